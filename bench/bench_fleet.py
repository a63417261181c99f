"""Fleet: the store's two engines side by side (issue 19), loopback only.

1. Observations committed per second by the batched writer (``open_storage``
   with the ``[store]`` defaults, bench_writer's workload): SQLite (WAL,
   ``synchronous=NORMAL``), PostgreSQL with its defaults (a WAL flush per
   commit), and PostgreSQL with ``synchronous_commit=off`` (SQLite NORMAL's
   durability: the last commits can be lost on power loss, nothing corrupt).
2. The change feed's delay under a steady write load: one ``Storage`` (a
   worker or node) records observations at ``--rate``; another follows the
   feed as a worker does (``read_feed``, ``wait_for_changes``). Per
   observation: from its commit, and from its ``record`` (the probe's end),
   to the follower reading it; p50 and p99. SQLite is read every
   ``feed_interval_ms``; PostgreSQL is woken by ``NOTIFY``.

    .venv/bin/python bench/bench_fleet.py            # about a minute
    .venv/bin/python bench/bench_fleet.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_writer
from harness.options import argument_parser
from harness.processes import Processes, run_benchmark
from harness.report import format_rate, print_preamble, print_table
from harness.servers import start_postgres

from notary.config import StoreConfig
from notary.outbound.writer import open_storage

DEFAULTS = StoreConfig()


def engines(processes: Processes, directory: Path) -> dict[str, StoreConfig]:
    """The store sections of the engines compared (each its own server)."""
    made = {"SQLite (WAL, NORMAL)": DEFAULTS}
    for label, settings in (("PostgreSQL (defaults)", ()),
                            ("PostgreSQL (synchronous_commit off)", ("synchronous_commit=off",))):
        dsn = start_postgres(processes, directory / f"pg{len(made)}", cpu=None,
                             settings=settings)
        made[label] = replace(DEFAULTS, backend="postgresql", dsn=dsn)
    return made


async def committed_per_second(path: Path, store: StoreConfig, count: int) -> float:
    results = bench_writer.observations(count)
    async with open_storage(path, store) as storage:
        start = time.perf_counter()
        for result in results:
            await storage.record(result)
        while storage.statistics().committed < count:  # noqa: ASYNC110
            await trio.sleep(0.001)
        return count / (time.perf_counter() - start)


class Commits:
    """The writer's ``timings``: when each batch committed, rows so far."""

    def __init__(self) -> None:
        self.at: list[tuple[float, int]] = []

    def batch_written(self, rows: int, seconds: float) -> None:
        done = self.at[-1][1] if self.at else 0
        self.at.append((time.perf_counter(), done + rows))

    def of(self, index: int) -> float:
        return next(at for at, done in self.at if done > index)


async def feed_delays(path: Path, store: StoreConfig, rate: float, seconds: float
                      ) -> tuple[list[float], list[float]]:
    """(commit -> read, record -> read) delays in ms, one per observation."""
    results = bench_writer.observations(int(rate * seconds))
    recorded: dict[int, float] = {}
    seen: dict[int, float] = {}
    commits = Commits()
    async with (
        open_storage(path, store, timings=commits) as writer,
        open_storage(path, store) as follower,
    ):
        position = await follower.feed_position()

        async def follow() -> None:
            nonlocal position
            while len(seen) < len(results):
                page = await follower.read_feed(position, 1000)
                now = time.perf_counter()
                for change in page.changes:
                    seen.setdefault(change.seq, now)
                position = page.last_seq or position
                if len(page.changes) < 1000:
                    await follower.wait_for_changes(store.feed_interval_ms / 1000)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow)
            start = trio.current_time()
            for index, result in enumerate(results):
                await trio.sleep_until(start + index / rate)
                recorded[index] = time.perf_counter()
                await writer.record(result)
            with trio.fail_after(30):
                while len(seen) < len(results):  # noqa: ASYNC110
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    first = min(seen)  # feed rows are numbered in commit order, as recorded
    by_index = {seq - first: at for seq, at in seen.items()}
    return ([1000 * (by_index[i] - commits.of(i)) for i in recorded],
            [1000 * (by_index[i] - recorded[i]) for i in recorded])


def percentile(values: list[float], share: float) -> float:
    return statistics.quantiles(values, n=100)[int(share * 100) - 1] if len(values) > 1 else values[0]


def run(args: argparse.Namespace, processes: Processes, directory: Path) -> int:
    print_preamble("Fleet: the store engines side by side", None)
    count = 10_000 if args.quick else 100_000
    seconds = 3.0 if args.quick else 20.0
    rows_writer, rows_feed = [], []
    for number, (label, store) in enumerate(engines(processes, directory).items()):
        path = directory / f"notary{number}.db"
        rate = trio.run(committed_per_second, path, store, count)
        rows_writer.append([label, f"{count:,}", format_rate(rate)])
        commit, record = trio.run(feed_delays, directory / f"feed{number}.db", store,
                                  args.rate, seconds)
        rows_feed.append([label, f"{len(commit):,}", *(
            f"{percentile(values, share):.0f}" for values in (commit, record)
            for share in (0.5, 0.99))])
    print(f"\n## 1. Observations committed per second (batched writer, {count:,} observations)\n")
    print_table(["engine", "observations", "committed"], rows_writer)
    print(f"\n## 2. Change feed delay at {args.rate:g} observations/s for {seconds:g} s "
          f"(feed_interval_ms {DEFAULTS.feed_interval_ms}, batch_interval_ms "
          f"{DEFAULTS.batch_interval_ms})\n")
    print_table(["engine", "observations", "commit->read p50 ms", "p99 ms",
                 "record->read p50 ms", "p99 ms"], rows_feed)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__.split("\n", 1)[0])
    parser.add_argument("--rate", type=float, default=400.0,
                        help="observations per second in part 2 (default 400: a core's probes)")
    return run_benchmark("bench_fleet", parser.parse_args(argv), run)


if __name__ == "__main__":
    sys.exit(main())
