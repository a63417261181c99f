"""The observation store on PostgreSQL, for the nodes of a fleet sharing one
database: the operations of :class:`notary.state.store.Store` (the SQLite
engine), with the same rows, the same change feed and probe claims.

Where SQLite's writer is set-based and tuned, this one rewrites each
target of a batch from its merged timeline (``Timeline.merged`` with the
limits, what the cache does): a few statements per batch, whatever its
size. Writers on several nodes serialise per target (its row is locked,
in id order) and on the feed (a transaction-level advisory lock taken
last), so the feed's sequence numbers are committed in order and a
follower never skips one.

Synchronous, like the SQLite engine: the Trio edge runs these methods in
worker threads. Resource handling: a ``PostgresStore`` owns one
``PostgresConnection`` (``notary.state.pgconnection``: autocommit,
explicit transactions); ``close()`` releases it. A connection the server
dropped is made again, as that module says.

Error handling: every ``psycopg`` error is raised as ``StoreError`` naming
the database without its password (``pgconnection.describe_dsn``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from notary.errors import StoreError
from notary.model.observations import (
    DEFAULT_MERGE_WINDOW_S,
    ProbeResult,
    Timeline,
    TimelineLimits,
)
from notary.model.targets import Target
from notary.state import feed
from notary.state.claims import Claim
from notary.state.pgconnection import MIGRATION_LOCK, PostgresConnection, scalar
from notary.state.store import (
    _LIMIT_NAMES,
    PRUNE_CHUNK_TARGETS,
    SCHEMA_VERSION,
    SWEEP_CHUNK_TARGETS,
    EngineOperations,
    PruneReport,
    StoreStatistics,
    _timeline_of,
)

__all__ = ["PostgresStore"]

#: The schema at ``SCHEMA_VERSION``, made in one step on a new database
#: (the SQLite engine's migrations 1-6 give the same tables). A later schema
#: version adds a migration to both engines.
SCHEMA = """
    CREATE TABLE settings (name TEXT PRIMARY KEY, value BIGINT NOT NULL);
    CREATE TABLE certificates (
        id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        sha256      BYTEA NOT NULL UNIQUE,
        sha1        BYTEA NOT NULL,
        md5         BYTEA NOT NULL,
        spki_sha256 BYTEA NOT NULL,
        der         BYTEA NOT NULL
    );
    CREATE TABLE targets (
        id       BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        host     TEXT NOT NULL,
        port     INTEGER NOT NULL,
        asked_at BIGINT NOT NULL DEFAULT 0,
        UNIQUE (host, port)
    );
    CREATE INDEX targets_by_asked_at ON targets (asked_at);
    CREATE TABLE observations (
        target_id      BIGINT NOT NULL REFERENCES targets (id),
        certificate_id BIGINT NOT NULL REFERENCES certificates (id),
        first_seen     BIGINT NOT NULL,
        last_seen      BIGINT NOT NULL,
        addresses      TEXT NOT NULL DEFAULT '',
        PRIMARY KEY (target_id, certificate_id)
    );
    CREATE INDEX observations_by_certificate ON observations (certificate_id);
    CREATE TABLE runs (
        target_id      BIGINT NOT NULL REFERENCES targets (id),
        certificate_id BIGINT NOT NULL REFERENCES certificates (id),
        start          BIGINT NOT NULL,
        "end"          BIGINT NOT NULL,
        PRIMARY KEY (target_id, certificate_id, start)
    );
    CREATE INDEX runs_by_certificate ON runs (certificate_id);
    CREATE TABLE changes (
        seq     BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        host    TEXT NOT NULL,
        port    INTEGER NOT NULL,
        sha256  BYTEA NOT NULL,
        changed INTEGER NOT NULL,
        origin  TEXT NOT NULL
    );
    CREATE TABLE probe_claims (
        host     TEXT NOT NULL,
        port     INTEGER NOT NULL,
        holder   TEXT NOT NULL,
        until_ms BIGINT NOT NULL,
        failure  TEXT,
        PRIMARY KEY (host, port)
    );
    INSERT INTO settings VALUES ('deletions', 0), ('feed_pruned_through', 0);
"""
#: The feed's advisory lock key (``pg_advisory_xact_lock``; migrations
#: take ``pgconnection.MIGRATION_LOCK``, "nota").
_FEED_LOCK = 0x6E6F7462
#: Targets per statement (``= ANY(%b)`` arrays).
CHUNK = 1000
#: How long one statement, or a wait for a lock (another node's batch), may
#: take: past it the call fails as a ``StoreError`` (the writer retries a batch).
STATEMENT_TIMEOUT_MS = 30_000
#: The channel each commit of observations notifies (``wait_for_changes``).
FEED_CHANNEL = "notary_changes"

_LOAD_TIMELINE = """
    SELECT c.id, c.der, c.sha1, c.sha256, c.md5, c.spki_sha256,
           o.first_seen, o.last_seen, o.addresses
    FROM targets t JOIN observations o ON o.target_id = t.id
    JOIN certificates c ON c.id = o.certificate_id
    WHERE t.host = %s AND t.port = %s
"""
_LOAD_RUNS = """
    SELECT r.certificate_id, r.start, r."end" FROM targets t JOIN runs r ON r.target_id = t.id
    WHERE t.host = %s AND t.port = %s ORDER BY r.start
"""
_ROWS_OF_TARGETS = """
    SELECT o.target_id, c.id, c.der, c.sha1, c.sha256, c.md5, c.spki_sha256,
           o.first_seen, o.last_seen, o.addresses
    FROM observations o JOIN certificates c ON c.id = o.certificate_id
    WHERE o.target_id = ANY(%b)
"""
_RUNS_OF_TARGETS = """
    SELECT target_id, certificate_id, start, "end" FROM runs
    WHERE target_id = ANY(%b) ORDER BY start
"""
_CLAIM = """
    INSERT INTO probe_claims (host, port, holder, until_ms, failure) VALUES (%s, %s, %s, %s, NULL)
    ON CONFLICT (host, port) DO UPDATE
        SET holder = excluded.holder, until_ms = excluded.until_ms, failure = NULL
        WHERE probe_claims.until_ms <= %s OR probe_claims.holder = excluded.holder
    RETURNING holder
"""
_READ_CLAIM = "SELECT holder, until_ms, failure FROM probe_claims WHERE host = %s AND port = %s"


class PostgresStore(EngineOperations):
    """One connection to the observation database on PostgreSQL; the
    methods and arguments of :class:`notary.state.store.Store`. ``dsn``:
    libpq keywords or a URL (a password comes best from ``PGPASSFILE``)."""

    notifies = True

    def __init__(
        self,
        dsn: str,
        *,
        create: bool = True,
        merge_window_s: int = DEFAULT_MERGE_WINDOW_S,
        limits: TimelineLimits | None = None,
    ) -> None:
        self._db = PostgresConnection(
            dsn, statement_timeout_ms=STATEMENT_TIMEOUT_MS, lock_timeout_ms=STATEMENT_TIMEOUT_MS,
        )
        self.path = self._db.path  # what messages name (the SQLite engine's path)
        self.merge_window_s = merge_window_s
        self.limits = limits
        try:
            if create:
                self.migrate()
            self._check_not_newer(self.schema_version())
        except BaseException:
            self._db.close()
            raise

    def close(self) -> None:
        self._db.close()

    def wait_for_changes(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a commit of observations (``NOTIFY``
        on ``FEED_CHANNEL``); whether one came. This connection then serves
        nothing else (``LISTEN``; again on a connection made again)."""
        return self._db.wait_for_notify(FEED_CHANNEL, timeout_s)

    # -- schema ------------------------------------------------------------------

    def schema_version(self) -> int:
        rows = self._db.read(
            "SELECT value FROM settings WHERE name = 'schema_version'"
        ) if self._has_schema() else []
        return int(rows[0][0]) if rows else 0

    def _has_schema(self) -> bool:
        return bool(self._db.read("SELECT to_regclass('settings') IS NOT NULL")[0][0])

    def migrate(self) -> int:
        """Make the schema on a new database (under an advisory lock: the
        nodes of a fleet may start at once); return how many steps ran."""
        with self._db.transaction() as db:
            db.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            if scalar(db, "SELECT to_regclass('settings')") is not None:
                return 0
            db.execute(SCHEMA)
            db.execute(
                "INSERT INTO settings VALUES ('schema_version', %s)", (SCHEMA_VERSION,)
            )
        return 1

    def _check_not_newer(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"database {self.path} has schema {version}, newer than this "
                f"notary's {SCHEMA_VERSION}"
            )
        if version < SCHEMA_VERSION:
            raise StoreError(f"database {self.path} has no schema (run `notary serve` once)")

    # -- reads ---------------------------------------------------------------------

    def load_timeline(self, target: Target) -> Timeline:
        rows = self._db.read(_LOAD_TIMELINE, (target.host, target.port))
        run_rows = self._db.read(_LOAD_RUNS, (target.host, target.port))
        timeline = _timeline_of(target, [_plain(row) for row in rows], run_rows)
        return timeline if self.limits is None else timeline.bounded(self.limits)

    def iter_target_keys(self, chunk_rows: int = 10_000) -> Iterator[list[str]]:
        after = 0
        while rows := self._db.read(
            "SELECT id, host, port FROM targets WHERE id > %s ORDER BY id LIMIT %s",
            (after, chunk_rows),
        ):
            yield [Target(host, port).key for _, host, port in rows]
            after = rows[-1][0]

    def statistics(self) -> StoreStatistics:
        count = {
            table: self._db.read(f"SELECT count(*) FROM {table}")[0][0]
            for table in ("targets", "certificates", "observations")
        }
        size = self._db.read("SELECT pg_database_size(current_database())")[0][0]
        return StoreStatistics(
            self.schema_version(), count["targets"], count["certificates"],
            count["observations"], size,
        )

    # -- writes --------------------------------------------------------------------

    def record(
        self, results: Sequence[ProbeResult], origin: str = "",
        probes: Sequence[int] | None = None,
    ) -> None:
        """Record ``results`` in one transaction (the SQLite engine's
        semantics: each target's rows become its stored timeline merged
        with its sightings, within ``limits``), with their feed rows (one
        per probe: ``probes``, as the SQLite engine's)."""
        if not results:
            return
        if self.merge_window_s < 0:
            raise ValueError("merge_window_s must not be negative")
        with self._db.transaction() as db:
            target_ids = self._lock_targets(db, results)
            stored = self._timelines(db, target_ids)
            seen: feed.Seen = {
                t: {c: o.last_seen for c, o in ids.items()}
                for t, (_, ids) in stored.items() if ids
            }
            certificate_ids = self._certificate_ids(db, results)
            pairs = [(target_ids[r.target], certificate_ids[r.leaf.sha256]) for r in results]
            dropped = self._rewrite(db, results, pairs, stored, certificate_ids)
            self._delete_orphans(db, dropped)
            db.execute("SELECT pg_advisory_xact_lock(%s)", (_FEED_LOCK,))
            _insert(db, "changes (host, port, sha256, changed, origin)",
                    ("text", "int", "bytea", "int", "text"),
                    feed.rows(results, pairs, seen, origin, self.merge_window_s, probes))
            db.execute(f"NOTIFY {FEED_CHANNEL}")  # delivered at commit

    def _lock_targets(self, db: Any, results: Sequence[ProbeResult]) -> dict[Target, int]:
        """The ids of the results' targets, their rows locked (in id order:
        writers on other nodes wait, never deadlock). A new target counts as
        asked about when first observed, as in the SQLite engine."""
        asked: dict[Target, int] = {}
        for result in results:
            asked[result.target] = max(asked.get(result.target, 0), result.observed_at)
        ordered = sorted(asked, key=lambda t: (t.host, t.port))
        hosts, ports = [t.host for t in ordered], [t.port for t in ordered]
        db.execute(
            "INSERT INTO targets (host, port, asked_at) SELECT * FROM "
            "unnest(%b::text[], %b::int[], %b::bigint[]) ON CONFLICT (host, port) DO NOTHING",
            (hosts, ports, [asked[t] for t in ordered]),
        )
        rows = db.execute(
            "SELECT t.id, t.host, t.port FROM targets t "
            "JOIN unnest(%b::text[], %b::int[]) AS k(host, port) "
            "ON t.host = k.host AND t.port = k.port ORDER BY t.id FOR UPDATE OF t",
            (hosts, ports),
        ).fetchall()
        return {Target(host, port): target_id for target_id, host, port in rows}

    def _timelines(
        self, db: Any, target_ids: dict[Target, int]
    ) -> dict[int, tuple[Timeline, dict[int, Any]]]:
        """Each target's stored timeline and its observations by certificate id."""
        ids = list(target_ids.values())
        rows: dict[int, list[tuple]] = {}
        runs: dict[int, list[tuple]] = {}
        for start in range(0, len(ids), CHUNK):
            chunk = ids[start:start + CHUNK]
            for row in db.execute(_ROWS_OF_TARGETS, (chunk,)):
                rows.setdefault(row[0], []).append(_plain(row[1:]))
            for row in db.execute(_RUNS_OF_TARGETS, (chunk,)):
                runs.setdefault(row[0], []).append(row[1:])
        made = {}
        for target, target_id in target_ids.items():
            target_rows = rows.get(target_id, [])
            timeline = _timeline_of(target, target_rows, runs.get(target_id, []))
            ids = {row[3]: row[0] for row in target_rows}  # sha256 -> certificate id
            by_id = {ids[o.certificate.sha256]: o for o in timeline.observations}
            if self.limits is not None:
                timeline = timeline.bounded(self.limits)
            made[target_id] = (timeline, by_id)
        return made

    def _certificate_ids(self, db: Any, results: Sequence[ProbeResult]) -> dict[bytes, int]:
        leaves = {r.leaf.sha256: r.leaf for r in results}
        keep_der = self.limits.max_certificate_bytes if self.limits is not None else math.inf
        _insert(
            db, "certificates (sha256, sha1, md5, spki_sha256, der)", ("bytea",) * 5,
            [(c.sha256, c.sha1, c.md5, c.spki_sha256, c.der if len(c.der) <= keep_der else b"")
             for c in leaves.values()], "ON CONFLICT (sha256) DO NOTHING",
        )
        return dict(db.execute(
            "SELECT sha256, id FROM certificates WHERE sha256 = ANY(%b)", (list(leaves),)
        ).fetchall())

    def _rewrite(
        self, db: Any, results: Sequence[ProbeResult], pairs: list[tuple[int, int]],
        stored: dict[int, tuple[Timeline, dict[int, Any]]], certificate_ids: dict[bytes, int],
    ) -> set[int]:
        """Write each target's timeline merged with its sightings (in
        recording order) in place of its rows; return the certificate ids
        some target dropped."""
        sightings: dict[int, list[ProbeResult]] = {}
        for result, (t, _) in zip(results, pairs, strict=True):
            sightings.setdefault(t, []).append(result)
        observations, run_rows, dropped = [], [], set()
        for t, seen in sightings.items():
            timeline, before = stored[t]
            for result in seen:
                timeline = timeline.merged(result, self.merge_window_s, self.limits)
            ids = {**{o.certificate.sha256: c for c, o in before.items()}, **certificate_ids}
            kept = {ids[o.certificate.sha256]: o for o in timeline.observations}
            # Certificates it held, and those of this batch it did not keep.
            dropped |= (before.keys() | {certificate_ids[r.leaf.sha256] for r in seen}) - kept.keys()
            for c, o in kept.items():
                observations.append((t, c, o.first_seen, o.last_seen, ",".join(o.addresses)))
                if len(o.timespans) > 1:
                    run_rows += [(t, c, start, end) for start, end in o.timespans]
        targets = list(sightings)
        db.execute("DELETE FROM runs WHERE target_id = ANY(%b)", (targets,))
        db.execute("DELETE FROM observations WHERE target_id = ANY(%b)", (targets,))
        _insert(db, _OBSERVATION_COLUMNS, _OBSERVATION_TYPES, observations)
        _insert(db, _RUN_COLUMNS, _RUN_TYPES, run_rows)
        return dropped

    def _delete_orphans(self, db: Any, certificate_ids: Iterable[int]) -> int:
        ids = list(certificate_ids)
        if not ids:
            return 0
        return db.execute(
            "DELETE FROM certificates c WHERE c.id = ANY(%b) AND NOT EXISTS "
            "(SELECT 1 FROM observations o WHERE o.certificate_id = c.id)", (ids,),
        ).rowcount

    # -- what is kept ----------------------------------------------------------------

    def note_asked(self, targets: Iterable[tuple[str, int]], at: int) -> int:
        keys = list(targets)
        if not keys:
            return 0
        with self._db.transaction() as db:
            return db.execute(
                "UPDATE targets t SET asked_at = %s FROM unnest(%b::text[], %b::int[]) "
                "AS k(host, port) WHERE t.host = k.host AND t.port = k.port AND t.asked_at < %s",
                (at, [host for host, _ in keys], [port for _, port in keys], at),
            ).rowcount

    def prune_unasked(self, asked_before: int, max_targets: int = PRUNE_CHUNK_TARGETS
                      ) -> PruneReport:
        with self._db.transaction() as db:
            ids = [row[0] for row in db.execute(
                "SELECT id FROM targets WHERE asked_at < %s LIMIT %s FOR UPDATE SKIP LOCKED",
                (asked_before, max_targets),
            )]
            if not ids:
                return PruneReport()
            certificates = [row[0] for row in db.execute(
                "SELECT DISTINCT certificate_id FROM observations WHERE target_id = ANY(%b)",
                (ids,),
            )]
            runs = db.execute("DELETE FROM runs WHERE target_id = ANY(%b)", (ids,)).rowcount
            observations = db.execute(
                "DELETE FROM observations WHERE target_id = ANY(%b)", (ids,)
            ).rowcount
            targets = db.execute("DELETE FROM targets WHERE id = ANY(%b)", (ids,)).rowcount
            deleted = self._delete_orphans(db, certificates)
        return PruneReport(targets, observations, runs, deleted)

    def _recorded_settings(self) -> dict[str, int]:
        return dict(self._db.read("SELECT name, value FROM settings"))

    def target_id_ranges(self) -> list[tuple[int, int]]:
        ids = [row[0] for row in self._db.read("SELECT id FROM targets ORDER BY id")]
        return [
            (ids[i], ids[min(i + SWEEP_CHUNK_TARGETS, len(ids)) - 1])
            for i in range(0, len(ids), SWEEP_CHUNK_TARGETS)
        ]

    def enforce_limits_in(self, first_id: int, last_id: int) -> PruneReport:
        """Bring targets ``first_id``..``last_id`` within ``limits``."""
        if self.limits is None:
            return PruneReport()
        with self._db.transaction() as db:
            targets = {
                Target(host, port): target_id for target_id, host, port in db.execute(
                    "SELECT id, host, port FROM targets WHERE id BETWEEN %s AND %s "
                    "ORDER BY id FOR UPDATE", (first_id, last_id),
                )
            }
            report = PruneReport()
            for target_id, (timeline, before) in self._timelines(db, targets).items():
                ids = {o.certificate.sha256: c for c, o in before.items()}
                kept = {ids[o.certificate.sha256] for o in timeline.observations}
                old_runs = sum(len(o.timespans) for o in before.values())
                new_runs = sum(len(o.timespans) for o in timeline.observations)
                if kept == before.keys() and old_runs == new_runs:
                    continue
                db.execute("DELETE FROM runs WHERE target_id = %s", (target_id,))
                db.execute("DELETE FROM observations WHERE target_id = %s", (target_id,))
                _insert(db, _OBSERVATION_COLUMNS, _OBSERVATION_TYPES, [
                    (target_id, ids[o.certificate.sha256], o.first_seen, o.last_seen,
                     ",".join(o.addresses)) for o in timeline.observations
                ])
                _insert(db, _RUN_COLUMNS, _RUN_TYPES, [
                    (target_id, ids[o.certificate.sha256], start, end)
                    for o in timeline.observations if len(o.timespans) > 1
                    for start, end in o.timespans
                ])
                report += PruneReport(
                    0, len(before) - len(kept), max(old_runs - new_runs, 0),
                    self._delete_orphans(db, before.keys() - kept),
                )
        return report

    def record_limits(self) -> PruneReport:
        if self.limits is None:
            return PruneReport()
        with self._db.transaction() as db, db.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO settings VALUES (%s, %s) "
                "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                [(name, getattr(self.limits, name)) for name in _LIMIT_NAMES],
            )
        return PruneReport()

    def delete_orphans(self) -> PruneReport:
        with self._db.transaction() as db:
            deleted = db.execute(
                "DELETE FROM certificates c WHERE NOT EXISTS "
                "(SELECT 1 FROM observations o WHERE o.certificate_id = c.id)"
            ).rowcount
        return PruneReport(certificates=deleted)

    def _shrink(self) -> None:
        """Nothing: PostgreSQL's autovacuum reclaims the space."""

    # -- the change feed -------------------------------------------------------------

    def feed_position(self) -> int:
        """The newest change's sequence number (0: none yet)."""
        return int(self._db.read(
            "SELECT greatest(coalesce(max(seq), 0), (SELECT value FROM settings "
            "WHERE name = 'feed_pruned_through')) FROM changes"
        )[0][0])

    def read_feed(self, after: int, limit: int) -> feed.FeedPage:
        with self._db.transaction() as db:
            pruned = scalar(db, "SELECT value FROM settings WHERE name = 'feed_pruned_through'")
            rows = db.execute(
                "SELECT seq, host, port, sha256, changed, origin FROM changes "
                "WHERE seq > %s ORDER BY seq LIMIT %s", (after, limit),
            ).fetchall()
        return feed.FeedPage(tuple(
            feed.Change(seq, Target(host, port), bytes(sha256), bool(changed), origin)
            for seq, host, port, sha256, changed, origin in rows
        ), after < pruned)

    def prune_feed(self, max_rows: int) -> int:
        with self._db.transaction() as db:
            through = scalar(db, "SELECT coalesce(max(seq), 0) FROM changes")
            through -= max_rows
            pruned = scalar(
                db, "SELECT value FROM settings WHERE name = 'feed_pruned_through' FOR UPDATE"
            )
            if through <= pruned:
                return 0
            deleted = db.execute("DELETE FROM changes WHERE seq <= %s", (through,)).rowcount
            db.execute(
                "UPDATE settings SET value = %s WHERE name = 'feed_pruned_through'", (through,)
            )
        return deleted

    # -- probe claims ------------------------------------------------------------------

    def claim_probe(self, target: Target, holder: str, now_ms: int, ttl_ms: int) -> Claim:
        until = now_ms + ttl_ms
        with self._db.transaction() as db:
            won = db.execute(
                _CLAIM, (target.host, target.port, holder, until, now_ms)
            ).fetchone()
            if won is not None:
                return Claim(holder, until)
            held = db.execute(_READ_CLAIM, (target.host, target.port)).fetchone()
            # The row the claim met: ON CONFLICT DO UPDATE locks it even when
            # its WHERE is false, so nobody deleted it since.
            assert held is not None
            return Claim(*held)

    def read_claim(self, target: Target) -> Claim | None:
        rows = self._db.read(_READ_CLAIM, (target.host, target.port))
        return Claim(*rows[0]) if rows else None

    def release_claim(
        self, target: Target, holder: str, failure: str | None, now_ms: int, linger_ms: int
    ) -> None:
        with self._db.transaction() as db:
            db.execute(
                "UPDATE probe_claims SET failure = %s, until_ms = %s WHERE host = %s "
                "AND port = %s AND holder = %s",
                (failure, now_ms + linger_ms, target.host, target.port, holder),
            )

    def delete_expired_claims(self, now_ms: int) -> int:
        with self._db.transaction() as db:
            return db.execute(
                "DELETE FROM probe_claims WHERE until_ms <= %s", (now_ms,)
            ).rowcount


_OBSERVATION_COLUMNS = "observations (target_id, certificate_id, first_seen, last_seen, addresses)"
_OBSERVATION_TYPES = ("bigint", "bigint", "bigint", "bigint", "text")
_RUN_COLUMNS = 'runs (target_id, certificate_id, start, "end")'
_RUN_TYPES = ("bigint",) * 4


def _insert(
    db: Any, into: str, types: Sequence[str], rows: Sequence[Sequence[Any]], tail: str = ""
) -> None:
    """Insert ``rows`` ``into`` a table (its columns of ``types``) in one
    statement: one array per column, ``unnest``ed (one round trip, where
    ``executemany`` makes one per row)."""
    if not rows:
        return
    columns = [list(column) for column in zip(*rows, strict=True)]
    # %b: binary parameters (text arrays of bytes are escaped element by element).
    arrays = ", ".join(f"%b::{kind}[]" for kind in types)
    db.execute(f"INSERT INTO {into} SELECT * FROM unnest({arrays}) {tail}", columns)


def _plain(row: Sequence[Any]) -> tuple:
    """A row with ``bytes`` for PostgreSQL's ``memoryview`` BYTEA values."""
    return tuple(bytes(v) if isinstance(v, memoryview) else v for v in row)

