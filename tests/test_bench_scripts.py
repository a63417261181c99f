"""No benchmark can rot unseen: every script of ``bench/`` (found by a glob,
so a new one is covered without editing this file) answers ``--help`` with
its usage, starting nothing (no run directory made), and imports as a
module; the harness and the command line stay split into modules of at
most ``MAX_LINES`` lines each. What a benchmark measures is not tested
here: nothing here opens a connection or starts a server."""

from __future__ import annotations

import ast
import importlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.bench import bench_on_path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
#: The issue's bound on a module of the split harness and command line.
MAX_LINES = 400
MAIN = re.compile(r"""^if __name__ == ["']__main__["']:""", re.M)


def is_script(path: Path) -> bool:
    """A file run as a program (``if __name__ == "__main__":``), not a library module."""
    return MAIN.search(path.read_text(encoding="utf-8")) is not None


SCRIPTS = sorted(path for path in BENCH.glob("*.py") if is_script(path))
#: Modules under bench/ that are no script (the harness), and the command line.
LIBRARY = sorted(
    [path for path in BENCH.rglob("*.py") if not is_script(path)]
    + list((ROOT / "notary" / "cli").glob("*.py"))
)


def short(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_every_scenario_of_run_py_is_a_script_found_here() -> None:
    """The glob finds what ``bench/run.py`` runs (a script it missed would rot)."""
    tree = ast.parse((BENCH / "run.py").read_text(encoding="utf-8"))
    scenarios = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "SCENARIOS" for t in node.targets)
    )
    assert scenarios, "bench/run.py names no scenario"
    names = {path.name for path in SCRIPTS}
    assert {f"bench_{name}.py" for name in scenarios} <= names
    assert {"run.py", "minimal_server.py"} <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_help_prints_usage_and_starts_nothing(script: Path, tmp_path: Path) -> None:
    env = {**os.environ, "COLUMNS": "100", "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, str(script), "--help"],
        cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: {script.name}"), done.stdout[:300]
    assert "--help" in done.stdout
    assert done.stderr == ""
    # A run makes its directory first (harness.processes.run_benchmark): none was.
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(name="bench_on_path")
def bench_on_path_fixture() -> Iterator[None]:
    """``bench/`` first on ``sys.path`` for the test (``tests.support.bench``)."""
    with bench_on_path():
        yield


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_script_imports_as_a_module(script: Path, bench_on_path: None) -> None:
    module = importlib.import_module(script.stem)
    assert callable(getattr(module, "main", None)), f"{script.name} has no main()"


def test_the_harness_still_offers_every_name_from_its_package(bench_on_path: None) -> None:
    """Scripts written against the one-module harness (``harness.NAME``,
    ``from harness import NAME``) keep working: each name is its module's."""
    harness = importlib.import_module("harness")
    assert harness.__all__
    for name in harness.__all__:
        value = getattr(harness, name)
        home = getattr(value, "__module__", None)
        if home is not None and home.startswith("harness."):
            assert getattr(importlib.import_module(home), name) is value


def test_the_split_modules_stay_packages() -> None:
    """The bound below holds for the harness and the command line only while
    they are packages: a grab-bag module back in their place would escape it."""
    for package in (BENCH / "harness", ROOT / "notary" / "cli"):
        assert (package / "__init__.py").is_file(), short(package)
        assert not package.with_suffix(".py").exists(), short(package.with_suffix(".py"))


@pytest.mark.parametrize("module", LIBRARY, ids=short)
def test_module_is_at_most_max_lines(module: Path) -> None:
    lines = len(module.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{short(module)}: {lines} lines, split it by concern"
