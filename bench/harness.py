"""The one harness of every benchmark in ``bench/`` (what each piece does and
why: ``bench/README.md``). Importing it puts the project root on ``sys.path``."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import hashlib
import json
import os
import platform
import re
import resource
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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
MINIMAL_SERVER = ROOT / "bench" / "minimal_server.py"
INSTALL_TOOLS = ROOT / ".ci" / "install-tools"
LOOPBACK = "127.0.0.1"
LOCK_PATH = Path("/tmp/notary-bench.lock")
READY_TIMEOUT_S = 30.0
PRIME_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
CLOCK_TICK = os.sysconf("SC_CLK_TCK")
PR_SET_PDEATHSIG = 1
CONTENT_TYPE = "application/x-www-form-urlencoded"
#: ``Run.warnings`` flags a server core busy below MIN_SERVER_CORE, a client's above MAX_WRK_CORE.
MIN_SERVER_CORE = 0.90
MAX_WRK_CORE = 0.95

#: cProfile wrapper for the notary process: SIGUSR1 starts profiling, SIGUSR2
#: stops it and writes the stats to argv[1]; the rest of argv is the notary's.
PROFILE_WRAPPER = """\
import cProfile, signal, sys
profile = cProfile.Profile()
signal.signal(signal.SIGUSR1, lambda *_: profile.enable())
signal.signal(signal.SIGUSR2, lambda *_: (profile.disable(), profile.dump_stats(sys.argv[1])))
from notary.cli import main
sys.exit(main(sys.argv[2:]))
"""


class BenchError(Exception):
    """The benchmark cannot give a valid figure: say why and stop."""


def project_env() -> dict[str, str]:
    """Every subprocess's environment: the notary imported from this checkout first."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


class Processes:
    """Every subprocess started here, each the leader of its own process
    group; ``stop`` and ``stop_all`` end the whole group."""

    def __init__(self) -> None:
        self._running: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, argv: Sequence[str], *, cpu: int | Iterable[int] | None,
              log: Path | None = None, cwd: Path | None = None,
              env: dict[str, str | None] | None = None) -> subprocess.Popen[bytes]:
        """Start ``argv`` pinned to ``cpu`` (a core, a set of cores, None: any),
        output to ``log`` (stdout and stderr) or to pipes, with ``env``'s
        variables set (None: removed); SIGKILLed if this process dies."""
        cpus = {cpu} if isinstance(cpu, int) else set(cpu) if cpu is not None else None

        def prepare() -> None:  # in the child, between fork and exec
            if cpus:
                os.sched_setaffinity(0, cpus)
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

        environment = {k: v for k, v in {**project_env(), **(env or {})}.items() if v is not None}
        with log.open("wb") if log else contextlib.nullcontext(subprocess.PIPE) as out:
            process = subprocess.Popen(
                argv, cwd=cwd, env=environment, stdout=out,
                stderr=subprocess.STDOUT if log else subprocess.PIPE,
                stdin=subprocess.DEVNULL, preexec_fn=prepare, start_new_session=True)
        self._running.append(process)
        return process

    def stop(self, process: subprocess.Popen[bytes], timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM to ``process``, SIGKILL to its group after ``timeout_s``,
        then a SIGKILL sweep of whatever the group still holds."""
        _terminate(process)
        _end_group(process, time.monotonic() + timeout_s)
        self._running = [p for p in self._running if p is not process]

    def stop_all(self) -> None:
        for process in reversed(self._running):
            _terminate(process)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for process in reversed(self._running):
            with contextlib.suppress(Exception):
                _end_group(process, deadline)
        self._running.clear()


def _terminate(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the group's leader only (a supervisor then stops its own
    workers). ``os.kill``, not ``Popen.terminate``, which would reap an exited
    leader and so free its pid before ``_end_group`` kills the group."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGTERM)


def _end_group(process: subprocess.Popen[bytes], deadline: float) -> None:
    """Wait (until ``deadline``) for ``process`` to exit without reaping it,
    SIGKILL its group while the zombie leader holds the group id (no other
    process can have it; a leader reaped elsewhere gets the SIGKILL too: the
    id is not handed out while a member lives), then reap it."""
    if process.returncode is None:
        while time.monotonic() < deadline:
            try:
                if os.waitid(os.P_PID, process.pid,
                             os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                    break
            except ChildProcessError:
                break  # reaped elsewhere
            time.sleep(0.02)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # own session: pgid == pid
    with contextlib.suppress(ChildProcessError):
        process.wait()


def run_benchmark(name: str, args: argparse.Namespace,
                  run: Callable[[argparse.Namespace, Processes, Path], int]) -> int:
    """Run ``run`` under the machine lock (waiting while another benchmark
    holds it), with a temporary directory and a ``Processes``, all cleaned up
    on every exit path; a ``BenchError`` is one message and exit 1."""
    signal.signal(signal.SIGTERM, lambda signum, _: sys.exit(128 + signum))
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started in background
    try:
        with open(os.open(LOCK_PATH, os.O_RDONLY | os.O_CREAT, 0o666)) as lock:  # close: unlock
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                print(f"waiting for another benchmark to finish (lock {LOCK_PATH})",
                      file=sys.stderr, flush=True)
                started = time.monotonic()
                fcntl.flock(lock, fcntl.LOCK_EX)
                print(f"lock taken after {time.monotonic() - started:.0f} s", file=sys.stderr,
                      flush=True)
            processes = Processes()
            directory = Path(tempfile.mkdtemp(prefix=f"notary-{name.replace('_', '-')}-"))
            try:
                return run(args, processes, directory)
            except BenchError as exc:
                print(f"{name}: FAILED: {exc}", file=sys.stderr)
                return 1
            finally:
                processes.stop_all()
                if getattr(args, "keep", False):
                    print(f"kept {directory}", file=sys.stderr)
                else:
                    shutil.rmtree(directory, ignore_errors=True)
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130


def ensure_tool(command: str) -> str:
    """The path of ``command``, first installing the bench tools if it is missing."""
    search = os.pathsep.join([os.environ.get("PATH", os.defpath), "/usr/sbin"])
    found = shutil.which(command, path=search)
    if found is None:
        print(f"{command} not found: running {INSTALL_TOOLS.relative_to(ROOT)} bench", flush=True)
        try:
            status: object = subprocess.run(["bash", str(INSTALL_TOOLS), "bench"],
                                            check=False).returncode
        except OSError as exc:
            status = f"not run: {exc}"
        found = shutil.which(command, path=search)
        if found is None:
            raise BenchError(f"{command} is not available after `{INSTALL_TOOLS} bench` (exit "
                             f"{status}); install it (the Debian packages are listed in that "
                             "script) and run again")
    return found


def ensure_wrk() -> str:
    return ensure_tool("wrk")


def wrk_version(wrk: str) -> str:
    result = subprocess.run([wrk, "-v"], capture_output=True, text=True, check=False)
    text = (result.stdout + result.stderr).strip()
    first = text.splitlines()[0] if text else "wrk (unknown version)"
    return first.split(" Copyright")[0].strip()


def _proc_fields(path: str) -> dict[str, str]:
    """The ``name: value`` lines of ``path`` (/proc/cpuinfo, meminfo, <pid>/status), {} if gone."""
    with contextlib.suppress(OSError), open(path, encoding="utf-8", errors="replace") as lines:
        pairs = (line.partition(":") for line in lines)
        return {name.strip(): value.strip() for name, _, value in pairs}
    return {}


def cores_and_load() -> tuple[int, int, str]:
    """Cores of the machine, cores this process may run on, load averages."""
    try:
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "n/a"
    return os.cpu_count() or 0, len(os.sched_getaffinity(0)), load


def _cpu_and_cores() -> str:
    cores, usable, _ = cores_and_load()
    cpu = _proc_fields("/proc/cpuinfo").get("model name") or platform.processor() or "unknown CPU"
    return f"{cpu}, {cores} cores ({usable} usable)"


def header(title: str, command: str) -> None:
    """The micro-benchmarks' head: title, machine, command, start time."""
    print(f"# {title}\nmachine: {_cpu_and_cores()}, "
          f"{platform.system()} {platform.release()} {platform.machine()}, "
          f"{platform.python_implementation()} {platform.python_version()}, "
          f"load average {cores_and_load()[2]}\ncommand: {command}")
    print(f"started: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n")


def notary_version() -> str:
    """The commit measured, and whether notary/ has uncommitted changes (read-only git)."""
    def git(*argv: str) -> str:
        return subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True,
                              check=True, timeout=10).stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--", "notary")
    except (OSError, subprocess.SubprocessError):
        return "notary (not a git checkout)"
    return f"notary at {commit}" + (" + uncommitted changes in notary/" if dirty else "")


def print_preamble(title: str, wrk: str | None, note: str = "") -> None:
    """The head of every load report: title, machine (with the versions of
    wrk, trio, httptools, OpenSSL and the notary's cache), command, start, commit."""
    import httptools
    import trio

    from notary.protocol.hotpath import IMPLEMENTATION as REQUEST_PATH
    from notary.state.cache import IMPLEMENTATION

    memory = _proc_fields("/proc/meminfo").get("MemTotal")
    print(
        f"# {title}\nmachine: {_cpu_and_cores()}, "
        + (f"{int(memory.split()[0]) / 1024 / 1024:.1f} GiB RAM; " if memory else "RAM n/a; ")
        + f"{platform.python_implementation()} {platform.python_version()}; "
        f"{platform.system()} {platform.release()} {platform.machine()}; "
        + (f"{wrk_version(wrk)}; " if wrk else "")
        + f"trio {trio.__version__}, httptools {httptools.__version__}, {ssl.OPENSSL_VERSION}, "
        f"notary cache {IMPLEMENTATION}, request path {REQUEST_PATH}; load average {cores_and_load()[2]}")
    print(f"command: {shlex.join([Path(sys.executable).name, *sys.argv])}")
    print(f"started: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; {notary_version()}{note}")


def choose_cpus(args: argparse.Namespace) -> tuple[int, int]:
    """(server core, client core): ``--server-cpu``/``--client-cpu``, or the first two usable."""
    usable = sorted(os.sched_getaffinity(0))
    server = getattr(args, "server_cpu", None)
    server = usable[0] if server is None else server
    client = getattr(args, "client_cpu", None)
    if client is None:
        client = next((cpu for cpu in usable if cpu != server), server)
    if server == client:
        print(f"warning: one usable core: server and client share CPU {server}", file=sys.stderr)
    return server, client


def cpu_times(cpus: Sequence[int]) -> dict[int, tuple[int, int]]:
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


def _busy_shares(before: dict[int, tuple[int, int]],
                 after: dict[int, tuple[int, int]]) -> dict[int, float]:
    """The busy share of each CPU between two ``cpu_times``."""
    return {cpu: (after[cpu][0] - before[cpu][0]) / max(1, after[cpu][1] - before[cpu][1])
            for cpu in before if cpu in after}


def busy_cpus(cpus: Sequence[int], seconds: float = 1.0) -> dict[int, float]:
    """Share of each CPU in ``cpus`` busy over ``seconds`` ({} if unreadable)."""
    try:
        before = cpu_times(cpus)
        time.sleep(seconds)
        return _busy_shares(before, cpu_times(cpus))
    except OSError:
        return {}


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


def machine_busy_seconds() -> float:
    """Busy CPU seconds of every core since boot (/proc/stat)."""
    return sum(busy for busy, _ in cpu_times(range(os.cpu_count() or 1)).values()) / CLOCK_TICK


def proc_stat(pid: int) -> list[str]:
    """``/proc/<pid>/stat`` after the command name: [0] state, [1] parent,
    [2] process group, [11] utime, [12] stime, [13] cutime, [14] cstime."""
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
        return stat.read().rsplit(")", 1)[1].split()


def all_proc_stats() -> dict[int, list[str]]:
    """``proc_stat`` of every process now (those gone meanwhile left out)."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError):
                found[int(entry)] = proc_stat(int(entry))
    return found


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all its threads) so far."""
    fields = proc_stat(pid)
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICK


def proc_status(pid: int) -> dict[str, int]:
    """``VmRSS``, ``VmHWM``, ``RssAnon``, ... of ``pid`` in bytes (empty if gone)."""
    return {name: int(value.split()[0]) * 1024
            for name, value in _proc_fields(f"/proc/{pid}/status").items() if value.endswith(" kB")}


def listen_queue(port: int) -> int | None:
    """The accept queue of the listener on ``port`` (/proc/net/tcp: no connection), or None."""
    with open("/proc/net/tcp", encoding="ascii") as table:
        for line in table:
            fields = line.split()
            if (len(fields) > 4 and fields[1] in (f"0100007F:{port:04X}", f"00000000:{port:04X}")
                    and fields[3] == "0A"):
                return int(fields[4].split(":")[1], 16)
    return None


def free_ports(count: int) -> list[int]:
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind((LOOPBACK, 0))
        return [sock.getsockname()[1] for sock in sockets]


def client_tls_context() -> ssl.SSLContext:
    """Loopback only, and the pin is checked by comparing hashes, not by a CA."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def connect(port: int, *, tls: bool, timeout_s: float) -> socket.socket:
    """A connection to ``port``, to use in ``with`` (a failed TLS handshake closes it)."""
    sock = socket.create_connection((LOOPBACK, port), timeout=timeout_s)
    return client_tls_context().wrap_socket(sock) if tls else sock


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


def body_of(response: bytes) -> bytes:
    return response.split(b"\r\n\r\n", 1)[1]


def header_of(response: bytes, name: str) -> str | None:
    head = response.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    match = re.search(rf"\r\n[ \t]*{re.escape(name)}[ \t]*:([^\r]*)", head, re.IGNORECASE)
    return match.group(1).strip() if match else None


def post_request(port: int, path: str, body: str, *, version: str = "1.1") -> bytes:
    """The request wrk sends with ``wrk_script`` (same headers, same order);
    ``version="1.0"``: the legacy client's (no Host needed, closes)."""
    return (
        f"POST {path} HTTP/{version}\r\nHost: {LOOPBACK}:{port}\r\n"
        f"Content-Type: {CONTENT_TYPE}\r\nContent-Length: {len(body)}\r\n\r\n{body}"
    ).encode("ascii")


def start_postgres(processes: Processes, directory: Path, *, cpu: int | None,
                   settings: Sequence[str] = ()) -> str:
    """A throwaway PostgreSQL (Debian's ``postgresql``, as the ``postgres``
    user when root) in ``directory``, on a loopback port, with ``settings``
    (``name=value``) on top of its defaults; its DSN. Raises if absent."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"))
    if not found:
        raise BenchError("PostgreSQL is not installed: .ci/install-tools tests")
    binaries, as_postgres = found[-1].parent, []
    directory.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        import pwd

        user = pwd.getpwnam("postgres")
        os.chown(directory, user.pw_uid, user.pw_gid)
        os.chmod(directory.parent, directory.parent.stat().st_mode | 0o711)  # let it reach in
        as_postgres = ["runuser", "-u", "postgres", "--"]
    data, port = directory / "data", free_ports(1)[0]
    subprocess.run([*as_postgres, str(binaries / "initdb"), "-D", str(data), "-A", "trust",
                    "-U", "postgres", "-E", "UTF8"], check=True, capture_output=True)
    options = [f"listen_addresses={LOOPBACK}", *settings]
    start_server(processes, "postgresql", [
        *as_postgres, str(found[-1]), "-D", str(data), "-p", str(port), "-k", str(directory),
        *(arg for option in options for arg in ("-c", option)),
    ], [port], cpu=cpu, log=directory / "postgresql.log")
    return f"host={LOOPBACK} port={port} user=postgres dbname=postgres"


def start_server(processes: Processes, name: str, argv: Sequence[str], ports: Sequence[int], *,
                 cpu: int | Iterable[int] | None, log: Path, cwd: Path | None = None,
                 env: dict[str, str | None] | None = None,
                 connect: bool = True) -> subprocess.Popen[bytes]:
    """``Processes.start``, then a wait until it listens on every one of ``ports``
    (``connect=False``: seen in /proc/net/tcp, no connection made); raises if it does not."""
    process = processes.start(name, argv, cpu=cpu, log=log, cwd=cwd, env=env)

    def listening(port: int) -> bool:
        with contextlib.suppress(OSError):
            if not connect:
                return listen_queue(port) is not None
            socket.create_connection((LOOPBACK, port), timeout=1.0).close()
            return True
        return False

    deadline = time.monotonic() + READY_TIMEOUT_S
    for port in ports:
        while process.poll() is None and not listening(port):
            if time.monotonic() > deadline:
                raise BenchError(f"{name} not listening on port {port}:\n{tail(log)}")
            time.sleep(0.05)
        if process.returncode is not None:
            raise BenchError(f"{name} exited with {process.returncode}:\n{tail(log)}")
    return process


def tail(path: Path, lines: int = 20) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return "(no log)"


def short_path(filename: str) -> str:
    """A source file's path for a profile table: from the package or ``ROOT``."""
    for marker in ("/site-packages/", str(ROOT) + "/"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    if filename.startswith("~"):
        return "builtin"
    return filename.rsplit("/lib/python", 1)[-1]


def get_metrics(port: int) -> list[tuple[str, float]]:
    """(name with labels, value) of every sample of ``GET /metrics`` on ``port``."""
    request = f"GET /metrics HTTP/1.1\r\nHost: {LOOPBACK}:{port}\r\n\r\n".encode()
    response = exchange(port, request, tls=False)[0]
    if status_of(response) != 200:
        raise BenchError(f"GET /metrics answered {response[:200]!r}")
    samples = []
    for line in body_of(response).decode().splitlines():
        name, _, value = line.rpartition(" ")
        if name and not name.startswith("#"):
            with contextlib.suppress(ValueError):
                samples.append((name, float(value)))
    return samples


@dataclass(frozen=True)
class NotarySetup:
    directory: Path
    config: Path
    api_port: int
    plain_port: int
    admin_port: int | None = None  # [admin] listen (metrics, health), None without one

    @property
    def path(self) -> str:
        """The benchmark's query: the notary asked about its own HTTPS port."""
        return f"/target/{LOOPBACK}+{self.api_port}"

    @property
    def cert(self) -> Path:
        return self.directory / "notary.crt"

    @property
    def key(self) -> Path:
        return self.directory / "notary.key"


def _set_keys(text: str, options: dict[str, dict[str, object]]) -> str:
    """``text`` (TOML) with ``options[section][key]`` set under the section's
    header (added at the end if missing), any other line of that key dropped."""
    def assignments(section: str) -> list[str]:
        return [f"{key} = {json.dumps(value)}" for key, value in options.get(section, {}).items()]

    section, seen, lines = "", set(), []
    for line in text.splitlines():
        header = re.fullmatch(r"\s*\[([\w.-]+)\]\s*(#.*)?", line)
        if header:
            section = header.group(1)
            seen.add(section)
            lines += [line, *assignments(section)]
            continue
        key = line.split("=", 1)[0].strip() if "=" in line else ""
        if line.lstrip().startswith("#") or key not in options.get(section, {}):
            lines.append(line)
    for name in options:
        if name not in seen:
            lines += ["", f"[{name}]", *assignments(name)]
    return "\n".join(lines) + "\n"


def make_notary(directory: Path, api_port: int, relay_api_port: int, plain_port: int,
                spare_ports: Sequence[int] | None = None) -> NotarySetup:
    """A fresh notary by ``notary dev-init`` in ``directory``, its config edited
    and checked: every listener on a loopback port chosen here (bench/README.md)."""
    spare = list(spare_ports) if spare_ports is not None else free_ports(4)
    result = subprocess.run(
        [sys.executable, "-m", "notary", "dev-init", "--dir", str(directory),
         "--api-port", str(api_port), "--relay-api-port", str(relay_api_port)],
        cwd=ROOT, env=project_env(), capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise BenchError(f"notary dev-init failed ({result.returncode}):\n{result.stderr}")
    config = directory / "notary.toml"
    text = config.read_text()
    # No transparency log unless a bench asks for one (bench_log.py): the
    # other benches keep measuring what they measured before dev-init kept
    # a log (f5408b4).
    options: dict[str, dict[str, object]] = {
        "server": {"plain_api": [f"{LOOPBACK}:{plain_port}"], "log_level": "warning"},
        "relay": {"listen": []}, "log": {"enabled": False}}
    listeners = [name for name, section in tomllib.loads(text).items()
                 if isinstance(section, dict) and "listen" in section and name != "relay"]
    if len(listeners) > len(spare):
        raise BenchError("not enough spare ports for the config's listeners")
    for name, port in zip(listeners, spare, strict=False):  # enough ports: checked above
        options[name] = {"listen": [f"{LOOPBACK}:{port}"]}
    text = _set_keys(text, options)
    config.write_text(text)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BenchError(f"config edit broke the TOML ({exc}):\n{text}") from None
    server = raw["server"]
    # Every listening address, by section.key.
    addresses = {f"server.{key}": list(server.get(key, [])) for key in ("api", "plain_api")}
    addresses.update((f"{name}.listen", list(section["listen"])) for name, section in raw.items()
                     if isinstance(section, dict) and "listen" in section)
    chosen = {api_port, relay_api_port, plain_port, *spare}
    strays = [f"{where} {address}" for where, values in addresses.items() for address in values
              if address.rsplit(":", 1)[0] != LOOPBACK
              or int(address.rsplit(":", 1)[1]) not in chosen]
    expected = {
        "plain_api": addresses.get("server.plain_api") == [f"{LOOPBACK}:{plain_port}"],
        "log_level": server.get("log_level") == "warning",
        "relay listen": raw.get("relay", {}).get("listen", []) == [],
        "no log": raw.get("log", {}).get("enabled") is False,
        "every listener on a chosen loopback port": not strays}
    if not all(expected.values()):
        raise BenchError(f"config edit failed ({expected}; strays {strays}):\n{text}")
    admin = addresses.get("admin.listen", [])
    admin_port = int(admin[0].rsplit(":", 1)[1]) if len(admin) == 1 else None
    return NotarySetup(directory, config, api_port, plain_port, admin_port)


def new_notary(directory: Path, options: dict[str, dict[str, object]] | None = None,
               ports: Sequence[int] | None = None) -> NotarySetup:
    """``make_notary`` on free ports (or ``ports``: api, relay api, plain, spare...),
    ``options[section][key]`` set in its TOML and read back by the notary's loader."""
    from notary.config import load_config

    api_port, relay_api_port, plain_port, *spare = ports or free_ports(7)
    setup = make_notary(directory, api_port, relay_api_port, plain_port, spare)
    if options:
        setup.config.write_text(_set_keys(setup.config.read_text(), options))
        loaded = load_config(setup.config)
        for name, values in options.items():
            for key, value in values.items():
                got = getattr(getattr(loaded, name), key)
                if str(got) != str(value) and got != value:
                    raise BenchError(
                        f"config edit: [{name}] {key} reads back {got!r}, not {value!r}")
    return setup


@dataclass
class RunningNotary:
    """A started notary, primed: its query's body and exact answer."""

    setup: NotarySetup
    process: subprocess.Popen[bytes]
    log: Path
    body: str = ""
    answer: bytes = b""

    @property
    def pid(self) -> int:
        return self.process.pid

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise BenchError(f"the notary exited ({self.process.returncode}):\n{tail(self.log)}")


def start_notary(processes: Processes, setup: NotarySetup, name: str, *,
                 cpu: int | Iterable[int] | None, log: Path, argv: Sequence[str] | None = None,
                 prime: bool = True) -> RunningNotary:
    """Start ``notary serve`` (or ``argv``) on ``setup`` and wait for its listeners;
    ``prime``: ask it about itself with its own SHA-1 pin (a cache hit from then on)."""
    process = start_server(processes, name, argv or notary_argv(setup),
                           [setup.plain_port, setup.api_port], cpu=cpu, log=log,
                           cwd=setup.directory)
    notary = RunningNotary(setup, process, log)
    if prime:
        with connect(setup.api_port, tls=True, timeout_s=10.0) as sock:
            pin = hashlib.sha1(sock.getpeercert(binary_form=True)).digest().hex(":").upper()
        notary.body = f"fingerprint={pin}"
        notary.answer = prime_notary(setup, notary.body)
    return notary


def notary_argv(setup: NotarySetup, extra: Sequence[str] = (), *,
                profile_out: Path | None = None) -> list[str]:
    """``notary serve`` on ``setup``'s config, ``--workers 1`` unless ``extra`` says
    otherwise; with ``profile_out``, under ``PROFILE_WRAPPER``'s cProfile."""
    workers = [] if "--workers" in extra else ["--workers", "1"]
    serve = ["serve", "--config", str(setup.config), *workers, *extra]
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


#: Appended to every wrk script: p50, p99, p99.9 and max in us (wrk's table stops at p99).
LATENCY_LUA = """
done = function(summary, latency, requests)
  io.write(string.format("latency-us p50 %d p99 %d p999 %d max %d\\n",
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9), latency.max))
end
"""


def wrk_script(directory: Path, body: str, *, name: str = "post",
               content_type: str = CONTENT_TYPE) -> Path:
    """The cache-hit query for wrk: ``POST`` ``body``, keep-alive, plus ``LATENCY_LUA``."""
    path = directory / f"{name}.lua"
    if "]]" in body:
        raise BenchError("body cannot be a Lua long string")
    path.write_text(f'-- cache-hit query, keep-alive\nwrk.method = "POST"\nwrk.body = [[{body}]]\n'
                    f'wrk.headers["Content-Type"] = "{content_type}"\n' + LATENCY_LUA)
    return path


def wrk_raw_script(directory: Path, request: bytes, *, name: str) -> Path:
    """A wrk script sending exactly ``request`` (e.g. an HTTP/1.0 request:
    wrk's own requests are always HTTP/1.1), plus ``LATENCY_LUA``."""
    path = directory / f"{name}.lua"
    # A quoted Lua string with escapes (a long string would turn \r\n into \n).
    quoted = "".join(chr(byte) if 32 <= byte < 127 and byte not in b'"\\' else f"\\{byte:03d}"
                     for byte in request)
    path.write_text(f'local raw = "{quoted}"\nrequest = function() return raw end\n'
                    + LATENCY_LUA)
    return path


@dataclass(frozen=True)
class Run:
    """One measured run of a load generator against a server, with its CPU figures."""

    rate: float  # requests (handshakes, messages) per second
    count: int
    elapsed_s: float
    #: CPU seconds of the server's processes (None: not measured) and of the
    #: client (the children reaped meanwhile: wrk, the s_time processes).
    server_cpu_s: float | None = None
    client_cpu_s: float = 0.0
    #: Busy share of the server's and the client's cores, softirq time
    #: included (None: not watched).
    server_busy: float | None = None
    client_busy: float | None = None
    machine_busy_s: float = 0.0  # busy CPU seconds of every core during the run
    latency_avg: str = "?"
    latency_p99: str = "?"
    latency_us: dict[str, int] = field(default_factory=dict)  # from LATENCY_LUA, if run
    errors: dict[str, int] = field(default_factory=dict)  # socket errors, non-2xx answers
    output: str = ""

    @property
    def server_us(self) -> float:
        """The server's CPU time per request (0 when not measured)."""
        return (self.server_cpu_s or 0.0) / self.count * 1e6

    @property
    def client_us(self) -> float:
        return self.client_cpu_s / self.count * 1e6

    @property
    def server_core(self) -> float | None:
        """The server's share of one core (near 100%: it was the bottleneck)."""
        return self.server_cpu_s / self.elapsed_s if self.server_cpu_s is not None else None

    @property
    def client_core(self) -> float:
        return self.client_cpu_s / self.elapsed_s if self.elapsed_s else 0.0

    @property
    def other_cores(self) -> float:
        """Cores busy with everything else (other benchmarks, idle servers)."""
        rest = self.machine_busy_s - (self.server_cpu_s or 0.0) - self.client_cpu_s
        return max(0.0, rest) / self.elapsed_s

    def warnings(self) -> list[str]:
        """Why this run does not measure the server: its core (or process) not
        saturated, or the client's saturated (one wrk thread per core assumed)."""
        found = []
        if self.server_busy is not None and self.client_busy is not None:
            if self.server_busy < MIN_SERVER_CORE:
                found.append(f"server core {self.server_busy:.0%} busy (< "
                             f"{MIN_SERVER_CORE:.0%}: the server was not the limit)")
            if self.client_busy > MAX_WRK_CORE:
                found.append(f"client core {self.client_busy:.0%} busy (> "
                             f"{MAX_WRK_CORE:.0%}: the generator was the limit)")
            return found
        if self.server_core is not None and self.server_core < MIN_SERVER_CORE:
            found.append(f"server used {self.server_core:.0%} of its core "
                         f"(< {MIN_SERVER_CORE:.0%}: not CPU-bound)")
        if self.client_core > MAX_WRK_CORE:
            found.append(f"wrk used {self.client_core:.0%} of a core "
                         f"(> {MAX_WRK_CORE:.0%}: the generator was the limit)")
        return found


class Meter:
    """CPU accounting from its creation to ``run``: ``server_cpu()`` (the server's
    CPU seconds so far), the children reaped (the client), ``cpus``, the machine."""

    def __init__(self, server_cpu: Callable[[], float] | None = None,
                 cpus: Sequence[int] = ()) -> None:
        self.server_cpu, self.cpus = server_cpu, tuple(cpus)
        self.server_s = server_cpu() if server_cpu else 0.0
        self.children = self._children()
        self.cores = cpu_times(self.cpus) if self.cpus else {}
        self.machine = machine_busy_seconds()
        self.started = time.monotonic()

    @staticmethod
    def _children() -> float:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    def run(self, rate: float, count: int, **fields: Any) -> Run:
        """The ``Run`` of ``count`` at ``rate``; ``fields``: latency, errors..."""
        elapsed = time.monotonic() - self.started
        shares = _busy_shares(self.cores, cpu_times(self.cpus)) if self.cpus else {}
        busy: list[float | None] = [shares[cpu] for cpu in self.cpus] or [None]
        figures: dict[str, Any] = {
            "server_cpu_s": self.server_cpu() - self.server_s if self.server_cpu else None,
            "client_cpu_s": self._children() - self.children, "server_busy": busy[0],
            "client_busy": busy[-1], "machine_busy_s": machine_busy_seconds() - self.machine}
        return Run(rate, count, elapsed, **{**figures, **fields})


def best(runs: Sequence[Any]) -> Any:
    """The best run (by ``rate``) not flagged by its ``warnings()`` (of all, if every one is)."""
    clean = [r for r in runs if not r.warnings()]
    return max(clean or runs, key=lambda r: r.rate)


def run_rounds(args: argparse.Namespace, items: Sequence[Any], measure: Callable[[Any], Any],
               progress: Callable[[Any, Any], str], *, key: Callable[[Any], Any] | None = None,
               quiet_cpus: Sequence[int] = ()) -> dict[Any, list[Any]]:
    """``args.rounds`` interleaved rounds of ``measure(item)`` over ``items``,
    a progress line after each run, a wait (<= 30 s, ``--wait-quiet``) for idle
    ``quiet_cpus`` before each further round. Returns the runs by ``key(item)``."""
    key = key or (lambda item: item.key)
    runs: dict[Any, list[Any]] = {key(item): [] for item in items}
    for round_number in range(args.rounds):
        if round_number and quiet_cpus and args.wait_quiet:
            wait_quiet(quiet_cpus, min(args.wait_quiet, 30.0))
        for item in items:
            run = measure(item)
            runs[key(item)].append(run)
            print(f"  round {round_number + 1} {progress(item, run)}"
                  + "".join(f"  WARNING: {w}" for w in run.warnings()), flush=True)
    return runs


def start_load(args: argparse.Namespace, title: str, wrk: str | None,
               describe: Callable[[int, int], Sequence[str]] = lambda s, c: (), *,
               cpus: Sequence[int] | None = None, note: str = "") -> tuple[int, int]:
    """Every load benchmark's start: cores, preamble, ``describe(server_cpu,
    client_cpu)``'s lines, ``--wait-quiet`` for ``cpus`` (default: the two
    chosen), their other load. Returns (server core, client core)."""
    server_cpu, client_cpu = choose_cpus(args)
    print_preamble(title, wrk, note)
    for line in describe(server_cpu, client_cpu):
        print(line)
    watched = list(cpus) if cpus is not None else [server_cpu, client_cpu]
    if args.wait_quiet:
        wait_quiet(watched, args.wait_quiet)
    print(describe_busy(watched, "before the runs"), flush=True)
    return server_cpu, client_cpu


def run_wrk(wrk: str, processes: Processes, url: str, script: Path, *, threads: int,
            connections: int, seconds: int, cpu: int | None,
            server_cpu_seconds: Callable[[], float] | None = None, allow_errors: bool = False,
            extra: Sequence[str] = (), cpus: Sequence[int] = ()) -> Run:
    """One run of ``wrk --latency`` pinned to ``cpu``, measured by a ``Meter``
    (``server_cpu_seconds``, ``cpus``). Socket errors or non-2xx answers
    raise, unless ``allow_errors`` (then they are counted)."""
    argv = [wrk, f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--latency", *extra,
            "-s", str(script), url]
    meter = Meter(server_cpu_seconds, cpus)
    process = processes.start("wrk", argv, cpu=cpu)
    try:
        out, err = process.communicate(timeout=seconds + 30)
    except subprocess.TimeoutExpired:
        raise BenchError(f"wrk did not finish within {seconds + 30} s ({url})") from None
    finally:
        processes.stop(process)
    output = out.decode(errors="replace") + err.decode(errors="replace")
    if process.returncode != 0:
        raise BenchError(f"wrk exited with {process.returncode}:\n{output}")

    def found(pattern: str) -> str | None:
        match = re.search(pattern, output, re.MULTILINE)
        return match.group(1) if match else None

    counts = re.findall(r"(connect|read|write|timeout) (\d+)", found(r"Socket errors: (.*)") or "")
    counts.append(("non-2xx", found(r"Non-2xx or 3xx responses: (\d+)") or "0"))
    errors = {name: int(value) for name, value in counts if int(value)}
    rate, total = found(r"Requests/sec:\s+([\d.]+)"), found(r"(\d+) requests in")
    if rate is None or total is None or not int(total):
        raise BenchError(f"wrk against {url}: no requests counted\n{output}")
    if errors and not allow_errors:
        raise BenchError(f"wrk against {url}: errors {errors}\n{output}")
    percentiles = re.search(r"latency-us p50 (\d+) p99 (\d+) p999 (\d+) max (\d+)", output)
    latency_us = dict(zip(("p50", "p99", "p99.9", "max"), map(int, percentiles.groups()),
                          strict=True)) if percentiles else {}
    return meter.run(float(rate), int(total), latency_avg=found(r"Latency\s+(\S+)") or "?",
                     latency_p99=found(r"^\s+99%\s+(\S+)") or "?", latency_us=latency_us,
                     errors=errors, output=output)


def format_us(us: float | None) -> str:
    """Latency for a table: ``850 us``, ``12.3 ms``."""
    if us is None:
        return "?"
    if us < 1000:
        return f"{us:.0f} us"
    return f"{us / 1000:.1f} ms" if us < 100_000 else f"{us / 1000:.0f} ms"


def load_parser(description: str, *, rounds: int, quick: str, cpus: str = "the servers",
                wait_quiet: str = "", connections: int | None = 64, threads: int = 1,
                ) -> argparse.ArgumentParser:
    """The load benchmarks' options (``finish_load_args`` fills those that depend on --quick)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--duration", type=int, default=None, help="seconds per wrk run (10)")
    parser.add_argument("--rounds", type=int, default=None,
                        help=f"runs of each row, interleaved (default {rounds})")
    if connections is not None:  # None: the script adds its own
        parser.add_argument("--connections", type=int, default=connections,
                            help=f"wrk -c (default {connections})")
    parser.add_argument("--threads", type=int, default=threads, help=f"wrk -t (default {threads})")
    parser.add_argument("--server-cpu", type=int, help=f"core for {cpus} (default: first)")
    parser.add_argument("--client-cpu", type=int, help="core for the client (default: second)")
    parser.add_argument("--wait-quiet", type=float, default=0, metavar="SECONDS",
                        help="first wait up to SECONDS for the cores to be idle (shared "
                        f"machines){wait_quiet}")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.set_defaults(default_rounds=rounds)
    return parser


def finish_load_args(args: argparse.Namespace, *, quick_rounds: int = 1) -> argparse.Namespace:
    if args.duration is None:
        args.duration = 2 if args.quick else 10
    if args.rounds is None:
        args.rounds = quick_rounds if args.quick else args.default_rounds
    return args


def argument_parser(description: str) -> argparse.ArgumentParser:
    """A parser with the options every micro-benchmark takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="small sizes and one repetition: "
                        "a smoke run of a few seconds, not a measurement")
    parser.add_argument("--repeat", type=int, default=None, help="repetitions per measurement, "
                        "the best is kept (default: see the script; 1 with --quick)")
    return parser


def repetitions(args: argparse.Namespace, full: int) -> int:
    if args.repeat is not None:
        return max(1, args.repeat)
    return 1 if args.quick else full


def best_seconds(run: Callable[[], float], repeat: int) -> float:
    """The best of ``repeat`` calls of ``run`` (which returns the seconds it
    measured): on a shared machine, noise only ever adds time."""
    return min(run() for _ in range(repeat))


def rate(count: float, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


def format_rate(per_second: float) -> str:
    """``12.3 M/s``-style figure, three significant digits."""
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if per_second >= scale:
            return f"{per_second / scale:.3g} {unit}/s"
    return f"{per_second:.3g} /s"


def format_ratio(ratio: float) -> str:
    return f"{ratio:.2f}x" if ratio < 10 else f"{ratio:.1f}x"


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Print a GitHub-flavoured Markdown table, columns aligned (pastes into RESULTS.md)."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    cells.insert(1, ["-" * width for width in widths])
    for row in cells:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
    print()
