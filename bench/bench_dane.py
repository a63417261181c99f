"""DANE verdicts per second per core on cache misses (issue 20), against the perspective probe.

A notary's DANE check on a miss (``lookup_tlsa`` through unbound + nsd on loopback, then
``verdict``) and, in the same run, the Prober's probe of as many loopback TLS targets
(bench_probe.py's farm, run as ``bench_probe.py --farm``). Set-up, passes: ``bench/README.md``.

    .venv/bin/python bench/bench_dane.py --wait-quiet 60   # full run (about 35 s)
    .venv/bin/python bench/bench_dane.py --quick           # smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import shutil
import ssl
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import trio
import trustme
from harness.loopback import free_ports
from harness.machine import describe_busy
from harness.processes import Processes, run_benchmark
from harness.project import BenchError
from harness.report import format_rate, format_ratio, print_table
from harness.runs import best_seconds, start_load

from notary.config import ProbeConfig
from notary.errors import ProbeError, ProbeResolveFailed
from notary.model.dane import association, verdict
from notary.model.policy import AddressPolicy
from notary.model.targets import Target
from notary.outbound.probe import open_prober
from notary.outbound.tlsa import lookup_tlsa
from tests.support.dnssec import dnssec_stack

ADDRESSES = 10  # the farm listens on 127.0.0.1-10, on as many ports as the targets need
FARM = Path(__file__).resolve().parent / "bench_probe.py"
ECDSA = trustme.KeyType.ECDSA
Item = tuple[Target, list[bytes]]  # a target, its chain (DER, leaf first)
EE, TA, COLD = "DANE-EE 3 1 1", "DANE-TA 2 0 1", "1: unbound cold, nsd answers"
#: The table's rows: (the passes' label, check, pass).
ROWS = (("EE cold", EE, COLD), ("EE warm", EE, "warm"), ("TA cold", TA, COLD),
        ("TA warm", TA, "warm"), ("probe", "perspective probe (Prober, loopback TLS farm)", "-"))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run, not a measurement")
    parser.add_argument("--targets", type=int, help="names and farm targets (2000; quick 200)")
    parser.add_argument("--ta-share", type=float, default=0.25,
                        help="share of names with DANE-TA 2 0 1, not DANE-EE 3 1 1 (0.25)")
    parser.add_argument("--concurrency", type=int, default=64, help="checks or probes at once (64)")
    parser.add_argument("--rounds", type=int, help="warm rounds (5; quick 1)")
    parser.add_argument("--repeat", type=int, help="passes of verdict() alone (5; quick 1)")
    parser.add_argument("--server-cpu", type=int, help="core of this process (default: first)")
    parser.add_argument("--client-cpu", type=int, help="of unbound, nsd, farm (default: second)")
    parser.add_argument("--wait-quiet", type=float, default=0, metavar="SECONDS")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    for name, full, quick in (("targets", 2000, 200), ("rounds", 5, 1), ("repeat", 5, 1)):
        setattr(args, name, getattr(args, name) or (quick if args.quick else full))
    return args


def make_names(count: int, ta_count: int) -> tuple[list[Item], list[Item], list[tuple]]:
    """DANE-TA and DANE-EE targets ``hN.test:443``, their chains (an ECDSA P-256 leaf per
    name, then the private CA: DANE-TA needs it sent) and TLSA records for the zone."""
    ca = trustme.CA(key_type=ECDSA)
    ca_der = ssl.PEM_cert_to_DER_cert(ca.cert_pem.bytes().decode())
    ta, ee, records = [], [], []
    for number in range(count):
        target = Target(f"h{number}.test", 443)
        issued = ca.issue_cert(target.host, key_type=ECDSA).cert_chain_pems[0]
        leaf = ssl.PEM_cert_to_DER_cert(issued.bytes().decode())
        text = (f"2 0 1 {association(ca_der, 0, 1).hex()}" if number < ta_count
                else f"3 1 1 {association(leaf, 1, 1).hex()}")
        (ta if number < ta_count else ee).append((target, [leaf, ca_der]))
        records.append((f"_443._tcp.{target.host}.", "TLSA", text))
    return ta, ee, records


def stack_threads(directory: Path) -> dict[str, list[str]]:
    """unbound's and nsd's threads (/proc/PID/task/TID; nsd forks), by program: every
    process whose command line names the stack's ``directory``."""
    found: dict[str, list[str]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if str(directory).encode() in b" ".join(argv):
                found.setdefault(Path(argv[0].decode()).name, []).extend(
                    f"/proc/{pid}/task/{tid}" for tid in os.listdir(f"/proc/{pid}/task"))
    return found


def cpu_of(tasks: Sequence[str]) -> float:
    """CPU seconds of ``tasks`` so far (schedstat: nanoseconds, not clock ticks)."""
    return sum(int(Path(f"{task}/schedstat").read_text().split()[0]) for task in tasks) / 1e9


@dataclass
class Pass:
    """One pass over the items: count, seconds, this process's CPU, unbound's and nsd's."""
    count: int
    seconds: float
    cpu: float
    stack: dict[str, float]

    def us(self, cpu_seconds: float) -> float:
        return cpu_seconds / self.count * 1e6

    @property
    def rate(self) -> float:
        return self.count / self.seconds


async def drive(items: Sequence[Item], check: Callable[[Item], Awaitable[str]], expected: str,
                concurrency: int, stack: dict[str, list[str]]) -> Pass:
    """``check`` every item once, ``concurrency`` at once; every outcome must be ``expected``."""
    outcomes: Counter[str] = Counter()
    queue = iter(items)

    async def worker() -> None:
        for item in queue:  # shared: each item once
            outcomes[await check(item)] += 1

    before = {name: cpu_of(tasks) for name, tasks in stack.items()}
    cpu, started = time.process_time(), time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    if outcomes != {expected: len(items)}:
        raise BenchError(f"expected {len(items)} x {expected!r}, got {dict(outcomes)}")
    return Pass(len(items), seconds, cpu, {n: cpu_of(t) - before[n] for n, t in stack.items()})


def run(args: argparse.Namespace, processes: Processes, directory: Path) -> int:
    tools = [shutil.which(tool, path="/usr/sbin:/usr/bin") for tool in ("unbound", "nsd")]
    if None in tools:
        raise BenchError("unbound and nsd are needed: run `.ci/install-tools tests`")
    versions = [subprocess.run([tool, flag], capture_output=True, text=True, check=False) for
                tool, flag in zip(tools, ("-V", "-v"), strict=True)]  # nsd's is on stderr
    versions = [(out.stdout + out.stderr).split("ersion ")[-1].split()[0] for out in versions]
    ta_count = round(args.targets * args.ta_share)
    server_cpu, client_cpu = start_load(
        args, "DANE verdicts on cache misses (issue 20), against the perspective probe", None,
        lambda s, c: [f"this process: CPU {s}; unbound {versions[0]}, nsd {versions[1]}, the TLS "
                      f"farm: CPU {c}; {args.targets:,} names ({ta_count:,} {TA}, the others "
                      f"{EE}; ECDSA P-256 chains), {args.targets:,} farm targets, concurrency "
                      f"{args.concurrency}, {args.rounds} warm round(s)"])
    ta, ee, records = make_names(args.targets, ta_count)
    issued = trustme.CA(key_type=ECDSA).issue_cert("127.0.0.1", key_type=ECDSA)
    cert, key = directory / "farm.crt", directory / "farm.key"
    issued.cert_chain_pems[0].write_to_path(cert), issued.private_key_pem.write_to_path(key)
    ports = free_ports(-(-args.targets // ADDRESSES))
    farm = processes.start("farm", [
        sys.executable, str(FARM), "--farm", "--farm-ports", ",".join(map(str, ports)),
        "--addresses", str(ADDRESSES), "--cert", str(cert), "--key", str(key)], cpu=client_cpu)
    if (farm.stdout.readline() if farm.stdout else b"").strip() != b"ready":
        raise BenchError("the TLS farm (bench_probe.py --farm) did not start")
    farm_items = [(Target(f"127.0.0.{k}", port), []) for port in ports
                  for k in range(1, ADDRESSES + 1)][:args.targets]
    now, lookups, runs = datetime.now(UTC), {}, {}  # runs: label -> passes

    async def refuse(host: str, port: int) -> list[str]:
        raise ProbeResolveFailed("the benchmark resolves no name")  # farm targets: IP literals

    with dnssec_stack(records) as stack:
        async def dane(item: Item) -> str:
            target, chain = item
            lookups[target] = lookup = await lookup_tlsa(target, stack.resolver, 5.0)
            return verdict(lookup, chain, target.host, now, max_reuse_s=3600).outcome.value

        async def measure() -> None:
            await lookup_tlsa(Target("prime.test", 443), stack.resolver, 5.0)  # root DNSKEY
            threads = stack_threads(stack.directory)  # after an answer: nsd has forked
            for task in (task for tasks in threads.values() for task in tasks):
                os.sched_setaffinity(int(Path(task).name), {client_cpu})
            os.sched_setaffinity(0, {server_cpu})
            async with open_prober(ProbeConfig(timeout_s=10.0, max_concurrent=args.concurrency),
                                   policy=AddressPolicy.from_cidrs(["127.0.0.0/8"]),
                                   resolver=refuse) as prober:
                async def probe(item: Item) -> str:
                    try:
                        await prober.probe(item[0])
                    except ProbeError as exc:
                        return exc.reason
                    return "ok"

                absent = [(Target(f"absent{n}.test", 443), []) for n in range(200)]  # warm-up
                plan = [("warm-up", absent, dane, "no-tlsa"), ("EE cold", ee, dane, "match"),
                        ("TA cold", ta, dane, "match")] + [
                    ("EE warm", ee, dane, "match"), ("TA warm", ta, dane, "match"),
                    ("probe", farm_items, probe, "ok")] * args.rounds
                for label, items, check, expected in filter(lambda step: step[1], plan):
                    runs.setdefault(label, []).append(
                        await drive(items, check, expected, args.concurrency, threads))

        trio.run(measure)
    best = {label: max(passes, key=lambda p: p.rate) for label, passes in runs.items()}
    probe, rows = best["probe"], []
    for label, name, text in filter(lambda row: row[0] in best, ROWS):
        one = best[label]
        rows.append([name, text, f"{one.count:,}", " / ".join(f"{p.rate:,.0f}" for p in runs[label]),
                     f"{one.cpu / one.seconds:.0%}", *(f"{one.us(cpu):,.0f}" for cpu in (
                         one.cpu, one.stack.get("unbound", 0), one.stack.get("nsd", 0))),
                     format_ratio(one.rate / probe.rate),
                     format_ratio(one.us(one.cpu) / probe.us(probe.cpu))])
    print_table(["check", "pass", "targets", "per s (runs; best kept)", "core use",
                 "notary CPU us/check", "unbound CPU us/check", "nsd CPU us/check",
                 "rate / probe's", "notary CPU / probe's"], rows)

    def verdicts(items: Sequence[Item]) -> float:
        started = time.perf_counter()
        for target, chain in items:
            verdict(lookups[target], chain, target.host, now, max_reuse_s=3600)
        return time.perf_counter() - started

    alone = []
    for kind, items in (("EE", ee), ("TA", ta)):
        if items:
            us = best_seconds(functools.partial(verdicts, items), args.repeat) * 1e6
            us, warm = us / len(items), best[f"{kind} warm"]
            alone.append([f"DANE-{kind}", f"{us:,.1f}", format_rate(1e6 / us),
                          f"{us / warm.us(warm.cpu):.0%}"])
    print_table(["verdict() alone (no I/O)", "us per verdict", "per s per core",
                 "share of a warm check's notary CPU"], alone)
    print(describe_busy([server_cpu, client_cpu], "after the runs"))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark("bench_dane", parse_args(argv), run)


if __name__ == "__main__":
    sys.exit(main())
