"""A logged statement's proof of inclusion in the notary's transparency log
(docs/v2.md, rule S7), as the server writes it into an answer document.

The log's entry of a statement is its answer-document entry as signed,
``{"signature":...,"statement":...}`` (``SignedStatement.entry``); once
the log has sequenced it, the answer's entry gains an ``inclusion`` member:
the entry's index, its RFC 9162 inclusion proof, and the signed checkpoint
(C2SP tlog-checkpoint, signed-note) the proof leads to.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass

from notary.protocol import tlog
from notary.protocol.v2.canonical import canonical_json
from notary.protocol.v2.parsing import ParsedStatement
from notary.protocol.v2.verification import VerificationError

__all__ = [
    "LoggedStatement",
    "inclusion_item",
    "open_checkpoint_note",
    "verify_checkpoint",
    "verify_logged",
]

_ENTRY_START = b'{"signature":'


def inclusion_item(entry: bytes, *, index: int, proof: Sequence[bytes], checkpoint: str) -> bytes:
    """``entry`` (a ``SignedStatement.entry``) with its ``inclusion`` member,
    canonical like the rest of the document (the members' keys sorted:
    ``inclusion`` comes first). Raises ``ValueError`` for an entry of
    another shape."""
    if not entry.startswith(_ENTRY_START):
        raise ValueError("not a statement entry")
    inclusion = canonical_json({
        "checkpoint": checkpoint,
        "index": index,
        "proof": [base64.b64encode(node).decode("ascii") for node in proof],
    })
    return b'{"inclusion":%s,%s' % (inclusion, entry[1:])


@dataclass(frozen=True, slots=True)
class LoggedStatement:
    """What a verified statement's log member came to: the checkpoint whose
    tree includes it and its signed note as verified (the checkpoint and
    the key's own signature lines: what a client may keep), or None while
    the promise stands (``merge_by`` not passed)."""

    checkpoint: tlog.Checkpoint | None
    note: str | None
    index: int | None


def verify_logged(
    statement: ParsedStatement, public_raw: bytes, *, now: int
) -> LoggedStatement | None:
    """Check a statement's log member (rule S7) with the notary's v2 key
    ``public_raw`` (which signs its checkpoints, key name = the origin):
    its inclusion proof leads to a checkpoint of the promised log that the
    key signed; without a proof, ``merge_by`` has not passed. None for a
    statement without a log member (the notary keeps no log).

    Error handling: ``VerificationError`` naming what failed (a checkpoint
    not signed by the key or of another log, a proof that does not lead to
    its root, an inclusion without a promise, a promise broken)."""
    promise, inclusion = statement.log, statement.inclusion
    if promise is None:
        if inclusion is not None:
            raise VerificationError("an inclusion proof for a statement that promises no log")
        return None
    if inclusion is None:
        if now > promise.merge_by:
            raise VerificationError(
                f"the log's promise is broken: the statement was due in {promise.origin!r} "
                f"by {promise.merge_by}"
            )
        return LoggedStatement(None, None, None)
    checkpoint, note = open_checkpoint_note(inclusion.checkpoint, promise.origin, public_raw)
    try:
        tlog.verify_inclusion(
            tlog.leaf_hash(statement.entry_bytes), inclusion.index, checkpoint.size,
            inclusion.proof, checkpoint.root,
        )
    except tlog.ProofError as exc:
        raise VerificationError(f"the inclusion proof fails: {exc}") from None
    return LoggedStatement(checkpoint, note, inclusion.index)


def verify_checkpoint(note: str, origin: str, public_raw: bytes) -> tlog.Checkpoint:
    """The checkpoint of the signed note ``note``, signed by ``public_raw``
    under the key name ``origin`` and naming ``origin``.
    ``VerificationError`` otherwise."""
    return open_checkpoint_note(note, origin, public_raw)[0]


def open_checkpoint_note(
    note: str | bytes, origin: str, public_raw: bytes
) -> tuple[tlog.Checkpoint, str]:
    """:func:`verify_checkpoint`, and the note reduced to what was verified:
    the checkpoint text and the signature lines of ``public_raw`` under
    ``origin`` (other signature lines, cosignatures or anything else, are
    left out: nothing checked them). ``VerificationError`` as
    :func:`verify_checkpoint`."""
    try:
        key = (origin, tlog.ed25519_key_id(origin, public_raw))
        verifiers = {key: tlog.ed25519_verifier(public_raw)}
        text, kept = tlog.known_signatures_only(note, verifiers)
        checkpoint = tlog.parse_checkpoint(text)
    except tlog.TlogError as exc:
        raise VerificationError(f"bad checkpoint: {exc}") from None
    if checkpoint.origin != origin:
        raise VerificationError("the checkpoint is of another log")
    return checkpoint, kept
