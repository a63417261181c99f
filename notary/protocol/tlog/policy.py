"""A client's witness policy (docs/log.md "Witnesses"): which witnesses it
trusts, and how many of them must have cosigned a log's checkpoint before
it accepts the checkpoint.

A checkpoint's signed note carries the log's signature and, as more
signature lines, the witnesses' cosignatures (C2SP tlog-cosignature).
:meth:`WitnessPolicy.judge` looks at each line on its own:

* a line of a key the policy does not trust is ignored (counted, never
  an error: anyone may add lines to a note);
* a line of a trusted key that does not verify over the checkpoint, or is
  dated more than :data:`MAX_AHEAD_S` after the client's clock, is
  *refused*: not counted, and named in the judgement;
* each trusted witness counts once, however many valid lines it has.

The checkpoint is *witnessed* when at least ``minimum`` trusted witnesses
count. Bounds are the note's (``MAX_NOTE_BYTES``,
``MAX_NOTE_SIGNATURES``): a note beyond them is malformed.

Sans-IO: time is an argument. Error handling: a malformed note or key is
``NoteError``; a policy asking more witnesses than it trusts is
``ValueError``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from notary.protocol.tlog.cosignature import (
    cosignature_verifier,
    parse_cosignature_line,
    parse_cosigner_key,
)
from notary.protocol.tlog.errors import NoteError
from notary.protocol.tlog.note import MAX_NOTE_SIGNATURES, open_note

__all__ = ["MAX_AHEAD_S", "WitnessPolicy", "Witnessing"]

#: How far after the client's clock a cosignature may be dated (clock skew).
MAX_AHEAD_S = 600


@dataclass(frozen=True, slots=True)
class Witnessing:
    """What a policy found on a note: the trusted witnesses whose
    cosignatures verified (``cosigned``, each once, in note order), those
    whose lines were refused and why (``refused``), how many lines of other
    keys were ignored, and how many the policy asks (``minimum``)."""

    cosigned: tuple[str, ...]
    refused: tuple[tuple[str, str], ...]
    ignored: int
    minimum: int

    @property
    def witnessed(self) -> bool:
        return len(self.cosigned) >= self.minimum

    def describe(self) -> str:
        """A few words for a report: ``cosigned by 2 of the 2 witnesses
        required (w1, w2)``, with what was refused."""
        names = f" ({', '.join(self.cosigned)})" if self.cosigned else ""
        words = f"cosigned by {len(self.cosigned)} of the {self.minimum} witnesses required{names}"
        if self.refused:
            words += "; refused: " + ", ".join(f"{name} ({why})" for name, why in self.refused)
        return words


@dataclass(frozen=True, slots=True)
class WitnessPolicy:
    """See the module docstring. ``witnesses``: cosigner vkeys (type 0x04);
    ``minimum``: how many of them must cosign (0: none required)."""

    witnesses: tuple[str, ...]
    minimum: int

    def __post_init__(self) -> None:
        if len(set(self.witnesses)) != len(self.witnesses):
            raise ValueError("a witness key is listed twice")
        if not 0 <= self.minimum <= len(self.witnesses):
            raise ValueError(
                f"{self.minimum} witnesses required, {len(self.witnesses)} trusted"
            )
        for vkey in self.witnesses:
            parse_cosigner_key(vkey)  # NoteError for a malformed key

    @property
    def required(self) -> bool:
        return self.minimum > 0

    @staticmethod
    def of(witnesses: Iterable[str], minimum: int) -> WitnessPolicy:
        return WitnessPolicy(tuple(witnesses), minimum)

    def judge(self, note: str, *, now: int) -> Witnessing:
        """What this policy finds on ``note`` (a checkpoint's signed note,
        whatever else signed it). ``NoteError`` for a malformed note."""
        split = note.rfind("\n\n")
        if split < 0:
            raise NoteError("note has no empty line before its signatures")
        text, block = note[: split + 1], note[split + 2:]
        lines = block[:-1].split("\n") if block.endswith("\n") else None
        if lines is None or len(lines) > MAX_NOTE_SIGNATURES:
            raise NoteError("malformed signature lines")
        keys: dict[tuple[str, bytes], bytes] = {}
        for vkey in self.witnesses:
            name, key_id, public_raw = parse_cosigner_key(vkey)
            keys[name, key_id] = public_raw
        cosigned: list[str] = []
        refused: list[tuple[str, str]] = []
        ignored = 0
        for line in lines:
            try:
                cosignature = parse_cosignature_line(line)
            except NoteError:
                ignored += 1  # another type of signature: the log's own, or unknown
                continue
            trusted = keys.get((cosignature.name, cosignature.key_id))
            if trusted is None:
                ignored += 1
                continue
            if cosignature.timestamp > now + MAX_AHEAD_S:
                refused.append((cosignature.name, f"dated {cosignature.timestamp}, in the future"))
                continue
            verifier = {(cosignature.name, cosignature.key_id): cosignature_verifier(trusted)}
            try:
                open_note(text + "\n" + line + "\n", verifier)
            except NoteError:
                refused.append((cosignature.name, "invalid cosignature"))
                continue
            if cosignature.name not in cosigned:
                cosigned.append(cosignature.name)
        return Witnessing(tuple(cosigned), tuple(refused), ignored, self.minimum)
