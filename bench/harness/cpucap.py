"""A server held to a share of one core (a cgroup CPU quota), so that a benchmark
measures it at saturation on a machine whose client would otherwise be the limit.

On two cores, one for the server and one for the load generator, a fast server
(nginx) handshakes faster than one core of clients can ask: the client is the
limit, the server idles between requests, and a server that is not saturated
spends more CPU per request than one that is (issue 35). Capping every server
of a comparison to the same share of its core (``cpu.cfs_quota_us``, cgroup v1,
or ``cpu.max``, cgroup v2) makes each one the limit: the client keeps a whole
core, each server's rate is what its share allows, and the rates compare the
servers at saturation.

``CpuCap(share, name)`` makes a cgroup of its own under the CPU hierarchy;
``add(pid)`` moves a process and its descendants into it; ``close()`` moves
them back to the parent group and removes it. ``unavailable()`` says why a
cap cannot be made here (no writable CPU controller: not root, a read-only
cgroup file system), so a benchmark can say so plainly and run uncapped.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["PERIOD_US", "CpuCap", "descendants", "quota_us", "unavailable"]

#: The quota's period: short enough that a throttled server does not stall
#: its clients for long, long enough for the kernel to account it well.
PERIOD_US = 20_000
_V1 = Path("/sys/fs/cgroup/cpu")
_V2 = (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))


def quota_us(share: float, period_us: int = PERIOD_US) -> int:
    """The quota of ``share`` (0 < share <= 1) of one core per ``period_us``."""
    if not 0 < share <= 1:
        raise ValueError("a share of one core: above 0, at most 1")
    return max(1000, round(share * period_us))


def _hierarchy() -> tuple[Path, str] | None:
    """(the CPU hierarchy's root, "v1" or "v2") that can be written here, or None."""
    if (_V1 / "cpu.cfs_quota_us").exists() and os.access(_V1, os.W_OK):
        return _V1, "v1"
    for root in _V2:
        controllers = root / "cgroup.controllers"
        if controllers.exists() and "cpu" in controllers.read_text().split() \
                and os.access(root, os.W_OK):
            return root, "v2"
    return None


def unavailable() -> str | None:
    """Why no cap can be made here (None: one can)."""
    if _hierarchy() is None:
        return ("no writable cgroup CPU controller (needs root and /sys/fs/cgroup/cpu or a "
                "cgroup v2 hierarchy with the cpu controller)")
    return None


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (read from /proc), parents first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            parent = int(stat[stat.rindex(")") + 2:].split()[1])
            children.setdefault(parent, []).append(int(entry))
    found, queue = [], [pid]
    while queue:
        current = queue.pop(0)
        found.append(current)
        queue.extend(children.get(current, []))
    return found


class CpuCap:
    """See the module docstring. Owns its cgroup until ``close()``; OSError
    when it cannot be made (check ``unavailable()`` first)."""

    def __init__(self, share: float, name: str) -> None:
        found = _hierarchy()
        if found is None:
            raise OSError(unavailable())
        self.root, self.version = found
        self.share = share
        self.path = self.root / f"notary-bench-{os.getpid()}-{name}"
        self.path.mkdir(exist_ok=True)
        quota = quota_us(share)
        if self.version == "v1":
            (self.path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (self.path / "cpu.max").write_text(f"{quota} {PERIOD_US}")

    def add(self, pid: int) -> None:
        """Move ``pid`` and its descendants into the group."""
        for member in descendants(pid):
            with contextlib.suppress(ProcessLookupError, FileNotFoundError):
                (self.path / "cgroup.procs").write_text(str(member))

    def close(self) -> None:
        """Move what is left back to the root group; remove the group."""
        with contextlib.suppress(OSError):
            for member in (self.path / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (self.root / "cgroup.procs").write_text(member)
        with contextlib.suppress(OSError):
            self.path.rmdir()
