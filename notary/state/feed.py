"""The change feed: every committed probe of a target, in commit order, for
the processes that share one store (a node's workers) to follow.

A row is written by ``Store.record`` in the transaction that commits the
observations, so a follower never sees a change that was rolled back, and
sees each committed one once, in ``seq`` order (``AUTOINCREMENT``: a
sequence number is never reused, even after pruning). One row stands for
one probe of a target: a probe that saw several certificates at several
addresses (its sightings, queued together: ``Storage.record``) is one
change of its target; a writer that does not say which results make a
probe (``probes``) gets a row per result.

``changed`` is judged against the stored history in that transaction: the
target had observations, and a certificate of this probe is outside what it
was serving: neither among its newest certificates (those with the latest
last sighting: times are whole seconds, so several may share it) nor seen
within the store's ``merge_window_s`` before (the sighting starts a new run
of its history: a certificate new to the target, or back after a longer
gap). So a site serving several certificates at once (a load balancer, a
CDN), seen in any mix from probe to probe, makes no change; a rotation
does. A late sighting older than the newest is no change. The row carries
the leaf of the first certificate that made the change, else the probe's
first.

The feed is bounded: ``prune`` keeps the newest ``max_rows`` rows and
records how far it deleted (``settings.feed_pruned_through``), so a follower
whose position is behind that knows it missed changes (``read``'s
``missed``) and must forget what it cached.

Written once for both engines (``?`` placeholders): these functions take
the ``Transaction`` (``notary.state.connection``) of the store calling
them (``notary.state.observationstore``), in a transaction where they
write, in a snapshot where they read several rows; ``write`` also its
connection, for the dialect. Errors are the connection's (``StoreError``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from notary.model.observations import ProbeResult
from notary.model.targets import Target
from notary.state.connection import Columns, Connection, Transaction

__all__ = [
    "COLUMNS", "MIGRATION", "POSITION", "Change", "FeedPage", "Seen", "position", "position_of",
    "prune", "read", "rows", "write",
]

#: The SQLite schema's migration that adds the feed
#: (``notary.state.store.MIGRATIONS``; PostgreSQL's: ``pgstore.SCHEMA``).
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
#: A change's columns (``Connection.insert_rows``), as ``rows`` makes them.
COLUMNS: Columns = (
    ("host", "text"), ("port", "int"), ("sha256", "bytea"), ("changed", "int"),
    ("origin", "text"),
)
#: Rows of targets per read of their stored sightings.
_SEEN_CHUNK = 500
# Each target's certificates and their last sightings (at most
# [store] max_certificates_per_target each).
_SEEN = "SELECT target_id, certificate_id, last_seen FROM observations WHERE {targets}"
_READ = (
    "SELECT seq, host, port, sha256, changed, origin FROM changes"
    " WHERE seq > ? ORDER BY seq LIMIT ?"
)
_PRUNED_THROUGH = "SELECT value FROM settings WHERE name = 'feed_pruned_through'"
#: The newest row's sequence number, and how far pruning deleted (rows may
#: all be gone): the position is the larger (``position_of``).
POSITION = (
    "SELECT coalesce(max(seq), 0), (SELECT value FROM settings"
    " WHERE name = 'feed_pruned_through') FROM changes"
)


@dataclass(frozen=True, slots=True)
class Change:
    """One committed probe: ``target`` was seen with the leaf ``sha256``
    (among others, for a probe of several certificates); ``changed``: a
    certificate outside what the target was serving (module docstring);
    ``origin``: the writer that committed it (``Storage``'s origin: a
    process's own changes are in its cache already)."""

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
    connection: Connection, db: Transaction, results: Sequence[ProbeResult],
    pairs: Sequence[tuple[int, int]], origin: str, merge_window_s: int,
    probes: Sequence[int] | None = None, *, new_targets: Collection[int] = (),
    seen: Seen | None = None,
) -> None:
    """Add the rows of ``results`` (``pairs[i]``: the target and certificate
    ids of ``results[i]``; ``probes``: how many consecutive results make
    each probe, None: one each), in the transaction ``db`` of
    ``connection`` that records them, before their observations are
    written: ``seen``, each target's stored sightings, is read unless the
    caller has it (``new_targets``: targets this transaction inserted, none
    stored)."""
    if seen is None:
        seen = {}
        known = sorted({t for t, _ in pairs if t not in new_targets})
        for start in range(0, len(known), _SEEN_CHUNK):
            where, parameters = connection.in_list(
                "target_id", known[start:start + _SEEN_CHUNK])
            for target_id, certificate_id, last_seen in db.execute(
                _SEEN.format(targets=where), parameters
            ):
                seen.setdefault(target_id, {})[certificate_id] = last_seen
    connection.insert_rows(
        db, "changes", COLUMNS, rows(results, pairs, seen, origin, merge_window_s, probes)
    )


#: Each target's stored certificates (ids) and their last sighting.
Seen = dict[int, dict[int, int]]


def rows(
    results: Sequence[ProbeResult], pairs: Sequence[tuple[int, int]], seen: Seen,
    origin: str, merge_window_s: int, probes: Sequence[int] | None = None,
) -> list[tuple[str, int, bytes, int, str]]:
    """The feed rows of ``results`` (``pairs[i]``: the ids of ``results[i]``;
    ``probes``: how many consecutive results make each probe, None: one
    each) given each target's ``seen`` stored certificates, which it
    updates: one (host, port, sha256, changed, origin) per probe and
    target, in observation order. The rule of both engines (module
    docstring)."""
    sizes = [1] * len(results) if probes is None else list(probes)
    if sum(sizes) != len(results):
        raise ValueError("probes must count every result once")
    groups: list[list[int]] = []
    start = 0
    for size in sizes:
        by_target: dict[int, list[int]] = {}
        for i in range(start, start + size):
            by_target.setdefault(pairs[i][0], []).append(i)
        groups += by_target.values()
        start += size
    groups.sort(key=lambda group: results[group[0]].observed_at)
    made = []
    for indices in groups:
        t = pairs[indices[0]][0]
        at = results[indices[0]].observed_at
        before = seen.get(t)
        changing = None
        if before:
            latest = max(before.values())
            if at >= latest:
                for i in indices:
                    last = before.get(pairs[i][1])
                    if last is None or (last != latest and last < at - merge_window_s):
                        changing = i
                        break
        after = seen.setdefault(t, {})
        for i in indices:
            c, seen_at = pairs[i][1], results[i].observed_at
            after[c] = max(after.get(c, seen_at), seen_at)
        result = results[indices[0] if changing is None else changing]
        target = result.target
        made.append((target.host, target.port, result.leaf.sha256, int(changing is not None),
                     origin))
    return made


def position_of(row: Sequence[int]) -> int:
    """The position a ``POSITION`` row gives: the sequence number of the
    newest row ever written (0: none), the one a follower starting now
    reads after."""
    return max(row)


def position(db: Transaction) -> int:
    return position_of(db.execute(POSITION).fetchone())


def read(db: Transaction, after: int, limit: int) -> FeedPage:
    """Up to ``limit`` rows after the position ``after``, oldest first (in a
    snapshot: ``missed`` is of the same rows)."""
    missed = after < db.execute(_PRUNED_THROUGH).fetchone()[0]
    changes = tuple(
        Change(seq, Target(host, port), bytes(sha256), bool(changed), origin)
        for seq, host, port, sha256, changed, origin in db.execute(_READ, (after, limit))
    )
    return FeedPage(changes, missed)


def prune(db: Transaction, max_rows: int, for_update: str = "") -> int:
    """Keep the newest ``max_rows`` rows (in a transaction; ``for_update``:
    the connection's, so two nodes' writers prune one after the other);
    return how many were deleted."""
    pruned = db.execute(_PRUNED_THROUGH + for_update).fetchone()[0]
    through = position(db) - max_rows
    if through <= pruned:
        return 0
    deleted = db.execute("DELETE FROM changes WHERE seq <= ?", (through,)).rowcount
    db.execute("UPDATE settings SET value = ? WHERE name = 'feed_pruned_through'", (through,))
    return deleted
