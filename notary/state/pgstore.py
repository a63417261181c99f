"""The observation store on PostgreSQL, for the nodes of a fleet sharing one
database: the operations of :class:`notary.state.store.Store` (the SQLite
engine), with the same rows, the same change feed and probe claims; what
the two do alike is written once (``notary.state.observationstore``), and
this module adds the schema, ``record``, ``note_asked`` and the wait for
a commit (``NOTIFY``).

Where SQLite's writer is set-based and tuned, this one rewrites each
target of a batch from its merged timeline (``Timeline.merged`` with the
limits, what the cache does): a few statements per batch, whatever its
size. Writers on several nodes serialise per target (its row is locked,
in id order) and on the feed (a transaction-level advisory lock taken
last), so the feed's sequence numbers are committed in order and a
follower never skips one.

Synchronous, like the SQLite engine: the Trio edge runs these methods in
worker threads. Resource handling: a ``PostgresStore`` owns one
``PostgresConnection`` (``notary.state.connection``: autocommit,
explicit transactions); ``close()`` releases it. A connection the server
dropped is made again, as that module says.

Error handling: every ``psycopg`` error is raised as ``StoreError`` naming
the database without its password (``notary.state.dsn``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from notary.errors import StoreError
from notary.model.observations import (
    DEFAULT_MERGE_WINDOW_S,
    ProbeResult,
    TimelineLimits,
)
from notary.model.targets import Target
from notary.state import feed
from notary.state.connection import (
    MIGRATION_LOCK,
    Columns,
    PostgresConnection,
    Transaction,
    scalar,
)
from notary.state.observationstore import SCHEMA_VERSION, EngineOperations

__all__ = ["FEED_CHANNEL", "SCHEMA", "STATEMENT_TIMEOUT_MS", "PostgresStore"]

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
#: take ``connection.MIGRATION_LOCK``, "nota").
_FEED_LOCK = 0x6E6F7462
#: How long one statement, or a wait for a lock (another node's batch), may
#: take: past it the call fails as a ``StoreError`` (the writer retries a batch).
STATEMENT_TIMEOUT_MS = 30_000
#: The channel each commit of observations notifies (``wait_for_changes``).
FEED_CHANNEL = "notary_changes"

_CERTIFICATE_COLUMNS: Columns = tuple((name, "bytea") for name in (
    "sha256", "sha1", "md5", "spki_sha256", "der"))


class PostgresStore(EngineOperations):
    """One connection to the observation database on PostgreSQL; the
    methods and arguments of :class:`notary.state.store.Store`. ``dsn``:
    libpq keywords or a URL (a password comes best from ``PGPASSFILE``)."""

    notifies = True
    _db: PostgresConnection

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
            db.execute("SELECT pg_advisory_xact_lock(?)", (MIGRATION_LOCK,))
            if scalar(db, "SELECT to_regclass('settings')") is not None:
                return 0
            db.execute(SCHEMA)
            db.execute("INSERT INTO settings VALUES ('schema_version', ?)", (SCHEMA_VERSION,))
        return 1

    def _check_not_newer(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"database {self.path} has schema {version}, newer than this "
                f"notary's {SCHEMA_VERSION}"
            )
        if version < SCHEMA_VERSION:
            raise StoreError(f"database {self.path} has no schema (run `notary serve` once)")

    def _size(self) -> int:
        return int(self._db.read("SELECT pg_database_size(current_database())")[0][0])

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
            sightings: dict[int, list[tuple[ProbeResult, int]]] = {}
            for result, (t, c) in zip(results, pairs, strict=True):
                sightings.setdefault(t, []).append((result, c))
            self._delete_orphans(db, self._rewrite(db, sightings, stored))
            db.execute("SELECT pg_advisory_xact_lock(?)", (_FEED_LOCK,))
            feed.write(self._db, db, results, pairs, origin, self.merge_window_s, probes,
                       seen=seen)
            db.execute(f"NOTIFY {FEED_CHANNEL}")  # delivered at commit

    def _lock_targets(self, db: Transaction, results: Sequence[ProbeResult]) -> dict[Target, int]:
        """The ids of the results' targets, their rows locked (in id order:
        writers on other nodes wait, never deadlock). A new target counts as
        asked about when first observed, as in the SQLite engine."""
        asked: dict[Target, int] = {}
        for result in results:
            asked[result.target] = max(asked.get(result.target, 0), result.observed_at)
        ordered = sorted(asked, key=lambda t: (t.host, t.port))
        hosts, ports = [t.host for t in ordered], [t.port for t in ordered]
        self._db.insert_rows(
            db, "targets", (("host", "text"), ("port", "int"), ("asked_at", "bigint")),
            [(t.host, t.port, asked[t]) for t in ordered], "ON CONFLICT (host, port) DO NOTHING",
        )
        rows = db.execute(
            "SELECT t.id, t.host, t.port FROM targets t "
            "JOIN unnest(%b::text[], %b::int[]) AS k(host, port) "
            "ON t.host = k.host AND t.port = k.port ORDER BY t.id FOR UPDATE OF t",
            (hosts, ports),
        ).fetchall()
        return {Target(host, port): target_id for target_id, host, port in rows}

    def _certificate_ids(
        self, db: Transaction, results: Sequence[ProbeResult]
    ) -> dict[bytes, int]:
        """The id of each result's leaf, the new ones inserted (their DER
        within ``limits``)."""
        leaves = {r.leaf.sha256: r.leaf for r in results}
        keep_der = self.limits.max_certificate_bytes if self.limits is not None else math.inf
        self._db.insert_rows(
            db, "certificates", _CERTIFICATE_COLUMNS,
            [(c.sha256, c.sha1, c.md5, c.spki_sha256, c.der if len(c.der) <= keep_der else b"")
             for c in leaves.values()], "ON CONFLICT (sha256) DO NOTHING",
        )
        return dict(db.execute(
            "SELECT sha256, id FROM certificates WHERE sha256 = ANY(%b)", (list(leaves),)
        ).fetchall())

    # -- what is kept ----------------------------------------------------------------

    def note_asked(self, targets: Iterable[tuple[str, int]], at: int) -> int:
        keys = list(targets)
        if not keys:
            return 0
        with self._db.transaction() as db:
            return db.execute(
                "UPDATE targets t SET asked_at = ? FROM unnest(%b::text[], %b::int[]) "
                "AS k(host, port) WHERE t.host = k.host AND t.port = k.port AND t.asked_at < ?",
                (at, [host for host, _ in keys], [port for _, port in keys], at),
            ).rowcount
