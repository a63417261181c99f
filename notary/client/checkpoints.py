"""The client's memory of each notary's log: the largest signed checkpoint
it has verified from it, and the evidence when a notary equivocates.

`notary check --v2` keeps, per notary (its v2 key and its log's origin),
the newest checkpoint it verified (``<directory>/<name>.checkpoint``: the
checkpoint and the notary's own signature line, as verified; other lines
of the note served, which nothing checked, are not kept), at most
:data:`MAX_CHECKPOINT_BYTES`, the bound of the parser that read it. A checkpoint seen later must be consistent with
it: the same root at the same size, or an RFC 9162 consistency proof
between the smaller and the larger tree. A notary that cannot prove it
has shown this client two histories: both signed checkpoints are kept
(``<name>.equivocation-<unix time>/``, ``older.checkpoint`` and
``newer.checkpoint``) as evidence anyone can check with the notary's key.

Resource handling: files are written whole (a new file, created
exclusively under an unpredictable name, renamed over the old one), so a
crash leaves the old checkpoint or the new one, and nothing planted in the
directory is written through; an evidence folder is always a new one.

Error handling: an unreadable or corrupt stored checkpoint is
:class:`CheckpointUnreadable` (a ``UsageError``) naming the file (the
user's own directory is damaged: the client says so rather than trusting a
notary afresh); a file that cannot be written is ``UsageError``. `notary
check` makes either that notary's row (``notary.client.logcheck``).
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from notary.errors import UsageError
from notary.protocol import tlog, v2

__all__ = [
    "CheckpointBook",
    "CheckpointUnreadable",
    "StoredCheckpoint",
    "default_checkpoint_dir",
    "notary_log_key",
]

#: A stored checkpoint, at most, in bytes: the bound the answer's parser
#: puts on an ``inclusion`` checkpoint, so whatever was verified can be
#: kept and read back (one constant both ways).
MAX_CHECKPOINT_BYTES = v2.MAX_CHECKPOINT_BYTES
#: Names tried for a folder of evidence (``-2``, ``-3``... when taken).
MAX_EVIDENCE_FOLDERS = 100


def default_checkpoint_dir() -> Path:
    """``$XDG_CONFIG_HOME/notary/checkpoints`` (``~/.config/notary/checkpoints``)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "notary" / "checkpoints"


def notary_log_key(origin: str, public_raw: bytes) -> str:
    """The file name stem of a notary's log: its origin made file-safe and
    its key's hash (two notaries never share a file, a rotated key starts
    afresh)."""
    slug = re.sub(r"[^A-Za-z0-9.-]+", "_", origin)[:80]
    return f"{slug}-{hashlib.sha256(public_raw).hexdigest()[:16]}"


class CheckpointUnreadable(UsageError):
    """The checkpoint kept for a notary's log (``path``) cannot be read or
    is damaged (``reason``): the user's own file, to be removed."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"stored checkpoint {path} is damaged ({reason}): remove it")
        self.path = path
        self.reason = reason


@dataclass(frozen=True, slots=True)
class StoredCheckpoint:
    checkpoint: tlog.Checkpoint
    note: str


class CheckpointBook:
    """See the module docstring. ``directory`` is made on first write."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def last(self, origin: str, public_raw: bytes) -> StoredCheckpoint | None:
        """The stored checkpoint of that log (verified again with the key)."""
        path = self.directory / f"{notary_log_key(origin, public_raw)}.checkpoint"
        try:
            with path.open("rb") as file:
                data = file.read(MAX_CHECKPOINT_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CheckpointUnreadable(path, exc.strerror or "cannot be read") from None
        try:
            if len(data) > MAX_CHECKPOINT_BYTES:
                raise ValueError(f"larger than {MAX_CHECKPOINT_BYTES} bytes")
            note = data.decode("utf-8")
            checkpoint = v2.verify_checkpoint(note, origin, public_raw)
        except (ValueError, v2.VerificationError) as exc:
            raise CheckpointUnreadable(path, str(exc)) from None
        return StoredCheckpoint(checkpoint, note)

    def remember(self, origin: str, public_raw: bytes, note: str) -> None:
        """Store ``note`` as that log's newest checkpoint: a note as verified
        (``v2.LoggedStatement.note``: the checkpoint and the notary's own
        signature, nothing unchecked), at most :data:`MAX_CHECKPOINT_BYTES`
        (``UsageError`` beyond, nothing written: what is stored can always
        be read back)."""
        path = self.directory / f"{notary_log_key(origin, public_raw)}.checkpoint"
        if len(note.encode("utf-8", "surrogatepass")) > MAX_CHECKPOINT_BYTES:
            raise UsageError(
                f"a checkpoint larger than {MAX_CHECKPOINT_BYTES} bytes is not kept in {path}"
            )
        self._write(path, note)

    def keep_evidence(self, origin: str, public_raw: bytes, older: str, newer: str) -> Path:
        """Keep two signed checkpoints that no consistency proof reconciles;
        return the directory holding them."""
        stem = notary_log_key(origin, public_raw)
        base = f"{stem}.equivocation-{int(time.time())}"
        folder = self._new_folder(base)
        self._write(folder / "older.checkpoint", older)
        self._write(folder / "newer.checkpoint", newer)
        return folder

    def _new_folder(self, base: str) -> Path:
        """A new folder ``base`` (or ``base-N``, the first free name) made
        here, mode 0700: a name already taken, by a symlink too, is never
        used (nothing is written through a link planted at it)."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            for number in range(1, MAX_EVIDENCE_FOLDERS + 1):
                folder = self.directory / (base if number == 1 else f"{base}-{number}")
                try:
                    folder.mkdir(mode=0o700)
                except FileExistsError:
                    continue
                return folder
        except OSError as exc:
            raise UsageError(f"cannot write in {self.directory}: {exc.strerror}") from None
        raise UsageError(f"{self.directory} has {MAX_EVIDENCE_FOLDERS} folders named {base}*")

    def _write(self, path: Path, text: str) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(
                "w", encoding="utf-8", dir=path.parent, delete=False, prefix=".tmp-"
            ) as handle:
                handle.write(text)
            os.replace(handle.name, path)
        except OSError as exc:
            raise UsageError(f"cannot write {path}: {exc.strerror}") from None
