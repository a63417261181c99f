"""The rules a witness applies to an add-checkpoint request (C2SP
tlog-witness), as pure functions: which checkpoint is acceptable, and what
to answer when it is not.

Numbered as the spec orders them; each refusal is a
:class:`WitnessRefusal` carrying its HTTP status:

1. The body is an add-checkpoint body and its note a well-formed signed
   note of a checkpoint: else 400.
2. The checkpoint's origin is a log the witness is configured for: else
   404 (the spec's answer for an unknown origin).
3. A signature by one of that log's keys (key name: the origin) verifies,
   and no signature by one of them fails: else 403.
4. ``old`` is at most the checkpoint's size: else 400.
5. ``old`` is the size of the checkpoint the witness holds for the origin
   (0 when none): else 409, and the answer's body is the held size.
6. A checkpoint of size 0 has the empty tree's root: else 422.
7. The proof shows the checkpoint consistent with the held one (RFC 9162
   2.1.4.2; empty from size 0; equal sizes need equal roots): else 422.

Only then may the witness store the checkpoint as the one it holds (in one
compare-and-swap with the held one, which the caller owns) and cosign it.
With rules 5 and 7 and the swap, a witness never cosigns two checkpoints of
one origin that are not consistent.

Sans-IO: the held checkpoint is an argument; nothing here stores anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from notary.protocol.tlog.checkpoint import Checkpoint, parse_checkpoint
from notary.protocol.tlog.cosignature import (
    AddCheckpoint,
    AddCheckpointError,
    parse_add_checkpoint,
)
from notary.protocol.tlog.errors import CheckpointError, NoteError, ProofError, TlogError
from notary.protocol.tlog.merkle import EMPTY_ROOT, verify_consistency
from notary.protocol.tlog.note import Verify, ed25519_verifier, open_note, parse_verifier_key

__all__ = [
    "NOTHING_HELD",
    "SIZE_CONTENT_TYPE",
    "HeldCheckpoint",
    "WitnessRefusal",
    "check_consistent",
    "open_submission",
    "witnessed_logs",
]

#: The content type of a 409's body (the size the witness holds).
SIZE_CONTENT_TYPE = "text/x.tlog.size"


class WitnessRefusal(TlogError):
    """The witness refuses the request: answer ``status`` with the message
    (for 409, the body is ``held_size`` and a newline)."""

    def __init__(self, status: int, message: str, held_size: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.held_size = held_size


@dataclass(frozen=True, slots=True)
class HeldCheckpoint:
    """What the witness holds for one log: the size and root of the last
    checkpoint it cosigned (and the signed note it was given)."""

    size: int
    root: bytes
    note: str = field(default="", compare=False)


#: What a witness holds for an origin it never cosigned.
NOTHING_HELD = HeldCheckpoint(0, EMPTY_ROOT)


class _AnySignature(Mapping[tuple[str, bytes], Verify]):
    """Verifiers that accept every signature: ``open_note`` then only
    checks a note's form (rule 1 before rule 3)."""

    def __getitem__(self, key: tuple[str, bytes]) -> Verify:
        return lambda message, signature: True

    def __iter__(self) -> Iterator[tuple[str, bytes]]:
        return iter(())

    def __len__(self) -> int:
        return 0


def witnessed_logs(vkeys: Iterable[str]) -> dict[str, dict[tuple[str, bytes], Verify]]:
    """The logs a witness accepts, from their Ed25519 signed-note vkeys
    (``origin+keyid+base64``; the key name is the origin): origin ->
    ``open_note`` verifiers (a log may have several keys). Raises
    :class:`NoteError` for a malformed key or the same key twice."""
    logs: dict[str, dict[tuple[str, bytes], Verify]] = {}
    for vkey in vkeys:
        name, key_id, public_raw = parse_verifier_key(vkey)
        verifiers = logs.setdefault(name, {})
        if (name, key_id) in verifiers:
            raise NoteError(f"the key of log {name!r} is listed twice")
        verifiers[name, key_id] = ed25519_verifier(public_raw)
    return logs


def open_submission(
    body: bytes, logs: Mapping[str, Mapping[tuple[str, bytes], Verify]]
) -> tuple[AddCheckpoint, Checkpoint]:
    """The request and its checkpoint, after rules 1 to 4 and 6; raises
    :class:`WitnessRefusal` (400, 404, 403, 422) otherwise."""
    try:
        request = parse_add_checkpoint(body)
        text, _ = open_note(request.note, _AnySignature())
        checkpoint = parse_checkpoint(text)
    except (AddCheckpointError, NoteError, CheckpointError) as exc:
        raise WitnessRefusal(400, f"malformed request: {exc}") from None
    verifiers = logs.get(checkpoint.origin)
    if verifiers is None:
        raise WitnessRefusal(404, "unknown log")
    try:
        open_note(request.note, verifiers)
    except NoteError:
        raise WitnessRefusal(403, "the checkpoint is not signed by the log's key") from None
    if request.old_size > checkpoint.size:
        raise WitnessRefusal(400, "old size is larger than the checkpoint")
    if checkpoint.size == 0 and checkpoint.root != EMPTY_ROOT:
        raise WitnessRefusal(422, "an empty tree's checkpoint has another root")
    return request, checkpoint


def check_consistent(request: AddCheckpoint, checkpoint: Checkpoint, held: HeldCheckpoint) -> None:
    """Rules 5 and 7 against what the witness ``held``s for the origin
    (:data:`NOTHING_HELD` when nothing); raises :class:`WitnessRefusal`
    (409, 422)."""
    if request.old_size != held.size:
        raise WitnessRefusal(409, "old size is not the witness's", held_size=held.size)
    try:
        verify_consistency(held.size, checkpoint.size, held.root, checkpoint.root, request.proof)
    except ProofError as exc:
        raise WitnessRefusal(422, f"not consistent with the witnessed checkpoint: {exc}") from None
