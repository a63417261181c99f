"""Writer micro-benchmark: observations committed per second.

Modes a to d2, then a diagnosis of the batched writer (``--no-diagnosis``
skips it); what each part measures, and the workload: ``bench/README.md``.
``--part bounds``: the bytes the database takes in the worst cases that the
docs/storage.md quotes (its table says what each counts).

    .venv/bin/python bench/bench_writer.py                # full run (a minute or two)
    .venv/bin/python bench/bench_writer.py --quick        # smoke run (seconds)
    .venv/bin/python bench/bench_writer.py --part bounds  # store bounds (about 10 s)
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import itertools
import random
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple
from unittest import mock

import trio
from harness.options import argument_parser, repetitions
from harness.project import ROOT
from harness.report import format_rate, format_ratio, header, print_table
from harness.runs import best_seconds, rate

from notary.config import LimitsConfig, ProbeConfig, StoreConfig
from notary.model.observations import Certificate, ProbeResult, Run, add_sighting
from notary.model.targets import Target
from notary.outbound.writer import StorageStatistics, open_storage
from notary.state.store import MAX_ADDRESSES, Store

DEFAULTS = StoreConfig()
LIMITS = DEFAULTS.timeline_limits()
BATCH_ROWS = DEFAULTS.batch_rows
#: Goals of the issue.
GOAL_VS_PER_ROW_DEFAULT = 100.0
GOAL_VS_RAW = 0.5

T0 = 1_700_000_000
DER_BYTES = 1_200
#: Part bounds: eight IPv6 addresses of the longest text form (39 characters).
LONG_ADDRESSES = [f"2001:db8:ffff:ffff:ffff:ffff:ffff:{i:04x}" for i in range(8)]


def certificate(rng: random.Random, size: int) -> Certificate:
    """``size`` random bytes standing in for the DER, with their real hashes."""
    der = rng.randbytes(size)
    return Certificate(der, hashlib.sha1(der).digest(), hashlib.sha256(der).digest(),
                       hashlib.md5(der).digest(), hashlib.sha256(der[:64]).digest())


def observations(n: int, seed: int = 1) -> list[ProbeResult]:
    rng = random.Random(seed)
    targets = max(1, n // 4)
    leaves = [certificate(rng, DER_BYTES) for _ in range(targets)]
    hosts = [Target(f"host{i}.example.test", 443) for i in range(targets)]
    return [ProbeResult(hosts[i % targets], leaves[i % targets], (leaves[i % targets].der,),
                        f"192.0.2.{(i // targets) % 250 + 1}", T0 + i) for i in range(n)]


def in_batches(items: Sequence[Any]) -> list[Sequence[Any]]:
    return [items[i:i + BATCH_ROWS] for i in range(0, len(items), BATCH_ROWS)]


def timed(function: Callable[..., Any], seconds: Counter[str], label: str) -> Callable[..., Any]:
    """``function``, adding the time each call takes to ``seconds[label]``."""

    def timed_call(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            seconds[label] += time.perf_counter() - start

    return timed_call


def filesystem_of(path: Path) -> str:
    """``ext4 on /dev/vda mounted at /``: the innermost mount holding ``path`` (last if stacked)."""
    inside = str(path.resolve()).rstrip("/") + "/"
    with open("/proc/mounts", encoding="utf-8") as mounts:
        holding = [entry for entry in map(str.split, mounts)
                   if inside.startswith(entry[1].rstrip("/") + "/")]
    device, mount_point, fs_type = max(reversed(holding), key=lambda entry: len(entry[1]))[:3]
    return f"{fs_type} on {device} mounted at {mount_point}"


class BatchedRun(NamedTuple):
    seconds: float
    statistics: StorageStatistics
    record_seconds: float  # wall time spent inside Store.record (the writer thread)


def open_store(path: Path, synchronous: str = DEFAULTS.synchronous) -> Store:
    """A ``Store`` with the ``StoreConfig`` defaults it takes."""
    return Store(path, synchronous=synchronous, merge_window_s=DEFAULTS.merge_window_s)


def run_batched(path: Path, results: Sequence[ProbeResult]) -> BatchedRun:
    inside: Counter[str] = Counter()

    async def main() -> BatchedRun:
        # Every [store] setting, as notary.server.app passes them.
        async with open_storage(path, DEFAULTS) as storage:
            start = time.perf_counter()
            for result in results:
                await storage.record(result)
            while storage.statistics().committed < len(results):  # noqa: ASYNC110
                await trio.sleep(0.001)  # polling costs < 1 ms; Storage has no event
            elapsed = time.perf_counter() - start
            stats = storage.statistics()
        return BatchedRun(elapsed, stats, inside["Store.record"])

    with mock.patch.object(Store, "record", timed(Store.record, inside, "Store.record")):
        return trio.run(main)


def run_per_row(path: Path, results: Sequence[ProbeResult], *, default_mode: bool) -> float:
    """One ``Store.record`` transaction per observation."""
    with open_store(path, "FULL" if default_mode else DEFAULTS.synchronous) as store:
        if default_mode:
            # Store always opens in WAL; switch this connection back to SQLite's
            # default rollback journal (bench-only use of the private connection).
            got = [store._db.execute(f"PRAGMA {pragma}").fetchone()[0]
                   for pragma in ("journal_mode = DELETE", "synchronous")]
            if got != ["delete", 2]:
                raise RuntimeError(f"expected journal_mode=delete, synchronous=FULL; got {got}")
        start = time.perf_counter()
        for result in results:
            store.record([result])
        return time.perf_counter() - start


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


def raw_rows(results: Sequence[ProbeResult]) -> list[tuple[Sequence[tuple], ...]]:
    """Per batch of ``BATCH_ROWS`` results, their ``RAW_UPSERT`` rows (ids given)."""
    target_ids: dict[Target, int] = {}
    certificate_ids: dict[bytes, int] = {}
    rows = [(target_ids.setdefault(r.target, len(target_ids) + 1),
             certificate_ids.setdefault(r.leaf.sha256, len(certificate_ids) + 1),
             r.observed_at, r.address) for r in results]
    return [(batch,) for batch in in_batches(rows)]


def schema_rows(results: Sequence[ProbeResult]) -> list[tuple[list[tuple], ...]]:
    """Per batch of ``BATCH_ROWS`` results, the rows ``Store.record`` leaves
    written, one list per ``RAW_SCHEMA_STATEMENTS`` (bench/README.md, d2; as
    in the store, a pair gets runs rows only once it has a second run)."""
    target_ids: dict[tuple[str, int], int] = {}
    certificate_ids: dict[bytes, int] = {}
    state: dict[tuple[int, int], tuple[int, int, list[str]]] = {}
    runs: dict[tuple[int, int], tuple[Run, ...]] = {}
    with_rows: set[tuple[int, int]] = set()
    batches = []
    for batch in in_batches(results):
        targets, certificates = [], []
        touched: dict[tuple[int, int], tuple[Run, ...]] = {}
        for r in batch:
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
            runs[pair] = add_sighting(runs.get(pair, ()), r.observed_at, DEFAULTS.merge_window_s)
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


def run_raw_executemany(path: Path, statements: Sequence[str],
                        batches: Sequence[Sequence[Sequence[tuple]]]) -> float:
    """Rows d and d2: into the notary's schema, per batch one transaction with
    one ``executemany`` of each of ``statements`` on its rows (if it has any)."""
    open_store(path).close()  # the notary's schema
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("PRAGMA journal_mode = WAL")
        db.execute(f"PRAGMA synchronous = {DEFAULTS.synchronous}")
        start = time.perf_counter()
        for batch in batches:
            db.execute("BEGIN IMMEDIATE")
            for statement, rows in zip(statements, batch, strict=True):
                if rows:
                    db.executemany(statement, rows)
            db.execute("COMMIT")
        return time.perf_counter() - start


@functools.cache
def statement_label(prefix: str, sql: str) -> str:
    """``INSERT OR IGNORE INTO targets`` from the full statement, after ``prefix``."""
    words = itertools.takewhile(
        lambda word: word not in ("VALUES", "WHERE", "SET") and not word.startswith("("),
        sql.split())
    return prefix + " ".join(words)


@dataclass
class TimedCursor:
    """A cursor whose fetches are timed under its statement's label (the
    store's reads and ``INSERT ... RETURNING`` step most rows there)."""

    cursor: sqlite3.Cursor
    seconds: Counter[str]
    label: str

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.cursor, name)
        return timed(attribute, self.seconds, self.label) if name.startswith("fetch") else attribute

    def __iter__(self) -> Iterator[Any]:
        return iter(self.fetchall())


@dataclass
class TimedConnection:
    """Times each ``execute`` and ``executemany`` call of a ``Store``'s
    connection, by statement, with the fetches of its cursor. The store's
    statements go through its connection's own transactions
    (``SqliteConnection.transaction`` runs ``self.execute``), so the timing
    wrappers are set on the connection itself (``instrument``), not put
    around it."""

    db: sqlite3.Connection
    seconds: Counter[str] = field(default_factory=Counter)
    calls: Counter[str] = field(default_factory=Counter)

    def instrument(self) -> None:
        """Shadow the connection's ``execute`` and ``executemany`` with the
        timed ones, for as long as the connection lives."""
        execute, executemany = self.db.execute, self.db.executemany
        self.db.execute = functools.partial(self._timed, "", execute)  # type: ignore[method-assign]
        self.db.executemany = functools.partial(  # type: ignore[method-assign]
            self._timed, "executemany: ", executemany
        )

    def _timed(self, prefix: str, method: Any, sql: str, parameters: Any = ()) -> TimedCursor:
        label = statement_label(prefix, sql)
        start = time.perf_counter()
        cursor = method(sql, parameters)
        self.seconds[label] += time.perf_counter() - start
        self.calls[label] += 1
        return TimedCursor(cursor, self.seconds, label)


def record_in_batches(store: Store, results: Sequence[ProbeResult]) -> float:
    """``store.record`` on ``BATCH_ROWS``-row batches, in this thread, no channel:
    the seconds it took."""
    batches = in_batches(results)
    start = time.perf_counter()
    for batch in batches:
        store.record(batch)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argument_parser(__doc__.split("\n", 1)[0])
    parser.add_argument("--part", choices=("writer", "bounds"), default="writer",
                        help="writer (default): observations committed per second; bounds: "
                        "the bytes the database takes at the default limits (ignores --quick)")
    parser.add_argument("--no-diagnosis", action="store_true",
                        help="measure the four modes of the goals only")
    parser.add_argument("--tmp-dir", type=Path, default=ROOT / ".bench-tmp",
                        help="parent of the temporary databases (default: <project>/.bench-tmp)")
    args = parser.parse_args(argv)
    header("Store bounds" if args.part == "bounds" else "Writer micro-benchmark",
           " ".join([".venv/bin/python bench/bench_writer.py", *argv]))
    created_parent = not args.tmp_dir.exists()
    args.tmp_dir.mkdir(parents=True, exist_ok=True)
    try:
        with tempfile.TemporaryDirectory(dir=args.tmp_dir, prefix=f"{args.part}-",
                                         ignore_cleanup_errors=True) as name:
            if args.part == "bounds":
                bounds(Path(name))
            else:
                run(Path(name), args)
    finally:
        if created_parent:
            with contextlib.suppress(OSError):
                args.tmp_dir.rmdir()


def run(directory: Path, args: argparse.Namespace) -> None:
    """The four modes of the goals, then the diagnosis, in databases under ``directory``."""
    print(f"databases in {directory} ({filesystem_of(directory)}); "
          f"SQLite {sqlite3.sqlite_version}; StoreConfig defaults: {DEFAULTS}\n")
    repeat = repetitions(args, full=1)
    n_batched, n_default, n_wal = (5_000, 100, 1_000) if args.quick else (100_000, 1_500, 20_000)
    workload = observations(n_batched)

    def path(name: str) -> Path:
        return Path(tempfile.mkdtemp(dir=directory)) / f"{name}.db"

    def best(measure: Callable[[], float]) -> float:
        return best_seconds(measure, repeat)

    batched = min((run_batched(path("batched"), workload) for _ in range(repeat)),
                  key=lambda r: r.seconds)
    modes = [  # key, label, observations, best seconds
        ("batched", "a. batched writer (open_storage, StoreConfig defaults)", n_batched,
         batched.seconds),
        ("default", "b. one transaction per row, rollback journal, synchronous=FULL", n_default,
         best(lambda: run_per_row(path("default"), observations(n_default), default_mode=True))),
        ("wal", "c. one transaction per row, WAL, synchronous=NORMAL", n_wal,
         best(lambda: run_per_row(path("wal"), observations(n_wal), default_mode=False))),
        ("raw", f"d. raw executemany, {BATCH_ROWS} rows per transaction, WAL (ceiling)",
         n_batched, best(lambda: run_raw_executemany(path("raw"), [RAW_UPSERT],
                                                     raw_rows(workload)))),
        ("raw_schema", "d2. raw executemany of the rows the notary's schema writes (4 tables)",
         n_batched, best(lambda: run_raw_executemany(path("raw-schema"), RAW_SCHEMA_STATEMENTS,
                                                     schema_rows(workload)))),
    ]
    rates = {key: rate(n, seconds) for key, _, n, seconds in modes}
    print(f"## Observations committed per second (best of {repeat})\n")
    print_table(
        ["mode", "observations", "rows/s", "vs per-row default", "vs raw executemany"],
        [[label, f"{n:,}", format_rate(rates[key]),
          format_ratio(rates[key] / rates["default"]), f"{rates[key] / rates['raw']:.1%}"]
         for key, label, n, _ in modes],
    )
    stats = batched.statistics
    print(f"Batched writer: {stats.batches} batches (mean {stats.committed / stats.batches:.0f} "
          f"rows), {stats.producer_waits} producer waits, {stats.failed_batches} failed; "
          f"{batched.record_seconds:.2f} s of its {batched.seconds:.2f} s inside Store.record "
          f"(the writer thread).")
    vs_default = rates["batched"] / rates["default"]
    vs_raw = rates["batched"] / rates["raw"]
    print(f"Goal: batched >= {GOAL_VS_PER_ROW_DEFAULT:.0f}x per-row default mode: "
          f"{format_ratio(vs_default)}: "
          f"{'met' if vs_default >= GOAL_VS_PER_ROW_DEFAULT else 'NOT met'}.")
    print(f"Goal: batched >= {GOAL_VS_RAW:.0%} of raw executemany: {vs_raw:.1%}: "
          f"{'met' if vs_raw >= GOAL_VS_RAW else 'NOT met'}.")
    print(f"Batched writer vs raw executemany of the notary's schema rows (d2): "
          f"{rates['batched'] / rates['raw_schema']:.1%}.\n")
    if not args.no_diagnosis:
        diagnose(path, workload, rates)


def diagnose(path: Callable[[str], Path], workload: Sequence[ProbeResult],
             rates: dict[str, float]) -> None:
    n = len(workload)
    with mock.patch.object(Store, "record", lambda self, batch, origin="", probes=None: None):
        noop = rate(n, run_batched(path("noop"), workload).seconds)
    with open_store(path("record")) as store:
        alone = rate(n, record_in_batches(store, workload))
    with open_store(path("record-timed")) as store:
        proxy = TimedConnection(store._db)  # bench-only use of the private connection
        proxy.instrument()
        pass_seconds = record_in_batches(store, workload)

    print("## Diagnosis: where the batched writer's time goes\n")
    print_table(
        ["variant", "rows/s", "vs raw executemany", "vs per-row default"],
        [[label, format_rate(r), f"{r / rates['raw']:.1%}",
          format_ratio(r / rates["default"])] for label, r in [
            ("1. open_storage pipeline, Store.record a no-op (channel + thread only)", noop),
            (f"2. Store.record alone, {BATCH_ROWS}-row batches, one thread, no channel", alone),
        ]],
    )
    print(f"### Store.record on {BATCH_ROWS}-row batches: time per statement\n")
    print(f"{n:,} observations in one pass with a timing proxy around the store's connection "
          f"(bench/README.md): {pass_seconds * 1e6 / n:.1f} µs per observation, against "
          f"{1e6 / alone:.1f} µs without the proxy (variant 2).\n")
    outside = max(0.0, pass_seconds - sum(proxy.seconds.values()))
    rows = [(label, f"{proxy.calls[label]:,}", seconds)
            for label, seconds in proxy.seconds.most_common()]
    rows += [("rest: Python of Store.record, the proxy's own calls", "", outside),
             ("total", f"{sum(proxy.calls.values()):,}", pass_seconds)]
    print_table(["statement", "calls", "µs per observation", "share"],
                [[label, calls, f"{seconds * 1e6 / n:.2f}", f"{seconds / pass_seconds:.0%}"]
                 for label, calls, seconds in rows])


def longest_host(index: int) -> str:
    return (f"t{index:08d}." + ("a" * 62 + ".") * 4)[:253].rstrip(".")


def file_bytes(path: Path) -> int:
    """``PRAGMA page_count`` x ``page_size`` after a checkpoint."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        return pages * db.execute("PRAGMA page_size").fetchone()[0]


def per_target(path: Path, targets: int = 8) -> tuple[float, float]:
    """Bytes per target at its limits: as written, and after compact."""
    rng = random.Random(1)
    runs, spacing = LIMITS.max_runs_per_certificate, DEFAULTS.merge_window_s + 1
    with Store(path, limits=LIMITS, merge_window_s=DEFAULTS.merge_window_s) as store:
        empty = file_bytes(path)
        for index in range(targets):
            target = Target(longest_host(index), 65535)
            leaves = [certificate(rng, LIMITS.max_certificate_bytes)
                      for _ in range(LIMITS.max_certificates_per_target)]
            record_in_batches(store, [
                ProbeResult(target, leaves[run // runs], (), address, T0 + run * spacing)
                for run in range(len(leaves) * runs) for address in LONG_ADDRESSES])
        written = file_bytes(path)
        store.compact(T0, 10**9)
        return (written - empty) / targets, (file_bytes(path) - empty) / targets


def per_probe(path: Path, probes: int = 4000, addresses: int = 1) -> float:
    """Bytes per probe of a new target with a new certificate at each of
    ``addresses`` addresses (issue 31: a probe observes every address)."""
    rng = random.Random(2)
    with Store(path, limits=LIMITS) as store:
        empty = file_bytes(path)
        record_in_batches(store, [
            ProbeResult(Target(longest_host(i), 65535),
                        certificate(rng, LIMITS.max_certificate_bytes), (),
                        LONG_ADDRESSES[a % len(LONG_ADDRESSES)], T0 + i)
            for i in range(probes) for a in range(addresses)
        ])
        return (file_bytes(path) - empty) / probes


def bounds(directory: Path) -> None:
    """Part bounds, in databases under ``directory``. The change feed's rows
    are left out (not written): the feed is bounded apart, by ``[store]
    feed_max_rows`` rows for the whole store, not per target or per probe
    (written here, unpruned, they would be most of "per target": a row per
    probe of a 253-character host name)."""
    with mock.patch("notary.state.feed.write", lambda *args, **kwargs: None):
        written, compacted = per_target(directory / "per-target.db")
        probe = per_probe(directory / "per-probe.db")
        probe_config = ProbeConfig()
        spread = probe_config.max_addresses
        split = per_probe(directory / "per-split-probe.db", 1000, spread)
    # The most new certificates one probe can see: every address probed (and
    # a client's address hint), each sampled.
    most = (probe_config.max_addresses + 1) * probe_config.samples_per_address
    limits = LimitsConfig()
    probes_per_day = limits.probes_per_s_per_prefix * 86400 + limits.probe_burst
    print(f"SQLite {sqlite3.sqlite_version}; {LIMITS}; {probe_config}\n")
    print_table(["measure", "bytes"], [
        ["a. per target at its limits, as written", f"{written:,.0f}"],
        ["a. per target at its limits, after compact", f"{compacted:,.0f}"],
        ["b. per probe (new target, new certificate)", f"{probe:,.0f}"],
        [f"c. per probe of {spread} addresses (new target, a new certificate each)",
         f"{split:,.0f}"],
        [f"d. the most one probe adds: {most} new certificates (c / {spread} x {most})",
         f"{split / spread * most:,.0f}"],
        [f"per client prefix per day ({probes_per_day:,.0f} probes x b)",
         f"{probes_per_day * probe:,.0f}"],
        ["... x d, every probe a sampled site serving a new certificate per handshake",
         f"{probes_per_day * split / spread * most:,.0f}"],
    ])


if __name__ == "__main__":
    main()
