"""TLS at the edge: the notary behind nginx (TLS terminated by nginx's ``stream`` module, each
connection passed to the notary's plain API listener after a PROXY v1 header) against nginx
alone answering the same bytes, same certificate and key, same wrk, same run: a cache hit,
keep-alive and one connection per query (``wrk -H 'Connection: close'``, TLS sessions resumed
as wrk resumes them). Server CPU per request: the notary's and the edge's together. The
notary with its own TLS, and its plain listener asked directly (no TLS: the notary's share of
the edge topology alone on the core), are measured beside them (information). bench/README.md,
docs/edge.md.

    .venv/bin/python bench/bench_edge.py --wait-quiet 120   # about 3 minutes
    .venv/bin/python bench/bench_edge.py --quick            # 2 s runs, one round
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# Importing harness also puts the project root on sys.path.
from harness.loopback import (
    LOOPBACK,
    body_of,
    exchange,
    free_ports,
    get_metrics,
    header_of,
    post_request,
    status_of,
)
from harness.machine import cpu_seconds, describe_busy
from harness.options import finish_load_args, load_parser
from harness.processes import Processes, run_benchmark, tail
from harness.project import BenchError
from harness.report import format_us, print_table
from harness.runs import Run, best, run_rounds, start_load
from harness.servers import (
    NotarySetup,
    new_notary,
    nginx_answer_block,
    nginx_stream_module,
    start_nginx,
    start_notary,
)
from harness.tools import ensure_tool, ensure_wrk, wrk_version
from harness.wrk import run_wrk, wrk_script

#: The edge's own address towards the notary (nginx ``proxy_bind``), the one
#: ``[server] proxy_protocol_from`` trusts: the set-up checks, from 127.0.0.1,
#: are served as direct clients.
EDGE_ADDRESS = "127.0.0.2"
#: wrk -c for one connection per query (the keep-alive runs use --connections).
CLOSE_CONNECTIONS = 20
SCENARIOS = {
    "keep-alive": ("cache hit, HTTPS keep-alive, POST /target", ()),
    "close": ("cache hit, one TLS connection per query (Connection: close; sessions resumed)",
              ("-H", "Connection: close")),
}


@dataclass
class Server:
    """A topology measured: who answers on ``port``, and the processes whose CPU is its cost."""

    key: str
    label: str
    port: int
    processes: Sequence[subprocess.Popen[bytes]]
    names: Sequence[str]
    info_only: bool = False
    scheme: str = "https"
    #: CPU seconds of each process over each run, by the run's id.
    splits: dict[int, list[float]] = field(default_factory=dict)

    def cpu_each(self) -> list[float]:
        return [cpu_seconds(process.pid) for process in self.processes]

    def cpu(self) -> float:
        return sum(self.cpu_each())


def edge_block(port: int, setup: NotarySetup) -> str:
    """nginx's ``stream`` server: TLS on ``port`` with the notary's certificate and key, each
    connection to the notary's plain listener from ``EDGE_ADDRESS``, a PROXY header first."""
    return f"""stream {{
    server {{
        listen {LOOPBACK}:{port} ssl;
        ssl_certificate {setup.cert};
        ssl_certificate_key {setup.key};
        ssl_protocols TLSv1.2 TLSv1.3;
        proxy_pass {LOOPBACK}:{setup.plain_port};
        proxy_bind {EDGE_ADDRESS};
        proxy_protocol on;
    }}
}}
"""


def check_answers(servers: Sequence[Server], setup: NotarySetup, body: str,
                  answer: bytes) -> None:
    """Through the edge, the notary's exact bytes; from nginx alone, the same status,
    Content-Type and body; with ``Connection: close``, answers that say so."""
    for server in servers:
        request = post_request(server.port, setup.path, body)
        closing = request.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1)
        for got in [*exchange(server.port, request, tls=True, count=2),
                    *exchange(server.port, closing, tls=True)]:
            same = (got == answer if server.key != "nginx" else all(
                part(got) == part(answer) for part in (status_of, content_type, body_of)))
            if not same and header_of(got, "Connection") != "close":
                raise BenchError(f"{server.label} answers {got[:400]!r}, not {answer[:400]!r}")
        if header_of(got, "Connection") != "close" or status_of(got) != 200:
            raise BenchError(f"{server.label} does not close after Connection: close: {got!r}")


def content_type(response: bytes) -> str:
    return header_of(response, "Content-Type") or "?"


def proxy_refused(setup: NotarySetup) -> float:
    """The notary's connections refused for their PROXY header (its ``/metrics``)."""
    if setup.admin_port is None:
        raise BenchError("the notary has no admin listener")
    samples = dict(get_metrics(setup.admin_port))
    return samples.get('notary_http_proxy_refused_connections_total{listener="plain_api"}', -1.0)


def measure(args: argparse.Namespace, processes: Processes, wrk: str, script: Path,
            extra: Sequence[str], cpus: tuple[int, int], server: Server) -> Run:
    before = server.cpu_each()
    connections = args.connections if not extra else min(args.connections, CLOSE_CONNECTIONS)
    run = run_wrk(wrk, processes, f"{server.scheme}://{LOOPBACK}:{server.port}{args.path}", script,
                  threads=args.threads, connections=connections, seconds=args.duration,
                  cpu=cpus[1], allow_errors=True, server_cpu_seconds=server.cpu, cpus=cpus,
                  extra=extra)
    server.splits[id(run)] = [now - then for now, then in zip(server.cpu_each(), before,
                                                              strict=True)]
    return run


def report(servers: Sequence[Server], runs: dict[str, list[Run]]) -> dict[str, Run]:
    top = {key: best(results) for key, results in runs.items()}
    rows = []
    for server in servers:
        run = top[server.key]
        split = " + ".join(f"{name} {seconds / run.count * 1e6:,.1f}"
                           for name, seconds in zip(server.names, server.splits[id(run)],
                                                    strict=True))
        rows.append([
            server.label + (" (information)" if server.info_only else ""),
            " / ".join(f"{r.rate:,.0f}{'*' if r.warnings() else ''}" for r in runs[server.key]),
            f"{run.rate:,.0f}" + (" *" if run.warnings() else ""),
            " / ".join(format_us(run.latency_us.get(p)) for p in ("p50", "p99"))
            if run.latency_us else "-",
            ", ".join(f"{k} {v}" for k, v in run.errors.items()) or "0",
            f"{run.server_us:,.1f}" + (f" ({split})" if len(server.names) > 1 else ""),
            f"{run.server_busy:.0%}" if run.server_busy is not None else "?",
            f"{run.client_core:.0%} / {run.client_busy:.0%}" if run.client_busy is not None
            else "?",
            f"{run.other_cores:.2f}",
            f"{run.rate / top['nginx'].rate:.2f} / {top['nginx'].server_us / run.server_us:.2f}"
            if run.server_us else "?",
        ])
    print_table(["topology", "req/s per run (* flagged)", "best req/s", "latency p50 / p99",
                 "errors", "server CPU us per request", "server core busy",
                 "wrk: process / core busy", "other load (cores)",
                 "vs nginx alone: rate / CPU"], rows)
    return top


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = load_parser(__doc__.split("\n\n")[0], rounds=2, connections=50,
                         quick="2 s per run, one round: a smoke run, not a measurement")
    parser.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="all")
    args = finish_load_args(parser.parse_args(argv))
    if args.duration < 1 or args.rounds < 1 or args.connections < args.threads:
        parser.error("--duration and --rounds >= 1, --connections >= --threads")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark("bench_edge", parse_args(argv), run)


def run(args: argparse.Namespace, processes: Processes, directory: Path) -> int:
    wrk, nginx = ensure_wrk(), ensure_tool("nginx")
    stream_module = nginx_stream_module(nginx)
    version = subprocess.run([nginx, "-v"], capture_output=True, text=True, check=False)
    cpus = start_load(
        args, "TLS at the edge: the notary behind nginx (PROXY protocol) vs nginx alone "
        "(cache hit, same certificate and key)", wrk, lambda server, client: [
            f"versions: {version.stderr.strip()}; {wrk_version(wrk)}",
            f"wrk -t{args.threads} -c{args.connections} (Connection: close: "
            f"-c{min(args.connections, CLOSE_CONNECTIONS)}) -d{args.duration}s --latency on "
            f"CPU {client}; every server on CPU {server} (the edge: notary and nginx both); "
            f"{args.rounds} interleaved run(s) per topology, best unflagged kept"])
    setup = new_notary(directory / "notary",
                       {"server": {"proxy_protocol_from": (f"{EDGE_ADDRESS}/32",)}})
    notary = start_notary(processes, setup, "notary", cpu=cpus[0], log=directory / "notary.log")
    args.path = setup.path
    edge_port, alone_port = free_ports(2)
    edge = start_nginx(processes, nginx, directory / "nginx-edge", edge_block(edge_port, setup),
                       [edge_port], cpu=cpus[0], top=stream_module)
    alone = start_nginx(processes, nginx, directory / "nginx-alone",
                        nginx_answer_block(alone_port, setup, notary.answer,
                                           directory / "nginx-alone"), [alone_port], cpu=cpus[0])
    servers = [
        Server("edge", "notary behind nginx (PROXY v1)", edge_port, [notary.process, edge],
               ["notary", "nginx"]),
        Server("nginx", "nginx alone", alone_port, [alone], ["nginx"]),
        Server("notary", "notary, its own TLS", setup.api_port, [notary.process], ["notary"],
               info_only=True),
    ]
    check_answers(servers, setup, notary.body, notary.answer)
    # The notary's share of the edge's work alone on the core: its plain listener, asked
    # directly (from 127.0.0.1: a client, not the edge).
    servers.append(Server("plain", "notary, plain HTTP (no TLS)", setup.plain_port,
                          [notary.process], ["notary"], info_only=True, scheme="http"))
    refused_before = proxy_refused(setup)
    print(f"query: POST {setup.path}, body {notary.body}; answer {len(notary.answer)} bytes; "
          f"through the edge: the notary's exact bytes; PROXY headers refused so far: "
          f"{refused_before:.0f}\n")
    for name in ([*SCENARIOS] if args.scenario == "all" else [args.scenario]):
        title, extra = SCENARIOS[name]
        print(f"## {name}: {title}")
        script = wrk_script(directory, notary.body, name=name)

        def progress(server: Server, run: Run, name: str = name) -> str:
            return (f"{name} {server.label}: {run.rate:,.0f}/s, server {run.server_us:,.1f} us "
                    f"CPU each (its core {run.server_busy:.0%} busy), wrk's core "
                    f"{run.client_busy:.0%} busy, other load {run.other_cores:.2f} cores"
                    + (f", errors {run.errors}" if run.errors else ""))

        runs = run_rounds(args, servers, lambda server, script=script, extra=extra: measure(
            args, processes, wrk, script, extra, cpus, server), progress, quiet_cpus=cpus)
        print()
        top = report(servers, runs)
        edge_run, nginx_run = top["edge"], top["nginx"]
        print(f"the edge topology / nginx alone: {edge_run.rate / nginx_run.rate:.1%} of its "
              f"req/s, {nginx_run.server_us / edge_run.server_us:.1%} by server CPU per request "
              f"({edge_run.server_us:,.1f} vs {nginx_run.server_us:,.1f} us); notary behind "
              f"nginx / notary with its own TLS: {edge_run.rate / top['notary'].rate:.1%} of its "
              f"req/s, {top['notary'].server_us / edge_run.server_us:.1%} by CPU per request\n")
    refused = proxy_refused(setup) - refused_before
    if refused:
        raise BenchError(f"the notary refused {refused:.0f} of the edge's PROXY headers")
    print(describe_busy(list(cpus), "after the runs"))
    text = tail(directory / "notary.log")
    if text.strip() and text != "(no log)":
        print(f"notary.log (warnings and errors):\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
