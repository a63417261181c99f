"""End to end: cache-hit Convergence ``POST /target/<host>+<port>`` requests
per second, measured with wrk over HTTP/1.1 keep-alive, against a minimal
Trio server that returns the same bytes (the ceiling), in the same run.

What runs (loopback only, every server pinned to one core, wrk to another):

- (c) ``bench/minimal_server.py``, plain HTTP: reads requests by byte
  scanning (head end + Content-Length), answers each with the exact bytes the
  notary returned for the query, nothing else: the ceiling.
- (a) the notary over its plain-HTTP API listener (``[server] plain_api``).
- (b) the notary over its HTTPS API listener (``[server] api``).
- (d) the minimal server over TLS (the notary's key, certificate and TLS
  settings): the HTTPS ceiling.
- (e) the minimal server parsing with httptools (what the notary parses
  with): shows the parser's own share of the gap. Information only.

Set-up: a fresh notary made by ``notary dev-init`` in a temporary directory,
its config adjusted (plain_api added, relay off, log_level warning). The
target is the notary itself (``127.0.0.1+<its HTTPS port>``, allowed by the
dev config), asked with its own SHA-1 pin: one priming POST makes it probe
and cache the answer, then every query is a cache hit answered 200. Each
target is measured twice, interleaved (round 1: c a b d e, round 2: same),
and the better run is used for the ratios.

``--profile cprofile`` then restarts the notary under cProfile (enabled by
SIGUSR1, dumped by SIGUSR2, only while wrk runs) and prints where the time
goes per request over plain HTTP, with calls per request; ``--profile py-spy``
samples it from outside instead (``.venv/bin/python -m pip install py-spy``):
truer shares, turned into microseconds per request.

wrk comes from ``.ci/install-tools bench`` (apt-get), run by this script when
``wrk`` is missing. Every process this script starts is stopped on every exit
path.

    .venv/bin/python bench/bench_http.py            # about 2 minutes
    .venv/bin/python bench/bench_http.py --quick    # 2 s per run: a smoke run
    .venv/bin/python bench/bench_http.py --profile cprofile   # plus a profile
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import platform
import pstats
import re
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MINIMAL_SERVER = ROOT / "bench" / "minimal_server.py"
INSTALL_TOOLS = ROOT / ".ci" / "install-tools"
LOOPBACK = "127.0.0.1"
GOAL = 0.80  # the issue: notary plain keep-alive >= 80% of the minimal Trio server
READY_TIMEOUT_S = 30.0
PRIME_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
CONTENT_TYPE = "application/x-www-form-urlencoded"

#: cProfile wrapper for the notary process: SIGUSR1 starts profiling, SIGUSR2
#: stops it and writes the stats to argv[1]; the rest of argv is the notary's.
PROFILE_WRAPPER = """\
import cProfile, signal, sys
out = sys.argv[1]
profile = cProfile.Profile()
def start(*_):
    profile.enable()
def dump(*_):
    profile.disable()
    profile.dump_stats(out)
signal.signal(signal.SIGUSR1, start)
signal.signal(signal.SIGUSR2, dump)
from notary.cli import main
sys.exit(main(sys.argv[2:]))
"""


class BenchError(Exception):
    """The benchmark cannot give a valid figure: say why and stop."""


# -- processes -------------------------------------------------------------------


class Processes:
    """Every subprocess started here; ``stop_all`` ends them (SIGTERM, then SIGKILL)."""

    def __init__(self) -> None:
        self._running: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(
        self, name: str, argv: Sequence[str], *, cpu: int | None, log: Path | None = None,
        cwd: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        def pin() -> None:
            if cpu is not None:
                os.sched_setaffinity(0, {cpu})

        out = log.open("wb") if log is not None else subprocess.PIPE
        try:
            process = subprocess.Popen(
                argv, cwd=cwd, env=project_env(), stdout=out,
                stderr=subprocess.STDOUT if log else subprocess.PIPE,
                stdin=subprocess.DEVNULL, preexec_fn=pin, start_new_session=True,
            )
        finally:
            if log is not None:
                out.close()
        self._running.append((name, process))
        return process

    def stop(self, process: subprocess.Popen[bytes]) -> None:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._running = [(n, p) for n, p in self._running if p is not process]

    def stop_all(self) -> None:
        for _, process in reversed(self._running):
            with contextlib.suppress(Exception):
                if process.poll() is None:
                    process.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for _, process in self._running:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._running.clear()


def _raise_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


# -- machine and tools -----------------------------------------------------------


def ensure_wrk() -> str:
    """The path of wrk, installing it with the project's script if missing."""
    wrk = shutil.which("wrk")
    if wrk is None:
        print(f"wrk not found: running {INSTALL_TOOLS.relative_to(ROOT)} bench", flush=True)
        try:
            status = subprocess.run(["bash", str(INSTALL_TOOLS), "bench"], check=False).returncode
        except OSError as exc:
            status = f"not run: {exc}"
        wrk = shutil.which("wrk")
        if wrk is None:
            raise BenchError(
                f"wrk is not available after `{INSTALL_TOOLS} bench` (exit {status}); "
                "install the Debian package wrk (needs root or sudo, and apt-get) and run again"
            )
    return wrk


def wrk_version(wrk: str) -> str:
    result = subprocess.run([wrk, "-v"], capture_output=True, text=True, check=False)
    first = (result.stdout + result.stderr).strip().splitlines()[0] if (
        result.stdout or result.stderr) else "wrk (unknown version)"
    return first.split(" Copyright")[0].strip()


def cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def machine_line(wrk: str) -> str:
    import httptools
    import trio

    from notary.cache import IMPLEMENTATION

    cores = os.cpu_count() or 0
    usable = len(os.sched_getaffinity(0))
    try:
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "n/a"
    return (
        f"{cpu_model()}, {cores} cores ({usable} usable); "
        f"{platform.python_implementation()} {platform.python_version()}; "
        f"{platform.system()} {platform.release()} {platform.machine()}; {wrk_version(wrk)}; "
        f"trio {trio.__version__}, httptools {httptools.__version__}, {ssl.OPENSSL_VERSION}, "
        f"notary cache {IMPLEMENTATION}; load average {load}"
    )


def choose_cpus(args: argparse.Namespace) -> tuple[int, int]:
    usable = sorted(os.sched_getaffinity(0))
    server = args.server_cpu if args.server_cpu is not None else usable[0]
    client = args.client_cpu if args.client_cpu is not None else (
        next((cpu for cpu in usable if cpu != server), server)
    )
    if server == client:
        print(f"warning: one usable core: server and wrk share CPU {server}", file=sys.stderr)
    return server, client


def _cpu_times(cpus: Sequence[int]) -> dict[int, tuple[int, int]]:
    """(busy, total) jiffies of each CPU in ``cpus`` from /proc/stat."""
    times = {}
    with open("/proc/stat", encoding="ascii") as stat:
        for line in stat:
            name, *fields = line.split()
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
                values = [int(v) for v in fields[:8]]
                idle = values[3] + values[4]  # idle + iowait
                times[int(name[3:])] = (sum(values) - idle, sum(values))
    return times


def busy_cpus(cpus: Sequence[int], seconds: float = 1.0) -> dict[int, float]:
    """Share of each CPU in ``cpus`` busy with other work over ``seconds``:
    a benchmark on a busy machine measures the machine, not the server."""
    try:
        before = _cpu_times(cpus)
        time.sleep(seconds)
        after = _cpu_times(cpus)
    except OSError:
        return {}
    return {
        cpu: (after[cpu][0] - before[cpu][0]) / max(1, after[cpu][1] - before[cpu][1])
        for cpu in before if cpu in after
    }


def describe_busy(cpus: Sequence[int], when: str) -> str:
    busy = busy_cpus(cpus)
    text = ", ".join(f"CPU {cpu} {share:.0%}" for cpu, share in sorted(busy.items()))
    line = f"other load {when}: {text or 'n/a'} busy over 1 s"
    if any(share > 0.10 for share in busy.values()):
        line += "  WARNING: the machine is busy; figures are not comparable with a quiet run"
    return line


def wait_quiet(cpus: Sequence[int], timeout_s: float) -> None:
    """Wait (at most ``timeout_s``) until ``cpus`` are < 10% busy for 3 s in a row."""
    deadline = time.monotonic() + timeout_s
    quiet = 0
    while quiet < 3 and time.monotonic() < deadline:
        busy = busy_cpus(cpus)
        quiet = quiet + 1 if busy and max(busy.values()) < 0.10 else 0
    if quiet < 3:
        print(f"warning: CPUs {list(cpus)} still busy after {timeout_s:.0f} s; going on",
              file=sys.stderr)


def free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((LOOPBACK, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


# -- HTTP by hand (set-up checks, not measurement) -------------------------------


def client_tls_context() -> ssl.SSLContext:
    """Loopback only, and the pin is checked by comparing hashes, not by a CA."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


@contextlib.contextmanager
def connect(port: int, *, tls: bool, timeout_s: float) -> Iterator[socket.socket]:
    sock = socket.create_connection((LOOPBACK, port), timeout=timeout_s)
    try:
        if tls:
            sock = client_tls_context().wrap_socket(sock)
        yield sock
    finally:
        sock.close()


def read_response(sock: socket.socket, buffer: bytearray) -> bytes:
    """One whole response (head + Content-Length body) from ``sock``."""
    while True:
        head_end = buffer.find(b"\r\n\r\n")
        if head_end >= 0:
            match = re.search(rb"\r\ncontent-length:\s*(\d+)", bytes(buffer[:head_end]).lower())
            if match is None:
                raise BenchError(f"response without Content-Length: {bytes(buffer[:200])!r}")
            end = head_end + 4 + int(match.group(1))
            if len(buffer) >= end:
                response = bytes(buffer[:end])
                del buffer[:end]
                return response
        data = sock.recv(65536)
        if not data:
            raise BenchError(f"connection closed mid-response: {bytes(buffer[:200])!r}")
        buffer += data


def exchange(port: int, request: bytes, *, tls: bool, count: int = 1,
             timeout_s: float = 10.0) -> list[bytes]:
    """Send ``request`` ``count`` times on one keep-alive connection, one at a time."""
    responses = []
    with connect(port, tls=tls, timeout_s=timeout_s) as sock:
        buffer = bytearray()
        for _ in range(count):
            sock.sendall(request)
            responses.append(read_response(sock, buffer))
    return responses


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def served_sha1_pin(port: int) -> str:
    with connect(port, tls=True, timeout_s=10.0) as sock:
        der = sock.getpeercert(binary_form=True)
    return hashlib.sha1(der).digest().hex(":").upper()


def post_request(port: int, path: str, body: str) -> bytes:
    """The request wrk sends with the Lua script below (same headers, same order)."""
    return (
        f"POST {path} HTTP/1.1\r\nHost: {LOOPBACK}:{port}\r\n"
        f"Content-Type: {CONTENT_TYPE}\r\nContent-Length: {len(body)}\r\n\r\n{body}"
    ).encode("ascii")


def wait_listening(process: subprocess.Popen[bytes], ports: Sequence[int], name: str,
                   log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    for port in ports:
        while True:
            if process.poll() is not None:
                raise BenchError(f"{name} exited with {process.returncode}:\n{tail(log)}")
            try:
                socket.create_connection((LOOPBACK, port), timeout=1.0).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise BenchError(f"{name} not listening on port {port}:\n{tail(log)}") from None
                time.sleep(0.05)


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# -- the notary ------------------------------------------------------------------


@dataclass(frozen=True)
class NotarySetup:
    directory: Path
    config: Path
    api_port: int
    plain_port: int

    @property
    def path(self) -> str:
        return f"/target/{LOOPBACK}+{self.api_port}"


def project_env() -> dict[str, str]:
    """The environment of every subprocess: the notary imported from this
    checkout (``ROOT``), whatever else is installed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def edit_config(text: str, plain_port: int, spare_ports: Iterator[int]) -> str:
    """dev-init's config for the benchmark: ``[server] plain_api`` added,
    ``log_level = "warning"``, ``[relay] listen = []``; any other section's
    ``listen`` (a listener dev-init puts on a fixed port) moved to a free port."""
    section = ""
    lines = []
    for line in text.splitlines():
        header = re.fullmatch(r"\s*\[([\w.-]+)\]\s*(#.*)?", line)
        if header:
            section = header.group(1)
        key = line.split("=", 1)[0].strip() if "=" in line and not line.lstrip().startswith("#") else ""
        if section == "server" and key in ("plain_api", "log_level"):
            continue  # set below
        if key == "listen":
            ports = "" if section == "relay" else f'"{LOOPBACK}:{next(spare_ports)}"'
            line = f"listen = [{ports}]"
        lines.append(line)
        if header and section == "server":
            lines += [f'plain_api = ["{LOOPBACK}:{plain_port}"]', 'log_level = "warning"']
    return "\n".join(lines) + "\n"


def make_notary(
    directory: Path, api_port: int, relay_api_port: int, plain_port: int,
    spare_ports: Sequence[int] | None = None,
) -> NotarySetup:
    result = subprocess.run(
        [sys.executable, "-m", "notary", "dev-init", "--dir", str(directory),
         "--api-port", str(api_port), "--relay-api-port", str(relay_api_port)],
        cwd=ROOT, env=project_env(), capture_output=True, text=True, check=False,
    )
    if result.returncode != 0:
        raise BenchError(f"notary dev-init failed ({result.returncode}):\n{result.stderr}")
    config = directory / "notary.toml"
    text = edit_config(config.read_text(), plain_port, iter(spare_ports or free_ports(4)))
    config.write_text(text)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BenchError(f"config edit broke the TOML ({exc}):\n{text}") from None
    expected = {
        "plain_api": raw.get("server", {}).get("plain_api") == [f"{LOOPBACK}:{plain_port}"],
        "log_level": raw.get("server", {}).get("log_level") == "warning",
        "relay listen": raw.get("relay", {}).get("listen", []) == [],
    }
    if not all(expected.values()):
        raise BenchError(f"config edit failed ({expected}):\n{text}")
    return NotarySetup(directory, config, api_port, plain_port)


def notary_version() -> str:
    """The commit measured, and whether notary/ has uncommitted changes (read-only git)."""
    def git(*argv: str) -> str:
        try:
            result = subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True,
                                    check=False, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return result.stdout.strip() if result.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return "notary (not a git checkout)"
    dirty = git("status", "--porcelain", "--", "notary")
    return f"notary at {commit}" + (" + uncommitted changes in notary/" if dirty else "")


def notary_argv(setup: NotarySetup, profile_out: Path | None = None) -> list[str]:
    # One process, pinned: explicit, whatever dev-init's [node] workers says.
    serve = ["serve", "--config", str(setup.config), "--workers", "1"]
    if profile_out is None:
        return [sys.executable, "-m", "notary", *serve]
    return [sys.executable, "-c", PROFILE_WRAPPER, str(profile_out), *serve]


def prime_notary(setup: NotarySetup, body: str) -> bytes:
    """Make the target a cache hit; return the notary's exact answer to the query."""
    request = post_request(setup.plain_port, setup.path, body)
    first = exchange(setup.plain_port, request, tls=False, timeout_s=PRIME_TIMEOUT_S)[0]
    if status_of(first) != 200:
        raise BenchError(f"priming POST {setup.path} answered:\n{first.decode(errors='replace')}")
    hits = exchange(setup.plain_port, request, tls=False, count=3)
    if len({*hits}) != 1 or status_of(hits[0]) != 200:
        raise BenchError(f"cache-hit answers differ or are not 200: {hits!r}")
    over_tls = exchange(setup.api_port, post_request(setup.api_port, setup.path, body), tls=True)
    if over_tls[0] != hits[0]:
        raise BenchError("the HTTPS answer differs from the plain-HTTP answer")
    return hits[0]


# -- wrk -------------------------------------------------------------------------


@dataclass(frozen=True)
class WrkResult:
    requests_per_s: float
    requests: int
    latency_avg: str
    latency_p99: str
    output: str
    #: The server's CPU time (user + system) per request, and its share of
    #: one core during the run (near 100%: the server was the bottleneck).
    cpu_us_per_request: float | None = None
    server_core_use: float | None = None


def wrk_script(directory: Path, body: str) -> Path:
    path = directory / "post.lua"
    path.write_text(
        "-- cache-hit Convergence query: POST /target/<host>+<port>, keep-alive\n"
        'wrk.method = "POST"\n'
        f'wrk.body = "{body}"\n'
        f'wrk.headers["Content-Type"] = "{CONTENT_TYPE}"\n'
    )
    return path


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all its threads) so far."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_wrk(wrk: str, processes: Processes, url: str, script: Path, args: argparse.Namespace,
            cpu: int, seconds: int, server_pid: int | None = None) -> WrkResult:
    """One wrk run; with ``server_pid``, also the server's CPU time per
    request, a figure that other load on the machine disturbs far less than
    requests per second."""
    argv = [wrk, f"-t{args.threads}", f"-c{args.connections}", f"-d{seconds}s", "--latency",
            "-s", str(script), url]
    cpu_before = cpu_seconds(server_pid) if server_pid else 0.0
    started = time.monotonic()
    process = processes.start("wrk", argv, cpu=cpu)
    try:
        out, err = process.communicate(timeout=seconds + 30)
    finally:
        processes.stop(process)
    elapsed = time.monotonic() - started
    server_cpu_s = cpu_seconds(server_pid) - cpu_before if server_pid else 0.0
    output = out.decode(errors="replace") + err.decode(errors="replace")
    if process.returncode != 0:
        raise BenchError(f"wrk exited with {process.returncode}:\n{output}")
    problems = []
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)",
                       output)
    if errors and any(int(n) for n in errors.groups()):
        problems.append(errors.group(0))
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    if non_2xx and int(non_2xx.group(1)):
        problems.append(non_2xx.group(0))
    rate = re.search(r"Requests/sec:\s+([\d.]+)", output)
    total = re.search(r"(\d+) requests in", output)
    if rate is None or total is None:
        problems.append("no Requests/sec in wrk's output")
    if problems:
        raise BenchError(f"wrk against {url}: {'; '.join(problems)}\n{output}")
    latency = re.search(r"Latency\s+(\S+)", output)
    p99 = re.search(r"^\s+99%\s+(\S+)", output, re.MULTILINE)
    requests = int(total.group(1))
    return WrkResult(
        float(rate.group(1)), requests,
        latency.group(1) if latency else "?", p99.group(1) if p99 else "?", output,
        server_cpu_s / requests * 1e6 if server_pid else None,
        server_cpu_s / elapsed if server_pid else None,
    )


# -- report ----------------------------------------------------------------------


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"

    print(line(cells[0]))
    print("| " + " | ".join("-" * w for w in widths) + " |")
    for row in cells[1:]:
        print(line(row))
    print()


@dataclass(frozen=True)
class Target:
    key: str
    label: str
    port: int
    tls: bool
    ceiling: str  # key of the row it is compared with on the same transport
    pid: int  # the server process


def report(targets: Sequence[Target], runs: dict[str, list[WrkResult]]) -> float:
    best = {key: max(results, key=lambda r: r.requests_per_s) for key, results in runs.items()}
    cpu = {
        key: min((r.cpu_us_per_request for r in results if r.cpu_us_per_request), default=0.0)
        for key, results in runs.items()
    }
    base = best["c"].requests_per_s
    rows = []
    for target in targets:
        results = runs[target.key]
        top = best[target.key]
        same = best[target.ceiling].requests_per_s
        rows.append([
            f"({target.key}) {target.label}",
            *(f"{r.requests_per_s:,.0f}" for r in results),
            f"{top.requests_per_s:,.0f}",
            f"{top.requests_per_s / base:.2f}",
            f"{top.requests_per_s / same:.2f} vs ({target.ceiling})",
            f"{cpu[target.key]:.1f}",
            f"{top.server_core_use:.0%}" if top.server_core_use is not None else "?",
            f"{top.latency_avg} / {top.latency_p99}",
        ])
    run_headers = [f"run {i + 1} req/s" for i in range(max(len(r) for r in runs.values()))]
    print_table(
        ["server", *run_headers, "best req/s", "vs (c)", "vs its ceiling",
         "server CPU us/req (min)", "server core use (best)", "latency avg / p99 (best)"],
        rows,
    )
    ratio = best["a"].requests_per_s / base
    verdict = "met" if ratio >= GOAL else "NOT met"
    print(f"goal: notary plain HTTP keep-alive >= {GOAL:.0%} of the minimal Trio server: "
          f"{ratio:.1%} ({best['a'].requests_per_s:,.0f} / {base:,.0f} req/s) -> {verdict}")
    if cpu["a"] and cpu["c"]:
        print(f"cross-check by server CPU time per request (less sensitive to other load): "
              f"minimal {cpu['c']:.1f} us / notary {cpu['a']:.1f} us = {cpu['c'] / cpu['a']:.1%}")
    print(f"notary HTTPS: {best['b'].requests_per_s / best['d'].requests_per_s:.1%} of the "
          f"minimal Trio TLS server, {best['b'].requests_per_s / best['a'].requests_per_s:.1%} "
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
    argv = notary_argv(setup, stats_path if cprofile else None)
    notary = processes.start("notary (profiled)", argv, cpu=server_cpu, log=log,
                             cwd=setup.directory)
    wait_listening(notary, [setup.plain_port, setup.api_port], "notary (profiled)", log)
    if prime_notary(setup, body) != expected:
        raise BenchError("the restarted notary answers different bytes")
    url = f"http://{LOOPBACK}:{setup.plain_port}{setup.path}"
    print(f"## Profile of the notary under load, plain HTTP keep-alive ({args.profile}, "
          f"{args.duration} s)")
    if cprofile:
        notary.send_signal(signal.SIGUSR1)
        result = run_wrk(wrk, processes, url, script, args, client_cpu, args.duration)
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
        result = run_wrk(wrk, processes, url, script, args, client_cpu, args.duration)
        with contextlib.suppress(subprocess.TimeoutExpired):
            sampler.wait(30)
        processes.stop(sampler)
        processes.stop(notary)
        if not raw.exists():
            raise BenchError(f"py-spy wrote nothing:\n{tail(setup.directory / 'py-spy.log')}")
        print_py_spy(raw, result, args.top)


def print_cprofile(stats_path: Path, result: WrkResult, top: int) -> None:
    stats = pstats.Stats(str(stats_path))
    table = stats.stats  # type: ignore[attr-defined]
    requests = result.requests
    total_s = sum(entry[2] for entry in table.values())
    print(f"{requests:,} requests at {result.requests_per_s:,.0f} req/s under cProfile "
          f"(its overhead inflates every time; read calls per request and shares); "
          f"{total_s / requests * 1e6:.1f} us profiled per request.")
    print()
    rows = []
    entries = sorted(table.items(), key=lambda item: item[1][2], reverse=True)
    for (filename, line, name), (_cc, calls, tottime, cumtime, _callers) in entries[:top]:
        rows.append([
            f"{short_path(filename)}:{line}({name})",
            f"{calls / requests:.2f}",
            f"{tottime / requests * 1e6:.2f}",
            f"{tottime / total_s:.1%}",
            f"{cumtime / requests * 1e6:.2f}",
        ])
    print_table(["function (by own time)", "calls/req", "own us/req", "own share",
                 "cumulative us/req"], rows)


def print_py_spy(raw: Path, result: WrkResult, top: int) -> None:
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
    per_request_us = 1e6 / result.requests_per_s
    print(f"{total:,} samples of the event loop thread ({other_threads:,} of other threads left "
          f"out); {result.requests_per_s:,.0f} req/s while sampled, so {per_request_us:.1f} us "
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
    return f"{name} ({short_path(where.rstrip(')'))})" if where else name


def short_path(filename: str) -> str:
    for marker in ("/site-packages/", str(ROOT) + "/"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    if filename.startswith("~"):
        return "builtin"
    return filename.rsplit("/lib/python", 1)[-1]


# -- main ------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="2 s per run instead of 10: a smoke run, not a measurement")
    parser.add_argument("--duration", type=int, default=None, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each target (default 2)")
    parser.add_argument("--connections", type=int, default=64, help="wrk -c (default 64)")
    parser.add_argument("--threads", type=int, default=1, help="wrk -t (default 1)")
    parser.add_argument("--server-cpu", type=int, help="core for the servers (default: first)")
    parser.add_argument("--client-cpu", type=int, help="core for wrk (default: second)")
    parser.add_argument("--no-httptools-row", action="store_true",
                        help="skip (e), the minimal server parsing with httptools")
    parser.add_argument("--profile", choices=["cprofile", "py-spy"],
                        help="then profile the notary under load (plain HTTP): cProfile "
                        "(calls per request) or py-spy (truer shares; pip install it)")
    parser.add_argument("--top", type=int, default=30, help="profile rows to print")
    parser.add_argument("--wait-quiet", type=float, default=0, metavar="SECONDS",
                        help="first wait up to SECONDS for both cores to be idle (shared machines)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    if args.duration is None:
        args.duration = 2 if args.quick else 10
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark("bench_http", parse_args(argv), run)


def run_benchmark(
    name: str,
    args: argparse.Namespace,
    run: Callable[[argparse.Namespace, Processes, Path], int],
) -> int:
    """Run ``run`` with a temporary directory and a process group it fills,
    both cleaned up on every exit path (SIGTERM and Ctrl-C included); a
    ``BenchError`` is one line and exit 1."""
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started in background
    processes = Processes()
    directory = Path(tempfile.mkdtemp(prefix=f"notary-{name.replace('_', '-')}-"))
    try:
        return run(args, processes, directory)
    except BenchError as exc:
        print(f"{name}: FAILED: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
    finally:
        processes.stop_all()
        if args.keep:
            print(f"kept {directory}", file=sys.stderr)
        else:
            shutil.rmtree(directory, ignore_errors=True)


def run(args: argparse.Namespace, processes: Processes, directory: Path) -> int:
    sys.path.insert(0, str(ROOT))
    wrk = ensure_wrk()
    server_cpu, client_cpu = choose_cpus(args)
    ports = free_ports(10)
    api_port, relay_api_port, plain_port, min_port, min_tls_port, min_httptools_port = ports[:6]
    print("# End to end: cache-hit POST /target requests per second (wrk)")
    print(f"machine: {machine_line(wrk)}")
    print(f"command: {shlex.join([Path(sys.executable).name, *sys.argv])}")
    print(f"started: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; {notary_version()}")
    print(f"wrk: -t{args.threads} -c{args.connections} -d{args.duration}s, pinned to CPU "
          f"{client_cpu}; each server pinned to CPU {server_cpu}; {args.rounds} runs per target")
    if args.wait_quiet:
        wait_quiet([server_cpu, client_cpu], args.wait_quiet)
    print(describe_busy([server_cpu, client_cpu], "before the runs"), flush=True)

    setup = make_notary(directory / "notary", api_port, relay_api_port, plain_port, ports[6:])
    log = directory / "notary.log"
    notary = processes.start("notary", notary_argv(setup), cpu=server_cpu, log=log,
                             cwd=setup.directory)
    wait_listening(notary, [plain_port, api_port], "notary", log)
    pin = served_sha1_pin(api_port)
    body = f"fingerprint={pin}"
    answer = prime_notary(setup, body)
    response_file = directory / "response.bin"
    response_file.write_bytes(answer)
    head = answer.split(b"\r\n\r\n", 1)[0].decode("ascii").replace("\r\n", " | ")
    print(f"query: POST {setup.path} (the notary's own HTTPS port), body {body}")
    print(f"answer: {len(answer)} bytes, {head}")
    print()

    cert, key = setup.directory / "notary.crt", setup.directory / "notary.key"
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
        server_log = directory / f"{name.replace(' ', '-')}.log"
        process = processes.start(name, argv, cpu=server_cpu, log=server_log)
        pids[name] = process.pid
        wait_listening(process, [port], name, server_log)
        got = exchange(port, post_request(port, setup.path, body), tls=tls, count=2)
        if got != [answer, answer]:
            raise BenchError(f"{name} does not answer the notary's bytes: {got!r}")

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
    script = wrk_script(directory, body)
    runs: dict[str, list[WrkResult]] = {t.key: [] for t in targets}
    for round_number in range(args.rounds):
        for target in targets:
            scheme = "https" if target.tls else "http"
            url = f"{scheme}://{LOOPBACK}:{target.port}{setup.path}"
            result = run_wrk(wrk, processes, url, script, args, client_cpu, args.duration,
                             server_pid=target.pid)
            runs[target.key].append(result)
            print(f"  round {round_number + 1} ({target.key}) {target.label}: "
                  f"{result.requests_per_s:,.0f} req/s, server {result.cpu_us_per_request:.1f} "
                  f"us CPU/req, {result.server_core_use:.0%} of its core", flush=True)
            if notary.poll() is not None:
                raise BenchError(f"the notary exited ({notary.returncode}):\n{tail(log)}")
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
