"""What witnesses cost a v2 answer (issue 34): a first answer's latency, an answer's bytes, and
a cache hit's rate and CPU, for a notary whose log nobody cosigns against the same notary with a
witness and [log] min_cosignatures = 1 (its answers wait until their inclusion is cosigned), in
the same run.

    .venv/bin/python bench/bench_witness.py --wait-quiet 60   # about 3 minutes
    .venv/bin/python bench/bench_witness.py --quick           # smoke run, about 40 s
"""

from __future__ import annotations

import argparse
import hashlib
import re
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# Importing harness also puts the project root on sys.path.
from harness.loopback import LOOPBACK, connect, free_ports
from harness.machine import cpu_seconds, describe_busy
from harness.options import finish_load_args, load_parser
from harness.processes import Processes, run_benchmark, tail
from harness.project import BenchError
from harness.report import print_table
from harness.runs import Run, run_rounds, start_load
from harness.runs import best as best_run
from harness.servers import RunningNotary, new_notary, start_notary
from harness.tools import ensure_wrk
from harness.v2requests import JSON_TYPE, add_api_ports, https, query_body
from harness.wrk import run_wrk, wrk_script

from notary.protocol import tlog, v2
from notary.state import crypto

TARGETS = 10  # the notary's own HTTPS API ports, each a target asked about once first
BATCHES = (1, 10)
NONCE = "bench-witness"
WITNESS_NAME = "bench.localhost/witness"
#: The notaries: (name, checkpoint_interval_s, witnessed).
NOTARIES = (("alone", 1.0, False), ("witnessed", 1.0, True), ("witnessed-0.1s", 0.1, True))


@dataclass
class Subject:
    name: str
    interval_s: float
    witnessed: bool
    ports: list[int]
    origin: str
    notary: RunningNotary | None = None
    sha256: str = ""
    first_ms: list[float] = field(default_factory=list)
    answers: dict[int, bytes] = field(default_factory=dict)


def v2_public(directory: Path) -> bytes:
    return crypto.ed25519_public_raw(crypto.load_ed25519_private_key(directory / "v2.key"))


def set_witness(config: Path, url: str, vkey: str, pin: str) -> None:
    """``[log] witnesses`` (one inline table, which the harness's key setter cannot write)
    and ``min_cosignatures = 1``, under the [log] header."""
    line = f'witnesses = [{{ url = "{url}", key = "{vkey}", pin = "{pin}" }}]\nmin_cosignatures = 1\n'
    text, found = re.subn(r"(?m)^\[log\]\n", lambda m: m[0] + line, config.read_text(), count=1)
    if not found:
        raise BenchError("no [log] section in the dev-init config")
    config.write_text(text)


def plan(directory: Path) -> tuple[list[Subject], list]:
    """Every notary's set-up (not started): its ports, its log."""
    subjects, setups = [], []
    for name, interval_s, witnessed in NOTARIES:
        ports = free_ports(TARGETS + 6)
        origin = f"{name}.bench.localhost/v2/log"
        setup = new_notary(directory / name, {
            "rescan": {"enabled": False},
            "log": {"enabled": True, "origin": origin, "checkpoint_interval_s": interval_s},
        }, [ports[0], ports[1], *ports[TARGETS:]])
        add_api_ports(setup.config, ports[2:TARGETS])
        subjects.append(Subject(name, interval_s, witnessed, ports[:TARGETS], origin))
        setups.append(setup)
    return subjects, setups


def start_all(processes: Processes, directory: Path, server_cpu: int, client_cpu: int
              ) -> tuple[list[Subject], str]:
    """The witness (on the client's core: it cosigns one checkpoint a second or ten), then
    the notaries, the witnessed ones asking it. Returns them and the witness's vkey."""
    subjects, setups = plan(directory)
    logs = [tlog.verifier_key(s.origin, v2_public(setup.directory))
            for s, setup in zip(subjects, setups, strict=True) if s.witnessed]
    witness_setup = new_notary(directory / "witness", {
        "rescan": {"enabled": False},
        "witness": {"enabled": True, "name": WITNESS_NAME, "logs": tuple(logs)}})
    start_notary(processes, witness_setup, "witness", cpu=client_cpu,
                 log=directory / "witness.log", prime=False)
    with connect(witness_setup.api_port, tls=True, timeout_s=10.0) as sock:
        pin = hashlib.sha1(sock.getpeercert(binary_form=True)).hexdigest()
    vkey = tlog.cosigner_key(WITNESS_NAME, v2_public(witness_setup.directory))
    url = f"https://{LOOPBACK}:{witness_setup.api_port}/v2/witness"
    for subject, setup in zip(subjects, setups, strict=True):
        if subject.witnessed:
            set_witness(setup.config, url, vkey, pin)
        subject.notary = start_notary(processes, setup, subject.name, cpu=server_cpu,
                                      log=directory / f"{subject.name}.log", prime=False)
        with connect(subject.ports[0], tls=True, timeout_s=10.0) as sock:
            subject.sha256 = hashlib.sha256(sock.getpeercert(binary_form=True)).hexdigest()
    return subjects, vkey


def first_answers(subjects: Sequence[Subject], count: int) -> None:
    """Each notary asked about ``count`` targets it never saw, one at a time, interleaved:
    the time from the question to the whole answer (a probe, a statement signed, and for a
    witnessed notary the wait for a cosigned checkpoint)."""
    for index in range(count):
        for subject in subjects:
            body = query_body([subject.ports[index]], subject.sha256, 1, nonce=NONCE)
            started = time.perf_counter()
            https(subject.ports[0], "POST", "/v2/query", body)
            subject.first_ms.append((time.perf_counter() - started) * 1000)


def judge(answer: bytes, subject: Subject, vkey: str) -> str:
    """Whether each statement's inclusion leads to a checkpoint cosigned by the witness."""
    policy = tlog.WitnessPolicy((vkey,), 1)
    parsed = v2.parse_answer_document(answer)
    cosigned = sum(
        1 for s in parsed.statements if s.inclusion is not None
        and policy.judge(s.inclusion.checkpoint, now=int(time.time())).witnessed
    )
    logged = sum(1 for s in parsed.statements if s.inclusion is not None)
    return f"{logged} of {len(parsed.statements)} logged, {cosigned} cosigned"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = load_parser(__doc__.split("\n\n")[0], rounds=3, cpus="the notaries",
                         quick="3 first answers, 2 s per wrk run: a smoke run")
    parser.add_argument("--first", type=int, default=None,
                        help=f"first answers per notary (default {TARGETS}; quick 3)")
    args = finish_load_args(parser.parse_args(argv))
    if args.first is None:
        args.first = 3 if args.quick else TARGETS
    if not 1 <= args.first <= TARGETS:
        parser.error(f"--first: 1 to {TARGETS}")
    return args


def run(args: argparse.Namespace, processes: Processes, directory: Path) -> int:
    wrk = ensure_wrk()
    server_cpu, client_cpu = start_load(
        args, "What witnesses cost a v2 answer (issue 34)", wrk, lambda server, client: [
            f"notaries (one worker each, dev-init, [rescan] off) on CPU {server}; the "
            f"witness and wrk on CPU {client}; targets: each notary's own HTTPS API ports"])
    subjects, vkey = start_all(processes, directory, server_cpu, client_cpu)
    print("\n## 1. A first answer (a new target: probe, sign, log; witnessed: the wait for a "
          f"cosigned checkpoint), {args.first} per notary, sequential\n", flush=True)
    first_answers(subjects, args.first)
    table = []
    alone = statistics.median(subjects[0].first_ms)
    for subject in subjects:
        median = statistics.median(subject.first_ms)
        table.append([subject.name, f"{subject.interval_s:g}", f"{median:,.1f}",
                      f"{max(subject.first_ms):,.1f}", f"{median / alone:.1f}x"])
    print_table(["notary", "checkpoint_interval_s", "median ms", "max ms", "vs alone"], table)
    time.sleep(2.5)  # every statement sequenced (and cosigned)
    print("\n## 2. An answer's bytes (the targets asked above, now logged)\n")
    table = []
    for subject in subjects:
        for n in BATCHES:
            body = query_body(subject.ports[:args.first], subject.sha256, n, nonce=NONCE)
            subject.answers[n] = https(subject.ports[0], "POST", "/v2/query", body)
            base = len(subjects[0].answers[n])
            table.append([subject.name, n, f"{len(subject.answers[n]):,}",
                          f"{len(subject.answers[n]) / base:.3f}x",
                          judge(subject.answers[n], subject, vkey)])
    print_table(["notary", "targets", "answer bytes", "vs alone", "statements"], table)
    print("\n## 3. A cache hit (the same answers, wrk keep-alive over HTTPS, "
          f"-t{args.threads} -c{args.connections} -d{args.duration}s)\n", flush=True)
    rows = [(subject.name, n) for n in BATCHES for subject in subjects[:2]]
    by_name = {subject.name: subject for subject in subjects}
    scripts = {}
    for name, n in rows:
        subject = by_name[name]
        body = query_body(subject.ports[:args.first], subject.sha256, n, nonce=NONCE)
        scripts[(name, n)] = wrk_script(directory, body, name=f"{name}-{n}",
                                        content_type=JSON_TYPE)

    def measure(row: tuple[str, int]) -> Run:
        subject = by_name[row[0]]
        assert subject.notary is not None
        notary = subject.notary
        result = run_wrk(
            wrk, processes, f"https://{LOOPBACK}:{subject.ports[0]}/v2/query", scripts[row],
            threads=args.threads, connections=args.connections, seconds=args.duration,
            cpu=client_cpu, server_cpu_seconds=lambda: cpu_seconds(notary.pid),
            cpus=[server_cpu, client_cpu])
        notary.check_alive()
        return result

    runs = run_rounds(args, rows, measure, lambda row, result: (
        f"{row[0]}, {row[1]} target(s): {result.rate:,.0f} req/s, server "
        f"{result.server_us:.1f} us CPU/req, client core {result.client_busy:.0%}"),
        key=lambda row: row, quiet_cpus=[server_cpu, client_cpu])
    best = {row: best_run(results) for row, results in runs.items()}
    table = []
    for n in BATCHES:
        off, on = best[("alone", n)], best[("witnessed", n)]
        for name, result in (("alone", off), ("witnessed", on)):
            table.append([n, name, " / ".join(f"{r.rate:,.0f}" for r in runs[(name, n)]),
                          f"{result.rate:,.0f}", f"{result.server_us:,.1f}",
                          "" if name == "alone" else
                          f"{on.rate / off.rate:.1%} / {on.server_us / off.server_us:.1%}"])
    print_table(["targets", "notary", "req/s per run", "best req/s", "server CPU us/req",
                 "witnessed / alone: rate / CPU per req"], table)
    print()
    print(describe_busy([server_cpu, client_cpu], "after the runs"))
    for subject in subjects:
        assert subject.notary is not None
        problems = [line for line in tail(subject.notary.log, 200).splitlines()
                    if "WARNING" in line or "ERROR" in line]
        if problems:
            print(f"notary {subject.name} log (warnings and errors):")
            print("\n".join(problems[-20:]) + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark("bench_witness", parse_args(argv), run)


if __name__ == "__main__":
    sys.exit(main())
