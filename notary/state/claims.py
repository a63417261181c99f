"""Probe claims: the processes sharing a store (a node's workers) probe a
target once at a time, not once each.

Before probing, a process claims the target in the store, in a write
transaction: it gets the claim when nobody holds one, the holder's claim
has expired (``until_ms``), or it holds it already. A process that finds the
target claimed waits for the holder's observation on the change feed, or
for a failure the holder left on the claim, or for the claim to expire, and
then probes itself. A claim expires on its own (a holder that crashed holds
nothing for long). When its probe ends the holder shortens its claim to a
moment (``release``), long enough for its observation to be committed, and
leaves a failure on it, so the waiters share the outcome instead of each
probing again; expired claims are deleted by the writer's maintenance.

Written once for both engines: these functions take the ``Transaction``
(``notary.state.connection``) of the store calling them
(``notary.state.observationstore``), ``claim`` and ``release`` in a write
transaction; the store reads ``READ`` on its own. Errors are the connection's
(``StoreError``).
"""

from __future__ import annotations

from dataclasses import dataclass

from notary.model.targets import Target
from notary.state.connection import Transaction

__all__ = ["MIGRATION", "READ", "Claim", "claim", "delete_expired", "read", "release"]

#: The SQLite schema's migration that adds the claims
#: (``notary.state.store.MIGRATIONS``; PostgreSQL's: ``pgstore.SCHEMA``).
MIGRATION = """
    CREATE TABLE probe_claims (
        host     TEXT NOT NULL,
        port     INTEGER NOT NULL,
        holder   TEXT NOT NULL,
        until_ms INTEGER NOT NULL,
        failure  TEXT,
        PRIMARY KEY (host, port)
    ) WITHOUT ROWID;
"""

_CLAIM = """
    INSERT INTO probe_claims (host, port, holder, until_ms, failure) VALUES (?, ?, ?, ?, NULL)
    ON CONFLICT (host, port) DO UPDATE
        SET holder = excluded.holder, until_ms = excluded.until_ms, failure = NULL
        WHERE probe_claims.until_ms <= ? OR probe_claims.holder = excluded.holder
    RETURNING holder
"""
#: The claim of a target (host, port): (holder, until_ms, failure).
READ = "SELECT holder, until_ms, failure FROM probe_claims WHERE host = ? AND port = ?"


@dataclass(frozen=True, slots=True)
class Claim:
    """A target's claim as read: ``holder`` until ``until_ms`` (Unix
    milliseconds); ``failure``: the ``ProbeError.reason`` the holder's
    probe ended with (None: still probing, or it succeeded)."""

    holder: str
    until_ms: int
    failure: str | None = None


def claim(db: Transaction, target: Target, holder: str, now_ms: int, ttl_ms: int) -> Claim:
    """Claim ``target`` for ``holder`` until ``now_ms + ttl_ms`` unless
    another holds an unexpired claim; return the claim that stands."""
    until = now_ms + ttl_ms
    won = db.execute(_CLAIM, (target.host, target.port, holder, until, now_ms)).fetchone()
    if won is not None:
        return Claim(holder, until)
    standing = read(db, target)
    # The row the claim met (SQLite: this transaction holds the write lock;
    # PostgreSQL: ON CONFLICT DO UPDATE locks it even when its WHERE is
    # false): nobody deleted it since.
    assert standing is not None
    return standing


def read(db: Transaction, target: Target) -> Claim | None:
    row = db.execute(READ, (target.host, target.port)).fetchone()
    return Claim(*row) if row is not None else None


def release(
    db: Transaction, target: Target, holder: str, failure: str | None, now_ms: int,
    linger_ms: int,
) -> None:
    """``holder``'s probe of ``target`` ended (``failure``: the reason it
    failed, None if it succeeded): the claim stands ``linger_ms`` more, for
    waiters to read the failure or the committed observation."""
    db.execute(
        "UPDATE probe_claims SET failure = ?, until_ms = ? WHERE host = ? AND port = ? "
        "AND holder = ?", (failure, now_ms + linger_ms, target.host, target.port, holder),
    )


def delete_expired(db: Transaction, now_ms: int) -> int:
    return db.execute("DELETE FROM probe_claims WHERE until_ms <= ?", (now_ms,)).rowcount
