"""Witness cosignatures (C2SP tlog-cosignature, Ed25519 ``cosignature/v1``),
the add-checkpoint body and a witness's rules (C2SP tlog-witness).

Known answers: the C2SP spec's example cosignature line (its timestamp is
the example message's ``time 1679315147``), transparency-dev/formats'
note_cosigv1_test.go (a native type-0x04 vkey, a cosignature whose
timestamp is 1727964367), and cosignatures by sumdb/note's PeterNeumann key
computed here from the spec's text with hashlib and ``cryptography``
(Ed25519 is deterministic, so ours must match byte for byte).
"""

from __future__ import annotations

import base64
import hashlib

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from notary.protocol import tlog
from notary.protocol.tlog import (
    NOTHING_HELD,
    AddCheckpoint,
    AddCheckpointError,
    HeldCheckpoint,
    NoteError,
    WitnessRefusal,
    check_consistent,
    cosign,
    cosignature_key_id,
    cosignature_verifiers,
    cosigner_key,
    format_add_checkpoint,
    open_note,
    open_submission,
    parse_add_checkpoint,
    parse_cosignature_line,
    parse_cosigner_key,
    witnessed_logs,
)

PETER_SEED = base64.b64decode("AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz")[1:]
PETER = Ed25519PrivateKey.from_private_bytes(PETER_SEED)
PETER_PUBLIC = base64.b64decode("ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW")[1:]
SPEC_LINE = (
    "— witness.example.com/w1 jWbPPwAAAABkGFDLEZMHwSRaJNiIDoe9DYn/zXcrtPHeolMI5OWXEhZCB9dlr"
    "DJsX3b2oyin1nPZqhf5nNo0xUe+mbIUBkBIfZ+qnA=="
)
FORMATS_SIGNATURE = (
    "ZGhGuQAAAABm/qTPeyKXD+R2rzyQsxPiP8mXum7qq/iF0u4vanlqJyocWODBt97w9uL+8qT7S5gxEHWWOworDc"
    "FiEBYJXORmnFBOBA=="
)
FORMATS_VKEY = "remora.n621.de+da77ade7+BOvN63jn/bLvkieywe8R6UYAtVtNbZpXh34x7onlmtw2"
CHECKPOINT = "example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"


def spec_cosignature(name: str, key: Ed25519PrivateKey, text: str, timestamp: int) -> str:
    """The spec's cosignature line, written from its text."""
    public = key.public_key().public_bytes_raw()
    key_id = hashlib.sha256(name.encode() + b"\n\x04" + public).digest()[:4]
    message = f"cosignature/v1\ntime {timestamp}\n{text}".encode()
    blob = key_id + timestamp.to_bytes(8, "big") + key.sign(message)
    return f"\u2014 {name} {base64.b64encode(blob).decode()}\n"


def test_a_cosignature_matches_the_spec_byte_for_byte() -> None:
    line = cosign(CHECKPOINT, "witness.example/w1", PETER.sign, PETER_PUBLIC, 1679315147)
    assert line == spec_cosignature("witness.example/w1", PETER, CHECKPOINT, 1679315147)
    parsed = parse_cosignature_line(line)
    assert parsed.timestamp == 1679315147 and parsed.name == "witness.example/w1"
    assert parsed.key_id == cosignature_key_id("witness.example/w1", PETER_PUBLIC)
    assert parsed.line() == line
    # The same key's signed-note (0x01) key id differs: 0x04 separates them.
    assert parsed.key_id != tlog.ed25519_key_id("witness.example/w1", PETER_PUBLIC)


def test_a_cosigned_note_opens_with_the_witness_key_and_not_with_others() -> None:
    vkey = cosigner_key("witness.example/w1", PETER_PUBLIC)
    assert parse_cosigner_key(vkey) == (
        "witness.example/w1", cosignature_key_id("witness.example/w1", PETER_PUBLIC),
        PETER_PUBLIC,
    )
    log_key = Ed25519PrivateKey.generate()
    log_public = log_key.public_key().public_bytes_raw()
    note = tlog.sign_note(CHECKPOINT, "example.com/behind-the-sofa", log_key.sign, log_public)
    cosigned = note + cosign(CHECKPOINT, "witness.example/w1", PETER.sign, PETER_PUBLIC, 1700000000)
    text, names = open_note(cosigned, cosignature_verifiers([vkey]))
    assert text == CHECKPOINT and names == ["witness.example/w1"]
    # The log's verifier still opens it (the cosignature is an unknown key's).
    log_vkey = tlog.verifier_key("example.com/behind-the-sofa", log_public)
    assert open_note(cosigned, tlog.ed25519_verifiers([log_vkey]))[1] == [
        "example.com/behind-the-sofa"
    ]
    # A cosignature over other text, a timestamp changed, the future: refused.
    other = CHECKPOINT.replace("20852163", "20852164")
    with pytest.raises(NoteError, match="invalid signature"):
        open_note(other + "\n" + cosigned.split("\n\n")[1], cosignature_verifiers([vkey]))
    blob = bytearray(base64.b64decode(cosigned.rsplit(" ", 1)[1]))
    blob[11] ^= 1
    forged = cosigned.rsplit(" ", 1)[0] + " " + base64.b64encode(bytes(blob)).decode() + "\n"
    with pytest.raises(NoteError, match="invalid signature"):
        open_note(forged, cosignature_verifiers([vkey]))
    with pytest.raises(NoteError, match="invalid signature"):
        open_note(cosigned, cosignature_verifiers([vkey], not_after=1699999999))
    # The log's signature alone is not a cosignature.
    with pytest.raises(NoteError, match="not signed by a known key"):
        open_note(note, cosignature_verifiers([vkey]))


def test_cosignatures_from_other_implementations_parse() -> None:
    spec = parse_cosignature_line(SPEC_LINE)
    assert spec.name == "witness.example.com/w1" and spec.timestamp == 1679315147
    blob = base64.b64decode(FORMATS_SIGNATURE)
    formats = parse_cosignature_line(f"\u2014 w {FORMATS_SIGNATURE}")
    assert formats.timestamp == 1727964367 and formats.key_id == blob[:4]
    name, key_id, public = parse_cosigner_key(FORMATS_VKEY)
    assert (name, key_id.hex(), len(public)) == ("remora.n621.de", "da77ade7", 32)
    assert cosigner_key(name, public) == FORMATS_VKEY


@pytest.mark.parametrize("vkey", [
    "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",  # type 0x01
    "remora.n621.de+da77ade8+BOvN63jn/bLvkieywe8R6UYAtVtNbZpXh34x7onlmtw2",  # wrong id
    "remora.n621.de+DA77ADE7+BOvN63jn/bLvkieywe8R6UYAtVtNbZpXh34x7onlmtw2",  # upper hex
    "remora.n621.de+da77ade7+BOvN63jn/bLvkieywe8R6UYAtVtNbZpXh34x7onlmtw",  # short
    "remora.n621.de+da77ade7",
    "bad name+da77ade7+BOvN63jn/bLvkieywe8R6UYAtVtNbZpXh34x7onlmtw2",
    "x" * 2000,
])
def test_malformed_witness_keys_are_refused(vkey: str) -> None:
    with pytest.raises(NoteError):
        parse_cosigner_key(vkey)


@pytest.mark.parametrize("line", [
    "- w " + FORMATS_SIGNATURE,
    "\u2014 w",
    "\u2014 w " + FORMATS_SIGNATURE[:-4],  # too short
    "\u2014 w " + base64.b64encode(b"\0" * 4 + b"\xff" * 8 + b"\0" * 64).decode(),  # 2**64-1
    "\u2014 w " + base64.b64encode(b"\0" * 73).decode(),  # a byte too many
])
def test_malformed_cosignature_lines_are_refused(line: str) -> None:
    with pytest.raises(NoteError):
        parse_cosignature_line(line)


def test_timestamps_out_of_range_are_a_caller_error() -> None:
    with pytest.raises(ValueError):
        cosign(CHECKPOINT, "w", PETER.sign, PETER_PUBLIC, 1 << 63)
    with pytest.raises(ValueError):
        cosign(CHECKPOINT, "w", PETER.sign, PETER_PUBLIC, -1)


# -- the add-checkpoint body -----------------------------------------------------

SPEC_BODY = (
    "old 20852014\n"
    "PlRNCrwHpqhGrupue0L7gxbjbMiKA9temvuZZDDpkaw=\n"
    "jrJZDmY8Y7SyJE0MWLpLozkIVMSMZcD5kvuKxPC3swk=\n"
    "5+pKlUdi2LeF/BcMHBn+Ku6yhPGNCswZZD1X/6QgPd8=\n"
    "/6WVhPs2CwSsb5rYBH5cjHV/wSmA79abXAwhXw3Kj/0=\n"
    "\n"
    + CHECKPOINT + "\n"
    "— example.com/behind-the-sofa Az3grlgtzPICa5OS8npVmf1Myq/5IZniMp+ZJurmRDeOoRDe4URYN7u5/Zh"
    "cyv2q1gGzGku9nTo+zyWE+xeMcTOAYQ8=\n"
)


def test_the_spec_example_body_parses_and_formats_back() -> None:
    request = parse_add_checkpoint(SPEC_BODY.encode())
    assert request.old_size == 20852014 and len(request.proof) == 4
    assert request.note.startswith(CHECKPOINT)
    assert format_add_checkpoint(request.old_size, request.proof, request.note) == (
        SPEC_BODY.encode()
    )
    empty = format_add_checkpoint(0, [], CHECKPOINT + "\n— x AAAAAAA=\n")
    assert empty.startswith(b"old 0\n\n" + CHECKPOINT.encode())
    assert parse_add_checkpoint(empty) == AddCheckpoint(0, (), CHECKPOINT + "\n— x AAAAAAA=\n")


HASH = base64.b64encode(b"\1" * 32).decode()


@pytest.mark.parametrize("body", [
    b"old 1\n",  # no empty line
    b"old 01\n\n" + CHECKPOINT.encode(),  # leading zero
    b"old -1\n\n" + CHECKPOINT.encode(),
    b"old 9223372036854775808\n\n" + CHECKPOINT.encode(),  # 2**63
    b"old  1\n\n" + CHECKPOINT.encode(),
    b"Old 1\n\n" + CHECKPOINT.encode(),
    b"old 1\r\n\n" + CHECKPOINT.encode(),
    b"old 1\n" + HASH[:-1].encode() + b"\n\n" + CHECKPOINT.encode(),  # not base64
    b"old 1\n" + base64.b64encode(b"\1" * 31) + b"\n\n" + CHECKPOINT.encode(),  # 31 bytes
    b"old 1\n" + (HASH.encode() + b"\n") * 64 + b"\n" + CHECKPOINT.encode(),  # 64 lines
    b"old 1\n\n",  # no checkpoint
    b"old 1\n\n\xff" + CHECKPOINT.encode(),  # not UTF-8
    b"old 1\n\n" + b"x" * tlog.MAX_ADD_CHECKPOINT_BYTES,  # too large
])
def test_malformed_bodies_are_refused(body: bytes) -> None:
    with pytest.raises(AddCheckpointError):
        parse_add_checkpoint(body)


def test_a_full_proof_of_63_lines_is_read() -> None:
    body = b"old 1\n" + (HASH.encode() + b"\n") * 63 + b"\n" + CHECKPOINT.encode()
    assert len(parse_add_checkpoint(body).proof) == 63


# -- a witness's rules -------------------------------------------------------------

ORIGIN = "log.example/test"
LOG_KEY = Ed25519PrivateKey.generate()
LOG_PUBLIC = LOG_KEY.public_key().public_bytes_raw()
LOGS = witnessed_logs([tlog.verifier_key(ORIGIN, LOG_PUBLIC)])
LEAVES = [tlog.leaf_hash(b"entry %d" % i) for i in range(20)]


def root(size: int) -> bytes:
    return tlog.root_hash(size, lambda level, index: _mth(index << level, (index + 1) << level))


def _mth(start: int, end: int) -> bytes:
    if end - start == 1:
        return LEAVES[start]
    k = 1
    while k * 2 < end - start:
        k *= 2
    return tlog.node_hash(_mth(start, start + k), _mth(start + k, end))


def signed(size: int, root_hash: bytes | None = None, origin: str = ORIGIN,
           key: Ed25519PrivateKey = LOG_KEY) -> str:
    text = tlog.format_checkpoint(tlog.Checkpoint(origin, size, root_hash or root(size)))
    return tlog.sign_note(text, origin, key.sign, key.public_key().public_bytes_raw())


def body(old: int, size: int, **kwargs: object) -> bytes:
    proof = tlog.consistency_proof(
        old, size, lambda level, index: _mth(index << level, (index + 1) << level)
    ) if old else []
    return format_add_checkpoint(old, proof, signed(size, **kwargs))  # type: ignore[arg-type]


def refusal(body_bytes: bytes, held: HeldCheckpoint = NOTHING_HELD) -> WitnessRefusal:
    with pytest.raises(WitnessRefusal) as caught:
        request, checkpoint = open_submission(body_bytes, LOGS)
        check_consistent(request, checkpoint, held)
    return caught.value


def test_a_witness_accepts_a_consistent_sequence() -> None:
    held = NOTHING_HELD
    for old, size in ((0, 3), (3, 7), (7, 7), (7, 16), (16, 20)):
        assert old == held.size
        request, checkpoint = open_submission(body(old, size), LOGS)
        check_consistent(request, checkpoint, held)
        held = HeldCheckpoint(checkpoint.size, checkpoint.root)
    assert held == HeldCheckpoint(20, root(20))


def test_a_witness_refuses_with_the_specs_statuses() -> None:
    held = HeldCheckpoint(7, root(7))
    assert refusal(body(3, 10), held).status == 409
    assert refusal(body(3, 10), held).held_size == 7
    assert refusal(body(0, 10), held).held_size == 7
    fork = signed(7, hashlib.sha256(b"fork").digest())
    assert refusal(format_add_checkpoint(7, [], fork), held).status == 422
    wrong_proof = format_add_checkpoint(7, [b"\0" * 32] * 3, signed(10))
    assert refusal(wrong_proof, held).status == 422
    assert refusal(format_add_checkpoint(0, [b"\0" * 32], signed(3))).status == 422
    assert refusal(format_add_checkpoint(0, [], signed(0, b"\1" * 32))).status == 422
    assert refusal(format_add_checkpoint(8, [], signed(7)), held).status == 400
    assert refusal(body(0, 3, origin="other.example/log")).status == 404
    assert refusal(body(0, 3, key=Ed25519PrivateKey.generate())).status == 403
    # A bad signature by the known key name and id: 403, not ignored.
    note = signed(3)
    blob = bytearray(base64.b64decode(note.rsplit(" ", 1)[1]))
    blob[-1] ^= 1
    bad = note.rsplit(" ", 1)[0] + " " + base64.b64encode(bytes(blob)).decode() + "\n"
    assert refusal(format_add_checkpoint(0, [], bad)).status == 403
    assert refusal(b"old 0\n\nnot a note\n").status == 400
    assert refusal(b"old 0\n\n" + tlog.format_checkpoint(tlog.Checkpoint(ORIGIN, 3, root(3)))
                   .encode()).status == 400


def test_the_new_modules_public_names_are_exported() -> None:
    import inspect

    for module in (tlog.cosignature, tlog.witness):
        for name, value in vars(module).items():
            if name.startswith("_") or inspect.ismodule(value):
                continue
            if getattr(value, "__module__", module.__name__) == module.__name__ and (
                inspect.isfunction(value) or inspect.isclass(value)
            ):
                assert name in tlog.__all__, f"{module.__name__}.{name} is not exported"
