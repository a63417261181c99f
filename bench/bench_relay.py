"""Bounce relay throughput: MB/s through one tunnel, tunnels opened per second.

    .venv/bin/python bench/bench_relay.py            # full run (about two minutes)
    .venv/bin/python bench/bench_relay.py --quick    # smoke run (about 15 s)
    .venv/bin/python bench/bench_relay.py --profile-relay relay.prof   # + cProfile of the relay

Four processes, loopback only (127.0.0.1; no name is ever resolved):

- the **relay**: the real :class:`notary.server.relay.RelayHandler` served by
  ``trio.serve_listeners`` on ``127.0.0.1:0``, configured ``destinations =
  "public"``, ``allow_addresses = ["127.0.0.0/8"]``, ``dial_port`` = the
  sink's port, ``max_tunnels`` raised to fit the test, every other setting
  (``buffer_bytes`` included) at its default. Its resolver refuses every name.
- **socat**, the baseline forwarder: ``socat TCP-LISTEN:<port>,bind=127.0.0.1,
  reuseaddr,fork,backlog=1024 TCP:127.0.0.1:<sink port>`` (read size
  ``-b``: socat's default, 8192 bytes, unless ``--socat-buffer``). No CONNECT:
  a client connection is forwarded to the sink as it is. socat forks one
  process per connection (accept, fork, the child forwards and exits), a
  cost the relay (one process, one Trio task per tunnel) does not have. It
  is installed by ``.ci/install-tools bench`` (run if socat is missing).
- the **sink**: plain blocking sockets, a fixed pool of threads each
  accepting and serving one connection at a time (no thread is started per
  connection). The first byte of a connection says what to do:
  ``U`` read until end of file and answer the byte count (8 bytes);
  ``D`` + 8-byte length: send that many bytes, half-close, wait for end of
  file; ``E`` + 15 bytes: echo the 16 bytes, wait for end of file.
- the **client**: this process, plain blocking sockets, 256 KiB chunks
  (``sendall`` of a memoryview, ``recv_into`` a preallocated buffer).

With two or more usable cores the relay and socat (and socat's forked
children: affinity is inherited) are pinned to the first one and the sink
and client to the others, so that this core is what the "via relay" and "via
socat" figures measure; the relay is idle while socat is measured and the
other way round. The CPU columns say how busy each side was (100% = one
core), so a client/sink bottleneck shows, and how long the relay waited for
its core while another process had it (``/proc/<pid>/task/*/schedstat``:
noise on a shared machine). socat's CPU is its whole process group: the
parent's run time, its reaped children's (``cutime + cstime`` of
``/proc/<pid>/stat``, 10 ms resolution) and the run time of children still
alive; its waiting time is not known (it goes with each child). "CPU cost"
(the forwarder's CPU time per MB or per tunnel) is the figure to compare
between runs on a noisy machine.

Measurements, each the best of ``--repeat`` runs, direct, relayed and socat
runs interleaved (noise on a shared machine only ever makes a run slower):

1. Upload (client -> destination) and download (destination -> client) of
   ``--mb`` MB (10^6 bytes) through one tunnel, timed from the first byte
   sent to the last byte (or the byte-count answer) received, the tunnel
   being already established. Baselines: the same transfer over a direct
   loopback TCP connection to the sink, and through socat.
2. Tunnels per second: ``--tunnels`` tunnels by ``--concurrency`` client
   threads, each ``CONNECT 127.0.0.1:4242``, waiting for ``HTTP/1.0 200
   Connection Established``, a 16-byte echo with the sink, close. Baselines:
   direct TCP connections to the sink doing the same echo, and connections
   through socat doing the same echo (no CONNECT).

The whole run holds the benchmarks' machine lock (``harness.machine_lock``):
two benchmarks on this machine do not measure each other.

Exit status: 0 after printing the tables; 1 with a message on stderr when
anything fails (a child does not start, the relay refuses a tunnel, a byte
count is wrong, a timeout); 130 on Ctrl-C. The child processes are ended on
every exit path (the Python ones also exit by themselves when this process
dies, as their stdin closes; socat gets SIGKILL then, by ``PR_SET_PDEATHSIG``,
and its per-connection children end with their connections).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import resource
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import common  # noqa: E402  (bench/ is on sys.path: this script's directory)

from notary.config import RelayConfig  # noqa: E402  (after the path set-up)

LOOPBACK = "127.0.0.1"
#: Client and sink read and write this much per call.
CHUNK_BYTES = 256 * 1024
#: The legacy client's request; the relay maps port 4242 to its dial_port.
CONNECT_REQUEST = b"CONNECT 127.0.0.1:4242 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
ESTABLISHED = b"HTTP/1.0 200 Connection Established\r\n"
MAX_HEAD_BYTES = 4096
#: The few-byte exchange of the tunnel-rate test (``E`` + 15 bytes).
PING = b"E" + b"0123456789abcde"
MB = 1_000_000
#: Socket timeout of the client and the sink: a stalled transfer fails the run.
SOCKET_TIMEOUT_S = 60.0
#: Time allowed to a child process to say it is ready.
START_TIMEOUT_S = 30.0
COUNT = struct.Struct("!Q")


class BenchError(Exception):
    """The benchmark cannot go on: the message says why."""


# ---------------------------------------------------------------------------
# Small socket helpers (client and sink)
# ---------------------------------------------------------------------------


def tcp_connect(port: int) -> socket.socket:
    """A blocking TCP connection to 127.0.0.1:port (an IP literal: no lookup)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(SOCKET_TIMEOUT_S)
        sock.connect((LOOPBACK, port))
    except BaseException:
        sock.close()
        raise
    return sock


def recv_exact(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise BenchError(f"connection closed after {len(data)} of {size} expected bytes")
        data += chunk
    return bytes(data)


def drain_to_eof(sock: socket.socket, buffer: bytearray) -> int:
    total = 0
    while True:
        received = sock.recv_into(buffer)
        if not received:
            return total
        total += received


def open_tunnel(relay_port: int) -> socket.socket:
    """A client connection through the relay, past its ``200`` answer."""
    sock = tcp_connect(relay_port)
    try:
        sock.sendall(CONNECT_REQUEST)
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(MAX_HEAD_BYTES)
            if not chunk:
                line = head.split(b"\r\n", 1)[0].decode("latin-1") or "nothing"
                raise BenchError(f"relay closed the connection after answering {line!r}")
            head += chunk
            if len(head) > MAX_HEAD_BYTES:
                raise BenchError("relay answer head too long")
        if not head.startswith(ESTABLISHED):
            line = head.split(b"\r\n", 1)[0].decode("latin-1")
            raise BenchError(f"relay refused the tunnel: {line!r}")
        if not head.endswith(b"\r\n\r\n"):
            raise BenchError("relay sent bytes after its answer, before the sink spoke")
    except BaseException:
        sock.close()
        raise
    return sock


# ---------------------------------------------------------------------------
# Child processes: the sink and the relay
# ---------------------------------------------------------------------------


def pin(cpus: str) -> None:
    if cpus:
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})


def exit_when_parent_goes() -> None:
    """A daemon thread that ends this process when its stdin (a pipe from the
    parent) closes: no orphan survives the parent, however it dies."""

    def watch() -> None:
        # os.read, not sys.stdin: a daemon thread blocked in a buffered read
        # holds the buffer's lock and breaks interpreter shutdown.
        with contextlib.suppress(OSError):
            while os.read(0, 4096):
                pass
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def sink_serve(listener: socket.socket) -> None:
    buffer = bytearray(CHUNK_BYTES)
    payload = memoryview(bytes(CHUNK_BYTES))
    while True:
        conn, _ = listener.accept()
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(SOCKET_TIMEOUT_S)
            command = conn.recv(1)
            if command == b"U":
                conn.sendall(COUNT.pack(drain_to_eof(conn, buffer)))
            elif command == b"D":
                remaining = COUNT.unpack(recv_exact(conn, COUNT.size))[0]
                while remaining:
                    size = min(CHUNK_BYTES, remaining)
                    conn.sendall(payload[:size])
                    remaining -= size
                conn.shutdown(socket.SHUT_WR)
                drain_to_eof(conn, buffer)
            elif command == b"E":
                conn.sendall(command + recv_exact(conn, len(PING) - 1))
                drain_to_eof(conn, buffer)
        except (OSError, BenchError):
            pass  # the client sees the failure; the sink serves on
        finally:
            conn.close()


def run_sink(args: argparse.Namespace) -> int:
    pin(args.cpus)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((LOOPBACK, 0))
    listener.listen(socket.SOMAXCONN)
    for index in range(args.threads):
        threading.Thread(
            target=sink_serve, args=(listener,), name=f"sink-{index}", daemon=True
        ).start()
    print(f"READY {listener.getsockname()[1]}", flush=True)
    with contextlib.suppress(OSError, KeyboardInterrupt):
        while os.read(0, 4096):
            pass
    os._exit(0)


def run_relay(args: argparse.Namespace) -> int:
    pin(args.cpus)
    import trio

    from notary.errors import ProbeResolveFailed
    from notary.server.relay import RelayHandler

    config = RelayConfig(
        listen=(),
        destinations="public",
        allow_addresses=("127.0.0.0/8",),
        dial_port=args.dial_port,
        max_tunnels=args.max_tunnels,
    )

    async def resolve_nothing(host: str, port: int) -> list[str]:
        raise ProbeResolveFailed("the benchmark relay resolves no names")

    handler = RelayHandler(config, trusted=None, resolver=resolve_nothing)

    async def serve() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            listeners = await trio.open_tcp_listeners(0, host=LOOPBACK)
            port = listeners[0].socket.getsockname()[1]
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.serve_listeners, handler, listeners)
                print(f"READY {port}", flush=True)
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    break

    exit_when_parent_goes()
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    trio.run(serve)
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(args.profile)
    stats = handler.statistics()
    print(
        f"STATS tunnels_opened={stats.tunnels_opened} refused={dict(stats.refused)} "
        f"bytes_to_destinations={stats.bytes_to_destinations} "
        f"bytes_to_clients={stats.bytes_to_clients}",
        flush=True,
    )
    return 0


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    port: int

    def cpu_seconds(self) -> tuple[float, float]:
        """Seconds the child's threads have run so far, and seconds they spent
        runnable but waiting for a CPU (``/proc/<pid>/task/*/schedstat``, in
        nanoseconds; threads that exited are not counted, and none do here)."""
        run = wait = 0
        task_dir = f"/proc/{self.process.pid}/task"
        try:
            tasks = os.listdir(task_dir)
        except OSError:
            return float("nan"), float("nan")
        for task in tasks:
            with contextlib.suppress(OSError), open(f"{task_dir}/{task}/schedstat") as file:
                fields = file.read().split()
                run += int(fields[0])
                wait += int(fields[1])
        return run / 1e9, wait / 1e9


def start_child(name: str, arguments: Sequence[str]) -> Child:
    process = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--role", name, *arguments],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,  # Ctrl-C reaches only us; we end the children
    )
    child = Child(name, process, 0)
    assert process.stdout is not None
    deadline = time.monotonic() + START_TIMEOUT_S
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([process.stdout], [], [], left)[0]:
            stop_child(child)
            raise BenchError(f"the {name} process did not start within {START_TIMEOUT_S:.0f} s")
        data = os.read(process.stdout.fileno(), 4096)  # unbuffered: select stays truthful
        if not data:
            code = process.wait()
            raise BenchError(f"the {name} process exited with status {code} before it was ready")
        line += data
    words = line.split()
    if len(words) != 2 or words[0] != b"READY":
        stop_child(child)
        raise BenchError(f"the {name} process said {line!r} instead of READY <port>")
    child.port = int(words[1])
    return child


def stop_child(child: Child, *, gracefully: bool = False) -> str:
    """End ``child`` (SIGINT first when ``gracefully``, so the relay writes its
    profile and statistics); returns what it printed after READY."""
    process = child.process
    output = b""
    if gracefully and process.poll() is None:
        # Not communicate(): it would close stdin, which ends the child at once.
        process.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=30)
    if process.stdin is not None:
        with contextlib.suppress(OSError):
            process.stdin.close()
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if process.stdout is not None:
        with contextlib.suppress(OSError, ValueError):
            output += process.stdout.read()
            process.stdout.close()
    return output.decode(errors="replace")


#: socat's own read size (``-b``) when not given: what a plain socat uses.
SOCAT_DEFAULT_BUFFER = 8192
#: Time allowed to socat's forked children to exit after a measurement.
SETTLE_TIMEOUT_S = 10.0
PR_SET_PDEATHSIG = 1
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def proc_stat(pid: int) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name: [0] is the
    state (field 3 of proc(5)), [2] the process group, [11] utime, [12] stime,
    [13] cutime, [14] cstime (clock ticks)."""
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as file:
        return file.read().rsplit(")", 1)[1].split()


def run_time(pid: int) -> float:
    """Seconds process ``pid`` (its main thread: socat has no other) has run."""
    with open(f"/proc/{pid}/schedstat", encoding="ascii") as file:
        return int(file.read().split()[0]) / 1e9


@dataclass
class Socat:
    """socat in its own process group (pgid = pid), children included."""

    name: str
    process: subprocess.Popen[bytes]
    port: int
    log: typing.IO[bytes]

    def members(self) -> list[int]:
        """The live processes of socat's group other than the parent: its
        per-connection children (zombies included until socat reaps them)."""
        pgid = str(self.process.pid)
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != self.process.pid:
                with contextlib.suppress(OSError, IndexError):
                    if proc_stat(int(entry))[2] == pgid:
                        found.append(int(entry))
        return found

    def cpu_seconds(self) -> tuple[float, float]:
        """(run time of the whole group so far, NaN: waiting is not known).
        A child reaped between the two reads below is missed or counted
        twice: measurements start and end with no child alive (settle)."""
        try:
            fields = proc_stat(self.process.pid)
            total = run_time(self.process.pid) + (int(fields[13]) + int(fields[14])) / CLOCK_TICKS
        except (OSError, IndexError, ValueError):
            return float("nan"), float("nan")
        for pid in self.members():
            with contextlib.suppress(OSError, IndexError, ValueError):
                total += run_time(pid)
        return total, float("nan")

    def settle(self) -> None:
        """Wait (bounded) until the forked children of the last connections
        have exited and been reaped, so that their CPU is in the parent's
        cutime/cstime and not counted in the next measurement."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while self.members() and time.monotonic() < deadline:
            time.sleep(0.002)

    def error_output(self) -> str:
        with contextlib.suppress(OSError, ValueError):
            self.log.seek(0)
            return self.log.read()[-2000:].decode(errors="replace").strip()
        return ""


def socat_version(executable: str) -> str:
    result = subprocess.run(
        [executable, "-V"], capture_output=True, text=True, check=False, timeout=10
    )
    for line in result.stdout.splitlines():
        if line.startswith("socat version"):
            return " ".join(line.split()[:3])
    return "socat (unknown version)"


def socat_command(executable: str, port: int, sink_port: int, buffer: int) -> list[str]:
    return [
        executable,
        "-b",
        str(buffer),
        f"TCP-LISTEN:{port},bind={LOOPBACK},reuseaddr,fork,backlog=1024",
        f"TCP:{LOOPBACK}:{sink_port}",
    ]


def free_port() -> int:
    """A port free on 127.0.0.1 now (socat cannot report the one it binds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


def listening(port: int) -> bool:
    """Whether something listens on 127.0.0.1:port (``/proc/net/tcp``: no
    connection is made, so socat forks nothing)."""
    local = f"0100007F:{port:04X}"
    with open("/proc/net/tcp", encoding="ascii") as table:
        next(table)
        return any(
            fields[1] == local and fields[3] == "0A" for fields in (line.split() for line in table)
        )


def start_socat(executable: str, sink_port: int, buffer: int, cpus: str) -> Socat:
    def prepare() -> None:  # in the child, between fork and exec; no thread runs yet
        pin(cpus)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    for _attempt in range(3):  # the free port may be taken in between: retry
        port = free_port()
        log = tempfile.TemporaryFile()  # noqa: SIM115  (closed with the Socat)
        process = subprocess.Popen(
            socat_command(executable, port, sink_port, buffer),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,  # its own process group, children included
            preexec_fn=prepare,
        )
        socat = Socat("socat", process, port, log)
        ready = False
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while process.poll() is None and time.monotonic() < deadline:
                if listening(port):
                    ready = True
                    return socat
                time.sleep(0.01)
            exited = process.poll() is not None  # by itself (else: timed out)
        finally:
            if not ready:  # failed, timed out or interrupted (Ctrl-C): no socat left
                stop_socat(socat)
        message = socat.error_output() or "no message"
        log.close()
        if exited and "Address already in use" in message:
            continue
        status = f"exited with status {process.returncode}" if exited else "timed out"
        raise BenchError(f"socat did not start listening on port {port} ({status}): {message}")
    raise BenchError("socat: no free port found in 3 attempts")


def stop_socat(socat: Socat) -> None:
    """End socat's whole process group: SIGTERM, then SIGKILL."""
    process = socat.process
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    # Children left (they got the SIGTERM too): the group still exists while
    # one lives, so its id cannot have been reused.
    deadline = time.monotonic() + 5
    while socat.members():
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            break
        time.sleep(0.01)


# ---------------------------------------------------------------------------
# The client's measurements
# ---------------------------------------------------------------------------


@dataclass
class Sample:
    """One timed run: the rate, and the CPU each side used (in cores): the
    forwarder measured (relay or socat; NaN for a direct run), the time it
    waited for its CPU (NaN when not known), the sink and this client."""

    rate: float
    forwarder_cpu: float
    forwarder_waiting: float
    client_sink_cpu: float


@dataclass(frozen=True)
class Route:
    """How the client reaches the sink: ``direct``, ``relay`` or ``socat``."""

    name: str
    port: int
    #: Through the relay: a CONNECT first.
    connect: bool
    #: The process forwarding the bytes, whose CPU is measured (None: direct).
    forwarder: Child | Socat | None


class CpuMeter:
    def __init__(self, sink: Child) -> None:
        self._sink = sink

    def client_sink_seconds(self) -> float:
        # getrusage, not os.times: its total is exact (os.times counts 10 ms ticks),
        # and it includes the client threads that have ended.
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return self._sink.cpu_seconds()[0] + usage.ru_utime + usage.ru_stime

    @staticmethod
    def forwarder_seconds(route: Route) -> tuple[float, float]:
        """(run time, time waiting for a CPU) of the route's forwarder."""
        if route.forwarder is None:
            return float("nan"), float("nan")
        if isinstance(route.forwarder, Socat):
            route.forwarder.settle()
        return route.forwarder.cpu_seconds()

    def measure(self, amount: float, route: Route, run: Callable[[], None]) -> Sample:
        forwarder_before = self.forwarder_seconds(route)
        client_sink_before = self.client_sink_seconds()
        start = time.perf_counter()
        run()
        wall = time.perf_counter() - start
        client_sink_after = self.client_sink_seconds()  # before the settling wait
        forwarder_after = self.forwarder_seconds(route)
        return Sample(
            amount / wall,
            (forwarder_after[0] - forwarder_before[0]) / wall,
            (forwarder_after[1] - forwarder_before[1]) / wall,
            (client_sink_after - client_sink_before) / wall,
        )


def upload(sock: socket.socket, size: int) -> None:
    payload = memoryview(bytes(CHUNK_BYTES))
    sock.sendall(b"U")
    remaining = size
    while remaining:
        chunk = min(CHUNK_BYTES, remaining)
        sock.sendall(payload[:chunk])
        remaining -= chunk
    sock.shutdown(socket.SHUT_WR)
    count = COUNT.unpack(recv_exact(sock, COUNT.size))[0]
    if count != size:
        raise BenchError(f"upload: the sink received {count} bytes of {size}")


def download(sock: socket.socket, size: int) -> None:
    sock.sendall(b"D" + COUNT.pack(size))
    received = drain_to_eof(sock, bytearray(CHUNK_BYTES))
    if received != size:
        raise BenchError(f"download: received {received} bytes of {size}")


def transfer(meter: CpuMeter, route: Route, direction: str, size: int) -> Sample:
    sock = open_tunnel(route.port) if route.connect else tcp_connect(route.port)
    try:
        move = upload if direction == "upload" else download
        return meter.measure(size / MB, route, lambda: move(sock, size))
    finally:
        sock.close()


def echo_once(port: int, relayed: bool) -> None:
    sock = open_tunnel(port) if relayed else tcp_connect(port)
    try:
        sock.sendall(PING)
        answer = recv_exact(sock, len(PING))
        if answer != PING:
            raise BenchError(f"echo: sent {PING!r}, got {answer!r}")
    finally:
        sock.close()


def open_many(port: int, relayed: bool, total: int, concurrency: int) -> None:
    """``total`` tunnels (or direct connections), ``concurrency`` at a time."""
    lock = threading.Lock()
    started = 0
    errors: list[str] = []
    go = threading.Event()

    def worker() -> None:
        nonlocal started
        go.wait()
        while True:
            with lock:
                if started >= total or errors:
                    return
                started += 1
            try:
                echo_once(port, relayed)
            except (OSError, BenchError) as exc:
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc}")
                return

    threads = [
        threading.Thread(target=worker, name=f"client-{i}", daemon=True) for i in range(concurrency)
    ]
    for thread in threads:
        thread.start()
    go.set()
    for thread in threads:
        thread.join()
    if errors:
        raise BenchError(f"{len(errors)} tunnel(s) failed; first: {errors[0]}")


# ---------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------


def figure(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def percent(value: float) -> str:
    return f"{100 * value:.0f}%"


ROUTES = ("direct", "relay", "socat")


@dataclass
class Result:
    what: str
    unit: str
    #: What one unit of the rate is, for the forwarders' CPU cost ("MB", "tunnel").
    item: str
    #: The samples of each route (``ROUTES``), in the order they were taken.
    runs: dict[str, list[Sample]]

    def best(self, route: str) -> Sample:
        return max(self.runs[route], key=lambda s: s.rate)

    def cost(self, route: str) -> float:
        """The forwarder's CPU seconds per unit (MB, tunnel) in the best run."""
        best = self.best(route)
        return best.forwarder_cpu / best.rate

    def rate_row(self) -> list[str]:
        direct, relay, socat = (self.best(route) for route in ROUTES)
        return [
            f"{self.what} ({self.unit})",
            figure(direct.rate),
            figure(relay.rate),
            figure(socat.rate),
            f"{relay.rate / direct.rate:.2f}",
            f"{relay.rate / socat.rate:.2f}",
            *(" ".join(figure(s.rate) for s in self.runs[route]) for route in ROUTES),
        ]

    def cpu_row(self) -> list[str]:
        direct, relay, socat = (self.best(route) for route in ROUTES)
        return [
            f"{self.what}",
            f"{percent(relay.forwarder_cpu)} (+{percent(relay.forwarder_waiting)})",
            f"{1e6 * self.cost('relay'):,.0f} us/{self.item}",
            percent(socat.forwarder_cpu),
            f"{1e6 * self.cost('socat'):,.0f} us/{self.item}",
            f"{self.cost('relay') / self.cost('socat'):.2f}",
            " / ".join(percent(s.client_sink_cpu) for s in (direct, relay, socat)),
        ]


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Bounce relay throughput (MB/s through one tunnel, tunnels/s) "
        "against direct loopback TCP and socat, measured in the same run."
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="20 MB, 500 tunnels, one repetition: a smoke run of ~15 s",
    )
    parser.add_argument(
        "--mb",
        type=int,
        default=None,
        help="MB (10^6 bytes) per direction through one tunnel (default 200)",
    )
    parser.add_argument(
        "--tunnels", type=int, default=None, help="tunnels per tunnel-rate run (default 4000)"
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=64,
        help="client threads opening tunnels at once (default 64)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="runs per measurement, the best is kept (default 3, 1 with --quick)",
    )
    parser.add_argument(
        "--profile-relay",
        metavar="FILE",
        default=None,
        help="run the relay under cProfile, write its stats to FILE and print "
        "the top functions (the profiler slows the relay: figures are not "
        "comparable with an unprofiled run)",
    )
    parser.add_argument(
        "--socat-buffer",
        type=int,
        default=SOCAT_DEFAULT_BUFFER,
        metavar="BYTES",
        help=f"socat's read size, -b (default {SOCAT_DEFAULT_BUFFER}, socat's own default; "
        f"the relay reads up to {RelayConfig().buffer_bytes} bytes)",
    )
    # Internal: the child processes.
    parser.add_argument("--role", choices=("relay", "sink"), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--cpus", default="", help=argparse.SUPPRESS)
    parser.add_argument("--dial-port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--max-tunnels", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--profile", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.mb is None:
        args.mb = 20 if args.quick else 200
    if args.tunnels is None:
        args.tunnels = 500 if args.quick else 4000
    if args.repeat is None:
        args.repeat = 1 if args.quick else 3
    for name in ("mb", "tunnels", "concurrency", "repeat", "socat_buffer"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def cpu_plan() -> tuple[str, str, str]:
    """(relay CPUs, client and sink CPUs, a sentence saying so)."""
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) < 2:
        return "", "", "not pinned (1 usable core: relay, sink and client share it)"
    relay = str(usable[0])
    others = ",".join(map(str, usable[1:]))
    return (
        relay,
        others,
        (
            f"relay process, and socat with its children, pinned to CPU {relay}; sink "
            f"process and client (this process) pinned to CPU {others}"
        ),
    )


@contextlib.contextmanager
def children(
    args: argparse.Namespace, socat_executable: str, relay_cpus: str, other_cpus: str
) -> Iterator[tuple[Child, Child, Socat, list[str]]]:
    """The sink, the relay and socat, ended on the way out whatever happens;
    the list receives the relay's closing report (statistics) when it exits."""
    report: list[str] = []
    started: list[Child | Socat] = []
    try:
        sink = start_child(
            "sink",
            [
                "--cpus",
                other_cpus,
                "--threads",
                str(max(16, 2 * args.concurrency + 8)),
            ],
        )
        started.append(sink)
        relay_arguments = [
            "--cpus",
            relay_cpus,
            "--dial-port",
            str(sink.port),
            "--max-tunnels",
            str(relay_max_tunnels(args)),
        ]
        if args.profile_relay:
            relay_arguments += ["--profile", os.path.abspath(args.profile_relay)]
        relay = start_child("relay", relay_arguments)
        started.append(relay)
        socat = start_socat(socat_executable, sink.port, args.socat_buffer, relay_cpus)
        started.append(socat)
        yield relay, sink, socat, report
    finally:
        # socat first; then the relay, gracefully, so that it writes its
        # statistics/profile; the sink last.
        for child in reversed(started):
            if isinstance(child, Socat):
                stop_socat(child)
                child.log.close()
                continue
            output = stop_child(child, gracefully=child.name == "relay")
            if child.name == "relay":
                report.append(output)


def relay_max_tunnels(args: argparse.Namespace) -> int:
    return max(RelayConfig().max_tunnels, 4 * args.concurrency)


def measure_all(args: argparse.Namespace, relay: Child, sink: Child, socat: Socat) -> list[Result]:
    meter = CpuMeter(sink)
    size = args.mb * MB
    routes = [
        Route("direct", sink.port, False, None),
        Route("relay", relay.port, True, relay),
        Route("socat", socat.port, False, socat),
    ]
    # Fails fast, with the relay's answer, if the relay refuses.
    for route in routes:
        echo_once(route.port, route.connect)
    # Warm-up (not timed): code paths, the sink's threads, TCP autotuning.
    for route in routes:
        for direction in ("upload", "download"):
            transfer(meter, route, direction, min(size, 20 * MB))
        open_many(
            route.port, route.connect, min(args.tunnels, 2 * args.concurrency), args.concurrency
        )

    results: list[Result] = []
    for direction in ("upload", "download"):
        result = Result(f"{direction}, one tunnel", "MB/s", "MB", {r.name: [] for r in routes})
        for _ in range(args.repeat):
            for route in routes:
                result.runs[route.name].append(transfer(meter, route, direction, size))
        results.append(result)
    result = Result(
        f"tunnels opened, {args.concurrency} at once", "/s", "tunnel", {r.name: [] for r in routes}
    )
    for _ in range(args.repeat):
        for route in routes:
            result.runs[route.name].append(
                meter.measure(
                    args.tunnels,
                    route,
                    lambda route=route: open_many(
                        route.port, route.connect, args.tunnels, args.concurrency
                    ),
                )
            )
    results.append(result)
    return results


def run_benchmark(args: argparse.Namespace, command: str) -> int:
    # harness: the machine lock and the tool installer shared by the benchmarks
    # (imported here, not at the top: the child processes do not need it).
    import harness

    try:
        socat_executable = harness.ensure_tool("socat")
    except harness.BenchError as exc:
        raise BenchError(str(exc)) from exc
    with harness.machine_lock():
        return measure_and_report(args, command, socat_executable)


def measure_and_report(args: argparse.Namespace, command: str, socat_executable: str) -> int:
    machine = common.machine_description()  # before pinning, which changes the usable cores
    relay_cpus, other_cpus, pinning = cpu_plan()
    if other_cpus:
        # Before any thread starts: threads inherit the affinity of their creator.
        os.sched_setaffinity(0, {int(c) for c in other_cpus.split(",")})
    print("# Bounce relay throughput")
    print(f"machine: {machine}")
    print(f"command: {command}")
    print(f"started: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    print(f"pinning: {pinning}")
    print(
        f"settings: {args.mb} MB per direction, {args.tunnels} tunnels by "
        f"{args.concurrency} client threads, best of {args.repeat}, "
        f"client/sink chunks {CHUNK_BYTES // 1024} KiB, relay buffer_bytes "
        f"{RelayConfig().buffer_bytes // 1024} KiB (default), relay max_tunnels "
        f"{relay_max_tunnels(args)}"
    )
    shown = socat_command("socat", 0, 0, args.socat_buffer)
    shown[3:] = [
        "TCP-LISTEN:<port>,bind=127.0.0.1,reuseaddr,fork,backlog=1024",
        "TCP:127.0.0.1:<sink port>",
    ]
    default = " (socat's default)" if args.socat_buffer == SOCAT_DEFAULT_BUFFER else ""
    print(
        f"socat: {socat_version(socat_executable)}, `{' '.join(shown)}`: -b "
        f"{args.socat_buffer} bytes per read{default}; one process forked per connection"
    )
    if args.profile_relay:
        print("note: the relay runs under cProfile; its figures are slowed by the profiler")
    print(flush=True)

    with children(args, socat_executable, relay_cpus, other_cpus) as (relay, sink, socat, report):
        try:
            results = measure_all(args, relay, sink, socat)
        except (OSError, BenchError) as exc:
            for child in (relay, sink, socat):
                if child.process.poll() is not None:
                    detail = f": {socat.error_output()}" if child is socat else ""
                    raise BenchError(
                        f"the {child.name} process exited with status "
                        f"{child.process.returncode}{detail} ({type(exc).__name__}: {exc})"
                    ) from exc
            raise
    print("## Rates\n")
    common.print_table(
        [
            "measurement",
            "direct",
            "via relay",
            "via socat",
            "relay/direct",
            "relay/socat",
            "direct runs",
            "relay runs",
            "socat runs",
        ],
        [result.rate_row() for result in results],
    )
    print(
        "Best of the runs in the first columns (each run's figure at the right). The relay "
        "answers a CONNECT per tunnel; socat has none, but forks a process per connection "
        "(the relay: one process, one task per tunnel)."
    )
    print("\n## CPU of the forwarders (best run)\n")
    common.print_table(
        [
            "measurement",
            "relay CPU (+waiting)",
            "relay CPU cost",
            "socat CPU",
            "socat CPU cost",
            "relay cost/socat cost",
            "client+sink CPU (direct / relay / socat)",
        ],
        [result.cpu_row() for result in results],
    )
    print(
        "CPU: cores busy during the best run (100% = one core): the relay process (and, "
        "in brackets, the time it was runnable but waiting for its CPU, taken by another "
        "process: noise); socat's whole process group (parent, forked children: fork, "
        "copy-on-write faults and exit included; its waiting time is not known); the sink "
        "process plus this client. CPU cost: the forwarder's CPU time per MB or per tunnel "
        "in its best run, the figure least disturbed by other load on the machine."
    )
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"finished: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, load average {load}")
    closing = " ".join(report).strip()
    for line in closing.splitlines():
        if line.startswith("STATS "):
            print(f"relay statistics at exit: {line[6:]}")
    if args.profile_relay:
        print_profile(args.profile_relay)
    return 0


def print_profile(path: str) -> None:
    import pstats

    if not os.path.exists(path):
        print(f"(no profile written to {path})")
        return
    print(f"\nrelay profile ({path}), top 25 by own time:")
    sys.stdout.flush()
    stats = pstats.Stats(path, stream=sys.stdout)
    stats.sort_stats("tottime").print_stats(25)


def raise_system_exit(signum: int, frame: FrameType | None) -> None:
    print(f"bench_relay: stopped by {signal.Signals(signum).name}", file=sys.stderr)
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_arguments(argv)
    if args.role == "sink":
        return run_sink(args)
    if args.role == "relay":
        return run_relay(args)
    # SIGTERM and SIGHUP unwind like Ctrl-C, through the clean-up of the children.
    signal.signal(signal.SIGTERM, raise_system_exit)
    signal.signal(signal.SIGHUP, raise_system_exit)
    given = sys.argv[1:] if argv is None else list(argv)
    command = " ".join([".venv/bin/python", "bench/bench_relay.py", *given])
    try:
        return run_benchmark(args, command)
    except BenchError as exc:
        print(f"bench_relay: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"bench_relay: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench_relay: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
