"""End to end: cache-hit Convergence ``POST /target/<host>+<port>`` requests
per second, measured with wrk over HTTP/1.1 keep-alive, against a minimal
Trio server that returns the same bytes (the ceiling), in the same run.

Rows (c) minimal server, (a) notary plain HTTP, (b) notary HTTPS, (d)
minimal server over TLS, (e) minimal server with httptools, (f) notary with
per-client limits on; ``--profile`` then profiles the notary. Details:
``bench/README.md``.

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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness
from harness import (
    LOOPBACK,
    MINIMAL_SERVER,
    BenchError,
    NotarySetup,
    Processes,
    Run,
    describe_busy,
    exchange,
    post_request,
    prime_notary,
    print_table,
    tail,
)

GOAL = 0.80  # the issue: notary plain keep-alive >= 80% of the minimal Trio server


def wrk_run(wrk: str, processes: Processes, url: str, script: Path, args: argparse.Namespace,
            cpu: int, server_pid: int | None = None) -> Run:
    """This script's wrk run: ``--threads``, ``--connections``, ``--duration``."""
    return harness.run_wrk(
        wrk, processes, url, script, threads=args.threads, connections=args.connections,
        seconds=args.duration, cpu=cpu,
        server_cpu_seconds=(lambda: harness.cpu_seconds(server_pid)) if server_pid else None,
    )


# -- report ----------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    key: str
    label: str
    port: int
    tls: bool
    ceiling: str  # key of the row it is compared with on the same transport
    pid: int  # the server process
    path: str = ""  # the query's path, when not the first notary's
    script: Path | None = None  # the wrk script, when not the first notary's


def report(targets: Sequence[Target], runs: dict[str, list[Run]]) -> float:
    best = {key: harness.best(results) for key, results in runs.items()}
    cpu = {key: min((r.server_us for r in results if r.server_us), default=0.0)
           for key, results in runs.items()}
    base = best["c"].rate
    rows = []
    for target in targets:
        results = runs[target.key]
        top = best[target.key]
        same = best[target.ceiling].rate
        rows.append([
            f"({target.key}) {target.label}",
            *(f"{r.rate:,.0f}" for r in results),
            f"{top.rate:,.0f}",
            f"{top.rate / base:.2f}",
            f"{top.rate / same:.2f} vs ({target.ceiling})",
            f"{cpu[target.key]:.1f}",
            f"{top.server_core:.0%}" if top.server_core is not None else "?",
            f"{top.latency_avg} / {top.latency_p99}",
        ])
    run_headers = [f"run {i + 1} req/s" for i in range(max(len(r) for r in runs.values()))]
    print_table(
        ["server", *run_headers, "best req/s", "vs (c)", "vs its ceiling",
         "server CPU us/req (min)", "server core use (best)", "latency avg / p99 (best)"],
        rows,
    )
    ratio = best["a"].rate / base
    verdict = "met" if ratio >= GOAL else "NOT met"
    print(f"goal: notary plain HTTP keep-alive >= {GOAL:.0%} of the minimal Trio server: "
          f"{ratio:.1%} ({best['a'].rate:,.0f} / {base:,.0f} req/s) -> {verdict}")
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


# -- profile ---------------------------------------------------------------------


def find_py_spy() -> str | None:
    local = Path(sys.executable).parent / "py-spy"
    return str(local) if local.exists() else shutil.which("py-spy")


def profile_notary(
    wrk: str, processes: Processes, setup: NotarySetup, body: str, script: Path,
    args: argparse.Namespace, server_cpu: int, client_cpu: int, expected: bytes,
) -> None:
    """Restart the notary, load it over plain HTTP with wrk, and profile it
    while wrk runs: cProfile (in-process, deterministic: exact calls per
    request, inflated times) or py-spy (samples from outside, pausing the
    process briefly for each: truer shares, no call counts)."""
    stats_path = setup.directory / "notary.prof"
    log = setup.directory / "notary-profiled.log"
    cprofile = args.profile == "cprofile"
    py_spy = None if cprofile else find_py_spy()
    if not cprofile and py_spy is None:
        raise BenchError("--profile py-spy: py-spy not found (.venv/bin/python -m pip install py-spy)")
    argv = harness.notary_argv(setup, profile_out=stats_path if cprofile else None)
    notary = harness.start_notary(processes, setup, "notary (profiled)", cpu=server_cpu,
                                  log=log, argv=argv, prime=False).process
    if prime_notary(setup, body) != expected:
        raise BenchError("the restarted notary answers different bytes")
    url = f"http://{LOOPBACK}:{setup.plain_port}{setup.path}"
    print(f"## Profile of the notary under load, plain HTTP keep-alive ({args.profile}, "
          f"{args.duration} s)")
    if cprofile:
        notary.send_signal(signal.SIGUSR1)
        result = wrk_run(wrk, processes, url, script, args, client_cpu)
        notary.send_signal(signal.SIGUSR2)
        deadline = time.monotonic() + 30
        while not stats_path.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)  # let dump_stats finish writing
        processes.stop(notary)
        if not stats_path.exists():
            raise BenchError(f"the profiled notary wrote no stats:\n{tail(log)}")
        print_cprofile(stats_path, result, args.top)
    else:
        raw = setup.directory / "py-spy.txt"
        seconds = max(1, args.duration - 2)
        sampler = processes.start(
            "py-spy",
            [py_spy, "record", "--pid", str(notary.pid), "--duration", str(seconds),
             "--rate", "500", "--format", "raw", "--function",
             "--output", str(raw)],
            cpu=client_cpu, log=setup.directory / "py-spy.log",
        )
        result = wrk_run(wrk, processes, url, script, args, client_cpu)
        with contextlib.suppress(subprocess.TimeoutExpired):
            sampler.wait(30)
        processes.stop(sampler)
        processes.stop(notary)
        if not raw.exists():
            raise BenchError(f"py-spy wrote nothing:\n{tail(setup.directory / 'py-spy.log')}")
        print_py_spy(raw, result, args.top)


def print_cprofile(stats_path: Path, result: Run, top: int) -> None:
    stats = pstats.Stats(str(stats_path))
    table = stats.stats  # type: ignore[attr-defined]
    requests = result.count
    total_s = sum(entry[2] for entry in table.values())
    print(f"{requests:,} requests at {result.rate:,.0f} req/s under cProfile "
          f"(its overhead inflates every time; read calls per request and shares); "
          f"{total_s / requests * 1e6:.1f} us profiled per request.")
    print()
    rows = []
    entries = sorted(table.items(), key=lambda item: item[1][2], reverse=True)
    for (filename, line, name), (_cc, calls, tottime, cumtime, _callers) in entries[:top]:
        rows.append([
            f"{harness.short_path(filename)}:{line}({name})",
            f"{calls / requests:.2f}",
            f"{tottime / requests * 1e6:.2f}",
            f"{tottime / total_s:.1%}",
            f"{cumtime / requests * 1e6:.2f}",
        ])
    print_table(["function (by own time)", "calls/req", "own us/req", "own share",
                 "cumulative us/req"], rows)


def print_py_spy(raw: Path, result: Run, top: int) -> None:
    """Own and inclusive shares of the event loop thread's samples, and
    microseconds per request (share x 1/rate: that thread is pinned to one
    core and saturated). Samples of other threads (Trio's idle worker threads,
    which py-spy fails to recognise as idle) are counted apart."""
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = other_threads = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        if stack.startswith("Thread._bootstrap"):
            other_threads += count
            continue
        total += count
        frames = [short_frame(frame) for frame in stack.split(";")]
        own[frames[-1]] = own.get(frames[-1], 0) + count
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + count
    if not total:
        raise BenchError("py-spy recorded no samples")
    per_request_us = 1e6 / result.rate
    print(f"{total:,} samples of the event loop thread ({other_threads:,} of other threads left "
          f"out); {result.rate:,.0f} req/s while sampled, so {per_request_us:.1f} us "
          "of one core per request (us/req = share x that).")
    print()
    for title, counts in (("own time", own), ("inclusive time", inclusive)):
        rows = [
            [frame, f"{count / total:.1%}", f"{count / total * per_request_us:.2f}"]
            for frame, count in sorted(counts.items(), key=lambda kv: kv[1], reverse=True)[:top]
        ]
        print_table([f"function ({title})", "share", "us/req"], rows)


def short_frame(frame: str) -> str:
    """``func (path/to/file.py)`` -> ``func (package/file.py)``."""
    name, _, where = frame.partition(" (")
    return f"{name} ({harness.short_path(where.rstrip(')'))})" if where else name


# -- main ------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = harness.load_parser(__doc__.split("\n\n")[0], rounds=2,
                                 quick="2 s per run instead of 10: a smoke run, not a measurement")
    parser.add_argument("--no-limits-row", action="store_true",
                        help="skip (f), the notary with per-client limits on")
    parser.add_argument("--no-httptools-row", action="store_true",
                        help="skip (e), the minimal server parsing with httptools")
    parser.add_argument("--profile", choices=["cprofile", "py-spy"],
                        help="then profile the notary under load (plain HTTP): cProfile "
                        "(calls per request) or py-spy (truer shares; pip install it)")
    parser.add_argument("--top", type=int, default=30, help="profile rows to print")
    return harness.finish_load_args(parser.parse_args(argv), quick_rounds=2)


def main(argv: Sequence[str] | None = None) -> int:
    return harness.run_benchmark("bench_http", parse_args(argv), run)


#: Row (f): every per-client limit applies to the loopback load client, with
#: rates and caps it never reaches: what a limited client's query costs.
LIMITS_ON = """
[limits]
exempt_clients = []
queries_per_s_per_prefix = 1000000000
query_burst = 1000000000
max_connections_per_address = 4096
max_connections_per_prefix = 4096
"""


def start_limited_notary(processes: Processes, directory: Path, ports: Sequence[int],
                         server_cpu: int) -> harness.RunningNotary:
    """A second notary like the first, with ``LIMITS_ON``, primed."""
    setup = harness.new_notary(directory, ports=ports)
    setup.config.write_text(setup.config.read_text() + LIMITS_ON)
    return harness.start_notary(processes, setup, "notary (limits on)", cpu=server_cpu,
                                log=directory / "notary.log")


def run(args: argparse.Namespace, processes: Processes, directory: Path) -> int:
    wrk = harness.ensure_wrk()
    server_cpu, client_cpu = harness.start_load(
        args, "End to end: cache-hit POST /target requests per second (wrk)", wrk,
        lambda server, client: [
            f"wrk: -t{args.threads} -c{args.connections} -d{args.duration}s, pinned to CPU "
            f"{client}; each server pinned to CPU {server}; {args.rounds} runs per target"])
    ports = harness.free_ports(10)
    limited_ports = harness.free_ports(7)
    api_port, relay_api_port, plain_port, min_port, min_tls_port, min_httptools_port = ports[:6]

    setup = harness.new_notary(directory / "notary", ports=[api_port, relay_api_port, plain_port,
                                                             *ports[6:]])
    log = directory / "notary.log"
    running = harness.start_notary(processes, setup, "notary", cpu=server_cpu, log=log)
    notary, body, answer = running.process, running.body, running.answer
    response_file = directory / "response.bin"
    response_file.write_bytes(answer)
    head = answer.split(b"\r\n\r\n", 1)[0].decode("ascii").replace("\r\n", " | ")
    print(f"query: POST {setup.path} (the notary's own HTTPS port), body {body}")
    print(f"answer: {len(answer)} bytes, {head}")
    print()

    cert, key = setup.cert, setup.key
    minimal = [sys.executable, str(MINIMAL_SERVER), "--response", str(response_file)]
    servers = [
        ("minimal", [*minimal, "--port", str(min_port)], min_port, False),
        ("minimal TLS", [*minimal, "--port", str(min_tls_port), "--cert", str(cert),
                         "--key", str(key)], min_tls_port, True),
    ]
    if not args.no_httptools_row:
        servers.append(("minimal httptools",
                        [*minimal, "--port", str(min_httptools_port), "--parser", "httptools"],
                        min_httptools_port, False))
    pids = {"notary": notary.pid}
    for name, argv, port, tls in servers:
        pids[name] = harness.start_server(processes, name, argv, [port], cpu=server_cpu,
                                          log=directory / f"{name.replace(' ', '-')}.log").pid
        got = exchange(port, post_request(port, setup.path, body), tls=tls, count=2)
        if got != [answer, answer]:
            raise BenchError(f"{name} does not answer the notary's bytes: {got!r}")

    script = harness.wrk_script(directory, body)
    limited = None
    if not args.no_limits_row:
        limited = start_limited_notary(processes, directory / "limited", limited_ports,
                                       server_cpu)

    targets = [
        Target("c", "minimal Trio server, plain HTTP (ceiling)", min_port, False, "c",
               pids["minimal"]),
        Target("a", "notary, plain HTTP", plain_port, False, "c", pids["notary"]),
        Target("b", "notary, HTTPS", api_port, True, "d", pids["notary"]),
        Target("d", "minimal Trio server, TLS (HTTPS ceiling)", min_tls_port, True, "d",
               pids["minimal TLS"]),
    ]
    if not args.no_httptools_row:
        targets.append(Target("e", "minimal Trio server + httptools parser, plain",
                              min_httptools_port, False, "c", pids["minimal httptools"]))
    if limited is not None:
        targets.append(Target(
            "f", "notary, plain HTTP, per-client limits on (loopback not exempt)",
            limited.setup.plain_port, False, "c", limited.pid, limited.setup.path,
            harness.wrk_script(directory, limited.body, name="limited")))
    def measure(target: Target) -> Run:
        scheme = "https" if target.tls else "http"
        url = f"{scheme}://{LOOPBACK}:{target.port}{target.path or setup.path}"
        result = wrk_run(wrk, processes, url, target.script or script, args, client_cpu,
                         target.pid)
        running.check_alive()
        return result

    runs = harness.run_rounds(args, targets, measure, lambda target, result: (
        f"({target.key}) {target.label}: {result.rate:,.0f} req/s, server "
        f"{result.server_us:.1f} us CPU/req, {result.server_core:.0%} of its core, wrk "
        f"{result.client_core:.0%} of its core"))
    print()
    ratio = report(targets, runs)
    print(describe_busy([server_cpu, client_cpu], "after the runs (servers idle)"))
    problems = tail(log)
    if problems.strip():
        print(f"notary log (warnings and errors):\n{problems}\n")
    if args.profile:
        processes.stop(notary)
        profile_notary(wrk, processes, setup, body, script, args, server_cpu, client_cpu, answer)
    elif ratio < GOAL:
        print("the goal is not met: run with --profile cprofile (or py-spy) to see where "
              "the notary's time goes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
