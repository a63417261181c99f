"""The v2 API: cache-hit targets per second through ``POST /v2/query`` (batches of 1, 10
and 100) and over one WebSocket, against legacy ``POST /target`` in the same run
(set-up, checks and columns: ``bench/README.md``).

    .venv/bin/python bench/bench_v2.py            # about 3 minutes
    .venv/bin/python bench/bench_v2.py --quick    # 2 s per run, one round: a smoke run
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# Importing harness also puts the project root on sys.path.
from harness.loopback import LOOPBACK, connect, free_ports
from harness.machine import cpu_seconds, describe_busy
from harness.options import finish_load_args, load_parser
from harness.processes import Processes, run_benchmark, tail
from harness.project import BenchError
from harness.report import print_table
from harness.runs import Meter, Run, run_rounds, start_load
from harness.runs import best as best_run
from harness.servers import make_notary, start_notary
from harness.tools import ensure_wrk
from harness.v2requests import JSON_TYPE, add_api_ports, https, query_body
from harness.wrk import run_wrk, wrk_script

from notary.protocol import v2

BATCHES = (1, 10, 100)
NONCE = "bench-v2"

#: The WebSocket client, run as ``python -c WS_CLIENT URL BODY WINDOW SECONDS``:
#: one connection, ``WINDOW`` queries outstanding, each one ``BODY`` (a /v2/query
#: body: targets and nonce); prints a JSON line with the counts and the first answer.
WS_CLIENT = r"""
import json, ssl, sys, time
import trio, trio_websocket

url, body, window, seconds = sys.argv[1:5]
query = json.loads(body)

def message(n):
    return json.dumps({"type": "query", "id": n, **query})

async def main():
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    async with trio_websocket.open_websocket_url(
        url, context, max_message_size=16 << 20, receive_buffer_size=65536
    ) as ws:
        await ws.send_message(message(0))
        first = await ws.get_message()
        for sent in range(1, int(window) + 1):
            await ws.send_message(message(sent))
        received, started = 0, time.monotonic()
        end = started + float(seconds)
        while received < sent:
            text = await ws.get_message()
            received += 1
            if not text.endswith(',"id":%d,"type":"answer"}' % received):
                print(json.dumps({"error": "unexpected message: " + text[:300]}))
                return
            if time.monotonic() < end:
                sent += 1
                await ws.send_message(message(sent))
        print(json.dumps({"messages": received, "seconds": time.monotonic() - started,
                          "first": first}))

trio.run(main)
"""


def verify(answer: bytes, body: str, keys: dict[str, object], label: str) -> str:
    """Check ``answer`` (to the request ``body``) with ``verify_answer``; a summary."""
    queries = v2.parse_query_request(body.encode(), max_batch=10_000, max_body_bytes=1 << 24)
    parsed = v2.parse_answer_document(answer)
    results = v2.verify_answer(parsed, keys, nonce=NONCE, now=int(time.time()),  # type: ignore[arg-type]
                               queries=queries.targets, max_answer_age_s=300)
    verdicts = {r.verdict for r in results}
    if verdicts != {v2.VERDICT_MATCH}:
        raise BenchError(f"{label}: verdicts {verdicts}, expected only match")
    return f"{label}: {len(results)} results verified (envelope, statements, nonce, order, match)"


def measure_ws(processes: Processes, url: str, body: str,
               args: argparse.Namespace, client_cpu: int, notary_pid: int) -> tuple[Run, str]:
    """One ``WS_CLIENT`` run sending ``body``: its run (the notary's CPU over the whole
    client run, connect and first query included) and its first answer message."""
    argv = [sys.executable, "-c", WS_CLIENT, url, body, str(args.window), str(args.duration)]
    meter = Meter(lambda: cpu_seconds(notary_pid))
    process = processes.start("ws client", argv, cpu=client_cpu)
    try:
        out, err = process.communicate(timeout=args.duration + 60)
    except subprocess.TimeoutExpired:
        raise BenchError(f"the WebSocket client did not finish ({url})") from None
    finally:
        processes.stop(process)
    text = out.decode(errors="replace").strip()
    if process.returncode != 0 or not text:
        raise BenchError(f"WebSocket client exited {process.returncode}:\n{text}\n"
                         f"{err.decode(errors='replace')[-3000:]}")
    report = json.loads(text.splitlines()[-1])
    if "error" in report:
        raise BenchError(f"WebSocket client: {report['error']}")
    return meter.run(report["messages"] / report["seconds"], report["messages"]), report["first"]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = load_parser(__doc__.split("\n\n")[0], rounds=2, cpus="the notary",
                         quick="2 s per run, one round: a smoke run, not a measurement")
    parser.add_argument("--window", type=int, default=16,
                        help="WebSocket queries outstanding (default 16; the send queue is 64)")
    parser.add_argument("--targets", type=int, default=4,
                        help="distinct cache-hit targets (the notary's API ports, default 4)")
    args = finish_load_args(parser.parse_args(argv))
    if args.targets < 2:
        parser.error("--targets must be at least 2 (the dev config has two API ports)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark("bench_v2", parse_args(argv), run)


def run(args: argparse.Namespace, processes: Processes, directory: Path) -> int:
    wrk = ensure_wrk()
    server_cpu, client_cpu = start_load(
        args, "v2 API: cache-hit targets per second, /v2/query and WebSocket vs legacy "
        "POST /target", wrk, lambda server, client: [
            f"wrk: -t{args.threads} -c{args.connections} -d{args.duration}s; WebSocket: one "
            f"connection, window {args.window}; clients pinned to CPU {client}, notary to CPU "
            f"{server}; {args.rounds} run(s) per row, best kept; {args.targets} distinct "
            "targets in the batches"])
    ports = free_ports(args.targets + 6)
    api_ports, plain_port, spare = ports[:args.targets], ports[args.targets], ports[args.targets + 1:]
    setup = make_notary(directory / "notary", api_ports[0], api_ports[1], plain_port, spare)
    add_api_ports(setup.config, api_ports[2:])
    # Primes the legacy query; the extra API ports listen too (all bound before any accepts).
    notary = start_notary(processes, setup, "notary", cpu=server_cpu,
                          log=directory / "notary.log")
    with connect(api_ports[0], tls=True, timeout_s=10.0) as sock:
        sha256 = hashlib.sha256(sock.getpeercert(binary_form=True)).hexdigest()

    # v2: prime every target once, then check the answers are all cache-hit matches.
    https(api_ports[0], "POST", "/v2/query", query_body(api_ports, sha256, len(api_ports),
                                                      nonce=NONCE))
    keys = {key.key_id: key.public_key()
            for key in v2.parse_key_document(https(api_ports[0], "GET", "/v2/key"))}
    bodies = {n: query_body(api_ports, sha256, n, nonce=NONCE) for n in BATCHES}
    answers = {n: https(api_ports[0], "POST", "/v2/query", bodies[n]) for n in BATCHES}
    largest = max(BATCHES)
    print(verify(answers[largest], bodies[largest], keys, f"/v2/query batch {largest}"))
    print(f"legacy: POST {setup.path}, body {notary.body}: {len(notary.answer)} bytes answered")
    for n in BATCHES:
        print(f"v2 batch {n}: request body {len(bodies[n]):,} bytes, answer "
              f"{len(answers[n]):,} bytes")
    print(flush=True)

    # wrk's URL and script for each wrk row; the WebSocket rows have none.
    base = f"https://{LOOPBACK}:{api_ports[0]}"
    wrk_runs = {"legacy": (base + setup.path, wrk_script(directory, notary.body,
                                                                  name="legacy"))}
    wrk_runs |= {f"v2-{n}": (base + "/v2/query", wrk_script(
        directory, bodies[n], name=f"v2-{n}", content_type=JSON_TYPE)) for n in BATCHES}
    rows: list[tuple[str, str, int]] = [("legacy", "legacy POST /target (1 target/request)", 1)]
    rows += [(f"v2-{n}", f"POST /v2/query, batch {n}", n) for n in BATCHES]
    rows += [(f"ws-{n}", f"WebSocket query, batch {n}", n) for n in BATCHES]
    verified_ws = False

    def measure(row: tuple[str, str, int]) -> Run:
        nonlocal verified_ws
        key, _, n = row
        if key in wrk_runs:
            url, script = wrk_runs[key]
            result = run_wrk(
                wrk, processes, url, script, threads=args.threads, connections=args.connections,
                seconds=args.duration, cpu=client_cpu,
                server_cpu_seconds=lambda: cpu_seconds(notary.pid))
        else:
            result, first = measure_ws(processes, f"wss://{LOOPBACK}:{api_ports[0]}/v2/ws",
                                       bodies[n], args, client_cpu, notary.pid)
            if not verified_ws and n == largest:
                message = json.loads(first)
                if message.get("type") != "answer" or message.get("id") != 0:
                    raise BenchError(f"first WebSocket message: {first[:300]}")
                answer = json.dumps(message["answer"]).encode()
                print("  " + verify(answer, bodies[n], keys, f"WebSocket batch {n}"))
                verified_ws = True
        notary.check_alive()
        return result

    runs = run_rounds(args, rows, measure, lambda row, result: (
        f"{row[1]}: {result.rate:,.0f} req/s, {result.rate * row[2]:,.0f} targets/s, server "
        f"{result.server_us:.0f} us CPU/req, {result.server_core:.0%} of its core, client "
        f"{result.client_core:.0%} of its core"), key=lambda row: row[0])
    print()
    best = {key: best_run(results) for key, results in runs.items()}
    table = []
    for key, label, batch in rows:
        top = best[key]
        table.append([label, " / ".join(f"{r.rate:,.0f}" for r in runs[key]), f"{top.rate:,.0f}",
                      f"{top.rate * batch:,.0f}", f"{top.rate * batch / best['legacy'].rate:.2f}",
                      f"{top.server_us:,.0f}", f"{top.server_us / batch:,.1f}",
                      f"{top.server_core:.0%}", f"{top.client_core:.0%}"])
    print_table(
        ["transport", "req/s per run", "best req/s", "targets/s", "targets/s vs legacy",
         "server CPU us/req", "server CPU us/target", "server core use", "client core use"],
        table)
    print(describe_busy([server_cpu, client_cpu], "after the runs (notary idle)"))
    problems = tail(notary.log)
    if problems.strip():
        print(f"notary log (warnings and errors):\n{problems}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
