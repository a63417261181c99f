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

Synchronous, like ``notary.state.store``: the Trio edge
(``notary.outbound.logappender``) runs these functions in a worker thread.
Resource handling: ``LogStore`` owns its ``sqlite3.Connection``;
``close()`` releases it. Error handling: ``sqlite3`` errors are raised as
``StoreError`` naming the file.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from notary.errors import StoreError
from notary.protocol import tlog

__all__ = ["SCHEMA", "Appended", "LogCorrupted", "LogHead", "LogStore"]

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


class LogStore:
    """See the module docstring. ``path``: the SQLite database file."""

    def __init__(self, path: Path, *, synchronous: str = "FULL") -> None:
        self.path = path
        try:
            self._db = sqlite3.connect(
                str(path), isolation_level=None, check_same_thread=False,
                timeout=BUSY_TIMEOUT_MS / 1000,
            )
            self._db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            self._db.execute("PRAGMA journal_mode = WAL")
            if synchronous.upper() not in ("NORMAL", "FULL", "EXTRA"):
                raise StoreError(f"the log needs synchronous NORMAL or stronger, not {synchronous}")
            self._db.execute(f"PRAGMA synchronous = {synchronous.upper()}")
            self._db.executescript(SCHEMA)
        except sqlite3.Error as exc:
            raise StoreError(f"database {path}: {exc}") from None

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> LogStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StoreError(f"database {self.path}: {exc}") from None

    def _read(self, sql: str, parameters: tuple = ()) -> list[tuple]:
        try:
            return self._db.execute(sql, parameters).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"database {self.path}: {exc}") from None

    # -- reads (any process) ---------------------------------------------------

    def head(self) -> LogHead | None:
        """The newest checkpoint (None: nothing was ever appended)."""
        rows = self._read("SELECT size, checkpoint FROM log_head WHERE id = 1")
        return LogHead(rows[0][0], rows[0][1]) if rows else None

    def tile(self, level: int, index: int) -> bytes | None:
        """The stored hashes of a tile (a partial tile: those there so far)."""
        rows = self._read(
            "SELECT hashes FROM log_tiles WHERE level = ? AND idx = ?", (level, index)
        )
        return bytes(rows[0][0]) if rows else None

    def entries(self, start: int, end: int) -> list[bytes]:
        """The entries at indices ``start`` to ``end`` - 1 that exist, in order."""
        rows = self._read(
            "SELECT entry FROM log_entries WHERE idx >= ? AND idx < ? ORDER BY idx", (start, end)
        )
        return [bytes(row[0]) for row in rows]

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

    def _stored_tile(self, level: int, index: int, width: int) -> bytes:
        """``TileHashReader``'s source: the first ``width`` hashes of a tile."""
        hashes = self.tile(level, index)
        if hashes is None or len(hashes) < width * tlog.HASH_SIZE:
            raise LogCorrupted(
                f"database {self.path}: log tile {level}/{index} lacks hashes the head covers"
            )
        return hashes[: width * tlog.HASH_SIZE]

    # -- the sequencer ---------------------------------------------------------

    def append(self, entries: Sequence[bytes], sign: CheckpointSigner) -> Appended:
        """Append ``entries`` (at most ``MAX_BATCH``, in order) after the
        stored tree, in one write transaction that also writes their tiles
        and the checkpoint ``sign`` makes of the new tree. Returns their
        indices and inclusion proofs to that checkpoint.

        Error handling: ``StoreError`` (nothing written) when the database
        fails; ``LogCorrupted`` when stored tiles contradict the tree;
        ``ValueError`` for an empty or oversized batch, or an entry longer
        than a tile bundle allows (65,535 bytes)."""
        if not 0 < len(entries) <= MAX_BATCH:
            raise ValueError(f"a batch holds 1 to {MAX_BATCH} entries")
        if any(len(entry) > 0xFFFF for entry in entries):
            raise ValueError("a log entry holds at most 65535 bytes")
        with self._transaction() as db:
            row = db.execute("SELECT size FROM log_head WHERE id = 1").fetchone()
            first = row[0] if row is not None else 0
            edge = tlog.CompactRange.from_tree(
                first, tlog.TileHashReader(first, self._stored_tile).perfect
            )
            # The hashes each tile gains, in order (levels 0, 8, 16, ...).
            grown: dict[tuple[int, int], list[tuple[int, bytes]]] = {}
            for entry in entries:
                for level, index, digest in edge.append(tlog.leaf_hash(entry)):
                    if level % tlog.TILE_HEIGHT == 0:
                        tile = (level // tlog.TILE_HEIGHT, index // tlog.TILE_WIDTH)
                        grown.setdefault(tile, []).append((index % tlog.TILE_WIDTH, digest))
            for (level, index), added in grown.items():
                self._grow_tile(db, level, index, added)
            db.executemany(
                "INSERT INTO log_entries (idx, entry) VALUES (?, ?)",
                ((first + offset, entry) for offset, entry in enumerate(entries)),
            )
            size = edge.size
            checkpoint = sign(size, edge.root())
            db.execute(
                "INSERT INTO log_head (id, size, checkpoint) VALUES (1, ?, ?) "
                "ON CONFLICT (id) DO UPDATE SET size = excluded.size, "
                "checkpoint = excluded.checkpoint",
                (size, checkpoint),
            )
            reader = tlog.TileHashReader(size, self._stored_tile)
            proofs = tuple(
                tuple(tlog.inclusion_proof(first + offset, size, reader.perfect))
                for offset in range(len(entries))
            )
        return Appended(LogHead(size, checkpoint), first, proofs)

    def _grow_tile(
        self, db: sqlite3.Connection, level: int, index: int, added: list[tuple[int, bytes]]
    ) -> None:
        row = db.execute(
            "SELECT hashes FROM log_tiles WHERE level = ? AND idx = ?", (level, index)
        ).fetchone()
        stored = bytes(row[0]) if row is not None else b""
        start = added[0][0]
        if len(stored) != start * tlog.HASH_SIZE or any(
            position != start + offset for offset, (position, _) in enumerate(added)
        ):
            raise LogCorrupted(
                f"database {self.path}: log tile {level}/{index} holds {len(stored) // 32} "
                f"hashes where the tree needs {start}"
            )
        hashes = stored + b"".join(digest for _, digest in added)
        db.execute(
            "INSERT INTO log_tiles (level, idx, hashes) VALUES (?, ?, ?) "
            "ON CONFLICT (level, idx) DO UPDATE SET hashes = excluded.hashes",
            (level, index, hashes),
        )
