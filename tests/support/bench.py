"""``bench/`` scripts imported as modules by tests: ``bench_on_path()``
puts ``bench/`` first on ``sys.path``, as when a script runs, and afterwards
restores it and forgets the modules imported from ``bench/``."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


@contextmanager
def bench_on_path() -> Iterator[None]:
    before = set(sys.modules)
    sys.path.insert(0, str(BENCH))
    try:
        yield
    finally:
        sys.path.remove(str(BENCH))
        for name in set(sys.modules) - before:
            if str(getattr(sys.modules[name], "__file__", None) or "").startswith(str(BENCH)):
                del sys.modules[name]
