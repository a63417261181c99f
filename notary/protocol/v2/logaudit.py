"""Auditing a notary's transparency log from the outside (docs/v2.md, rule
S7; docs/log.md, "Watching a notary's log"): what ``notary log verify`` and
``notary log watch`` check, without I/O.

* :func:`open_log_checkpoint`: a served checkpoint, signed by the notary's
  v2 key under the key name its origin (its first line) gives.
* :func:`check_log_entry`: one log entry is a statement entry as the
  notary signs it (``{"signature":...,"statement":...}``, canonical, no
  ``inclusion``), signed by the v2 key, promising this log.
* :class:`LogReplay`: the tree recomputed from the entries, in order, in
  O(log n) memory (a :class:`~notary.protocol.tlog.CompactRange`), with
  the content every hash tile of the tree must have (to compare with the
  tiles served), one tile per level at a time.
* :func:`parse_consistency_proof`: the body of ``proof/consistency``.

Sans-IO: no Trio, no sockets, no files, no clock. Not exported by
``notary.protocol.v2``: import the names from this module.

Error handling: a checkpoint that does not verify is ``VerificationError``;
a bad entry is :class:`LogEntryError`, which says what kind of fault it is;
a malformed proof is ``tlog.ProofError``. A caller's misuse (a start edge
larger than the tree) is ``ValueError``.
"""

from __future__ import annotations

import binascii
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from notary.errors import ProtocolError
from notary.protocol import strictjson, tlog
from notary.protocol.v2.keys import key_id_of
from notary.protocol.v2.logproof import open_checkpoint_note
from notary.protocol.v2.parsing import ParsedStatement, parse_statement_entry
from notary.protocol.v2.verification import VerificationError, verify_signature

__all__ = [
    "BAD_SIGNATURE",
    "MALFORMED_ENTRY",
    "MAX_PROOF_BODY_BYTES",
    "WRONG_ORIGIN",
    "ExpectedTile",
    "LogEntryError",
    "LogReplay",
    "check_log_entry",
    "log_origin",
    "open_log_checkpoint",
    "parse_consistency_proof",
    "public_key_of",
]

#: The kinds of :class:`LogEntryError`.
MALFORMED_ENTRY = "malformed entry"
BAD_SIGNATURE = "bad signature"
WRONG_ORIGIN = "wrong origin"

#: Longest consistency proof body read: 64 lines of base64 SHA-256 hashes.
MAX_PROOF_BODY_BYTES = tlog.MAX_PROOF_HASHES * 45


class LogEntryError(ValueError):
    """A log entry that is not a statement the notary signed for this log.
    ``kind`` is :data:`MALFORMED_ENTRY`, :data:`BAD_SIGNATURE` or
    :data:`WRONG_ORIGIN`; the message says what is wrong, shortly."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


def log_origin(note: str) -> str:
    """The origin a checkpoint's note claims: its first line ("" if none)."""
    return note.split("\n", 1)[0]


def open_log_checkpoint(
    note: bytes | str, public_raw: bytes, *, origin: str | None = None
) -> tuple[tlog.Checkpoint, str]:
    """The checkpoint of a served note and the note as verified (its text
    and the v2 key's signature lines: what a client keeps), checked: the
    note is strict UTF-8, signed by the v2 key ``public_raw`` under the key
    name that is the log's origin (``origin`` when the caller knows it,
    else the note's first line), and its checkpoint names that origin.

    Error handling: ``VerificationError`` naming what failed.
    """
    if isinstance(note, bytes):
        if len(note) > tlog.MAX_NOTE_BYTES:
            raise VerificationError("bad checkpoint: too large")
        try:
            note = note.decode("utf-8")
        except UnicodeDecodeError:
            raise VerificationError("bad checkpoint: not UTF-8") from None
    claimed = log_origin(note)
    if origin is not None and claimed != origin:
        raise VerificationError(
            f"the checkpoint is of another log ({claimed[:80]!r}, not {origin!r})"
        )
    return open_checkpoint_note(note, claimed, public_raw)


def check_log_entry(
    entry: bytes, *, origin: str, public_key: Ed25519PublicKey, key_id: str, index: int = 0
) -> ParsedStatement:
    """Entry ``index`` of log ``origin`` parsed and checked: strict JSON, a
    statement entry (rules S1, S3) in its canonical form without an
    ``inclusion``, signed by ``public_key`` (whose rule S4 id is
    ``key_id``), whose ``log`` promise names ``origin``.

    Expiry is not checked: a logged statement stays in the log after its
    ``valid_until``.

    Error handling: :class:`LogEntryError`.
    """
    try:
        document = strictjson.loads(entry)
    except ValueError:
        raise LogEntryError(MALFORMED_ENTRY, "not strict UTF-8 JSON") from None
    try:
        parsed = parse_statement_entry(index, document)
    except ProtocolError as exc:
        raise LogEntryError(MALFORMED_ENTRY, str(exc)) from None
    if parsed.inclusion is not None:
        raise LogEntryError(MALFORMED_ENTRY, "a log entry carries an inclusion proof")
    if parsed.entry_bytes != bytes(entry):
        raise LogEntryError(MALFORMED_ENTRY, "not in canonical form (as signed)")
    if parsed.key_id != key_id:
        raise LogEntryError(BAD_SIGNATURE, f"signed by another key (key id {parsed.key_id[:20]})")
    if not verify_signature(public_key, parsed.signed_bytes, parsed.signature):
        raise LogEntryError(BAD_SIGNATURE, "the statement's signature does not verify")
    if parsed.log is None:
        raise LogEntryError(MALFORMED_ENTRY, "the statement promises no log")
    if parsed.log.origin != origin:
        raise LogEntryError(
            WRONG_ORIGIN, f"the statement promises log {parsed.log.origin[:80]!r}"
        )
    return parsed


def public_key_of(public_raw: bytes) -> tuple[Ed25519PublicKey, str]:
    """The v2 key from its raw 32 bytes and its rule S4 key id; raises
    ``ValueError`` for bytes that are not an Ed25519 public key."""
    return Ed25519PublicKey.from_public_bytes(public_raw), key_id_of(public_raw)


@dataclass(frozen=True, slots=True)
class ExpectedTile:
    """A hash tile of the tree (``level``, ``index``, ``width`` hashes) and
    the bytes it must hold, recomputed from the entries."""

    level: int
    index: int
    width: int
    hashes: bytes


class LogReplay:
    """The tree of a log of ``size`` leaves, recomputed from its entries
    given in order from index ``start.size`` (0 without ``start``).

    ``start``: the right edge of the tree already checked (its root equal
    to a verified checkpoint's); this object appends to it, the caller's
    range is not copied. ``expect_tiles``: also recompute the hash tiles
    of the tree of ``size`` leaves, which needs every leaf: only from 0.

    Resource handling: O(log size) hashes, plus at most one tile being
    filled per tile level (8 KiB each) when ``expect_tiles``.
    """

    __slots__ = ("_edge", "_filling", "_size", "expect_tiles")

    def __init__(
        self, size: int, *, start: tlog.CompactRange | None = None, expect_tiles: bool = False
    ) -> None:
        edge = start if start is not None else tlog.CompactRange()
        if not isinstance(size, int) or not edge.size <= size:
            raise ValueError("the tree is smaller than where the replay starts")
        if expect_tiles and edge.size:
            raise ValueError("tiles are recomputed only from the first leaf")
        self._edge = edge
        self._size = size
        self.expect_tiles = expect_tiles
        self._filling: dict[int, bytearray] = {}

    @property
    def next_index(self) -> int:
        """The index of the next entry to give to :meth:`add`."""
        return self._edge.size

    @property
    def edge(self) -> tlog.CompactRange:
        return self._edge

    @property
    def complete(self) -> bool:
        return self._edge.size == self._size

    def add(self, entry: bytes) -> list[ExpectedTile]:
        """Append ``entry`` (the logged bytes) and return the tiles it
        completes (none unless ``expect_tiles``), lowest level first.
        Raises ``ValueError`` once the tree has all its leaves."""
        if self._edge.size >= self._size:
            raise ValueError("the tree has all its leaves")
        completed = self._edge.append(tlog.leaf_hash(entry))
        if not self.expect_tiles:
            return []
        tiles = []
        for level, index, digest in completed:
            if level % tlog.TILE_HEIGHT:
                continue
            tile_level = level // tlog.TILE_HEIGHT
            buffer = self._filling.setdefault(tile_level, bytearray())
            buffer += digest
            tile_index = index // tlog.TILE_WIDTH
            full, partial = tlog.tile_count(self._size, tile_level)
            width = tlog.TILE_WIDTH if tile_index < full else partial
            if index % tlog.TILE_WIDTH == width - 1:
                tiles.append(ExpectedTile(tile_level, tile_index, width, bytes(buffer)))
                buffer.clear()
        return tiles

    def root(self) -> bytes:
        """The root of the leaves added so far (all of them: the tree's)."""
        return self._edge.root()


def parse_consistency_proof(body: bytes) -> list[bytes]:
    """The hashes of a ``proof/consistency`` body: one standard base64
    SHA-256 hash per line, each line ending in a newline, at most
    ``tlog.MAX_PROOF_HASHES``.

    Error handling: ``tlog.ProofError`` for anything else.
    """
    if len(body) > MAX_PROOF_BODY_BYTES:
        raise tlog.ProofError("proof is too long")
    if body and not body.endswith(b"\n"):
        raise tlog.ProofError("proof does not end in a newline")
    proof = []
    for line in body.split(b"\n")[:-1]:
        try:
            node = binascii.a2b_base64(line, strict_mode=True)
        except (binascii.Error, ValueError):
            raise tlog.ProofError("proof line is not base64") from None
        if len(node) != tlog.HASH_SIZE or len(line) != 44:
            raise tlog.ProofError("proof line is not a SHA-256 hash")
        proof.append(node)
    if len(proof) > tlog.MAX_PROOF_HASHES:
        raise tlog.ProofError("proof is too long")
    return proof
