"""Bounce relay throughput: MB/s through one tunnel, tunnels opened per second.

    .venv/bin/python bench/bench_relay.py            # full run (about two minutes)
    .venv/bin/python bench/bench_relay.py --quick    # smoke run (about 15 s)
    .venv/bin/python bench/bench_relay.py --profile-relay relay.prof   # + cProfile of the relay

The real ``RelayHandler`` in its own process, socat (the baseline forwarder),
a sink and this client, loopback only (127.0.0.1; no name is ever
resolved), against direct loopback TCP. What each process does, the pinning
and the CPU figures: ``bench/README.md``.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # also puts the project root on sys.path
from harness import LOOPBACK, BenchError, Processes

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
#: socat's own read size (``-b``) when not given: what a plain socat uses.
SOCAT_DEFAULT_BUFFER = 8192
#: Time allowed to socat's forked children to exit after a measurement.
SETTLE_TIMEOUT_S = 10.0
ROUTES = ("direct", "relay", "socat")


# -- sockets (client and sink) ---------------------------------------------------


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


# -- the child processes: sink and relay (``--role``) -----------------------------


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
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((LOOPBACK, args.port))
    listener.listen(socket.SOMAXCONN)
    for index in range(args.threads):
        threading.Thread(target=sink_serve, args=(listener,), name=f"sink-{index}",
                         daemon=True).start()
    threading.Event().wait()  # until SIGTERM (Processes.stop)
    return 0


def run_relay(args: argparse.Namespace) -> int:
    import trio

    from notary.errors import ProbeResolveFailed
    from notary.server.relay import RelayHandler

    config = RelayConfig(listen=(), destinations="public", allow_addresses=("127.0.0.0/8",),
                         dial_port=args.dial_port, max_tunnels=args.max_tunnels)

    async def resolve_nothing(host: str, port: int) -> list[str]:
        raise ProbeResolveFailed("the benchmark relay resolves no names")

    handler = RelayHandler(config, trusted=None, resolver=resolve_nothing)

    async def serve() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            listeners = await trio.open_tcp_listeners(args.port, host=LOOPBACK)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.serve_listeners, handler, listeners)
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    break

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
    print(f"STATS tunnels_opened={stats.tunnels_opened} refused={dict(stats.refused)} "
          f"bytes_to_destinations={stats.bytes_to_destinations} "
          f"bytes_to_clients={stats.bytes_to_clients}", flush=True)
    return 0


# -- the forwarders' CPU ---------------------------------------------------------


def schedstat_seconds(pid: int) -> tuple[float, float]:
    """Seconds the threads of ``pid`` have run so far, and seconds they spent
    runnable but waiting for a CPU (``/proc/<pid>/task/*/schedstat``)."""
    run = wait = 0
    task_dir = f"/proc/{pid}/task"
    try:
        tasks = os.listdir(task_dir)
    except OSError:
        return float("nan"), float("nan")
    for task in tasks:
        try:
            with open(f"{task_dir}/{task}/schedstat") as file:
                fields = file.read().split()
        except OSError:
            continue
        run += int(fields[0])
        wait += int(fields[1])
    return run / 1e9, wait / 1e9


@dataclass
class Child:
    """The sink or the relay: a Python process of this script."""

    name: str
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    def cpu_seconds(self) -> tuple[float, float]:
        return schedstat_seconds(self.process.pid)


@dataclass
class Socat(Child):
    """socat in its own process group (pgid = pid), children included."""

    def members(self) -> list[int]:
        """The live processes of socat's group other than the parent: its
        per-connection children (zombies included until socat reaps them)."""
        pgid = str(self.process.pid)
        return [pid for pid, fields in harness.all_proc_stats().items()
                if pid != self.process.pid and fields[2] == pgid]

    def cpu_seconds(self) -> tuple[float, float]:
        """(run time of the whole group so far: the parent, its reaped
        children's cutime + cstime and the live children; NaN: waiting is
        not known). Measurements start and end with no child alive (settle)."""
        try:
            fields = harness.proc_stat(self.process.pid)
            total = (schedstat_seconds(self.process.pid)[0]
                     + (int(fields[13]) + int(fields[14])) / harness.CLOCK_TICK)
        except (OSError, IndexError, ValueError):
            return float("nan"), float("nan")
        for pid in self.members():
            run = schedstat_seconds(pid)[0]
            total += run if run == run else 0.0  # NaN: gone meanwhile
        return total, float("nan")

    def settle(self) -> None:
        """Wait (bounded) until the forked children of the last connections
        have exited and been reaped (their CPU then is in cutime/cstime)."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while self.members() and time.monotonic() < deadline:
            time.sleep(0.002)


def socat_version(executable: str) -> str:
    result = subprocess.run([executable, "-V"], capture_output=True, text=True, check=False,
                            timeout=10)
    for line in result.stdout.splitlines():
        if line.startswith("socat version"):
            return " ".join(line.split()[:3])
    return "socat (unknown version)"


def socat_command(executable: str, port: int | str, sink_port: int | str, buffer: int) -> list[str]:
    return [executable, "-b", str(buffer),
            f"TCP-LISTEN:{port},bind={LOOPBACK},reuseaddr,fork,backlog=1024",
            f"TCP:{LOOPBACK}:{sink_port}"]


# -- the client's measurements ---------------------------------------------------


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
        # getrusage, not os.times: its total is exact (os.times counts 10 ms
        # ticks), and it includes the client threads that have ended.
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
        return Sample(amount / wall, (forwarder_after[0] - forwarder_before[0]) / wall,
                      (forwarder_after[1] - forwarder_before[1]) / wall,
                      (client_sink_after - client_sink_before) / wall)


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


# -- the report ------------------------------------------------------------------


def figure(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def percent(value: float) -> str:
    return f"{100 * value:.0f}%"


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


# -- main ------------------------------------------------------------------------


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Bounce relay throughput (MB/s through one tunnel, tunnels/s) "
        "against direct loopback TCP and socat, measured in the same run.")
    parser.add_argument("--quick", action="store_true",
                        help="20 MB, 500 tunnels, one repetition: a smoke run of ~15 s")
    parser.add_argument("--mb", type=int, default=None,
                        help="MB (10^6 bytes) per direction through one tunnel (default 200)")
    parser.add_argument("--tunnels", type=int, default=None,
                        help="tunnels per tunnel-rate run (default 4000)")
    parser.add_argument("--concurrency", type=int, default=64,
                        help="client threads opening tunnels at once (default 64)")
    parser.add_argument("--repeat", type=int, default=None,
                        help="runs per measurement, the best is kept (default 3, 1 with --quick)")
    parser.add_argument("--profile-relay", metavar="FILE", default=None,
                        help="run the relay under cProfile, write its stats to FILE and print "
                        "the top functions (the profiler slows the relay: figures are not "
                        "comparable with an unprofiled run)")
    parser.add_argument("--socat-buffer", type=int, default=SOCAT_DEFAULT_BUFFER, metavar="BYTES",
                        help=f"socat's read size, -b (default {SOCAT_DEFAULT_BUFFER}, socat's own "
                        f"default; the relay reads up to {RelayConfig().buffer_bytes} bytes)")
    # Internal: the child processes.
    parser.add_argument("--role", choices=("relay", "sink"), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
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


def cpu_plan() -> tuple[set[int] | None, set[int] | None, str]:
    """(relay CPUs, client and sink CPUs, a sentence saying so)."""
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) < 2:
        return None, None, "not pinned (1 usable core: relay, sink and client share it)"
    others = ",".join(map(str, usable[1:]))
    return {usable[0]}, set(usable[1:]), (
        f"relay process, and socat with its children, pinned to CPU {usable[0]}; sink "
        f"process and client (this process) pinned to CPU {others}")


def relay_max_tunnels(args: argparse.Namespace) -> int:
    return max(RelayConfig().max_tunnels, 4 * args.concurrency)


def start_children(args: argparse.Namespace, processes: Processes, directory: Path, socat: str,
                   relay_cpus: set[int] | None, other_cpus: set[int] | None
                   ) -> tuple[Child, Child, Socat]:
    """The sink, the relay and socat, each ready (its listener seen in
    /proc/net/tcp: no connection made, so socat forks nothing)."""
    me = [sys.executable, os.path.abspath(__file__), "--role"]
    sink_port, relay_port, socat_port = harness.free_ports(3)
    started = []
    for name, argv, port, cpus in (
        ("sink", [*me, "sink", "--port", str(sink_port),
                  "--threads", str(max(16, 2 * args.concurrency + 8))], sink_port, other_cpus),
        ("relay", [*me, "relay", "--port", str(relay_port), "--dial-port", str(sink_port),
                   "--max-tunnels", str(relay_max_tunnels(args))]
         + (["--profile", os.path.abspath(args.profile_relay)] if args.profile_relay else []),
         relay_port, relay_cpus),
        ("socat", socat_command(socat, socat_port, sink_port, args.socat_buffer), socat_port,
         relay_cpus),
    ):
        log = directory / f"{name}.log"
        process = harness.start_server(processes, name, argv, [port], cpu=cpus, log=log,
                                       connect=False)
        started.append((Socat if name == "socat" else Child)(name, process, port, log))
    return started[0], started[1], started[2]  # type: ignore[return-value]


def measure_all(args: argparse.Namespace, relay: Child, sink: Child, socat: Socat) -> list[Result]:
    meter = CpuMeter(sink)
    size = args.mb * MB
    routes = [Route("direct", sink.port, False, None), Route("relay", relay.port, True, relay),
              Route("socat", socat.port, False, socat)]
    # Fails fast, with the relay's answer, if the relay refuses.
    for route in routes:
        echo_once(route.port, route.connect)
    # Warm-up (not timed): code paths, the sink's threads, TCP autotuning.
    for route in routes:
        for direction in ("upload", "download"):
            transfer(meter, route, direction, min(size, 20 * MB))
        open_many(route.port, route.connect, min(args.tunnels, 2 * args.concurrency),
                  args.concurrency)

    results: list[Result] = []
    for direction in ("upload", "download"):
        result = Result(f"{direction}, one tunnel", "MB/s", "MB", {r.name: [] for r in routes})
        for _ in range(args.repeat):
            for route in routes:
                result.runs[route.name].append(transfer(meter, route, direction, size))
        results.append(result)
    result = Result(f"tunnels opened, {args.concurrency} at once", "/s", "tunnel",
                    {r.name: [] for r in routes})
    for _ in range(args.repeat):
        for route in routes:
            result.runs[route.name].append(meter.measure(
                args.tunnels, route, lambda route=route: open_many(
                    route.port, route.connect, args.tunnels, args.concurrency)))
    results.append(result)
    return results


def run(args: argparse.Namespace, processes: Processes, directory: Path) -> int:
    socat_executable = harness.ensure_tool("socat")
    machine = harness.machine_description()  # before pinning, which changes the usable cores
    relay_cpus, other_cpus, pinning = cpu_plan()
    if other_cpus:
        # Before any thread starts: threads inherit the affinity of their creator.
        os.sched_setaffinity(0, other_cpus)
    print("# Bounce relay throughput")
    print(f"machine: {machine}")
    print(f"command: {' '.join(['.venv/bin/python', 'bench/bench_relay.py', *sys.argv[1:]])}")
    print(f"started: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    print(f"pinning: {pinning}")
    print(f"settings: {args.mb} MB per direction, {args.tunnels} tunnels by "
          f"{args.concurrency} client threads, best of {args.repeat}, "
          f"client/sink chunks {CHUNK_BYTES // 1024} KiB, relay buffer_bytes "
          f"{RelayConfig().buffer_bytes // 1024} KiB (default), relay max_tunnels "
          f"{relay_max_tunnels(args)}")
    shown = socat_command("socat", "<port>", "<sink port>", args.socat_buffer)
    default = " (socat's default)" if args.socat_buffer == SOCAT_DEFAULT_BUFFER else ""
    print(f"socat: {socat_version(socat_executable)}, `{' '.join(shown)}`: -b "
          f"{args.socat_buffer} bytes per read{default}; one process forked per connection")
    if args.profile_relay:
        print("note: the relay runs under cProfile; its figures are slowed by the profiler")
    print(flush=True)

    sink, relay, socat = start_children(args, processes, directory, socat_executable,
                                        relay_cpus, other_cpus)
    try:
        results = measure_all(args, relay, sink, socat)
    except (OSError, BenchError) as exc:
        for child in (relay, sink, socat):
            if child.process.poll() is not None:
                raise BenchError(f"the {child.name} process exited with status "
                                 f"{child.process.returncode}: {harness.tail(child.log)} "
                                 f"({type(exc).__name__}: {exc})") from exc
        raise BenchError(f"{type(exc).__name__}: {exc}") from exc
    # socat first; then the relay (SIGTERM: it writes its statistics and
    # profile, given time); the sink last.
    processes.stop(socat.process)
    processes.stop(relay.process, timeout_s=30.0)
    processes.stop(sink.process)
    print("## Rates\n")
    harness.print_table(
        ["measurement", "direct", "via relay", "via socat", "relay/direct", "relay/socat",
         "direct runs", "relay runs", "socat runs"],
        [result.rate_row() for result in results])
    print("Best of the runs in the first columns (each run's figure at the right). The relay "
          "answers a CONNECT per tunnel; socat has none, but forks a process per connection "
          "(the relay: one process, one task per tunnel).")
    print("\n## CPU of the forwarders (best run)\n")
    harness.print_table(
        ["measurement", "relay CPU (+waiting)", "relay CPU cost", "socat CPU", "socat CPU cost",
         "relay cost/socat cost", "client+sink CPU (direct / relay / socat)"],
        [result.cpu_row() for result in results])
    print("CPU: cores busy during the best run (100% = one core): the relay process (and, "
          "in brackets, the time it was runnable but waiting for its CPU, taken by another "
          "process: noise); socat's whole process group (parent, forked children: fork, "
          "copy-on-write faults and exit included; its waiting time is not known); the sink "
          "process plus this client. CPU cost: the forwarder's CPU time per MB or per tunnel "
          "in its best run, the figure least disturbed by other load on the machine.")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"finished: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, load average {load}")
    for line in relay.log.read_text(errors="replace").splitlines():
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
    pstats.Stats(path, stream=sys.stdout).sort_stats("tottime").print_stats(25)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_arguments(argv)
    if args.role == "sink":
        return run_sink(args)
    if args.role == "relay":
        return run_relay(args)
    return harness.run_benchmark("bench_relay", args, run)


if __name__ == "__main__":
    sys.exit(main())
