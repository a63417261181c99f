"""Helpers shared by the micro-benchmarks in ``bench/``.

Importing this module puts the project root on ``sys.path``, so the scripts
run from a checkout (``.venv/bin/python bench/bench_cache.py``) without the
package being installed.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def cores_and_load() -> tuple[int, int, str]:
    """Cores of the machine, cores this process may run on, and the load
    averages as text."""
    cores = os.cpu_count() or 0
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
    try:
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "n/a"
    return cores, usable, load


def machine_description() -> str:
    """One line: CPU, cores, kernel, Python, load average at start."""
    cores, usable, load = cores_and_load()
    return (
        f"{cpu_model()}, {cores} cores ({usable} usable), "
        f"{platform.system()} {platform.release()} {platform.machine()}, "
        f"{platform.python_implementation()} {platform.python_version()}, "
        f"load average {load}"
    )


def argument_parser(description: str) -> argparse.ArgumentParser:
    """A parser with the options every benchmark takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--quick", action="store_true",
        help="small sizes and one repetition: a smoke run of a few seconds, not a measurement",
    )
    parser.add_argument(
        "--repeat", type=int, default=None,
        help="repetitions per measurement, the best is kept (default: see the script; 1 with --quick)",
    )
    return parser


def repetitions(args: argparse.Namespace, full: int) -> int:
    if args.repeat is not None:
        return max(1, args.repeat)
    return 1 if args.quick else full


def best_seconds(run: Callable[[], float], repeat: int) -> float:
    """Call ``run`` (which returns the seconds it measured) ``repeat`` times; keep the best.

    The best rather than the mean: on a shared machine, noise only ever adds time.
    """
    return min(run() for _ in range(repeat))


def rate(count: float, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


def format_rate(per_second: float) -> str:
    """``12.3 M/s``-style figure, three significant digits."""
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if per_second >= scale:
            return f"{per_second / scale:.3g} {unit}/s"
    return f"{per_second:.3g} /s"


def format_ratio(ratio: float) -> str:
    return f"{ratio:.2f}x" if ratio < 10 else f"{ratio:.1f}x"


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Print a GitHub-flavoured Markdown table, columns aligned (pastes into RESULTS.md)."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return "| " + " | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) + " |"

    print(line(cells[0]))
    print("| " + " | ".join("-" * width for width in widths) + " |")
    for row in cells[1:]:
        print(line(row))
    print()


def header(title: str, command: str) -> None:
    print(f"# {title}")
    print(f"machine: {machine_description()}")
    print(f"command: {command}")
    print(f"started: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    print()
