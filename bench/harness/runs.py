"""Measured runs: the record of one run of a load generator against a
server with its CPU figures (``Run``, taken by a ``Meter``; ``best`` keeps
the best run its warnings do not flag), a load benchmark's start and
interleaved rounds, two rows compared round by round (``paired``), a micro-benchmark's best of N, and Trio clients driven
for a while with the server's memory sampled (``drive_clients``, ``Sampler``)."""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from .loopback import get_metrics
from .machine import (
    busy_shares,
    choose_cpus,
    cpu_times,
    describe_busy,
    machine_busy_seconds,
    proc_status,
    wait_quiet,
)
from .report import print_preamble

#: ``Run.warnings`` flags a server core busy below MIN_SERVER_CORE, a client's above MAX_WRK_CORE.
MIN_SERVER_CORE = 0.90
MAX_WRK_CORE = 0.95


@dataclass(frozen=True)
class Run:
    """One measured run of a load generator against a server, with its CPU figures."""

    rate: float  # requests (handshakes, messages) per second
    count: int
    elapsed_s: float
    #: CPU seconds of the server's processes (None: not measured) and of the
    #: client (the children reaped meanwhile: wrk, the s_time processes).
    server_cpu_s: float | None = None
    client_cpu_s: float = 0.0
    #: Busy share of the server's and the client's cores, softirq time
    #: included (None: not watched).
    server_busy: float | None = None
    client_busy: float | None = None
    machine_busy_s: float = 0.0  # busy CPU seconds of every core during the run
    latency_avg: str = "?"
    latency_p99: str = "?"
    latency_us: dict[str, int] = field(default_factory=dict)  # from LATENCY_LUA, if run
    errors: dict[str, int] = field(default_factory=dict)  # socket errors, non-2xx answers
    output: str = ""
    #: The share of one core the server was held to (``harness.cpucap``; 1: a whole core).
    server_share: float = 1.0

    @property
    def server_us(self) -> float:
        """The server's CPU time per request (0 when not measured)."""
        return (self.server_cpu_s or 0.0) / self.count * 1e6

    @property
    def client_us(self) -> float:
        return self.client_cpu_s / self.count * 1e6

    @property
    def server_core(self) -> float | None:
        """The server's share of one core (near 100%: it was the bottleneck)."""
        return self.server_cpu_s / self.elapsed_s if self.server_cpu_s is not None else None

    @property
    def client_core(self) -> float:
        return self.client_cpu_s / self.elapsed_s if self.elapsed_s else 0.0

    @property
    def other_cores(self) -> float:
        """Cores busy with everything else (other benchmarks, idle servers)."""
        rest = self.machine_busy_s - (self.server_cpu_s or 0.0) - self.client_cpu_s
        return max(0.0, rest) / self.elapsed_s

    def warnings(self) -> list[str]:
        """Why this run does not measure the server: its core (or process) not
        saturated, or the client's saturated (one wrk thread per core assumed)."""
        found = []
        if self.server_share < 1 and self.server_core is not None:
            # Held to a share of its core: saturated when it used that share.
            if self.server_core < MIN_SERVER_CORE * self.server_share:
                found.append(f"server used {self.server_core:.0%} of a core, its cap "
                             f"{self.server_share:.0%} (< {MIN_SERVER_CORE:.0%} of it: the "
                             "server was not the limit)")
            if self.client_busy is not None and self.client_busy > MAX_WRK_CORE:
                found.append(f"client core {self.client_busy:.0%} busy (> "
                             f"{MAX_WRK_CORE:.0%}: the generator was the limit)")
            return found
        if self.server_busy is not None and self.client_busy is not None:
            if self.server_busy < MIN_SERVER_CORE:
                found.append(f"server core {self.server_busy:.0%} busy (< "
                             f"{MIN_SERVER_CORE:.0%}: the server was not the limit)")
            if self.client_busy > MAX_WRK_CORE:
                found.append(f"client core {self.client_busy:.0%} busy (> "
                             f"{MAX_WRK_CORE:.0%}: the generator was the limit)")
            return found
        if self.server_core is not None and self.server_core < MIN_SERVER_CORE:
            found.append(f"server used {self.server_core:.0%} of its core "
                         f"(< {MIN_SERVER_CORE:.0%}: not CPU-bound)")
        if self.client_core > MAX_WRK_CORE:
            found.append(f"wrk used {self.client_core:.0%} of a core "
                         f"(> {MAX_WRK_CORE:.0%}: the generator was the limit)")
        return found


class Meter:
    """CPU accounting from its creation to ``run``: ``server_cpu()`` (the server's
    CPU seconds so far), the children reaped (the client), ``cpus``, the machine."""

    def __init__(self, server_cpu: Callable[[], float] | None = None,
                 cpus: Sequence[int] = ()) -> None:
        self.server_cpu, self.cpus = server_cpu, tuple(cpus)
        self.server_s = server_cpu() if server_cpu else 0.0
        self.children = self._children()
        self.cores = cpu_times(self.cpus) if self.cpus else {}
        self.machine = machine_busy_seconds()
        self.started = time.monotonic()

    @staticmethod
    def _children() -> float:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    def run(self, rate: float, count: int, **fields: Any) -> Run:
        """The ``Run`` of ``count`` at ``rate``; ``fields``: latency, errors..."""
        elapsed = time.monotonic() - self.started
        shares = busy_shares(self.cores, cpu_times(self.cpus)) if self.cpus else {}
        busy: list[float | None] = [shares[cpu] for cpu in self.cpus] or [None]
        figures: dict[str, Any] = {
            "server_cpu_s": self.server_cpu() - self.server_s if self.server_cpu else None,
            "client_cpu_s": self._children() - self.children, "server_busy": busy[0],
            "client_busy": busy[-1], "machine_busy_s": machine_busy_seconds() - self.machine}
        return Run(rate, count, elapsed, **{**figures, **fields})


def best(runs: Sequence[Any]) -> Any:
    """The best run (by ``rate``) not flagged by its ``warnings()`` (of all, if every one is)."""
    clean = [r for r in runs if not r.warnings()]
    return max(clean or runs, key=lambda r: r.rate)


def run_rounds(args: argparse.Namespace, items: Sequence[Any], measure: Callable[[Any], Any],
               progress: Callable[[Any, Any], str], *, key: Callable[[Any], Any] | None = None,
               quiet_cpus: Sequence[int] = ()) -> dict[Any, list[Any]]:
    """``args.rounds`` interleaved rounds of ``measure(item)`` over ``items``,
    every other round in reverse order (a row measured first in one round is
    measured last in the next: a drift of the machine's speed within rounds
    does not always favour the same row), a progress line after each run, a
    wait (<= 30 s, ``--wait-quiet``) for idle ``quiet_cpus`` before each
    further round. Returns the runs by ``key(item)``, in round order."""
    key = key or (lambda item: item.key)
    runs: dict[Any, list[Any]] = {key(item): [] for item in items}
    for round_number in range(args.rounds):
        if round_number and quiet_cpus and args.wait_quiet:
            wait_quiet(quiet_cpus, min(args.wait_quiet, 30.0))
        for item in items if round_number % 2 == 0 else reversed(items):
            run = measure(item)
            runs[key(item)].append(run)
            print(f"  round {round_number + 1} {progress(item, run)}"
                  + "".join(f"  WARNING: {w}" for w in run.warnings()), flush=True)
    return runs


@dataclass(frozen=True)
class Paired:
    """One row against another, round by round (``paired``): each ratio
    compares two runs made one right after the other, so when a shared
    machine changes speed between rounds (this one does, by ~30%:
    bench/RESULTS.md) both runs of a pair move together, where the best run
    of each row may come from different speeds. The goal is judged on the
    median pair."""

    #: ours.rate / theirs.rate, and theirs.server_us / ours.server_us (CPU
    #: per request: higher is better for ours), one per pair used.
    rates: tuple[float, ...]
    cpu: tuple[float, ...]
    #: Pairs left out because a run of theirs or ours was flagged (none are
    #: left out when every pair has a flagged run: then all count).
    left_out: int
    #: Whether the pairs used include flagged runs of ours / of theirs.
    ours_flagged: bool
    theirs_flagged: bool

    @property
    def rate(self) -> float:
        return statistics.median(self.rates)

    @property
    def by_cpu(self) -> float:
        return statistics.median(self.cpu)

    def rounds(self) -> str:
        """The pairs' rate ratios, and what was left out, for a report."""
        left = f"; {self.left_out} flagged pair(s) left out" if self.left_out else ""
        return (f"median of {len(self.rates)} paired round(s): "
                f"{' / '.join(f'{r:.1%}' for r in self.rates)}{left}")


def paired(ours: Sequence[Run], theirs: Sequence[Run]) -> Paired:
    """``ours`` against ``theirs``, run i with run i (``run_rounds``' rounds).
    Pairs with a flagged run are left out, unless every pair has one."""
    if not ours:
        raise ValueError("paired rounds need runs")
    pairs = list(zip(ours, theirs, strict=True))  # ValueError: not as many runs
    clean = [(a, b) for a, b in pairs if not a.warnings() and not b.warnings()]
    used = clean or pairs
    return Paired(
        rates=tuple(a.rate / b.rate for a, b in used),
        cpu=tuple(b.server_us / a.server_us if a.server_us else 0.0 for a, b in used),
        left_out=len(pairs) - len(used),
        ours_flagged=any(a.warnings() for a, _ in used),
        theirs_flagged=any(b.warnings() for _, b in used))


def start_load(args: argparse.Namespace, title: str, wrk: str | None,
               describe: Callable[[int, int], Sequence[str]] = lambda s, c: (), *,
               cpus: Sequence[int] | None = None, note: str = "") -> tuple[int, int]:
    """Every load benchmark's start: cores, preamble, ``describe(server_cpu,
    client_cpu)``'s lines, ``--wait-quiet`` for ``cpus`` (default: the two
    chosen), their other load. Returns (server core, client core)."""
    server_cpu, client_cpu = choose_cpus(args)
    print_preamble(title, wrk, note)
    for line in describe(server_cpu, client_cpu):
        print(line)
    watched = list(cpus) if cpus is not None else [server_cpu, client_cpu]
    if args.wait_quiet:
        wait_quiet(watched, args.wait_quiet)
    print(describe_busy(watched, "before the runs"), flush=True)
    return server_cpu, client_cpu


def best_seconds(run: Callable[[], float], repeat: int) -> float:
    """The best of ``repeat`` calls of ``run`` (which returns the seconds it
    measured): on a shared machine, noise only ever adds time."""
    return min(run() for _ in range(repeat))


def rate(count: float, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


class Sampler:
    """Every second of a load: a server's RSS and, given its admin port, its
    ``notary_probes_in_flight``."""

    def __init__(self, pid: int, admin_port: int | None = None) -> None:
        self.pid, self.admin_port = pid, admin_port
        self.rss: list[int] = []  # bytes
        self.in_flight: list[float] = []

    def sample(self) -> None:
        self.rss.append(proc_status(self.pid)["VmRSS"])
        if self.admin_port is not None:
            found = [value for name, value in get_metrics(self.admin_port)
                     if name.split("{")[0] == "notary_probes_in_flight"]
            self.in_flight += found[:1]

    def growth(self) -> float:
        """Peak RSS of the last third over the first third's, minus one."""
        third = max(1, len(self.rss) // 3)
        return max(self.rss[-third:]) / max(self.rss[:third]) - 1


async def drive_clients(client: Callable[[float], Awaitable[None]], *, concurrency: int,
                        duration_s: float, sampler: Sampler) -> float:
    """``concurrency`` tasks each running ``client(deadline)``, the deadline
    ``duration_s`` from now, with ``sampler`` sampling every second (in a
    thread) meanwhile; the seconds until the last client returned. A
    client's error ends the run (the nursery's)."""

    async def sample_every_second() -> None:
        while True:
            await trio.to_thread.run_sync(sampler.sample)
            await trio.sleep(1)

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sample_every_second)
        async with trio.open_nursery() as clients:
            for _ in range(concurrency):
                clients.start_soon(client, start + duration_s)
        nursery.cancel_scope.cancel()  # the sampling
    return trio.current_time() - start
