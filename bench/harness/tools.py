"""The outside programs the benchmarks drive (wrk, nginx, openssl, socat):
found on ``PATH`` (or ``/usr/sbin``), installed by ``.ci/install-tools bench``
when missing; ``BenchError`` if still missing."""

from __future__ import annotations

import os
import shutil
import subprocess

from .project import ROOT, BenchError

INSTALL_TOOLS = ROOT / ".ci" / "install-tools"


def ensure_tool(command: str) -> str:
    """The path of ``command``, first installing the bench tools if it is missing."""
    search = os.pathsep.join([os.environ.get("PATH", os.defpath), "/usr/sbin"])
    found = shutil.which(command, path=search)
    if found is None:
        print(f"{command} not found: running {INSTALL_TOOLS.relative_to(ROOT)} bench", flush=True)
        try:
            status: object = subprocess.run(["bash", str(INSTALL_TOOLS), "bench"],
                                            check=False).returncode
        except OSError as exc:
            status = f"not run: {exc}"
        found = shutil.which(command, path=search)
        if found is None:
            raise BenchError(f"{command} is not available after `{INSTALL_TOOLS} bench` (exit "
                             f"{status}); install it (the Debian packages are listed in that "
                             "script) and run again")
    return found


def ensure_wrk() -> str:
    return ensure_tool("wrk")


def wrk_version(wrk: str) -> str:
    result = subprocess.run([wrk, "-v"], capture_output=True, text=True, check=False)
    text = (result.stdout + result.stderr).strip()
    first = text.splitlines()[0] if text else "wrk (unknown version)"
    return first.split(" Copyright")[0].strip()
