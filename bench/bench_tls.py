"""TLS: the notary against nginx and the minimal Trio TLS server, same
certificate and key, same wrk command, same run (issue: scenarios 1 and 2).

Scenario 1: cache hit over HTTPS keep-alive (goal: notary >= 80% of the
minimal Trio TLS server). Scenario 2: one new TLS connection per query, full
handshakes (resumption off everywhere; goal: notary >= 75% of nginx), with
wrk and ``openssl s_time -new``. Set-up, flags and columns: ``bench/README.md``.

    .venv/bin/python bench/bench_tls.py --wait-quiet 120   # about 4 minutes
    .venv/bin/python bench/bench_tls.py --quick            # 2 s runs, one round
"""

from __future__ import annotations

import argparse
import re
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # also puts the project root on sys.path
from harness import LOOPBACK, MINIMAL_SERVER, BenchError, NotarySetup, Processes, Run

GOAL_KEEPALIVE = 0.80  # scenario 1: notary / minimal Trio TLS server
GOAL_HANDSHAKE = 0.75  # scenario 2: notary / nginx, full handshakes

#: ``notary serve`` with TLS session resumption off (scenario 2): the
#: context from ``make_server_ssl_context`` (looked up at call time) issues no
#: session tickets. argv[1:] is the ``serve`` command line.
NOTARY_NO_RESUMPTION = """\
import ssl, sys
import notary.server.app as app
_make = app.make_server_ssl_context
def make_server_ssl_context(config):
    context = _make(config)
    context.options |= ssl.OP_NO_TICKET
    context.num_tickets = 0
    return context
app.make_server_ssl_context = make_server_ssl_context
from notary.cli import main
sys.exit(main(sys.argv[1:]))
"""


@dataclass
class Server:
    key: str
    label: str
    port: int
    process: subprocess.Popen[bytes]
    info_only: bool = False

    def cpu(self) -> float:
        return harness.cpu_seconds(self.process.pid)


# -- servers ---------------------------------------------------------------------


def nginx_versions(nginx: str) -> str:
    result = subprocess.run([nginx, "-V"], capture_output=True, text=True, check=False)
    lines = (result.stderr + result.stdout).splitlines()
    version = lines[0].removeprefix("nginx version: ") if lines else "nginx (unknown)"
    built = next((line for line in lines if line.startswith("built with")), "")
    return f"{version} ({built})" if built else version


def openssl_version(openssl: str) -> str:
    result = subprocess.run([openssl, "version"], capture_output=True, text=True, check=False)
    return f"openssl CLI {result.stdout.strip()}"


def nginx_config(directory: Path, name: str, port: int, setup: NotarySetup, body: bytes,
                 content_type: str, *, resumption: bool, log_reuse: bool = False) -> Path:
    """One nginx in the foreground (no daemon, no master: the process we
    start serves), one location answering ``body`` with ``content_type``,
    the notary's certificate and key, TLS 1.2+."""
    text = body.decode("utf-8")
    if "$" in text:
        raise BenchError("the answer holds '$': nginx would read it as a variable")
    quoted = text.replace("\\", "\\\\").replace("'", "\\'")
    work = directory / name
    work.mkdir(exist_ok=True)
    logging = (f"log_format reuse '$ssl_session_reused $ssl_protocol';\n"
               f"    access_log {work}/access.log reuse;" if log_reuse else "access_log off;")
    sessions = "" if resumption else "ssl_session_tickets off;\n        ssl_session_cache off;"
    config = work / "nginx.conf"
    config.write_text(f"""\
daemon off;
master_process off;
worker_processes 1;
pid {work}/nginx.pid;
error_log {work}/error.log warn;
events {{
    worker_connections 1024;
}}
http {{
    {logging}
    client_body_temp_path {work}/body;
    proxy_temp_path {work}/proxy;
    fastcgi_temp_path {work}/fastcgi;
    uwsgi_temp_path {work}/uwsgi;
    scgi_temp_path {work}/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 75s;
    server {{
        listen {LOOPBACK}:{port} ssl;
        ssl_certificate {setup.cert};
        ssl_certificate_key {setup.key};
        ssl_protocols TLSv1.2 TLSv1.3;
        {sessions}
        location = {setup.path} {{
            default_type {content_type};
            return 200 '{quoted}';
        }}
    }}
}}
""", encoding="utf-8")
    return config


def start_nginx(processes: Processes, nginx: str, config: Path, port: int, label: str,
                cpu: int, key: str = "nginx") -> Server:
    process = harness.start_server(
        processes, label, [nginx, "-p", str(config.parent), "-c", str(config), "-e",
                           str(config.parent / "error.log")], [port], cpu=cpu,
        log=config.parent / "nginx.out")
    return Server(key, label, port, process)


def start_minimal(processes: Processes, directory: Path, setup: NotarySetup, response: bytes,
                  port: int, cpu: int, *, close: bool) -> Server:
    name = "minimal-close" if close else "minimal"
    response_file = directory / f"{name}.bin"
    response_file.write_bytes(response)
    argv = [sys.executable, str(MINIMAL_SERVER), "--port", str(port), "--response",
            str(response_file), "--cert", str(setup.cert), "--key", str(setup.key)]
    if close:
        argv += ["--close", "--no-resumption"]
    process = harness.start_server(processes, name, argv, [port], cpu=cpu,
                                   log=directory / f"{name}.log")
    return Server("minimal", "minimal Trio TLS server", port, process)


def start_notary(processes: Processes, setup: NotarySetup, directory: Path, cpu: int, *,
                 resumption: bool) -> Server:
    argv = harness.notary_argv(setup)
    label = "notary"
    if not resumption:
        argv = [sys.executable, "-c", NOTARY_NO_RESUMPTION, *argv[3:]]  # after "-m notary"
        label = "notary (no session tickets)"
    log = directory / ("notary.log" if resumption else "notary-no-tickets.log")
    process = harness.start_notary(processes, setup, label, cpu=cpu, log=log, argv=argv,
                                   prime=False).process
    return Server("notary", label, setup.api_port, process)


# -- checks ----------------------------------------------------------------------


def read_to_close(port: int, request: bytes) -> bytes:
    """Send ``request`` over TLS, read until the server closes."""
    data = bytearray()
    with harness.connect(port, tls=True, timeout_s=10.0) as sock:
        sock.sendall(request)
        while chunk := sock.recv(65536):
            data += chunk
    return bytes(data)


def check_answer(server: Server, got: bytes, expected: bytes, *, exact: bool) -> str:
    """The same bytes (exact) or the same status, Content-Type and body (nginx);
    returns nginx's head for the report."""
    if exact:
        if got != expected:
            raise BenchError(f"{server.label} does not answer the notary's bytes: {got[:300]!r}")
        return ""
    same = (harness.status_of(got) == harness.status_of(expected)
            and harness.body_of(got) == harness.body_of(expected)
            and harness.header_of(got, "Content-Type") == harness.header_of(expected,
                                                                            "Content-Type"))
    if not same:
        raise BenchError(f"{server.label} answers a different status, type or body: {got[:400]!r}")
    return got.split(b"\r\n\r\n", 1)[0].decode("latin-1").replace("\r\n", " | ")


def tls_session(port: int, request: bytes, *, to_close: bool) -> tuple[str, bool]:
    """(protocol and cipher, resumed?) of a second connection offering the
    session (and any ticket) the first one got: resumption possible? The
    answer is read to the server's close (``to_close``) or by its length."""
    context = harness.client_tls_context()

    def once(session: ssl.SSLSession | None) -> tuple[ssl.SSLSession | None, bool, str]:
        with socket.create_connection((LOOPBACK, port), timeout=10.0) as raw, \
                context.wrap_socket(raw, session=session) as sock:
            cipher = sock.cipher()
            protocol = f"{sock.version()} {cipher[0] if cipher else '?'}"
            sock.sendall(request)  # TLS 1.3 tickets arrive while the answer is read
            if to_close:
                while sock.recv(65536):
                    pass
            else:
                harness.read_response(sock, bytearray())
            return sock.session, sock.session_reused, protocol

    session, _, protocol = once(None)
    _, reused, _ = once(session)
    return protocol, reused


def wrk_resumption(wrk: str, processes: Processes, nginx: str, directory: Path,
                   setup: NotarySetup, body: bytes, content_type: str, cpu: int,
                   client_cpu: int, *, resumption: bool) -> tuple[int, int]:
    """(resumed, connections) in a 1 s wrk run of scenario 2's client
    against an nginx logging ``$ssl_session_reused``."""
    port = harness.free_ports(1)[0]
    name = "nginx-check-" + ("default" if resumption else "off")
    config = nginx_config(directory, name, port, setup, body, content_type,
                          resumption=resumption, log_reuse=True)
    server = start_nginx(processes, nginx, config, port, name, cpu)
    try:
        script = harness.wrk_raw_script(directory, request_10(port, setup), name=name)
        harness.run_wrk(wrk, processes, f"https://{LOOPBACK}:{port}{setup.path}", script,
                        threads=1, connections=4, seconds=1, cpu=client_cpu)
    finally:
        processes.stop(server.process)
    lines = (config.parent / "access.log").read_text().splitlines()
    return sum(line.startswith("r ") for line in lines), len(lines)


def request_10(port: int, setup: NotarySetup) -> bytes:
    body = (setup.directory / "bench-body.txt").read_text()
    return harness.post_request(port, setup.path, body, version="1.0")


# -- measurement -----------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    wrk: str
    openssl: str
    args: argparse.Namespace
    server_cpu: int
    client_cpu: int


def measure_wrk(plan: Plan, processes: Processes, server: Server, path: str,
                script: Path) -> Run:
    return harness.run_wrk(
        plan.wrk, processes, f"https://{LOOPBACK}:{server.port}{path}", script,
        threads=plan.args.threads, connections=plan.args.connections,
        seconds=plan.args.duration, cpu=plan.client_cpu, allow_errors=True,
        server_cpu_seconds=server.cpu, cpus=(plan.server_cpu, plan.client_cpu))


def measure_s_time(plan: Plan, processes: Processes, server: Server) -> Run:
    """``--s-time-clients`` ``openssl s_time -new`` at once (each one
    handshake at a time), all on the client core: full handshakes per second."""
    seconds = plan.args.duration
    argv = [plan.openssl, "s_time", "-connect", f"{LOOPBACK}:{server.port}", "-new",
            "-time", str(seconds)]
    meter = harness.Meter(server.cpu, (plan.server_cpu, plan.client_cpu))
    started = time.monotonic()
    clients = [processes.start("s_time", argv, cpu=plan.client_cpu)
               for _ in range(plan.args.s_time_clients)]
    outputs = []
    try:
        for client in clients:
            try:
                out, err = client.communicate(timeout=seconds + 30)
            except subprocess.TimeoutExpired:
                raise BenchError(f"openssl s_time did not finish ({server.label})") from None
            outputs.append((client.returncode, out.decode(errors="replace")
                            + err.decode(errors="replace")))
    finally:
        for client in clients:
            processes.stop(client)
    elapsed = time.monotonic() - started
    count = 0
    for returncode, text in outputs:
        found = re.search(r"(\d+) connections in [\d.]+s;", text)
        if returncode != 0 or found is None or not int(found.group(1)):
            raise BenchError(f"openssl s_time against {server.label} failed ({returncode}):\n"
                             f"{text[-2000:]}")
        count += int(found.group(1))
    return meter.run(count / elapsed, count)


def run_rounds(plan: Plan, processes: Processes, servers: Sequence[Server],
               measure: Callable[[Server], Run], what: str) -> dict[str, list[Run]]:
    def checked(server: Server) -> Run:
        if server.process.poll() is not None:
            raise BenchError(f"{server.label} exited ({server.process.returncode})")
        return measure(server)

    def progress(server: Server, run: Run) -> str:
        latency = (f", p50 {harness.format_us(run.latency_us.get('p50'))} p99.9 "
                   f"{harness.format_us(run.latency_us.get('p99.9'))}" if run.latency_us else "")
        errors = f", errors {run.errors}" if run.errors else ""
        return (f"{what} {server.label}: {run.rate:,.0f}/s, server {run.server_us:,.1f} us CPU "
                f"each, {run.server_core:.0%} of a core (its core {run.server_busy:.0%} busy), "
                f"client {run.client_core:.0%} (its core {run.client_busy:.0%} busy), other "
                f"load {run.other_cores:.2f} cores{latency}{errors}")

    return harness.run_rounds(plan.args, servers, checked, progress)


# -- report ----------------------------------------------------------------------


def print_report(servers: Sequence[Server], runs: dict[str, list[Run]], unit: str,
                 each: str, client: str, peak_rss: dict[str, int | None]) -> dict[str, Run]:
    best = {key: harness.best(results) for key, results in runs.items()}
    notary = best["notary"].rate
    rows = []
    for server in servers:
        results, top = runs[server.key], best[server.key]
        latency = top.latency_us
        rows.append([
            server.label + (" (information)" if server.info_only else ""),
            " / ".join(f"{r.rate:,.0f}{'*' if r.warnings() else ''}" for r in results),
            f"{top.rate:,.0f}" + (" *" if top.warnings() else ""),
            " / ".join(harness.format_us(latency.get(p)) for p in ("p50", "p99", "p99.9"))
            if latency else "-",
            ", ".join(f"{k} {v}" for k, v in top.errors.items()) or "0",
            f"{top.server_us:,.1f}",
            f"{top.server_core:.0%} / {top.server_busy:.0%}",
            f"{top.client_core:.0%} / {top.client_busy:.0%}",
            f"{top.other_cores:.2f}",
            f"{peak_rss[server.key] / 2**20:.1f} MiB" if peak_rss.get(server.key) else "?",
            "1.00" if server.key == "notary" else f"{notary / top.rate:.2f}",
        ])
    harness.print_table(
        ["server", f"{unit} per run (* flagged)", f"best {unit}",
         "latency p50 / p99 / p99.9 (best)", "errors (best)", f"server CPU us per {each}",
         "server: process / core busy", f"{client}: process / core busy", "other load (cores)",
         "server peak RSS",
         "notary / this"],
        rows,
    )
    return best


def verdict(name: str, ours: Run, theirs: Run, goal: float) -> str:
    """The goal judged twice: by the measured rates, and by the servers'
    CPU time per request (the rate each would reach with its core to itself:
    the figure to use when a run is flagged, e.g. when wrk was the limit)."""
    ratio = ours.rate / theirs.rate
    cpu = theirs.server_us / ours.server_us if ours.server_us else 0.0
    trust = ("" if not (ours.warnings() or theirs.warnings())
             else " (flagged runs: see the warnings)")
    return (f"goal: notary >= {goal:.0%} of {name}: by rate {ratio:.1%} ({ours.rate:,.0f} / "
            f"{theirs.rate:,.0f}) -> {'met' if ratio >= goal else 'NOT met'}{trust}; by server "
            f"CPU per request {cpu:.1%} ({theirs.server_us:,.1f} / {ours.server_us:,.1f} us, "
            f"i.e. {1e6 / ours.server_us:,.0f} vs {1e6 / theirs.server_us:,.0f} per core-second)"
            f" -> {'met' if cpu >= goal else 'NOT met'}")


# -- main ------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = harness.load_parser(
        __doc__.split("\n\n")[0], rounds=2,
        quick="2 s per run, one round: a smoke run, not a measurement",
        wait_quiet=", and up to min(SECONDS, 30) before scenario 2")
    parser.add_argument("--s-time-clients", type=int, default=16,
                        help="openssl s_time processes at once (default 16)")
    parser.add_argument("--scenario", choices=["1", "2", "all"], default="all")
    args = harness.finish_load_args(parser.parse_args(argv))
    if args.duration < 1 or args.rounds < 1 or args.connections < args.threads:
        parser.error("--duration and --rounds >= 1, --connections >= --threads")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return harness.run_benchmark("bench_tls", parse_args(argv), run)


def run(args: argparse.Namespace, processes: Processes, directory: Path) -> int:
    wrk = harness.ensure_wrk()
    nginx = harness.ensure_tool("nginx")
    openssl = harness.ensure_tool("openssl")
    server_cpu, client_cpu = harness.start_load(
        args, "TLS: the notary vs nginx and the minimal Trio TLS server "
        "(cache hit, same certificate and key)", wrk, lambda server, client: [
            f"versions: {nginx_versions(nginx)}; {openssl_version(openssl)}; "
            f"{harness.wrk_version(wrk)}",
            f"wrk -t{args.threads} -c{args.connections} -d{args.duration}s --latency on CPU "
            f"{client}; every server alone on CPU {server}; {args.rounds} interleaved "
            f"run(s) per server, best unflagged kept; s_time: {args.s_time_clients} processes "
            f"x -time {args.duration}"])
    plan = Plan(wrk, openssl, args, server_cpu, client_cpu)
    cpus = [server_cpu, client_cpu]

    api_port, relay_port, plain_port, minimal_port, nginx_port, *spare = harness.free_ports(9)
    setup = harness.make_notary(directory / "notary", api_port, relay_port, plain_port, spare)
    print(f"certificate: {describe_certificate(setup.cert)}")
    notary = start_notary(processes, setup, directory, server_cpu, resumption=True)
    body = f"fingerprint={harness.served_sha1_pin(api_port)}"
    (setup.directory / "bench-body.txt").write_text(body)
    answer = harness.prime_notary(setup, body)
    content_type = harness.header_of(answer, "Content-Type") or "application/json"
    print(f"query: POST {setup.path}, body {body}; answer {len(answer)} bytes "
          f"({len(harness.body_of(answer))} body, {content_type})")
    print()

    if args.scenario in ("1", "all"):
        scenario_keepalive(plan, processes, directory, setup, notary, answer, content_type,
                           body, nginx, minimal_port, nginx_port)
    processes.stop(notary.process)
    if args.scenario in ("2", "all"):
        if args.wait_quiet and args.scenario == "all":
            harness.wait_quiet(cpus, min(args.wait_quiet, 30.0))
        scenario_handshakes(plan, processes, directory, setup, content_type, nginx,
                            minimal_port, nginx_port)
    print(harness.describe_busy(cpus, "after the runs (servers stopped)"))
    for name in ("notary.log", "notary-no-tickets.log"):
        text = harness.tail(directory / name)
        if text.strip() and text != "(no log)":
            print(f"{name} (warnings and errors):\n{text}\n")
    return 0


def rsa_sign_us(openssl: str, processes: Processes, cpu: int) -> str:
    """What one RSA-2048 signature (the server's share of a full handshake
    with this key) costs on ``cpu``: ``openssl speed``, for reading scenario 2."""
    process = processes.start("openssl speed", [openssl, "speed", "-seconds", "1", "rsa2048"],
                              cpu=cpu)
    try:
        out, _ = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        return "openssl speed did not finish"
    finally:
        processes.stop(process)
    found = re.search(rb"rsa 2048 bits\s+([\d.]+)s\s+([\d.]+)s", out)
    if found is None:
        return "openssl speed rsa2048: no figure"
    return (f"one RSA-2048 signature costs {float(found.group(1)) * 1e6:,.0f} us on CPU {cpu} "
            f"(openssl speed; a verification {float(found.group(2)) * 1e6:,.0f} us)")


def describe_certificate(path: Path) -> str:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    key = x509.load_pem_x509_certificate(path.read_bytes()).public_key()
    if isinstance(key, rsa.RSAPublicKey):
        return f"RSA {key.key_size} (the notary's dev-init key, used by every server)"
    if isinstance(key, ec.EllipticCurvePublicKey):
        return f"EC {key.curve.name} (the notary's dev-init key, used by every server)"
    return type(key).__name__


def scenario_keepalive(plan: Plan, processes: Processes, directory: Path, setup: NotarySetup,
                       notary: Server, answer: bytes, content_type: str, body: str, nginx: str,
                       minimal_port: int, nginx_port: int) -> None:
    print("## Scenario 1: cache hit, HTTPS keep-alive, POST /target")
    minimal = start_minimal(processes, directory, setup, answer, minimal_port, plan.server_cpu,
                            close=False)
    config = nginx_config(directory, "nginx-keepalive", nginx_port, setup,
                          harness.body_of(answer), content_type, resumption=True)
    web = start_nginx(processes, nginx, config, nginx_port, "nginx", plan.server_cpu)
    servers = [notary, minimal, web]
    for server in servers:
        got = harness.exchange(server.port, harness.post_request(server.port, setup.path, body),
                               tls=True, count=2)
        head = ""
        for response in got:
            head = check_answer(server, response, answer, exact=server.key != "nginx")
        if head:
            ours = answer.split(b"\r\n\r\n", 1)[0].decode().replace("\r\n", " | ")
            print(f"nginx's head: {head} (the notary's: {ours})")
    for server in servers:
        protocol, reused = tls_session(server.port, harness.post_request(
            server.port, setup.path, body), to_close=False)
        print(f"  {server.label}: {protocol}, session resumption "
              f"{'possible' if reused else 'not offered'} (Python client)")
    script = harness.wrk_script(directory, body, name="keepalive")
    runs = run_rounds(plan, processes, servers,
                      lambda server: measure_wrk(plan, processes, server, setup.path, script),
                      "wrk keep-alive")
    peak = {s.key: harness.proc_status(s.process.pid).get("VmHWM") for s in servers}
    print()
    best = print_report(servers, runs, "req/s", "request", "wrk", peak)
    print(verdict("the minimal Trio TLS server", best["notary"], best["minimal"],
                  GOAL_KEEPALIVE))
    print(f"notary / nginx: {best['notary'].rate / best['nginx'].rate:.1%} of its req/s, "
          f"{best['nginx'].server_us / best['notary'].server_us:.1%} by server CPU per request")
    print()
    processes.stop(minimal.process)
    processes.stop(web.process)


def scenario_handshakes(plan: Plan, processes: Processes, directory: Path, setup: NotarySetup,
                        content_type: str, nginx: str, minimal_port: int,
                        nginx_port: int) -> None:
    print("## Scenario 2: cache hit, one new TLS connection per query (HTTP/1.0, server closes)")
    body = (setup.directory / "bench-body.txt").read_text()
    print(rsa_sign_us(plan.openssl, processes, plan.server_cpu))
    notary = start_notary(processes, setup, directory, plan.server_cpu, resumption=False)
    harness.prime_notary(setup, body)
    answer = read_to_close(setup.api_port, request_10(setup.api_port, setup))
    if harness.header_of(answer, "Connection") != "close" or harness.status_of(answer) != 200:
        raise BenchError(f"the notary's HTTP/1.0 answer: {answer[:300]!r}")

    resumed, total = wrk_resumption(plan.wrk, processes, nginx, directory, setup,
                                    harness.body_of(answer), content_type, plan.server_cpu,
                                    plan.client_cpu, resumption=True)
    print(f"wrk's reconnections against nginx with its default session settings: {resumed} of "
          f"{total} resumed a TLS session" + (": so resumption is off on every server below"
                                              if resumed else ""))
    resumed, total = wrk_resumption(plan.wrk, processes, nginx, directory, setup,
                                    harness.body_of(answer), content_type, plan.server_cpu,
                                    plan.client_cpu, resumption=False)
    print(f"... with ssl_session_tickets off and ssl_session_cache off: {resumed} of {total}")
    if resumed:
        raise BenchError("wrk still resumes sessions with nginx's resumption off")

    minimal = start_minimal(processes, directory, setup, answer, minimal_port, plan.server_cpu,
                            close=True)
    minimal.info_only = True
    config = nginx_config(directory, "nginx-handshakes", nginx_port, setup,
                          harness.body_of(answer), content_type, resumption=False)
    web = start_nginx(processes, nginx, config, nginx_port, "nginx", plan.server_cpu)
    servers = [notary, web, minimal]
    scripts = {}
    for server in servers:
        request = request_10(server.port, setup)
        got = read_to_close(server.port, request)
        head = check_answer(server, got, answer, exact=server.key != "nginx")
        if server.key == "nginx" and harness.header_of(got, "Connection") != "close":
            raise BenchError(f"nginx did not close: {head}")
        protocol, reused = tls_session(server.port, request, to_close=True)
        print(f"  {server.label}: {protocol}; a second connection offering the first one's "
              f"session {'RESUMED it' if reused else 'made a full handshake'} (Python client)")
        if reused:
            raise BenchError(f"{server.label} resumes TLS sessions: not a full-handshake run")
        scripts[server.key] = harness.wrk_raw_script(directory, request,
                                                     name=f"close-{server.key}")
    runs = run_rounds(plan, processes, servers,
                      lambda server: measure_wrk(plan, processes, server, setup.path,
                                                 scripts[server.key]),
                      "wrk new connection per query")
    s_time_runs = run_rounds(plan, processes, servers,
                             lambda server: measure_s_time(plan, processes, server),
                             "openssl s_time -new")
    peak = {s.key: harness.proc_status(s.process.pid).get("VmHWM") for s in servers}
    print()
    print("wrk, one query per TLS connection (wrk's latency leaves the handshake out):")
    print()
    best = print_report(servers, runs, "req/s", "connection", "wrk", peak)
    print(f"openssl s_time -new -time {plan.args.duration} x {plan.args.s_time_clients} "
          "processes (handshake only, no HTTP):")
    print()
    best_s_time = print_report(servers, s_time_runs, "handshakes/s", "handshake", "s_time",
                               peak)
    print(verdict("nginx (wrk, full handshake + query)", best["notary"], best["nginx"],
                  GOAL_HANDSHAKE))
    print(verdict("nginx (openssl s_time, handshakes)", best_s_time["notary"],
                  best_s_time["nginx"], GOAL_HANDSHAKE))
    print(f"information: notary / minimal Trio TLS server: "
          f"{best['notary'].rate / best['minimal'].rate:.1%} (wrk), "
          f"{best_s_time['notary'].rate / best_s_time['minimal'].rate:.1%} (s_time)")
    print()
    for server in servers:
        processes.stop(server.process)


if __name__ == "__main__":
    sys.exit(main())
