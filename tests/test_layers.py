"""The folders of ``notary/`` are layers, and imports only point inwards
(see docs/architecture.md, "Layers"): a layer imports the layers
listed for it and nothing else; only the layers that do I/O import Trio;
nothing imports the command line."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "notary"

#: Each layer and the layers it may import ("base": ``notary`` itself and
#: ``notary.errors``). Inner layers first.
ALLOWED = {
    "base": {"base"},
    "model": {"base", "model"},
    "protocol": {"base", "model", "protocol"},
    "web": {"base", "model", "protocol", "web"},
    "state": {"base", "model", "protocol", "state"},
    "config": {"base", "model", "protocol", "state", "config"},
    "logs": {"base", "logs"},
    "outbound": {"base", "config", "logs", "model", "protocol", "state", "outbound"},
    "service": {
        "base", "config", "logs", "model", "protocol", "state", "outbound", "service",
    },
    "server": {
        "base", "config", "logs", "model", "protocol", "web", "state", "outbound",
        "service", "server",
    },
    "node": {
        "base", "config", "logs", "model", "protocol", "state", "outbound", "service",
        "server", "node",
    },
    "client": {"base", "config", "logs", "model", "protocol", "state", "outbound", "client"},
    "cli": {
        "base", "config", "logs", "model", "protocol", "web", "state", "outbound",
        "service", "server", "node", "client", "cli",
    },
}
#: The layers that may import Trio (and trio-websocket): they do I/O.
TRIO_LAYERS = {"outbound", "service", "server", "node", "client", "cli"}
PYX_IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+c?import|c?import\s+([\w.]+))", re.M)
#: The modules and packages at the top of ``notary/``; the compiled cache and
#: its twin sit there (the design card's place) but are state (``state.cache``
#: picks one).
TOP_LEVEL = {"__init__": "base", "__main__": "cli", "errors": "base", "extensions": "base",
             "_fastcache": "state", "_fastcache_py": "state",
             "config": "config",
             "logs": "logs", "cli": "cli"}


def layer_of(module: str) -> str:
    """The layer of the dotted ``module`` (``notary.model.targets``: model)."""
    parts = module.split(".")
    assert parts[0] == "notary", module
    if len(parts) == 1:
        return "base"
    head = parts[1]
    if head in TOP_LEVEL:
        return TOP_LEVEL[head]
    assert head in ALLOWED, f"{module}: a folder with no layer in ALLOWED"
    return head


def module_name(path: Path) -> str:
    relative = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth of its code (a function's
    import counts as the module's)."""
    text = path.read_text()
    if path.suffix == ".pyx":  # Cython: read its Python-level imports by line
        return {
            match.group(1) or match.group(2)
            for match in PYX_IMPORT.finditer(text)
        }
    tree = ast.parse(text, str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: resolved against the module's package
                package = module_name(path).split(".")
                if path.name != "__init__.py":
                    package.pop()
                package = package[: len(package) - (node.level - 1)]
                module = ".".join(package + ([module] if module else []))
            found.add(module)
            if module == "notary" or module.startswith("notary."):
                # ``from notary.model import targets`` imports notary.model.targets
                found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def sources() -> list[Path]:
    return sorted([*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.pyx")])


def existing(module: str) -> bool:
    base = PACKAGE.parent / Path(*module.split("."))
    return base.with_suffix(".py").exists() or base.with_suffix(".pyx").exists() or (
        base / "__init__.py"
    ).exists()


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_inwards(path: Path) -> None:
    importer = layer_of(module_name(path))
    wrong = sorted(
        f"{module} ({layer_of(module)})"
        for module in imports_of(path)
        if module.startswith("notary") and existing(module)
        and layer_of(module) not in ALLOWED[importer]
    )
    assert not wrong, f"{module_name(path)} ({importer}) imports {', '.join(wrong)}"


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_only_the_io_layers_import_trio(path: Path) -> None:
    importer = layer_of(module_name(path))
    trio_imports = {
        m for m in imports_of(path) if m.split(".")[0] in ("trio", "trio_websocket")
    }
    if importer not in TRIO_LAYERS:
        assert not trio_imports, f"{module_name(path)} ({importer}) imports {trio_imports}"


def test_nothing_imports_the_command_line() -> None:
    """Only the command line itself (``notary/cli/`` and ``__main__``)
    imports ``notary.cli`` or any of its modules."""
    importers = [
        module_name(path) for path in sources()
        if layer_of(module_name(path)) != "cli"
        and any(m == "notary.cli" or m.startswith("notary.cli.") for m in imports_of(path))
    ]
    assert importers == []


def test_a_model_module_importing_a_server_would_be_caught(tmp_path: Path) -> None:
    """The checker itself: a function-level ``from ... import`` of an outer
    layer, and a Trio import, are both seen in an inner module."""
    module = tmp_path / "bad.py"
    module.write_text(
        "import trio\n\ndef f():\n    from notary.server import app\n    return app\n"
    )
    found = imports_of(module)
    assert "notary.server.app" in found and "trio" in found
    assert layer_of("notary.server.app") not in ALLOWED[layer_of("notary.model.targets")]
    assert layer_of("notary.model.targets") not in TRIO_LAYERS
