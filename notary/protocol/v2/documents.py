"""The server side of an answer: the per-request envelope and the answer
document of ``POST /v2/query`` (docs/v2.md, rules S2 and S5)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from notary.model.targets import Target
from notary.protocol.v2.canonical import canonical_json
from notary.protocol.v2.constants import (
    ANSWER_TYPE,
    BASE64_RE,
    MATCHED_BY,
    VERDICT_MATCH,
    VERDICT_MISMATCH,
    VERDICTS,
)
from notary.protocol.v2.statements import SignedStatement, answer_item


@dataclass(frozen=True, slots=True)
class QueryResult:
    """The answer to one request entry: its verdict, the target's signed
    statement (None when the notary has no observation to state) and, for
    a match by the submitted key alone, ``matched_by`` (``"spki"``, rules
    S2 and V6: ``v2.matched_by`` gives it; None: left out)."""

    target: Target
    verdict: str
    statement: SignedStatement | None = None
    matched_by: str | None = None


def envelope(
    results: Sequence[QueryResult], *, nonce: str | None, signed_at: int, key_id: str
) -> dict[str, Any]:
    """The per-request object to sign (rule S2), ``results`` in request order.

    Raises ``ValueError`` for a verdict outside :data:`VERDICTS`, a statement
    of another target, ``match``/``mismatch`` without a statement, or a
    ``matched_by`` outside :data:`MATCHED_BY` or on another verdict than
    ``match``.
    """
    rows = []
    for result in results:
        if result.verdict not in VERDICTS:
            raise ValueError(f"unknown verdict {result.verdict!r}")
        signed = result.statement
        if signed is not None and signed.target != result.target.key:
            raise ValueError("a result's statement must be of its target")
        if signed is None and result.verdict in (VERDICT_MATCH, VERDICT_MISMATCH):
            raise ValueError("match and mismatch need a statement")
        row = {
            "target": result.target.key,
            "verdict": result.verdict,
            "statement_signature": signed.signature if signed is not None else None,
        }
        if result.matched_by is not None:
            if result.matched_by not in MATCHED_BY or result.verdict != VERDICT_MATCH:
                raise ValueError("matched_by is for a match by key")
            row["matched_by"] = result.matched_by
        rows.append(row)
    return {
        "type": ANSWER_TYPE,
        "nonce": nonce,
        "signed_at": signed_at,
        "key_id": key_id,
        "results": rows,
    }


def answer_document(
    statements: Iterable[SignedStatement],
    envelope: Mapping[str, Any],
    envelope_signature: str,
    *,
    envelope_bytes: bytes | None = None,
) -> bytes:
    """The answer document (rule S5): the envelope, its signature and each
    distinct statement once (by signature), in first-seen order.

    ``envelope_bytes`` may pass the canonical bytes already computed for
    signing, so the envelope is not encoded twice. Raises ``ValueError``
    when ``envelope_signature`` is not base64 text.
    """
    if not BASE64_RE.fullmatch(envelope_signature):
        raise ValueError("signature must be base64 text")
    if envelope_bytes is None:
        envelope_bytes = canonical_json(dict(envelope))
    seen: set[str] = set()
    entries = []
    for signed in statements:
        if signed.signature not in seen:
            seen.add(signed.signature)
            entries.append(answer_item(signed))
    return b'{"answer":%s,"signature":"%s","statements":[%s]}' % (
        envelope_bytes,
        envelope_signature.encode("ascii"),
        b",".join(entries),
    )


def answer_bytes(
    results: Sequence[QueryResult],
    *,
    nonce: str | None,
    signed_at: int,
    key_id: str,
    sign: Callable[[bytes], str],
) -> bytes:
    """The whole ``POST /v2/query`` answer body with one signature (by
    ``sign``) whatever the number of results. Raises as :func:`envelope`."""
    body = envelope(results, nonce=nonce, signed_at=signed_at, key_id=key_id)
    data = canonical_json(body)
    return answer_document(
        (r.statement for r in results if r.statement is not None),
        body,
        sign(data),
        envelope_bytes=data,
    )
