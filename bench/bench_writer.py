"""Writer micro-benchmark: observations committed per second.

Modes a (the batched writer), b and c (one transaction per row), d and d2
(raw ``executemany``, the ceilings), then a diagnosis of the batched writer
(``--no-diagnosis`` skips it). Modes and workload: ``bench/README.md``.

    .venv/bin/python bench/bench_writer.py           # full run (a minute or two)
    .venv/bin/python bench/bench_writer.py --quick   # smoke run (seconds)
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import shutil
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import harness
import trio

from notary.config import StoreConfig
from notary.model.observations import Certificate, ProbeResult, Run, add_sighting
from notary.model.targets import Target
from notary.outbound.writer import StorageStatistics, open_storage
from notary.state.store import MAX_ADDRESSES, Store

BATCH_ROWS = StoreConfig().batch_rows
#: Goals of the issue.
GOAL_VS_PER_ROW_DEFAULT = 100.0
GOAL_VS_RAW = 0.5

T0 = 1_700_000_000
DER_BYTES = 1_200


# ---------------------------------------------------------------------------
# Workload
# ---------------------------------------------------------------------------


def observations(n: int, seed: int = 1) -> list[ProbeResult]:
    rng = random.Random(seed)
    targets = max(1, n // 4)
    certificates = []
    for _ in range(targets):
        der = rng.randbytes(DER_BYTES)
        certificates.append(Certificate(
            der=der,
            sha1=hashlib.sha1(der).digest(),
            sha256=hashlib.sha256(der).digest(),
            md5=hashlib.md5(der).digest(),
            spki_sha256=hashlib.sha256(der[:300]).digest(),
        ))
    hosts = [Target(f"host{i}.example.test", 443) for i in range(targets)]
    return [
        ProbeResult(
            target=hosts[i % targets],
            leaf=certificates[i % targets],
            chain=(certificates[i % targets].der,),
            address=f"192.0.2.{(i // targets) % 250 + 1}",
            observed_at=T0 + i,
        )
        for i in range(n)
    ]


def fresh_path(directory: Path, name: str) -> Path:
    path = directory / f"{name}.db"
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return path


def filesystem_of(path: Path) -> str:
    """``ext4 /dev/vda mounted at /``: the mount holding ``path`` (longest prefix)."""
    best = ("?", "?", "")
    resolved = str(path.resolve())
    with open("/proc/mounts", encoding="utf-8") as mounts:
        for line in mounts:
            device, mount_point, fs_type = line.split()[:3]
            inside = resolved == mount_point or resolved.startswith(mount_point.rstrip("/") + "/")
            if inside and len(mount_point) >= len(best[2]):
                best = (fs_type, device, mount_point)
    return f"{best[0]} on {best[1]} mounted at {best[2]}"


@contextlib.contextmanager
def patched(owner: object, name: str, replacement: object) -> Iterator[None]:
    original = getattr(owner, name)
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        setattr(owner, name, original)


# ---------------------------------------------------------------------------
# The four modes of the goals
# ---------------------------------------------------------------------------


@dataclass
class BatchedRun:
    seconds: float
    statistics: StorageStatistics
    record_seconds: float  # wall time spent inside Store.record (the writer thread)


def store_settings() -> dict[str, Any]:
    """The default ``StoreConfig`` as a dict of its keys."""
    return {f.name: getattr(StoreConfig(), f.name) for f in fields(StoreConfig)}


def open_store(path: Path, synchronous: str | None = None,
               store_class: type[Store] = Store) -> Store:
    """A ``Store`` with the default ``StoreConfig`` settings it takes."""
    settings = store_settings()
    wanted = {"synchronous", "merge_window_s"} & settings.keys()
    kwargs = {name: settings[name] for name in wanted}
    if synchronous is not None:
        kwargs["synchronous"] = synchronous
    return store_class(path, **kwargs)


def run_batched(path: Path, results: Sequence[ProbeResult]) -> BatchedRun:
    inside = [0.0]
    real_record = Store.record

    def timed_record(self: Store, batch: Sequence[ProbeResult]) -> None:
        start = time.perf_counter()
        try:
            real_record(self, batch)
        finally:
            inside[0] += time.perf_counter() - start

    async def main() -> BatchedRun:
        # Every [store] setting, as notary.server.app passes them.
        async with open_storage(path, StoreConfig()) as storage:
            start = time.perf_counter()
            for result in results:
                await storage.record(result)
            while storage.statistics().committed < len(results):  # noqa: ASYNC110
                await trio.sleep(0.001)  # polling costs < 1 ms; Storage has no event
            elapsed = time.perf_counter() - start
            stats = storage.statistics()
        return BatchedRun(elapsed, stats, inside[0])

    with patched(Store, "record", timed_record):
        return trio.run(main)


def run_per_row(path: Path, results: Sequence[ProbeResult], *, default_mode: bool) -> float:
    """One ``Store.record`` transaction per observation."""
    if default_mode:
        store = open_store(path, synchronous="FULL")
        # Store always opens in WAL; switch this connection back to SQLite's
        # default rollback journal (bench-only use of the private connection).
        mode = store._db.execute("PRAGMA journal_mode = DELETE").fetchone()[0]
        synchronous = store._db.execute("PRAGMA synchronous").fetchone()[0]
        if (mode, synchronous) != ("delete", 2):
            raise RuntimeError(f"expected journal_mode=delete, synchronous=FULL; got {mode}, "
                               f"{synchronous}")
    else:
        store = open_store(path)
    try:
        start = time.perf_counter()
        for result in results:
            store.record([result])
        return time.perf_counter() - start
    finally:
        store.close()


RAW_UPSERT = """
    INSERT INTO observations (target_id, certificate_id, first_seen, last_seen, addresses)
    VALUES (?1, ?2, ?3, ?3, ?4)
    ON CONFLICT (target_id, certificate_id) DO UPDATE SET
        first_seen = min(first_seen, excluded.first_seen),
        last_seen = max(last_seen, excluded.last_seen),
        addresses = excluded.addresses
"""


RAW_SCHEMA_STATEMENTS = (
    "INSERT INTO targets (id, host, port) VALUES (?, ?, ?)",
    "INSERT INTO certificates (id, sha256, sha1, md5, spki_sha256, der) VALUES (?, ?, ?, ?, ?, ?)",
    """INSERT INTO observations (target_id, certificate_id, first_seen, last_seen, addresses)
       VALUES (?, ?, ?, ?, ?)
       ON CONFLICT (target_id, certificate_id) DO UPDATE SET
           first_seen = excluded.first_seen, last_seen = excluded.last_seen,
           addresses = excluded.addresses""",
    "DELETE FROM runs WHERE target_id = ? AND certificate_id = ? AND start = ?",
    """INSERT INTO runs (target_id, certificate_id, start, end) VALUES (?, ?, ?, ?)
       ON CONFLICT (target_id, certificate_id, start) DO UPDATE SET end = excluded.end""",
)


def schema_rows(results: Sequence[ProbeResult], merge_window_s: int
                ) -> list[tuple[list[tuple], ...]]:
    """Per batch of ``BATCH_ROWS`` results, the rows ``Store.record`` leaves
    written, computed in Python: new targets and certificates (ids given),
    observation rows (dates and address list merged), run rows deleted and
    run rows inserted or widened (``add_sighting``; as in the store, a pair
    gets runs rows only once it has a second run)."""
    target_ids: dict[tuple[str, int], int] = {}
    certificate_ids: dict[bytes, int] = {}
    state: dict[tuple[int, int], tuple[int, int, list[str]]] = {}
    runs: dict[tuple[int, int], tuple[Run, ...]] = {}
    with_rows: set[tuple[int, int]] = set()
    batches = []
    for index in range(0, len(results), BATCH_ROWS):
        targets: list[tuple] = []
        certificates: list[tuple] = []
        touched: dict[tuple[int, int], tuple[Run, ...]] = {}
        for r in results[index:index + BATCH_ROWS]:
            key = (r.target.host, r.target.port)
            if key not in target_ids:
                target_ids[key] = len(target_ids) + 1
                targets.append((target_ids[key], *key))
            leaf = r.leaf
            if leaf.sha256 not in certificate_ids:
                certificate_ids[leaf.sha256] = len(certificate_ids) + 1
                certificates.append((certificate_ids[leaf.sha256], leaf.sha256, leaf.sha1,
                                     leaf.md5, leaf.spki_sha256, leaf.der))
            pair = (target_ids[key], certificate_ids[leaf.sha256])
            first, last, addresses = state.get(pair, (r.observed_at, r.observed_at, []))
            addresses = [r.address, *(a for a in addresses if a != r.address)][:MAX_ADDRESSES]
            state[pair] = (min(first, r.observed_at), max(last, r.observed_at), addresses)
            touched.setdefault(pair, runs.get(pair, ()))
            runs[pair] = add_sighting(runs.get(pair, ()), r.observed_at, merge_window_s)
        observation_rows = [(*pair, state[pair][0], state[pair][1], ",".join(state[pair][2]))
                            for pair in touched]
        deleted, written = [], []
        for pair, before in touched.items():
            if pair in with_rows:
                after = dict(runs[pair])
                deleted += [(*pair, start) for start, _ in before if start not in after]
                written += [(*pair, *run) for run in set(runs[pair]) - set(before)]
            elif len(runs[pair]) > 1:
                with_rows.add(pair)
                written += [(*pair, *run) for run in runs[pair]]
        batches.append((targets, certificates, observation_rows, deleted, written))
    return batches


def run_raw_schema_executemany(path: Path, results: Sequence[ProbeResult]) -> float:
    """Row d2: the rows of every table ``Store.record`` writes, precomputed,
    one ``executemany`` per table and batch, one transaction per batch."""
    open_store(path).close()  # the notary's schema
    batches = schema_rows(results, StoreConfig().merge_window_s)
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode = WAL")
        db.execute(f"PRAGMA synchronous = {StoreConfig().synchronous}")
        start = time.perf_counter()
        for batch in batches:
            db.execute("BEGIN IMMEDIATE")
            for statement, rows in zip(RAW_SCHEMA_STATEMENTS, batch, strict=True):
                if rows:
                    db.executemany(statement, rows)
            db.execute("COMMIT")
        return time.perf_counter() - start
    finally:
        db.close()


def run_raw_executemany(path: Path, results: Sequence[ProbeResult]) -> float:
    open_store(path).close()  # the notary's schema
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode = WAL")
        db.execute(f"PRAGMA synchronous = {StoreConfig().synchronous}")
        target_ids: dict[Target, int] = {}
        certificate_ids: dict[bytes, int] = {}
        rows = [
            (target_ids.setdefault(r.target, len(target_ids) + 1),
             certificate_ids.setdefault(r.leaf.sha256, len(certificate_ids) + 1),
             r.observed_at, r.address)
            for r in results
        ]
        batches = [rows[i:i + BATCH_ROWS] for i in range(0, len(rows), BATCH_ROWS)]
        start = time.perf_counter()
        for batch in batches:
            db.execute("BEGIN IMMEDIATE")
            db.executemany(RAW_UPSERT, batch)
            db.execute("COMMIT")
        return time.perf_counter() - start
    finally:
        db.close()


# ---------------------------------------------------------------------------
# Diagnosis: where the batched writer's time goes
# ---------------------------------------------------------------------------


def statement_label(sql: str) -> str:
    """``INSERT OR IGNORE INTO targets`` from the full statement."""
    words = []
    for word in sql.split():
        if word in ("VALUES", "WHERE", "SET") or word.startswith("("):
            break
        words.append(word)
    return " ".join(words)


class TimedCursor:
    """A cursor whose fetches are timed under its statement's label (the
    store's reads and ``INSERT ... RETURNING`` step most rows there)."""

    def __init__(self, cursor: sqlite3.Cursor, owner: TimedConnection, label: str) -> None:
        self._cursor = cursor
        self._owner = owner
        self._label = label

    def _timed(self, method: Callable[..., Any], *args: Any) -> Any:
        start = time.perf_counter()
        try:
            return method(*args)
        finally:
            self._owner.seconds[self._label] += time.perf_counter() - start

    def fetchall(self) -> list[Any]:
        return self._timed(self._cursor.fetchall)

    def fetchone(self) -> Any:
        return self._timed(self._cursor.fetchone)

    def fetchmany(self, *args: Any) -> list[Any]:
        return self._timed(self._cursor.fetchmany, *args)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.fetchall())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


class TimedConnection:
    """Stands in for a ``Store``'s connection: times each ``execute`` and
    ``executemany`` call, by statement, with the fetches of its cursor."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        self._labels: dict[str, str] = {}
        self.seconds: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()

    def _timed(self, method: Callable[..., sqlite3.Cursor], sql: str, parameters: Any,
               prefix: str) -> TimedCursor:
        start = time.perf_counter()
        cursor = method(sql, parameters)
        elapsed = time.perf_counter() - start
        label = self._labels.get(sql)
        if label is None:
            label = self._labels[sql] = prefix + statement_label(sql)
        self.seconds[label] += elapsed
        self.calls[label] += 1
        return TimedCursor(cursor, self, label)

    def execute(self, sql: str, parameters: Any = ()) -> TimedCursor:
        return self._timed(self._db.execute, sql, parameters, "")

    def executemany(self, sql: str, parameters: Any) -> TimedCursor:
        return self._timed(self._db.executemany, sql, parameters, "executemany: ")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


def run_record_in_batches(path: Path, results: Sequence[ProbeResult], *,
                          store_class: type[Store] = Store, timed: bool = False
                          ) -> tuple[float, TimedConnection | None]:
    """``record`` of ``store_class`` on 500-row batches, in this thread, no channel."""
    store = open_store(path, store_class=store_class)
    batches = [results[i:i + BATCH_ROWS] for i in range(0, len(results), BATCH_ROWS)]
    proxy = None
    if timed:
        proxy = TimedConnection(store._db)
        real_db, store._db = store._db, proxy  # type: ignore[assignment]
    try:
        start = time.perf_counter()
        for batch in batches:
            store.record(batch)
        return time.perf_counter() - start, proxy
    finally:
        if proxy is not None:
            store._db = real_db
        store.close()


def noop_record(self: Store, batch: Sequence[ProbeResult]) -> None:
    return None


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = harness.argument_parser(__doc__.split("\n", 1)[0])
    parser.add_argument("--no-diagnosis", action="store_true",
                        help="measure the four modes of the goals only")
    parser.add_argument("--tmp-dir", type=Path, default=harness.ROOT / ".bench-tmp",
                        help="parent of the temporary databases (default: <project>/.bench-tmp)")
    args = parser.parse_args(argv)
    repeat = harness.repetitions(args, full=1)
    n_batched = 5_000 if args.quick else 100_000
    n_per_row_default = 100 if args.quick else 1_500
    n_per_row_wal = 1_000 if args.quick else 20_000

    harness.header("Writer micro-benchmark",
                  " ".join([".venv/bin/python bench/bench_writer.py", *argv]))
    parent = args.tmp_dir
    created_parent = not parent.exists()
    parent.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(dir=parent, prefix="writer-"))
    try:
        print(f"databases in {directory} ({filesystem_of(directory)}); "
              f"SQLite {sqlite3.sqlite_version}; StoreConfig defaults: {StoreConfig()}")
        print()
        run(directory, args, repeat, n_batched, n_per_row_default, n_per_row_wal)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        if created_parent:
            with contextlib.suppress(OSError):
                parent.rmdir()


def run(directory: Path, args: Any, repeat: int, n_batched: int, n_per_row_default: int,
        n_per_row_wal: int) -> None:
    workload = observations(n_batched)
    counter = iter(range(1_000_000))

    def path(name: str) -> Path:
        return fresh_path(directory, f"{name}-{next(counter)}")

    batched_runs = [run_batched(path("batched"), workload) for _ in range(repeat)]
    batched = min(batched_runs, key=lambda r: r.seconds)
    per_row_default = harness.best_seconds(
        lambda: run_per_row(path("default"), observations(n_per_row_default), default_mode=True),
        repeat)
    per_row_wal = harness.best_seconds(
        lambda: run_per_row(path("wal"), observations(n_per_row_wal), default_mode=False), repeat)
    raw = harness.best_seconds(lambda: run_raw_executemany(path("raw"), workload), repeat)
    raw_schema = harness.best_seconds(
        lambda: run_raw_schema_executemany(path("raw-schema"), workload), repeat)

    rates = {
        "batched": harness.rate(n_batched, batched.seconds),
        "default": harness.rate(n_per_row_default, per_row_default),
        "wal": harness.rate(n_per_row_wal, per_row_wal),
        "raw": harness.rate(n_batched, raw),
        "raw_schema": harness.rate(n_batched, raw_schema),
    }

    def row(label: str, n: int, key: str) -> list[str]:
        return [label, f"{n:,}", harness.format_rate(rates[key]),
                harness.format_ratio(rates[key] / rates["default"]),
                f"{rates[key] / rates['raw']:.1%}"]

    print(f"## Observations committed per second (best of {repeat})")
    print()
    harness.print_table(
        ["mode", "observations", "rows/s", "vs per-row default", "vs raw executemany"],
        [
            row("a. batched writer (open_storage, StoreConfig defaults)", n_batched, "batched"),
            row("b. one transaction per row, rollback journal, synchronous=FULL",
                n_per_row_default, "default"),
            row("c. one transaction per row, WAL, synchronous=NORMAL", n_per_row_wal, "wal"),
            row(f"d. raw executemany, {BATCH_ROWS} rows per transaction, WAL (ceiling)",
                n_batched, "raw"),
            row("d2. raw executemany of the rows the notary's schema writes (4 tables)",
                n_batched, "raw_schema"),
        ],
    )
    stats = batched.statistics
    print(f"Batched writer: {stats.batches} batches (mean {stats.committed / stats.batches:.0f} "
          f"rows), {stats.producer_waits} producer waits, {stats.failed_batches} failed; "
          f"{batched.record_seconds:.2f} s of its {batched.seconds:.2f} s inside Store.record "
          f"(the writer thread).")
    vs_default = rates["batched"] / rates["default"]
    vs_raw = rates["batched"] / rates["raw"]
    print(f"Goal: batched >= {GOAL_VS_PER_ROW_DEFAULT:.0f}x per-row default mode: "
          f"{harness.format_ratio(vs_default)}: "
          f"{'met' if vs_default >= GOAL_VS_PER_ROW_DEFAULT else 'NOT met'}.")
    print(f"Goal: batched >= {GOAL_VS_RAW:.0%} of raw executemany: {vs_raw:.1%}: "
          f"{'met' if vs_raw >= GOAL_VS_RAW else 'NOT met'}.")
    print(f"Batched writer vs raw executemany of the notary's schema rows (d2): "
          f"{rates['batched'] / rates['raw_schema']:.1%}.")
    print()
    if not args.no_diagnosis:
        diagnose(path, workload, rates)


def diagnose(path: Callable[[str], Path], workload: Sequence[ProbeResult],
             rates: dict[str, float]) -> None:
    n = len(workload)
    results: list[tuple[str, float]] = []

    def pipeline(name: str) -> float:
        return harness.rate(n, run_batched(path(name), workload).seconds)

    with patched(Store, "record", noop_record):
        results.append(("1. open_storage pipeline, Store.record a no-op (channel + thread only)",
                        pipeline("noop")))
    seconds, _ = run_record_in_batches(path("record"), workload)
    results.append((f"2. Store.record alone, {BATCH_ROWS}-row batches, one thread, no channel",
                    harness.rate(n, seconds)))
    timed_seconds, proxy = run_record_in_batches(path("record-timed"), workload, timed=True)

    print("## Diagnosis: where the batched writer's time goes")
    print()
    harness.print_table(
        ["variant", "rows/s", "vs raw executemany", "vs per-row default"],
        [[label, harness.format_rate(r), f"{r / rates['raw']:.1%}",
          harness.format_ratio(r / rates["default"])] for label, r in results],
    )
    assert proxy is not None
    in_sql = sum(proxy.seconds.values())
    calls = sum(proxy.calls.values())
    print(f"### Store.record on {BATCH_ROWS}-row batches: time per statement")
    print()
    print(f"{n:,} observations in one pass with a timing proxy around the store's "
          f"connection, so the real Store.record runs: each execute or executemany call, "
          f"with the fetches of its cursor, is timed. The pass took "
          f"{timed_seconds * 1e6 / n:.1f} µs per observation, against "
          f"{1e6 / results[1][1]:.1f} µs without the proxy (variant 2).")
    print()
    table = [[label, f"{proxy.calls[label]:,}", f"{seconds * 1e6 / n:.2f}",
              f"{seconds / timed_seconds:.0%}"]
             for label, seconds in proxy.seconds.most_common()]
    outside = max(0.0, timed_seconds - in_sql)
    table.append(["rest: Python of Store.record, the proxy's own calls", "",
                  f"{outside * 1e6 / n:.2f}", f"{outside / timed_seconds:.0%}"])
    table.append(["total", f"{calls:,}", f"{timed_seconds * 1e6 / n:.2f}", "100%"])
    harness.print_table(["statement", "calls", "µs per observation", "share"], table)


if __name__ == "__main__":
    main()
