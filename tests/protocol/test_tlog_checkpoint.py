"""Checkpoints (C2SP tlog-checkpoint): format, strict parse, signed
round trip.

Known answers: golang.org/x/mod/sumdb/tlog's tree note (note_test.go,
whose root is the record hash of "hello world") and the tlog-checkpoint
spec's example body.
"""

from __future__ import annotations

import base64

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from notary.protocol.tlog import (
    EMPTY_ROOT,
    MAX_CHECKPOINT_CHARS,
    MAX_TREE_SIZE,
    Checkpoint,
    CheckpointError,
    NoteError,
    ed25519_verifiers,
    format_checkpoint,
    leaf_hash,
    open_checkpoint,
    parse_checkpoint,
    sign_note,
    verifier_key,
)

GO_TREE = "go.sum database tree\n123456789012\nTszzRgjTG6xce+z2AG31kAXYKBgQVtCSCE40HmuwBb0=\n"
SPEC_BODY = "example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"
ROOT_B64 = "TszzRgjTG6xce+z2AG31kAXYKBgQVtCSCE40HmuwBb0="


def test_go_tree_note_known_answer() -> None:
    checkpoint = parse_checkpoint(GO_TREE)
    assert checkpoint == Checkpoint("go.sum database tree", 123456789012, leaf_hash(b"hello world"))
    assert format_checkpoint(checkpoint) == GO_TREE


def test_spec_example_round_trips() -> None:
    checkpoint = parse_checkpoint(SPEC_BODY)
    assert (checkpoint.origin, checkpoint.size, checkpoint.extensions) == (
        "example.com/behind-the-sofa",
        20852163,
        (),
    )
    assert (
        base64.b64encode(checkpoint.root).decode() == "CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I="
    )
    assert format_checkpoint(checkpoint) == SPEC_BODY


def test_extensions_and_edges_round_trip() -> None:
    for checkpoint in [
        Checkpoint("log", 0, EMPTY_ROOT),
        Checkpoint("log", MAX_TREE_SIZE, b"\xff" * 32),
        Checkpoint("a log with spaces+plus", 1, leaf_hash(b""), ("ext one", "— ext two")),
        Checkpoint("ünï", 7, b"\0" * 32, ("x",) * 10),
    ]:
        text = format_checkpoint(checkpoint)
        assert text.endswith("\n") and "\n\n" not in text
        assert parse_checkpoint(text) == checkpoint


BAD_TEXTS = {
    # sumdb/tlog TestParseTree's bad trees.
    "hex size": "go.sum database tree\n0xabcdef\n" + ROOT_B64 + "\n",
    "root too long": GO_TREE.replace("Bb0=", "BTOOBIG="),
    "leading zero": "log\n0123\n" + ROOT_B64 + "\n",
    "double zero": "log\n00\n" + ROOT_B64 + "\n",
    "plus sign": "log\n+1\n" + ROOT_B64 + "\n",
    "minus": "log\n-1\n" + ROOT_B64 + "\n",
    "space before": "log\n 1\n" + ROOT_B64 + "\n",
    "space after": "log\n1 \n" + ROOT_B64 + "\n",
    "underscore": "log\n1_000\n" + ROOT_B64 + "\n",
    "arabic-indic digits": "log\n\u0661\u0662\n" + ROOT_B64 + "\n",
    "full-width digits": "log\n\uff11\n" + ROOT_B64 + "\n",
    "2**63": f"log\n{2**63}\n{ROOT_B64}\n",
    "huge": "log\n" + "9" * 5000 + "\n" + ROOT_B64 + "\n",
    "empty size": "log\n\n" + ROOT_B64 + "\n",
    "31-byte root": "log\n1\n" + base64.b64encode(b"\0" * 31).decode() + "\n",
    "33-byte root": "log\n1\n" + base64.b64encode(b"\0" * 33).decode() + "\n",
    "root without padding": "log\n1\n" + ROOT_B64.rstrip("=") + "\n",
    "root with unused bits set": "log\n1\n" + ROOT_B64.replace("b0=", "b1=") + "\n",
    "url-safe root": "log\n1\n" + base64.urlsafe_b64encode(b"\xfb\xff" * 16).decode() + "\n",
    "root with a space": "log\n1\n " + ROOT_B64 + "\n",
    "empty origin": "\n1\n" + ROOT_B64 + "\n",
    "empty extension": "log\n1\n" + ROOT_B64 + "\n\n",
    "empty line between extensions": "log\n1\n" + ROOT_B64 + "\na\n\nb\n",
    "no final newline": GO_TREE[:-1],
    "two lines": "log\n1\n",
    "empty": "",
    "only newlines": "\n\n\n",
    "crlf": GO_TREE.replace("\n", "\r\n"),
    "tab in origin": "a\tlog\n1\n" + ROOT_B64 + "\n",
    "nul in extension": GO_TREE + "a\0b\n",
    "lone surrogate": "\udc80\n1\n" + ROOT_B64 + "\n",
    "too long": "log\n1\n" + ROOT_B64 + "\n" + "x" * MAX_CHECKPOINT_CHARS + "\n",
}


@pytest.mark.parametrize("text", BAD_TEXTS.values(), ids=BAD_TEXTS.keys())
def test_parse_checkpoint_rejections(text: str) -> None:
    with pytest.raises(CheckpointError):
        parse_checkpoint(text)


def test_parse_checkpoint_rejects_non_strings() -> None:
    for value in [GO_TREE.encode(), None, 1]:
        with pytest.raises(CheckpointError):
            parse_checkpoint(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "fields",
    [
        ("", 1, EMPTY_ROOT, ()),
        ("a\nb", 1, EMPTY_ROOT, ()),
        ("a\rb", 1, EMPTY_ROOT, ()),
        ("log", -1, EMPTY_ROOT, ()),
        ("log", 2**63, EMPTY_ROOT, ()),
        ("log", True, EMPTY_ROOT, ()),
        ("log", 1.0, EMPTY_ROOT, ()),
        ("log", 1, EMPTY_ROOT[:31], ()),
        ("log", 1, bytearray(EMPTY_ROOT), ()),
        ("log", 1, EMPTY_ROOT, ("",)),
        ("log", 1, EMPTY_ROOT, ("a\nb",)),
        ("log", 1, EMPTY_ROOT, ["list"]),
        ("log", 1, EMPTY_ROOT, "ab"),
    ],
)
def test_checkpoint_rejects_what_cannot_be_formatted(fields) -> None:
    with pytest.raises(CheckpointError):
        Checkpoint(*fields)


def test_signed_checkpoint_round_trip() -> None:
    key = Ed25519PrivateKey.generate()
    public_raw = key.public_key().public_bytes_raw()
    checkpoint = Checkpoint("notary.example/log", 42, leaf_hash(b"42"))
    note = sign_note(format_checkpoint(checkpoint), "notary.example/log", key.sign, public_raw)
    verifiers = ed25519_verifiers([verifier_key("notary.example/log", public_raw)])
    assert open_checkpoint(note, verifiers, "notary.example/log") == (
        checkpoint,
        ["notary.example/log"],
    )
    with pytest.raises(CheckpointError, match="another log"):
        open_checkpoint(note, verifiers, "notary.example/other")
    with pytest.raises(NoteError):
        open_checkpoint(note.replace("42\n", "43\n", 1), verifiers, "notary.example/log")
    not_a_checkpoint = sign_note("hello\n", "notary.example/log", key.sign, public_raw)
    with pytest.raises(CheckpointError):
        open_checkpoint(not_a_checkpoint, verifiers, "notary.example/log")
