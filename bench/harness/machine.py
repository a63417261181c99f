"""What ``/proc`` says about the machine and its processes: cores, load,
the busy share of cores (other load), a process's CPU time and memory, a
listener's accept queue. Read-only; a process gone meanwhile reads as empty
where noted, else ``OSError``."""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
import time
from collections.abc import Sequence

CLOCK_TICK = os.sysconf("SC_CLK_TCK")


def proc_fields(path: str) -> dict[str, str]:
    """The ``name: value`` lines of ``path`` (/proc/cpuinfo, meminfo, <pid>/status), {} if gone."""
    with contextlib.suppress(OSError), open(path, encoding="utf-8", errors="replace") as lines:
        pairs = (line.partition(":") for line in lines)
        return {name.strip(): value.strip() for name, _, value in pairs}
    return {}


def cores_and_load() -> tuple[int, int, str]:
    """Cores of the machine, cores this process may run on, load averages."""
    try:
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "n/a"
    return os.cpu_count() or 0, len(os.sched_getaffinity(0)), load


def cpu_and_cores() -> str:
    cores, usable, _ = cores_and_load()
    cpu = proc_fields("/proc/cpuinfo").get("model name") or platform.processor() or "unknown CPU"
    return f"{cpu}, {cores} cores ({usable} usable)"


def choose_cpus(args: argparse.Namespace) -> tuple[int, int]:
    """(server core, client core): ``--server-cpu``/``--client-cpu``, or the first two usable."""
    usable = sorted(os.sched_getaffinity(0))
    server = getattr(args, "server_cpu", None)
    server = usable[0] if server is None else server
    client = getattr(args, "client_cpu", None)
    if client is None:
        client = next((cpu for cpu in usable if cpu != server), server)
    if server == client:
        print(f"warning: one usable core: server and client share CPU {server}", file=sys.stderr)
    return server, client


def cpu_times(cpus: Sequence[int]) -> dict[int, tuple[int, int]]:
    """(busy, total) jiffies of each CPU in ``cpus`` from /proc/stat."""
    times = {}
    with open("/proc/stat", encoding="ascii") as stat:
        for line in stat:
            name, *fields = line.split()
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
                values = [int(v) for v in fields[:8]]
                idle = values[3] + values[4]  # idle + iowait
                times[int(name[3:])] = (sum(values) - idle, sum(values))
    return times


def busy_shares(before: dict[int, tuple[int, int]],
                 after: dict[int, tuple[int, int]]) -> dict[int, float]:
    """The busy share of each CPU between two ``cpu_times``."""
    return {cpu: (after[cpu][0] - before[cpu][0]) / max(1, after[cpu][1] - before[cpu][1])
            for cpu in before if cpu in after}


def busy_cpus(cpus: Sequence[int], seconds: float = 1.0) -> dict[int, float]:
    """Share of each CPU in ``cpus`` busy over ``seconds`` ({} if unreadable)."""
    try:
        before = cpu_times(cpus)
        time.sleep(seconds)
        return busy_shares(before, cpu_times(cpus))
    except OSError:
        return {}


def describe_busy(cpus: Sequence[int], when: str) -> str:
    busy = busy_cpus(cpus)
    text = ", ".join(f"CPU {cpu} {share:.0%}" for cpu, share in sorted(busy.items()))
    line = f"other load {when}: {text or 'n/a'} busy over 1 s"
    if any(share > 0.10 for share in busy.values()):
        line += "  WARNING: the machine is busy; figures are not comparable with a quiet run"
    return line


def wait_quiet(cpus: Sequence[int], timeout_s: float) -> None:
    """Wait (at most ``timeout_s``) until ``cpus`` are < 10% busy for 3 s in a row."""
    deadline = time.monotonic() + timeout_s
    quiet = 0
    while quiet < 3 and time.monotonic() < deadline:
        busy = busy_cpus(cpus)
        quiet = quiet + 1 if busy and max(busy.values()) < 0.10 else 0
    if quiet < 3:
        print(f"warning: CPUs {list(cpus)} still busy after {timeout_s:.0f} s; going on",
              file=sys.stderr)


def machine_busy_seconds() -> float:
    """Busy CPU seconds of every core since boot (/proc/stat)."""
    return sum(busy for busy, _ in cpu_times(range(os.cpu_count() or 1)).values()) / CLOCK_TICK


def proc_stat(pid: int) -> list[str]:
    """``/proc/<pid>/stat`` after the command name: [0] state, [1] parent,
    [2] process group, [11] utime, [12] stime, [13] cutime, [14] cstime."""
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
        return stat.read().rsplit(")", 1)[1].split()


def all_proc_stats() -> dict[int, list[str]]:
    """``proc_stat`` of every process now (those gone meanwhile left out)."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError):
                found[int(entry)] = proc_stat(int(entry))
    return found


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all its threads) so far."""
    fields = proc_stat(pid)
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICK


def proc_status(pid: int) -> dict[str, int]:
    """``VmRSS``, ``VmHWM``, ``RssAnon``, ... of ``pid`` in bytes (empty if gone)."""
    return {name: int(value.split()[0]) * 1024
            for name, value in proc_fields(f"/proc/{pid}/status").items() if value.endswith(" kB")}


def listen_queue(port: int) -> int | None:
    """The accept queue of the listener on ``port`` (/proc/net/tcp: no connection), or None."""
    with open("/proc/net/tcp", encoding="ascii") as table:
        for line in table:
            fields = line.split()
            if (len(fields) > 4 and fields[1] in (f"0100007F:{port:04X}", f"00000000:{port:04X}")
                    and fields[3] == "0A"):
                return int(fields[4].split(":")[1], 16)
    return None
