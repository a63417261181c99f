"""docs/architecture.md cannot drift from the code: every module of
``notary/`` is named there, every module it names exists, and every
``module:function`` row of "Where things happen" names a function (or a
method, ``Class.method``) that exists."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
#: A module named in the layer tables: its path in backquotes.
MODULE_PATH = re.compile(r"`(notary/[\w/]+\.(?:py|pyx))`")
#: A row of "Where things happen": ``| step | `module:qualified.name` |``.
ROW = re.compile(r"^\|[^|]+\|\s*`(notary(?:\.\w+)+):([\w.]+)`\s*\|\s*$", re.M)


def package_modules() -> set[str]:
    """Every Python and Cython module of ``notary/``, as a path from the root."""
    found = set()
    for pattern in ("*.py", "*.pyx"):
        found.update(str(p.relative_to(ROOT)) for p in (ROOT / "notary").rglob(pattern))
    return found


def named_modules(text: str) -> set[str]:
    return set(MODULE_PATH.findall(text))


def rows(text: str) -> list[tuple[str, str]]:
    where = text.split("## Where things happen", 1)[1]
    return ROW.findall(where)


def resolve(module: str, qualified: str) -> object:
    """The object ``qualified`` names in ``module`` (AttributeError, or
    ImportError, when it does not exist)."""
    found: object = importlib.import_module(module)
    for part in qualified.split("."):
        found = getattr(found, part)
    return found


def test_every_module_is_named_and_every_named_module_exists() -> None:
    named = named_modules(DOC.read_text())
    modules = package_modules()
    assert sorted(modules - named) == [], "modules missing from docs/architecture.md"
    assert sorted(named - modules) == [], "docs/architecture.md names modules that do not exist"


def test_each_path_has_rows() -> None:
    text = DOC.read_text()
    where = text.split("## Where things happen", 1)[1]
    paths = re.split(r"^### ", where, flags=re.M)[1:]
    assert len(paths) >= 3
    for path in paths:
        title = path.splitlines()[0]
        assert len(ROW.findall(path)) >= 5, f"{title!r} has too few rows"


@pytest.mark.parametrize(("module", "qualified"), rows(DOC.read_text()))
def test_row_names_a_function_that_exists(module: str, qualified: str) -> None:
    found = resolve(module, qualified)
    if isinstance(found, property):
        found = found.fget
    assert inspect.isfunction(found) or inspect.ismethod(found) or inspect.isbuiltin(found), (
        f"{module}:{qualified} is not a function"
    )


def test_the_checks_catch_drift() -> None:
    """The parsers above find what they must, so a renamed function or a
    new module fails the tests rather than passing unseen."""
    sample = (
        "| `notary/model/targets.py` | x |\n"
        "## Where things happen\n### A\n"
        "| step | `notary.model.targets:make_target` |\n"
        "| step | `notary.model.targets:no_such_function` |\n"
    )
    assert named_modules(sample) == {"notary/model/targets.py"}
    assert rows(sample) == [
        ("notary.model.targets", "make_target"), ("notary.model.targets", "no_such_function"),
    ]
    with pytest.raises(AttributeError):
        resolve("notary.model.targets", "no_such_function")
