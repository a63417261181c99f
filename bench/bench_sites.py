"""Sites served at several addresses (issue 31): what a probe of every address costs.

Four parts (``--part cost,memory,notary,store``; default all), loopback only; set-up,
cases, baselines and goals: ``bench/README.md`` ("Sites served at several addresses").

1. cost: the Prober in this process (pinned to the server core) probing names that an
   injected resolver maps to 1, 4 and 8 loopback addresses, each address serving its
   own certificate (the site farm, ``--farm``, on the client core), and sampled sites;
   against the same number of raw TLS handshakes of the same run, in the same shape
   (every address at once): the prober's own handshake alone ("bare": the same
   pyOpenSSL client context, aborted at the certificate) and stdlib ``ssl``.
2. memory: thousands of 8-address probes of distinct names, the RSS, Python's
   allocated blocks and what tracemalloc sees held sampled along the run.
3. notary: a whole notary (``--serve-notary``: ``serve_notary`` with the same injected
   resolver) answering queries that probe 1-address and 8-address names, its RSS
   sampled every second.
4. store: the bytes a target takes at its bounds (certificates, runs, addresses) when
   written as the probes of a site at 8 addresses write it, on SQLite and PostgreSQL
   (a throwaway server on loopback, skipped when not installed); the bounds checked.

    .venv/bin/python bench/bench_sites.py --wait-quiet 120   # full run (about 20 minutes)
    .venv/bin/python bench/bench_sites.py --quick            # smoke run (about a minute)
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import hashlib
import ipaddress
import itertools
import os
import random
import re
import signal
import socket
import sqlite3
import ssl
import statistics
import sys
import time
import tracemalloc
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager as AsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio
from cryptography.hazmat.primitives.serialization import Encoding
from harness.loopback import (
    LOOPBACK,
    client_tls_context,
    free_ports,
    get_metrics,
    post_request,
    receive_response,
    status_of,
)
from harness.machine import (
    cpu_seconds,
    describe_busy,
    machine_busy_seconds,
    proc_status,
    wait_quiet,
)
from harness.processes import Processes, run_benchmark, tail
from harness.project import BenchError
from harness.report import print_table, short_path
from harness.runs import Sampler, drive_clients, start_load
from harness.servers import new_notary, start_notary, start_postgres
from OpenSSL import SSL

from notary.errors import ProbeResolveFailed
from notary.model.observations import Certificate, ProbeResult
from notary.model.targets import Target

if TYPE_CHECKING:
    from notary.outbound.probe import Prober

BENCH_DIR = Path(__file__).resolve().parent
#: The site's addresses: ``a<N>-<n>.sites.test`` resolves to the first N of them.
ADDRESSES = tuple(f"127.0.0.{k}" for k in range(2, 10))
DOMAIN = "sites.test"
#: Certificates each address serves on the rotating ports, one per connection in turn
#: (the split ports serve the first one only).
CERTS_PER_ADDRESS = 4
#: Listening ports per group (split, rotating) on every address: each worker of a
#: pass keeps to one (a sampled probe of a rotating port then sees its 4 in turn).
PORTS_PER_GROUP = 8
#: Connections in flight in a loaded pass (probes at once: this over the addresses).
IN_FLIGHT = 64
GOAL_PER_CONNECTION = 1.10  # an 8-address probe's cost per connection / a 1-address probe's
#: Memory verdict: growth over the steady part of the run below these is "flat".
#: (A leak of one object a probe is 16 bytes a probe or more; RSS moves by
#: pages and allocator arenas, so it is judged over the whole steady part.)
FLAT_TRACED_BYTES_PER_PROBE = 8.0
FLAT_RSS_GROWTH = 0.01
GROWTH_TOLERANCE = 0.05  # part 3: RSS peak of the last third over the first third's
NO_SUCH_FINGERPRINT = ":".join(["00"] * 20)
HANDSHAKE_TIMEOUT_S = 10.0
PARTS = ("cost", "memory", "notary", "store")


@dataclass(frozen=True)
class Case:
    """One kind of probe: ``addresses`` of the name, ``samples`` asked of the
    prober (``samples_per_address``), the rotating ports or not, and the
    handshakes that makes per address."""

    key: str
    label: str
    addresses: int
    samples: int
    rotating: bool
    per_address: int

    @property
    def connections(self) -> int:
        return self.addresses * self.per_address

    @property
    def concurrency(self) -> int:
        """Probes at once in a loaded pass: IN_FLIGHT connections (a probe's
        samples of one address are one after the other)."""
        return max(1, IN_FLIGHT // self.addresses)


CASES = (
    Case("1", "1 address", 1, 1, False, 1),
    Case("4", "4 addresses", 4, 1, False, 1),
    Case("8", "8 addresses", 8, 1, False, 1),
    Case("8s", "8 addresses, sampled: one certificate each (2 handshakes an address)",
         8, CERTS_PER_ADDRESS, False, 2),
    Case("8r", "8 addresses, sampled: 4 certificates each in turn (4 handshakes an address)",
         8, CERTS_PER_ADDRESS, True, 4),
)
REGIMES = ("alone", "loaded")
#: Who makes the connections: the Prober, its handshake alone ("bare"), stdlib ``ssl``.
KINDS = ("probe", "bare", "stdlib")


def tcp_retransmissions() -> int:
    """Segments the machine's TCP retransmitted since boot (/proc/net/snmp;
    every process's, loopback included)."""
    with open("/proc/net/snmp", encoding="ascii") as snmp:
        names, values = (line.split() for line in snmp if line.startswith("Tcp:"))
    return int(values[names.index("RetransSegs")])


def site_name(addresses: int, number: int) -> str:
    return f"a{addresses}-{number}.{DOMAIN}"


async def site_resolver(host: str, port: int) -> list[str]:
    """The injected resolver: ``a<N>-<n>.sites.test`` is the first N of
    ``ADDRESSES``; any other name does not resolve. Holds no state."""
    await trio.lowlevel.checkpoint()
    label, _, domain = host.partition(".")
    match = re.fullmatch(r"a(\d+)-\d+", label)
    if domain != DOMAIN or match is None or not 1 <= int(match[1]) <= len(ADDRESSES):
        raise ProbeResolveFailed("name did not resolve")
    return list(ADDRESSES[: int(match[1])])


def refuse_name_lookups() -> None:
    """Loopback only, whatever the code under test does: in this process,
    ``getaddrinfo`` of anything but an IP literal raises (no DNS query)."""
    lookup = socket.getaddrinfo

    def literal_only(host: object, *args: object, **kwargs: object) -> object:
        text = host.decode() if isinstance(host, bytes) else host
        if text is not None:
            try:
                ipaddress.ip_address(str(text).split("%")[0])
            except ValueError:
                raise socket.gaierror(socket.EAI_NONAME,
                                      f"bench_sites resolves no name ({text!r})") from None
        return lookup(host, *args, **kwargs)  # type: ignore[arg-type]

    socket.getaddrinfo = literal_only  # type: ignore[assignment]


# -- the site farm (child) ---------------------------------------------------------------------

def cert_paths(directory: Path, address: int, number: int) -> tuple[Path, Path]:
    return directory / f"a{address}-c{number}.crt", directory / f"a{address}-c{number}.key"


def make_certificates(directory: Path) -> None:
    """An ECDSA P-256 leaf (trustme, a test dependency) for every address x
    ``CERTS_PER_ADDRESS``, each with its own key: the cheapest handshake to serve."""
    import trustme

    ca = trustme.CA(key_type=trustme.KeyType.ECDSA)
    for address in range(len(ADDRESSES)):
        for number in range(CERTS_PER_ADDRESS):
            issued = ca.issue_cert(f"*.{DOMAIN}", key_type=trustme.KeyType.ECDSA)
            cert, key = cert_paths(directory, address, number)
            issued.cert_chain_pems[0].write_to_path(str(cert))
            issued.private_key_pem.write_to_path(str(key))


def farm_main(args: argparse.Namespace) -> int:
    """Serve TLS on every address x port until killed: the split ports with
    each address's first certificate, the rotating ones with its
    ``CERTS_PER_ADDRESS`` in turn (a count per listener); print ``ready``."""
    directory = Path(args.certs)

    def context(address: int, number: int) -> ssl.SSLContext:
        made = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        made.load_cert_chain(*cert_paths(directory, address, number))
        made.num_tickets = 0  # nothing after the handshake: the farm stays cheap
        return made

    contexts = [[context(a, n) for n in range(CERTS_PER_ADDRESS)] for a in range(len(ADDRESSES))]

    def handler(choices: Sequence[ssl.SSLContext]) -> Callable[[trio.SocketStream], Awaitable]:
        served = 0

        async def handshake(tcp: trio.SocketStream) -> None:
            nonlocal served
            chosen = choices[served % len(choices)]
            served += 1
            stream = trio.SSLStream(tcp, chosen, server_side=True)
            with trio.move_on_after(HANDSHAKE_TIMEOUT_S):
                try:
                    await stream.do_handshake()
                    await stream.aclose()
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pass
            await trio.aclose_forcefully(tcp)

        return handshake

    async def serve() -> None:
        async with trio.open_nursery() as nursery:
            for index, host in enumerate(ADDRESSES):
                for ports, choices in ((args.split_ports, contexts[index][:1]),
                                       (args.rotating_ports, contexts[index])):
                    for port in ports:
                        sock = trio.socket.socket()
                        sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_REUSEADDR, 1)
                        await sock.bind((host, port))
                        sock.listen(1024)
                        nursery.start_soon(trio.serve_listeners, handler(choices),
                                           [trio.SocketListener(sock)])
            print("ready", flush=True)

    trio.run(serve)
    return 0


def start_farm(processes: Processes, directory: Path, cpu: int) -> tuple[list[int], list[int],
                                                                          int]:
    """The site farm on ``cpu``: (split ports, rotating ports, its pid)."""
    make_certificates(directory)
    ports = free_ports(2 * PORTS_PER_GROUP)
    split, rotating = ports[:PORTS_PER_GROUP], ports[PORTS_PER_GROUP:]
    farm = processes.start("site farm", [
        sys.executable, str(Path(__file__).resolve()), "--farm", "--certs", str(directory),
        "--split-ports", ",".join(map(str, split)),
        "--rotating-ports", ",".join(map(str, rotating))], cpu=cpu)
    line = farm.stdout.readline() if farm.stdout else b""
    if line.strip() != b"ready":
        error = farm.stderr.read().decode(errors="replace") if farm.stderr else ""
        raise BenchError(f"the site farm did not start: {line!r} {error}")
    return split, rotating, farm.pid


# -- the notary with the injected resolver (child) ----------------------------------------------

def serve_notary_main(args: argparse.Namespace) -> int:
    """``serve_notary`` on ``--serve-notary``'s config with ``site_resolver``:
    the notary's own code, only its resolver injected (as the tests do)."""
    refuse_name_lookups()
    from notary.config import load_config
    from notary.logs import configure_logging
    from notary.server.app import serve_notary

    config = load_config(Path(args.serve_notary))
    configure_logging(config.server.log_level, config.server.log_format)
    if args.trace_dir is None:
        trio.run(functools.partial(serve_notary, config, resolver=site_resolver))
        return 0

    async def traced() -> None:
        """Under tracemalloc: each SIGUSR1 writes a snapshot, ``<n>.snapshot``
        in ``--trace-dir`` (after a full collection), then ``<n>.done``."""
        tracemalloc.start()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(serve_notary, config, resolver=site_resolver))
            with trio.open_signal_receiver(signal.SIGUSR1) as signals:
                number = 0
                async for _ in signals:
                    number += 1
                    gc.collect()
                    snapshot = tracemalloc.take_snapshot()
                    path = Path(args.trace_dir) / f"{number}.snapshot"
                    await trio.to_thread.run_sync(snapshot.dump, str(path))
                    await trio.to_thread.run_sync(path.with_suffix(".done").touch)

    trio.run(traced)
    return 0


# -- part 1: cost --------------------------------------------------------------------------------

@dataclass
class Pass:
    """One pass of a case in a regime, by the prober or the raw client."""

    probes: int
    connections: int
    seconds: float
    cpu: float  # this process's CPU seconds
    farm_cpu: float
    machine_busy: float  # busy CPU seconds of every core
    walls: list[float] = field(default_factory=list)  # seconds of each probe
    retransmissions: int = 0  # TCP segments the machine retransmitted meanwhile

    def cpu_us(self, per: int | None = None) -> float:
        return self.cpu / (per or self.connections) * 1e6

    @property
    def wall_per_connection_us(self) -> float:
        return self.seconds / self.connections * 1e6

    @property
    def other_cores(self) -> float:
        """Cores busy with anything but this process and the farm."""
        return max(0.0, self.machine_busy - self.cpu - self.farm_cpu) / self.seconds


class Names:
    """Fresh names, never probed before in this run (each probe resolves and
    remembers its name, as a notary asked about many targets does)."""

    def __init__(self) -> None:
        self.used = 0

    def next(self, addresses: int) -> str:
        self.used += 1
        return site_name(addresses, self.used)


async def drive(count: int, concurrency: int, one: Callable[[int], Awaitable[None]],
                farm_pid: int) -> Pass:
    """``one(worker)`` ``count`` times, ``concurrency`` workers at once;
    the connections are the caller's to fill in."""
    walls: list[float] = []
    left = count

    async def worker(number: int) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            started = time.perf_counter()
            await one(number)
            walls.append(time.perf_counter() - started)

    farm, machine = cpu_seconds(farm_pid), machine_busy_seconds()
    retransmitted = tcp_retransmissions()
    cpu, started = time.process_time(), time.perf_counter()
    async with trio.open_nursery() as nursery:
        for number in range(min(concurrency, count)):
            nursery.start_soon(worker, number)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    return Pass(count, 0, seconds, cpu, cpu_seconds(farm_pid) - farm,
                machine_busy_seconds() - machine, walls,
                tcp_retransmissions() - retransmitted)


class Cost:
    """Part 1's passes, in this process: the prober's and the raw client's."""

    def __init__(self, prober: Prober, split: list[int], rotating: list[int],
                 farm_pid: int) -> None:
        self.prober, self.split, self.rotating, self.farm_pid = prober, split, rotating, farm_pid
        self.names = Names()
        self.context = client_tls_context()
        self.bare_context = bare_context()

    def ports(self, case: Case) -> list[int]:
        return self.rotating if case.rotating else self.split

    async def probes(self, case: Case, count: int, concurrency: int) -> Pass:
        ports = self.ports(case)
        connections = self.prober.statistics().connections

        async def one(worker: int) -> None:
            target = Target(self.names.next(case.addresses), ports[worker % len(ports)])
            report = await self.prober.probe(target, samples_per_address=case.samples)
            if report.failures or len(report.results) != case.connections:
                raise BenchError(f"{case.label}: a probe of {target} showed "
                                 f"{len(report.results)} handshakes, failures {report.failures}")

        done = await drive(count, concurrency, one, self.farm_pid)
        done.connections = self.prober.statistics().connections - connections
        if done.connections != count * case.connections:
            raise BenchError(f"{case.label}: {done.connections} connections for {count} probes")
        return done

    async def stdlib_handshake(self, address: str, port: int, name: str) -> None:
        """A full handshake through stdlib ``ssl`` (``trio.SSLStream``), the
        peer's certificate read: the raw handshake of ``bench_probe.py``."""
        with trio.fail_after(HANDSHAKE_TIMEOUT_S):
            tcp = await trio.open_tcp_stream(address, port)
            stream = trio.SSLStream(tcp, self.context, server_hostname=name)
            try:
                await stream.do_handshake()
                if not stream.getpeercert(binary_form=True):
                    raise BenchError(f"handshake with {address}:{port}: no certificate")
            finally:
                await trio.aclose_forcefully(stream)

    async def bare_handshake(self, address: str, port: int, name: str) -> None:
        """The prober's handshake and nothing else: pyOpenSSL over memory
        BIOs, SNI, the chain copied as DER in the verify callback, which
        aborts; the alert sent. No resolver, policy, slots, report."""
        chain: list[bytes] = []
        connection = SSL.Connection(self.bare_context, None)
        connection.set_app_data(chain)
        connection.set_connect_state()
        connection.set_tlsext_host_name(name.encode("ascii"))
        with trio.fail_after(HANDSHAKE_TIMEOUT_S):
            stream = await trio.open_tcp_stream(address, port)
            try:
                while True:
                    try:
                        connection.do_handshake()
                    except SSL.WantReadError:
                        pass
                    except SSL.Error:
                        if not chain:
                            raise
                    outgoing = drain(connection)
                    if chain:
                        with contextlib.suppress(trio.BrokenResourceError):
                            await stream.send_all(outgoing)
                        return
                    if outgoing:
                        await stream.send_all(outgoing)
                    data = await stream.receive_some(16384)
                    if not data:
                        raise BenchError(f"handshake with {address}:{port}: closed")
                    connection.bio_write(data)
            finally:
                await trio.aclose_forcefully(stream)

    async def handshakes(self, kind: str, case: Case, count: int, concurrency: int) -> Pass:
        """The probes' shape without the prober: every address at once, its
        handshakes one after the other (``kind``: stdlib or bare)."""
        ports = self.ports(case)
        handshake = self.stdlib_handshake if kind == "stdlib" else self.bare_handshake

        async def at(address: str, port: int, name: str) -> None:
            for _ in range(case.per_address):
                await handshake(address, port, name)

        async def one(worker: int) -> None:
            name, port = self.names.next(case.addresses), ports[worker % len(ports)]
            async with trio.open_nursery() as nursery:
                for address in ADDRESSES[: case.addresses]:
                    nursery.start_soon(at, address, port, name)

        done = await drive(count, concurrency, one, self.farm_pid)
        done.connections = count * case.connections
        return done

    async def measure(self, kind: str, case: Case, count: int, concurrency: int) -> Pass:
        if kind == "probe":
            return await self.probes(case, count, concurrency)
        return await self.handshakes(kind, case, count, concurrency)


def drain(connection: SSL.Connection) -> bytes:
    """Everything OpenSSL queued for the peer."""
    chunks = []
    while True:
        try:
            chunks.append(connection.bio_read(16384))
        except SSL.WantReadError:
            return b"".join(chunks)


def bare_context() -> SSL.Context:
    """The prober's client context (``notary.outbound.probe``'s settings),
    its verify callback copying the chain as DER and aborting."""
    def capture(connection: SSL.Connection, _cert: object, _errno: int, _depth: int,
                _ok: int) -> bool:
        chain = connection.get_app_data()
        if not chain:
            chain.extend(cert.public_bytes(Encoding.DER) for cert in
                         connection.get_peer_cert_chain(as_cryptography=True) or [])
        return False

    context = SSL.Context(SSL.TLS_CLIENT_METHOD)
    context.set_min_proto_version(SSL.TLS1_VERSION)
    context.set_max_proto_version(SSL.TLS1_3_VERSION)
    context.set_cipher_list(b"DEFAULT:@SECLEVEL=0")
    context.set_verify(SSL.VERIFY_PEER, capture)
    return context


def counts(args: argparse.Namespace, case: Case, regime: str) -> tuple[int, int]:
    """(probes, concurrency) of a pass: about ``--connections`` connections
    loaded, a quarter of that alone."""
    connections = args.connections if regime == "loaded" else args.connections // 4
    probes = max(2, connections // case.connections)
    return probes, case.concurrency if regime == "loaded" else 1


async def run_cost(args: argparse.Namespace, cost: Cost, quiet_cpus: Sequence[int]
                   ) -> dict[tuple[str, str, str], list[Pass]]:
    """``--rounds`` interleaved rounds of every case x regime x (probe, raw),
    after a warm-up pass of each. (Nothing else runs meanwhile: the
    blocking waits for quiet cores block nothing.)"""
    runs: dict[tuple[str, str, str], list[Pass]] = {}
    for case in CASES:
        for kind in KINDS:
            await cost.measure(kind, case, 8, case.concurrency)
    for number in range(1, args.rounds + 1):
        if number > 1 and args.wait_quiet:
            wait_quiet(quiet_cpus, min(args.wait_quiet, 30.0))
        for case in CASES:
            for regime in REGIMES:
                probes, concurrency = counts(args, case, regime)
                for kind in KINDS:
                    done = await cost.measure(kind, case, probes, concurrency)
                    runs.setdefault((case.key, regime, kind), []).append(done)
                    print(f"  round {number} {case.key:>2} {regime:6} {kind:5} "
                          f"{done.probes:5,} x {case.connections:2} connections in "
                          f"{done.seconds:5.2f} s: CPU {done.cpu_us():5,.0f} us/connection, "
                          f"farm core {done.farm_cpu / done.seconds:4.0%}, other load "
                          f"{done.other_cores:.2f} cores, TCP retransmissions "
                          f"{done.retransmissions}", flush=True)
    return runs


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def goal_verdict(direct: float, normalized: float) -> str:
    """The verdict on one per-connection figure of an N-address probe:
    ``direct``, over a 1-address probe's; ``normalized``, the same over the
    raw handshakes' own ratio (of the same shape, in the same rounds): what
    the prober adds, whatever slowed the handshakes themselves."""
    if direct <= GOAL_PER_CONNECTION:
        return "met"
    if normalized <= GOAL_PER_CONNECTION:
        return ("NOT met, but not the prober's: raw handshakes of the same shape slowed as "
                "much")
    return "NOT met"


def spread(values: Sequence[float]) -> str:
    """``median (min-max)`` of per-round ratios."""
    text = f"{median(values):.2f}"
    return text + (f" ({min(values):.2f}-{max(values):.2f})" if len(values) > 1 else "")


def report_cost(args: argparse.Namespace,
                runs: dict[tuple[str, str, str], list[Pass]]) -> list[str]:
    """Print part 1's tables; return the goal lines. Ratios are taken
    within each round, then their median."""
    def each(case: Case, regime: str, kind: str, value: Callable[[Pass], float]) -> list[float]:
        return [value(done) for done in runs[(case.key, regime, kind)]]

    def ratio(case: Case, regime: str, kind: str, value: Callable[[Pass], float],
              other: tuple[str, str]) -> list[float]:
        """Per round: ``value`` of (case, kind) over that of ``other`` (case key, kind)."""
        return [a / b for a, b in zip(each(case, regime, kind, value),
                                      [value(done) for done in runs[(other[0], regime, other[1])]],
                                      strict=True)]

    def vs_one(case: Case, regime: str, kind: str, value: Callable[[Pass], float]
               ) -> list[float]:
        return ratio(case, regime, kind, value, ("1", kind))

    def figure(case: Case, regime: str, kind: str, value: Callable[[Pass], float],
               form: str = ",.0f") -> str:
        return format(median(each(case, regime, kind, value)), form)

    def cpu(done: Pass) -> float:
        return done.cpu_us()

    def wall(done: Pass) -> float:  # loaded: seconds of the pass over its connections
        return done.wall_per_connection_us

    def p50(done: Pass) -> float:  # alone: a probe's wall, its median over the pass
        return median(done.walls) * 1e3

    def p50_per_connection(done: Pass) -> float:
        return p50(done) / (done.connections / done.probes)

    rows = []
    for case in CASES:
        rows.append([
            case.label, case.connections, case.concurrency,
            figure(case, "loaded", "probe", lambda d: d.connections / d.seconds),
            figure(case, "loaded", "probe", cpu), figure(case, "loaded", "bare", cpu),
            figure(case, "loaded", "stdlib", cpu),
            spread(vs_one(case, "loaded", "probe", cpu)),
            spread(vs_one(case, "loaded", "bare", cpu)),
            spread(ratio(case, "loaded", "probe", cpu, (case.key, "bare"))),
            figure(case, "loaded", "probe", wall), figure(case, "loaded", "bare", wall),
            spread(vs_one(case, "loaded", "probe", wall)),
            spread(vs_one(case, "loaded", "bare", wall)),
            spread(ratio(case, "loaded", "probe", wall, (case.key, "bare"))),
            figure(case, "loaded", "probe", lambda d: d.farm_cpu / d.seconds, ".0%"),
            figure(case, "loaded", "probe", lambda d: d.other_cores, ".2f")])
    print(f"\n## 1a. Loaded: {IN_FLIGHT} connections in flight (probes at once: {IN_FLIGHT} "
          f"over the addresses), ~{args.connections:,} connections a pass; medians of "
          f"{args.rounds} round(s), ratios taken within each round: median (min-max)\n")
    print_table([
        "probe", "connections a probe", "probes at once", "connections/s",
        "CPU us/connection", "bare", "stdlib", "CPU/connection vs 1 address",
        "bare: vs 1 address", "probe / bare, CPU", "wall us/connection", "bare",
        "wall/connection vs 1 address", "bare: vs 1 address", "probe / bare, wall",
        "farm core", "other load (cores)"], rows)

    rows = []
    for case in CASES:
        walls = [w for done in runs[(case.key, "alone", "probe")] for w in done.walls]
        rows.append([
            case.label, case.connections,
            f"{median(walls) * 1e3:.2f} / {statistics.quantiles(walls, n=10)[-1] * 1e3:.2f}",
            figure(case, "alone", "bare", p50, ".2f"), figure(case, "alone", "stdlib", p50, ".2f"),
            spread(ratio(case, "alone", "probe", p50, (case.key, "bare"))),
            spread(vs_one(case, "alone", "probe", p50_per_connection)),
            spread(vs_one(case, "alone", "bare", p50_per_connection)),
            figure(case, "alone", "probe", cpu), figure(case, "alone", "bare", cpu),
            spread(vs_one(case, "alone", "probe", cpu)),
            spread(vs_one(case, "alone", "bare", cpu)),
            spread(ratio(case, "alone", "probe", cpu, (case.key, "bare"))),
            figure(case, "alone", "probe", lambda d: d.other_cores, ".2f")])
    print(f"\n## 1b. Alone: one probe at a time, ~{args.connections // 4:,} connections a pass\n")
    print_table([
        "probe", "connections a probe", "wall ms/probe p50 / p90", "bare: p50", "stdlib: p50",
        "probe / bare, wall", "wall/connection vs 1 address", "bare: vs 1 address",
        "CPU us/connection", "bare", "CPU/connection vs 1 address", "bare: vs 1 address",
        "probe / bare, CPU", "other load (cores)"], rows)

    goals = []
    for case in CASES[1:]:
        for regime, what, value in (("loaded", "CPU", cpu), ("alone", "CPU", cpu),
                                    ("loaded", "wall", wall),
                                    ("alone", "wall", p50_per_connection)):
            if case.per_address > 1:  # a sampled probe: its handshakes at an address in turn
                over = ratio(case, regime, "probe", value, (case.key, "bare"))
                goals.append(f"{case.label}, {regime}, {what} per connection: "
                             f"{median(over):.2f}x raw handshakes of the same shape")
                continue
            direct = vs_one(case, regime, "probe", value)
            raw = vs_one(case, regime, "bare", value)
            normalized = median([a / b for a, b in zip(direct, raw, strict=True)])
            official = ", the issue's goal" if case.key == "8" else ""
            goals.append(
                f"{case.label}, {regime}, {what} per connection: {median(direct):.2f}x a "
                f"1-address probe's (raw handshakes of the same shape: {median(raw):.2f}x; "
                f"over theirs: {normalized:.2f}x); goal <= {GOAL_PER_CONNECTION:.2f}x"
                f"{official}: {goal_verdict(median(direct), normalized)}")
    return goals


# -- part 2: memory ------------------------------------------------------------------------------

@dataclass(frozen=True)
class MemorySample:
    probes: int
    rss: int  # bytes
    blocks: int  # sys.getallocatedblocks() after gc.collect()
    traced: int  # bytes allocated since part 2 began and still held (tracemalloc; not
    # the benchmark's own)
    remembered: int  # addresses in the prober's address memory


@dataclass(frozen=True)
class MemoryVerdict:
    """Part 2's judgement over its steady samples (the address memory full)."""

    steady: list[MemorySample]
    filled_at: int | None  # probes when the address memory became full, None: never
    rss_per_probe: float
    blocks_per_probe: float
    traced_per_probe: float  # from the first third's median to the last third's

    @property
    def rss_growth(self) -> float:
        """RSS at the end of the steady part over its start's, less one."""
        return self.steady[-1].rss / self.steady[0].rss - 1

    @property
    def flat(self) -> bool:
        return (self.traced_per_probe < FLAT_TRACED_BYTES_PER_PROBE
                and self.rss_growth < FLAT_RSS_GROWTH)


def slope(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of ``points`` (0 for fewer than two, or one x)."""
    if len(points) < 2 or len({x for x, _ in points}) < 2:
        return 0.0
    return statistics.linear_regression([x for x, _ in points], [y for _, y in points]).slope


def memory_verdict(samples: Sequence[MemorySample], capacity: int,
                   per_probe: int = len(ADDRESSES)) -> MemoryVerdict:
    """Judge ``samples`` from the one where the address memory (``capacity``
    addresses) could take no further probe of ``per_probe`` addresses
    without dropping a name: before it the prober is filling a bounded
    table, which is meant. If it never filled (or too few samples follow),
    judge the second half. The steady part starts a quarter after the fill."""
    filled_at = next((s.probes for s in samples if s.remembered > capacity - per_probe), None)
    steady = [s for s in samples if filled_at is not None and s.probes >= filled_at]
    # Its first quarter left out too: the allocator's arenas and the table's
    # dict settle after the fill (a leak goes on to the end).
    steady = steady[len(steady) // 4:]
    if len(steady) < 3:
        steady = list(samples[len(samples) // 2:])
    return MemoryVerdict(
        steady, filled_at,
        slope([(s.probes, s.rss) for s in steady]),
        slope([(s.probes, s.blocks) for s in steady]),
        thirds_slope([(s.probes, s.traced) for s in steady]))


def thirds_slope(points: Sequence[tuple[float, float]]) -> float:
    """The growth per unit of x from the first third of ``points`` to the
    last, by their medians: a swing in one sample (a table resized, a
    buffer held at that moment) moves it less than a least-squares slope."""
    third = len(points) // 3
    if third < 1:
        return slope(points)
    first, last = points[:third], points[-third:]
    run = median([x for x, _ in last]) - median([x for x, _ in first])
    return (median([y for _, y in last]) - median([y for _, y in first])) / run


async def run_memory(args: argparse.Namespace, cost: Cost
                     ) -> tuple[list[MemorySample], float, list[str]]:
    """``--memory-probes`` 8-address probes of fresh names, loaded, in batches
    of ``--memory-every``, under tracemalloc; after each batch (nothing in
    flight) a full collection and a sample. Returns the samples, the
    seconds, and the lines of code whose allocations still held grew most
    over the steady part (where a leak would show)."""
    case = CASES[2]
    samples: list[MemorySample] = []
    snapshots: list[tracemalloc.Snapshot] = []
    capacity = cost.prober.address_memory.max_entries
    # What the benchmark itself keeps (its samples) and tracemalloc's own.
    ignore = [tracemalloc.Filter(False, tracemalloc.__file__),
              tracemalloc.Filter(False, str(BENCH_DIR / "*"))]

    def sample(done: int) -> None:
        gc.collect()
        snapshot = tracemalloc.take_snapshot().filter_traces(ignore)
        samples.append(MemorySample(
            done, proc_status(os.getpid())["VmRSS"], sys.getallocatedblocks(),
            sum(stat.size for stat in snapshot.statistics("filename")),
            len(cost.prober.address_memory)))
        if snapshots:  # the first one once the address memory is full, and the last
            snapshots[1:] = [snapshot]
        elif samples[-1].remembered > capacity - case.addresses:
            snapshots.append(snapshot)

    gc.collect()
    tracemalloc.start()
    try:
        started, done = time.perf_counter(), 0
        sample(done)
        while done < args.memory_probes:
            batch = min(args.memory_every, args.memory_probes - done)
            await cost.probes(case, batch, case.concurrency)
            done += batch
            sample(done)
        seconds = time.perf_counter() - started
        growth: list[str] = []
        if len(snapshots) == 2:
            grown = sorted(snapshots[1].compare_to(snapshots[0], "lineno"),
                           key=lambda stat: -stat.size_diff)
            for stat in [stat for stat in grown if stat.size_diff > 0][:5]:
                frame = stat.traceback[0]
                growth.append(f"{short_path(frame.filename)}:{frame.lineno}: "
                              f"{stat.size_diff:+,} bytes, {stat.count_diff:+,} blocks")
    finally:
        tracemalloc.stop()
    return samples, seconds, growth


def report_memory(args: argparse.Namespace, samples: list[MemorySample], seconds: float,
                  capacity: int, growth: Sequence[str]) -> str:
    verdict = memory_verdict(samples, capacity)
    steady = verdict.steady
    shown = sorted({0, len(samples) - 1, samples.index(steady[0]),
                    *range(0, len(samples), max(1, len(samples) // 8))})
    rows = [[f"{samples[i].probes:,}", f"{samples[i].probes * len(ADDRESSES):,}",
             f"{samples[i].rss / 2**20:.1f}", f"{samples[i].blocks:,}",
             f"{samples[i].traced / 2**20:.2f}", f"{samples[i].remembered:,}"] for i in shown]
    print(f"\n## 2. Memory: {args.memory_probes:,} probes of 8 addresses (fresh names, "
          f"{CASES[2].concurrency} at once), {seconds:.0f} s under tracemalloc, a fresh prober "
          f"remembering {capacity:,} addresses at most; a sample after every "
          f"{args.memory_every} probes (nothing in flight, after gc.collect())\n")
    print_table(["probes", "connections", "RSS MiB", "allocated blocks",
                         "traced MiB (tracemalloc)", "addresses remembered"], rows)
    if growth:
        print("\nallocations still held that grew most over the steady part "
              "(tracemalloc, by line):")
        for line in growth:
            print(f"  {line}")
    where = (f"from probe {steady[0].probes:,} (the address memory of {capacity:,} addresses "
             f"full at {verdict.filled_at:,})"
             if verdict.filled_at is not None and steady[0].probes >= verdict.filled_at
             else f"over the second half (from probe {steady[0].probes:,}: the address memory "
                  "never filled)")
    fill = (steady[0].rss - samples[0].rss) / 2**20
    return (f"memory, {where} to {steady[-1].probes:,}: {verdict.traced_per_probe:+.2f} bytes "
            f"held by Python (tracemalloc), {verdict.rss_per_probe:+.1f} bytes of RSS and "
            f"{verdict.blocks_per_probe:+.3f} allocated blocks per probe, RSS "
            f"{verdict.rss_growth:+.2%} over it ({'flat' if verdict.flat else 'GROWING'}: flat "
            f"below {FLAT_TRACED_BYTES_PER_PROBE:g} traced bytes a probe and "
            f"{FLAT_RSS_GROWTH:.0%} of RSS); before it, {fill:+.1f} MiB of RSS while the "
            "address memory filled")


# -- part 3: the notary end to end ----------------------------------------------------------------

async def query_load(port: int, targets: Sequence[str], *, concurrency: int, duration_s: float,
                     passes: int | None, sampler: Sampler) -> tuple[Counter[int], float, int]:
    """``POST /target/<target>`` with a fingerprint no site serves, over
    ``concurrency`` keep-alive connections, round the targets (``passes``
    times, or until ``duration_s``). Returns the statuses, the seconds and
    the queries sent."""
    statuses: Counter[int] = Counter()
    sent = 0
    total = len(targets) * passes if passes is not None else None
    body = f"fingerprint={NO_SUCH_FINGERPRINT}"

    def more(deadline: float) -> bool:
        return (total is None or sent < total) and trio.current_time() < deadline

    async def connection(deadline: float) -> None:
        nonlocal sent
        buffer = bytearray()
        async with await trio.open_tcp_stream(LOOPBACK, port) as stream:
            while more(deadline):
                path = f"/target/{targets[sent % len(targets)]}"
                sent += 1
                await stream.send_all(post_request(port, path, body))
                head = await receive_response(stream, buffer)
                statuses[status_of(head)] += 1
                if re.search(rb"(?i)\r\nconnection: *close", head.partition(b"\r\n\r\n")[0]):
                    return

    async def client(deadline: float) -> None:
        while more(deadline):
            await connection(deadline)

    seconds = await drive_clients(client, concurrency=concurrency, duration_s=duration_s,
                                  sampler=sampler)
    return statuses, seconds, sent


def connections_made(admin_port: int) -> float:
    found = [value for name, value in get_metrics(admin_port)
             if name.split("{")[0] in ("notary_probe_connections", "notary_probe_connections_total")]
    if not found:
        raise BenchError("the notary's /metrics has no notary_probe_connections")
    return found[0]


def run_notary(args: argparse.Namespace, processes: Processes, directory: Path,
               split: list[int], server_cpu: int) -> tuple[list[list[str]], str]:
    """Part 3: a fresh notary, phases of 1-address then 8-address names."""
    setup = new_notary(directory / "notary", {
        "answers": {"reprobe_after_s": 0},
        "limits": {"probes_per_minute_per_target": 0, "probes_per_s_per_destination_prefix": 0},
        "rescan": {"enabled": False}})
    if setup.admin_port is None:
        raise BenchError("the notary has no admin listener (its /metrics count connections)")
    trace_dir = directory / "notary-snapshots"
    trace = ["--trace-dir", str(trace_dir)] if args.trace_notary else []
    trace_dir.mkdir(exist_ok=True)
    notary = start_notary(
        processes, setup, "notary", cpu=server_cpu, log=setup.directory / "notary.log",
        argv=[sys.executable, str(Path(__file__).resolve()), "--serve-notary",
              str(setup.config), *trace], prime=False)
    snapshots: list[tuple[str, Path]] = []
    if args.trace_notary:
        snapshots.append(("started", snapshot_notary(notary.process, trace_dir, 1)))
    rows, verdict = [], ""
    for addresses, names, expected, label in (
            (1, 5 * args.notary_targets, 1, "1 address (one certificate)"),
            (8, args.notary_targets, 16, "8 addresses, a certificate each (sampled once seen: "
                                         "2 handshakes an address)")):
        targets = [f"{site_name(addresses, n)}+{split[n % len(split)]}" for n in range(names)]
        concurrency = max(1, IN_FLIGHT // addresses)
        phases = (("first query of each name (new)", 1, 600.0),
                  ("every query probes again", None,
                   args.memory_duration if addresses == 8 else args.duration))
        for phase, passes, duration in phases:
            sampler = Sampler(notary.pid)
            cpu, made = cpu_seconds(notary.pid), connections_made(setup.admin_port)
            statuses, seconds, sent = trio.run(functools.partial(
                query_load, setup.plain_port, targets, concurrency=concurrency,
                duration_s=duration, passes=passes, sampler=sampler))
            cpu = cpu_seconds(notary.pid) - cpu
            made = connections_made(setup.admin_port) - made
            notary.check_alive()
            if set(statuses) - {409}:
                raise BenchError(f"{label}, {phase}: statuses {dict(statuses)} (409 expected: "
                                 f"the fingerprint is no site's)\n{tail(notary.log)}")
            per_query = made / sent
            if passes is None and per_query < 0.9 * expected:
                print(f"WARNING: {label}, {phase}: {per_query:.1f} connections a query, not "
                      f"{expected}: queries came within a second of their name's last probe "
                      "(reprobe_after_s counts whole seconds); use more --notary-targets")
            rows.append([label, phase, f"{len(targets):,}", f"{sent:,}",
                         f"{sent / seconds:,.0f}", f"{per_query:.1f}", f"{made / seconds:,.0f}",
                         f"{cpu / sent * 1e6:,.0f}", f"{cpu / made * 1e6:,.0f}",
                         f"{cpu / seconds:.0%}",
                         f"{min(sampler.rss) / 2**20:.0f} / {max(sampler.rss) / 2**20:.0f}",
                         f"{sampler.growth():+.1%}" if passes is None else "-"])
            print(f"  {label}, {phase}: {sent:,} queries in {seconds:.1f} s", flush=True)
            if args.trace_notary:
                snapshots.append((f"{label}, {phase}", snapshot_notary(
                    notary.process, trace_dir, len(snapshots) + 1)))
            if passes is None:
                tenths = [sampler.rss[min(len(sampler.rss) - 1, len(sampler.rss) * k // 10)]
                          for k in range(11)]
                print(f"    RSS over it, each tenth (MiB): "
                      f"{' '.join(f'{rss / 2**20:.0f}' for rss in tenths)}", flush=True)
            if passes is None and addresses == 8:
                growth = sampler.growth()
                verdict = (f"notary memory, {sent:,} queries each probing 8 addresses over "
                           f"{seconds:.0f} s: RSS growth {growth:+.1%} (peak of the last third "
                           f"over the first third's; "
                           f"{'none' if growth <= GROWTH_TOLERANCE else 'GROWING'} at "
                           f"{GROWTH_TOLERANCE:.0%})")
    problems = tail(notary.log)
    if problems.strip():
        print(f"\nnotary log (warnings and errors):\n{problems}")
    processes.stop(notary.process)
    for (_, before), (phase, after) in itertools.pairwise(snapshots):
        print(f"\nthe notary's allocations still held, over \"{phase}\", and the lines whose grew most "
              "(tracemalloc, by line):")
        grown = sorted(tracemalloc.Snapshot.load(str(after)).compare_to(
            tracemalloc.Snapshot.load(str(before)), "lineno"), key=lambda stat: -stat.size_diff)
        print(f"  in all: {sum(stat.size_diff for stat in grown):+,} bytes, "
              f"{sum(stat.count_diff for stat in grown):+,} blocks, held "
              f"{sum(stat.size for stat in grown):,} bytes")
        for stat in grown[:8]:
            frame = stat.traceback[0]
            print(f"  {short_path(frame.filename)}:{frame.lineno}: "
                  f"{stat.size_diff:+,} bytes, {stat.count_diff:+,} blocks")
    return rows, verdict


def snapshot_notary(process: Any, directory: Path, number: int) -> Path:
    """Ask the notary under ``--trace-notary`` for its snapshot ``number``
    and wait until it is written; its path."""
    process.send_signal(signal.SIGUSR1)
    done = directory / f"{number}.done"
    deadline = time.monotonic() + 120
    while not done.exists():
        if time.monotonic() > deadline or process.poll() is not None:
            raise BenchError(f"the notary wrote no snapshot {number} under --trace-notary")
        time.sleep(0.2)
    return done.with_suffix(".snapshot")


# -- part 4: the store's worst case per target ------------------------------------------------------

#: Part 4's addresses: IPv6 of the longest text form (39 characters), the
#: last one a client's address hint (``bench_writer.py --part bounds``'s).
STORE_ADDRESSES = tuple(f"2001:db8:ffff:ffff:ffff:ffff:ffff:{i:04x}" for i in range(9))
STORE_T0 = 1_700_000_000
#: The tables of targets' timelines (the change feed, bounded apart by
#: ``[store] feed_max_rows`` for the whole store, and the claims are left out).
TIMELINE_TABLES = ("certificates", "targets", "observations", "runs")
ENGINES = ("sqlite", "postgresql")


@dataclass(frozen=True)
class SiteShape:
    """A site at the store's bounds: ``addresses`` addresses (``[probe]
    max_addresses``), each showing ``samples`` certificates a probe
    (``samples_per_address``, every handshake a new one), over
    ``certificates`` certificates (``max_certificates_per_target``), each
    seen in ``runs`` probes (``max_runs_per_certificate``) ``spacing_s``
    apart (beyond the store's merge window: every sighting a run)."""

    addresses: int
    samples: int
    certificates: int
    runs: int
    spacing_s: int

    @property
    def per_probe(self) -> int:
        return self.addresses * self.samples

    @property
    def groups(self) -> int:
        """Probes in turn before a certificate is shown again."""
        return -(-self.certificates // self.per_probe)

    @property
    def probes(self) -> int:
        """Probes that bring the target to every bound."""
        return self.groups * self.runs


def probe_plan(shape: SiteShape, probe: int) -> list[tuple[int, int]]:
    """What probe number ``probe`` of the site shows: (certificate, address)
    index pairs, ``shape.samples`` distinct certificates at each address.
    The certificates of one group in turn (``shape.groups`` groups), each
    at the next address each time its group comes round, so that after
    ``shape.probes`` probes each certificate has had ``shape.runs``
    sightings at every address (with ``runs`` >= ``addresses``)."""
    group, turn = probe % shape.groups, probe // shape.groups
    shown = []
    for slot in range(shape.per_probe):
        certificate = group * shape.per_probe + slot
        if certificate < shape.certificates:
            shown.append((certificate, (slot + turn) % shape.addresses))
    return shown


def store_certificate(seed: str, size: int) -> Certificate:
    """``size`` bytes standing in for the DER (random: nothing compresses),
    with their real hashes."""
    der = random.Random(seed).randbytes(size)
    return Certificate(der, hashlib.sha1(der).digest(), hashlib.sha256(der).digest(),
                       hashlib.md5(der).digest(), hashlib.sha256(der[:64]).digest())


def longest_host(index: int) -> str:
    """A 253-character host name (the longest), ``index`` in its first label."""
    return (f"t{index:08d}." + ("a" * 62 + ".") * 4)[:253].rstrip(".")


@dataclass(frozen=True)
class Held:
    """What the timeline tables hold (read back with SQL that both engines run)."""

    targets: int
    certificates: int  # rows of certificates (a target's each: none shared here)
    most_certificates: int  # per target
    most_runs: int  # per (target, certificate): rows of runs, or 1 without
    most_addresses: int  # per observation

    def within(self, shape: SiteShape) -> bool:
        return (self.most_certificates <= shape.certificates and self.most_runs <= shape.runs
                and self.most_addresses <= shape.addresses)


HELD_SQL = (
    "SELECT count(*) FROM targets",
    "SELECT count(*) FROM certificates",
    "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM observations "
    "GROUP BY target_id) AS counted",
    "SELECT coalesce(max(n), 1) FROM (SELECT count(*) AS n FROM runs "
    "GROUP BY target_id, certificate_id) AS counted",
    "SELECT coalesce(max(length(addresses) - length(replace(addresses, ',', '')) + 1), 0) "
    "FROM observations WHERE addresses <> ''",
)


@dataclass(frozen=True)
class Engine:
    """One engine's store for part 4: ``query`` runs one SQL statement on a
    connection of its own (autocommit) and returns its first value;
    ``timeline_bytes``: what the timeline tables and their indexes (and
    PostgreSQL's TOAST) take; ``reclaim``: the statements that leave only
    live rows in them (PostgreSQL's dead rows; SQLite updates in place and
    its freed pages are not counted)."""

    name: str
    open_store: Callable[[], Any]
    query: Callable[[str], Any]
    timeline_bytes: Callable[[], int]
    reclaim: tuple[str, ...] = ()

    def held(self) -> Held:
        return Held(*(int(self.query(sql)) for sql in HELD_SQL))


def sqlite_engine(path: Path, limits: Any, merge_window_s: int) -> Engine:
    from notary.state.store import Store

    def query(sql: str) -> Any:
        with contextlib.closing(sqlite3.connect(path)) as db:
            return db.execute(sql).fetchone()[0]

    def timeline_bytes() -> int:
        """Pages in use (``dbstat``) of the tables and their indexes: the
        freelist, pages freed and not yet reused, is not counted."""
        names = ", ".join(f"'{table}'" for table in TIMELINE_TABLES)
        return int(query(f"SELECT coalesce(sum(pgsize), 0) FROM dbstat WHERE name IN "
                         f"(SELECT name FROM sqlite_schema WHERE tbl_name IN ({names}))"))

    return Engine(f"SQLite {sqlite3.sqlite_version}",
                  lambda: Store(path, limits=limits, merge_window_s=merge_window_s),
                  query, timeline_bytes)


def postgres_engine(dsn: str, limits: Any, merge_window_s: int) -> Engine:
    import psycopg

    from notary.state.pgstore import PostgresStore

    def query(sql: str) -> Any:
        with psycopg.connect(dsn, autocommit=True) as db:
            cursor = db.execute(sql)
            return cursor.fetchone()[0] if cursor.description else None

    def timeline_bytes() -> int:
        """``pg_total_relation_size``: heap, indexes and TOAST, dead rows
        included (what autovacuum has not reclaimed yet)."""
        names = ", ".join(f"'{table}'" for table in TIMELINE_TABLES)
        return int(query(f"SELECT sum(pg_total_relation_size(name::regclass)) "
                         f"FROM unnest(ARRAY[{names}]) AS name"))

    def version() -> str:
        return str(query("SHOW server_version")).split()[0]

    return Engine(f"PostgreSQL {version()}",
                  lambda: PostgresStore(dsn, limits=limits, merge_window_s=merge_window_s),
                  query, timeline_bytes, tuple(f"VACUUM FULL {t}" for t in TIMELINE_TABLES))


@dataclass
class StoreFigures:
    """Part 4's figures for one engine, bytes per target unless said:
    ``written``, as the writes leave the tables (PostgreSQL: with the dead
    rows autovacuum has not reclaimed yet), ``live`` once they are
    reclaimed (PostgreSQL: after ``VACUUM FULL``; SQLite: the same, its
    pages in use)."""

    engine: str
    targets: int
    probes: int  # a target's, each phase
    written_at_bounds: float = 0.0
    live_at_bounds: float = 0.0
    held_at_bounds: Held | None = None
    written_past: float = 0.0
    live_past: float = 0.0
    held_past: Held | None = None
    compacted: float = 0.0
    most_one_probe: float = 0.0  # bytes one probe adds at most: a new target's
    certificates_one_probe: int = 0
    seconds: float = 0.0

    @property
    def dead_per_probe(self) -> float:
        """Bytes of dead rows a probe of a target at its bounds leaves
        (past the bounds, between two reclaims)."""
        return (self.written_past - self.live_past) / self.probes


def store_worst_case(engine: Engine, shape: SiteShape, *, targets: int, size: int,
                     new_targets: int) -> StoreFigures:
    """Part 4 on ``engine``: ``targets`` sites written to their bounds probe
    by probe (``shape.probes`` probes each, a transaction a probe, as the
    writer's batches of one probe), measured as written and reclaimed; as
    many probes again with as many new certificates (each replacing the
    oldest: past the bounds), measured; compacted (``notary db compact``,
    then the engine's reclaim), measured. Then ``new_targets`` new targets
    whose first probe shows the most one probe can: a certificate at every
    handshake of every address and of a client's address hint."""
    figures = StoreFigures(engine.name, targets, shape.probes)
    started = time.perf_counter()

    def per_target(empty: int) -> float:
        return (engine.timeline_bytes() - empty) / targets

    def reclaim() -> None:
        for statement in engine.reclaim:
            engine.query(statement)

    with engine.open_store() as store:
        empty = engine.timeline_bytes()
        for phase in (0, 1):
            for index in range(targets):
                target = Target(longest_host(index), 65535)
                leaves = [store_certificate(f"{index}/{phase}/{n}", size)
                          for n in range(shape.certificates)]
                for probe in range(shape.probes):
                    at = STORE_T0 + (phase * shape.probes + probe) * shape.spacing_s
                    results = [ProbeResult(target, leaves[c], (), STORE_ADDRESSES[a], at)
                               for c, a in probe_plan(shape, probe)]
                    store.record(results, probes=[len(results)])
            written = per_target(empty)
            reclaim()
            if phase == 0:
                figures.written_at_bounds, figures.live_at_bounds = written, per_target(empty)
                figures.held_at_bounds = engine.held()
            else:
                figures.written_past, figures.live_past = written, per_target(empty)
                figures.held_past = engine.held()
        store.compact(STORE_T0, 10**9)
    reclaim()
    figures.compacted = per_target(empty)
    with engine.open_store() as store:
        before = engine.timeline_bytes()
        hint = len(STORE_ADDRESSES) - 1
        for index in range(new_targets):
            target = Target(longest_host(10**7 + index), 65535)
            at = STORE_T0 + 10**8
            results = [ProbeResult(target, store_certificate(f"n{index}/{a}/{s}", size), (),
                                   STORE_ADDRESSES[a], at)
                       for a in (*range(shape.addresses), hint) for s in range(shape.samples)]
            store.record(results, probes=[len(results)])
        figures.certificates_one_probe = len(results)
        figures.most_one_probe = (engine.timeline_bytes() - before) / new_targets
    figures.seconds = time.perf_counter() - started
    return figures


def run_store(args: argparse.Namespace, processes: Processes, directory: Path
              ) -> tuple[list[StoreFigures], SiteShape, int]:
    from notary.config import ProbeConfig, StoreConfig

    config, probe = StoreConfig(), ProbeConfig()
    limits = config.timeline_limits()
    shape = SiteShape(probe.max_addresses, probe.samples_per_address,
                      limits.max_certificates_per_target, limits.max_runs_per_certificate,
                      config.merge_window_s + 1)
    engines = []
    if "sqlite" in args.engines:
        engines.append(lambda: sqlite_engine(directory / "store.db", limits,
                                             config.merge_window_s))
    if "postgresql" in args.engines:
        def postgres() -> Engine:
            # Autovacuum off: "as written" counts every dead row the writes
            # leave (what autovacuum reclaims, when it runs), the same in every run.
            dsn = start_postgres(processes, directory / "pg", cpu=None,
                                         settings=("autovacuum=off",))
            return postgres_engine(dsn, limits, config.merge_window_s)
        engines.append(postgres)
    found = []
    for make in engines:
        try:
            engine = make()
        except BenchError as exc:
            print(f"  skipped: {exc}", flush=True)
            continue
        print(f"  {engine.name}: {args.store_targets} targets x {2 * shape.probes} probes",
              flush=True)
        figures = store_worst_case(engine, shape, targets=args.store_targets,
                                   size=limits.max_certificate_bytes,
                                   new_targets=args.store_targets * 4)
        for held in (figures.held_at_bounds, figures.held_past):
            if held is None or not held.within(shape):
                raise BenchError(f"{engine.name}: the store holds beyond its bounds: {held}")
        found.append(figures)
    return found, shape, limits.max_certificate_bytes


def report_store(found: Sequence[StoreFigures], shape: SiteShape, size: int) -> list[str]:
    """Print part 4's table; return its goal lines."""
    print(f"\n## 4. The store's worst case per target: a site at {shape.addresses} addresses "
          f"of 39 characters, {shape.samples} certificates at each a probe (every handshake "
          f"a new one), {shape.certificates} certificates of {size:,} bytes in turn, each "
          f"seen {shape.runs} times {shape.spacing_s:,} s apart (a run each), 253-character "
          f"names; {shape.probes} probes (a transaction each) take a target to its bounds, "
          f"as many again with new certificates go past them. Bytes per target of the "
          f"timeline tables and their indexes (the change feed left out); live: PostgreSQL "
          f"after VACUUM FULL (autovacuum off), SQLite its pages in use\n")
    rows = []
    for figures in found:
        held, past = figures.held_at_bounds, figures.held_past
        assert held is not None and past is not None
        rows.append([
            figures.engine, f"{figures.live_at_bounds:,.0f}", f"{figures.live_past:,.0f}",
            f"{figures.compacted:,.0f}",
            f"{figures.written_at_bounds:,.0f} / {figures.written_past:,.0f}",
            f"{figures.dead_per_probe:,.0f}",
            f"{held.most_certificates} / {held.most_runs} / {held.most_addresses}",
            f"{past.most_certificates} / {past.most_runs} / {past.most_addresses}",
            f"{figures.certificates_one_probe}: {figures.most_one_probe:,.0f}",
            f"{figures.seconds:.1f}"])
    print_table([
        "engine", "live at its bounds", "live past them", "compacted",
        "as written: at / past its bounds", "dead rows a probe at its bounds leaves",
        "most held: certificates / runs / addresses", "past them",
        "one probe at most, new target: certificates: bytes", "seconds"], rows)
    return [f"store, {figures.engine}: {figures.live_at_bounds / 1e6:.2f} MB per target at "
            f"its bounds ({figures.live_past / 1e6:.2f} MB past them, "
            f"{figures.compacted / 1e6:.2f} MB compacted; README, SQLite: 0.70 MB, 0.65 MB "
            f"compacted), bounds held; {figures.dead_per_probe / 1e3:,.0f} kB of dead rows a "
            f"probe at the bounds; the most one probe adds: {figures.most_one_probe / 1e3:.0f} "
            f"kB (README: 320 kB)" for figures in found]


# -- the whole run -------------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run, not a measurement")
    parser.add_argument("--part", default=",".join(PARTS),
                        help=f"comma-separated parts ({', '.join(PARTS)}; default all)")
    parser.add_argument("--rounds", type=int, help="part 1 rounds, interleaved (3; quick 1)")
    parser.add_argument("--connections", type=int,
                        help="part 1: connections a loaded pass (4000; quick 400), a quarter "
                             "of it alone")
    parser.add_argument("--memory-probes", type=int, help="part 2: probes (6000; quick 800)")
    parser.add_argument("--memory-every", type=int, help="part 2: probes between samples "
                        "(100; quick 50)")
    parser.add_argument("--address-memory", type=int, help="part 2: addresses the prober "
                        "remembers at most (the default, 16384; quick 1024, so that it fills)")
    parser.add_argument("--notary-targets", type=int, help="part 3: names of 8 addresses, "
                        "and 5 times as many of one (600; quick 150): each query must come "
                        "a second or more after the last of its name to probe")
    parser.add_argument("--duration", type=float, help="part 3: seconds of the 1-address "
                        "phase (15; quick 3)")
    parser.add_argument("--memory-duration", type=float, help="part 3: seconds of the "
                        "8-address phase, whose RSS growth is reported (90; quick 5)")
    parser.add_argument("--store-targets", type=int, help="part 4: sites written to their "
                        "bounds, per engine (8; quick 2)")
    parser.add_argument("--engines", default=",".join(ENGINES),
                        help=f"part 4: comma-separated engines ({', '.join(ENGINES)}; default "
                        "both; PostgreSQL is skipped, said so, when not installed)")
    parser.add_argument("--server-cpu", type=int, help="core of the prober or the notary "
                        "(default: first)")
    parser.add_argument("--client-cpu", type=int, help="core of the farm and the query load "
                        "(default: second)")
    parser.add_argument("--trace-notary", action="store_true", help="part 3: run the notary "
                        "under tracemalloc and print what grew in each phase (a diagnosis: "
                        "the figures are then not measurements)")
    parser.add_argument("--wait-quiet", type=float, default=0, metavar="SECONDS")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    # Child modes (started by the benchmark itself).
    parser.add_argument("--farm", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--certs", help=argparse.SUPPRESS)
    ports = functools.partial(parser.add_argument, help=argparse.SUPPRESS, default=[],
                              type=lambda text: [int(port) for port in text.split(",")])
    ports("--split-ports")
    ports("--rotating-ports")
    parser.add_argument("--serve-notary", metavar="CONFIG", help=argparse.SUPPRESS)
    parser.add_argument("--trace-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name, full, quick in (("rounds", 3, 1), ("connections", 4000, 400),
                              ("memory_probes", 6000, 800), ("memory_every", 100, 50),
                              ("notary_targets", 600, 150), ("duration", 15.0, 3.0),
                              ("memory_duration", 90.0, 5.0), ("store_targets", 8, 2)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    args.parts = [part.strip() for part in args.part.split(",") if part.strip()]
    unknown = set(args.parts) - set(PARTS)
    if unknown:
        parser.error(f"unknown part {', '.join(sorted(unknown))}; choose from {', '.join(PARTS)}")
    args.engines = [engine.strip() for engine in args.engines.split(",") if engine.strip()]
    unknown = set(args.engines) - set(ENGINES)
    if unknown:
        parser.error(f"unknown engine {', '.join(sorted(unknown))}; choose from "
                     f"{', '.join(ENGINES)}")
    for name in ("rounds", "connections", "memory_probes", "memory_every", "address_memory",
                 "notary_targets", "store_targets"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("duration", "memory_duration"):
        if not getattr(args, name) > 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    return args


def run(args: argparse.Namespace, processes: Processes, directory: Path) -> int:
    from notary.config import ProbeConfig
    from notary.model.policy import AddressPolicy
    from notary.outbound.probe import DEFAULT_ADDRESS_MEMORY_ENTRIES, open_prober

    if args.address_memory is None:
        args.address_memory = 1024 if args.quick else DEFAULT_ADDRESS_MEMORY_ENTRIES

    refuse_name_lookups()
    server_cpu, client_cpu = start_load(
        args, "Sites served at several addresses (issue 31): the cost of probing every address",
        None, lambda s, c: [
            f"parts: {', '.join(args.parts)}; the prober (parts 1-2, this process) or the "
            f"notary (part 3): CPU {s}; the site farm (and part 3's query load): CPU {c}",
            f"the site: a<N>-<n>.{DOMAIN} resolves (injected resolver) to the first N of "
            f"{ADDRESSES[0]}-{ADDRESSES[-1].rsplit('.', 1)[1]}, each address with its own ECDSA "
            f"P-256 certificate ({CERTS_PER_ADDRESS} in turn on the rotating ports), "
            f"{PORTS_PER_GROUP} ports of each kind; every probe a fresh name"])
    split: list[int] = []
    rotating: list[int] = []
    farm_pid = 0
    if {"cost", "memory", "notary"} & set(args.parts):
        split, rotating, farm_pid = start_farm(processes, directory, client_cpu)
    goals: list[str] = []
    if {"cost", "memory"} & set(args.parts):
        os.sched_setaffinity(0, {server_cpu})

        def prober(memory_entries: int = DEFAULT_ADDRESS_MEMORY_ENTRIES) -> AsyncContextManager:
            return open_prober(ProbeConfig(timeout_s=30.0),
                               policy=AddressPolicy.from_cidrs(["127.0.0.0/8"]),
                               resolver=site_resolver, address_memory_entries=memory_entries)

        async def prober_parts() -> None:
            if "cost" in args.parts:
                async with prober() as opened:
                    print(f"\npart 1: {args.rounds} round(s) of {len(CASES)} cases x "
                          f"{len(REGIMES)} regimes x (prober, raw handshakes)", flush=True)
                    runs = await run_cost(args, Cost(opened, split, rotating, farm_pid),
                                          [server_cpu, client_cpu])
                    goals.extend(report_cost(args, runs))
            if "memory" in args.parts:
                async with prober(args.address_memory) as opened:  # a fresh one
                    print(f"\npart 2: {args.memory_probes:,} probes of 8 addresses", flush=True)
                    samples, seconds, growth = await run_memory(
                        args, Cost(opened, split, rotating, farm_pid))
                    goals.append(report_memory(args, samples, seconds, args.address_memory,
                                               growth))

        trio.run(prober_parts)
    if "notary" in args.parts:
        os.sched_setaffinity(0, {client_cpu})
        print(f"\npart 3: a notary, {args.notary_targets} names of 1 and of 8 addresses",
              flush=True)
        rows, verdict = run_notary(args, processes, directory, split, server_cpu)
        print(f"\n## 3. The notary end to end: POST /target with a fingerprint no site serves, "
              f"[answers] reprobe_after_s = 0 (every query probes), {IN_FLIGHT} connections "
              "in flight (queries at once: that over the addresses)\n")
        print_table([
            "names", "phase", "targets", "queries", "per s", "connections a query", "connections/s",
            "notary CPU us/query", "notary CPU us/connection", "notary core",
            "RSS min / max MiB", "RSS growth, last third"], rows)
        goals.append(verdict)
    if "store" in args.parts:
        print("\npart 4: the store's worst case per target", flush=True)
        found, shape, size = run_store(args, processes, directory)
        goals.extend(report_store(found, shape, size))
    print()
    for line in goals:
        print(line)
    print(describe_busy([server_cpu, client_cpu], "after the runs"))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.farm:
        return farm_main(args)
    if args.serve_notary:
        return serve_notary_main(args)
    return run_benchmark("bench_sites", args, run)


if __name__ == "__main__":
    sys.exit(main())
