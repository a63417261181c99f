"""The observation store behind one seam: the ``ObservationStore``
protocol its callers type against (``notary.outbound.writer``, ``notary db``),
and what its two engines do alike, written once over their connections
(``notary.state.connection``): ``EngineOperations``, the base of
``notary.state.store.Store`` (SQLite) and
``notary.state.pgstore.PostgresStore`` (PostgreSQL, a fleet's database).

Each engine brings its schema and migrations, and its own way of recording
a batch (``record``: SQLite set-based, PostgreSQL a rewrite of each
target's rows under a row lock) and of noting targets asked about; the
rest is here: reading a timeline, what is kept (retention, limits,
orphans), the change feed (``notary.state.feed``) and the probe claims
(``notary.state.claims``), each statement once, in ``?`` placeholders.

Synchronous: the Trio edge (``notary.outbound.writer``) runs these
methods in worker threads. Resource handling: a store owns its one
connection (``_db``); ``close()`` (or leaving a ``with`` block) releases
it. Error handling: database errors are raised as ``StoreError`` naming
the database (``notary.state.connection``); ``ValueError`` for an argument
out of range.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Protocol, Self

from notary.model.observations import (
    Certificate,
    Observation,
    ProbeResult,
    Timeline,
    TimelineLimits,
)
from notary.model.targets import Target
from notary.state import claims, feed
from notary.state.connection import Columns, ConnectionOwner, Transaction

__all__ = [
    "IN_LIST_ROWS",
    "LIMIT_NAMES",
    "OBSERVATION_COLUMNS",
    "PRUNE_CHUNK_TARGETS",
    "RUN_COLUMNS",
    "SCHEMA_VERSION",
    "SWEEP_CHUNK_TARGETS",
    "EngineOperations",
    "ObservationStore",
    "PruneReport",
    "StoreStatistics",
    "chunks",
    "timeline_of",
]

#: The schema both engines make (SQLite: ``store.MIGRATIONS``, one each;
#: PostgreSQL: ``pgstore.SCHEMA``, at once). A new version adds a migration
#: to both.
SCHEMA_VERSION = 6
#: Targets removed per transaction by ``prune_unasked`` (the writer lock is
#: held that long; batches go in between).
PRUNE_CHUNK_TARGETS = 500
#: Targets per transaction of ``enforce_limits`` (target ids, a range).
SWEEP_CHUNK_TARGETS = 10_000
#: Most values in one ``in_list`` (well within SQLite's parameters).
IN_LIST_ROWS = 500
#: The limits ``settings`` records the rows to be within.
LIMIT_NAMES = tuple(f.name for f in fields(TimelineLimits))
#: ``insert_rows``'s columns of the observations and of their runs.
OBSERVATION_COLUMNS: Columns = (
    ("target_id", "bigint"), ("certificate_id", "bigint"), ("first_seen", "bigint"),
    ("last_seen", "bigint"), ("addresses", "text"),
)
RUN_COLUMNS: Columns = (
    ("target_id", "bigint"), ("certificate_id", "bigint"), ("start", "bigint"),
    ('"end"', "bigint"),
)

# "end" is quoted: a reserved word in PostgreSQL.
_LOAD_TIMELINE = """
    SELECT c.id, c.der, c.sha1, c.sha256, c.md5, c.spki_sha256,
           o.first_seen, o.last_seen, o.addresses
    FROM targets t
    JOIN observations o ON o.target_id = t.id
    JOIN certificates c ON c.id = o.certificate_id
    WHERE t.host = ? AND t.port = ?
"""
_LOAD_RUNS = """
    SELECT r.certificate_id, r.start, r."end"
    FROM targets t
    JOIN runs r ON r.target_id = t.id
    WHERE t.host = ? AND t.port = ?
    ORDER BY r.start
"""
_ROWS_OF_TARGETS = """
    SELECT o.target_id, c.id, c.der, c.sha1, c.sha256, c.md5, c.spki_sha256,
           o.first_seen, o.last_seen, o.addresses
    FROM observations o JOIN certificates c ON c.id = o.certificate_id
    WHERE {targets}
"""
_RUNS_OF_TARGETS = (
    'SELECT target_id, certificate_id, start, "end" FROM runs WHERE {targets} ORDER BY start'
)
_TARGET_KEYS = "SELECT id, host, port FROM targets WHERE id > ? ORDER BY id LIMIT ?"
# A certificate no observation refers to any more (runs rows always belong
# to an observation's pair).
_DELETE_ORPHAN_CERTIFICATES = """
    DELETE FROM certificates WHERE {ids}
    AND NOT EXISTS (SELECT 1 FROM observations o WHERE o.certificate_id = certificates.id)
    RETURNING sha256
"""
_DELETE_RUNS_OF_PAIR = "DELETE FROM runs WHERE target_id = ? AND certificate_id = ?"
# Rows beyond the limits among targets first_id..last_id, oldest first, as
# ``Timeline.bounded`` drops them: runs by start, observations in the
# timeline's order (newest last_seen, first_seen, sha256 first).
_RUNS_BEYOND_LIMIT = """
    SELECT target_id, certificate_id, start FROM (
        SELECT target_id, certificate_id, start, row_number() OVER (
            PARTITION BY target_id, certificate_id ORDER BY start DESC) AS newer
        FROM runs WHERE target_id BETWEEN ? AND ?) AS ranked
    WHERE newer > ?
"""
_OBSERVATIONS_BEYOND_LIMIT = """
    SELECT target_id, certificate_id FROM (
        SELECT o.target_id, o.certificate_id, row_number() OVER (
            PARTITION BY o.target_id
            ORDER BY o.last_seen DESC, o.first_seen DESC, c.sha256 DESC) AS newer
        FROM observations o JOIN certificates c ON c.id = o.certificate_id
        WHERE o.target_id BETWEEN ? AND ?) AS ranked
    WHERE newer > ?
"""


def timeline_of(target: Target, rows: Sequence[Sequence[Any]],
                run_rows: Sequence[Sequence[Any]]) -> Timeline:
    """The timeline of ``target`` from its rows (``_LOAD_TIMELINE`` and
    ``_LOAD_RUNS`` shapes): a pair without runs rows has one run,
    ``first_seen``..``last_seen``."""
    runs: dict[int, list[tuple[int, int]]] = {}
    for certificate_id, start, end in run_rows:
        runs.setdefault(certificate_id, []).append((start, end))
    return Timeline(target, tuple(
        Observation(
            certificate=Certificate(der, sha1, sha256, md5, spki),
            first_seen=first,
            last_seen=last,
            addresses=tuple(a for a in addresses.split(",") if a),
            runs=tuple(runs.get(certificate_id, ())) or ((first, last),),
        )
        for certificate_id, der, sha1, sha256, md5, spki, first, last, addresses in rows
    ))


def chunks(items: Sequence[Any], size: int = IN_LIST_ROWS) -> Iterator[Sequence[Any]]:
    """``items`` ``size`` at a time."""
    for index in range(0, len(items), size):
        yield items[index:index + size]


@dataclass(frozen=True, slots=True)
class StoreStatistics:
    schema_version: int
    targets: int
    certificates: int
    observations: int
    file_bytes: int


@dataclass(frozen=True, slots=True)
class PruneReport:
    """Rows removed (``ders_dropped``: certificates whose DER was dropped,
    their hashes kept). Reports add up with ``+``."""

    targets: int = 0
    observations: int = 0
    runs: int = 0
    certificates: int = 0
    ders_dropped: int = 0

    def __add__(self, other: PruneReport) -> PruneReport:
        return PruneReport(*(getattr(self, f.name) + getattr(other, f.name)
                             for f in fields(PruneReport)))

    def __bool__(self) -> bool:
        return any(getattr(self, f.name) for f in fields(PruneReport))

    def __str__(self) -> str:
        return (
            f"{self.targets} targets, {self.observations} observations, {self.runs} runs, "
            f"{self.certificates} certificates removed; {self.ders_dropped} certificates' "
            "DER dropped"
        )


class ObservationStore(Protocol):
    """One connection to the observation store, of either engine: what the
    writer (``notary.outbound.writer``) and ``notary db`` call. Each method
    is documented where ``EngineOperations`` or the engine defines it."""

    @property
    def path(self) -> Path | str: ...

    @property
    def limits(self) -> TimelineLimits | None: ...

    @property
    def notifies(self) -> bool: ...

    def __enter__(self) -> Self: ...

    def __exit__(self, *exc_info: object) -> None: ...

    def close(self) -> None: ...

    def schema_version(self) -> int: ...

    def migrate(self) -> int: ...

    def load_timeline(self, target: Target) -> Timeline: ...

    def iter_target_keys(self, chunk_rows: int = ...) -> Iterator[list[str]]: ...

    def statistics(self) -> StoreStatistics: ...

    def record(
        self, results: Sequence[ProbeResult], origin: str = "",
        probes: Sequence[int] | None = None,
    ) -> None: ...

    def note_asked(self, targets: Iterable[tuple[str, int]], at: int) -> int: ...

    def prune_unasked(self, asked_before: int, max_targets: int = ...) -> PruneReport: ...

    def prune(self, now: int, forget_unasked_after_s: int) -> PruneReport: ...

    def limits_enforced(self) -> bool: ...

    def target_id_ranges(self) -> list[tuple[int, int]]: ...

    def enforce_limits_in(self, first_id: int, last_id: int) -> PruneReport: ...

    def record_limits(self) -> PruneReport: ...

    def enforce_limits(self, *, force: bool = False) -> PruneReport: ...

    def delete_orphans(self) -> PruneReport: ...

    def compact(self, now: int, forget_unasked_after_s: int) -> PruneReport: ...

    def feed_position(self) -> int: ...

    def read_feed(self, after: int, limit: int) -> feed.FeedPage: ...

    def prune_feed(self, max_rows: int) -> int: ...

    def wait_for_changes(self, timeout_s: float) -> bool: ...

    def claim_probe(
        self, target: Target, holder: str, now_ms: int, ttl_ms: int
    ) -> claims.Claim: ...

    def read_claim(self, target: Target) -> claims.Claim | None: ...

    def release_claim(
        self, target: Target, holder: str, failure: str | None, now_ms: int, linger_ms: int
    ) -> None: ...

    def delete_expired_claims(self, now_ms: int) -> int: ...


class EngineOperations(ConnectionOwner):
    """What both engines do alike, over their connection ``_db``; each
    engine adds its schema (``schema_version``, ``migrate``), ``record``,
    ``note_asked`` and ``_size``, and may add ``_deleted`` and ``_shrink``.

    ``limits``: what a target keeps (``TimelineLimits``): ``record`` keeps
    the rows within them and ``load_timeline`` reads within them; None keeps
    everything. ``merge_window_s``: sightings this close join one run."""

    path: Path | str
    limits: TimelineLimits | None
    merge_window_s: int
    #: Whether ``wait_for_changes`` wakes on a commit (PostgreSQL's NOTIFY);
    #: else a follower reads the feed at its interval.
    notifies = False

    # -- reads -------------------------------------------------------------------------

    def load_timeline(self, target: Target) -> Timeline:
        """Every observation of ``target`` (an empty timeline if unknown),
        with its runs (one, ``first_seen``..``last_seen``, if it has no runs
        rows), within ``limits``."""
        rows = self._db.read(_LOAD_TIMELINE, (target.host, target.port))
        run_rows = self._db.read(_LOAD_RUNS, (target.host, target.port))
        timeline = timeline_of(target, rows, run_rows)
        return timeline if self.limits is None else timeline.bounded(self.limits)

    def iter_target_keys(self, chunk_rows: int = 10_000) -> Iterator[list[str]]:
        """The key (``Target.key``) of every stored target, ``chunk_rows`` at a
        time, a read each (memory stays bounded by the chunk, whatever the
        store's size). Raises ``StoreError``."""
        after = 0
        while rows := self._db.read(_TARGET_KEYS, (after, chunk_rows)):
            yield [Target(host, port).key for _, host, port in rows]
            after = rows[-1][0]

    def statistics(self) -> StoreStatistics:
        count = {
            table: self._db.read(f"SELECT count(*) FROM {table}")[0][0]
            for table in ("targets", "certificates", "observations")
        }
        return StoreStatistics(
            self.schema_version(), count["targets"], count["certificates"],
            count["observations"], self._size(),
        )

    def _timelines(
        self, db: Transaction, target_ids: dict[Target, int]
    ) -> dict[int, tuple[Timeline, dict[int, Observation]]]:
        """Each target's stored timeline (within ``limits``) and all its
        stored observations by certificate id, by target id."""
        ids = list(target_ids.values())
        rows: dict[int, list[tuple]] = {}
        runs: dict[int, list[tuple]] = {}
        for chunk in chunks(ids):
            where, parameters = self._db.in_list("o.target_id", chunk)
            for row in db.execute(_ROWS_OF_TARGETS.format(targets=where), parameters):
                rows.setdefault(row[0], []).append(row[1:])
            where, parameters = self._db.in_list("target_id", chunk)
            for row in db.execute(_RUNS_OF_TARGETS.format(targets=where), parameters):
                runs.setdefault(row[0], []).append(row[1:])
        made = {}
        for target, target_id in target_ids.items():
            target_rows = rows.get(target_id, [])
            timeline = timeline_of(target, target_rows, runs.get(target_id, []))
            by_sha256 = {row[3]: row[0] for row in target_rows}
            by_id = {by_sha256[o.certificate.sha256]: o for o in timeline.observations}
            if self.limits is not None:
                timeline = timeline.bounded(self.limits)
            made[target_id] = (timeline, by_id)
        return made

    # -- writes ------------------------------------------------------------------------

    def _rewrite(
        self, db: Transaction, sightings: dict[int, list[tuple[ProbeResult, int]]],
        stored: dict[int, tuple[Timeline, dict[int, Observation]]],
    ) -> set[int]:
        """Write each target's stored timeline merged with its sightings
        (results with their certificate ids, in recording order), one at a
        time with ``limits`` as the cache does, in place of its rows;
        return the ids of the certificates some target dropped."""
        observations: list[tuple] = []
        run_rows: list[tuple] = []
        dropped: set[int] = set()
        for t, seen in sightings.items():
            timeline, before = stored[t]
            ids = {o.certificate.sha256: c for c, o in before.items()}
            for result, certificate_id in seen:
                ids[result.leaf.sha256] = certificate_id
                timeline = timeline.merged(result, self.merge_window_s, self.limits)
            kept = {ids[o.certificate.sha256]: o for o in timeline.observations}
            dropped |= set(ids.values()) - kept.keys()
            for c, o in kept.items():
                observations.append((t, c, o.first_seen, o.last_seen, ",".join(o.addresses)))
                if len(o.timespans) > 1:  # one run keeps no row
                    run_rows += [(t, c, start, end) for start, end in o.timespans]
        for chunk in chunks(list(sightings)):
            where, parameters = self._db.in_list("target_id", chunk)
            db.execute(f"DELETE FROM runs WHERE {where}", parameters)
            db.execute(f"DELETE FROM observations WHERE {where}", parameters)
        self._db.insert_rows(db, "observations", OBSERVATION_COLUMNS, observations)
        self._db.insert_rows(db, "runs", RUN_COLUMNS, run_rows)
        return dropped

    def _delete_orphans(self, db: Transaction, certificate_ids: Iterable[int]) -> list[bytes]:
        """Delete those of ``certificate_ids`` no observation refers to;
        return their SHA-256."""
        deleted: list[bytes] = []
        for chunk in chunks(list(certificate_ids)):
            where, parameters = self._db.in_list("id", chunk)
            deleted += [bytes(row[0]) for row in db.execute(
                _DELETE_ORPHAN_CERTIFICATES.format(ids=where), parameters)]
        return deleted

    def _deleted(self, db: Transaction) -> None:
        """This transaction deleted rows (an engine that memoises ids
        forgets them)."""

    # -- what is kept: retention, limits, compaction -----------------------------------

    def prune(self, now: int, forget_unasked_after_s: int) -> PruneReport:
        """``prune_unasked`` until no target nobody asked about within
        ``forget_unasked_after_s`` of ``now`` is left."""
        report = PruneReport()
        while True:
            chunk = self.prune_unasked(now - forget_unasked_after_s)
            report += chunk
            if chunk.targets < PRUNE_CHUNK_TARGETS:
                return report

    def prune_unasked(self, asked_before: int, max_targets: int = PRUNE_CHUNK_TARGETS
                      ) -> PruneReport:
        """Remove up to ``max_targets`` targets last asked about before
        ``asked_before`` (Unix seconds), with their observations and runs and
        the certificates no other target refers to, in one transaction. A
        report of fewer than ``max_targets`` targets means none is left
        (PostgreSQL: none but those another node's batch is writing)."""
        if not 1 <= max_targets <= IN_LIST_ROWS:
            raise ValueError(f"max_targets must be 1-{IN_LIST_ROWS}")
        with self._db.transaction() as db:
            ids = [row[0] for row in db.execute(
                "SELECT id FROM targets WHERE asked_at < ? LIMIT ?"
                + self._db.for_update_skip_locked, (asked_before, max_targets),
            )]
            if not ids:
                return PruneReport()
            where, parameters = self._db.in_list("target_id", ids)
            certificates = [row[0] for row in db.execute(
                f"SELECT DISTINCT certificate_id FROM observations WHERE {where}", parameters,
            )]
            runs = db.execute(f"DELETE FROM runs WHERE {where}", parameters).rowcount
            observations = db.execute(
                f"DELETE FROM observations WHERE {where}", parameters
            ).rowcount
            where, parameters = self._db.in_list("id", ids)
            targets = db.execute(f"DELETE FROM targets WHERE {where}", parameters).rowcount
            deleted = self._delete_orphans(db, certificates)
            self._deleted(db)
        return PruneReport(targets, observations, runs, len(deleted))

    def limits_enforced(self) -> bool:
        """Whether the rows are known to be within ``limits``: ``settings``
        records limits no looser than them (then ``record`` keeps them so).
        True without limits."""
        if self.limits is None:
            return True
        recorded = dict(self._db.read("SELECT name, value FROM settings"))
        return all(
            name in recorded and recorded[name] <= getattr(self.limits, name)
            for name in LIMIT_NAMES
        )

    def target_id_ranges(self) -> list[tuple[int, int]]:
        """Ranges of target ids, ``SWEEP_CHUNK_TARGETS`` wide, covering every
        stored target."""
        last = self._db.read("SELECT max(id) FROM targets")[0][0] or 0
        return [(first, first + SWEEP_CHUNK_TARGETS - 1)
                for first in range(1, last + 1, SWEEP_CHUNK_TARGETS)]

    def enforce_limits_in(self, first_id: int, last_id: int) -> PruneReport:
        """Bring the rows of the targets with ids ``first_id``..``last_id``
        within ``limits`` (runs, then observations, as ``Timeline.bounded``)
        in one transaction (PostgreSQL: the targets' rows locked first, as
        a writer locks them)."""
        limits = self.limits
        if limits is None:
            return PruneReport()
        with self._db.transaction() as db:
            if self._db.for_update:
                db.execute("SELECT id FROM targets WHERE id BETWEEN ? AND ? ORDER BY id"
                           + self._db.for_update, (first_id, last_id)).fetchall()
            runs = db.execute(_RUNS_BEYOND_LIMIT, (
                first_id, last_id, limits.max_runs_per_certificate)).fetchall()
            db.executemany(
                "DELETE FROM runs WHERE target_id = ? AND certificate_id = ? AND start = ?", runs
            )
            for pair in {(t, c) for t, c, _ in runs}:
                kept = db.execute(
                    "SELECT start FROM runs WHERE target_id = ? AND certificate_id = ?"
                    " ORDER BY start", pair,
                ).fetchall()
                db.execute(
                    "UPDATE observations SET first_seen = ?"
                    " WHERE target_id = ? AND certificate_id = ?", (kept[0][0], *pair),
                )
                if len(kept) == 1:  # one run keeps no row: first_seen..last_seen
                    db.execute(_DELETE_RUNS_OF_PAIR, pair)
            doomed = db.execute(_OBSERVATIONS_BEYOND_LIMIT, (
                first_id, last_id, limits.max_certificates_per_target)).fetchall()
            dropped_runs = sum(db.execute(_DELETE_RUNS_OF_PAIR, pair).rowcount for pair in doomed)
            db.executemany(
                "DELETE FROM observations WHERE target_id = ? AND certificate_id = ?", doomed
            )
            deleted = self._delete_orphans(db, {c for _, c in doomed})
            if runs or doomed:
                self._deleted(db)
        return PruneReport(0, len(doomed), len(runs) + dropped_runs, len(deleted))

    def record_limits(self) -> PruneReport:
        """Drop the DER of certificates larger than ``limits`` allows and
        record the limits in ``settings`` (``limits_enforced``): call it
        once every target is within them (``enforce_limits_in``)."""
        limits = self.limits
        if limits is None:
            return PruneReport()
        with self._db.transaction() as db:
            stripped = db.execute(
                "UPDATE certificates SET der = ? WHERE length(der) > ?",
                (b"", limits.max_certificate_bytes),
            ).rowcount
            db.executemany(
                "INSERT INTO settings VALUES (?, ?)"
                " ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                [(name, getattr(limits, name)) for name in LIMIT_NAMES],
            )
        return PruneReport(ders_dropped=stripped)

    def enforce_limits(self, *, force: bool = False) -> PruneReport:
        """Bring every target's rows within ``limits``, as
        :meth:`Timeline.bounded` does in memory, unless they are known to be
        (``force``: check all the same), a transaction per
        ``SWEEP_CHUNK_TARGETS`` targets (``enforce_limits_in``), then record
        the limits (``record_limits``)."""
        if self.limits is None or (not force and self.limits_enforced()):
            return PruneReport()
        report = PruneReport()
        for first_id, last_id in self.target_id_ranges():
            report += self.enforce_limits_in(first_id, last_id)
        return report + self.record_limits()

    def delete_orphans(self) -> PruneReport:
        """Delete runs rows of no observation and certificates no observation
        refers to (none should be left: ``record`` and ``prune`` delete their
        own), in one transaction."""
        with self._db.transaction() as db:
            runs = db.execute(
                "DELETE FROM runs WHERE NOT EXISTS (SELECT 1 FROM observations o"
                " WHERE o.target_id = runs.target_id"
                " AND o.certificate_id = runs.certificate_id)"
            ).rowcount
            certificates = db.execute(
                "DELETE FROM certificates WHERE NOT EXISTS (SELECT 1 FROM observations o"
                " WHERE o.certificate_id = certificates.id)"
            ).rowcount
            if runs or certificates:
                self._deleted(db)
        return PruneReport(runs=runs, certificates=certificates)

    def compact(self, now: int, forget_unasked_after_s: int) -> PruneReport:
        """``notary db compact``: targets nobody asked about within
        ``forget_unasked_after_s`` of ``now`` removed, every other one within
        ``limits`` (checked whatever ``settings`` records), orphans removed,
        then the engine's own shrinking (``_shrink``)."""
        report = self.prune(now, forget_unasked_after_s)
        report += self.enforce_limits(force=True)
        report += self.delete_orphans()
        self._shrink()
        return report

    def _shrink(self) -> None:
        """Give the space of deleted rows back (PostgreSQL: nothing, its
        autovacuum reclaims it)."""

    # -- the change feed ---------------------------------------------------------------

    def feed_position(self) -> int:
        """The newest change's sequence number (0: none yet)."""
        return feed.position_of(self._db.read(feed.POSITION)[0])

    def read_feed(self, after: int, limit: int) -> feed.FeedPage:
        """Up to ``limit`` changes after the position ``after``, read in one
        snapshot (``FeedPage.missed``: some were pruned unread)."""
        with self._db.snapshot() as db:
            return feed.read(db, after, limit)

    def prune_feed(self, max_rows: int) -> int:
        """Keep the newest ``max_rows`` changes; return how many went."""
        with self._db.transaction() as db:
            return feed.prune(db, max_rows, self._db.for_update)

    def wait_for_changes(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a commit of observations; whether one
        came. Without notifications (``notifies`` False) it waits the
        whole time and says none came: a follower reads the feed instead."""
        time.sleep(timeout_s)
        return False

    # -- probe claims ------------------------------------------------------------------

    def claim_probe(self, target: Target, holder: str, now_ms: int, ttl_ms: int) -> claims.Claim:
        """Claim ``target``'s probe for ``holder`` (``notary.state.claims``);
        the claim that stands, ``holder``'s or another's."""
        with self._db.transaction() as db:
            return claims.claim(db, target, holder, now_ms, ttl_ms)

    def read_claim(self, target: Target) -> claims.Claim | None:
        rows = self._db.read(claims.READ, (target.host, target.port))
        return claims.Claim(*rows[0]) if rows else None

    def release_claim(
        self, target: Target, holder: str, failure: str | None, now_ms: int, linger_ms: int
    ) -> None:
        """``holder``'s probe of ``target`` ended (``failure``: why it failed)."""
        with self._db.transaction() as db:
            claims.release(db, target, holder, failure, now_ms, linger_ms)

    def delete_expired_claims(self, now_ms: int) -> int:
        with self._db.transaction() as db:
            return claims.delete_expired(db, now_ms)

    # -- what each engine brings -------------------------------------------------------

    def schema_version(self) -> int:
        raise NotImplementedError

    def _size(self) -> int:
        """The bytes the database takes."""
        raise NotImplementedError

