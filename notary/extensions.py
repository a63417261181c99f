"""Which implementation of a compiled module to use: the Cython build or its
pure-Python twin (``notary._fastcache``, ``notary.protocol._fastrequest``;
each twin behaves the same, and the test suite runs against both).

Chosen at import time, the way aio-libs frozenlist and yarl do:

* ``NOTARY_NO_EXTENSIONS`` set (non-empty, not ``"0"``): the pure twin.
* otherwise the compiled module, falling back to the twin when it cannot be
  imported (not built, built for another Python) ...
* ... unless ``NOTARY_REQUIRE_EXTENSION`` is set (non-empty, not ``"0"``):
  then a failed import raises ``ImportError``. ``make test-compiled`` sets
  it so a silently failed build cannot pass the test suite.

Setting both variables is a contradiction and raises ``ImportError``.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Literal

__all__ = ["NO_EXTENSIONS_ENV", "REQUIRE_EXTENSION_ENV", "Implementation", "load"]

NO_EXTENSIONS_ENV = "NOTARY_NO_EXTENSIONS"
REQUIRE_EXTENSION_ENV = "NOTARY_REQUIRE_EXTENSION"
Implementation = Literal["compiled", "pure"]


def _flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


def load(compiled: str) -> tuple[ModuleType, Implementation]:
    """The module ``compiled`` (a dotted name) or its twin ``compiled + "_py"``,
    by the rules above, and which one it is."""
    if _flag(NO_EXTENSIONS_ENV):
        if _flag(REQUIRE_EXTENSION_ENV):
            raise ImportError(
                f"{NO_EXTENSIONS_ENV} and {REQUIRE_EXTENSION_ENV} are both set: "
                "the compiled modules cannot be both forbidden and required; unset one"
            )
        return importlib.import_module(compiled + "_py"), "pure"
    try:
        return importlib.import_module(compiled), "compiled"
    except ImportError as exc:
        if _flag(REQUIRE_EXTENSION_ENV):
            raise ImportError(
                f"compiled module required but {compiled} failed to import: {exc} "
                f"(build it with `python setup.py build_ext --inplace`, or unset "
                f"{REQUIRE_EXTENSION_ENV})"
            ) from exc
        return importlib.import_module(compiled + "_py"), "pure"
