"""The observation store: SQLite in WAL mode, schema migrations, and the two
operations the notary needs (load one target's timeline, record a batch of
probe results in one transaction).

Synchronous on purpose: the Trio edge (``notary.server.storage``) runs these
methods in worker threads, one connection per thread role, so the event loop
never waits on the disk.

Resource handling: a ``Store`` owns one ``sqlite3.Connection``; ``close()``
releases it (also via ``with``). A connection must be used by one thread at a
time: callers serialise access (the Trio edge uses a limiter of 1 per store).

Error handling: every ``sqlite3`` error is raised as ``StoreError`` with the
path and a short reason.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from notary.errors import StoreError
from notary.observations import (
    DEFAULT_MERGE_WINDOW_S,
    Certificate,
    Observation,
    ProbeResult,
    Run,
    Timeline,
    add_sighting,
)
from notary.protocol.targets import Target

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
)
SCHEMA_VERSION = len(MIGRATIONS)
BUSY_TIMEOUT_MS = 5000
MAX_ADDRESSES = 8

_LOAD_TIMELINE = """
    SELECT c.der, c.sha1, c.sha256, c.md5, c.spki_sha256,
           o.first_seen, o.last_seen, o.addresses
    FROM targets t
    JOIN observations o ON o.target_id = t.id
    JOIN certificates c ON c.id = o.certificate_id
    WHERE t.host = ? AND t.port = ?
"""
_LOAD_RUNS = """
    SELECT c.sha256, r.start, r.end
    FROM targets t
    JOIN runs r ON r.target_id = t.id
    JOIN certificates c ON c.id = r.certificate_id
    WHERE t.host = ? AND t.port = ?
    ORDER BY r.start
"""


#: Entries of each id memo before it is cleared.
ID_MEMO_ENTRIES = 100_000


#: Pairs per ``IN (VALUES ...)`` read (SQLite allows 32766 parameters).
PAIRS_PER_READ = 500


def _chunks(pairs: list[tuple[int, int]]) -> Iterator[list[tuple[int, int]]]:
    for index in range(0, len(pairs), PAIRS_PER_READ):
        yield pairs[index:index + PAIRS_PER_READ]


def _remember(memo: dict, learnt: dict) -> None:
    if len(memo) + len(learnt) > ID_MEMO_ENTRIES:
        memo.clear()
    memo.update(learnt)


@dataclass(frozen=True, slots=True)
class StoreStatistics:
    schema_version: int
    targets: int
    certificates: int
    observations: int
    file_bytes: int


class Store:
    """One connection to the observation database."""

    def __init__(
        self,
        path: Path,
        *,
        synchronous: str = "NORMAL",
        create: bool = True,
        merge_window_s: int = DEFAULT_MERGE_WINDOW_S,
    ) -> None:
        self.path = Path(path)
        self.merge_window_s = merge_window_s
        #: Row ids of targets and certificates known to be committed (a
        #: bounded memo: cleared when full; rows are never deleted).
        self._target_ids: dict[tuple[str, int], int] = {}
        self._certificate_ids: dict[bytes, int] = {}
        if not create and not self.path.exists():
            raise StoreError(f"database {self.path} does not exist (run `notary db init`)")
        if synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise StoreError(f"unknown synchronous mode {synchronous!r}")
        try:
            self._db = sqlite3.connect(
                self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                check_same_thread=False,
            )
        except sqlite3.Error as exc:
            raise StoreError(f"database {self.path}: {exc}") from None
        try:
            self._db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            mode = self._db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise StoreError(f"database {self.path}: cannot enable WAL mode")
            self._db.execute(f"PRAGMA synchronous = {synchronous.upper()}")
            self._db.execute("PRAGMA foreign_keys = ON")
            self.migrate()
        except BaseException as exc:
            self._db.close()  # a failed open leaves no connection behind
            if isinstance(exc, sqlite3.Error):
                raise StoreError(f"database {self.path}: {exc}") from None
            raise

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StoreError(f"database {self.path}: {exc}") from None

    def schema_version(self) -> int:
        return self._db.execute("PRAGMA user_version").fetchone()[0]

    def migrate(self) -> int:
        """Apply pending migrations; return how many ran. Idempotent.

        Raises ``StoreError`` if the file was made by a newer notary.
        """
        current = self.schema_version()
        if current > SCHEMA_VERSION:
            raise StoreError(
                f"database {self.path} has schema {current}, newer than this notary's "
                f"{SCHEMA_VERSION}"
            )
        for version in range(current, SCHEMA_VERSION):
            with self._transaction() as db:
                for statement in MIGRATIONS[version].split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(f"PRAGMA user_version = {version + 1}")
        return SCHEMA_VERSION - current

    def load_timeline(self, target: Target) -> Timeline:
        """Every observation of ``target`` (an empty timeline if unknown)."""
        try:
            rows = self._db.execute(_LOAD_TIMELINE, (target.host, target.port)).fetchall()
            run_rows = self._db.execute(_LOAD_RUNS, (target.host, target.port)).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"database {self.path}: {exc}") from None
        runs: dict[bytes, list[tuple[int, int]]] = {}
        for sha256, start, end in run_rows:
            runs.setdefault(sha256, []).append((start, end))
        observations = tuple(
            Observation(
                certificate=Certificate(der, sha1, sha256, md5, spki),
                first_seen=first,
                last_seen=last,
                addresses=tuple(a for a in addresses.split(",") if a),
                runs=tuple(runs.get(sha256, ())),
            )
            for der, sha1, sha256, md5, spki, first, last, addresses in rows
        )
        return Timeline(target, observations)

    def iter_target_keys(self, chunk_rows: int = 10_000) -> Iterator[list[str]]:
        """The key (``Target.key``) of every stored target, ``chunk_rows`` at a
        time, streamed (memory stays bounded by the chunk, whatever the
        store's size). Raises ``StoreError``."""
        try:
            cursor = self._db.execute("SELECT host, port FROM targets")
            while rows := cursor.fetchmany(chunk_rows):
                yield [Target(host, port).key for host, port in rows]
        except sqlite3.Error as exc:
            raise StoreError(f"database {self.path}: {exc}") from None

    def record(self, results: Sequence[ProbeResult]) -> None:
        """Record ``results`` in one transaction: a certificate seen again
        widens its observation (first_seen down, last_seen up) and adds the
        address; a new one starts an observation. ``first_seen`` and
        ``last_seen`` do not depend on the order of recording, so a batch may
        be retried after a newer one committed; the address list is ordered
        by recording (newest recorded first), not by ``observed_at``. The
        sighting also joins the runs within ``merge_window_s`` of it, as
        :func:`~notary.observations.add_sighting` does in memory."""
        if not results:
            return
        # Ids learnt in this transaction join the memo only once it commits:
        # a rolled-back insert must not leave an id that names no row.
        learnt_targets: dict[tuple[str, int], int] = {}
        learnt_certificates: dict[bytes, int] = {}
        with self._transaction() as db:
            # Set-based: the batch's sightings grouped by (target, certificate)
            # in recording order, then one read and one write per table.
            sightings: dict[tuple[int, int], list[ProbeResult]] = {}
            for result in results:
                pair = (
                    self._target_id(db, result.target, learnt_targets),
                    self._certificate_id(db, result.leaf, learnt_certificates),
                )
                sightings.setdefault(pair, []).append(result)
            self._write_observations(db, sightings)
            self._write_runs(db, sightings)
        _remember(self._target_ids, learnt_targets)
        _remember(self._certificate_ids, learnt_certificates)

    @staticmethod
    def _write_observations(
        db: sqlite3.Connection, sightings: dict[tuple[int, int], list[ProbeResult]]
    ) -> None:
        existing: dict[tuple[int, int], tuple[int, int, str]] = {}
        for chunk in _chunks(list(sightings)):
            # A join with the batch, not ``IN (VALUES ...)``: SQLite plans the
            # latter as a scan of the whole table.
            rows = db.execute(
                "WITH batch (t, c) AS (VALUES " + ",".join(["(?, ?)"] * len(chunk)) + ")"
                " SELECT o.target_id, o.certificate_id, o.first_seen, o.last_seen, o.addresses"
                " FROM batch b JOIN observations o"
                " ON o.target_id = b.t AND o.certificate_id = b.c",
                [value for pair in chunk for value in pair],
            ).fetchall()
            existing.update({(t, c): (first, last, text) for t, c, first, last, text in rows})
        written = []
        for pair, results in sightings.items():
            first = last = None
            addresses: list[str] = []
            if pair in existing:
                first, last, text = existing[pair]
                addresses = [a for a in text.split(",") if a]
            for result in results:
                seen = result.observed_at
                first = seen if first is None else min(first, seen)
                last = seen if last is None else max(last, seen)
                addresses = [result.address, *(a for a in addresses if a != result.address)]
                addresses = addresses[:MAX_ADDRESSES]
            written.append((*pair, first, last, ",".join(addresses)))
        db.executemany(
            """INSERT INTO observations VALUES (?, ?, ?, ?, ?)
               ON CONFLICT (target_id, certificate_id) DO UPDATE SET
                   first_seen = excluded.first_seen, last_seen = excluded.last_seen,
                   addresses = excluded.addresses""",
            written,
        )

    def _write_runs(
        self, db: sqlite3.Connection, sightings: dict[tuple[int, int], list[ProbeResult]]
    ) -> None:
        """Each pair's sightings join its runs (:func:`add_sighting`). Only
        runs within the merge window of the batch's sightings are read: no
        other run can change (stored runs are more than the window apart)."""
        window = self.merge_window_s
        bounds = {
            pair: (
                min(r.observed_at for r in results) - window,
                max(r.observed_at for r in results) + window,
            )
            for pair, results in sightings.items()
        }
        touching: dict[tuple[int, int], list[Run]] = {pair: [] for pair in sightings}
        for chunk in _chunks(list(sightings)):
            rows = db.execute(
                "WITH batch (t, c, low, high) AS (VALUES "
                + ",".join(["(?, ?, ?, ?)"] * len(chunk))
                + ") SELECT r.target_id, r.certificate_id, r.start, r.end FROM runs r"
                " JOIN batch b ON r.target_id = b.t AND r.certificate_id = b.c"
                " AND r.end >= b.low AND r.start <= b.high",
                [value for pair in chunk for value in (*pair, *bounds[pair])],
            ).fetchall()
            for t, c, start, end in rows:
                touching[(t, c)].append((start, end))
        deleted, inserted = [], []
        for pair, results in sightings.items():
            before = tuple(sorted(touching[pair]))
            after = before
            for result in results:
                after = add_sighting(after, result.observed_at, window)
            deleted += [(*pair, start) for start, _ in set(before) - set(after)]
            inserted += [(*pair, *run) for run in set(after) - set(before)]
        db.executemany(
            "DELETE FROM runs WHERE target_id = ? AND certificate_id = ? AND start = ?", deleted
        )
        db.executemany("INSERT INTO runs VALUES (?, ?, ?, ?)", inserted)

    def _target_id(
        self, db: sqlite3.Connection, target: Target, learnt: dict[tuple[str, int], int]
    ) -> int:
        key = (target.host, target.port)
        known = self._target_ids.get(key) or learnt.get(key)
        if known is not None:
            return known
        db.execute("INSERT OR IGNORE INTO targets (host, port) VALUES (?, ?)", key)
        learnt[key] = db.execute(
            "SELECT id FROM targets WHERE host = ? AND port = ?", key
        ).fetchone()[0]
        return learnt[key]

    def _certificate_id(
        self, db: sqlite3.Connection, cert: Certificate, learnt: dict[bytes, int]
    ) -> int:
        # A certificate seen again is not offered to INSERT again: its DER is
        # the largest value written, and most sightings are of known ones.
        known = self._certificate_ids.get(cert.sha256) or learnt.get(cert.sha256)
        if known is not None:
            return known
        db.execute(
            """INSERT OR IGNORE INTO certificates (sha256, sha1, md5, spki_sha256, der)
               VALUES (?, ?, ?, ?, ?)""",
            (cert.sha256, cert.sha1, cert.md5, cert.spki_sha256, cert.der),
        )
        learnt[cert.sha256] = db.execute(
            "SELECT id FROM certificates WHERE sha256 = ?", (cert.sha256,)
        ).fetchone()[0]
        return learnt[cert.sha256]

    def statistics(self) -> StoreStatistics:
        try:
            count = self._db.execute
            targets = count("SELECT count(*) FROM targets").fetchone()[0]
            certificates = count("SELECT count(*) FROM certificates").fetchone()[0]
            observations = count("SELECT count(*) FROM observations").fetchone()[0]
        except sqlite3.Error as exc:
            raise StoreError(f"database {self.path}: {exc}") from None
        size = 0
        for suffix in ("", "-wal"):
            with suppress(FileNotFoundError):
                size += os.stat(f"{self.path}{suffix}").st_size
        return StoreStatistics(self.schema_version(), targets, certificates, observations, size)
