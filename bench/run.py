"""The operator's load benchmark: every scenario, one after the other.

    .venv/bin/python bench/run.py                  # every scenario (most of an hour)
    .venv/bin/python bench/run.py --quick          # smoke runs (a few minutes)
    .venv/bin/python bench/run.py --only tls,scale # some scenarios
    make bench                                     # installs the tools, then this

Each scenario is the script ``bench_<scenario>.py``; what each one measures,
against which baseline, and the exit status: bench/README.md.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCENARIOS = ("tls", "edge", "http", "connection", "perspectives", "probe", "sites", "relay", "v2",
             "scale", "workers", "cache", "writer", "fleet", "dane", "log")
#: The scenarios whose script takes no ``--wait-quiet``.
NO_WAIT_QUIET = {"connection", "relay", "cache", "writer", "fleet"}


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
        command = [sys.executable, str(HERE / f"bench_{name}.py")]
        if args.quick:
            command.append("--quick")
        elif name not in NO_WAIT_QUIET:
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
