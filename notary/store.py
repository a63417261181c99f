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
from dataclasses import dataclass, field
from functools import cache
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
)
SCHEMA_VERSION = len(MIGRATIONS)
BUSY_TIMEOUT_MS = 5000
#: ``INSERT ... RETURNING`` (``Store.record``) came with SQLite 3.35.
MIN_SQLITE_VERSION = (3, 35, 0)
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


# A join with the batch (a CTE of its rows), not ``IN (VALUES ...)``: SQLite
# plans the latter as a scan of the whole table. NULL padding rows match no row.
@cache
def _insert_targets_sql(rows: int) -> str:
    return (
        "INSERT INTO targets (host, port) SELECT column1, column2 FROM ("
        + _values(rows, 2)
        + ") WHERE column1 IS NOT NULL ON CONFLICT DO NOTHING RETURNING id, host, port"
    )


@cache
def _select_targets_sql(rows: int) -> str:
    return (
        "WITH wanted_targets (host, port) AS (" + _values(rows, 2) + ")"
        " SELECT t.id, t.host, t.port FROM wanted_targets b JOIN targets t"
        " ON t.host = b.host AND t.port = b.port"
    )


@cache
def _insert_certificates_sql(rows: int) -> str:
    return (
        "INSERT INTO certificates (sha256, sha1, md5, spki_sha256, der)"
        " SELECT column1, column2, column3, column4, column5 FROM ("
        + _values(rows, 5)
        + ") WHERE column1 IS NOT NULL ON CONFLICT DO NOTHING RETURNING id, sha256"
    )


@cache
def _select_certificates_sql(rows: int) -> str:
    return (
        "WITH wanted_certificates (sha256) AS (" + _values(rows, 1) + ")"
        " SELECT c.id, c.sha256 FROM wanted_certificates b"
        " JOIN certificates c ON c.sha256 = b.sha256"
    )


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
        if sqlite3.sqlite_version_info < MIN_SQLITE_VERSION:
            raise StoreError(
                f"SQLite {sqlite3.sqlite_version} is too old: the store needs "
                f"{'.'.join(map(str, MIN_SQLITE_VERSION))} or newer (INSERT ... RETURNING)"
            )
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
        """Every observation of ``target`` (an empty timeline if unknown),
        with its runs (one, ``first_seen``..``last_seen``, if it has no runs
        rows)."""
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
                runs=tuple(runs.get(sha256, ())) or ((first, last),),
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
        :func:`~notary.observations.add_sighting` does in memory.

        Set-based, a few statements per batch whatever its size: one
        ``INSERT ... RETURNING`` per table for the ids of targets and
        certificates not in the memo (and one joined ``SELECT`` for those
        that turn out to exist already), one read of the batch's stored
        observations with the runs near its sightings, one ``executemany``
        per kind of write."""
        if not results:
            return
        if self.merge_window_s < 0:
            raise ValueError("merge_window_s must not be negative")
        # Ids learnt in this transaction join the memo only once it commits:
        # a rolled-back insert must not leave an id that names no row.
        learnt_targets: dict[tuple[str, int], int] = {}
        learnt_certificates: dict[bytes, int] = {}
        with self._transaction() as db:
            target_ids, new_targets = self._target_ids_of(db, results, learnt_targets)
            certificate_ids, new_certificates = self._certificate_ids_of(
                db, results, learnt_certificates
            )
            pairs = list(zip(target_ids, certificate_ids, strict=True))
            self._write(db, pairs, results, new_targets, new_certificates)
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
            return ids, inserted
        missing = list(dict.fromkeys([k for k, i in zip(keys, ids, strict=True) if i is None]))
        for chunk in _chunks(missing):
            sql = _insert_targets_sql(_padded_rows(len(chunk)))
            for row_id, host, port in db.execute(sql, _flat(chunk, 2)).fetchall():
                learnt[(host, port)] = row_id
                inserted.add(row_id)
        # Not inserted: the row exists (it left the memo when the memo was
        # cleared, or another connection inserted it).
        for chunk in _chunks([k for k in missing if k not in learnt]):
            sql = _select_targets_sql(_padded_rows(len(chunk)))
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
            return ids, inserted
        missing: dict[bytes, Certificate] = {}
        for sha256, i, result in zip(shas, ids, results, strict=True):
            if i is None and sha256 not in missing:
                missing[sha256] = result.leaf
        rows = [(c.sha256, c.sha1, c.md5, c.spki_sha256, c.der) for c in missing.values()]
        for chunk in _chunks(rows):
            sql = _insert_certificates_sql(_padded_rows(len(chunk)))
            for row_id, sha256 in db.execute(sql, _flat(chunk, 5)).fetchall():
                learnt[sha256] = row_id
                inserted.add(row_id)
        for chunk in _chunks([(s,) for s in missing if s not in learnt]):
            sql = _select_certificates_sql(_padded_rows(len(chunk)))
            for row_id, sha256 in db.execute(sql, _flat(chunk, 1)).fetchall():
                learnt[sha256] = row_id
        return [learnt[s] if i is None else i for s, i in zip(shas, ids, strict=True)], inserted

    def _write(
        self, db: sqlite3.Connection, pairs: list[tuple[int, int]],
        results: Sequence[ProbeResult], new_targets: set[int], new_certificates: set[int],
    ) -> None:
        """Upsert the observation of each (target, certificate) pair and add
        its sightings to its runs (``pairs[i]`` is that of ``results[i]``).

        Only runs within the merge window of the batch's sightings are read:
        no other run can change (stored runs are more than the window apart).
        A pair whose history is one run keeps no runs rows (schema 3): the run
        is its observation's ``first_seen``..``last_seen``; rows are written
        once a second run starts, and kept from then on."""
        window = self.merge_window_s
        # Most pairs have one sighting in a batch: ``singles`` maps them to
        # it; ``groups`` holds the others, sightings in recording order.
        singles = dict(zip(pairs, results, strict=True))
        groups: dict[tuple[int, int], list[ProbeResult]] = {}
        if len(singles) < len(results):
            for pair, result in zip(pairs, results, strict=True):
                groups.setdefault(pair, []).append(result)
            singles = {pair: rs[0] for pair, rs in groups.items() if len(rs) == 1}
            groups = {pair: rs for pair, rs in groups.items() if len(rs) > 1}

        # Read the pairs that may be stored: not those with a target or a
        # certificate this batch inserted.
        if new_targets or new_certificates:
            read = [(t, c, r.observed_at) for (t, c), r in singles.items()
                    if t not in new_targets and c not in new_certificates]
        else:
            read = [(t, c, r.observed_at) for (t, c), r in singles.items()]
        bounds = [value for t, c, seen in read for value in (t, c, seen - window, seen + window)]
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

        # The common case inline: one sighting of a pair, at most one run
        # near it.
        writes = _Writes()
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
        for pair, rs in groups.items():
            self._write_group(pair, rs, found.get(pair), touching.get(pair), writes)

        for sql, parameters in (
            (_DELETE_RUNS, writes.runs_deleted),
            (_INSERT_OBSERVATIONS, writes.observations_inserted),
            (_UPDATE_OBSERVATIONS, writes.observations_updated),
            (_INSERT_RUNS, writes.runs_inserted),
            (_UPDATE_RUNS, writes.runs_updated),
        ):
            if parameters:
                db.executemany(sql, parameters)

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
