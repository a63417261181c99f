"""The observation store on SQLite (WAL mode): its schema migrations, and
its own way of recording a batch of probe results in one transaction
(set-based, with memoised row ids); the rest of what a store does is
written once for both engines (``notary.state.observationstore``, whose
``ObservationStore`` callers type against; ``notary.state.pgstore`` is the
PostgreSQL engine).

Synchronous on purpose: the Trio edge (``notary.outbound.writer``) runs these
methods in worker threads, one connection per thread role, so the event loop
never waits on the disk.

Resource handling: a ``Store`` owns one ``SqliteConnection``
(``notary.state.connection``); ``close()`` releases it (also via ``with``).
A connection must be used by one thread at a time: callers serialise access
(the Trio edge uses a limiter of 1 per store).

What it keeps is bounded (docs/storage.md "What the notary keeps"): with
``TimelineLimits`` a target keeps its newest certificates, each its newest
runs, and a certificate's DER only up to a size, exactly as
``Timeline.merged`` does in memory; targets nobody asked about for a while
are removed by ``prune``. Rows are deleted, so ids can be reused: each
deletion is counted in the ``settings`` table, and a connection that sees
the count change forgets the ids it memoised (another process, a node's
other worker or ``notary db compact``, may have deleted their rows).

Files: the database and its ``-wal`` and ``-shm`` files are created with
``file_mode`` (0600 by default; SQLite gives the latter two the database's
mode), and a writable open sets the mode of existing ones.

Error handling: every ``sqlite3`` error is raised as ``StoreError`` with the
path and a short reason (``notary.state.connection``).
"""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Iterable, Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import cast

from notary.errors import StoreError
from notary.model.observations import (
    DEFAULT_MERGE_WINDOW_S,
    Certificate,
    ProbeResult,
    Run,
    TimelineLimits,
    add_sighting,
)
from notary.state import claims, feed
from notary.state.connection import SqliteConnection, Transaction
from notary.state.observationstore import (
    SCHEMA_VERSION,
    EngineOperations,
    PruneReport,
    StoreStatistics,
)

__all__ = [
    "DATABASE_FILE_MODE", "DATABASE_GROUP_FILE_MODE", "MAX_ADDRESSES", "MIGRATIONS",
    "SCHEMA_VERSION", "PruneReport", "Store", "StoreStatistics", "database_file_mode",
]

#: Migrations, applied in order; ``PRAGMA user_version`` is the index of the
#: last applied one. Never edit a released migration: append a new one.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE certificates (
        id          INTEGER PRIMARY KEY,
        sha256      BLOB NOT NULL UNIQUE,
        sha1        BLOB NOT NULL,
        md5         BLOB NOT NULL,
        spki_sha256 BLOB NOT NULL,
        der         BLOB NOT NULL
    );
    CREATE TABLE targets (
        id   INTEGER PRIMARY KEY,
        host TEXT NOT NULL,
        port INTEGER NOT NULL,
        UNIQUE (host, port)
    );
    CREATE TABLE observations (
        target_id      INTEGER NOT NULL REFERENCES targets (id),
        certificate_id INTEGER NOT NULL REFERENCES certificates (id),
        first_seen     INTEGER NOT NULL,
        last_seen      INTEGER NOT NULL,
        addresses      TEXT NOT NULL DEFAULT '',
        PRIMARY KEY (target_id, certificate_id)
    ) WITHOUT ROWID;
    """,
    # 2: runs of sightings per (target, certificate), the full history the
    # Perspectives protocol answers from. History recorded before this
    # migration becomes one run per observation (its gaps were not kept).
    """
    CREATE TABLE runs (
        target_id      INTEGER NOT NULL REFERENCES targets (id),
        certificate_id INTEGER NOT NULL REFERENCES certificates (id),
        start          INTEGER NOT NULL,
        end            INTEGER NOT NULL,
        PRIMARY KEY (target_id, certificate_id, start)
    ) WITHOUT ROWID;
    INSERT INTO runs (target_id, certificate_id, start, end)
        SELECT target_id, certificate_id, first_seen, last_seen FROM observations;
    """,
    # 3: a (target, certificate) pair whose history is one run keeps no runs
    # rows: that run is its observation's first_seen..last_seen (most pairs;
    # the batched writer then neither reads nor writes runs rows for them).
    # A pair gets rows, all its runs, once a second run starts.
    """
    DELETE FROM runs WHERE EXISTS (
        SELECT 1 FROM observations o
        WHERE o.target_id = runs.target_id AND o.certificate_id = runs.certificate_id
          AND o.first_seen = runs.start AND o.last_seen = runs.end
    );
    """,
    # 4: bounded storage. ``asked_at``: when someone last asked about the
    # target (Unix seconds; targets recorded before this migration count as
    # asked now, so none is forgotten at the upgrade). Indexes for the
    # retention's scan and for deleting certificates (the foreign keys'
    # child lookups). ``settings``: ``deletions`` counts transactions that
    # deleted rows (id memos), the limits the rows are within (absent: not
    # swept yet).
    """
    ALTER TABLE targets ADD COLUMN asked_at INTEGER NOT NULL DEFAULT 0;
    UPDATE targets SET asked_at = CAST(strftime('%s', 'now') AS INTEGER);
    CREATE INDEX targets_by_asked_at ON targets (asked_at);
    CREATE INDEX observations_by_certificate ON observations (certificate_id);
    CREATE INDEX runs_by_certificate ON runs (certificate_id);
    CREATE TABLE settings (
        name  TEXT PRIMARY KEY,
        value INTEGER NOT NULL
    ) WITHOUT ROWID;
    INSERT INTO settings VALUES ('deletions', 0);
    """,
    # 5: the change feed (``notary.state.feed``).
    feed.MIGRATION,
    # 6: probe claims (``notary.state.claims``).
    claims.MIGRATION,
)
BUSY_TIMEOUT_MS = 5000
#: ``INSERT ... RETURNING`` (``Store.record``) came with SQLite 3.35.
MIN_SQLITE_VERSION = (3, 35, 0)
MAX_ADDRESSES = 8
#: The database and its ``-wal``/``-shm`` files: the owner only, or with a
#: service group (``[node] group``) the group may read too.
DATABASE_FILE_MODE = 0o600
DATABASE_GROUP_FILE_MODE = 0o640


def database_file_mode(group: str) -> int:
    """The mode of the database files: 0640 when the service runs with a
    group of its own (``[node] group``), else 0600."""
    return DATABASE_GROUP_FILE_MODE if group else DATABASE_FILE_MODE


_COUNT_OBSERVATIONS = "SELECT count(*) FROM observations WHERE target_id = ?"
_COUNT_RUNS = "SELECT count(*) FROM runs WHERE target_id = ? AND certificate_id = ?"
_DELETIONS = "SELECT value FROM settings WHERE name = 'deletions'"
_COUNT_DELETION = "UPDATE settings SET value = value + 1 WHERE name = 'deletions' RETURNING value"
_NOTE_ASKED = "UPDATE targets SET asked_at = ? WHERE host = ? AND port = ? AND asked_at < ?"
#: Entries of each id memo before it is cleared.
ID_MEMO_ENTRIES = 100_000


#: Most rows in one ``VALUES`` list (SQLite allows 32766 parameters; the
#: widest row here has 5).
ROWS_PER_STATEMENT = 512


def _chunks(items: list) -> Iterator[list]:
    for index in range(0, len(items), ROWS_PER_STATEMENT):
        yield items[index:index + ROWS_PER_STATEMENT]


def _padded_rows(count: int) -> int:
    """``count`` rounded up to a power of two: ``VALUES`` lists come in a few
    lengths only (padded with NULL rows that match nothing), so a handful of
    SQL texts serve every batch size and stay in sqlite3's statement cache
    (preparing a 500-row ``VALUES`` list costs milliseconds)."""
    return 1 << (count - 1).bit_length()


@cache
def _values(rows: int, columns: int) -> str:
    """``VALUES (?, ?), (?, ?)``: ``rows`` rows of ``columns`` parameters."""
    row = "(" + ", ".join(["?"] * columns) + ")"
    return "VALUES " + ", ".join([row] * rows)


def _flat(rows: list[tuple], columns: int) -> list:
    """The parameters of ``rows``, padded with NULL rows to ``_padded_rows``."""
    flat = [value for row in rows for value in row]
    flat += [None] * (columns * (_padded_rows(len(rows)) - len(rows)))
    return flat


@cache
def _insert_sql(table: str, columns: tuple[str, ...], returning: str, rows: int) -> str:
    """Insert ``rows`` rows of ``columns`` into ``table`` unless there (NULL
    padding rows are skipped); return ``returning`` of those inserted."""
    picked = ", ".join(f"column{i}" for i in range(1, len(columns) + 1))
    return (
        f"INSERT INTO {table} ({', '.join(columns)}) SELECT {picked} FROM ("
        + _values(rows, len(columns))
        + f") WHERE column1 IS NOT NULL ON CONFLICT DO NOTHING RETURNING {returning}"
    )


# A join with the batch (a CTE of its rows), not ``IN (VALUES ...)``: SQLite
# plans the latter as a scan of the whole table. NULL padding rows match no row.
@cache
def _select_sql(table: str, keys: tuple[str, ...], rows: int) -> str:
    """The id and ``keys`` of each row of ``table`` whose ``keys`` are among
    ``rows`` rows of parameters."""
    return (
        f"WITH wanted ({', '.join(keys)}) AS (" + _values(rows, len(keys)) + ")"
        f" SELECT t.id, {', '.join(f't.{key}' for key in keys)} FROM wanted b JOIN {table} t"
        " ON " + " AND ".join(f"t.{key} = b.{key}" for key in keys)
    )


#: A new target counts as asked about when first observed (a probe follows
#: a query, or a rescan of a target asked about lately).
_TARGET_COLUMNS = ("host", "port", "asked_at")
_CERTIFICATE_COLUMNS = ("sha256", "sha1", "md5", "spki_sha256", "der")


@cache
def _read_pairs_sql(rows: int) -> str:
    """Each stored pair of the batch: its observation, the runs that reach
    ``[low, high]`` (one row per run; a NULL run if none does) and whether
    it has runs rows at all (if not, its one run is first_seen..last_seen)."""
    return (
        "WITH pairs (t, c, low, high) AS (" + _values(rows, 4) + ")"
        " SELECT o.target_id, o.certificate_id, o.first_seen, o.last_seen, o.addresses,"
        " r.start, r.end, EXISTS (SELECT 1 FROM runs x"
        " WHERE x.target_id = b.t AND x.certificate_id = b.c)"
        " FROM pairs b JOIN observations o ON o.target_id = b.t AND o.certificate_id = b.c"
        " LEFT JOIN runs r ON r.target_id = b.t AND r.certificate_id = b.c"
        " AND r.end >= b.low AND r.start <= b.high"
    )


# New pairs only; the upsert is a guard (the read found no row for them).
_INSERT_OBSERVATIONS = """
    INSERT INTO observations VALUES (?, ?, ?, ?, ?)
    ON CONFLICT (target_id, certificate_id) DO UPDATE SET
        first_seen = excluded.first_seen, last_seen = excluded.last_seen,
        addresses = excluded.addresses
"""
_UPDATE_OBSERVATIONS = """
    UPDATE observations SET first_seen = ?, last_seen = ?, addresses = ?
    WHERE target_id = ? AND certificate_id = ?
"""
_DELETE_RUNS = "DELETE FROM runs WHERE target_id = ? AND certificate_id = ? AND start = ?"
_INSERT_RUNS = "INSERT INTO runs VALUES (?, ?, ?, ?)"
_UPDATE_RUNS = "UPDATE runs SET end = ? WHERE target_id = ? AND certificate_id = ? AND start = ?"


def _merged_addresses(parts: list[str], address: str) -> str:
    """The stored address list (split at commas) after a sighting from
    ``address``: it comes first, without duplicates, at most ``MAX_ADDRESSES``."""
    merged = [address, *(a for a in parts if a and a != address)]
    return ",".join(merged[:MAX_ADDRESSES])


@dataclass(slots=True)
class _Writes:
    """The rows one batch writes, by statement."""

    observations_inserted: list[tuple] = field(default_factory=list)
    observations_updated: list[tuple] = field(default_factory=list)
    runs_deleted: list[tuple] = field(default_factory=list)
    runs_inserted: list[tuple] = field(default_factory=list)
    runs_updated: list[tuple] = field(default_factory=list)

    def execute(self, db: sqlite3.Connection) -> None:
        """Run the batch's statements, deletions first (a run whose start
        moves is deleted and inserted again)."""
        for sql, parameters in (
            (_DELETE_RUNS, self.runs_deleted),
            (_INSERT_OBSERVATIONS, self.observations_inserted),
            (_UPDATE_OBSERVATIONS, self.observations_updated),
            (_INSERT_RUNS, self.runs_inserted),
            (_UPDATE_RUNS, self.runs_updated),
        ):
            if parameters:
                db.executemany(sql, parameters)


def _by_pair(
    pairs: list[tuple[int, int]], results: Sequence[ProbeResult]
) -> tuple[dict[tuple[int, int], ProbeResult], dict[tuple[int, int], list[ProbeResult]]]:
    """The batch's sightings by (target, certificate) pair: ``singles``, the
    pairs seen once (most), and ``groups``, the others in recording order."""
    singles = dict(zip(pairs, results, strict=True))
    groups: dict[tuple[int, int], list[ProbeResult]] = {}
    if len(singles) < len(results):
        for pair, result in zip(pairs, results, strict=True):
            groups.setdefault(pair, []).append(result)
        singles = {pair: rs[0] for pair, rs in groups.items() if len(rs) == 1}
        groups = {pair: rs for pair, rs in groups.items() if len(rs) > 1}
    return singles, groups


def _remember(memo: dict, learnt: dict) -> None:
    if len(memo) + len(learnt) > ID_MEMO_ENTRIES:
        memo.clear()
    memo.update(learnt)


def _ensure_file_mode(path: Path, mode: int) -> None:
    """Create the database file ``path`` with ``mode`` if it is missing, and
    give it and its existing ``-wal``/``-shm`` files exactly ``mode``.
    Raises ``StoreError``."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    except FileExistsError:
        pass
    except OSError as exc:
        raise StoreError(f"database {path}: {exc.strerror}") from None
    else:
        os.close(fd)
    for name in (str(path), f"{path}-wal", f"{path}-shm"):
        try:
            status = os.stat(name)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise StoreError(f"database {name}: {exc.strerror}") from None
        if not stat.S_ISREG(status.st_mode):
            raise StoreError(f"database {name}: not a regular file")
        if stat.S_IMODE(status.st_mode) != mode:
            try:
                os.chmod(name, mode)
            except OSError as exc:
                raise StoreError(
                    f"cannot make {name} mode {mode:04o} ({exc.strerror}): run as its "
                    f"owner, or chmod {mode:04o} it"
                ) from None


class Store(EngineOperations):
    """One connection to the observation database on SQLite.

    ``limits``: what a target keeps (``TimelineLimits``): ``record`` keeps
    the rows within them and ``load_timeline`` reads within them; None keeps
    everything. ``create``: make the file if it is missing, with
    ``file_mode``, and set that mode on the existing files (the database,
    ``-wal``, ``-shm``); a reader opens with ``create=False`` and touches no
    mode."""

    _db: SqliteConnection

    def __init__(
        self,
        path: Path,
        *,
        synchronous: str = "NORMAL",
        create: bool = True,
        merge_window_s: int = DEFAULT_MERGE_WINDOW_S,
        limits: TimelineLimits | None = None,
        file_mode: int = DATABASE_FILE_MODE,
    ) -> None:
        self.path = Path(path)
        self.merge_window_s = merge_window_s
        self.limits = limits
        #: Row ids of targets and certificates known to be committed (a
        #: bounded memo: cleared when full, and when rows were deleted:
        #: ``_deletions``).
        self._target_ids: dict[tuple[str, int], int] = {}
        self._certificate_ids: dict[bytes, int] = {}
        #: The ``deletions`` count the memos are valid for.
        self._deletions = 0
        if not create and not self.path.exists():
            raise StoreError(f"database {self.path} does not exist (run `notary db init`)")
        if synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise StoreError(f"unknown synchronous mode {synchronous!r}")
        if sqlite3.sqlite_version_info < MIN_SQLITE_VERSION:
            raise StoreError(
                f"SQLite {sqlite3.sqlite_version} is too old: the store needs "
                f"{'.'.join(map(str, MIN_SQLITE_VERSION))} or newer (INSERT ... RETURNING)"
            )
        if create:
            _ensure_file_mode(self.path, file_mode)
        self._db = SqliteConnection.open(
            self.path, synchronous=synchronous.upper(), busy_timeout_ms=BUSY_TIMEOUT_MS,
            foreign_keys=True,
        )
        try:
            self.migrate()
            self._deletions = self._db.read(_DELETIONS)[0][0]
        except BaseException:
            self._db.close()  # a failed open leaves no connection behind
            raise

    def schema_version(self) -> int:
        return int(self._db.read("PRAGMA user_version")[0][0])

    def migrate(self) -> int:
        """Apply pending migrations; return how many this connection ran.
        Idempotent, and safe when several processes (a node's workers) open
        one new file at once: each step reads the version under the write
        lock, so a step another process applied meanwhile is not run again.

        Raises ``StoreError`` if the file was made by a newer notary.
        """
        ran = 0
        # Read without the write lock first: the usual case is up to date.
        while (version := self.schema_version()) < SCHEMA_VERSION:
            with self._db.transaction() as db:
                version = db.execute("PRAGMA user_version").fetchone()[0]
                if version >= SCHEMA_VERSION:  # another process migrated it
                    continue
                for statement in MIGRATIONS[version].split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(f"PRAGMA user_version = {version + 1}")
            ran += 1
        self._check_not_newer(version)
        return ran

    def _check_not_newer(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"database {self.path} has schema {version}, newer than this "
                f"notary's {SCHEMA_VERSION}"
            )

    def record(
        self, results: Sequence[ProbeResult], origin: str = "",
        probes: Sequence[int] | None = None,
    ) -> None:
        """Record ``results`` in one transaction, with a row per probe in
        the change feed (``notary.state.feed``; ``origin`` names the
        writer; ``probes``: how many consecutive results make each probe,
        None: one each): a certificate seen again
        widens its observation (first_seen down, last_seen up) and adds the
        address; a new one starts an observation. ``first_seen`` and
        ``last_seen`` do not depend on the order of recording, so a batch may
        be retried after a newer one committed; the address list is ordered
        by recording (newest recorded first), not by ``observed_at``. The
        sighting also joins the runs within ``merge_window_s`` of it, as
        :func:`~notary.model.observations.add_sighting` does in memory.

        Set-based, a few statements per batch whatever its size: one
        ``INSERT ... RETURNING`` per table for the ids of targets and
        certificates not in the memo (and one joined ``SELECT`` for those
        that turn out to exist already), one read of the batch's stored
        observations with the runs near its sightings, one ``executemany``
        per kind of write.

        With ``limits``, the targets whose rows this batch could take beyond
        them (a new certificate where the target has nearly its maximum, a
        new run where a certificate has nearly its maximum) are written
        apart, by :meth:`Timeline.merged` with the limits, one sighting at a
        time: the rows are what the in-memory merge gives. Certificates no
        target refers to any more are deleted. A certificate's DER larger
        than the limit is not written (its hashes are)."""
        if not results:
            return
        if self.merge_window_s < 0:
            raise ValueError("merge_window_s must not be negative")
        # Ids learnt in this transaction join the memo only once it commits:
        # a rolled-back insert must not leave an id that names no row.
        learnt_targets: dict[tuple[str, int], int] = {}
        learnt_certificates: dict[bytes, int] = {}
        with self._db.transaction() as db:
            deletions = db.execute(_DELETIONS).fetchone()[0]
            if deletions != self._deletions:  # rows were deleted: ids may name others
                self._target_ids.clear()
                self._certificate_ids.clear()
                self._deletions = deletions
            target_ids, new_targets = self._target_ids_of(db, results, learnt_targets)
            certificate_ids, new_certificates = self._certificate_ids_of(
                db, results, learnt_certificates
            )
            pairs = list(zip(target_ids, certificate_ids, strict=True))
            feed.write(self._db, db, results, pairs, origin, self.merge_window_s, probes,
                       new_targets=new_targets)
            dropped = self._write(db, pairs, results, new_targets, new_certificates)
            deleted = self._delete_orphans(db, dropped)
            if deleted:
                deletions = db.execute(_COUNT_DELETION).fetchone()[0]
        if deleted:
            self._deletions = deletions
            for sha256 in deleted:
                learnt_certificates.pop(sha256, None)
                self._certificate_ids.pop(sha256, None)
        _remember(self._target_ids, learnt_targets)
        _remember(self._certificate_ids, learnt_certificates)

    def _target_ids_of(
        self, db: sqlite3.Connection, results: Sequence[ProbeResult],
        learnt: dict[tuple[str, int], int],
    ) -> tuple[list[int], set[int]]:
        """The target id of each result, and the ids of the rows this call
        inserted; targets not in the memo are inserted (or found) and their
        ids put in ``learnt``."""
        keys = [(r.target.host, r.target.port) for r in results]
        ids = list(map(self._target_ids.get, keys))
        inserted: set[int] = set()
        if None not in ids:
            return cast(list[int], ids), inserted
        asked_at: dict[tuple[str, int], int] = {}
        for key, i, result in zip(keys, ids, results, strict=True):
            if i is None:
                asked_at[key] = max(asked_at.get(key, result.observed_at), result.observed_at)
        missing = list(asked_at)
        rows = [(host, port, asked_at[(host, port)]) for host, port in missing]
        for chunk in _chunks(rows):
            sql = _insert_sql("targets", _TARGET_COLUMNS, "id, host, port",
                              _padded_rows(len(chunk)))
            for row_id, host, port in db.execute(sql, _flat(chunk, 3)).fetchall():
                learnt[(host, port)] = row_id
                inserted.add(row_id)
        # Not inserted: the row exists (it left the memo when the memo was
        # cleared, or another connection inserted it).
        for chunk in _chunks([k for k in missing if k not in learnt]):
            sql = _select_sql("targets", ("host", "port"), _padded_rows(len(chunk)))
            for row_id, host, port in db.execute(sql, _flat(chunk, 2)).fetchall():
                learnt[(host, port)] = row_id
        return [learnt[k] if i is None else i for k, i in zip(keys, ids, strict=True)], inserted

    def _certificate_ids_of(
        self, db: sqlite3.Connection, results: Sequence[ProbeResult],
        learnt: dict[bytes, int],
    ) -> tuple[list[int], set[int]]:
        """As ``_target_ids_of``, for the leaf certificates. A certificate in
        the memo is not offered to INSERT again: its DER is the largest value
        written, and most sightings are of known ones."""
        shas = [r.leaf.sha256 for r in results]
        ids = list(map(self._certificate_ids.get, shas))
        inserted: set[int] = set()
        if None not in ids:
            return cast(list[int], ids), inserted
        missing: dict[bytes, Certificate] = {}
        for sha256, i, result in zip(shas, ids, results, strict=True):
            if i is None and sha256 not in missing:
                missing[sha256] = result.leaf
        max_der = self.limits.max_certificate_bytes if self.limits is not None else None
        rows = [
            (c.sha256, c.sha1, c.md5, c.spki_sha256,
             c.der if max_der is None or len(c.der) <= max_der else b"")
            for c in missing.values()
        ]
        for chunk in _chunks(rows):
            sql = _insert_sql("certificates", _CERTIFICATE_COLUMNS, "id, sha256",
                              _padded_rows(len(chunk)))
            for row_id, sha256 in db.execute(sql, _flat(chunk, 5)).fetchall():
                learnt[sha256] = row_id
                inserted.add(row_id)
        for chunk in _chunks([(s,) for s in missing if s not in learnt]):
            sql = _select_sql("certificates", ("sha256",), _padded_rows(len(chunk)))
            for row_id, sha256 in db.execute(sql, _flat(chunk, 1)).fetchall():
                learnt[sha256] = row_id
        return [learnt[s] if i is None else i for s, i in zip(shas, ids, strict=True)], inserted

    def _write(
        self, db: sqlite3.Connection, pairs: list[tuple[int, int]],
        results: Sequence[ProbeResult], new_targets: set[int], new_certificates: set[int],
    ) -> set[int]:
        """Upsert the observation of each (target, certificate) pair and add
        its sightings to its runs (``pairs[i]`` is that of ``results[i]``);
        return the ids of the certificates some target dropped (limits).

        Only runs within the merge window of the batch's sightings are read:
        no other run can change (stored runs are more than the window apart).
        A pair whose history is one run keeps no runs rows (schema 3): the run
        is its observation's ``first_seen``..``last_seen``; rows are written
        once a second run starts, and kept from then on.

        With ``limits``, the rows are within them before the batch (they
        are swept when the limits change, ``enforce_limits``), so a target
        whose rows cannot go beyond them through this batch is written here
        and needs no limit; the others are rewritten by ``_rewrite``."""
        singles, groups = _by_pair(pairs, results)
        found, touching = self._read_near(db, singles, groups, new_targets, new_certificates)
        rewritten: set[int] = set()
        if self.limits is not None:
            rewritten = self._may_exceed_limits(db, singles, groups, found, touching, new_targets)
            if rewritten:
                singles = {pair: r for pair, r in singles.items() if pair[0] not in rewritten}
                groups = {pair: rs for pair, rs in groups.items() if pair[0] not in rewritten}
        writes = _Writes()
        self._write_singles(singles, found, touching, groups, writes)
        for pair, rs in groups.items():
            self._write_group(pair, rs, found.get(pair), touching.get(pair), writes)
        writes.execute(db)
        dropped: set[int] = set()
        if rewritten:
            sightings: dict[int, list[tuple[ProbeResult, int]]] = {}
            for (t, c), result in zip(pairs, results, strict=True):
                if t in rewritten:
                    sightings.setdefault(t, []).append((result, c))
            targets = {seen[0][0].target: t for t, seen in sightings.items()}
            dropped = self._rewrite(db, sightings, self._timelines(db, targets))
        return dropped

    def _read_near(
        self, db: sqlite3.Connection, singles: dict[tuple[int, int], ProbeResult],
        groups: dict[tuple[int, int], list[ProbeResult]],
        new_targets: set[int], new_certificates: set[int],
    ) -> tuple[dict[tuple[int, int], tuple], dict[tuple[int, int], list[Run]]]:
        """The stored rows of the pairs that may be stored (not those with a
        target or a certificate this batch inserted), each with the run near
        its sighting: ``found`` by pair, and ``touching``, the pairs with
        several runs near a sighting."""
        window = self.merge_window_s
        if new_targets or new_certificates:
            read = [(t, c, r.observed_at) for (t, c), r in singles.items()
                    if t not in new_targets and c not in new_certificates]
        else:
            read = [(t, c, r.observed_at) for (t, c), r in singles.items()]
        bounds: list[int | None] = [
            value for t, c, seen in read for value in (t, c, seen - window, seen + window)
        ]
        for (t, c), rs in groups.items():
            if t not in new_targets and c not in new_certificates:
                times = [r.observed_at for r in rs]
                bounds += (t, c, min(times) - window, max(times) + window)
        rows: list[tuple] = []
        step = 4 * ROWS_PER_STATEMENT
        for index in range(0, len(bounds), step):
            chunk = bounds[index:index + step]
            padded = _padded_rows(len(chunk) // 4)
            chunk += [None] * (4 * padded - len(chunk))
            rows += db.execute(_read_pairs_sql(padded), chunk).fetchall()
        found = {row[:2]: row for row in rows}
        touching: dict[tuple[int, int], list[Run]] = {}
        if len(found) < len(rows):  # some pairs have several runs near a sighting
            for row in rows:
                touching.setdefault(row[:2], []).append(row[5:7])
            touching = {pair: runs for pair, runs in touching.items() if len(runs) > 1}
        return found, touching

    def _write_singles(
        self, singles: dict[tuple[int, int], ProbeResult], found: dict[tuple[int, int], tuple],
        touching: dict[tuple[int, int], list[Run]],
        groups: dict[tuple[int, int], list[ProbeResult]], writes: _Writes,
    ) -> None:
        """The common case, one loop: one sighting of a pair and at most one
        run near it, into ``writes``; a pair with several runs near its
        sighting joins ``groups``."""
        window = self.merge_window_s
        insert_observation = writes.observations_inserted.append
        update_observation = writes.observations_updated.append
        insert_run = writes.runs_inserted.append
        update_run = writes.runs_updated.append
        get_row = found.get
        for pair, result in singles.items():
            row = get_row(pair)
            seen = result.observed_at
            if row is None:  # a new observation: its one run needs no row
                insert_observation((*pair, seen, seen, result.address))
                continue
            if touching and pair in touching:
                groups[pair] = [result]
                continue
            t, c, first, last, text, start, end, has_runs = row
            address = result.address
            if text == address:
                addresses = text
            else:
                parts = text.split(",")
                if len(parts) < MAX_ADDRESSES and address not in parts and "" not in parts:
                    addresses = address + "," + text
                else:
                    addresses = _merged_addresses(parts, address)
            if seen < first:
                update_observation((seen, last, addresses, t, c))
            elif seen > last:
                update_observation((first, seen, addresses, t, c))
            elif addresses != text:  # else this sighting was recorded before
                update_observation((first, last, addresses, t, c))
            if not has_runs:  # one run, first..last: it takes the sighting
                if seen < first - window or seen > last + window:  # or a second starts
                    insert_run((t, c, first, last))
                    insert_run((t, c, seen, seen))
            elif start is None:  # no run near: a run of its own
                insert_run((t, c, seen, seen))
            elif seen > end:  # the run near it ends later
                update_run((seen, t, c, start))
            elif seen < start:  # or starts earlier (its key changes)
                writes.runs_deleted.append((t, c, start))
                insert_run((t, c, seen, end))

    def _may_exceed_limits(
        self, db: sqlite3.Connection, singles: dict[tuple[int, int], ProbeResult],
        groups: dict[tuple[int, int], list[ProbeResult]], found: dict[tuple[int, int], tuple],
        touching: dict[tuple[int, int], list[Run]], new_targets: set[int],
    ) -> set[int]:
        """The targets whose rows this batch could take beyond ``limits`` at
        some sighting (an upper bound: each sighting adds at most one
        observation, or one run to its pair). Counts are read only where a
        sighting adds one."""
        limits = self.limits
        assert limits is not None
        window = self.merge_window_s
        max_runs = limits.max_runs_per_certificate
        new_pairs: dict[int, int] = {}
        for pair in (*singles, *groups):
            if pair not in found:
                new_pairs[pair[0]] = new_pairs.get(pair[0], 0) + 1
        exceeding: set[int] = set()
        for t, added in new_pairs.items():
            stored = 0 if t in new_targets else db.execute(_COUNT_OBSERVATIONS, (t,)).fetchone()[0]
            if stored + added > limits.max_certificates_per_target:
                exceeding.add(t)
        for pair, result in singles.items():
            row = found.get(pair)
            if row is None or pair[0] in exceeding or pair in touching:
                continue  # a new pair (one run), or a sighting that merges runs
            _, _, first, last, _, start, _, has_runs = row
            seen = result.observed_at
            if has_runs:
                if start is None and db.execute(_COUNT_RUNS, pair).fetchone()[0] + 1 > max_runs:
                    exceeding.add(pair[0])
            elif (seen < first - window or seen > last + window) and max_runs < 2:
                exceeding.add(pair[0])
        for pair, sightings in groups.items():
            if pair[0] in exceeding:
                continue
            row = found.get(pair)
            stored = 0 if row is None else (
                db.execute(_COUNT_RUNS, pair).fetchone()[0] if row[7] else 1
            )
            if stored + len(sightings) > max_runs:
                exceeding.add(pair[0])
        return exceeding

    def _write_group(
        self, pair: tuple[int, int], results: list[ProbeResult], row: tuple | None,
        touching: list[Run] | None, writes: _Writes,
    ) -> None:
        """The general case of ``_write``: several sightings of ``pair``
        (in recording order), or several runs near its sighting;
        :func:`add_sighting` per sighting. ``row`` is what the read found
        (None for a new pair), ``touching`` the runs near the sightings if
        there are several."""
        first = last = None
        addresses: list[str] = []
        before: tuple[Run, ...] = ()
        has_runs = False
        if row is not None:
            _, _, first, last, text, start, end, has_runs = row
            addresses = [a for a in text.split(",") if a]
            if not has_runs:
                before = ((first, last),)
            elif touching is not None:
                before = tuple(sorted(touching))
            elif start is not None:
                before = ((start, end),)
        after = before
        for result in results:
            seen = result.observed_at
            first = seen if first is None else min(first, seen)
            last = seen if last is None else max(last, seen)
            addresses = [result.address, *(a for a in addresses if a != result.address)]
            addresses = addresses[:MAX_ADDRESSES]
            after = add_sighting(after, seen, self.merge_window_s)
        if row is None:
            writes.observations_inserted.append((*pair, first, last, ",".join(addresses)))
        else:
            writes.observations_updated.append((first, last, ",".join(addresses), *pair))
        if not has_runs:  # one run needs no row; a second one needs them all
            if len(after) > 1:
                writes.runs_inserted += [(*pair, *run) for run in after]
            return
        ends_before = dict(before)
        ends_after = dict(after)
        writes.runs_deleted += [(*pair, start) for start in ends_before
                                if start not in ends_after]
        for start, end in after:
            if start not in ends_before:
                writes.runs_inserted.append((*pair, start, end))
            elif ends_before[start] != end:
                writes.runs_updated.append((end, *pair, start))

    # -- what is kept: asked-about times, retention, limits, compaction ------------

    def note_asked(self, targets: Iterable[tuple[str, int]], at: int) -> int:
        """Record that each ``(host, port)`` of ``targets`` was asked about
        at ``at`` (Unix seconds; never moved back), in one transaction; a
        target not stored is skipped. Return how many rows changed."""
        rows = [(at, host, port, at) for host, port in targets]
        if not rows:
            return 0
        with self._db.transaction() as db:
            return db.executemany(_NOTE_ASKED, rows).rowcount

    def _deleted(self, db: Transaction) -> None:
        """This transaction deleted rows: count it (``settings``) and forget
        the memoised ids (the rows of some may be gone)."""
        self._deletions = db.execute(_COUNT_DELETION).fetchone()[0]
        self._target_ids.clear()
        self._certificate_ids.clear()

    def _shrink(self) -> None:
        """``VACUUM`` (the file shrinks to what is kept; it needs as much free
        disk again while it runs), then the WAL truncated."""
        self._db.change("VACUUM")
        self._db.change("PRAGMA wal_checkpoint(TRUNCATE)")

    def _size(self) -> int:
        """The bytes of the database file and its WAL."""
        size = 0
        for suffix in ("", "-wal"):
            with suppress(FileNotFoundError):
                size += os.stat(f"{self.path}{suffix}").st_size
        return size
