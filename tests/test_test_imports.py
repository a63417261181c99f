"""Tests share helpers, not modules: what several test files use lives in
``tests/support/``, and no module under ``tests/`` imports a test module
(``tests/**/test_*.py``), neither a test module, nor a support module, nor
``conftest.py``; nor does a program a test hands to ``python -c``.

Importing a test module from another one runs its module-level code and
makes its helpers part of its interface: a test file could not be split,
renamed or reorganised without breaking others."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
SUPPORT = TESTS / "support"

#: A test module named in a string: imported by a ``python -c`` program, or
#: the whole string is its name (``importlib.import_module``).
TEST_MODULE = r"tests(?:\.\w+)*\.test_\w+"
IMPORT_IN_TEXT = re.compile(rf"\b(?:from|import)\s+({TEST_MODULE})")
NAME_IN_TEXT = re.compile(TEST_MODULE)


def module_name(path: Path) -> str:
    """The dotted name of ``path`` (``tests/model/test_dane.py``: ``tests.model.test_dane``)."""
    parts = list(path.relative_to(TESTS.parent).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def is_test_module(module: str) -> bool:
    """Whether ``module`` names a test module (or something inside one)."""
    parts = module.split(".")
    return parts[0] == "tests" and any(part.startswith("test_") for part in parts[1:])


def imports_of_test_modules(path: Path) -> list[tuple[int, str]]:
    """Each import of a test module in ``path`` as (line, module), at any
    depth of its code (a function's import counts), relative imports
    resolved, and ``from tests import test_x`` seen as ``tests.test_x``."""
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against the module's package
                package = module_name(path).split(".")
                if path.name != "__init__.py":
                    package.pop()
                package = package[: len(package) - (node.level - 1)]
                base = ".".join(package + ([base] if base else []))
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = IMPORT_IN_TEXT.findall(node.value)
            if NAME_IN_TEXT.fullmatch(node.value):
                names.append(node.value)
        else:
            continue
        if hit := next((name for name in names if is_test_module(name)), None):
            found.append((node.lineno, hit))
    return found


def described(path: Path, imports: list[tuple[int, str]]) -> str:
    where = path.relative_to(TESTS.parent)
    found = "; ".join(f"{where}:{line} imports the test module {module}" for line, module in imports)
    return f"{found} (what test modules share belongs in tests/support/)"


def ids(path: Path) -> str:
    return str(path.relative_to(TESTS))


TEST_FILES = sorted(TESTS.rglob("test_*.py"))
OTHER_FILES = sorted(set(TESTS.rglob("*.py")) - set(TEST_FILES))


@pytest.mark.parametrize("path", TEST_FILES, ids=ids)
def test_no_test_module_imports_another(path: Path) -> None:
    imports = imports_of_test_modules(path)
    assert not imports, described(path, imports)


@pytest.mark.parametrize("path", OTHER_FILES, ids=ids)
def test_support_and_conftest_import_no_test_module(path: Path) -> None:
    imports = imports_of_test_modules(path)
    assert not imports, described(path, imports)


def test_support_conftest_and_subpackages_are_checked() -> None:
    assert SUPPORT / "notaries.py" in OTHER_FILES and TESTS / "conftest.py" in OTHER_FILES
    assert TESTS / "protocol" / "test_tlog_merkle.py" in TEST_FILES


#: TEST_ stands for test_ (replaced when run), so this file passes its own check.
@pytest.mark.parametrize(("source", "line", "module"), [
    ("from tests.TEST_metrics import value\n", 1, "tests.TEST_metrics"),
    ("import tests.model.TEST_dane as dane\n", 1, "tests.model.TEST_dane"),
    ("from tests import TEST_relay\n", 1, "tests.TEST_relay"),
    ("from tests.protocol import TEST_tlog_merkle\n", 1, "tests.protocol.TEST_tlog_merkle"),
    ("def f():\n    from .TEST_node import run_node\n", 2, "tests.TEST_node"),
    ("from . import TEST_node\n", 1, "tests.TEST_node"),
    ('PROGRAM = "from tests.TEST_metrics import run_worker; run_worker()"\n', 1,
     "tests.TEST_metrics"),
    ('import importlib\nrelay = importlib.import_module("tests.TEST_relay")\n', 2,
     "tests.TEST_relay"),
])
def test_the_checker_sees_each_way_to_import_a_test_module(
    tmp_path: Path, source: str, line: int, module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each form, in a file where ``tests/test_bad.py`` would be, is named
    with its file and line."""
    monkeypatch.setattr(f"{__name__}.TESTS", tmp_path / "tests")
    bad = tmp_path / "tests" / "test_bad.py"
    bad.parent.mkdir()
    bad.write_text(source.replace("TEST_", "test_"))
    module = module.replace("TEST_", "test_")
    imports = imports_of_test_modules(bad)
    assert imports == [(line, module)]
    assert described(bad, imports).startswith(
        f"tests/test_bad.py:{line} imports the test module {module} "
    )


@pytest.mark.parametrize("source", [
    "from tests.support.metrics import value\n",
    "import tests.vectors_path\n",
    "from tests.support import notaries\n",
    'TEXT = "the tests of test_relay import nothing"\n',
])
def test_the_checker_lets_support_imports_pass(tmp_path: Path, source: str) -> None:
    bad = tmp_path / "test_fine.py"
    bad.write_text(source)
    assert imports_of_test_modules(bad) == []
