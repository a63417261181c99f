"""Scenario 3: cache misses, every query a probe.

A notary probing a target farm (``--farm``), against a minimal Trio client's TLS handshakes
with the same targets (``--handshake``). Set-up, phases, rounds, goal: ``bench/README.md``.

    .venv/bin/python bench/bench_probe.py --wait-quiet 120   # full run (about 4 minutes)
    .venv/bin/python bench/bench_probe.py --quick            # smoke run
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import ssl
import statistics
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import trio
from harness.loopback import (
    LOOPBACK,
    client_tls_context,
    free_ports,
    post_request,
    receive_response,
    status_of,
)
from harness.machine import cpu_seconds, describe_busy
from harness.processes import Processes, run_benchmark, tail
from harness.project import BenchError
from harness.report import print_table
from harness.runs import Sampler, drive_clients, start_load
from harness.servers import new_notary, start_notary

GOAL_VS_HANDSHAKES = 0.70
GROWTH_TOLERANCE = 0.05  # more growth of the RSS peak (last third over first) is "GROWING"
NO_SUCH_FINGERPRINT = ":".join(["00"] * 20)
#: (name, POST with an unknown fingerprint, passes over the target list).
PHASES = (("1. fresh targets (GET, never seen)", False, 1),
          ("2. probe per query (POST, unknown fingerprint, same targets)", True, 200))


def target_list(addresses: int, ports: Sequence[int]) -> list[tuple[str, int]]:
    """Every farm target, ports varying fastest."""
    return [(f"127.0.0.{k}", port) for k in range(1, addresses + 1) for port in ports]


def farm_main(args: argparse.Namespace) -> int:
    """Serve TLS on every (address, port) of ``--farm-ports`` until killed;
    print ``ready`` once every listener is up."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(args.cert, args.key)
    context.num_tickets = 0  # nothing after the handshake: the farm stays cheap

    async def handshake(tcp: trio.SocketStream) -> None:
        stream = trio.SSLStream(tcp, context, server_side=True)
        with trio.move_on_after(10):
            try:
                await stream.do_handshake()
                await stream.aclose()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass

    async def serve() -> None:
        listeners = []
        for host, port in target_list(args.addresses, args.farm_ports):
            sock = trio.socket.socket()
            sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_REUSEADDR, 1)
            await sock.bind((host, port))
            sock.listen(1024)
            listeners.append(trio.SocketListener(sock))
        print("ready", flush=True)
        await trio.serve_listeners(handshake, listeners)

    trio.run(serve)
    return 0


def handshake_main(args: argparse.Namespace) -> int:
    """The baseline: handshakes against every target in turn, ``--concurrency``
    at once, for ``--duration`` seconds; prints the count as JSON."""
    targets = target_list(args.addresses, args.farm_ports)
    context = client_tls_context()
    done = failed = 0

    async def worker(offset: int, deadline: float) -> None:
        nonlocal done, failed
        index = offset
        while trio.current_time() < deadline:
            host, port = targets[index % len(targets)]
            index += args.concurrency
            try:
                tcp = await trio.open_tcp_stream(host, port)
                stream = trio.SSLStream(tcp, context, server_hostname=None)
                await stream.do_handshake()
                stream.getpeercert(binary_form=True)
                await trio.aclose_forcefully(stream)
                done += 1
            except (OSError, trio.BrokenResourceError):
                failed += 1

    async def run() -> float:
        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            for offset in range(args.concurrency):
                nursery.start_soon(worker, offset, start + args.duration)
        return trio.current_time() - start

    seconds = trio.run(run)
    print(json.dumps({"handshakes": done, "failed": failed, "seconds": seconds}), flush=True)
    return 0


async def load(port: int, targets: Sequence[tuple[str, int]], *, post: bool, concurrency: int,
               duration_s: float, sampler: Sampler) -> tuple[Counter[int], float]:
    """Queries over ``concurrency`` keep-alive connections, each target at
    most once, for ``duration_s``; returns the count of each status, and the seconds."""
    statuses: Counter[int] = Counter()
    next_index = 0
    body = f"fingerprint={NO_SUCH_FINGERPRINT}"

    async def client(deadline: float) -> None:
        while trio.current_time() < deadline and next_index < len(targets):
            await connection(deadline)

    async def connection(deadline: float) -> None:
        """Queries over one keep-alive connection, until the notary says it
        closes it (``[http] max_requests_per_connection``) or the run ends."""
        nonlocal next_index
        stream = await trio.open_tcp_stream(LOOPBACK, port)
        buffer = bytearray()
        async with stream:
            while trio.current_time() < deadline and next_index < len(targets):
                host, target_port = targets[next_index]
                next_index += 1
                path = f"/target/{host}+{target_port}"
                request = (post_request(port, path, body) if post
                           else f"GET {path} HTTP/1.1\r\nHost: n\r\n\r\n".encode())
                await stream.send_all(request)
                head = await receive_response(stream, buffer)
                statuses[status_of(head)] += 1
                if re.search(rb"(?i)\r\nconnection: *close", head.partition(b"\r\n\r\n")[0]):
                    return  # the connection's last request: open another

    seconds = await drive_clients(client, concurrency=concurrency, duration_s=duration_s,
                                  sampler=sampler)
    return statuses, seconds


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run, not a measurement")
    parser.add_argument("--duration", type=float,
                        help="seconds per phase and for the baseline (default 20; quick 5)")
    parser.add_argument("--rounds", type=int,
                        help="rounds, each with a fresh notary and its own baseline (default 3; "
                             "quick 1): the verdict is on the median ratio")
    parser.add_argument("--memory-duration", type=float,
                        help="seconds of the last round's phase 2, whose RSS growth is "
                             "reported (default 60; quick 5)")
    parser.add_argument("--concurrency", type=int, default=64, help="queries at once (64)")
    parser.add_argument("--addresses", type=int, help="farm loopback addresses (default 20)")
    parser.add_argument("--ports", type=int, help="farm ports per address (default 200)")
    parser.add_argument("--server-cpu", type=int)
    parser.add_argument("--client-cpu", type=int)
    parser.add_argument("--wait-quiet", type=float, default=0, metavar="SECONDS")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    # Child modes (started by the benchmark itself).
    parser.add_argument("--farm", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--handshake", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--farm-ports", help=argparse.SUPPRESS,
                        type=lambda text: [int(port) for port in text.split(",")])
    parser.add_argument("--cert", help=argparse.SUPPRESS)
    parser.add_argument("--key", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name, full, quick in (("duration", 20.0, 5.0), ("rounds", 3, 1),
                              ("memory_duration", 60.0, 5.0), ("addresses", 20, 4),
                              ("ports", 200, 50)):
        setattr(args, name, getattr(args, name) or (quick if args.quick else full))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.farm:
        return farm_main(args)
    if args.handshake:
        return handshake_main(args)
    return run_benchmark("bench_probe", args, run)


def start_farm(processes: Processes, directory: Path, child: Sequence[str], cpu: int) -> None:
    """Start the target farm (``child --farm``) with an ECDSA P-256 certificate (trustme,
    a test dependency); return once it listens on every target."""
    import trustme

    issued = trustme.CA(key_type=trustme.KeyType.ECDSA).issue_cert(
        "127.0.0.1", key_type=trustme.KeyType.ECDSA)
    cert, key = directory / "farm.crt", directory / "farm.key"
    issued.cert_chain_pems[0].write_to_path(str(cert))
    issued.private_key_pem.write_to_path(str(key))
    farm = processes.start("farm", [*child, "--farm", "--cert", str(cert), "--key", str(key)],
                           cpu=cpu)
    line = farm.stdout.readline() if farm.stdout else b""
    if line.strip() != b"ready":
        raise BenchError(f"the target farm did not start: {line!r}")


def run(args: argparse.Namespace, processes: Processes, directory: Path) -> int:
    server_cpu, client_cpu = start_load(
        args, "Scenario 3: cache misses, every query a probe", None)
    farm_ports = free_ports(args.ports)
    targets = target_list(args.addresses, farm_ports)
    child = [sys.executable, str(Path(__file__).resolve()), "--farm-ports",
             ",".join(map(str, farm_ports)), "--addresses", str(args.addresses)]
    start_farm(processes, directory, child, client_cpu)
    os.sched_setaffinity(0, {client_cpu})
    print(f"targets: {len(targets):,} ({args.addresses} loopback addresses x {args.ports} "
          f"ports), concurrency {args.concurrency}, {args.rounds} round(s) of: a fresh "
          f"notary, phase 1, phase 2 ({args.duration:g} s; the last round's "
          f"{args.memory_duration:g} s, for memory), the baseline ({args.duration:g} s)\n")

    rows = []
    ratios: dict[str, list[float]] = {phase: [] for phase, _, _ in PHASES}
    growth = 0.0
    for number in range(1, args.rounds + 1):
        last = number == args.rounds
        # A fresh notary (new database: every target is new to it), serving plain HTTP; a
        # capacity test, not an abuse test: the per-target and per-destination probe limits
        # (every farm target is in 127.0.0.0/24) are off.
        setup = new_notary(directory / f"round{number}", {
            "answers": {"fresh_for_s": 1, "reprobe_after_s": 0},
            "limits": {"probes_per_minute_per_target": 0,
                       "probes_per_s_per_destination_prefix": 0}})
        notary = start_notary(processes, setup, "notary", cpu=server_cpu,
                              log=setup.directory / "notary.log", prime=False)
        rates = {}
        for phase, post, rounds_over in PHASES:
            # Phase 2 goes round after round over the same targets: each query probes again.
            duration = args.memory_duration if post and last else args.duration
            sampler = Sampler(notary.pid, setup.admin_port)
            cpu_before = cpu_seconds(notary.pid)
            statuses, seconds = trio.run(functools.partial(
                load, setup.plain_port, targets * rounds_over, post=post,
                concurrency=args.concurrency, duration_s=duration, sampler=sampler))
            cpu = cpu_seconds(notary.pid) - cpu_before
            notary.check_alive()
            ok = statuses[200] + statuses[409]
            rates[phase] = ok / seconds
            if post and last:
                growth = sampler.growth()
            in_flight = (f"{sum(sampler.in_flight) / len(sampler.in_flight):.0f} avg, "
                         f"{max(sampler.in_flight):.0f} max") if sampler.in_flight else "n/a"
            rows.append([
                f"{number}", phase, f"{statuses.total():,}", f"{rates[phase]:,.0f}",
                ", ".join(f"{k}: {v:,}" for k, v in sorted(statuses.items())),
                in_flight, f"{cpu / seconds:.0%}", f"{cpu / max(1, ok) * 1e6:,.0f}",
                f"{min(sampler.rss) / 2**20:.0f} / {max(sampler.rss) / 2**20:.0f}",
                f"{sampler.growth():+.1%}"])
        problems = tail(notary.log)
        processes.stop(notary.process)
        # The baseline right after, on the same core: the notary is stopped.
        baseline = processes.start("handshake client", [
            *child, "--handshake", "--concurrency", str(args.concurrency),
            "--duration", f"{args.duration:g}"], cpu=server_cpu)
        out, err = baseline.communicate(timeout=args.duration + 60)
        if baseline.returncode != 0:
            raise BenchError(f"the handshake client failed:\n{err.decode(errors='replace')}")
        counts = json.loads(out.decode().strip().splitlines()[-1])
        handshake_rate = counts["handshakes"] / counts["seconds"]
        rows.append([
            f"{number}", "baseline: minimal Trio client, TLS handshakes, same targets",
            f"{counts['handshakes']:,}", f"{handshake_rate:,.0f}",
            f"failed: {counts['failed']}", "-", "-", "-", "-", "-"])
        for phase, rate in rates.items():
            ratios[phase].append(rate / handshake_rate)
        if problems.strip():
            print(f"\nnotary log, round {number} (warnings and errors):\n{problems}")
    print_table(
        ["round", "run", "queries", "per s", "statuses", "probes in flight", "notary core use",
         "notary CPU us/probe", "RSS min / max MiB", "RSS growth, last third"], rows)
    for phase, shares in ratios.items():
        median = statistics.median(shares)
        verdict = "met" if median >= GOAL_VS_HANDSHAKES else "NOT met"
        print(f"{phase}: median {median:.0%} of the raw handshake rate of the same round "
              f"(rounds: {', '.join(f'{share:.0%}' for share in shares)}; goal >= "
              f"{GOAL_VS_HANDSHAKES:.0%}: {verdict})")
    print(f"memory, probing without end for {args.memory_duration:g} s (round {args.rounds}, "
          f"phase 2): RSS growth {growth:+.1%} ({'none' if growth <= GROWTH_TOLERANCE else 'GROWING'})")
    print(describe_busy([server_cpu, client_cpu], "after the runs"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
