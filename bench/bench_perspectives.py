"""The Perspectives query against a Convergence cache hit (issue 35): one notary (one worker,
dev-init, [rescan] off) asked about its own HTTPS port, a cached answer each time: ``GET
/?host=&port=&service_type=2`` on its Perspectives listener (plain HTTP, as Perspectives
clients ask) and ``POST /target`` on its plain and HTTPS API listeners, the same wrk command,
same run, interleaved rounds; the goal is judged on the median of the rounds' paired ratios
(``harness.runs.paired``).

    .venv/bin/python bench/bench_perspectives.py --wait-quiet 60   # about 2 minutes
    .venv/bin/python bench/bench_perspectives.py --quick           # 2 s runs, one round
"""

from __future__ import annotations

import argparse
import sys
import time
import tomllib
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# Importing harness also puts the project root on sys.path.
from harness.loopback import LOOPBACK, exchange, status_of
from harness.machine import cpu_seconds, describe_busy
from harness.options import finish_load_args, load_parser
from harness.processes import Processes, run_benchmark
from harness.project import BenchError
from harness.report import print_table
from harness.runs import Run, paired, run_rounds, start_load
from harness.runs import best as best_run
from harness.servers import new_notary, start_notary
from harness.tools import ensure_wrk
from harness.wrk import run_wrk, wrk_raw_script, wrk_script

GOAL = 1.0  # the issue: the Perspectives query as fast as a Convergence cache hit (HTTPS)
#: Many short rounds: the machine changes speed within minutes (bench_tls.py's ROUNDS).
ROUNDS, DURATION_S = 5, 5


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = load_parser(__doc__.split("\n\n")[0], rounds=ROUNDS, duration=DURATION_S,
                         cpus="the notary", quick="2 s per run, one round: a smoke run",
                         connections=50)
    return finish_load_args(parser.parse_args(argv))


def run(args: argparse.Namespace, processes: Processes, directory: Path) -> int:
    wrk = ensure_wrk()
    server_cpu, client_cpu = start_load(
        args, "The Perspectives query against a Convergence cache hit (issue 35)", wrk,
        lambda server, client: [f"the notary on CPU {server}, wrk -t{args.threads} "
                                f"-c{args.connections} -d{args.duration}s on CPU {client}; "
                                f"{args.rounds} rounds, every other one reversed"])
    setup = new_notary(directory / "notary", {"rescan": {"enabled": False}})
    notary = start_notary(processes, setup, "notary", cpu=server_cpu,
                          log=directory / "notary.log")
    listen = tomllib.loads(setup.config.read_text())["perspectives"]["listen"][0]
    port = int(listen.rsplit(":", 1)[1])
    query = f"/?host={LOOPBACK}&port={setup.api_port}&service_type=2"
    request = f"GET {query} HTTP/1.1\r\nHost: {LOOPBACK}:{port}\r\n\r\n".encode("ascii")
    for _ in range(50):  # the first question starts the probe (404), then it answers
        answer = exchange(port, request, tls=False)[0]
        if status_of(answer) == 200:
            break
        time.sleep(0.2)
    else:
        raise BenchError(f"no Perspectives answer: {answer[:300]!r}")
    print(f"Perspectives answer: {len(answer):,} bytes; Convergence answer: "
          f"{len(notary.answer):,} bytes\n")
    rows = {  # the goal's two rows next to each other in every round
        "perspectives (plain HTTP)": (f"http://{LOOPBACK}:{port}{query}",
                                      wrk_raw_script(directory, request, name="perspectives")),
        "convergence hit (HTTPS)": (f"https://{LOOPBACK}:{setup.api_port}{setup.path}",
                                    wrk_script(directory, notary.body, name="https")),
        "convergence hit (plain HTTP)": (f"http://{LOOPBACK}:{setup.plain_port}{setup.path}",
                                         wrk_script(directory, notary.body, name="plain")),
    }

    def measure(name: str) -> Run:
        url, script = rows[name]
        result = run_wrk(wrk, processes, url, script, threads=args.threads,
                         connections=args.connections, seconds=args.duration, cpu=client_cpu,
                         server_cpu_seconds=lambda: cpu_seconds(notary.pid),
                         cpus=[server_cpu, client_cpu])
        notary.check_alive()
        return result

    runs = run_rounds(args, list(rows), measure, lambda name, result: (
        f"{name}: {result.rate:,.0f} req/s, server {result.server_us:.1f} us CPU/req, "
        f"server core {result.server_busy:.0%}, client core {result.client_busy:.0%}"),
        key=lambda name: name, quiet_cpus=[server_cpu, client_cpu])
    best = {name: best_run(results) for name, results in runs.items()}
    https = "convergence hit (HTTPS)"
    base = best[https]

    def median_pair(name: str) -> str:
        if name == https:
            return "-"
        pairs = paired(runs[name], runs[https])
        return f"{pairs.rate:.1%} / {1 / pairs.by_cpu:.1%}"

    print_table(["query", "req/s per run", "best req/s", "server CPU us/req",
                 "vs the HTTPS hit: rate / CPU per req (best runs)",
                 "vs the HTTPS hit: rate / CPU per req (median pair)"], [
        [name, " / ".join(f"{r.rate:,.0f}" for r in runs[name]), f"{top.rate:,.0f}",
         f"{top.server_us:.1f}",
         f"{top.rate / base.rate:.1%} / {top.server_us / base.server_us:.1%}", median_pair(name)]
        for name, top in best.items()])
    pairs = paired(runs["perspectives (plain HTTP)"], runs[https])
    print(f"\ngoal: the Perspectives query >= {GOAL:.0%} of a Convergence hit over HTTPS: "
          f"{pairs.rate:.1%} by rate ({pairs.rounds()}), {pairs.by_cpu:.1%} by CPU per request "
          f"(median pair) -> {'met' if pairs.rate >= GOAL else 'NOT met'}; best runs: "
          f"{best['perspectives (plain HTTP)'].rate / base.rate:.1%} by rate")
    print(describe_busy([server_cpu, client_cpu], "after the runs"))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark("bench_perspectives", parse_args(argv), run)


if __name__ == "__main__":
    sys.exit(main())
