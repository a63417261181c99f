"""Checkpoints (C2SP tlog-checkpoint): the text of a log's signed tree
head, as ``origin``, tree size and base64 root hash on three lines, then
optional extension lines. A checkpoint is signed and opened as a signed
note (:mod:`notary.protocol.tlog.note`).

Error handling: a checkpoint that breaks a rule, parsed or built, is
:class:`CheckpointError`.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from dataclasses import dataclass

from notary.protocol.tlog._text import is_note_text, strict_b64decode
from notary.protocol.tlog.errors import CheckpointError
from notary.protocol.tlog.merkle import HASH_SIZE
from notary.protocol.tlog.note import MAX_NOTE_BYTES, Verify, open_note

#: Largest tree size a checkpoint may state.
MAX_TREE_SIZE = (1 << 63) - 1
#: Longest checkpoint text :func:`parse_checkpoint` reads: a note's.
MAX_CHECKPOINT_CHARS = MAX_NOTE_BYTES

_DECIMAL = re.compile(r"0|[1-9][0-9]{0,18}")


def _is_line(value: object) -> bool:
    return isinstance(value, str) and value != "" and "\n" not in value and is_note_text(value)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A log's tree head: its ``origin`` (the log's identity), ``size``
    leaves, their Merkle ``root`` (32 bytes), and extension lines.

    Raises :class:`CheckpointError` when built with an empty origin or
    extension, one holding a newline or a control character, a size outside
    ``0..2**63 - 1``, or a root that is not 32 bytes.
    """

    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not _is_line(self.origin):
            raise CheckpointError("origin must be one non-empty line of text")
        if (
            not isinstance(self.size, int)
            or isinstance(self.size, bool)
            or not 0 <= self.size <= MAX_TREE_SIZE
        ):
            raise CheckpointError("tree size must be an integer from 0 to 2**63 - 1")
        if not isinstance(self.root, bytes) or len(self.root) != HASH_SIZE:
            raise CheckpointError(f"root hash must be {HASH_SIZE} bytes")
        if not isinstance(self.extensions, tuple) or not all(map(_is_line, self.extensions)):
            raise CheckpointError("extensions must be non-empty lines of text")


def format_checkpoint(checkpoint: Checkpoint) -> str:
    """The note text of ``checkpoint``, every line ending in a newline:
    ready for :func:`~notary.protocol.tlog.note.sign_note`."""
    root = base64.b64encode(checkpoint.root).decode("ascii")
    lines = [checkpoint.origin, str(checkpoint.size), root, *checkpoint.extensions]
    return "".join(line + "\n" for line in lines)


def parse_checkpoint(text: str) -> Checkpoint:
    """The checkpoint of a note text (as :func:`open_note` returns it).

    Strict: raises :class:`CheckpointError` unless the text is at least
    three lines, each non-empty and ending in a newline, with no control
    character; the size is decimal without leading zeros (``0`` for the
    empty tree) and below 2**63; and the root is canonical padded base64
    of exactly 32 bytes.
    """
    if not isinstance(text, str) or len(text) > MAX_CHECKPOINT_CHARS:
        raise CheckpointError("malformed checkpoint")
    if not text.endswith("\n"):
        raise CheckpointError("checkpoint must end in a newline")
    lines = text[:-1].split("\n")
    if len(lines) < 3:
        raise CheckpointError("checkpoint has fewer than three lines")
    if not all(lines):
        raise CheckpointError("checkpoint has an empty line")
    if not is_note_text(text):
        raise CheckpointError("checkpoint holds a control character or is not UTF-8")
    origin, size_text, root_text, *extensions = lines
    if not _DECIMAL.fullmatch(size_text) or int(size_text) > MAX_TREE_SIZE:
        raise CheckpointError("tree size is not a decimal number below 2**63")
    root = strict_b64decode(root_text)
    if root is None or len(root) != HASH_SIZE:
        raise CheckpointError(f"root hash is not base64 of {HASH_SIZE} bytes")
    return Checkpoint(origin, int(size_text), root, tuple(extensions))


def open_checkpoint(
    note: str | bytes, verifiers: Mapping[tuple[str, bytes], Verify], origin: str
) -> tuple[Checkpoint, list[str]]:
    """The checkpoint of a signed note from log ``origin``, and the names of
    the known keys that signed it (:func:`open_note`).

    Raises :class:`~notary.protocol.tlog.errors.NoteError` as
    :func:`open_note`, and :class:`CheckpointError` if the text is not a
    checkpoint or names another origin.
    """
    text, names = open_note(note, verifiers)
    checkpoint = parse_checkpoint(text)
    if checkpoint.origin != origin:
        raise CheckpointError("checkpoint is from another log")
    return checkpoint, names
