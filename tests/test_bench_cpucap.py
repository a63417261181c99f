"""bench/harness/cpucap.py's pure parts: the quota of a share of a core, and a
process's descendants read from /proc (the cgroup itself is made by the
benchmark only, never by a test)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parent.parent / "bench" / "harness" / "cpucap.py"
_SPEC = importlib.util.spec_from_file_location("bench_cpucap", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
cpucap = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(cpucap)  # a module of its own: sys.path untouched


def test_a_share_of_a_core_is_a_quota_per_period() -> None:
    assert cpucap.quota_us(0.5) == cpucap.PERIOD_US // 2
    assert cpucap.quota_us(1.0) == cpucap.PERIOD_US
    assert cpucap.quota_us(0.01) == 1000  # the kernel's smallest useful quota
    for bad in (0, -0.5, 1.5):
        with pytest.raises(ValueError, match="a share of one core"):
            cpucap.quota_us(bad)


def test_descendants_are_read_from_proc() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time; "
         "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); "
         "print(p.pid, flush=True); time.sleep(30)"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout is not None
        grandchild = int(child.stdout.readline())
        found = cpucap.descendants(os.getpid())
        assert found[0] == os.getpid()
        assert child.pid in found and grandchild in found
        assert found.index(child.pid) < found.index(grandchild)  # parents first
    finally:
        for pid in cpucap.descendants(child.pid)[::-1]:
            os.kill(pid, 9)
        child.wait()
