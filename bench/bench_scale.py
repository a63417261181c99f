"""Scale: how the notary holds up with many connections and a large store.
Three parts, one Markdown table each (loopback only): 1. concurrent keep-alive connections
(wrk, 10 to 10,000), 2. memory per idle connection (and, under tracemalloc, where it goes),
3. start-up with a store of 1,000,000 targets. What each part measures: ``bench/README.md``.

    .venv/bin/python bench/bench_scale.py --wait-quiet 120   # about 5 min (+1-2 min to build the store once)
    .venv/bin/python bench/bench_scale.py --quick            # 10/100/1000 connections, 100k targets, 2 s runs
    .venv/bin/python bench/bench_scale.py --parts startup --rebuild-store
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import random
import re
import resource
import select
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness.loopback import LOOPBACK, get_metrics, post_request, read_response
from harness.machine import cpu_seconds, describe_busy, listen_queue, proc_status, wait_quiet
from harness.options import finish_load_args, load_parser
from harness.processes import Processes, run_benchmark, tail
from harness.project import ROOT, BenchError
from harness.report import print_table, short_path
from harness.runs import Run, start_load
from harness.servers import NotarySetup, RunningNotary, new_notary, notary_argv, start_notary
from harness.tools import ensure_wrk
from harness.wrk import run_wrk, wrk_script

from notary.config import CacheConfig
from notary.model.observations import Certificate, ProbeResult
from notary.model.targets import Target
from notary.state.store import SCHEMA_VERSION, Store

PARTS = ("connections", "idle", "startup")
NOFILE = 65_536
#: ``[http] max_connections`` = the largest N + this.
CONNECTION_MARGIN = 2_000
IDLE_KEEPALIVE_S = 120.0
WRK_TIMEOUT_S = 10
GOAL_IDLE_CONNECTIONS = 10_000
GOAL_RSS_BYTES = 200 * 10**6
#: The store: batches of ``Store.record``, certificate size, generator version
#: (part of the cache file's name: bump it when the generated rows change).
STORE_BATCH = 500
DER_BYTES = 1_200
GENERATOR = 1
STORE_SEED = 6
T0 = 1_700_000_000
CACHE_DIR = ROOT / ".bench-tmp"
START_TIMEOUT_S = 300.0
#: Settling time before reading memory figures, and for /metrics to fold.
SETTLE_S = 2.0
#: When, as fractions of a wrk run, the notary's open connections are read
#: (``/metrics``: each figure up to ``[admin] metrics_interval_s`` old).
SAMPLE_AT = (0.25, 0.5, 0.95)
#: Longest wait for the previous wrk run's connections to be gone.
DRAIN_TIMEOUT_S = 120.0
#: tracemalloc wrapper for the notary: SIGUSR1 writes a snapshot to
#: argv[1].<n> (n = 0, 1, ...; renamed once complete); argv[2] is the number
#: of frames kept; the rest of argv is the notary's.
TRACE_WRAPPER = """\
import itertools, os, signal, sys, tracemalloc
prefix, frames = sys.argv[1], int(sys.argv[2])
tracemalloc.start(frames)
taken = itertools.count()
def dump(*_):
    path = f"{prefix}.{next(taken)}"
    tracemalloc.take_snapshot().dump(path + ".part")
    os.replace(path + ".part", path)
signal.signal(signal.SIGUSR1, dump)
from notary.cli import main
sys.exit(main(sys.argv[3:]))
"""
TRACE_FRAMES = 1
KNOWN_LINE = re.compile(r"known targets: (\d+) loaded from the store in ([\d.]+) s")
KNOWN_WARNING = re.compile(r"known targets: \d+ targets exceed .*")


def accept_queue(port: int) -> int:
    """Connections waiting in the accept queue of the listener on ``port``."""
    queued = listen_queue(port)
    if queued is None:
        raise BenchError(f"no listener on port {port} in /proc/net/tcp")
    return queued


def mb(value: float) -> str:
    return f"{value / 1e6:,.1f} MB"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.0f} ms" if seconds >= 0.1 else f"{seconds * 1e3:,.1f} ms"


def joined(counts: Iterable[float]) -> str:
    """``a / b / c``, ``?`` for a count that could not be read (NaN) or for none."""
    return " / ".join(f"{n:,.0f}" if n == n else "?" for n in counts) or "?"


def plain_metrics(notary: RunningNotary) -> dict[str, float]:
    """The plain-HTTP listener's open and refused connections (``/metrics``)."""
    if notary.setup.admin_port is None:
        raise BenchError("the bench config has no admin listener")
    figures = {"open": 0.0, "refused": 0.0}
    for name, value in get_metrics(notary.setup.admin_port):
        if 'listener="plain_api"' not in name:
            continue
        if name.startswith("notary_http_connections{"):
            figures["open"] = value
        elif name.startswith("notary_http_refused_connections"):
            figures["refused"] = value
    return figures


@dataclass(frozen=True)
class LoadRun:
    connections: int
    wrk: Run
    rss_before: int
    peak_rss: int
    #: The notary's open connections at SAMPLE_AT fractions of the run, and
    #: the listener's accept queue then.
    open_during: tuple[float, ...]
    queued_during: tuple[int, ...]
    #: Time waited before the run for the previous run's connections to go.
    drained_s: float
    refused: float

    def latency(self, percentile: str) -> str:
        us = self.wrk.latency_us.get(percentile)
        if us is None:
            return self.wrk.latency_p99 if percentile == "p99" else "?"
        return ms(us / 1e6)


def wait_drained(notary: RunningNotary) -> float:
    """Wait until the previous run's connections are gone: none open at the notary (twice
    in a row: /metrics lags), none left in the accept queue (bench/README.md). Return the wait."""
    started = time.monotonic()
    zero = 0
    while zero < 2:
        idle = (accept_queue(notary.setup.plain_port) == 0
                and plain_metrics(notary)["open"] == 0)
        zero = zero + 1 if idle else 0
        if time.monotonic() - started > DRAIN_TIMEOUT_S:
            print(f"  warning: connections of the previous run still open or queued after "
                  f"{DRAIN_TIMEOUT_S:g} s; going on", flush=True)
            break
        time.sleep(0.6)
    return time.monotonic() - started


def load_run(args: argparse.Namespace, wrk: str, processes: Processes, notary: RunningNotary,
             script: Path, connections: int, client_cpu: int) -> LoadRun:
    """One wrk run (socket errors counted, not fatal), with the notary's RSS before, its peak
    during the run (VmHWM reset first), its open connections mid-run and its refused ones."""
    notary.check_alive()
    url = f"http://{LOOPBACK}:{notary.setup.plain_port}{notary.setup.path}"
    drained_s = wait_drained(notary)
    refused_before = plain_metrics(notary)["refused"]
    rss_before = proc_status(notary.pid)["VmRSS"]
    try:  # VmHWM back to the current RSS (Linux >= 4.0, same user or root)
        Path(f"/proc/{notary.pid}/clear_refs").write_text("5", encoding="ascii")
    except OSError:
        raise BenchError("cannot reset the notary's VmHWM (/proc/<pid>/clear_refs)") from None
    samples: list[float] = []
    queued: list[int] = []
    stop = threading.Event()
    started = time.monotonic()

    def sample() -> None:  # in a thread, while run_wrk waits for wrk
        for fraction in SAMPLE_AT:
            if stop.wait(max(0.0, started + args.duration * fraction - time.monotonic())):
                return
            try:
                queued.append(accept_queue(notary.setup.plain_port))
                samples.append(plain_metrics(notary)["open"])
            except (OSError, BenchError):
                samples.append(float("nan"))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = run_wrk(
            wrk, processes, url, script, threads=args.threads, connections=connections,
            seconds=args.duration, cpu=client_cpu, allow_errors=True,
            server_cpu_seconds=lambda: cpu_seconds(notary.pid),
            extra=[f"--timeout={WRK_TIMEOUT_S}s"])
    finally:
        stop.set()
        sampler.join()
    peak = proc_status(notary.pid)["VmHWM"]
    time.sleep(SETTLE_S)  # /metrics folds every [admin] metrics_interval_s
    refused = plain_metrics(notary)["refused"] - refused_before
    return LoadRun(connections, result, rss_before, peak, tuple(samples), tuple(queued),
                   drained_s, refused)


def part_connections(args: argparse.Namespace, processes: Processes, directory: Path, wrk: str,
                     cpus: tuple[int, int]) -> None:
    server_cpu, client_cpu = cpus
    max_connections = max(args.connections) + CONNECTION_MARGIN
    setup = new_notary(directory / "connections",
                       {"http": {"max_connections": max_connections}})
    notary = start_notary(processes, setup, "notary-connections", cpu=server_cpu,
                          log=directory / "notary-connections.log")
    script = wrk_script(directory, notary.body)
    limits = re.search(r"Max open files\s+(\S+)\s+(\S+)",
                       Path(f"/proc/{notary.pid}/limits").read_text())
    somaxconn = Path("/proc/sys/net/core/somaxconn").read_text().strip()
    print(f"## 1. Concurrent keep-alive connections: cache-hit POST {setup.path}, plain HTTP (wrk)")
    print(f"notary pid {notary.pid} pinned to CPU {server_cpu}, open files limit "
          f"{'/'.join(limits.groups()) if limits else '?'}, [http] max_connections = "
          f"{max_connections:,}; wrk -t{args.threads} -cN -d{args.duration}s --timeout="
          f"{WRK_TIMEOUT_S}s on CPU {client_cpu} ({args.threads} thread(s): N / {args.threads} "
          f"connections each); {args.rounds} run(s) per N; answer {len(notary.answer)} bytes; "
          f"listen backlog min(65535, somaxconn {somaxconn})", flush=True)
    runs: list[LoadRun] = []
    for connections in args.connections:
        if connections % args.threads:
            print(f"  warning: wrk gives each of its {args.threads} threads {connections} // "
                  f"{args.threads} connections: {connections % args.threads} fewer than asked")
        for round_number in range(args.rounds):
            run = load_run(args, wrk, processes, notary, script, connections, client_cpu)
            runs.append(run)
            print(f"  N={connections:,} run {round_number + 1}: {run.wrk.rate:,.0f} req/s, "
                  f"p50 {run.latency('p50')}, p99 {run.latency('p99')}, errors "
                  f"{run.wrk.errors or 'none'}, {run.wrk.server_us:.1f} us CPU/req, peak RSS "
                  f"{mb(run.peak_rss)}, open at the notary {joined(run.open_during)}, accept "
                  f"queue {joined(run.queued_during)}; waited {run.drained_s:.1f} s before it "
                  "for the previous run's connections to go", flush=True)
    print()
    when = " / ".join(f"{f:.0%}" for f in SAMPLE_AT)
    print_table(
        ["connections (wrk -c)", "req/s", "latency p50", "latency p99", "N / rate",
         "socket errors connect / read / write / timeout", "non-2xx", "server CPU us/req",
         "server core use", "wrk core use", f"open at the notary at {when} of the run",
         f"accept queue at {when}", "refused by the notary", "server RSS before",
         "server peak RSS (VmHWM)"],
        [[f"{run.connections:,}", f"{run.wrk.rate:,.0f}", run.latency("p50"),
          run.latency("p99"), ms(run.connections / run.wrk.rate),
          joined(run.wrk.errors.get(name, 0) for name in ("connect", "read", "write", "timeout")),
          f"{run.wrk.errors.get('non-2xx', 0):,}", f"{run.wrk.server_us:.1f}",
          f"{run.wrk.server_core or 0:.0%}", f"{run.wrk.client_core:.0%}",
          joined(run.open_during), joined(run.queued_during), f"{run.refused:,.0f}",
          mb(run.rss_before), mb(run.peak_rss)] for run in runs],
    )
    for run in runs:
        accepted = max((n for n in run.open_during if n == n), default=0.0)
        if accepted < 0.95 * run.connections:
            queued = max(run.queued_during, default=0)
            print(f"N={run.connections:,}: the notary held at most {accepted:,.0f} of the "
                  f"{run.connections:,} connections; the others waited in the kernel's accept "
                  f"queue (up to {queued:,} at once), their first request unanswered: wrk's "
                  "latency covers answered requests only; clients would see N / rate ("
                  f"{ms(run.connections / run.wrk.rate)}) on average, and wrk counts a timeout "
                  f"only past --timeout ({WRK_TIMEOUT_S} s).")
    print("Columns: latency from wrk (answered requests); 'open at the notary': "
          "notary_http_connections{listener=\"plain_api\"} from /metrics (up to 1 s old); "
          "accept queue: the listener's rx_queue in /proc/net/tcp (accepted by the kernel, "
          "not yet by the notary); peak RSS: VmHWM, reset at the start of each run.")
    print()
    processes.stop(notary.process)
    text = tail(notary.log)
    if text.strip():
        print(f"notary log (warnings and errors):\n{text}\n")


@dataclass(frozen=True)
class IdleRun:
    connections: int
    rss_before: int
    rss_idle: int
    anon_before: int
    anon_idle: int
    open_counted: float
    open_s: float
    longest_idle_s: float
    alive: int
    rss_closed: int


def open_idle(sockets: contextlib.ExitStack, port: int, request: bytes, answer: bytes,
              count: int) -> list[socket.socket]:
    """``count`` connections, each asked once, answered, then left idle;
    ``sockets`` closes them."""
    socks = []
    for _ in range(count):
        sock = sockets.enter_context(socket.create_connection((LOOPBACK, port), timeout=30.0))
        socks.append(sock)
        sock.sendall(request)
        if read_response(sock, bytearray()) != answer:
            raise BenchError("an idle connection's first answer differs from the primed one")
    return socks


def snapshot(notary: RunningNotary, prefix: Path, index: int) -> Path:
    """Ask the traced notary for a tracemalloc snapshot; wait for the file."""
    path = Path(f"{prefix}.{index}")
    notary.process.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 120
    while not path.exists():
        notary.check_alive()
        if time.monotonic() > deadline:
            raise BenchError(f"the traced notary wrote no snapshot {path}")
        time.sleep(0.1)
    return path


def idle_run(processes: Processes, directory: Path, connections: int, server_cpu: int,
             max_connections: int, trace: bool = False) -> IdleRun:
    """One fresh notary holding ``connections`` idle ones; with ``trace``,
    under tracemalloc, and its allocations per connection printed."""
    name = f"idle-{connections}" + ("-traced" if trace else "")
    setup = new_notary(directory / name, {"http": {
        "max_connections": max_connections, "keepalive_timeout_s": IDLE_KEEPALIVE_S}})
    prefix = directory / f"{name}.snapshot"
    serve = notary_argv(setup)
    traced = [sys.executable, "-c", TRACE_WRAPPER, str(prefix), str(TRACE_FRAMES),
              *serve[serve.index("serve"):]]
    notary = start_notary(processes, setup, f"notary-{name}", cpu=server_cpu,
                          argv=traced if trace else None,
                          log=directory / f"notary-{name}.log")
    request = post_request(setup.plain_port, setup.path, notary.body)
    snapshots = []
    try:
        # Warm-up: a few connections through the same path, closed, so that
        # what is allocated once (first connection, first answer) is in "before".
        with contextlib.ExitStack() as warm_up:
            open_idle(warm_up, setup.plain_port, request, notary.answer, 100)
        time.sleep(SETTLE_S)
        before = proc_status(notary.pid)
        if trace:
            snapshots.append(snapshot(notary, prefix, 0))
        started = time.monotonic()
        with contextlib.ExitStack() as sockets:
            socks = open_idle(sockets, setup.plain_port, request, notary.answer, connections)
            open_s = time.monotonic() - started
            time.sleep(SETTLE_S)
            idle = proc_status(notary.pid)
            counted = plain_metrics(notary)["open"]
            if trace:
                snapshots.append(snapshot(notary, prefix, 1))
            longest_idle_s = time.monotonic() - started
            notary.check_alive()
            alive = 0
            for sock in socks:
                with contextlib.suppress(OSError, BenchError):
                    sock.sendall(request)
                    alive += read_response(sock, bytearray()) == notary.answer
        time.sleep(SETTLE_S)
        closed = proc_status(notary.pid)
    finally:
        processes.stop(notary.process)
    run = IdleRun(connections, before["VmRSS"], idle["VmRSS"], before["RssAnon"],
                  idle["RssAnon"], counted, open_s, longest_idle_s, alive, closed["VmRSS"])
    if trace:
        print_traced(run, *snapshots)
    return run


def print_traced(run: IdleRun, before_path: Path, after_path: Path, top: int = 15) -> None:
    """Python allocations held per idle connection, by allocation site."""
    before = tracemalloc.Snapshot.load(str(before_path))
    after = tracemalloc.Snapshot.load(str(after_path))
    n = run.connections
    by_file = after.compare_to(before, "filename")
    total = sum(stat.size_diff for stat in by_file)
    print(f"tracemalloc ({n:,} idle connections, a separate notary run under tracemalloc, "
          f"{TRACE_FRAMES} frames; its RSS figures include tracemalloc's own overhead): "
          f"{total / n:,.0f} B of Python allocations held per connection, RSS "
          f"{(run.rss_idle - run.rss_before) / n:,.0f} B per connection in the same run")
    print()
    print_table(
        ["allocation site (innermost frame)", "bytes per connection", "blocks per connection",
         "share"],
        [[f"{short_path(stat.traceback[0].filename)}:{stat.traceback[0].lineno}",
          f"{stat.size_diff / n:,.0f}", f"{stat.count_diff / n:.2f}",
          f"{stat.size_diff / total:.0%}" if total else "?"]
         for stat in after.compare_to(before, "lineno")[:top]])
    print_table(
        ["allocated in (file)", "bytes per connection", "blocks per connection"],
        [[short_path(stat.traceback[0].filename), f"{stat.size_diff / n:,.0f}",
          f"{stat.count_diff / n:.2f}"] for stat in by_file[:8]])


def part_idle(args: argparse.Namespace, processes: Processes, directory: Path,
              cpus: tuple[int, int]) -> None:
    server_cpu, client_cpu = cpus
    max_connections = max(args.idle) + CONNECTION_MARGIN
    print("## 2. Memory per idle keep-alive connection (plain HTTP, one fresh notary per N)")
    print(f"notary pinned to CPU {server_cpu}, [http] max_connections = {max_connections:,}, "
          f"keepalive_timeout_s = {IDLE_KEEPALIVE_S:g} (raised from 30); the client, this process "
          f"on CPU {client_cpu}, opens them one after the other, asks each once and leaves it "
          "idle, after a warm-up of 100 connections opened and closed", flush=True)
    runs = []
    for connections in args.idle:
        run = idle_run(processes, directory, connections, server_cpu, max_connections)
        runs.append(run)
        print(f"  N={connections:,}: RSS {mb(run.rss_before)} -> {mb(run.rss_idle)}, "
              f"{(run.rss_idle - run.rss_before) / connections:,.0f} B per connection; "
              f"opened in {run.open_s:.1f} s; {run.alive:,} answered again", flush=True)
    print()
    print_table(
        ["idle connections", "server RSS before", "server RSS with them idle",
         "bytes per connection (VmRSS)", "bytes per connection (RssAnon)",
         "open at the notary (/metrics)", "time to open them", "longest idle",
         "answered again afterwards", "server RSS after closing them"],
        [[f"{run.connections:,}", mb(run.rss_before), mb(run.rss_idle),
          f"{(run.rss_idle - run.rss_before) / run.connections:,.0f}",
          f"{(run.anon_idle - run.anon_before) / run.connections:,.0f}",
          f"{run.open_counted:,.0f}", f"{run.open_s:.1f} s", f"{run.longest_idle_s:.1f} s",
          f"{run.alive:,}", mb(run.rss_closed)] for run in runs],
    )
    goal = next((run for run in runs if run.connections == GOAL_IDLE_CONNECTIONS), None)
    if goal is None:
        print(f"goal ({GOAL_IDLE_CONNECTIONS:,} idle connections under {mb(GOAL_RSS_BYTES)}): "
              f"not measured in this run (--idle without {GOAL_IDLE_CONNECTIONS})")
    else:
        met = goal.rss_idle < GOAL_RSS_BYTES and goal.alive == goal.connections
        print(f"goal: {GOAL_IDLE_CONNECTIONS:,} idle connections held under {mb(GOAL_RSS_BYTES)} "
              f"of server RSS: {mb(goal.rss_idle)}, {goal.alive:,} still answering -> "
              f"{'met' if met else 'NOT met'}")
    print("Kernel socket memory (buffers, the socket structures) is not in the process's RSS.")
    print()
    if args.trace_memory:
        print(f"### Where the memory of an idle connection goes ({args.trace_memory:,} "
              "connections, tracemalloc)")
        idle_run(processes, directory, args.trace_memory, server_cpu, max_connections,
                 trace=True)


def remove_database(path: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def probe_result(index: int, rng: random.Random) -> ProbeResult:
    der = rng.randbytes(DER_BYTES)
    certificate = Certificate(
        der=der, sha1=hashlib.sha1(der).digest(), sha256=hashlib.sha256(der).digest(),
        md5=hashlib.md5(der).digest(), spki_sha256=hashlib.sha256(der[:300]).digest(),
    )
    return ProbeResult(Target(f"host{index}.example.test", 443), certificate, (der,),
                       "192.0.2.1", T0 + index)


def check_store(path: Path, targets: int) -> int:
    """The cached store's size in bytes, if it holds exactly what is built here."""
    with Store(path, create=False) as store:
        statistics = store.statistics()
    if (statistics.schema_version, statistics.targets, statistics.observations) != (
            SCHEMA_VERSION, targets, targets):
        raise BenchError(f"{path}: schema {statistics.schema_version}, {statistics.targets} "
                         f"targets, {statistics.observations} observations; expected "
                         f"{SCHEMA_VERSION}, {targets}, {targets} (--rebuild-store)")
    return statistics.file_bytes


def build_store(path: Path, targets: int, why: str) -> None:
    """``targets`` targets, one observation each, through ``Store.record``;
    written under a temporary name, renamed once complete."""
    print(f"building {path.relative_to(ROOT)} ({why}): {targets:,} targets, one "
          f"observation each, Store.record in batches of {STORE_BATCH}", flush=True)
    CACHE_DIR.mkdir(exist_ok=True)
    building = path.with_name(path.name + ".building")
    remove_database(building)
    rng = random.Random(STORE_SEED)
    started = time.monotonic()
    with Store(building) as store:
        for first in range(0, targets, STORE_BATCH):
            done = min(targets, first + STORE_BATCH)
            store.record([probe_result(i, rng) for i in range(first, done)])
            if done % max(STORE_BATCH, targets // 10 // STORE_BATCH * STORE_BATCH) == 0:
                print(f"  built {done:,} targets in {time.monotonic() - started:.0f} s",
                      flush=True)
    elapsed = time.monotonic() - started
    remove_database(path)
    for suffix in ("-wal", "-shm"):  # a clean close leaves none; be sure
        if Path(f"{building}{suffix}").exists():
            raise BenchError(f"{building}{suffix} left after closing the store")
    os.replace(building, path)
    print(f"built in {elapsed:.1f} s ({targets / elapsed:,.0f} targets/s), "
          f"{mb(check_store(path, targets))}", flush=True)


def resident(path: Path) -> str:
    """How much of ``path`` is in the page cache (fincore), ``?`` if unknown."""
    with contextlib.suppress(OSError):  # no fincore
        result = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES",
                                 str(path)], capture_output=True, text=True, check=False)
        if result.stdout.strip().isdigit():
            return mb(int(result.stdout))
    return "?"


@dataclass(frozen=True)
class StartRun:
    listening_s: float
    answering_s: float
    ready_s: float
    known_line: str
    known_s: float
    rss_ready: int
    peak_ready: int
    warning: str


def timed_start(processes: Processes, setup: NotarySetup, name: str, targets: int,
                server_cpu: int) -> StartRun:
    """Start the notary with ``NOTIFY_SOCKET`` bound here; time the listener
    (TCP connect), the first HTTP answer and READY=1; RSS at READY. The
    notary is stopped before this returns."""
    log = setup.directory.parent / f"{name}.log"
    notify_path = setup.directory.parent / f"{name}.notify"
    notify_path.unlink(missing_ok=True)
    request = f"GET / HTTP/1.1\r\nHost: {LOOPBACK}:{setup.plain_port}\r\n\r\n".encode()
    listening = answering = ready = None
    probe: socket.socket | None = None
    answer = b""
    states: list[bytes] = []
    with contextlib.ExitStack() as stack:
        notify = stack.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM))
        notify.bind(str(notify_path))
        stack.callback(notify_path.unlink, missing_ok=True)
        env = {"NOTIFY_SOCKET": str(notify_path), "WATCHDOG_USEC": None, "WATCHDOG_PID": None}
        started = time.monotonic()
        process = processes.start(name, notary_argv(setup), cpu=server_cpu, log=log,
                                  cwd=setup.directory, env=env)
        stack.callback(processes.stop, process)
        while ready is None or answering is None:
            if process.poll() is not None:
                raise BenchError(f"{name} exited with {process.returncode}:\n{tail(log)}")
            if time.monotonic() - started > START_TIMEOUT_S:
                raise BenchError(f"{name}: not ready after {START_TIMEOUT_S:g} s "
                                 f"(listening {listening}, answering {answering}, "
                                 f"states {states}):\n{tail(log)}")
            if probe is None:
                with contextlib.suppress(OSError):
                    probe = stack.enter_context(
                        socket.create_connection((LOOPBACK, setup.plain_port), timeout=1.0))
                if probe is not None:
                    listening = time.monotonic() - started
                    probe.sendall(request)
            watch = [notify] + ([probe] if probe is not None and answering is None else [])
            readable, _, _ = select.select(watch, [], [], 0.005 if listening else 0.01)
            if notify in readable:  # select: a datagram waits, recv returns at once
                states += notify.recv(65536).split(b"\n")
                if b"READY=1" in states and ready is None:
                    ready = time.monotonic() - started
                    memory = proc_status(process.pid)
            if probe in readable:
                data = probe.recv(65536)
                if not data:
                    raise BenchError(f"{name} closed the first connection without "
                                     f"answering: {answer!r}")
                answer += data
                if b"\r\n" in answer:
                    if not answer.startswith(b"HTTP/1.1 "):
                        raise BenchError(f"{name} answered {answer[:100]!r}")
                    answering = time.monotonic() - started
        time.sleep(0.2)  # the log line is written before READY; let it reach the file
        text = log.read_text(errors="replace")
    known = KNOWN_LINE.search(text)
    if known is None:
        raise BenchError(f"{name}: no 'known targets: N loaded' line in the log:\n"
                         f"{tail(log)}")
    if int(known.group(1)) != targets:
        raise BenchError(f"{name}: the notary loaded {known.group(1)} targets, not {targets}")
    warning = KNOWN_WARNING.search(text)
    return StartRun(listening or 0.0, answering, ready, known.group(0), float(known.group(2)),
                    memory["VmRSS"], memory["VmHWM"], warning.group(0) if warning else "")


def part_startup(args: argparse.Namespace, processes: Processes, directory: Path,
                 cpus: tuple[int, int]) -> None:
    server_cpu, _ = cpus
    targets = args.targets
    path = CACHE_DIR / f"scale-store-schema{SCHEMA_VERSION}-{targets}-g{GENERATOR}.db"
    print(f"## 3. Start-up with {targets:,} targets in the store "
          "(notary serve --workers 1, NOTIFY_SOCKET bound here)")
    if args.rebuild_store or not path.exists():
        build_store(path, targets, "--rebuild-store" if path.exists() else "not cached yet")
    else:
        print(f"reusing {path.relative_to(ROOT)} ({mb(check_store(path, targets))}; "
              "--rebuild-store to build it again)", flush=True)
    size = check_store(path, targets)
    if args.wait_quiet:
        wait_quiet(list(cpus), min(args.wait_quiet, 60.0))
    default_bloom = CacheConfig().bloom_expected_items
    variants = [("empty", 0, default_bloom, "warm"), ("large-cold", targets, default_bloom, "cold")]
    variants += [(f"large-warm-{i + 1}", targets, default_bloom, "warm")
                 for i in range(args.rounds)]
    variants.append(("large-bloom-below", targets, max(1, targets // 10), "warm"))
    rows = []
    warnings = []
    for label, count, bloom, cache in variants:
        options: dict[str, dict[str, object]] = {
            "server": {"log_level": "info"}, "cache": {"bloom_expected_items": bloom}}
        if count:
            options["server"]["db_file"] = str(path)
        setup = new_notary(directory / f"startup-{label}", options)
        if count and cache == "cold":  # drop the file's pages from this kernel's page cache
            with open(path, "rb") as file:
                os.fsync(file.fileno())
                os.posix_fadvise(file.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        page_cache = resident(path) if count else "-"
        run = timed_start(processes, setup, f"notary-start-{label}", count, server_cpu)
        print(f"  {label}: listening {ms(run.listening_s)}, answering {ms(run.answering_s)}, "
              f"READY {ms(run.ready_s)}; '{run.known_line}'; RSS {mb(run.rss_ready)}"
              + (f"; WARNING logged: {run.warning}" if run.warning else ""), flush=True)
        rows.append([
            f"{count:,}", f"{bloom:,}", f"{page_cache} resident" if count else "-",
            ms(run.listening_s), ms(run.answering_s), ms(run.ready_s), f"{run.known_s:.1f} s",
            mb(run.rss_ready), mb(run.peak_ready), "yes" if run.warning else "no",
        ])
        if run.warning:
            warnings.append(f"{label}: the notary logged: {run.warning}")
    print()
    print_table(
        ["targets in the store", "[cache] bloom_expected_items", "database in page cache",
         "listening (TCP connect)", "first HTTP answer", "READY=1",
         "notary's 'loaded ... in X s'", "RSS at READY", "peak RSS at READY (VmHWM)",
         "over-capacity warning"],
        rows,
    )
    print(f"Times from the notary's fork (Python start-up and imports included); the database: "
          f"{path.relative_to(ROOT)}, {mb(size)}, used in place. Each start is a new process "
          f"pinned to CPU {server_cpu}.")
    for warning in warnings:
        print(warning)
    print(f"store unchanged after the starts: {targets:,} targets, "
          f"{mb(check_store(path, targets))}")
    print()


def int_list(text: str) -> list[int]:
    values = [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"a comma-separated list of positive counts: {text!r}")
    return values


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = load_parser(
        __doc__.split("\n\n")[0], rounds=2, cpus="the notary", connections=None,
        quick="10/100/1000 connections, 100/1000 idle, 100k targets, 2 s runs, one round: "
        "a smoke run", wait_quiet=", and up to min(SECONDS, 60) before each further part")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"comma-separated subset of {', '.join(PARTS)} (default: all)")
    parser.add_argument("--connections", type=int_list,
                        help="wrk -c values, comma-separated (default 10,100,1000,10000)")
    parser.add_argument("--idle", type=int_list,
                        help="idle connection counts (default 1000,10000)")
    parser.add_argument("--targets", type=int, help="targets in the store (default 1,000,000)")
    parser.add_argument("--rebuild-store", action="store_true",
                        help="build the cached store again even if present")
    parser.add_argument("--trace-memory", type=int, default=1000, metavar="N",
                        help="part 2: then N idle connections to a notary under tracemalloc, "
                        "bytes per connection by allocation site (default 1000; 0: skip)")
    args = finish_load_args(parser.parse_args(argv))
    args.parts = [part.strip() for part in args.parts.split(",") if part.strip()]
    if not args.parts or set(args.parts) - set(PARTS):
        parser.error(f"--parts: choose among {', '.join(PARTS)}")
    for name, quick, full in (("connections", [10, 100, 1000], [10, 100, 1000, 10000]),
                              ("idle", [100, 1000], [1000, 10000]),
                              ("targets", 100_000, 1_000_000)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    if args.threads < 1 or min(args.connections) < args.threads:
        parser.error("--threads must be >= 1 and <= every --connections value")
    if args.targets < 10 or args.duration < 1 or args.rounds < 1:
        parser.error("--targets >= 10, --duration >= 1, --rounds >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark("bench_scale", parse_args(argv), run)


def run(args: argparse.Namespace, processes: Processes, directory: Path) -> int:
    wrk = ensure_wrk()
    needed = max([*args.connections, *args.idle]) + CONNECTION_MARGIN + 1000
    wanted = max(NOFILE, needed)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), max(hard, wanted)))
    except (ValueError, OSError):  # not root: up to the hard limit only
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(wanted, hard)), hard))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        raise BenchError(f"RLIMIT_NOFILE is {soft} (hard {hard}): {needed} needed; raise the "
                         "hard limit (ulimit -Hn, or prlimit as root)")
    os.environ.pop("NOTIFY_SOCKET", None)  # no notary here talks to a real manager
    cpus = start_load(
        args, "Scale: concurrent connections, memory per idle connection, start-up with a "
        "large store", wrk, lambda server, client: [
            f"notary pinned to CPU {server}, wrk and this script to CPU {client}; "
            f"RLIMIT_NOFILE {soft}/{hard} (this process, inherited by the notary and wrk; "
            f"{needed:,} needed); parts: {', '.join(args.parts)}"],
        note=f"; SQLite {sqlite3.sqlite_version}, store schema {SCHEMA_VERSION}")
    os.sched_setaffinity(0, {cpus[1]})  # the idle client and the store build
    print()
    for index, part in enumerate(args.parts):
        if index and args.wait_quiet and part != "startup":
            wait_quiet(list(cpus), min(args.wait_quiet, 60.0))
        if part == "connections":
            part_connections(args, processes, directory, wrk, cpus)
        elif part == "idle":
            part_idle(args, processes, directory, cpus)
        else:
            part_startup(args, processes, directory, cpus)
    print(describe_busy(list(cpus), "after the runs"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
