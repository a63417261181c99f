"""The transparency log's rows on PostgreSQL, for the nodes of a fleet
sharing one database (``notary.state.pgstore``): the operations of
:class:`notary.state.tlogstore.LogStore`, with the same rows and the same
append algorithm (``tlogstore.append_rows``).

One sequencer per logical notary: the lock holder; the others wait. A
batch is appended in one transaction that first takes a transaction-level
advisory lock dedicated to the log (``pg_advisory_xact_lock(LOG_LOCK)``),
then reads the tree's size, writes the entries after it, the tiles they
complete and the new checkpoint, signed inside the transaction. Every node
(and every worker of a node) appends through that lock, so one appends at a
time and the others wait for it, never at the same indices: a fleet has one
log. A wait is bounded by ``LOCK_TIMEOUT_MS`` (as is each statement): past
it ``append`` fails as a ``StoreError`` with nothing written, and the
appender retries with back-off. The lock is released at commit, once the
batch is visible to the next holder.

Crash guarantees: a batch is committed whole or not at all, and its commit
waits for the server's WAL flush (``synchronous_commit = on`` for the
transaction, whatever the server's default): a checkpoint a client has
seen survives the server's crash. With replicas, the server's
``synchronous_standby_names`` decides whether a failover may lose it.

Append-only, as on SQLite: rows are only inserted, tiles only grow
(``LogCorrupted`` otherwise); ``log_entries``'s primary key refuses an
index used twice.

Schema: made on first use (``CREATE TABLE IF NOT EXISTS``) under the
store's migration advisory lock, so nodes starting at once do not race.

Synchronous, like ``LogStore``: the Trio edge runs these methods in worker
threads. Resource handling: a ``PostgresLogStore`` owns one
``PostgresConnection`` (``notary.state.pgconnection``: autocommit,
explicit transactions); ``close()`` releases it. A connection the server
dropped is made again, as that module says. Error handling: every
``psycopg`` error is raised as ``StoreError`` naming the database without
its password (``pgconnection.describe_dsn``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from notary.state.pgconnection import MIGRATION_LOCK, PostgresConnection
from notary.state.tlogstore import (
    Appended,
    CheckpointSigner,
    LogEngine,
    LogHead,
    append_rows,
    check_batch,
)

__all__ = ["LOCK_TIMEOUT_MS", "LOG_LOCK", "SCHEMA", "PostgresLogStore"]

#: The tables of ``tlogstore.SCHEMA``, in PostgreSQL's types.
SCHEMA = """
    CREATE TABLE IF NOT EXISTS log_entries (
        idx   BIGINT PRIMARY KEY,
        entry BYTEA NOT NULL
    );
    CREATE TABLE IF NOT EXISTS log_tiles (
        level  INTEGER NOT NULL,
        idx    BIGINT NOT NULL,
        hashes BYTEA NOT NULL,
        PRIMARY KEY (level, idx)
    );
    CREATE TABLE IF NOT EXISTS log_head (
        id         INTEGER PRIMARY KEY CHECK (id = 1),
        size       BIGINT NOT NULL,
        checkpoint TEXT NOT NULL
    );
"""
#: The log's advisory lock key (``pg_advisory_xact_lock``): its sequencer.
#: ("notl"; the store's keys are "nota" and "notb".)
LOG_LOCK = 0x6E6F746C
#: How long a batch may wait for the lock (another node appending), and
#: how long one statement may take: past it ``append`` is a ``StoreError``.
LOCK_TIMEOUT_MS = 10_000


class PostgresLogStore(LogEngine):
    """See the module docstring. ``dsn``: the store's (``[store] dsn``)."""

    def __init__(self, dsn: str) -> None:
        self._db = PostgresConnection(
            dsn, statement_timeout_ms=LOCK_TIMEOUT_MS, lock_timeout_ms=LOCK_TIMEOUT_MS,
        )
        self.path = self._db.path  # what messages name (LogStore's path)
        try:
            with self._db.transaction() as db:
                db.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
                db.execute(SCHEMA)
        except BaseException:
            self._db.close()
            raise

    def close(self) -> None:
        self._db.close()

    # -- reads (any node) ----------------------------------------------------------

    def head(self) -> LogHead | None:
        """The newest checkpoint (None: nothing was ever appended)."""
        rows = self._db.read("SELECT size, checkpoint FROM log_head WHERE id = 1")
        return LogHead(int(rows[0][0]), rows[0][1]) if rows else None

    def tile(self, level: int, index: int) -> bytes | None:
        """The stored hashes of a tile (a partial tile: those there so far)."""
        rows = self._db.read(
            "SELECT hashes FROM log_tiles WHERE level = %s AND idx = %s", (level, index)
        )
        return bytes(rows[0][0]) if rows else None

    def entries(self, start: int, end: int) -> list[bytes]:
        """The entries at indices ``start`` to ``end`` - 1 that exist, in order."""
        rows = self._db.read(
            "SELECT entry FROM log_entries WHERE idx >= %s AND idx < %s ORDER BY idx",
            (start, end),
        )
        return [bytes(row[0]) for row in rows]

    # -- the sequencer -------------------------------------------------------------

    def append(self, entries: Sequence[bytes], sign: CheckpointSigner) -> Appended:
        """Append ``entries`` (at most ``MAX_BATCH``, in order) after the
        stored tree, in one transaction holding ``LOG_LOCK`` that also
        writes their tiles and the checkpoint ``sign`` makes of the new
        tree. Returns their indices and inclusion proofs to that checkpoint.

        Error handling: ``StoreError`` (nothing written) when the database
        fails or the lock is not had within ``LOCK_TIMEOUT_MS``;
        ``LogCorrupted`` when stored tiles contradict the tree;
        ``ValueError`` for an empty or oversized batch, or an entry longer
        than a tile bundle allows (65,535 bytes)."""
        check_batch(entries)
        with self._db.transaction() as db:
            db.execute("SET LOCAL synchronous_commit = on")
            db.execute("SELECT pg_advisory_xact_lock(%s)", (LOG_LOCK,))
            return append_rows(_PostgresRows(db), entries, sign, f"database {self.path}")


class _PostgresRows:
    """``LogRows`` on the connection of a transaction holding ``LOG_LOCK``
    (each statement, read committed, sees the previous holder's commit)."""

    def __init__(self, db: Any) -> None:
        self._db = db

    def size(self) -> int:
        row = self._db.execute("SELECT size FROM log_head WHERE id = 1").fetchone()
        return int(row[0]) if row is not None else 0

    def tile(self, level: int, index: int) -> bytes | None:
        row = self._db.execute(
            "SELECT hashes FROM log_tiles WHERE level = %s AND idx = %s", (level, index)
        ).fetchone()
        return bytes(row[0]) if row is not None else None

    def put_tile(self, level: int, index: int, hashes: bytes) -> None:
        self._db.execute(
            "INSERT INTO log_tiles (level, idx, hashes) VALUES (%s, %s, %b) "
            "ON CONFLICT (level, idx) DO UPDATE SET hashes = excluded.hashes",
            (level, index, hashes),
        )

    def put_entries(self, first: int, entries: Sequence[bytes]) -> None:
        # One statement (unnest of two arrays), not a round trip per entry.
        self._db.execute(
            "INSERT INTO log_entries (idx, entry) SELECT * FROM unnest(%b::bigint[], %b::bytea[])",
            (list(range(first, first + len(entries))), list(entries)),
        )

    def put_head(self, size: int, checkpoint: str) -> None:
        self._db.execute(
            "INSERT INTO log_head (id, size, checkpoint) VALUES (1, %s, %s) "
            "ON CONFLICT (id) DO UPDATE SET size = excluded.size, "
            "checkpoint = excluded.checkpoint",
            (size, checkpoint),
        )
