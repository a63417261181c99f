"""The change feed: every committed observation, in commit order, for the
processes that share one store (a node's workers) to follow.

A row is written by ``Store.record`` in the transaction that commits the
observation, so a follower never sees a change that was rolled back, and
sees each committed one once, in ``seq`` order (``AUTOINCREMENT``: a
sequence number is never reused, even after pruning). ``changed`` is judged
against the stored history in that transaction: the target had observations
and none of its newest certificates (those with the latest last sighting:
times are whole seconds, so several may share it) is this one; a late
sighting older than the newest is no change.

The feed is bounded: ``prune`` keeps the newest ``max_rows`` rows and
records how far it deleted (``settings.feed_pruned_through``), so a follower
whose position is behind that knows it missed changes (``read``'s
``missed``) and must forget what it cached.

Synchronous, like ``notary.state.store``: these functions take the
connection (in a transaction where they write) of the ``Store`` calling
them. Errors are ``sqlite3.Error``; the ``Store`` wraps them.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

from notary.model.observations import ProbeResult
from notary.model.targets import Target

__all__ = ["MIGRATION", "Change", "FeedPage", "Newest", "position", "prune", "read", "rows", "write"]

#: The schema's migration that adds the feed (``notary.state.store.MIGRATIONS``).
MIGRATION = """
    CREATE TABLE changes (
        seq     INTEGER PRIMARY KEY AUTOINCREMENT,
        host    TEXT NOT NULL,
        port    INTEGER NOT NULL,
        sha256  BLOB NOT NULL,
        changed INTEGER NOT NULL,
        origin  TEXT NOT NULL
    );
    INSERT INTO settings VALUES ('feed_pruned_through', 0);
"""

_INSERT = "INSERT INTO changes (host, port, sha256, changed, origin) VALUES (?, ?, ?, ?, ?)"
# The newest certificates of each target: those of its latest last sighting.
_NEWEST = """
    SELECT o.target_id, o.certificate_id, o.last_seen FROM observations o JOIN (
        SELECT target_id, max(last_seen) AS latest FROM observations
        WHERE target_id IN ({marks}) GROUP BY target_id
    ) n ON o.target_id = n.target_id AND o.last_seen = n.latest
"""
_READ = "SELECT seq, host, port, sha256, changed, origin FROM changes WHERE seq > ? ORDER BY seq LIMIT ?"
_PRUNED_THROUGH = "SELECT value FROM settings WHERE name = 'feed_pruned_through'"
_POSITION = "SELECT seq FROM sqlite_sequence WHERE name = 'changes'"


@dataclass(frozen=True, slots=True)
class Change:
    """One committed observation: ``target`` was seen with the leaf
    ``sha256``; ``changed``: the target's newest stored certificate before
    it was another one; ``origin``: the writer that committed it
    (``Storage``'s origin: a process's own changes are in its cache already)."""

    seq: int
    target: Target
    sha256: bytes
    changed: bool
    origin: str


@dataclass(frozen=True, slots=True)
class FeedPage:
    """What ``read`` found after a position: ``changes`` in order, and
    ``missed``: rows after that position were pruned unread."""

    changes: tuple[Change, ...]
    missed: bool

    @property
    def last_seq(self) -> int | None:
        return self.changes[-1].seq if self.changes else None


def write(
    db: sqlite3.Connection, results: Sequence[ProbeResult],
    pairs: Sequence[tuple[int, int]], new_targets: set[int], origin: str,
) -> None:
    """Add a row per result (``pairs[i]``: the target and certificate ids of
    ``results[i]``), in the transaction that records them, before their
    observations are written (the newest stored certificates are read)."""
    known = sorted({t for t, _ in pairs if t not in new_targets})
    newest: Newest = {}
    for start in range(0, len(known), 500):
        chunk = known[start:start + 500]
        marks = ", ".join("?" * len(chunk))
        for target_id, certificate_id, last_seen in db.execute(
            _NEWEST.format(marks=marks), chunk
        ):
            newest.setdefault(target_id, (set(), last_seen))[0].add(certificate_id)
    db.executemany(_INSERT, rows(results, pairs, newest, origin))


#: Each target's newest certificates (ids) and their last sighting.
Newest = dict[int, tuple[set[int], int]]


def rows(
    results: Sequence[ProbeResult], pairs: Sequence[tuple[int, int]], newest: Newest,
    origin: str,
) -> list[tuple[str, int, bytes, int, str]]:
    """The feed rows of ``results`` (``pairs[i]``: the ids of ``results[i]``)
    given each target's ``newest`` stored certificates, which it updates:
    (host, port, sha256, changed, origin), in observation order. The rule
    of both engines."""
    made = []
    for i in sorted(range(len(results)), key=lambda i: results[i].observed_at):
        result, (t, c) = results[i], pairs[i]
        seen = result.observed_at
        before = newest.get(t)
        changed = before is not None and seen >= before[1] and c not in before[0]
        if before is None or seen > before[1]:
            newest[t] = ({c}, seen)
        elif seen == before[1]:
            before[0].add(c)
        target = result.target
        made.append((target.host, target.port, result.leaf.sha256, int(changed), origin))
    return made


def position(db: sqlite3.Connection) -> int:
    """The sequence number of the newest row ever written (0: none): a
    follower starting now reads after it."""
    row = db.execute(_POSITION).fetchone()
    return row[0] if row is not None else 0


def read(db: sqlite3.Connection, after: int, limit: int) -> FeedPage:
    """Up to ``limit`` rows after the position ``after``, oldest first."""
    missed = after < db.execute(_PRUNED_THROUGH).fetchone()[0]
    changes = tuple(
        Change(seq, Target(host, port), sha256, bool(changed), origin)
        for seq, host, port, sha256, changed, origin in db.execute(_READ, (after, limit))
    )
    return FeedPage(changes, missed)


def prune(db: sqlite3.Connection, max_rows: int) -> int:
    """Keep the newest ``max_rows`` rows (in a transaction); return how many
    were deleted."""
    through = position(db) - max_rows
    if through <= db.execute(_PRUNED_THROUGH).fetchone()[0]:
        return 0
    deleted = db.execute("DELETE FROM changes WHERE seq <= ?", (through,)).rowcount
    db.execute("UPDATE settings SET value = ? WHERE name = 'feed_pruned_through'", (through,))
    return deleted
