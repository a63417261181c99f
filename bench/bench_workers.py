"""Worker scaling: cache-hit Convergence ``POST /target/<host>+<port>``
requests per second, measured with wrk over HTTP/1.1 keep-alive (plain HTTP
and HTTPS), against ``notary serve --workers 1`` and ``--workers 2`` in the
same run: the 1-worker figure is the baseline.

Rows: 1 worker pinned (``bench_http.py``'s set-up, a reference), 1 worker
and N workers with nothing pinned (wrk ``-t2``). Why nothing is pinned, and
the checks made: ``bench/README.md``.

    .venv/bin/python bench/bench_workers.py --wait-quiet 120   # about 5 minutes
    .venv/bin/python bench/bench_workers.py --quick            # 2 s per run: a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import subprocess
import sys
import time
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # also puts the project root on sys.path
from harness import LOOPBACK, BenchError, Processes

from notary.config import load_config
from notary.node.devsetup import DEV_ADMIN_PORT, DEV_PERSPECTIVES_PORT, DEV_RELAY_PORT

WARM_UP_S = 1
#: In a warm-up run, each worker must take at least this share of the workers' CPU.
MIN_WORKER_SHARE = 0.10
#: A measured run where a worker takes less than this share is flagged as uneven.
UNEVEN_SHARE = 0.35
#: Graceful stop of a node (idle: well under a second per worker), then SIGKILL.
NODE_STOP_TIMEOUT_S = 15.0
TRANSPORTS = ("plain", "https")


@dataclass(frozen=True)
class Variant:
    key: str
    label: str
    workers: int
    pinned: bool  # notary on the server core, wrk on the client core (bench_http's set-up)
    wrk_threads: int


@dataclass
class Node:
    variant: Variant
    setup: harness.NotarySetup
    process: subprocess.Popen[bytes]
    log: Path
    admin_port: int
    #: The serving processes: the notary itself (1 worker), or the supervisor's children.
    workers: list[int]
    body: str = ""
    answer: bytes = b""
    script: Path | None = None

    def url(self, transport: str) -> str:
        if transport == "plain":
            return f"http://{LOOPBACK}:{self.setup.plain_port}{self.setup.path}"
        return f"https://{LOOPBACK}:{self.setup.api_port}{self.setup.path}"


@dataclass(frozen=True)
class Measurement:
    run: harness.Run  # server CPU: the node's processes, summed
    worker_cpu_s: tuple[float, ...]  # per worker (the supervisor left out)
    cores: int
    queries: float  # Convergence queries the node counted (/metrics)
    misses: float
    probes: float

    @property
    def rate(self) -> float:
        return self.run.rate

    @property
    def ceiling(self) -> float:
        """The rate at which notary + wrk would fill every core, or each
        worker its own core, whichever comes first (no other load)."""
        return min(self.cores * 1e6 / (self.run.server_us + self.run.client_us),
                   len(self.worker_cpu_s) * 1e6 / self.run.server_us)

    @property
    def supervisor_cpu_s(self) -> float:
        return (self.run.server_cpu_s or 0.0) - sum(self.worker_cpu_s)

    def split(self) -> str:
        total = sum(self.worker_cpu_s)
        if len(self.worker_cpu_s) < 2 or not total:
            return "-"
        text = " / ".join(f"{s / total:.0%}" for s in self.worker_cpu_s)
        return text + (" UNEVEN" if min(self.worker_cpu_s) / total < UNEVEN_SHARE else "")

    def warnings(self) -> list[str]:
        found = []
        if self.misses or self.probes:
            found.append(f"{self.misses:.0f} cache misses, {self.probes:.0f} probes during the run")
        if self.queries < self.run.count:
            found.append(f"/metrics counted {self.queries:.0f} queries, wrk {self.run.count}")
        return found


# -- processes of a node ---------------------------------------------------------


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (``/proc/<pid>/task/*/children`` is not
    in every kernel: this VM has no CONFIG_PROC_CHILDREN)."""
    parents = {child: int(fields[1]) for child, fields in harness.all_proc_stats().items()}
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def tree_cpu_seconds(pids: Sequence[int]) -> dict[int, float]:
    """User + system CPU seconds of each process (all its threads); a process
    gone is a worker that died: the figure would be wrong."""
    times = {}
    for pid in pids:
        try:
            times[pid] = harness.cpu_seconds(pid)
        except OSError:
            raise BenchError(f"process {pid} of the node vanished during the run") from None
    return times


def worker_index_of(pid: int) -> str | None:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/environ", "rb") as environ:
        for item in environ.read().split(b"\0"):
            if item.startswith(b"NOTARY_WORKER_INDEX="):
                return item.split(b"=", 1)[1].decode()
    return None


def cmdline_of(pid: int) -> list[str]:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        return [part.decode(errors="replace") for part in cmdline.read().split(b"\0") if part]
    return []


def wait_for_workers(node_process: subprocess.Popen[bytes], workers: int, log: Path) -> list[int]:
    """The pids serving: the node itself for 1 worker (no supervisor, no
    child); for N > 1 its N children, each a ``notary serve`` worker with its
    own ``NOTARY_WORKER_INDEX``."""
    deadline = time.monotonic() + harness.READY_TIMEOUT_S
    while True:
        if node_process.poll() is not None:
            raise BenchError(f"the node exited with {node_process.returncode}:\n{harness.tail(log)}")
        children = descendants(node_process.pid)
        if workers == 1:
            if children:
                raise BenchError(f"--workers 1 started child processes {children}: a supervisor?")
            return [node_process.pid]
        if len(children) == workers:
            break
        if len(children) > workers or time.monotonic() > deadline:
            raise BenchError(f"--workers {workers} node has children {children}:\n"
                             f"{harness.tail(log)}")
        time.sleep(0.1)
    indexes = sorted(worker_index_of(pid) or "?" for pid in children)
    commands = [cmdline_of(pid) for pid in children]
    if indexes != [str(i) for i in range(workers)] or not all(
        "notary" in argv and "serve" in argv for argv in commands
    ):
        raise BenchError(f"the node's children are not its workers: indexes {indexes}, "
                         f"commands {commands}")
    return sorted(children)


# -- set-up ----------------------------------------------------------------------


def check_listeners(setup: harness.NotarySetup) -> int:
    """``make_notary`` checked that every listener is on a port chosen here;
    also none on dev-init's fixed ports (admin 9142, Perspectives 8080, relay
    8280), and one admin listener (for /metrics): return its port."""
    raw = tomllib.loads(setup.config.read_text())
    addresses = [a for values in harness.listen_addresses(raw).values() for a in values]
    fixed = {DEV_ADMIN_PORT, DEV_PERSPECTIVES_PORT, DEV_RELAY_PORT}
    if setup.admin_port is None or {int(a.rsplit(":", 1)[1]) for a in addresses} & fixed:
        raise BenchError(f"the edited config listens on {addresses} (admin port "
                         f"{setup.admin_port}):\n{setup.config.read_text()}")
    return setup.admin_port


def start_node(processes: Processes, directory: Path, variant: Variant, server_cpu: int) -> Node:
    setup = harness.new_notary(directory / variant.key)
    admin_port = check_listeners(setup)
    log = directory / f"{variant.key}.log"
    process = harness.start_notary(
        processes, setup, f"notary {variant.key}", cpu=server_cpu if variant.pinned else None,
        log=log, argv=harness.notary_argv(setup, ["--workers", str(variant.workers)]),
        prime=False).process
    workers = wait_for_workers(process, variant.workers, log)
    return Node(variant, setup, process, log, admin_port, workers)


def prime(node: Node) -> None:
    """Cache hit in every worker, and the same bytes from each: the first
    POST probes (one worker); the others load the stored answer."""
    node.body = f"fingerprint={harness.served_sha1_pin(node.setup.api_port)}"
    node.answer = harness.prime_notary(node.setup, node.body)
    node.script = harness.wrk_script(node.setup.directory, node.body)
    for port, tls in ((node.setup.plain_port, False), (node.setup.api_port, True)):
        request = harness.post_request(port, node.setup.path, node.body)
        with contextlib.ExitStack() as stack:
            # Several connections open at once, so that the kernel hands them
            # to different workers.
            socks = [stack.enter_context(harness.connect(port, tls=tls, timeout_s=30.0))
                     for _ in range(4 * node.variant.workers)]
            for sock in socks:
                buffer = bytearray()
                for _ in range(2):
                    sock.sendall(request)
                    if harness.read_response(sock, buffer) != node.answer:
                        raise BenchError(f"notary {node.variant.key}: a worker answers "
                                         "different bytes")


def scrape(node: Node) -> dict[str, float]:
    """Node totals from ``/metrics`` (summed over the workers, each as of its
    last fold, at most ``[admin] metrics_interval_s`` old)."""
    totals = {"queries": 0.0, "misses": 0.0, "probes": 0.0}
    for name, value in harness.get_metrics(node.admin_port):
        if name.startswith("notary_queries_total{") and 'protocol="convergence"' in name:
            totals["queries"] += value
        elif name == "notary_cache_misses_total":
            totals["misses"] += value
        elif name.startswith("notary_probes_total{"):
            totals["probes"] += value
    return totals


def stop_node(node: Node, processes: Processes) -> None:
    """SIGTERM to the node (a supervisor stops its workers), then SIGKILL to
    its whole process group after ``NODE_STOP_TIMEOUT_S`` (``Processes.stop``)."""
    processes.stop(node.process, NODE_STOP_TIMEOUT_S)


# -- measurement -----------------------------------------------------------------


def measure(wrk: str, processes: Processes, node: Node, transport: str,
            args: argparse.Namespace, client_cpu: int, seconds: int,
            settle_s: float) -> Measurement:
    """One wrk run against ``node``, with the CPU time of the node's
    processes (summed), of each worker, of wrk and of the whole machine."""
    if node.process.poll() is not None:
        raise BenchError(f"notary {node.variant.key} exited ({node.process.returncode}):\n"
                         f"{harness.tail(node.log)}")
    children = sorted(descendants(node.process.pid))
    pids = [node.process.pid, *children]
    if (children or [node.process.pid]) != node.workers:
        raise BenchError(f"notary {node.variant.key}: workers {node.workers} became {pids}: "
                         f"a worker restarted\n{harness.tail(node.log)}")
    before_metrics = scrape(node)
    before = tree_cpu_seconds(pids)
    result = harness.run_wrk(
        wrk, processes, node.url(transport), node.script, threads=node.variant.wrk_threads,
        connections=args.connections, seconds=seconds,
        cpu=client_cpu if node.variant.pinned else None)
    after = tree_cpu_seconds(pids)
    time.sleep(settle_s)  # every worker folds its counters into /metrics
    after_metrics = scrape(node)
    used = {pid: after[pid] - before[pid] for pid in pids}
    return Measurement(
        dataclasses.replace(result, server_cpu_s=sum(used.values())),
        tuple(used[pid] for pid in node.workers), os.cpu_count() or 1,
        **{key: after_metrics[key] - before_metrics[key] for key in before_metrics},
    )


def warm_up(wrk: str, processes: Processes, node: Node, args: argparse.Namespace,
            client_cpu: int, settle_s: float) -> None:
    """A short run per transport (TLS sessions, caches, every worker's first
    hit); with several workers, each must take a share of the load."""
    for transport in TRANSPORTS:
        run = measure(wrk, processes, node, transport, args, client_cpu, WARM_UP_S, settle_s)
        total = sum(run.worker_cpu_s)
        shares = [s / total for s in run.worker_cpu_s] if total else [0.0]
        print(f"  warm-up {node.variant.label}, {transport}: {run.rate:,.0f} req/s; "
              f"worker pids {node.workers}, CPU {' / '.join(f'{s:.2f}' for s in run.worker_cpu_s)}"
              " s", flush=True)
        if len(shares) > 1 and min(shares) < MIN_WORKER_SHARE:
            raise BenchError(f"notary {node.variant.key}: a worker took {min(shares):.0%} of the "
                             f"workers' CPU in the warm-up ({transport}): not all workers answer")


# -- report ----------------------------------------------------------------------


def least(results: Sequence[Measurement], key: str) -> float:
    return min(getattr(m.run, key) for m in results)


def report(variants: Sequence[Variant], runs: dict[tuple[str, str], list[Measurement]],
           base_key: str) -> None:
    base = {t: harness.best(runs[base_key, t]).rate for t in TRANSPORTS}
    rows = []
    for variant in variants:
        plain, https = runs[variant.key, "plain"], runs[variant.key, "https"]
        top = {t: harness.best(runs[variant.key, t]) for t in TRANSPORTS}
        rows.append([
            variant.label,
            f"{top['plain'].rate:,.0f} ({' / '.join(f'{m.rate:,.0f}' for m in plain)})",
            f"{top['plain'].rate / base['plain']:.2f}x",
            f"{top['https'].rate:,.0f} ({' / '.join(f'{m.rate:,.0f}' for m in https)})",
            f"{top['https'].rate / base['https']:.2f}x",
            f"{least(plain, 'server_us'):.1f} / {least(https, 'server_us'):.1f}",
            f"{least(plain, 'client_us'):.1f} / {least(https, 'client_us'):.1f}",
            " / ".join(f"{m.run.server_core:.2f} + {m.run.client_core:.2f} + "
                       f"{m.run.other_cores:.2f}" for m in (top["plain"], top["https"])),
            f"{top['plain'].ceiling:,.0f} / {top['https'].ceiling:,.0f}",
            f"{top['plain'].split()} ; {top['https'].split()}",
        ])
    harness.print_table(
        ["notary (wrk)", "plain req/s best (runs)", "plain vs 1 worker",
         "HTTPS req/s best (runs)", "HTTPS vs 1 worker", "notary CPU us/req plain / HTTPS",
         "wrk CPU us/req plain / HTTPS",
         "cores used, notary + wrk + other (best plain / best HTTPS)",
         "CPU ceiling req/s plain / HTTPS", "worker CPU split plain ; HTTPS"],
        rows,
    )


# -- main ------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = harness.load_parser(
        __doc__.split("\n\n")[0], rounds=3, threads=2, cpus="the pinned row's notary",
        quick="2 s per run, one round: a smoke run, not a measurement",
        wait_quiet=", and up to min(SECONDS, 30) before each further round")
    parser.add_argument("--workers", type=int, default=2,
                        help="workers of the scaled node (default 2)")
    parser.add_argument("--no-pinned-row", action="store_true",
                        help="skip the 1-worker row pinned like bench_http.py")
    args = harness.finish_load_args(parser.parse_args(argv))
    if args.workers < 2:
        parser.error("--workers must be 2 or more (the baseline is 1)")
    if args.connections < max(args.threads, 1) or args.duration < 1:
        parser.error("--connections must be >= --threads, --duration >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return harness.run_benchmark("bench_workers", parse_args(argv), run)


def run(args: argparse.Namespace, processes: Processes, directory: Path) -> int:
    wrk = harness.ensure_wrk()
    cores = sorted(os.sched_getaffinity(0))
    server_cpu, client_cpu = harness.start_load(
        args, "Worker scaling: cache-hit POST /target requests per second (wrk), "
        f"notary serve --workers 1 vs {args.workers}", wrk, lambda server, client: [
            f"wrk: -c{args.connections} -d{args.duration}s, -t{args.threads} in the unpinned "
            f"rows; {args.rounds} run(s) per row and transport, interleaved, best kept; "
            "loopback only",
            f"note: {len(cores)} usable cores, and wrk needs cores too. With {args.workers} "
            f"workers on {len(cores)} cores, wrk's threads share the cores with the workers "
            "(nothing is pinned in the compared rows), so the scaled figure is bounded by the "
            "cores left to the notary, not by the workers: see 'cores used' and 'CPU ceiling' "
            "(cores / (notary + wrk CPU per request)). On a machine with C cores, run N workers "
            "with N + wrk's cores <= C."], cpus=cores)
    variants = [
        Variant("w1", f"1 worker (-t{args.threads}, nothing pinned)", 1, False, args.threads),
        Variant(f"w{args.workers}", f"{args.workers} workers (-t{args.threads}, nothing pinned)",
                args.workers, False, args.threads),
    ]
    if not args.no_pinned_row:
        variants.insert(0, Variant("w1-pinned", f"1 worker pinned to CPU {server_cpu} "
                                   f"(-t1 on CPU {client_cpu}, bench_http)", 1, True, 1))

    nodes: list[Node] = []
    try:
        for variant in variants:
            node = start_node(processes, directory, variant, server_cpu)
            nodes.append(node)
            prime(node)
            print(f"{variant.label}: pid {node.process.pid}, serving pids {node.workers}; "
                  f"answer {len(node.answer)} bytes, {node.answer.split(b' ', 2)[1].decode()}")
        settle_s = load_config(nodes[0].setup.config).admin.metrics_interval_s + 0.5
        print(f"query: POST /target/{LOOPBACK}+<the node's own HTTPS port>, body "
              "fingerprint=<its SHA-1 pin> (each node is its own target)")
        for node in nodes:
            warm_up(wrk, processes, node, args, client_cpu, settle_s)
        print()
        problems = []

        def progress(item: tuple[Node, str], m: Measurement) -> str:
            label = f"{item[0].variant.label}, {item[1]}"
            problems.extend(f"{label}: {w}" for w in m.warnings())
            return (f"{label}: {m.rate:,.0f} req/s, notary {m.run.server_us:.1f} us CPU/req "
                    f"({m.run.server_core:.2f} cores, split {m.split()}, supervisor "
                    f"{m.supervisor_cpu_s * 1e3:.0f} ms), wrk {m.run.client_us:.1f} us/req "
                    f"({m.run.client_core:.2f} cores), other load {m.run.other_cores:.2f} "
                    f"cores; latency {m.run.latency_avg} / p99 {m.run.latency_p99}")

        # Other work may start meanwhile: each further round waits too.
        runs = harness.run_rounds(
            args, [(node, t) for node in nodes for t in TRANSPORTS],
            lambda item: measure(wrk, processes, item[0], item[1], args, client_cpu,
                                 args.duration, settle_s),
            progress, key=lambda item: (item[0].variant.key, item[1]), quiet_cpus=cores)
        print()
        report(variants, runs, "w1")
        scaled = f"w{args.workers}"
        for transport in TRANSPORTS:
            top = harness.best(runs[scaled, transport]).rate
            line = (f"{transport}: {args.workers} workers / 1 worker = "
                    f"{top / harness.best(runs['w1', transport]).rate:.2f}x")
            if not args.no_pinned_row:
                line += (f"; / 1 worker pinned (bench_http set-up) = "
                         f"{top / harness.best(runs['w1-pinned', transport]).rate:.2f}x")
            print(line)
        print("cores used: CPU time / wall time of the run, in cores (other = the rest of the "
              "machine's busy time: other benchmarks, the idle nodes, and the loopback traffic's "
              "softirq time, which no process is charged with); CPU ceiling: min(cores / (notary "
              "+ wrk CPU per request), workers / notary CPU per request), the rate of this run's "
              f"costs on an otherwise idle machine; 'UNEVEN': a worker took less than "
              f"{UNEVEN_SHARE:.0%} of the workers' CPU")
        for problem in problems:
            print(f"WARNING: {problem}")
        print(harness.describe_busy(cores, "after the runs (nodes idle)"))
        for node in nodes:
            text = harness.tail(node.log)
            if text.strip():
                print(f"notary {node.variant.key} log (warnings and errors):\n{text}\n")
    finally:
        for node in reversed(nodes):
            with contextlib.suppress(Exception):
                stop_node(node, processes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
