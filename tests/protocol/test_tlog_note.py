"""Signed notes (C2SP signed-note), Ed25519.

Known answers: golang.org/x/mod/sumdb/note's PeterNeumann and EnochRoot
keys and notes (note.go, note_test.go), and the signed-note spec's
example.com/foo example. Ed25519 signatures are deterministic, so signing
the Go text with the Go key must give the Go note byte for byte.
"""

from __future__ import annotations

import base64

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from notary.protocol.tlog import (
    MAX_NOTE_BYTES,
    MAX_NOTE_SIGNATURES,
    NoteError,
    ed25519_key_id,
    ed25519_verifier,
    ed25519_verifiers,
    known_signatures_only,
    open_note,
    parse_verifier_key,
    sign_note,
    verifier_key,
)

PETER_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
PETER_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
ENOCH_VKEY = "EnochRoot+af0cfe78+ATtqJ7zOtqQtYqOo0CpvDXNlMhV3HeJDpjrASKGLWdop"
TEXT = (
    "If you think cryptography is the answer to your problem,\n"
    "then you don't know what your problem is.\n"
)
PETER_SIG = (
    "— PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvq"
    "fqdngotpRZb6KE6RyyBwJnAM=\n"
)
ENOCH_SIG = (
    "— EnochRoot rwz+eBzmZa0SO3NbfRGzPCpDckykFXSdeX+MNtCOXm2/5n2tiOHp+vAF1aGrQ5ovTG01oOTG"
    "wnWLox33WWd1RvMc+QQ=\n"
)
PETER_NOTE = TEXT + "\n" + PETER_SIG

SPEC_VKEY = "example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k"
SPEC_NOTE = (
    "This is an example message.\n\n— example.com/foo Uw2QOkn8srV1yJGh2VYRlL1Tnagv1YEq6TfXppzi"
    "2ONncAlTgK7Ztg1ERYNZXsYjOBH3mFXmRKuwHjG1Yu72IneyaQM=\n"
)


def peter_key() -> Ed25519PrivateKey:
    seed = base64.b64decode(PETER_SKEY.split("+", 4)[4])
    assert seed[0] == 1
    return Ed25519PrivateKey.from_private_bytes(seed[1:])


PETER = ed25519_verifiers([PETER_VKEY])
BOTH = ed25519_verifiers([PETER_VKEY, ENOCH_VKEY])


# --- Known answers ----------------------------------------------------------


def test_peter_neumann_key_and_note() -> None:
    key = peter_key()
    public_raw = key.public_key().public_bytes_raw()
    assert ed25519_key_id("PeterNeumann", public_raw).hex() == "c74f20a3"
    assert verifier_key("PeterNeumann", public_raw) == PETER_VKEY
    assert parse_verifier_key(PETER_VKEY) == ("PeterNeumann", bytes.fromhex("c74f20a3"), public_raw)
    assert sign_note(TEXT, "PeterNeumann", key.sign, public_raw) == PETER_NOTE
    assert open_note(PETER_NOTE, PETER) == (TEXT, ["PeterNeumann"])
    assert open_note(PETER_NOTE.encode("utf-8"), PETER) == (TEXT, ["PeterNeumann"])


def test_spec_example_verifies() -> None:
    name, key_id, _ = parse_verifier_key(SPEC_VKEY)
    assert (name, key_id.hex()) == ("example.com/foo", "530d903a")
    assert open_note(SPEC_NOTE, ed25519_verifiers([SPEC_VKEY])) == (
        "This is an example message.\n",
        ["example.com/foo"],
    )


def test_two_signatures_known_and_unknown() -> None:
    note = TEXT + "\n" + PETER_SIG + ENOCH_SIG
    assert open_note(note, PETER) == (TEXT, ["PeterNeumann"])
    assert open_note(note, BOTH) == (TEXT, ["PeterNeumann", "EnochRoot"])
    assert open_note(TEXT + "\n" + ENOCH_SIG + PETER_SIG, BOTH)[1] == ["EnochRoot", "PeterNeumann"]
    with pytest.raises(NoteError, match="known key"):
        open_note(note, {})
    with pytest.raises(NoteError, match="known key"):
        open_note(note, ed25519_verifiers([SPEC_VKEY]))


def test_known_signatures_only_keeps_what_was_verified() -> None:
    """What a client keeps of a note: the text and the lines of the keys it
    knows (each verified), never a line nobody checked."""
    note = TEXT + "\n" + ENOCH_SIG + PETER_SIG + PETER_SIG
    assert known_signatures_only(note, PETER) == (TEXT, TEXT + "\n" + PETER_SIG + PETER_SIG)
    assert known_signatures_only(note.encode("utf-8"), BOTH) == (TEXT, note)
    kept = known_signatures_only(note, PETER)[1]
    assert open_note(kept, PETER) == (TEXT, ["PeterNeumann"])
    with pytest.raises(NoteError, match="known key"):
        known_signatures_only(TEXT + "\n" + ENOCH_SIG, PETER)
    with pytest.raises(NoteError, match="invalid signature"):
        known_signatures_only(PETER_NOTE.replace("problem,", "problem;"), PETER)


def test_a_changed_text_or_signature_fails() -> None:
    for note in [
        PETER_NOTE.replace("problem,", "problem;"),
        PETER_NOTE.replace("If you", "If  you"),
        "X" + PETER_NOTE,
        PETER_NOTE.replace("problem is.\n", "problem is.\n\n"),
        PETER_NOTE.replace("x08go/ZJ", "x08go/ZK"),
        PETER_NOTE.replace("nAM=", "nAA="),
    ]:
        with pytest.raises(NoteError):
            open_note(note, PETER)


def test_repeated_signatures_name_the_key_once_and_are_all_verified() -> None:
    assert open_note(TEXT + "\n" + PETER_SIG * 3, PETER) == (TEXT, ["PeterNeumann"])
    bad = PETER_SIG.replace("x08go/ZJ", "x08go/ZK")
    with pytest.raises(NoteError, match="invalid signature"):
        open_note(TEXT + "\n" + PETER_SIG + bad, PETER)


def test_a_known_key_with_a_bad_signature_rejects_the_note() -> None:
    with pytest.raises(NoteError, match="invalid signature"):
        open_note(TEXT + "\n" + ENOCH_SIG.replace("Lox33", "Lox34") + PETER_SIG, BOTH)


def test_keys_match_on_name_and_id_together() -> None:
    _, peter_id, peter_raw = parse_verifier_key(PETER_VKEY)
    same_id_other_name = {("PeterNeumann2", peter_id): ed25519_verifier(peter_raw)}
    same_name_other_id = {("PeterNeumann", b"\0\0\0\0"): ed25519_verifier(peter_raw)}
    for verifiers in (same_id_other_name, same_name_other_id):
        with pytest.raises(NoteError, match="known key"):
            open_note(PETER_NOTE, verifiers)


def test_vkey_manglings_are_rejected() -> None:
    # sumdb/note TestNewVerifier: every proper substring, every byte + 1.
    for i in range(len(PETER_VKEY) + 1):
        for j in range(i + 1, len(PETER_VKEY) + 1):
            if (i, j) != (0, len(PETER_VKEY)):
                with pytest.raises(NoteError):
                    parse_verifier_key(PETER_VKEY[i:j])
    for i in range(len(PETER_VKEY)):
        mangled = PETER_VKEY[:i] + chr(ord(PETER_VKEY[i]) + 1) + PETER_VKEY[i + 1 :]
        with pytest.raises(NoteError):
            parse_verifier_key(mangled)
    for bad in [
        # A wrong-length key and an unknown algorithm, each with its key id.
        "PeterNeumann+cc469956+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TWBADKEY==",
        "PeterNeumann+173116ae+ZRpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",
        PETER_VKEY.replace("c74f20a3", "C74F20A3"),
        PETER_VKEY + "\n",
        "x" * 2000,
        "",
    ]:
        with pytest.raises(NoteError):
            parse_verifier_key(bad)


def test_duplicate_verifier_keys_are_refused() -> None:
    with pytest.raises(NoteError):
        ed25519_verifiers([PETER_VKEY, PETER_VKEY])


# --- Signing ----------------------------------------------------------------


@pytest.fixture(scope="module")
def key() -> tuple[Ed25519PrivateKey, bytes]:
    private = Ed25519PrivateKey.generate()
    return private, private.public_key().public_bytes_raw()


def test_sign_and_open_round_trip(key) -> None:
    private, public_raw = key
    verifiers = ed25519_verifiers([verifier_key("log.example/1", public_raw)])
    for text in ["a\n", "a\n\nb\n", "a\n\n", "\nleading empty line\n", "ünïcode — ok\n", TEXT]:
        note = sign_note(text, "log.example/1", private.sign, public_raw)
        assert open_note(note, verifiers) == (text, ["log.example/1"])


@pytest.mark.parametrize(
    "text",
    ["", "\n", "\n\n", "no newline", "tab\there\n", "cr\r\n", "nul\0\n", "esc\x1b\n", "\ud800\n"],
)
def test_sign_note_rejects_invalid_texts(key, text: str) -> None:
    private, public_raw = key
    with pytest.raises(NoteError):
        sign_note(text, "log", private.sign, public_raw)


@pytest.mark.parametrize(
    "name", ["", "a b", "a+b", "a\u00a0b", "a\u2003b", "a\nb", "a\tb", "\ud800"]
)
def test_sign_note_rejects_invalid_names(key, name: str) -> None:
    private, public_raw = key
    with pytest.raises(NoteError):
        sign_note("text\n", name, private.sign, public_raw)
    with pytest.raises(NoteError):
        verifier_key(name, public_raw)


def test_sign_note_rejects_bad_keys_and_signatures(key) -> None:
    private, public_raw = key
    with pytest.raises(NoteError):
        sign_note("text\n", "log", private.sign, public_raw[:31])
    with pytest.raises(NoteError):
        sign_note("text\n", "log", lambda message: private.sign(message)[:63], public_raw)
    with pytest.raises(NoteError):
        sign_note("x" * MAX_NOTE_BYTES + "\n", "log", private.sign, public_raw)
    with pytest.raises(NoteError):
        ed25519_verifier(b"\0" * 33)


def test_ed25519_verifier(key) -> None:
    private, public_raw = key
    verify = ed25519_verifier(public_raw)
    signature = private.sign(b"message")
    assert verify(b"message", signature)
    assert not verify(b"massage", signature)
    assert not verify(b"message", signature[:63])
    assert not verify(b"message", signature + b"\0")
    assert not verify(b"message", bytes([signature[0] ^ 1]) + signature[1:])


# --- Malformed notes --------------------------------------------------------

MALFORMED = {
    "no empty line": TEXT + PETER_SIG,
    "no final newline": PETER_NOTE[:-1],
    "no signature": TEXT + "\n",
    "empty signature line": TEXT + "\n" + PETER_SIG + "\n",
    "only empty text": "\n\n" + PETER_SIG,
    "hyphens for the em dash": TEXT + "\n" + PETER_SIG.replace("—", "--"),
    "no space after the dash": TEXT + "\n" + PETER_SIG.replace("— ", "—"),
    "two spaces": TEXT + "\n" + PETER_SIG.replace("Neumann ", "Neumann  "),
    "no signature after the name": TEXT + "\n— PeterNeumann\n",
    "empty signature": TEXT + "\n— PeterNeumann \n",
    "plus in the name": TEXT + "\n" + PETER_SIG.replace("Peter", "Pe+ter"),
    "signature of 4 bytes": TEXT + "\n— PeterNeumann x08gow==\n",
    "base64 without padding": TEXT + "\n" + PETER_SIG.replace("nAM=", "nAM"),
    "base64 with unused bits set": TEXT + "\n" + PETER_SIG.replace("nAM=", "nAN="),
    "url-safe base64": TEXT + "\n" + PETER_SIG.replace("/", "_"),
    "carriage return": PETER_NOTE.replace("\n", "\r\n"),
    "tab in the text": "a\tb\n\n" + PETER_SIG,
    "nul": TEXT + "\0\n" + PETER_SIG,
    "lone surrogate": TEXT.replace("If", "\udcff") + "\n" + PETER_SIG,
    "text line after the signatures": PETER_NOTE + "more text\n",
}


@pytest.mark.parametrize("note", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_notes_are_rejected(note: str) -> None:
    with pytest.raises(NoteError):
        open_note(note, BOTH)


@pytest.mark.parametrize(
    "data",
    [
        PETER_NOTE.encode("utf-8").replace(b"If", b"\xff\xfe"),
        PETER_NOTE.encode("utf-8").replace("—".encode(), b"\xe2\x80"),
        b"\xed\xa0\x80\n\n" + PETER_SIG.encode(),  # an encoded surrogate
        b"x" * (MAX_NOTE_BYTES + 1),
    ],
)
def test_malformed_note_bytes_are_rejected(data: bytes) -> None:
    with pytest.raises(NoteError):
        open_note(data, PETER)


def test_size_and_signature_count_limits() -> None:
    unknown = ENOCH_SIG
    # The spec: verifiers must accept at least 16 signatures.
    assert open_note(TEXT + "\n" + unknown * (MAX_NOTE_SIGNATURES - 1) + PETER_SIG, PETER)[1] == [
        "PeterNeumann"
    ]
    assert MAX_NOTE_SIGNATURES >= 16
    with pytest.raises(NoteError, match="more than"):
        open_note(TEXT + "\n" + unknown * MAX_NOTE_SIGNATURES + PETER_SIG, PETER)
    with pytest.raises(NoteError, match="larger"):
        open_note("x" * MAX_NOTE_BYTES + "\n\n" + PETER_SIG, PETER)
    # Characters, not bytes, under the limit; bytes over it.
    with pytest.raises(NoteError, match="larger"):
        open_note("é" * (MAX_NOTE_BYTES // 2) + "\n\n" + PETER_SIG, PETER)


def test_error_messages_do_not_echo_large_inputs() -> None:
    long_name = "n" * 10_000
    note = TEXT + "\n" + PETER_SIG.replace("PeterNeumann", long_name)
    verifiers = {(long_name, bytes.fromhex("c74f20a3")): lambda message, signature: False}
    with pytest.raises(NoteError) as caught:
        open_note(note, verifiers)
    assert len(str(caught.value)) < 200
    for bad in ["x" * 100_000, "y" * 100_000 + "\n\n" + PETER_SIG]:
        with pytest.raises(NoteError) as caught:
            open_note(bad, PETER)
        assert len(str(caught.value)) < 200


def test_non_text_notes_are_rejected() -> None:
    for note in [None, 42, ["a"]]:
        with pytest.raises(NoteError):
            open_note(note, PETER)  # type: ignore[arg-type]
