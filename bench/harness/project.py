"""What every part of the harness shares: the checkout it measures (``ROOT``,
put on ``sys.path`` on import, so the scripts import ``notary`` from it; the
environment that makes every child import it too) and ``BenchError``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


class BenchError(Exception):
    """The benchmark cannot give a valid figure: say why and stop."""


def project_env() -> dict[str, str]:
    """Every subprocess's environment: the notary imported from this checkout first."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env
