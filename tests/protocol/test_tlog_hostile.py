"""Hostile input to every parser and verifier of notary.protocol.tlog: each
either succeeds with a result that round-trips, or raises its own
TlogError subclass, never another exception."""

from __future__ import annotations

import base64

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from notary.protocol.tlog import (
    CheckpointError,
    NoteError,
    ProofError,
    TileError,
    decode_entry_bundle,
    ed25519_verifiers,
    encode_entry_bundle,
    entries_path,
    format_checkpoint,
    open_note,
    parse_checkpoint,
    parse_tile_path,
    parse_verifier_key,
    sign_note,
    tile_path,
    verifier_key,
    verify_consistency,
    verify_inclusion,
)

EXAMPLES = 400

# --- Tile paths -------------------------------------------------------------

_path_pieces = st.sampled_from(
    [
        "tile/",
        "entries/",
        "0/",
        "1/",
        "63/",
        "64/",
        "x",
        "000",
        "001",
        "999",
        "/",
        ".p/",
        "0",
        "1",
        "255",
        "256",
        "\u0661",
        "\n",
        " ",
        "x001/",
        "x000/",
    ]
)


def _check_tile_path(path: str) -> None:
    try:
        level, index, width = parse_tile_path(path)
    except TileError:
        return
    made = entries_path(index, width) if level is None else tile_path(level, index, width)
    assert made == path


@settings(max_examples=EXAMPLES)
@given(st.one_of(st.text(max_size=80), st.lists(_path_pieces, max_size=12).map("".join)))
def test_parse_tile_path_raises_only_tile_error(path: str) -> None:
    _check_tile_path(path)


@settings(max_examples=EXAMPLES)
@given(st.text(alphabet="tilex/entrisp.0123456789", max_size=60))
def test_parse_tile_path_on_the_path_alphabet(path: str) -> None:
    _check_tile_path(path)


# --- Entry bundles ----------------------------------------------------------


@settings(max_examples=EXAMPLES)
@given(st.binary(max_size=600))
def test_decode_entry_bundle_raises_only_tile_error(data: bytes) -> None:
    try:
        entries = decode_entry_bundle(data)
    except TileError:
        return
    assert encode_entry_bundle(entries) == data


# --- Checkpoints ------------------------------------------------------------

_ROOT = base64.b64encode(bytes(range(32))).decode()
_line = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["0", "1", "01", "123", str(2**63), str(2**63 - 1), _ROOT, _ROOT[:-1], ""]),
)


@settings(max_examples=EXAMPLES)
@given(
    st.one_of(
        st.text(max_size=200), st.lists(_line, max_size=6).map(lambda ls: "\n".join(ls) + "\n")
    )
)
def test_parse_checkpoint_raises_only_checkpoint_error(text: str) -> None:
    try:
        checkpoint = parse_checkpoint(text)
    except CheckpointError:
        return
    assert format_checkpoint(checkpoint) == text


# --- Notes and verifier keys ------------------------------------------------

_KEY = Ed25519PrivateKey.from_private_bytes(b"\x07" * 32)
_PUBLIC = _KEY.public_key().public_bytes_raw()
_VKEY = verifier_key("log.example", _PUBLIC)
_TEXT = "log.example\n7\n" + _ROOT + "\n"
_NOTE = sign_note(_TEXT, "log.example", _KEY.sign, _PUBLIC)
VERIFIERS = ed25519_verifiers([_VKEY])


@settings(max_examples=EXAMPLES)
@given(st.one_of(st.text(max_size=300), st.binary(max_size=300)))
def test_open_note_raises_only_note_error(note: str | bytes) -> None:
    try:
        open_note(note, VERIFIERS)
    except NoteError:
        return
    raise AssertionError("a random note verified")


@st.composite
def _mutated_notes(draw: st.DrawFn) -> str:
    """The valid note with a few characters inserted, deleted or replaced."""
    note = _NOTE
    for _ in range(draw(st.integers(1, 3))):
        position = draw(st.integers(0, len(note)))
        action = draw(st.sampled_from(["insert", "delete", "replace"]))
        char = draw(
            st.one_of(st.sampled_from(["\n", " ", "—", "+", "=", "A", "\r"]), st.characters())
        )
        if action == "insert":
            note = note[:position] + char + note[position:]
        elif action == "delete":
            note = note[:position] + note[position + 1 :]
        else:
            note = note[:position] + char + note[position + 1 :]
    return note


@settings(max_examples=EXAMPLES)
@given(_mutated_notes())
def test_a_mutated_note_fails_or_still_carries_the_signed_text(note: str) -> None:
    try:
        text, names = open_note(note, VERIFIERS)
    except NoteError:
        return
    # Only the signature block can change without breaking the signature
    # (an added line by an unknown key, say); the text never.
    assert text == _TEXT
    assert names == ["log.example"]


@settings(max_examples=EXAMPLES)
@given(
    st.one_of(
        st.text(max_size=120),
        st.builds(lambda a, b: a + "+" + b, st.text(max_size=20), st.text(max_size=60)),
    )
)
def test_parse_verifier_key_raises_only_note_error(text: str) -> None:
    try:
        name, _, public_raw = parse_verifier_key(text)
    except NoteError:
        return
    assert verifier_key(name, public_raw) == text


# --- Proof verification -----------------------------------------------------

_hashish = st.one_of(st.binary(min_size=32, max_size=32), st.binary(max_size=40))
_size = st.one_of(st.integers(-3, 70), st.integers(-(2**70), 2**70))


@settings(max_examples=EXAMPLES)
@given(_hashish, _size, _size, st.lists(_hashish, max_size=70), _hashish)
def test_verify_inclusion_raises_only_proof_error(leaf, index, size, proof, root) -> None:
    try:
        verify_inclusion(leaf, index, size, proof, root)
    except ProofError:
        return
    # Only a one-leaf tree, whose root is its leaf, can pass with random input.
    assert (index, size, proof, leaf) == (0, 1, [], root)


@settings(max_examples=EXAMPLES)
@given(_size, _size, _hashish, _hashish, st.lists(_hashish, max_size=70))
def test_verify_consistency_raises_only_proof_error(old, new, old_root, new_root, proof) -> None:
    try:
        verify_consistency(old, new, old_root, new_root, proof)
    except ProofError:
        return
    # Only the trivially consistent cases can pass with random input.
    assert proof == [] and ((old == new and old_root == new_root) or old == 0)
