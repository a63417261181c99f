"""What the notary holds as a witness (C2SP tlog-witness): for each log
origin it witnesses, the last checkpoint it cosigned (size, root and the
signed note it was given), in the store beside the observations.

Compare-and-swap: ``swap(origin, held, new)`` replaces the held checkpoint
only if it is still ``held`` (the one the request's consistency proof was
checked against), in one statement, so one transaction: an ``UPDATE ...
WHERE size = ? AND root = ?`` (or an ``INSERT`` that does nothing when a
row exists). Two requests checked against the same held checkpoint cannot
both swap; the loser's caller answers 409 with the size now held. This is
the atomic check-and-persist the spec asks for, across the workers of a
node and the nodes of a fleet sharing the database, and across restarts:
a witness never cosigns two checkpoints of one origin that are not
consistent. The caller cosigns only after ``swap`` returned True
(persisted first, then answered).

Crash guarantees: the SQLite connection commits with ``synchronous=FULL``
and PostgreSQL's with ``synchronous_commit=on``: a checkpoint the witness
cosigned survives a power loss (a rolled-back size would let it cosign a
fork).

Engines: ``WitnessStore`` (SQLite file), ``PostgresWitnessStore`` (the
fleet's database, ``[store] dsn``), each its tables' types and its
connection (``notary.state.connection``), the SQL written once
(``WitnessRows``). Synchronous: the Trio edge (``notary.server.witness``)
runs these methods in a worker thread. Resource handling: each store owns
its one connection; ``close()`` releases it. A PostgreSQL connection the
server dropped is made again, as that module says. Error handling:
database errors are raised as ``StoreError`` naming the database
(PostgreSQL: never its password).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from notary.protocol.tlog import HeldCheckpoint
from notary.state.connection import ConnectionOwner, PostgresConnection, SqliteConnection

__all__ = ["PostgresWitnessStore", "WitnessEngine", "WitnessRows", "WitnessStore"]

SCHEMA = """
    CREATE TABLE IF NOT EXISTS witness_checkpoints (
        origin     TEXT PRIMARY KEY,
        size       INTEGER NOT NULL,
        root       BLOB NOT NULL,
        checkpoint TEXT NOT NULL
    );
"""
PG_SCHEMA = """
    CREATE TABLE IF NOT EXISTS witness_checkpoints (
        origin     TEXT PRIMARY KEY,
        size       BIGINT NOT NULL,
        root       BYTEA NOT NULL,
        checkpoint TEXT NOT NULL
    );
"""
BUSY_TIMEOUT_MS = 10_000
_SELECT = "SELECT size, root, checkpoint FROM witness_checkpoints WHERE origin = ?"
_INSERT = (
    "INSERT INTO witness_checkpoints (origin, size, root, checkpoint) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (origin) DO NOTHING"
)
_UPDATE = (
    "UPDATE witness_checkpoints SET size = ?, root = ?, checkpoint = ? "
    "WHERE origin = ? AND size = ? AND root = ?"
)


class WitnessEngine(Protocol):
    """What the witness endpoint needs of a store."""

    def held(self, origin: str) -> HeldCheckpoint | None:
        """The checkpoint held for ``origin`` (None: never cosigned one)."""

    def swap(self, origin: str, held: HeldCheckpoint | None, new: HeldCheckpoint) -> bool:
        """Hold ``new`` for ``origin`` if ``held`` is still held (None:
        nothing is); whether it was swapped."""

    def close(self) -> None: ...


class WitnessRows(ConnectionOwner):
    """``held`` and ``swap`` over an engine's connection ``_db``: the SQL
    written once."""

    def held(self, origin: str) -> HeldCheckpoint | None:
        rows = self._db.read(_SELECT, (origin,))
        return HeldCheckpoint(int(rows[0][0]), bytes(rows[0][1]), rows[0][2]) if rows else None

    def swap(self, origin: str, held: HeldCheckpoint | None, new: HeldCheckpoint) -> bool:
        if held is None:
            changed = self._db.change(_INSERT, (origin, new.size, new.root, new.note))
        else:
            changed = self._db.change(
                _UPDATE, (new.size, new.root, new.note, origin, held.size, held.root)
            )
        return changed == 1


class WitnessStore(WitnessRows):
    """See the module docstring. ``path``: the SQLite database file."""

    def __init__(self, path: Path | str) -> None:
        self.path = path
        self._db = SqliteConnection.open(path, synchronous="FULL", busy_timeout_ms=BUSY_TIMEOUT_MS)
        try:
            self._db.create_tables(SCHEMA)
        except BaseException:
            self._db.close()
            raise


class PostgresWitnessStore(WitnessRows):
    """See the module docstring. ``dsn``: the store's (``[store] dsn``)."""

    def __init__(self, dsn: str) -> None:
        self._db = PostgresConnection(
            dsn, statement_timeout_ms=BUSY_TIMEOUT_MS, synchronous_commit="on",
        )
        self.path = self._db.path
        try:
            self._db.create_tables(PG_SCHEMA)
        except BaseException:
            self._db.close()
            raise
