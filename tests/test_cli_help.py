"""The shape of the ``notary`` command line: every command and subcommand
the parser offers is the expected one, in the order ``--help`` lists them,
and each one's ``--help`` renders (usage, its options, its subcommands)
through ``main`` and through ``python -m notary``. Help texts themselves are
not pinned here; what a command does is tests/test_cli.py's."""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from notary import cli

REPO = Path(__file__).resolve().parents[1]

#: Every command path, in the order a depth-first walk of the parser (each
#: parent's subcommands in their ``--help`` order) meets them.
EXPECTED = [
    (),
    ("keygen",),
    ("bundle",),
    ("bundle", "show"),
    ("bundle", "fetch"),
    ("bundle", "list"),
    ("bundle", "remove"),
    ("check",),
    ("db",),
    ("serve",),
    ("watch",),
    ("log",),
    ("log", "verify"),
    ("log", "watch"),
    ("perspectives-entry",),
    ("keys",),
    ("dev-init",),
]


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """``parser``'s subcommands by name, in their ``--help`` order."""
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for name, sub in subcommands(parser).items():
        yield from walk(sub, (*path, name))


TREE = dict(walk(cli.build_parser()))


def test_the_commands_are_the_expected_ones_in_order() -> None:
    assert list(TREE) == EXPECTED


@pytest.mark.parametrize("path", EXPECTED, ids=lambda p: " ".join(p) or "notary")
def test_every_command_help_renders(
    path: tuple[str, ...], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*path, "--help"])
    out, err = capsys.readouterr()
    assert exit_info.value.code == 0
    assert err == ""
    assert out.startswith(f"usage: {' '.join(('notary', *path))} ")
    parser = TREE[path]
    for action in parser._actions:
        for option in action.option_strings:
            assert option in out, f"{option} missing from {path} --help"
        if not action.option_strings:  # a positional argument, or the subcommands
            shown = action.metavar or (
                "{" + ",".join(action.choices) + "}" if action.choices else action.dest
            )
            assert shown in out, f"{shown} missing from {path} --help"
    for name in subcommands(parser):
        assert f"    {name}" in out, f"{name} missing from {path} --help"
    assert out == parser.format_help()


def test_python_m_notary_prints_the_same_help(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    done = subprocess.run(
        [sys.executable, "-m", "notary", "log", "verify", "--help"],
        capture_output=True, text=True, timeout=60, check=False,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == TREE[("log", "verify")].format_help()


def test_the_console_script_runs_cli_main() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, name = scripts["notary"].partition(":")
    assert getattr(importlib.import_module(module), name) is cli.main
