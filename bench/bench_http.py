"""End to end: cache-hit Convergence ``POST /target/<host>+<port>`` requests
per second, measured with wrk over HTTP/1.1 keep-alive, against a minimal
Trio server that returns the same bytes (the ceiling), in the same run.

Rows (a) to (f), and what ``--profile`` shows: ``bench/README.md``.

    .venv/bin/python bench/bench_http.py            # about 2 minutes
    .venv/bin/python bench/bench_http.py --quick    # 2 s per run: a smoke run
    .venv/bin/python bench/bench_http.py --profile cprofile   # plus a profile
"""

from __future__ import annotations

import argparse
import contextlib
import pstats
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness.loopback import LOOPBACK, exchange, free_ports, post_request
from harness.machine import cpu_seconds, describe_busy
from harness.options import finish_load_args, load_parser
from harness.processes import Processes, run_benchmark, tail
from harness.project import BenchError
from harness.report import print_table, short_path
from harness.runs import Run, run_rounds, start_load
from harness.runs import best as best_run
from harness.servers import (
    MINIMAL_SERVER,
    RunningNotary,
    new_notary,
    notary_argv,
    start_notary,
    start_server,
)
from harness.tools import ensure_wrk
from harness.wrk import run_wrk, wrk_script

GOAL = 0.80  # the issue: notary plain keep-alive >= 80% of the minimal Trio server
ROW_ORDER = "cabdef"  # each round's runs and the table's rows


def wrk_run(wrk: str, processes: Processes, url: str, script: Path, args: argparse.Namespace,
            cpu: int, server_pid: int | None = None) -> Run:
    """This script's wrk run: ``--threads``, ``--connections``, ``--duration``."""
    return run_wrk(
        wrk, processes, url, script, threads=args.threads, connections=args.connections,
        seconds=args.duration, cpu=cpu,
        server_cpu_seconds=(lambda: cpu_seconds(server_pid)) if server_pid else None)


def url(port: int, path: str, *, tls: bool) -> str:
    return f"{'https' if tls else 'http'}://{LOOPBACK}:{port}{path}"


@dataclass(frozen=True)
class Target:
    key: str
    label: str
    url: str
    pid: int  # the server process
    script: Path  # the wrk script

    @property
    def ceiling(self) -> str:
        """The row it is compared with on the same transport."""
        return "d" if self.url.startswith("https:") else "c"


def report(targets: Sequence[Target], runs: dict[str, list[Run]]) -> float:
    best = {key: best_run(results) for key, results in runs.items()}
    cpu = {key: min((r.server_us for r in results if r.server_us), default=0.0)
           for key, results in runs.items()}
    base = best["c"].rate
    rows = []
    for target in targets:
        top = best[target.key]
        rows.append([
            f"({target.key}) {target.label}",
            *(f"{r.rate:,.0f}" for r in runs[target.key]),
            f"{top.rate:,.0f}",
            f"{top.rate / base:.2f}",
            f"{top.rate / best[target.ceiling].rate:.2f} vs ({target.ceiling})",
            f"{cpu[target.key]:.1f}",
            f"{top.server_core:.0%}" if top.server_core is not None else "?",
            f"{top.latency_avg} / {top.latency_p99}",
        ])
    run_headers = [f"run {i + 1} req/s" for i in range(max(len(r) for r in runs.values()))]
    print_table(
        ["server", *run_headers, "best req/s", "vs (c)", "vs its ceiling",
         "server CPU us/req (min)", "server core use (best)", "latency avg / p99 (best)"], rows)
    ratio = best["a"].rate / base
    print(f"goal: notary plain HTTP keep-alive >= {GOAL:.0%} of the minimal Trio server: "
          f"{ratio:.1%} ({best['a'].rate:,.0f} / {base:,.0f} req/s) -> "
          f"{'met' if ratio >= GOAL else 'NOT met'}")
    if cpu["a"] and cpu["c"]:
        print(f"cross-check by server CPU time per request (less sensitive to other load): "
              f"minimal {cpu['c']:.1f} us / notary {cpu['a']:.1f} us = {cpu['c'] / cpu['a']:.1%}")
    if "f" in best:
        print(f"per-client limits on: {best['f'].rate / best['a'].rate:.1%} "
              f"of the notary's rate without (loopback exempt); server CPU "
              f"{cpu['f']:.1f} vs {cpu['a']:.1f} us/req")
    print(f"notary HTTPS: {best['b'].rate / best['d'].rate:.1%} of the "
          f"minimal Trio TLS server, {best['b'].rate / best['a'].rate:.1%} "
          "of the notary over plain HTTP")
    print()
    return ratio


def profile_notary(wrk: str, processes: Processes, notary: RunningNotary, script: Path,
                   args: argparse.Namespace, server_cpu: int, client_cpu: int) -> None:
    """Restart the notary under ``args.profile`` (cProfile or py-spy: bench/README.md)
    and print where its time goes while wrk loads it over plain HTTP."""
    setup = notary.setup
    stats_path, raw = setup.directory / "notary.prof", setup.directory / "py-spy.txt"
    log = setup.directory / "notary-profiled.log"
    cprofile = args.profile == "cprofile"
    local_py_spy = Path(sys.executable).parent / "py-spy"
    py_spy = str(local_py_spy) if local_py_spy.exists() else shutil.which("py-spy")
    if not cprofile and py_spy is None:
        raise BenchError("--profile py-spy: py-spy not found (.venv/bin/python -m pip install py-spy)")
    processes.stop(notary.process)
    argv = notary_argv(setup, profile_out=stats_path if cprofile else None)
    restarted = start_notary(processes, setup, "notary (profiled)", cpu=server_cpu,
                             log=log, argv=argv)
    if restarted.answer != notary.answer:
        raise BenchError("the restarted notary answers different bytes")
    profiled = restarted.process
    plain_url = url(setup.plain_port, setup.path, tls=False)
    print(f"## Profile of the notary under load, plain HTTP keep-alive ({args.profile}, "
          f"{args.duration} s)")
    if cprofile:
        profiled.send_signal(signal.SIGUSR1)
        result = wrk_run(wrk, processes, plain_url, script, args, client_cpu)
        profiled.send_signal(signal.SIGUSR2)
        deadline = time.monotonic() + 30
        while not stats_path.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)  # let dump_stats finish writing
        processes.stop(profiled)
        if not stats_path.exists():
            raise BenchError(f"the profiled notary wrote no stats:\n{tail(log)}")
        print_cprofile(stats_path, result, args.top)
        return
    sampler = processes.start(
        "py-spy", [py_spy, "record", "--pid", str(profiled.pid), "--duration",
                   str(max(1, args.duration - 2)), "--rate", "500", "--format", "raw",
                   "--function", "--output", str(raw)],
        cpu=client_cpu, log=setup.directory / "py-spy.log")
    result = wrk_run(wrk, processes, plain_url, script, args, client_cpu)
    with contextlib.suppress(subprocess.TimeoutExpired):
        sampler.wait(30)
    processes.stop(sampler)
    processes.stop(profiled)
    if not raw.exists():
        raise BenchError(f"py-spy wrote nothing:\n{tail(setup.directory / 'py-spy.log')}")
    print_py_spy(raw, result, args.top)


def print_cprofile(stats_path: Path, result: Run, top: int) -> None:
    table = pstats.Stats(str(stats_path)).stats  # type: ignore[attr-defined]
    requests = result.count
    total_s = sum(entry[2] for entry in table.values())
    print(f"{requests:,} requests at {result.rate:,.0f} req/s under cProfile "
          f"(its overhead inflates every time; read calls per request and shares); "
          f"{total_s / requests * 1e6:.1f} us profiled per request.")
    print()
    entries = sorted(table.items(), key=lambda item: item[1][2], reverse=True)
    rows = [[f"{short_path(filename)}:{line}({name})", f"{calls / requests:.2f}",
             f"{tottime / requests * 1e6:.2f}", f"{tottime / total_s:.1%}",
             f"{cumtime / requests * 1e6:.2f}"]
            for (filename, line, name), (_cc, calls, tottime, cumtime, _callers) in entries[:top]]
    print_table(["function (by own time)", "calls/req", "own us/req", "own share",
                 "cumulative us/req"], rows)


def print_py_spy(raw: Path, result: Run, top: int) -> None:
    """Own and inclusive shares of the event loop thread's samples, and
    microseconds per request (share x 1/rate: that thread is pinned to one
    core and saturated). Samples of other threads (Trio's idle worker threads,
    which py-spy fails to recognise as idle) are counted apart."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    other_threads = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        if stack.startswith("Thread._bootstrap"):
            other_threads += int(count_text)
            continue
        # "func (path/to/file.py)" -> "func (package/file.py)"
        frames = [f"{name} ({short_path(where.rstrip(')'))})" if where else name
                  for name, _, where in (frame.partition(" (") for frame in stack.split(";"))]
        own[frames[-1]] += int(count_text)
        inclusive.update(dict.fromkeys(frames, int(count_text)))
    total = own.total()
    if not total:
        raise BenchError("py-spy recorded no samples")
    per_request_us = 1e6 / result.rate
    print(f"{total:,} samples of the event loop thread ({other_threads:,} of other threads left "
          f"out); {result.rate:,.0f} req/s while sampled, so {per_request_us:.1f} us "
          "of one core per request (us/req = share x that).")
    print()
    for title, counts in (("own time", own), ("inclusive time", inclusive)):
        print_table([f"function ({title})", "share", "us/req"], [
            [frame, f"{count / total:.1%}", f"{count / total * per_request_us:.2f}"]
            for frame, count in counts.most_common(top)])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = load_parser(__doc__.split("\n\n")[0], rounds=2,
                         quick="2 s per run instead of 10: a smoke run, not a measurement")
    parser.add_argument("--no-limits-row", action="store_true",
                        help="skip (f), the notary with per-client limits on")
    parser.add_argument("--no-httptools-row", action="store_true",
                        help="skip (e), the minimal server parsing with httptools")
    parser.add_argument("--profile", choices=["cprofile", "py-spy"],
                        help="then profile the notary under load (plain HTTP): cProfile "
                        "(calls per request) or py-spy (truer shares; pip install it)")
    parser.add_argument("--top", type=int, default=30, help="profile rows to print")
    return finish_load_args(parser.parse_args(argv), quick_rounds=2)


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark("bench_http", parse_args(argv), run)


#: Row (f): every per-client limit applies to the loopback load client (no client exempt:
#: an empty tuple, as the config reads it back), with rates and caps it never reaches.
LIMITS_ON: dict[str, dict[str, object]] = {"limits": {
    "exempt_clients": (), "queries_per_s_per_prefix": 10**9, "query_burst": 10**9,
    "max_connections_per_address": 4096, "max_connections_per_prefix": 4096}}


def run(args: argparse.Namespace, processes: Processes, directory: Path) -> int:
    wrk = ensure_wrk()
    server_cpu, client_cpu = start_load(
        args, "End to end: cache-hit POST /target requests per second (wrk)", wrk,
        lambda server, client: [
            f"wrk: -t{args.threads} -c{args.connections} -d{args.duration}s, pinned to CPU "
            f"{client}; each server pinned to CPU {server}; {args.rounds} runs per target"])
    setup = new_notary(directory / "notary")
    log = directory / "notary.log"
    notary = start_notary(processes, setup, "notary", cpu=server_cpu, log=log)
    body, answer = notary.body, notary.answer
    response_file = directory / "response.bin"
    response_file.write_bytes(answer)
    head = answer.split(b"\r\n\r\n", 1)[0].decode("ascii").replace("\r\n", " | ")
    print(f"query: POST {setup.path} (the notary's own HTTPS port), body {body}")
    print(f"answer: {len(answer)} bytes, {head}\n")

    script = wrk_script(directory, body)
    targets = {key: Target(key, label, url(port, setup.path, tls=tls), notary.pid, script)
               for key, label, port, tls in (("a", "notary, plain HTTP", setup.plain_port, False),
                                            ("b", "notary, HTTPS", setup.api_port, True))}
    minimal = [sys.executable, str(MINIMAL_SERVER), "--response", str(response_file)]
    tls_files = ["--cert", str(setup.cert), "--key", str(setup.key)]
    minimal_rows = [("c", "minimal Trio server, plain HTTP (ceiling)", [], False),
                    ("d", "minimal Trio server, TLS (HTTPS ceiling)", tls_files, True)]
    if not args.no_httptools_row:
        minimal_rows.append(("e", "minimal Trio server + httptools parser, plain",
                             ["--parser", "httptools"], False))
    for key, label, options, tls in minimal_rows:
        port = free_ports(1)[0]
        pid = start_server(processes, f"({key}) {label}", [
            *minimal, "--port", str(port), *options], [port], cpu=server_cpu,
            log=directory / f"minimal-{key}.log").pid
        got = exchange(port, post_request(port, setup.path, body), tls=tls,
                       count=2)
        if got != [answer, answer]:
            raise BenchError(f"({key}) {label} does not answer the notary's bytes: {got!r}")
        targets[key] = Target(key, label, url(port, setup.path, tls=tls), pid, script)
    if not args.no_limits_row:
        limited_setup = new_notary(directory / "limited", LIMITS_ON)
        limited = start_notary(processes, limited_setup, "notary (limits on)",
                               cpu=server_cpu, log=directory / "limited" / "notary.log")
        targets["f"] = Target(
            "f", "notary, plain HTTP, per-client limits on (loopback not exempt)",
            url(limited_setup.plain_port, limited_setup.path, tls=False), limited.pid,
            wrk_script(directory, limited.body, name="limited"))

    def measure(target: Target) -> Run:
        result = wrk_run(wrk, processes, target.url, target.script, args, client_cpu, target.pid)
        notary.check_alive()
        return result

    rows = [targets[key] for key in ROW_ORDER if key in targets]
    runs = run_rounds(args, rows, measure, lambda target, result: (
        f"({target.key}) {target.label}: {result.rate:,.0f} req/s, server "
        f"{result.server_us:.1f} us CPU/req, {result.server_core:.0%} of its core, wrk "
        f"{result.client_core:.0%} of its core"))
    print()
    ratio = report(rows, runs)
    print(describe_busy([server_cpu, client_cpu], "after the runs (servers idle)"))
    problems = tail(log)
    if problems.strip():
        print(f"notary log (warnings and errors):\n{problems}\n")
    if args.profile:
        profile_notary(wrk, processes, notary, script, args, server_cpu, client_cpu)
    elif ratio < GOAL:
        print("the goal is not met: run with --profile cprofile (or py-spy) to see where "
              "the notary's time goes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
