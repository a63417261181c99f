"""Bounce relay throughput: MB/s through one tunnel, tunnels opened per second.

    .venv/bin/python bench/bench_relay.py            # full run (about two minutes)
    .venv/bin/python bench/bench_relay.py --quick    # smoke run (about 15 s)
    .venv/bin/python bench/bench_relay.py --profile-relay relay.prof   # + cProfile of the relay

The real ``RelayHandler`` and socat against direct loopback TCP (127.0.0.1 only);
what each part measures, the pinning and the CPU figures: ``bench/README.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import os
import pstats
import resource
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# Importing harness also puts the project root on sys.path.
from harness.loopback import LOOPBACK, connect, free_ports
from harness.machine import CLOCK_TICK, all_proc_stats, cores_and_load, proc_stat
from harness.options import argument_parser, repetitions
from harness.processes import Processes, run_benchmark, tail
from harness.project import BenchError
from harness.report import header, print_table
from harness.servers import start_server
from harness.tools import ensure_tool

from notary.config import RelayConfig

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
COUNT = struct.Struct("!Q")
#: What the client uploads and the sink sends: zeros, a chunk at a time.
ZEROS = memoryview(bytes(CHUNK_BYTES))
#: socat's own read size (``-b``) when not given: what a plain socat uses.
SOCAT_DEFAULT_BUFFER = 8192
#: Time allowed to socat's forked children to exit after a measurement.
SETTLE_TIMEOUT_S = 10.0
ROUTES = ("direct", "relay", "socat")
NAN = float("nan")


@contextlib.contextmanager
def client_connection(route: Route) -> Iterator[socket.socket]:
    """A connection to the route's port on 127.0.0.1 (an IP literal: no
    lookup); through the relay, past its ``200`` answer."""
    with connect(route.port, tls=False, timeout_s=SOCKET_TIMEOUT_S) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if route.name == "relay":
            sock.sendall(CONNECT_REQUEST)
            head = b""
            while (b"\r\n\r\n" not in head and len(head) <= MAX_HEAD_BYTES
                   and (chunk := sock.recv(MAX_HEAD_BYTES))):
                head += chunk
            if not head.startswith(ESTABLISHED) or not head.endswith(b"\r\n\r\n"):
                first_line = head.split(b"\r\n", 1)[0].decode("latin-1") or "nothing"
                raise BenchError(f"the relay did not open the tunnel: it sent {len(head)} bytes, "
                                 f"first line {first_line!r} (a 200 head alone expected)")
        yield sock


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
    while received := sock.recv_into(buffer):
        total += received
    return total


def send_zeros(sock: socket.socket, size: int) -> None:
    while size:
        chunk = min(CHUNK_BYTES, size)
        sock.sendall(ZEROS[:chunk])
        size -= chunk


def sink_serve(listener: socket.socket) -> None:
    """Serve the connections of ``listener`` one at a time, forever; a failed
    one is closed (the client sees the failure)."""
    buffer = bytearray(CHUNK_BYTES)
    while True:
        conn, _ = listener.accept()
        with conn, contextlib.suppress(OSError, BenchError):
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(SOCKET_TIMEOUT_S)
            command = conn.recv(1)
            if command == b"U":
                conn.sendall(COUNT.pack(drain_to_eof(conn, buffer)))
            elif command == b"D":
                send_zeros(conn, COUNT.unpack(recv_exact(conn, COUNT.size))[0])
                conn.shutdown(socket.SHUT_WR)
                drain_to_eof(conn, buffer)
            elif command == b"E":
                conn.sendall(command + recv_exact(conn, len(PING) - 1))
                drain_to_eof(conn, buffer)


def run_sink(args: argparse.Namespace) -> int:
    listener = socket.create_server((LOOPBACK, args.port), backlog=socket.SOMAXCONN)
    for index in range(max(16, 2 * args.concurrency + 8)):
        threading.Thread(target=sink_serve, args=(listener,), name=f"sink-{index}",
                         daemon=True).start()
    threading.Event().wait()  # until SIGTERM (Processes.stop)
    return 0


def run_relay(args: argparse.Namespace) -> int:
    """Serve until SIGTERM, then write the profile (``--profile-relay``) and
    print the relay's statistics to its log."""
    import trio

    from notary.errors import ProbeResolveFailed
    from notary.server.relay import RelayHandler

    config = RelayConfig(listen=(), destinations="public", allow_addresses=("127.0.0.0/8",),
                         dial_port=args.sink_port, max_tunnels=args.max_tunnels)

    async def resolve_nothing(host: str, port: int) -> list[str]:
        raise ProbeResolveFailed("the benchmark relay resolves no names")

    handler = RelayHandler(config, trusted=None, resolver=resolve_nothing)

    async def serve() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            listeners = await trio.open_tcp_listeners(args.port, host=LOOPBACK)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.serve_listeners, handler, listeners)
                await anext(signals)
                nursery.cancel_scope.cancel()

    profiler = cProfile.Profile() if args.profile_relay else None
    with profiler or contextlib.nullcontext():
        trio.run(serve)
    if profiler is not None:
        profiler.dump_stats(args.profile_relay)
    stats = handler.statistics()
    print(f"STATS tunnels_opened={stats.tunnels_opened} refused={dict(stats.refused)} "
          f"bytes_to_destinations={stats.bytes_to_destinations} "
          f"bytes_to_clients={stats.bytes_to_clients}", flush=True)
    return 0


# Not harness.runs.Meter: transfers last a few ms (schedstat counts ns, /proc/<pid>/stat
# 10 ms ticks), the client is this process, not a reaped child, and socat is a group.
def schedstat_seconds(pid: int) -> tuple[float, float]:
    """Seconds the threads of ``pid`` have run so far, and seconds they spent
    runnable but waiting for a CPU (``/proc/<pid>/task/*/schedstat``)."""
    run = wait = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return NAN, NAN
    for task in tasks:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/schedstat") as file:
            fields = file.read().split()
            run += int(fields[0])
            wait += int(fields[1])
    return run / 1e9, wait / 1e9


def socat_seconds(pid: int) -> tuple[float, float]:
    """(run time, NaN: waiting not known) so far of socat's process group (pgid
    = pid) once the last connections' children have exited (bounded wait):
    socat, its reaped children (cutime + cstime) and live ones (zombies too)."""
    def children() -> list[int]:
        return [member for member, fields in all_proc_stats().items()
                if member != pid and fields[2] == str(pid)]

    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while children() and time.monotonic() < deadline:
        time.sleep(0.002)
    try:
        fields = proc_stat(pid)
        total = (schedstat_seconds(pid)[0]
                 + (int(fields[13]) + int(fields[14])) / CLOCK_TICK)
    except (OSError, IndexError, ValueError):
        return NAN, NAN
    for child in children():
        run = schedstat_seconds(child)[0]
        total += run if run == run else 0.0  # NaN: gone meanwhile
    return total, NAN


@dataclass(frozen=True)
class Route:
    """How the client reaches the sink: ``direct``, ``relay`` (a CONNECT
    first) or ``socat``, and the (run, waiting) CPU seconds so far of the
    process forwarding the bytes (NaN: not known, or none)."""

    name: str
    port: int
    forwarder_seconds: Callable[[], tuple[float, float]] = lambda: (NAN, NAN)


@dataclass
class Sample:
    """One timed run: the rate, and the CPU each side used (in cores): the
    forwarder measured (relay or socat; NaN for a direct run), the time it
    waited for its CPU (NaN when not known), the sink and this client."""

    rate: float
    forwarder_cpu: float
    forwarder_waiting: float
    client_sink_cpu: float


def measure(amount: float, route: Route, sink_pid: int, run: Callable[[], None]) -> Sample:
    """Time ``run``, which moves ``amount`` (MB, tunnels) through ``route``."""
    def client_sink_seconds() -> float:
        # getrusage, not os.times: its total is exact (os.times counts 10 ms
        # ticks), and it includes the client threads that have ended.
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return schedstat_seconds(sink_pid)[0] + usage.ru_utime + usage.ru_stime

    forwarder_before = route.forwarder_seconds()
    client_sink_before = client_sink_seconds()
    start = time.perf_counter()
    run()
    wall = time.perf_counter() - start
    client_sink = client_sink_seconds() - client_sink_before  # before socat settles
    forwarder_after = route.forwarder_seconds()
    return Sample(amount / wall, (forwarder_after[0] - forwarder_before[0]) / wall,
                  (forwarder_after[1] - forwarder_before[1]) / wall, client_sink / wall)


def move(sock: socket.socket, direction: str, size: int) -> None:
    """Upload ``size`` bytes (``U``: the sink answers the count it read) or
    download them (``D`` + the count: the sink sends them)."""
    if direction == "upload":
        sock.sendall(b"U")
        send_zeros(sock, size)
        sock.shutdown(socket.SHUT_WR)
        arrived = COUNT.unpack(recv_exact(sock, COUNT.size))[0]
    else:
        sock.sendall(b"D" + COUNT.pack(size))
        arrived = drain_to_eof(sock, bytearray(CHUNK_BYTES))
    if arrived != size:
        raise BenchError(f"{direction}: {arrived} bytes of {size} arrived")


def transfer(route: Route, sink_pid: int, direction: str, size: int) -> Sample:
    """One timed upload or download through a tunnel opened beforehand."""
    with client_connection(route) as sock:
        return measure(size / MB, route, sink_pid, lambda: move(sock, direction, size))


def echo_once(route: Route) -> None:
    with client_connection(route) as sock:
        sock.sendall(PING)
        answer = recv_exact(sock, len(PING))
    if answer != PING:
        raise BenchError(f"echo: sent {PING!r}, got {answer!r}")


def open_many(route: Route, total: int, concurrency: int) -> None:
    """``total`` tunnels (or direct connections), ``concurrency`` at a time;
    the first failure stops them all."""
    tickets = iter(range(total))
    lock = threading.Lock()
    errors: list[str] = []
    go = threading.Event()

    def worker() -> None:
        go.wait()
        try:
            while not errors:
                with lock:
                    if next(tickets, None) is None:
                        return
                echo_once(route)
        except (OSError, BenchError) as exc:
            errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=worker, name=f"client-{i}", daemon=True)
               for i in range(concurrency)]
    for thread in threads:
        thread.start()
    go.set()
    for thread in threads:
        thread.join()
    if errors:
        raise BenchError(f"{len(errors)} tunnel(s) failed; first: {errors[0]}")


def figure(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


@dataclass
class Result:
    what: str
    unit: str
    #: What one unit of the rate is, for the forwarders' CPU cost ("MB", "tunnel").
    item: str
    #: The samples of each route (``ROUTES``), in the order they were taken.
    runs: dict[str, list[Sample]] = field(default_factory=lambda: {r: [] for r in ROUTES})

    def best(self) -> list[Sample]:
        """The best sample of each route (``ROUTES``)."""
        return [max(self.runs[route], key=lambda s: s.rate) for route in ROUTES]

    def rate_row(self) -> list[str]:
        direct, relay, socat = self.best()
        return [f"{self.what} ({self.unit})", *(figure(s.rate) for s in (direct, relay, socat)),
                f"{relay.rate / direct.rate:.2f}", f"{relay.rate / socat.rate:.2f}",
                *(" ".join(figure(s.rate) for s in self.runs[route]) for route in ROUTES)]

    def cpu_row(self) -> list[str]:
        direct, relay, socat = self.best()
        relay_cost, socat_cost = relay.forwarder_cpu / relay.rate, socat.forwarder_cpu / socat.rate
        return [self.what, f"{relay.forwarder_cpu:.0%} (+{relay.forwarder_waiting:.0%})",
                f"{1e6 * relay_cost:,.0f} us/{self.item}", f"{socat.forwarder_cpu:.0%}",
                f"{1e6 * socat_cost:,.0f} us/{self.item}", f"{relay_cost / socat_cost:.2f}",
                " / ".join(f"{s.client_sink_cpu:.0%}" for s in (direct, relay, socat))]


def socat_command(executable: str, port: int | str, sink_port: int | str, buffer: int) -> list[str]:
    return [executable, "-b", str(buffer),
            f"TCP-LISTEN:{port},bind={LOOPBACK},reuseaddr,fork,backlog=1024",
            f"TCP:{LOOPBACK}:{sink_port}"]


def measure_all(args: argparse.Namespace, routes: list[Route], sink_pid: int) -> list[Result]:
    """A first echo on each route (fails fast, with the relay's answer, if
    the relay refuses), an untimed warm-up (code paths, the sink's threads,
    TCP autotuning), then each measurement, ``--repeat`` rounds of the routes."""
    size = args.mb * MB
    for route in routes:
        echo_once(route)
    for route in routes:
        for direction in ("upload", "download"):
            transfer(route, sink_pid, direction, min(size, 20 * MB))
        open_many(route, min(args.tunnels, 2 * args.concurrency), args.concurrency)

    def rounds(result: Result, sample: Callable[[Route], Sample]) -> Result:
        for _ in range(args.repeat):
            for route in routes:
                result.runs[route.name].append(sample(route))
        return result

    results = [rounds(Result(f"{direction}, one tunnel", "MB/s", "MB"),
                      lambda route, direction=direction: transfer(route, sink_pid, direction, size))
               for direction in ("upload", "download")]
    results.append(rounds(
        Result(f"tunnels opened, {args.concurrency} at once", "/s", "tunnel"),
        lambda route: measure(args.tunnels, route, sink_pid,
                              lambda: open_many(route, args.tunnels, args.concurrency))))
    return results


def run(args: argparse.Namespace, processes: Processes, directory: Path) -> int:
    socat_executable = ensure_tool("socat")
    # Before pinning, which changes the usable cores.
    header("Bounce relay throughput",
           " ".join([".venv/bin/python", "bench/bench_relay.py", *sys.argv[1:]]))
    usable = sorted(os.sched_getaffinity(0))
    relay_cpus, other_cpus = ({usable[0]}, set(usable[1:])) if len(usable) > 1 else (None, None)
    if other_cpus:
        # Before any thread starts: threads inherit the affinity of their creator.
        os.sched_setaffinity(0, other_cpus)
        print(f"pinning: relay process, and socat with its children, pinned to CPU {usable[0]}; "
              f"sink process and client (this process) pinned to CPU {','.join(map(str, usable[1:]))}")
    else:
        print("pinning: not pinned (1 usable core: relay, sink and client share it)")
    print(f"settings: {args.mb} MB per direction, {args.tunnels} tunnels by {args.concurrency} "
          f"client threads, best of {args.repeat}, client/sink chunks {CHUNK_BYTES // 1024} KiB, "
          f"relay buffer_bytes {RelayConfig().buffer_bytes // 1024} KiB (default), relay "
          f"max_tunnels {args.max_tunnels}")
    version = subprocess.run([socat_executable, "-V"], capture_output=True, text=True,
                             check=False, timeout=10).stdout
    version = next((" ".join(line.split()[:3]) for line in version.splitlines()
                    if line.startswith("socat version")), "socat (unknown version)")
    shown = socat_command("socat", "<port>", "<sink port>", args.socat_buffer)
    default = " (socat's default)" if args.socat_buffer == SOCAT_DEFAULT_BUFFER else ""
    print(f"socat: {version}, `{' '.join(shown)}`: -b "
          f"{args.socat_buffer} bytes per read{default}; one process forked per connection")
    if args.profile_relay:
        print("note: the relay runs under cProfile; its figures are slowed by the profiler")
    print(flush=True)

    sink_port, relay_port, socat_port = free_ports(3)
    me = [sys.executable, os.path.abspath(__file__), "--concurrency", str(args.concurrency)]
    profile = ["--profile-relay", os.path.abspath(args.profile_relay)] if args.profile_relay else []
    children = {}
    # Each ready when its listener shows in /proc/net/tcp: no connection made,
    # so no stray tunnel in the relay's statistics and no fork by socat.
    for name, argv, port, cpus in (
        ("sink", [*me, "--role", "sink", "--port", str(sink_port)], sink_port, other_cpus),
        ("relay", [*me, "--role", "relay", "--port", str(relay_port), "--sink-port",
                   str(sink_port), *profile], relay_port, relay_cpus),
        ("socat", socat_command(socat_executable, socat_port, sink_port, args.socat_buffer),
         socat_port, relay_cpus),
    ):
        children[name] = start_server(processes, name, argv, [port], cpu=cpus,
                                      log=directory / f"{name}.log", connect=False)
    routes = [Route("direct", sink_port),
              Route("relay", relay_port, lambda: schedstat_seconds(children["relay"].pid)),
              Route("socat", socat_port, lambda: socat_seconds(children["socat"].pid))]
    try:
        results = measure_all(args, routes, children["sink"].pid)
    except (OSError, BenchError) as exc:
        for name, process in children.items():
            if process.poll() is not None:
                raise BenchError(f"the {name} process exited with status {process.returncode}: "
                                 f"{tail(directory / f'{name}.log')} "
                                 f"({type(exc).__name__}: {exc})") from exc
        raise BenchError(f"{type(exc).__name__}: {exc}") from exc
    # socat first; then the relay (SIGTERM: it writes its statistics and
    # profile, given time); the sink last.
    processes.stop(children["socat"])
    processes.stop(children["relay"], timeout_s=30.0)
    processes.stop(children["sink"])
    print("## Rates\n")
    print_table(
        ["measurement", "direct", "via relay", "via socat", "relay/direct", "relay/socat",
         "direct runs", "relay runs", "socat runs"],
        [result.rate_row() for result in results])
    print("Best of the runs in the first columns (each run's figure at the right); socat forks "
          "a process per connection, the relay answers a CONNECT per tunnel (bench/README.md).")
    print("\n## CPU of the forwarders (best run)\n")
    print_table(
        ["measurement", "relay CPU (+waiting)", "relay CPU cost", "socat CPU", "socat CPU cost",
         "relay cost/socat cost", "client+sink CPU (direct / relay / socat)"],
        [result.cpu_row() for result in results])
    print("CPU: cores busy during the best run (100% = one core; +waiting: runnable, its core "
          "taken: noise); socat: its whole process group; CPU cost: CPU time per MB or tunnel, "
          "the figure least disturbed by other load (bench/README.md).")
    print(f"finished: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, "
          f"load average {cores_and_load()[2]}")
    for line in (directory / "relay.log").read_text(errors="replace").splitlines():
        if line.startswith("STATS "):
            print(f"relay statistics at exit: {line[6:]}")
    if args.profile_relay and not os.path.exists(args.profile_relay):
        print(f"(no profile written to {args.profile_relay})")
    elif args.profile_relay:
        print(f"\nrelay profile ({args.profile_relay}), top 25 by own time:", flush=True)
        pstats.Stats(args.profile_relay, stream=sys.stdout).sort_stats("tottime").print_stats(25)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argument_parser(
        "Bounce relay throughput (MB/s through one tunnel, tunnels/s) against direct loopback "
        "TCP and socat, measured in the same run; best of --repeat runs (default 3).")
    parser.add_argument("--mb", type=int, help="MB (10^6 bytes) per direction through one "
                        "tunnel (default 200, 20 with --quick)")
    parser.add_argument("--tunnels", type=int,
                        help="tunnels per tunnel-rate run (default 4000, 500 with --quick)")
    parser.add_argument("--concurrency", type=int, default=64,
                        help="client threads opening tunnels at once (default 64)")
    parser.add_argument("--profile-relay", metavar="FILE",
                        help="run the relay under cProfile (slower: figures not comparable), "
                        "write its stats to FILE and print the top functions")
    parser.add_argument("--socat-buffer", type=int, default=SOCAT_DEFAULT_BUFFER, metavar="BYTES",
                        help=f"socat's read size, -b (default {SOCAT_DEFAULT_BUFFER}, socat's own "
                        f"default; the relay reads up to {RelayConfig().buffer_bytes} bytes)")
    # Internal: the child processes (--concurrency sizes them).
    parser.add_argument("--role", choices=("relay", "sink"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--sink-port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.mb is None:
        args.mb = 20 if args.quick else 200
    if args.tunnels is None:
        args.tunnels = 500 if args.quick else 4000
    for name in ("mb", "tunnels", "concurrency", "socat_buffer"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    args.repeat = repetitions(args, full=3)
    args.max_tunnels = max(RelayConfig().max_tunnels, 4 * args.concurrency)
    if args.role:
        return run_sink(args) if args.role == "sink" else run_relay(args)
    return run_benchmark("bench_relay", args, run)


if __name__ == "__main__":
    sys.exit(main())
