"""Worker scaling: cache-hit ``POST /target`` requests per second (wrk, plain HTTP and
HTTPS keep-alive), ``notary serve --workers 2`` against the baseline ``--workers 1``.

Rows, why nothing is pinned, and the checks made: ``bench/README.md``.

    .venv/bin/python bench/bench_workers.py --wait-quiet 120   # about 5 minutes
    .venv/bin/python bench/bench_workers.py --quick            # 2 s per run: a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# Importing harness also puts the project root on sys.path.
from harness.loopback import (
    LOOPBACK,
    connect,
    free_ports,
    get_metrics,
    post_request,
    read_response,
    resumed_reconnections,
)
from harness.machine import all_proc_stats, cpu_seconds, describe_busy
from harness.options import finish_load_args, load_parser
from harness.processes import Processes, run_benchmark, tail
from harness.project import BenchError
from harness.report import print_table
from harness.runs import Run, run_rounds, start_load
from harness.runs import best as best_run
from harness.servers import READY_TIMEOUT_S, RunningNotary, new_notary, notary_argv, start_notary
from harness.tools import ensure_wrk
from harness.wrk import run_wrk, wrk_script

from notary.config import load_config
from notary.node.devsetup import DEV_ADMIN_PORT, DEV_PERSPECTIVES_PORT, DEV_RELAY_PORT

WARM_UP_S = 1
#: TLS reconnections per node whose resumption is counted (each offers the first one's session).
RECONNECTIONS = 200
#: In a warm-up run, each worker must take at least this share of the workers' CPU.
MIN_WORKER_SHARE = 0.10
#: A measured run where a worker takes less than this share is flagged as uneven.
UNEVEN_SHARE = 0.35
TRANSPORTS = ("plain", "https")


@dataclass(frozen=True)
class Variant:
    key: str
    label: str
    workers: int
    pinned: bool = False  # notary, wrk -t1 each pinned (bench_http's set-up); else wrk --threads


@dataclass
class Node:
    variant: Variant
    notary: RunningNotary
    admin_port: int  # its /metrics
    #: The serving processes: the notary itself (1 worker), or the supervisor's children.
    workers: list[int]
    script: Path


@dataclass(frozen=True)
class Measurement(Run):
    """A wrk run whose server CPU is the node's processes, summed, plus each
    worker's CPU (the supervisor left out) and the node's ``/metrics`` counts."""

    worker_cpu_s: tuple[float, ...] = ()
    queries: float = 0.0  # Convergence queries the node counted
    misses: float = 0.0
    probes: float = 0.0

    @property
    def ceiling(self) -> float:
        """The rate at which notary + wrk would fill every core, or each
        worker its own core, whichever comes first (no other load)."""
        return min((os.cpu_count() or 1) * 1e6 / (self.server_us + self.client_us),
                   len(self.worker_cpu_s) * 1e6 / self.server_us)

    @property
    def shares(self) -> list[float]:
        """Each worker's share of the workers' CPU (none if they used none)."""
        total = sum(self.worker_cpu_s)
        return [s / total for s in self.worker_cpu_s] if total else []

    def split(self) -> str:
        if len(self.shares) < 2:
            return "-"
        text = " / ".join(f"{share:.0%}" for share in self.shares)
        return text + (" UNEVEN" if min(self.shares) < UNEVEN_SHARE else "")

    def warnings(self) -> list[str]:
        """The node's counters only: nothing is pinned, so ``Run``'s core checks do not apply."""
        found = []
        if self.misses or self.probes:
            found.append(f"{self.misses:.0f} cache misses, {self.probes:.0f} probes during the run")
        if self.queries < self.count:
            found.append(f"/metrics counted {self.queries:.0f} queries, wrk {self.count}")
        return found


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, sorted (``/proc/<pid>/task/*/children`` is
    not in every kernel: this VM has no CONFIG_PROC_CHILDREN)."""
    parents = {child: int(fields[1]) for child, fields in all_proc_stats().items()}
    found, frontier = [], {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found += frontier
    return sorted(found)


def tree_cpu_seconds(pids: Sequence[int]) -> dict[int, float]:
    """User + system CPU seconds of each process (all its threads); a process
    gone is a worker that died: the figure would be wrong."""
    try:
        return {pid: cpu_seconds(pid) for pid in pids}
    except OSError as exc:
        raise BenchError(f"a process of the node vanished during the run ({exc})") from None


def proc_strings(pid: int, name: str) -> list[str]:
    """The NUL-separated strings of ``/proc/<pid>/<name>`` (cmdline, environ); none if gone."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/{name}", "rb") as file:
        return [part.decode(errors="replace") for part in file.read().split(b"\0") if part]
    return []


def wait_for_workers(node_process: subprocess.Popen[bytes], workers: int, log: Path) -> list[int]:
    """The pids serving: the node itself for 1 worker (no supervisor, no
    child); for N > 1 its N children, each a ``notary serve`` worker with its
    own ``NOTARY_WORKER_INDEX``."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    expected = workers if workers > 1 else 0  # 1 worker: the node itself, no child
    while len(children := descendants(node_process.pid)) != expected:
        if (node_process.poll() is not None or len(children) > workers or workers == 1
                or time.monotonic() > deadline):
            break
        time.sleep(0.1)
    if node_process.poll() is not None or len(children) != expected:
        raise BenchError(f"--workers {workers} node (exit status {node_process.returncode}) "
                         f"has children {children}:\n{tail(log)}")
    if workers == 1:
        return [node_process.pid]
    indexes = sorted(next((item.split("=", 1)[1] for item in proc_strings(pid, "environ")
                           if item.startswith("NOTARY_WORKER_INDEX=")), "?") for pid in children)
    commands = [proc_strings(pid, "cmdline") for pid in children]
    if indexes != [str(i) for i in range(workers)] or not all(
            "notary" in argv and "serve" in argv for argv in commands):
        raise BenchError(f"the node's children are not its workers: indexes {indexes}, "
                         f"commands {commands}")
    return children


def start_node(processes: Processes, directory: Path, variant: Variant, server_cpu: int) -> Node:
    """A fresh notary with ``variant.workers`` on ports chosen here (none of dev-init's fixed
    ones; an admin listener for /metrics), each worker checked to answer the cache hit with
    the same bytes (the first POST probed; the others load the stored answer)."""
    ports = free_ports(7)  # api, relay api, plain, spare: every listener's
    setup = new_notary(directory / variant.key, ports=ports)
    fixed = {DEV_ADMIN_PORT, DEV_PERSPECTIVES_PORT, DEV_RELAY_PORT}
    if setup.admin_port is None or set(ports) & fixed:
        raise BenchError(f"the edited config listens on {sorted(set(ports) & fixed)} or has "
                         f"no admin listener:\n{setup.config.read_text()}")
    log = directory / f"{variant.key}.log"
    notary = start_notary(
        processes, setup, f"notary {variant.key}", cpu=server_cpu if variant.pinned else None,
        log=log, argv=notary_argv(setup, ["--workers", str(variant.workers)]))
    node = Node(variant, notary, setup.admin_port,
                wait_for_workers(notary.process, variant.workers, log),
                wrk_script(setup.directory, notary.body))
    for port, tls in ((setup.plain_port, False), (setup.api_port, True)):
        request = post_request(port, setup.path, notary.body)
        with contextlib.ExitStack() as stack:
            # Several connections at once, so that the kernel hands them to different workers.
            socks = [stack.enter_context(connect(port, tls=tls, timeout_s=30.0))
                     for _ in range(4 * variant.workers)]
            for sock in socks:
                buffer = bytearray()
                for _ in range(2):
                    sock.sendall(request)
                    if read_response(sock, buffer) != notary.answer:
                        raise BenchError(f"notary {variant.key}: a worker answers different bytes")
    print(f"{variant.label}: pid {notary.pid}, serving pids {node.workers}; answer "
          f"{len(notary.answer)} bytes, {notary.answer.split(b' ', 2)[1].decode()}")
    return node


def scrape(node: Node) -> dict[str, float]:
    """Node totals from ``/metrics`` (summed over the workers, each as of its
    last fold, at most ``[admin] metrics_interval_s`` old)."""
    metrics = get_metrics(node.admin_port)
    return {"queries": sum(value for name, value in metrics if 'protocol="convergence"' in name
                           and name.startswith("notary_queries_total{")),
            "misses": sum(value for name, value in metrics if name == "notary_cache_misses_total"),
            "probes": sum(value for name, value in metrics
                          if name.startswith("notary_probes_total{"))}


def measure(wrk: str, processes: Processes, args: argparse.Namespace, client_cpu: int,
            settle_s: float, node: Node, transport: str, seconds: int) -> Measurement:
    """One wrk run against ``node``, with the CPU time of the node's
    processes (summed), of each worker, of wrk and of the whole machine."""
    node.notary.check_alive()
    children = descendants(node.notary.pid)
    pids = [node.notary.pid, *children]
    if (children or [node.notary.pid]) != node.workers:
        raise BenchError(f"notary {node.variant.key}: workers {node.workers} became {pids}: "
                         f"a worker restarted\n{tail(node.notary.log)}")
    before_metrics, before = scrape(node), tree_cpu_seconds(pids)
    setup = node.notary.setup
    url = (f"http://{LOOPBACK}:{setup.plain_port}" if transport == "plain"
           else f"https://{LOOPBACK}:{setup.api_port}") + setup.path
    result = run_wrk(
        wrk, processes, url, node.script, threads=1 if node.variant.pinned else args.threads,
        connections=args.connections, seconds=seconds,
        cpu=client_cpu if node.variant.pinned else None)
    after = tree_cpu_seconds(pids)
    time.sleep(settle_s)  # every worker folds its counters into /metrics
    after_metrics = scrape(node)
    used = {pid: after[pid] - before[pid] for pid in pids}
    return Measurement(
        **{**vars(result), "server_cpu_s": sum(used.values())},
        worker_cpu_s=tuple(used[pid] for pid in node.workers),
        **{key: after_metrics[key] - before_metrics[key] for key in before_metrics})


def report(args: argparse.Namespace, variants: Sequence[Variant],
           runs: dict[tuple[str, str], list[Measurement]]) -> None:
    """The table, then the scaled node's best rate over each 1-worker row's."""
    best = {key: best_run(results) for key, results in runs.items()}
    rows = []
    for variant in variants:
        plain, https = runs[variant.key, "plain"], runs[variant.key, "https"]
        top = {t: best[variant.key, t] for t in TRANSPORTS}
        rows.append([
            variant.label,
            f"{top['plain'].rate:,.0f} ({' / '.join(f'{m.rate:,.0f}' for m in plain)})",
            f"{top['plain'].rate / best['w1', 'plain'].rate:.2f}x",
            f"{top['https'].rate:,.0f} ({' / '.join(f'{m.rate:,.0f}' for m in https)})",
            f"{top['https'].rate / best['w1', 'https'].rate:.2f}x",
            f"{min(m.server_us for m in plain):.1f} / {min(m.server_us for m in https):.1f}",
            f"{min(m.client_us for m in plain):.1f} / {min(m.client_us for m in https):.1f}",
            " / ".join(f"{m.server_core:.2f} + {m.client_core:.2f} + {m.other_cores:.2f}"
                       for m in (top["plain"], top["https"])),
            f"{top['plain'].ceiling:,.0f} / {top['https'].ceiling:,.0f}",
            f"{top['plain'].split()} ; {top['https'].split()}",
        ])
    print_table(
        ["notary (wrk)", "plain req/s best (runs)", "plain vs 1 worker",
         "HTTPS req/s best (runs)", "HTTPS vs 1 worker", "notary CPU us/req plain / HTTPS",
         "wrk CPU us/req plain / HTTPS",
         "cores used, notary + wrk + other (best plain / best HTTPS)",
         "CPU ceiling req/s plain / HTTPS", "worker CPU split plain ; HTTPS"], rows)
    for transport in TRANSPORTS:
        top = best[f"w{args.workers}", transport].rate
        pinned = "" if args.no_pinned_row else (f"; / 1 worker pinned (bench_http set-up) = "
                                                f"{top / best['w1-pinned', transport].rate:.2f}x")
        print(f"{transport}: {args.workers} workers / 1 worker = "
              f"{top / best['w1', transport].rate:.2f}x{pinned}")
    print("cores used: CPU time / wall time, in cores (other: the rest of the machine's busy "
          "time, loopback softirq included); CPU ceiling: min(cores / (notary + wrk CPU per "
          "request), workers / notary CPU per request) (bench/README.md); 'UNEVEN': a worker "
          f"took less than {UNEVEN_SHARE:.0%} of the workers' CPU")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = load_parser(
        __doc__.split("\n\n")[0], rounds=3, threads=2, cpus="the pinned row's notary",
        quick="2 s per run, one round: a smoke run, not a measurement",
        wait_quiet=", and up to min(SECONDS, 30) before each further round")
    parser.add_argument("--workers", type=int, default=2,
                        help="workers of the scaled node (default 2)")
    parser.add_argument("--no-pinned-row", action="store_true",
                        help="skip the 1-worker row pinned like bench_http.py")
    args = finish_load_args(parser.parse_args(argv))
    if args.workers < 2:
        parser.error("--workers must be 2 or more (the baseline is 1)")
    if args.connections < max(args.threads, 1) or args.duration < 1:
        parser.error("--connections must be >= --threads, --duration >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark("bench_workers", parse_args(argv), run)


def run(args: argparse.Namespace, processes: Processes, directory: Path) -> int:
    wrk = ensure_wrk()
    cores = sorted(os.sched_getaffinity(0))
    server_cpu, client_cpu = start_load(
        args, "Worker scaling: cache-hit POST /target requests per second (wrk), "
        f"notary serve --workers 1 vs {args.workers}", wrk, lambda server, client: [
            f"wrk: -c{args.connections} -d{args.duration}s, -t{args.threads} in the unpinned rows; "
            f"{args.rounds} run(s) per row and transport, interleaved, best kept; loopback only",
            f"note: {args.workers} workers and wrk share {len(cores)} usable cores (nothing "
            "pinned in the compared rows): the cores bound the scaled figure, see 'CPU ceiling' "
            "(bench/README.md); with C cores, run N workers with N + wrk's cores <= C"],
        cpus=cores)
    unpinned = f"(-t{args.threads}, nothing pinned)"
    variants = [Variant("w1", f"1 worker {unpinned}", 1),
                Variant(f"w{args.workers}", f"{args.workers} workers {unpinned}", args.workers)]
    if not args.no_pinned_row:
        variants.insert(0, Variant("w1-pinned", f"1 worker pinned to CPU {server_cpu} "
                                   f"(-t1 on CPU {client_cpu}, bench_http)", 1, pinned=True))

    # Every node runs to the end: run_benchmark's Processes.stop_all stops them (SIGTERM, a
    # supervisor stops its workers; SIGKILL after a timeout).
    nodes = [start_node(processes, directory, variant, server_cpu) for variant in variants]
    settle_s = load_config(nodes[0].notary.setup.config).admin.metrics_interval_s + 0.5
    print(f"query: POST /target/{LOOPBACK}+<the node's own HTTPS port>, body "
          "fingerprint=<its SHA-1 pin> (each node is its own target)")

    measure_node = functools.partial(measure, wrk, processes, args, client_cpu, settle_s)
    items = [(node, transport) for node in nodes for transport in TRANSPORTS]
    # Warm-up, a short run per transport (TLS sessions, caches, every
    # worker's first hit): with several workers, each must take a share.
    for node, transport in items:
        m = measure_node(node, transport, WARM_UP_S)
        print(f"  warm-up {node.variant.label}, {transport}: {m.rate:,.0f} req/s; "
              f"worker pids {node.workers}, CPU "
              f"{' / '.join(f'{s:.2f}' for s in m.worker_cpu_s)} s", flush=True)
        if len(m.shares) > 1 and min(m.shares) < MIN_WORKER_SHARE:
            raise BenchError(f"notary {node.variant.key}, warm-up ({transport}): a worker took "
                             f"{min(m.shares):.0%} of the workers' CPU: not all workers answer")
    print()
    problems = []

    def progress(item: tuple[Node, str], m: Measurement) -> str:
        label = f"{item[0].variant.label}, {item[1]}"
        problems.extend(f"{label}: {w}" for w in m.warnings())
        supervisor_s = (m.server_cpu_s or 0.0) - sum(m.worker_cpu_s)
        return (f"{label}: {m.rate:,.0f} req/s, notary {m.server_us:.1f} us CPU/req "
                f"({m.server_core:.2f} cores, split {m.split()}, supervisor "
                f"{supervisor_s * 1e3:.0f} ms), wrk {m.client_us:.1f} us/req "
                f"({m.client_core:.2f} cores), other load {m.other_cores:.2f} "
                f"cores; latency {m.latency_avg} / p99 {m.latency_p99}")

    # Other work may start meanwhile: each further round waits too.
    runs = run_rounds(args, items, lambda item: measure_node(*item, args.duration),
                      progress, key=lambda item: (item[0].variant.key, item[1]),
                      quiet_cpus=cores)
    print()
    report(args, variants, runs)
    for problem in problems:
        print(f"WARNING: {problem}")
    print(describe_busy(cores, "after the runs (nodes idle)"))
    # With --workers N the kernel hands each reconnection to any worker: they all
    # resume only because the workers share their ticket keys (notary.server.tickets).
    print(f"TLS reconnections that resumed the first connection's session, of {RECONNECTIONS}: "
          + ", ".join(f"{node.variant.label}: " + str(resumed_reconnections(
              node.notary.setup.api_port, b"GET / HTTP/1.0\r\n\r\n", RECONNECTIONS))
              for node in nodes))
    for node in nodes:
        text = tail(node.notary.log)
        if text.strip():
            print(f"notary {node.variant.key} log (warnings and errors):\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
