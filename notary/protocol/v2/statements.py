"""Signed statements: what the notary observed for one target (docs/v2.md,
rules S1, S3 and S8), built and signed when the target's observations change."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from notary.model.consistency import Consistency, consistency_of
from notary.model.observations import Observation, Timeline
from notary.protocol.v2.canonical import canonical_json
from notary.protocol.v2.constants import (
    BASE64_RE,
    MAX_CONSISTENCY_ADDRESSES,
    MAX_STATEMENT_OBSERVATIONS,
    STATEMENT_TYPE,
)


def statement(
    timeline: Timeline, *, key_id: str, signed_at: int, valid_for_s: int,
    verification: Mapping[str, Any] | None = None,
    log: Mapping[str, Any] | None = None,
    fresh_for_s: int | None = None,
) -> dict[str, Any]:
    """The statement of ``timeline`` (rule S1), to sign with :func:`sign_statement`;
    ``verification`` (rule S6, ``notary.protocol.v2.evidence``) says which
    backend vouched, on notaries that run DANE (None: left out); ``log``
    (rule S7, ``log_promise``) promises the statement's inclusion in the
    notary's log, on notaries that keep one (None: left out). With
    ``fresh_for_s`` (the notary's ``[answers] fresh_for_s``), a statement
    with an observation carries the ``consistency`` of the target's current
    set among the stated observations at ``signed_at`` (rule S8); None:
    left out, the statement is byte for byte as before S8.

    Raises ``ValueError`` for a negative ``valid_for_s`` or ``fresh_for_s``.
    """
    if valid_for_s < 0:
        raise ValueError("valid_for_s must not be negative")
    if fresh_for_s is not None and fresh_for_s < 0:
        raise ValueError("fresh_for_s must not be negative")
    made: dict[str, Any] = {
        "type": STATEMENT_TYPE,
        "target": timeline.target.key,
        "observations": [
            {
                "sha256": o.certificate.sha256.hex(),
                "spki_sha256": o.certificate.spki_sha256.hex(),
                "sha1": o.certificate.sha1.hex(),
                "first_seen": o.first_seen,
                "last_seen": o.last_seen,
                "addresses": list(o.addresses),
            }
            for o in timeline.observations[:MAX_STATEMENT_OBSERVATIONS]
        ],
        "signed_at": signed_at,
        "valid_until": signed_at + valid_for_s,
        "key_id": key_id,
    }
    if verification is not None:
        made["verification"] = dict(verification)
    if log is not None:
        made["log"] = dict(log)
    if fresh_for_s is not None:
        stated = Timeline(timeline.target, timeline.observations[:MAX_STATEMENT_OBSERVATIONS])
        consistency = consistency_of(stated, now=signed_at, fresh_for_s=fresh_for_s)
        if consistency is not None:
            made["consistency"] = consistency_member(consistency)
    return made


def consistency_member(consistency: Consistency) -> dict[str, Any]:
    """A statement's ``consistency`` member (rule S8): the kind, the first
    :data:`MAX_CONSISTENCY_ADDRESSES` addresses in their order, and the
    current set's SHA-256s in lower-case hex."""
    return {
        "kind": consistency.kind.value,
        "addresses": list(consistency.addresses[:MAX_CONSISTENCY_ADDRESSES]),
        "current": [sha256.hex() for sha256 in consistency.current],
    }


def stated_timeline(timeline: Timeline) -> Timeline:
    """What a statement of ``timeline`` says, as a timeline: its first
    ``MAX_STATEMENT_OBSERVATIONS`` observations with their certificates'
    hashes and their times, without DER, runs or addresses (what a verdict
    reads, small enough to keep beside a statement signed earlier)."""
    return Timeline(timeline.target, tuple(
        Observation(replace(o.certificate, der=b""), o.first_seen, o.last_seen)
        for o in timeline.observations[:MAX_STATEMENT_OBSERVATIONS]
    ))


def log_promise(origin: str, *, signed_at: int, max_merge_delay_s: int) -> dict[str, Any]:
    """A statement's ``log`` member (rule S7): it will be in the log named
    ``origin`` by ``merge_by``. The statement's signature is the promise."""
    return {"origin": origin, "merge_by": signed_at + max_merge_delay_s}


class LogSlot:
    """Where a logged statement's inclusion arrives once the log has
    sequenced it: ``item``, the statement's entry of the answer document with
    its ``inclusion`` (rule S7); None until then (the statement's promise
    stands). Written by the log's appender, read by the answers.

    With witnesses, ``item`` is replaced once a checkpoint at or past the
    statement's index is cosigned (its inclusion proven against that one,
    its cosignatures on the note), and ``witnessed`` set; ``abandoned``
    says nobody will do so (the notary gave up waiting for it: answers then
    do not wait either)."""

    __slots__ = ("abandoned", "item", "witnessed")

    def __init__(self) -> None:
        self.item: bytes | None = None
        self.witnessed = False
        self.abandoned = False

    @property
    def awaits_witnesses(self) -> bool:
        """Whether a cosigned inclusion may still come."""
        return not (self.witnessed or self.abandoned)


def statement_bytes(statement: Mapping[str, Any]) -> bytes:
    """The bytes a statement's signature covers: its canonical JSON."""
    return canonical_json(dict(statement))


@dataclass(frozen=True, slots=True)
class SignedStatement:
    """A statement ready to serve: its canonical bytes, its signature and the
    entry of the answer document's ``statements`` array (``entry``),
    prepared once when the target's observations change.

    Raises ``ValueError`` when ``signature`` is not base64 text.
    """

    target: str
    valid_until: int
    statement: bytes
    signature: str
    entry: bytes = field(init=False, repr=False, compare=False)
    #: A logged statement's slot (rule S7); None: the notary keeps no log.
    log: LogSlot | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.signature, str) or not BASE64_RE.fullmatch(self.signature):
            raise ValueError("signature must be base64 text")
        entry = b'{"signature":"%s","statement":%s}' % (
            self.signature.encode("ascii"),
            self.statement,
        )
        object.__setattr__(self, "entry", entry)


def sign_statement(statement: Mapping[str, Any], sign: Callable[[bytes], str]) -> SignedStatement:
    """Encode ``statement`` and sign it once with ``sign`` (bytes -> base64);
    a statement with a ``log`` promise gets its ``LogSlot``."""
    data = statement_bytes(statement)
    return SignedStatement(
        target=statement["target"],
        valid_until=statement["valid_until"],
        statement=data,
        signature=sign(data),
        log=LogSlot() if "log" in statement else None,
    )


def answer_item(signed: SignedStatement) -> bytes:
    """The statement's entry in an answer document: with its inclusion
    proof once the log has it (rule S7), else as signed."""
    slot = signed.log
    if slot is not None and slot.item is not None:
        return slot.item
    return signed.entry


def statement_due(signed: SignedStatement, *, now: int, renew_before_s: int) -> bool:
    """True when ``signed`` expires within ``renew_before_s``: sign a new one
    from the same timeline so no client ever receives an expired one."""
    return signed.valid_until - now <= renew_before_s
