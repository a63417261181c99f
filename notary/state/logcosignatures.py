"""The witnesses' cosignatures of the notary's log, kept in the store beside
the log (docs/log.md "Witnesses"): one set per notary, however many
workers and nodes serve it.

Two tables, written once for both engines (``?`` placeholders, over an
engine's ``Connection``):

* ``log_cosignatures``: each cosignature line a witness returned, with the
  checkpoint (the log's signed note) it covers, keyed by (size, witness).
  Every worker reads them (``read``) to serve its answers and
  ``/v2/log/checkpoint`` with the cosigned checkpoint; each witness keeps
  its newest :data:`KEEP_PER_WITNESS` rows (``add`` prunes the rest).
* ``log_witness_turns``: who submits to each witness. A process takes the
  turn (``take_turn``) when nobody holds it, the holder's has expired
  (``until_ms``) or it holds it already, so each checkpoint is submitted to
  each witness once per notary, not once per worker; a holder that crashed
  holds nothing for long. The turn also keeps the size the witness was last
  known to hold (``held_size``), so a new holder starts from it.

Synchronous: the Trio edge (``notary.outbound.witnessing``) calls these in
a worker thread. Errors are the connection's (``StoreError``).
"""

from __future__ import annotations

from dataclasses import dataclass

from notary.state.connection import Connection

__all__ = [
    "KEEP_PER_WITNESS", "PG_SCHEMA", "SCHEMA", "StoredCosignature", "Turn", "add", "read",
    "record_held_size", "take_turn",
]

#: Cosignatures kept per witness: its newest.
KEEP_PER_WITNESS = 16
#: Rows read at most (``KEEP_PER_WITNESS`` for each of 64 witnesses).
MAX_ROWS = 1024

SCHEMA = """
    CREATE TABLE IF NOT EXISTS log_cosignatures (
        size       INTEGER NOT NULL,
        witness    TEXT NOT NULL,
        checkpoint TEXT NOT NULL,
        line       TEXT NOT NULL,
        PRIMARY KEY (size, witness)
    );
    CREATE TABLE IF NOT EXISTS log_witness_turns (
        witness   TEXT PRIMARY KEY,
        holder    TEXT NOT NULL,
        until_ms  INTEGER NOT NULL,
        held_size INTEGER NOT NULL
    );
"""
PG_SCHEMA = """
    CREATE TABLE IF NOT EXISTS log_cosignatures (
        size       BIGINT NOT NULL,
        witness    TEXT NOT NULL,
        checkpoint TEXT NOT NULL,
        line       TEXT NOT NULL,
        PRIMARY KEY (size, witness)
    );
    CREATE TABLE IF NOT EXISTS log_witness_turns (
        witness   TEXT PRIMARY KEY,
        holder    TEXT NOT NULL,
        until_ms  BIGINT NOT NULL,
        held_size BIGINT NOT NULL
    );
"""

_ADD = (
    "INSERT INTO log_cosignatures (size, witness, checkpoint, line) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (size, witness) DO UPDATE SET checkpoint = excluded.checkpoint, "
    "line = excluded.line"
)
_PRUNE = (
    "DELETE FROM log_cosignatures WHERE witness = ? AND size NOT IN "
    "(SELECT size FROM log_cosignatures WHERE witness = ? ORDER BY size DESC LIMIT ?)"
)
_READ = "SELECT size, witness, checkpoint, line FROM log_cosignatures ORDER BY size DESC LIMIT ?"
_TAKE_TURN = """
    INSERT INTO log_witness_turns (witness, holder, until_ms, held_size) VALUES (?, ?, ?, 0)
    ON CONFLICT (witness) DO UPDATE
        SET holder = excluded.holder, until_ms = excluded.until_ms
        WHERE log_witness_turns.until_ms <= ? OR log_witness_turns.holder = excluded.holder
    RETURNING held_size
"""
_HELD_SIZE = "UPDATE log_witness_turns SET held_size = ? WHERE witness = ? AND holder = ?"


@dataclass(frozen=True, slots=True)
class StoredCosignature:
    """A witness's (``witness``: its vkey) cosignature ``line`` of the
    checkpoint of ``size`` leaves (``checkpoint``: the log's signed note)."""

    size: int
    witness: str
    checkpoint: str
    line: str


@dataclass(frozen=True, slots=True)
class Turn:
    """A turn taken: the size the witness was last known to hold."""

    held_size: int


def add(db: Connection, cosignature: StoredCosignature) -> None:
    """Keep ``cosignature`` and drop that witness's rows beyond its newest
    :data:`KEEP_PER_WITNESS`, in one transaction."""
    with db.transaction() as tx:
        tx.execute(_ADD, (
            cosignature.size, cosignature.witness, cosignature.checkpoint, cosignature.line,
        ))
        tx.execute(_PRUNE, (cosignature.witness, cosignature.witness, KEEP_PER_WITNESS))


def read(db: Connection) -> list[StoredCosignature]:
    """The cosignatures kept, newest checkpoint first (at most ``MAX_ROWS``)."""
    return [
        StoredCosignature(int(size), witness, checkpoint, line)
        for size, witness, checkpoint, line in db.read(_READ, (MAX_ROWS,))
    ]


def take_turn(
    db: Connection, witness: str, holder: str, *, now_ms: int, until_ms: int
) -> Turn | None:
    """Take (or keep) the turn to submit to ``witness`` until ``until_ms``;
    None when another holder's turn runs past ``now_ms``."""
    with db.transaction() as tx:
        row = tx.execute(_TAKE_TURN, (witness, holder, until_ms, now_ms)).fetchone()
    return Turn(int(row[0])) if row is not None else None


def record_held_size(db: Connection, witness: str, holder: str, size: int) -> None:
    """Keep the size ``witness`` holds now (only while ``holder`` has the turn)."""
    db.change(_HELD_SIZE, (size, witness, holder))
