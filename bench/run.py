"""The operator's load benchmark: every scenario, one after the other.

    .venv/bin/python bench/run.py                  # every scenario (about half an hour)
    .venv/bin/python bench/run.py --quick          # smoke runs (a few minutes)
    .venv/bin/python bench/run.py --only tls,scale # some scenarios
    make bench                                     # installs the tools, then this

Each scenario is its own script (run alone for its options); this runs them
in the order below, passes ``--quick`` and ``--wait-quiet`` on, prints each
one's tables as they come, and ends with a summary line per scenario (its
exit status and duration). Every script measures its baseline in the same
run and prints the ratio; none sends a byte beyond loopback.

=========  ==============================  ===========================================
scenario   script                          baseline of the same run
=========  ==============================  ===========================================
tls        ``bench_tls.py``                minimal Trio TLS server, nginx (1: keep-alive,
                                           2: a full handshake per query)
http       ``bench_http.py``               minimal Trio server (plain HTTP and TLS)
probe      ``bench_probe.py``              a minimal Trio client's TLS handshakes (3)
relay      ``bench_relay.py``              direct loopback TCP
v2         ``bench_v2.py``                 legacy ``POST /target`` of the same run
scale      ``bench_scale.py``              10 connections; memory with none open
workers    ``bench_workers.py``            ``--workers 1``
cache      ``bench_cache.py``              the pure-Python twin, an ``OrderedDict`` LRU
writer     ``bench_writer.py``             one transaction per row, raw ``executemany``
=========  ==============================  ===========================================

Exit status: 0 when every scenario ran (a goal not met is a finding, not a
failure), 1 when one failed (the others still run), 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: scenario -> (script, takes --wait-quiet)
SCENARIOS: dict[str, tuple[str, bool]] = {
    "tls": ("bench_tls.py", True),
    "http": ("bench_http.py", True),
    "probe": ("bench_probe.py", True),
    "relay": ("bench_relay.py", False),
    "v2": ("bench_v2.py", True),
    "scale": ("bench_scale.py", True),
    "workers": ("bench_workers.py", True),
    "cache": ("bench_cache.py", False),
    "writer": ("bench_writer.py", False),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke runs: not measurements")
    parser.add_argument("--only", metavar="NAMES",
                        help=f"comma-separated scenarios ({', '.join(SCENARIOS)})")
    parser.add_argument("--wait-quiet", type=float, default=60, metavar="SECONDS",
                        help="before each scenario, wait up to this for idle cores (default 60)")
    args = parser.parse_args(argv)
    names = list(SCENARIOS) if args.only is None else [n.strip() for n in args.only.split(",")]
    unknown = [name for name in names if name not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    args.names = names
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    summary = []
    for name in args.names:
        script, waits = SCENARIOS[name]
        command = [sys.executable, str(HERE / script)]
        if args.quick:
            command.append("--quick")
        if waits and not args.quick:
            command += ["--wait-quiet", f"{args.wait_quiet:g}"]
        print(f"\n# scenario {name}: {' '.join(command[1:])}\n", flush=True)
        started = time.monotonic()
        try:
            status = subprocess.run(command, check=False).returncode
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
        summary.append((name, status, time.monotonic() - started))
    print("\n# summary\n")
    print("| scenario | exit status | seconds |\n| --- | --- | --- |")
    for name, status, seconds in summary:
        print(f"| {name} | {status}{'' if status == 0 else ' (failed)'} | {seconds:.0f} |")
    return 0 if all(status == 0 for _, status, _ in summary) else 1


if __name__ == "__main__":
    sys.exit(main())
