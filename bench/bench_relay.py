"""Bounce relay throughput: MB/s through one tunnel, tunnels opened per second.

    .venv/bin/python bench/bench_relay.py            # full run (about a minute)
    .venv/bin/python bench/bench_relay.py --quick    # smoke run (about 10 s)
    .venv/bin/python bench/bench_relay.py --profile-relay relay.prof   # + cProfile of the relay

Three processes, loopback only (127.0.0.1; no name is ever resolved):

- the **relay**: the real :class:`notary.server.relay.RelayHandler` served by
  ``trio.serve_listeners`` on ``127.0.0.1:0``, configured ``destinations =
  "public"``, ``allow_addresses = ["127.0.0.0/8"]``, ``dial_port`` = the
  sink's port, ``max_tunnels`` raised to fit the test, every other setting
  (``buffer_bytes`` included) at its default. Its resolver refuses every name.
- the **sink**: plain blocking sockets, a fixed pool of threads each
  accepting and serving one connection at a time (no thread is started per
  connection). The first byte of a connection says what to do:
  ``U`` read until end of file and answer the byte count (8 bytes);
  ``D`` + 8-byte length: send that many bytes, half-close, wait for end of
  file; ``E`` + 15 bytes: echo the 16 bytes, wait for end of file.
- the **client**: this process, plain blocking sockets, 256 KiB chunks
  (``sendall`` of a memoryview, ``recv_into`` a preallocated buffer).

With two or more usable cores the relay is pinned to the first one and the
sink and client to the others, so that the relay's core is what the "via
relay" figures measure; the CPU columns say how busy each side was (100% =
one core), so a client/sink bottleneck shows, and how long the relay waited
for its core while another process had it (``/proc/<pid>/task/*/schedstat``:
noise on a shared machine). "Relay CPU cost" (the relay's CPU time per MB or
per tunnel) is the figure to compare between runs on a noisy machine. The
relay is idle during the direct baselines.

Measurements, each the best of ``--repeat`` runs, direct and relayed runs
interleaved (noise on a shared machine only ever makes a run slower):

1. Upload (client -> destination) and download (destination -> client) of
   ``--mb`` MB (10^6 bytes) through one tunnel, timed from the first byte
   sent to the last byte (or the byte-count answer) received, the tunnel
   being already established. Baseline: the same transfer over a direct
   loopback TCP connection to the sink.
2. Tunnels per second: ``--tunnels`` tunnels by ``--concurrency`` client
   threads, each ``CONNECT 127.0.0.1:4242``, waiting for ``HTTP/1.0 200
   Connection Established``, a 16-byte echo with the sink, close. Baseline:
   direct TCP connections to the sink doing the same echo.

Exit status: 0 after printing the tables; 1 with a message on stderr when
anything fails (a child does not start, the relay refuses a tunnel, a byte
count is wrong, a timeout); 130 on Ctrl-C. The child processes are ended on
every exit path (they also exit by themselves when this process dies, as
their stdin closes).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import resource
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

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


# ---------------------------------------------------------------------------
# The client's measurements
# ---------------------------------------------------------------------------


@dataclass
class Sample:
    """One timed run: the rate, and the CPU each side used (in cores)."""

    rate: float
    relay_cpu: float
    relay_waiting: float
    client_sink_cpu: float


class CpuMeter:
    def __init__(self, relay: Child, sink: Child) -> None:
        self._relay = relay
        self._sink = sink

    def snapshot(self) -> tuple[float, float, float, float]:
        """(wall clock, relay run time, relay time waiting for a CPU, sink +
        client run time), in seconds."""
        # getrusage, not os.times: its total is exact (os.times counts 10 ms ticks),
        # and it includes the client threads that have ended.
        usage = resource.getrusage(resource.RUSAGE_SELF)
        relay_run, relay_wait = self._relay.cpu_seconds()
        return (
            time.perf_counter(),
            relay_run,
            relay_wait,
            self._sink.cpu_seconds()[0] + usage.ru_utime + usage.ru_stime,
        )

    def measure(self, amount: float, run: Callable[[], None]) -> Sample:
        start = self.snapshot()
        run()
        end = self.snapshot()
        wall = end[0] - start[0]
        busy = [(after - before) / wall for before, after in zip(start[1:], end[1:], strict=True)]
        return Sample(amount / wall, *busy)


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


def transfer(meter: CpuMeter, port: int, relayed: bool, direction: str, size: int) -> Sample:
    sock = open_tunnel(port) if relayed else tcp_connect(port)
    try:
        move = upload if direction == "upload" else download
        return meter.measure(size / MB, lambda: move(sock, size))
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


def cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def machine_line() -> str:
    cores = os.cpu_count() or 0
    usable = len(os.sched_getaffinity(0))
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"{cpu_model()}, {cores} cores ({usable} usable), "
        f"{platform.system()} {platform.release()} {platform.machine()}, "
        f"{platform.python_implementation()} {platform.python_version()}, "
        f"load average {load}"
    )


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    cells = [list(headers), *[list(row) for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        padded = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        return "| " + " | ".join(padded) + " |"

    print(line(cells[0]))
    print("| " + " | ".join("-" * width for width in widths) + " |")
    for row in cells[1:]:
        print(line(row))
    print()


def figure(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def percent(value: float) -> str:
    return f"{100 * value:.0f}%"


@dataclass
class Result:
    what: str
    unit: str
    #: What one unit of the rate is, for the relay's CPU cost ("MB", "tunnel").
    item: str
    direct: list[Sample]
    relayed: list[Sample]

    def row(self) -> list[str]:
        direct = max(self.direct, key=lambda s: s.rate)
        relayed = max(self.relayed, key=lambda s: s.rate)
        return [
            f"{self.what} ({self.unit})",
            figure(direct.rate),
            figure(relayed.rate),
            f"{relayed.rate / direct.rate:.2f}",
            f"{percent(relayed.relay_cpu)} (+{percent(relayed.relay_waiting)})",
            f"{1e6 * relayed.relay_cpu / relayed.rate:,.0f} us/{self.item}",
            f"{percent(direct.client_sink_cpu)} / {percent(relayed.client_sink_cpu)}",
            " ".join(figure(s.rate) for s in self.direct),
            " ".join(figure(s.rate) for s in self.relayed),
        ]


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Bounce relay throughput (MB/s through one tunnel, tunnels/s) "
        "against direct loopback TCP, measured in the same run."
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="20 MB, 500 tunnels, one repetition: a smoke run of ~10 s",
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
    for name in ("mb", "tunnels", "concurrency", "repeat"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
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
            f"relay process pinned to CPU {relay}; sink process and client (this process) "
            f"pinned to CPU {others}"
        ),
    )


@contextlib.contextmanager
def children(
    args: argparse.Namespace, relay_cpus: str, other_cpus: str
) -> Iterator[tuple[Child, Child, list[str]]]:
    """The sink and the relay, ended on the way out whatever happens; the
    list receives the relay's closing report (statistics) when it exits."""
    report: list[str] = []
    started: list[Child] = []
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
        yield relay, sink, report
    finally:
        # The relay first, gracefully, so that it writes its statistics/profile.
        for child in reversed(started):
            output = stop_child(child, gracefully=child.name == "relay")
            if child.name == "relay":
                report.append(output)


def relay_max_tunnels(args: argparse.Namespace) -> int:
    return max(RelayConfig().max_tunnels, 4 * args.concurrency)


def measure_all(args: argparse.Namespace, relay: Child, sink: Child) -> list[Result]:
    meter = CpuMeter(relay, sink)
    size = args.mb * MB
    # Fails fast, with the relay's answer, if the relay refuses.
    echo_once(relay.port, True)
    echo_once(sink.port, False)
    # Warm-up (not timed): code paths, the sink's threads, TCP autotuning.
    for relayed, port in ((False, sink.port), (True, relay.port)):
        for direction in ("upload", "download"):
            transfer(meter, port, relayed, direction, min(size, 20 * MB))
        open_many(port, relayed, min(args.tunnels, 2 * args.concurrency), args.concurrency)

    results: list[Result] = []
    for direction in ("upload", "download"):
        result = Result(f"{direction}, one tunnel", "MB/s", "MB", [], [])
        for _ in range(args.repeat):
            result.direct.append(transfer(meter, sink.port, False, direction, size))
            result.relayed.append(transfer(meter, relay.port, True, direction, size))
        results.append(result)
    result = Result(f"tunnels opened, {args.concurrency} at once", "/s", "tunnel", [], [])
    for _ in range(args.repeat):
        result.direct.append(
            meter.measure(
                args.tunnels, lambda: open_many(sink.port, False, args.tunnels, args.concurrency)
            )
        )
        result.relayed.append(
            meter.measure(
                args.tunnels, lambda: open_many(relay.port, True, args.tunnels, args.concurrency)
            )
        )
    results.append(result)
    return results


def run_benchmark(args: argparse.Namespace, command: str) -> int:
    machine = machine_line()  # before pinning, which changes the usable cores
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
    if args.profile_relay:
        print("note: the relay runs under cProfile; its figures are slowed by the profiler")
    print(flush=True)

    with children(args, relay_cpus, other_cpus) as (relay, sink, report):
        try:
            results = measure_all(args, relay, sink)
        except (OSError, BenchError) as exc:
            for child in (relay, sink):
                if child.process.poll() is not None:
                    raise BenchError(
                        f"the {child.name} process exited with status "
                        f"{child.process.returncode} ({type(exc).__name__}: {exc})"
                    ) from exc
            raise
    print_table(
        [
            "measurement",
            "direct",
            "via relay",
            "relay/direct",
            "relay CPU (+waiting)",
            "relay CPU cost",
            "client+sink CPU (direct / relay)",
            "direct runs",
            "relay runs",
        ],
        [result.row() for result in results],
    )
    print(
        "Best of the runs in the first three columns (each run's figure at the right). "
        "CPU: cores busy during the best run (100% = one core): the relay process (and, "
        "in brackets, the time it was runnable but waiting for its CPU, taken by another "
        "process: noise), and the sink process plus this client, in the direct and the "
        "relayed run. Relay CPU cost: the relay's CPU time per MB or per tunnel in the best "
        "run, the figure least disturbed by other load on the machine."
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
