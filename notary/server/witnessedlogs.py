"""The logs the notary witnesses (docs/log.md "Witnesses"): the vkeys of
``[witness] logs`` and the log key (``BundleLog.key``) of every ``.notary``
bundle named by ``[witness] bundles`` (files, or directories whose
``*.notary`` files are read), each vkey once, read at start and again on
SIGHUP.

What counts as a failure and what is skipped: a bundle file that cannot be
read, is not a bundle, has no ``log`` member, or whose log key clashes
with one already taken (another key with the same name and key id) is
logged (a warning naming the file) and skipped; a configured path that
does not exist, or a directory that cannot be listed, is a
``UsageError`` when ``strict`` (a reload then keeps the set it had) and a
warning otherwise (at start: the notary serves the rest). Only regular
files are read (a FIFO dropped in the directory would block the reading
thread), each up to ``MAX_BUNDLE_BYTES``; at most ``MAX_WITNESSED_LOGS``
keys are taken, the rest skipped with a warning (each witnessed log costs
a cached view, ``notary.server.witness``).

Blocking file reads: at start, or in a worker thread (``Reloader.read``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from notary.errors import UsageError
from notary.protocol import tlog
from notary.protocol.bundle import BUNDLE_SUFFIX, MAX_BUNDLE_BYTES, BundleError, parse_bundle

__all__ = ["MAX_WITNESSED_LOGS", "read_witnessed_logs"]

log = logging.getLogger(__name__)

#: Log keys a witness takes, at most (from the configuration and bundles).
MAX_WITNESSED_LOGS = 1024


def read_witnessed_logs(
    vkeys: Sequence[str], bundles: Sequence[Path], *, strict: bool
) -> tuple[str, ...]:
    """``vkeys`` (valid already: the configuration checked them) then the
    log keys of the bundles found in ``bundles``, in that order, each once;
    see the module docstring for what is skipped and what raises
    ``UsageError``."""
    taken: dict[str, None] = dict.fromkeys(vkeys)
    key_ids = {tlog.parse_verifier_key(vkey)[:2] for vkey in taken}
    for file in _bundle_files(bundles, strict=strict):
        key = _log_key(file)
        if key is None or key in taken:
            continue
        name, key_id, _public = tlog.parse_verifier_key(key)  # the bundle checked it
        if (name, key_id) in key_ids:
            log.warning("witness: skipped bundle %s: another key of log %r has its key id",
                        file, name)
            continue
        if len(taken) >= MAX_WITNESSED_LOGS:
            log.warning("witness: skipped bundle %s: %d logs witnessed already",
                        file, MAX_WITNESSED_LOGS)
            continue
        taken[key] = None
        key_ids.add((name, key_id))
    if not taken:
        log.warning("witness: no log to witness ([witness] logs and bundles): "
                    "every submission is refused")
    return tuple(taken)


def _bundle_files(paths: Sequence[Path], *, strict: bool) -> list[Path]:
    """The files to read: each path itself, or a directory's ``*.notary``
    regular files in name order."""
    files: list[Path] = []
    for path in paths:
        try:
            if not path.is_dir():
                if not path.exists():
                    raise OSError(f"{path} does not exist")
                files.append(path)
                continue
            files += sorted(
                p for p in path.iterdir() if p.name.endswith(BUNDLE_SUFFIX) and p.is_file()
            )
        except OSError as exc:
            message = f"[witness] bundles: cannot read {path}: {exc.strerror or exc}"
            if strict:
                raise UsageError(message) from None
            log.warning("witness: %s; its logs are not witnessed", message)
    return files


def _log_key(file: Path) -> str | None:
    """The log key of the bundle ``file``, or None (logged) when it has none."""
    try:
        if not file.is_file():
            log.warning("witness: skipped bundle %s: not a regular file", file)
            return None
        with file.open("rb") as f:
            data = f.read(MAX_BUNDLE_BYTES + 1)
        bundle = parse_bundle(data)
    except OSError as exc:
        log.warning("witness: skipped bundle %s: %s", file, exc.strerror or exc)
        return None
    except BundleError as exc:
        log.warning("witness: skipped bundle %s: %s", file, exc)
        return None
    if bundle.log is None:
        log.warning("witness: skipped bundle %s: it names no log", file)
        return None
    return bundle.log.key
