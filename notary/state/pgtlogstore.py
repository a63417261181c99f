"""The transparency log's rows on PostgreSQL, for the nodes of a fleet
sharing one database (``notary.state.pgstore``): the operations of
:class:`notary.state.tlogstore.LogStore`, with the same rows, the same
statements and the same append algorithm (``tlogstore.LogEngine``,
``tlogstore.append_rows``); this module adds the tables' types and the
sequencer's lock.

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
``PostgresConnection`` (``notary.state.connection``: autocommit,
explicit transactions); ``close()`` releases it. A connection the server
dropped is made again, as that module says. Error handling: every
``psycopg`` error is raised as ``StoreError`` naming the database without
its password (``notary.state.dsn``).
"""

from __future__ import annotations

from notary.state import logcosignatures
from notary.state.connection import PostgresConnection, Transaction
from notary.state.tlogstore import LogEngine

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
            self._db.create_tables(SCHEMA + logcosignatures.PG_SCHEMA)
        except BaseException:
            self._db.close()
            raise

    def _take_turn(self, db: Transaction) -> None:
        """The sequencer's lock, ``LOG_LOCK`` (a wait bounded by
        ``LOCK_TIMEOUT_MS``), and a commit that waits for the WAL flush."""
        db.execute("SET LOCAL synchronous_commit = on")
        db.execute("SELECT pg_advisory_xact_lock(?)", (LOG_LOCK,))
