"""What a benchmark prints: the head of a report (machine, versions,
command, start time, commit) and its Markdown tables and figures."""

from __future__ import annotations

import platform
import shlex
import ssl
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from .machine import cores_and_load, cpu_and_cores, proc_fields
from .project import ROOT
from .tools import wrk_version


def header(title: str, command: str) -> None:
    """The micro-benchmarks' head: title, machine, command, start time."""
    print(f"# {title}\nmachine: {cpu_and_cores()}, "
          f"{platform.system()} {platform.release()} {platform.machine()}, "
          f"{platform.python_implementation()} {platform.python_version()}, "
          f"load average {cores_and_load()[2]}\ncommand: {command}")
    print(f"started: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n")


def notary_version() -> str:
    """The commit measured, and whether notary/ has uncommitted changes (read-only git)."""
    def git(*argv: str) -> str:
        return subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True,
                              check=True, timeout=10).stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--", "notary")
    except (OSError, subprocess.SubprocessError):
        return "notary (not a git checkout)"
    return f"notary at {commit}" + (" + uncommitted changes in notary/" if dirty else "")


def print_preamble(title: str, wrk: str | None, note: str = "") -> None:
    """The head of every load report: title, machine (with the versions of
    wrk, trio, httptools, OpenSSL and the notary's cache), command, start, commit."""
    import httptools
    import trio

    from notary.protocol.hotpath import IMPLEMENTATION as REQUEST_PATH
    from notary.server.tlsdriver import IMPLEMENTATION as TLS_DRIVER
    from notary.state.cache import IMPLEMENTATION

    memory = proc_fields("/proc/meminfo").get("MemTotal")
    print(
        f"# {title}\nmachine: {cpu_and_cores()}, "
        + (f"{int(memory.split()[0]) / 1024 / 1024:.1f} GiB RAM; " if memory else "RAM n/a; ")
        + f"{platform.python_implementation()} {platform.python_version()}; "
        f"{platform.system()} {platform.release()} {platform.machine()}; "
        + (f"{wrk_version(wrk)}; " if wrk else "")
        + f"trio {trio.__version__}, httptools {httptools.__version__}, {ssl.OPENSSL_VERSION}, "
        f"notary cache {IMPLEMENTATION}, request path {REQUEST_PATH}, TLS driver {TLS_DRIVER}; "
        f"load average {cores_and_load()[2]}")
    print(f"command: {shlex.join([Path(sys.executable).name, *sys.argv])}")
    print(f"started: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; {notary_version()}{note}")


def short_path(filename: str) -> str:
    """A source file's path for a profile table: from the package or ``ROOT``."""
    for marker in ("/site-packages/", str(ROOT) + "/"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    if filename.startswith("~"):
        return "builtin"
    return filename.rsplit("/lib/python", 1)[-1]


def format_us(us: float | None) -> str:
    """Latency for a table: ``850 us``, ``12.3 ms``."""
    if us is None:
        return "?"
    if us < 1000:
        return f"{us:.0f} us"
    return f"{us / 1000:.1f} ms" if us < 100_000 else f"{us / 1000:.0f} ms"


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
    cells.insert(1, ["-" * width for width in widths])
    for row in cells:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
    print()
