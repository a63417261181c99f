"""The ``notary`` command line as an operator runs it, for tests:
``python -m notary`` in a subprocess with this checkout on its path, its
output captured as text; it is killed after 120 s
(``subprocess.TimeoutExpired``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def python_m_notary(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "notary", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
