"""The compiled modules and their pure-Python twins, for tests that run
against both in one run (``notary.extensions``): ``twin(kind, name)`` gives
the module, skipping the compiled one when it is not built, except under
``NOTARY_REQUIRE_EXTENSION=1`` (``make test-compiled``), where a missing
build fails instead."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

#: The parameter values of a test run against both twins.
KINDS = ("pure", "compiled")


def require_extension() -> bool:
    return os.environ.get("NOTARY_REQUIRE_EXTENSION", "") not in ("", "0")


def twin(kind: str, name: str) -> ModuleType:
    """The module ``name`` (dotted, compiled) when ``kind`` is
    ``"compiled"``, else its twin ``name + "_py"``."""
    if kind == "pure":
        return importlib.import_module(name + "_py")
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        reason = f"{name} is not built ({exc}): `python setup.py build_ext --inplace`"
        if require_extension():
            pytest.fail(f"NOTARY_REQUIRE_EXTENSION=1 but {reason}")
        pytest.skip(reason)
