"""The transparency log's rows in the store (SQLite): entries, tiles and the
signed head, appended in one write transaction per batch.

The log is sequenced by whoever holds the database's write lock: a batch is
appended in a ``BEGIN IMMEDIATE`` transaction that reads the tree's size,
writes the entries after it, the hashes they complete into the tiles
(C2SP tlog-tiles: levels 0, 8, 16, ... of the tree, 256 hashes a tile) and
the new checkpoint, signed inside the transaction. The workers of a node
sharing the file therefore append one after the other, never at the same
indices: one sequencer at a time per logical notary.

Crash guarantees: a batch is committed whole or not at all (entries, tiles
and checkpoint together), and the log's connection commits with
``synchronous=FULL``: a checkpoint a client has seen survives a power loss
(with ``NORMAL`` the last transactions could roll back and the next batch
would be sequenced at the same indices: to a client, a fork).

Append-only: rows are only inserted, and tiles only grow (a partial tile is
rewritten with the same hashes first; ``append`` checks this and refuses to
write anything else, ``LogCorrupted``).

The sequencing algorithm and the log's SQL are written once, here, for
both engines, over their connections (``notary.state.connection``):
``append_rows`` appends a batch through a ``LogRows`` (the rows, inside an
engine's write transaction) and ``LogEngine`` reads, appends and derives
proofs from any engine's ``head`` and ``tile``; an engine brings its
connection, its tables' types and how a sequencer takes its turn
(``_take_turn``). ``notary.state.pgtlogstore`` is the PostgreSQL engine (a
fleet's log: one sequencer, the holder of an advisory lock).

Synchronous, like ``notary.state.store``: the Trio edge
(``notary.outbound.logappender``) runs these functions in a worker thread.
Resource handling: ``LogStore`` owns its ``SqliteConnection``; ``close()``
releases it. Error handling: ``sqlite3`` errors are raised as
``StoreError`` naming the file.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from notary.errors import StoreError
from notary.protocol import tlog
from notary.state import logcosignatures
from notary.state.connection import (
    Columns,
    Connection,
    ConnectionOwner,
    SqliteConnection,
    Transaction,
)

__all__ = [
    "MAX_BATCH", "SCHEMA", "Appended", "CheckpointSigner", "LogCorrupted", "LogEngine", "LogHead",
    "LogRows", "LogStore", "append_rows", "check_batch",
]

#: Made on first use (``CREATE ... IF NOT EXISTS``), beside the
#: observations; the observation schema's version does not cover it.
SCHEMA = """
    CREATE TABLE IF NOT EXISTS log_entries (
        idx   INTEGER PRIMARY KEY,
        entry BLOB NOT NULL
    );
    CREATE TABLE IF NOT EXISTS log_tiles (
        level  INTEGER NOT NULL,
        idx    INTEGER NOT NULL,
        hashes BLOB NOT NULL,
        PRIMARY KEY (level, idx)
    ) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS log_head (
        id         INTEGER PRIMARY KEY CHECK (id = 1),
        size       INTEGER NOT NULL,
        checkpoint TEXT NOT NULL
    );
"""
BUSY_TIMEOUT_MS = 10_000
#: Entries appended per transaction at most (the caller splits larger batches).
MAX_BATCH = 4096
#: ``log_entries``'s columns (``Connection.insert_rows``).
_ENTRY_COLUMNS: Columns = (("idx", "bigint"), ("entry", "bytea"))
_HEAD = "SELECT size, checkpoint FROM log_head WHERE id = 1"
_TILE = "SELECT hashes FROM log_tiles WHERE level = ? AND idx = ?"

#: Signs the checkpoint of a tree: (size, root hash) -> the signed note.
CheckpointSigner = Callable[[int, bytes], str]


class LogCorrupted(StoreError):
    """The stored log contradicts itself (a tile whose stored hashes differ
    from the ones recomputed): nothing more is appended."""


@dataclass(frozen=True, slots=True)
class LogHead:
    """The newest checkpoint: the tree's size and its signed note."""

    size: int
    checkpoint: str


@dataclass(frozen=True, slots=True)
class Appended:
    """A committed batch: the checkpoint that covers it, and for each entry
    in order its index and inclusion proof to that checkpoint."""

    head: LogHead
    first_index: int
    proofs: tuple[tuple[bytes, ...], ...]


def check_batch(entries: Sequence[bytes]) -> None:
    """Raise ``ValueError`` unless ``entries`` is a batch ``append`` takes:
    1 to ``MAX_BATCH`` entries of at most 65,535 bytes (a tile bundle's)."""
    if not 0 < len(entries) <= MAX_BATCH:
        raise ValueError(f"a batch holds 1 to {MAX_BATCH} entries")
    if any(len(entry) > tlog.MAX_ENTRY_BYTES for entry in entries):
        raise ValueError("a log entry holds at most 65535 bytes")


def stored_tile_reader(
    read_tile: Callable[[int, int], bytes | None], where: str
) -> tlog.ReadTile:
    """``TileHashReader``'s source over an engine's ``read_tile(level,
    index)``: the first ``width`` hashes of a tile, ``LogCorrupted`` (naming
    ``where``) when the tile lacks some."""

    def read(level: int, index: int, width: int) -> bytes:
        hashes = read_tile(level, index)
        if hashes is None or len(hashes) < width * tlog.HASH_SIZE:
            raise LogCorrupted(f"{where}: log tile {level}/{index} lacks hashes the head covers")
        return hashes[: width * tlog.HASH_SIZE]

    return read


class LogRows(Protocol):
    """One engine's rows of the log, inside its append transaction (after
    it took the sequencer's lock): what ``append_rows`` reads and writes."""

    def size(self) -> int:
        """The stored tree's size (0: nothing appended yet)."""

    def tile(self, level: int, index: int) -> bytes | None:
        """The stored hashes of a tile, as this transaction sees them."""

    def put_tile(self, level: int, index: int, hashes: bytes) -> None:
        """Insert or replace a tile (its stored hashes, then more)."""

    def put_entries(self, first: int, entries: Sequence[bytes]) -> None:
        """Insert ``entries`` at indices ``first``, ``first + 1``, ..."""

    def put_head(self, size: int, checkpoint: str) -> None:
        """Insert or replace the head."""


def append_rows(
    rows: LogRows, entries: Sequence[bytes], sign: CheckpointSigner, where: str
) -> Appended:
    """Append ``entries`` (a ``check_batch`` batch) after the tree ``rows``
    holds: the tiles they complete, the entries, and the head with the
    checkpoint ``sign`` makes of the new tree; return their indices and
    inclusion proofs to it. The caller's transaction makes this atomic.
    Raises ``LogCorrupted`` (naming ``where``) when stored tiles contradict
    the tree; whatever ``rows`` raises propagates."""
    read_tile = stored_tile_reader(rows.tile, where)
    first = rows.size()
    edge = tlog.CompactRange.from_tree(first, tlog.TileHashReader(first, read_tile).perfect)
    # The hashes each tile gains, in order (levels 0, 8, 16, ...).
    grown: dict[tuple[int, int], list[tuple[int, bytes]]] = {}
    for entry in entries:
        for level, index, digest in edge.append(tlog.leaf_hash(entry)):
            if level % tlog.TILE_HEIGHT == 0:
                tile = (level // tlog.TILE_HEIGHT, index // tlog.TILE_WIDTH)
                grown.setdefault(tile, []).append((index % tlog.TILE_WIDTH, digest))
    for (level, index), added in grown.items():
        stored = rows.tile(level, index) or b""
        start = added[0][0]
        if len(stored) != start * tlog.HASH_SIZE or any(
            position != start + offset for offset, (position, _) in enumerate(added)
        ):
            raise LogCorrupted(
                f"{where}: log tile {level}/{index} holds {len(stored) // tlog.HASH_SIZE} "
                f"hashes where the tree needs {start}"
            )
        rows.put_tile(level, index, stored + b"".join(digest for _, digest in added))
    rows.put_entries(first, entries)
    size = edge.size
    checkpoint = sign(size, edge.root())
    rows.put_head(size, checkpoint)
    reader = tlog.TileHashReader(size, read_tile)
    proofs = tuple(
        tuple(tlog.inclusion_proof(first + offset, size, reader.perfect))
        for offset in range(len(entries))
    )
    return Appended(LogHead(size, checkpoint), first, proofs)


class LogEngine(ConnectionOwner):
    """One connection to the log's rows, of either engine (``LogStore``
    here, ``pgtlogstore.PostgresLogStore``): its reads, ``append`` and
    ``close``, with the proofs derived here from its ``head()`` and
    ``tile()``; ``path`` names the database in messages. A context manager
    closing it."""

    path: object

    # -- reads (any process, any node) -------------------------------------------------

    def head(self) -> LogHead | None:
        """The newest checkpoint (None: nothing was ever appended)."""
        rows = self._db.read(_HEAD)
        return LogHead(int(rows[0][0]), rows[0][1]) if rows else None

    def tile(self, level: int, index: int) -> bytes | None:
        """The stored hashes of a tile (a partial tile: those there so far)."""
        rows = self._db.read(_TILE, (level, index))
        return bytes(rows[0][0]) if rows else None

    def entries(self, start: int, end: int) -> list[bytes]:
        """The entries at indices ``start`` to ``end`` - 1 that exist, in order."""
        rows = self._db.read(
            "SELECT entry FROM log_entries WHERE idx >= ? AND idx < ? ORDER BY idx", (start, end)
        )
        return [bytes(row[0]) for row in rows]

    # -- the sequencer -----------------------------------------------------------------

    def append(self, entries: Sequence[bytes], sign: CheckpointSigner) -> Appended:
        """Append ``entries`` (at most ``MAX_BATCH``, in order) after the
        stored tree, in one write transaction (once this sequencer's turn
        came: ``_take_turn``) that also writes their tiles and the
        checkpoint ``sign`` makes of the new tree. Returns their indices and
        inclusion proofs to that checkpoint.

        Error handling: ``StoreError`` (nothing written) when the database
        fails (PostgreSQL: or the turn does not come within its lock
        timeout); ``LogCorrupted`` when stored tiles contradict the tree;
        ``ValueError`` for an empty or oversized batch, or an entry longer
        than a tile bundle allows (65,535 bytes)."""
        check_batch(entries)
        with self._db.transaction() as db:
            self._take_turn(db)
            return append_rows(_LogRows(self._db, db), entries, sign, f"database {self.path}")

    def _take_turn(self, db: Transaction) -> None:
        """What this engine does first in an append's transaction for the
        sequencers to take turns (SQLite: nothing, ``BEGIN IMMEDIATE`` took
        the file's write lock)."""

    def consistency_proof(self, old_size: int, new_size: int) -> list[bytes]:
        """RFC 9162's consistency proof between two sizes of the stored tree.
        Raises ``ValueError`` for sizes out of order or beyond the tree."""
        head = self.head()
        size = head.size if head is not None else 0
        if not 0 <= old_size <= new_size <= size:
            raise ValueError(f"sizes must be 0 <= old <= new <= {size}")
        reader = tlog.TileHashReader(new_size, self._stored_tile)
        return tlog.consistency_proof(old_size, new_size, reader.perfect)

    def inclusion_proof(self, index: int, size: int) -> list[bytes]:
        """RFC 9162's inclusion proof of entry ``index`` in the tree of ``size``."""
        head = self.head()
        if head is None or not 0 <= index < size <= head.size:
            raise ValueError("index and size must be within the stored tree")
        reader = tlog.TileHashReader(size, self._stored_tile)
        return tlog.inclusion_proof(index, size, reader.perfect)

    def inclusion_proofs(self, indices: Sequence[int], size: int) -> list[list[bytes]]:
        """The inclusion proofs of entries ``indices`` in the tree of
        ``size``, read through one tile reader (tiles shared by the proofs
        are read once). ``ValueError`` as :meth:`inclusion_proof`."""
        head = self.head()
        if head is None or not 0 < size <= head.size or any(
            not 0 <= index < size for index in indices
        ):
            raise ValueError("indices and size must be within the stored tree")
        reader = tlog.TileHashReader(size, self._stored_tile)
        return [tlog.inclusion_proof(index, size, reader.perfect) for index in indices]

    # -- the witnesses' cosignatures (notary.state.logcosignatures) ---------------------

    def cosignatures(self) -> list[logcosignatures.StoredCosignature]:
        return logcosignatures.read(self._db)

    def add_cosignature(self, cosignature: logcosignatures.StoredCosignature) -> None:
        logcosignatures.add(self._db, cosignature)

    def take_witness_turn(
        self, witness: str, holder: str, now_ms: int, until_ms: int
    ) -> logcosignatures.Turn | None:
        return logcosignatures.take_turn(
            self._db, witness, holder, now_ms=now_ms, until_ms=until_ms
        )

    def record_witness_size(self, witness: str, holder: str, size: int) -> None:
        logcosignatures.record_held_size(self._db, witness, holder, size)

    def _stored_tile(self, level: int, index: int, width: int) -> bytes:
        """``TileHashReader``'s source: the first ``width`` hashes of a tile."""
        return stored_tile_reader(self.tile, f"database {self.path}")(level, index, width)


class LogStore(LogEngine):
    """See the module docstring. ``path``: the SQLite database file."""

    def __init__(self, path: Path, *, synchronous: str = "FULL") -> None:
        if synchronous.upper() not in ("NORMAL", "FULL", "EXTRA"):
            raise StoreError(f"the log needs synchronous NORMAL or stronger, not {synchronous}")
        self.path = path
        self._db = SqliteConnection.open(
            path, synchronous=synchronous.upper(), busy_timeout_ms=BUSY_TIMEOUT_MS
        )
        try:
            self._db.create_tables(SCHEMA + logcosignatures.SCHEMA)
        except BaseException:
            self._db.close()
            raise


class _LogRows:
    """``LogRows`` in a transaction ``db`` of ``connection`` that holds the
    sequencer's turn (each statement sees the previous holder's commit)."""

    def __init__(self, connection: Connection, db: Transaction) -> None:
        self._connection = connection
        self._db = db

    def size(self) -> int:
        row = self._db.execute(_HEAD).fetchone()
        return int(row[0]) if row is not None else 0

    def tile(self, level: int, index: int) -> bytes | None:
        row = self._db.execute(_TILE, (level, index)).fetchone()
        return bytes(row[0]) if row is not None else None

    def put_tile(self, level: int, index: int, hashes: bytes) -> None:
        self._db.execute(
            "INSERT INTO log_tiles (level, idx, hashes) VALUES (?, ?, ?) "
            "ON CONFLICT (level, idx) DO UPDATE SET hashes = excluded.hashes",
            (level, index, hashes),
        )

    def put_entries(self, first: int, entries: Sequence[bytes]) -> None:
        self._connection.insert_rows(self._db, "log_entries", _ENTRY_COLUMNS, [
            (first + offset, entry) for offset, entry in enumerate(entries)
        ])

    def put_head(self, size: int, checkpoint: str) -> None:
        self._db.execute(
            "INSERT INTO log_head (id, size, checkpoint) VALUES (1, ?, ?) "
            "ON CONFLICT (id) DO UPDATE SET size = excluded.size, "
            "checkpoint = excluded.checkpoint",
            (size, checkpoint),
        )
