"""A client's witness policy (notary.protocol.tlog.policy): which
cosignature lines count, which are refused, which are ignored, and the
bounds on a note's lines."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519

from notary.protocol import tlog

NOW = 1_800_000_000
TEXT = tlog.format_checkpoint(tlog.Checkpoint("log.test/v2/log", 5, b"\x01" * 32))


def key() -> tuple[ed25519.Ed25519PrivateKey, bytes]:
    private = ed25519.Ed25519PrivateKey.generate()
    return private, private.public_key().public_bytes_raw()


LOG_KEY, LOG_PUBLIC = key()
NOTE = tlog.sign_note(TEXT, "log.test/v2/log", LOG_KEY.sign, LOG_PUBLIC)


def witness(name: str) -> tuple[str, object]:
    private, public = key()
    return tlog.cosigner_key(name, public), (private, public, name)


def cosign(who: object, *, text: str = TEXT, at: int = NOW - 5) -> str:
    private, public, name = who  # type: ignore[misc]
    return tlog.cosign(text, name, private.sign, public, at)


W1, S1 = witness("w1.test/witness")
W2, S2 = witness("w2.test/witness")
W3, S3 = witness("w3.test/witness")


def test_two_trusted_cosignatures_meet_a_minimum_of_two() -> None:
    judged = tlog.WitnessPolicy((W1, W2), 2).judge(NOTE + cosign(S1) + cosign(S2), now=NOW)
    assert judged.witnessed and judged.cosigned == ("w1.test/witness", "w2.test/witness")
    assert judged.ignored == 1  # the log's own signature
    assert "cosigned by 2 of the 2" in judged.describe()


def test_a_witness_counts_once_however_many_lines_it_has() -> None:
    judged = tlog.WitnessPolicy((W1, W2), 2).judge(
        NOTE + cosign(S1) + cosign(S1, at=NOW - 1), now=NOW
    )
    assert judged.cosigned == ("w1.test/witness",) and not judged.witnessed


def test_an_untrusted_key_is_ignored_not_counted() -> None:
    judged = tlog.WitnessPolicy((W1,), 1).judge(NOTE + cosign(S3), now=NOW)
    assert not judged.witnessed and judged.cosigned == () and judged.ignored == 2
    assert judged.refused == ()


def test_garbage_and_far_future_cosignatures_are_refused() -> None:
    other = tlog.format_checkpoint(tlog.Checkpoint("log.test/v2/log", 6, b"\x02" * 32))
    garbage = cosign(S1, text=other)  # a cosignature of another checkpoint
    future = cosign(S2, at=NOW + tlog.MAX_AHEAD_S + 1)
    judged = tlog.WitnessPolicy((W1, W2), 1).judge(NOTE + garbage + future, now=NOW)
    assert not judged.witnessed
    assert [name for name, _ in judged.refused] == ["w1.test/witness", "w2.test/witness"]
    assert "invalid cosignature" in judged.describe() and "in the future" in judged.describe()
    # Just inside the clock-skew bound is fine.
    near = cosign(S2, at=NOW + tlog.MAX_AHEAD_S)
    assert tlog.WitnessPolicy((W2,), 1).judge(NOTE + near, now=NOW).witnessed


def test_a_refused_line_does_not_spoil_a_valid_one() -> None:
    bad = cosign(S1, text=TEXT.replace("5", "7", 1))
    judged = tlog.WitnessPolicy((W1, W2), 1).judge(NOTE + bad + cosign(S2), now=NOW)
    assert judged.witnessed and judged.cosigned == ("w2.test/witness",)


def test_the_note_bounds_hold() -> None:
    too_many = NOTE + cosign(S3) * tlog.note.MAX_NOTE_SIGNATURES
    with pytest.raises(tlog.NoteError):
        tlog.WitnessPolicy((W1,), 1).judge(too_many, now=NOW)
    with pytest.raises(tlog.NoteError):
        tlog.WitnessPolicy((W1,), 1).judge(TEXT, now=NOW)  # no signature block
    with pytest.raises(tlog.NoteError):
        tlog.WitnessPolicy((W1,), 1).judge(NOTE[:-1], now=NOW)  # no final newline


def test_a_policy_cannot_ask_more_than_it_trusts() -> None:
    with pytest.raises(ValueError, match="2 witnesses required, 1 trusted"):
        tlog.WitnessPolicy((W1,), 2)
    with pytest.raises(ValueError, match="twice"):
        tlog.WitnessPolicy((W1, W1), 1)
    with pytest.raises(tlog.NoteError):
        tlog.WitnessPolicy(("not a key",), 0)
    assert not tlog.WitnessPolicy((), 0).required
    assert tlog.WitnessPolicy((), 0).judge(NOTE, now=NOW).witnessed
