"""The shape of notary.protocol.tlog: sans-IO imports only, every public
name re-exported, errors in one hierarchy."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import notary.protocol.tlog as tlog
from notary.errors import NotaryError

PACKAGE = Path(tlog.__file__).parent

#: What the package may import: hashing, text, data classes, Ed25519, and
#: itself. No trio, socket, time, os, random: no I/O, no clock.
ALLOWED_IMPORTS = {
    "__future__",
    "base64",
    "binascii",
    "collections",
    "collections.abc",
    "dataclasses",
    "hashlib",
    "re",
    "cryptography.exceptions",
    "cryptography.hazmat.primitives.asymmetric.ed25519",
    "notary.errors",
}


def test_modules_import_nothing_that_does_io() -> None:
    for path in PACKAGE.glob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name in ALLOWED_IMPORTS or name.startswith("notary.protocol.tlog"), (
                    f"{path.name} imports {name}"
                )


def test_every_public_name_is_exported() -> None:
    assert sorted(tlog.__all__) == sorted(set(tlog.__all__))
    for name in tlog.__all__:
        assert hasattr(tlog, name), name
    for module in (tlog.merkle, tlog.tiles, tlog.note, tlog.checkpoint, tlog.errors):
        for name, value in vars(module).items():
            if name.startswith("_") or inspect.ismodule(value):
                continue
            if getattr(value, "__module__", module.__name__) == module.__name__ and (
                inspect.isfunction(value) or inspect.isclass(value)
            ):
                assert name in tlog.__all__, f"{module.__name__}.{name} is not exported"


def test_the_agreed_signatures() -> None:
    expected = {
        "leaf_hash": ["entry"],
        "node_hash": ["left", "right"],
        "range_hash": ["start", "end", "perfect"],
        "root_hash": ["size", "perfect"],
        "inclusion_proof": ["index", "size", "perfect"],
        "consistency_proof": ["old_size", "new_size", "perfect"],
        "verify_inclusion": ["leaf", "index", "size", "proof", "root"],
        "verify_consistency": ["old_size", "new_size", "old_root", "new_root", "proof"],
        "tile_path": ["level", "index", "width"],
        "entries_path": ["index", "width"],
        "parse_tile_path": ["path"],
        "tile_count": ["size", "level"],
        "tile_hashes": ["level", "index", "width", "perfect"],
        "encode_entry_bundle": ["entries"],
        "decode_entry_bundle": ["data", "width"],
        "ed25519_key_id": ["name", "public_raw"],
        "verifier_key": ["name", "public_raw"],
        "parse_verifier_key": ["text"],
        "sign_note": ["text", "name", "sign", "public_raw"],
        "open_note": ["note", "verifiers"],
        "ed25519_verifier": ["public_raw"],
        "format_checkpoint": ["checkpoint"],
        "parse_checkpoint": ["text"],
    }
    for name, parameters in expected.items():
        assert list(inspect.signature(getattr(tlog, name)).parameters) == parameters, name
    assert list(inspect.signature(tlog.TileHashReader).parameters)[:2] == ["size", "read_tile"]
    assert [f.name for f in tlog.Checkpoint.__dataclass_fields__.values()] == [
        "origin",
        "size",
        "root",
        "extensions",
    ]


def test_errors_form_one_hierarchy() -> None:
    for error in (tlog.ProofError, tlog.NoteError, tlog.CheckpointError, tlog.TileError):
        assert issubclass(error, tlog.TlogError)
    assert issubclass(tlog.TlogError, ValueError)
    assert issubclass(tlog.TlogError, NotaryError)
