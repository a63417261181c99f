"""The client side: verifying a parsed answer, or a pushed statement, against
trusted keys (docs/v2.md, "Verifying an answer"; rule S6 for a match the
DANE backend decided, V6 for a match by key)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from notary.errors import ProtocolError
from notary.model.consistency import Consistency
from notary.model.targets import Target
from notary.protocol.v2.constants import ED25519_SIGNATURE_BYTES, VERDICT_MATCH, VERDICT_MISMATCH
from notary.protocol.v2.parsing import (
    ParsedAnswer,
    ParsedResult,
    ParsedStatement,
    ParsedVerification,
    StatementObservation,
    parse_statement_entry,
)
from notary.protocol.v2.requests import TargetQuery


class VerificationError(ProtocolError):
    """A well-formed v2 answer failed verification: unknown key id, bad
    signature, a result not bound to its statement, an expired statement, a
    wrong nonce, results that do not answer the query. Status 502."""

    status = 502


@dataclass(frozen=True, slots=True)
class VerifiedResult:
    """A verified answer to one request entry. ``observations`` and
    ``valid_until`` come from the signed statement; they are empty and None
    when the notary sent none (``unknown``, ``unreachable``, ``refused``
    without history). ``verification`` is the statement's rule S6 object
    (which backend decided, the DANE evidence); None without a statement or
    when the notary sent none (it verifies by network perspective alone).
    ``consistency`` is the statement's rule S8 summary of the target's
    current set (None without a statement, or from a notary that sends
    none); ``matched_by`` is ``"spki"`` for a match by key alone (V6)."""

    target: Target
    verdict: str
    observations: tuple[StatementObservation, ...]
    valid_until: int | None
    verification: ParsedVerification | None = None
    consistency: Consistency | None = None
    matched_by: str | None = None


def verify_signature(public_key: Ed25519PublicKey, data: bytes, signature_b64: str) -> bool:
    """True when ``signature_b64`` (rule S3) is ``public_key``'s signature of
    ``data``; False for a bad signature or one that is not 64 bytes of base64."""
    try:
        signature = base64.b64decode(signature_b64, validate=True)
    except (binascii.Error, ValueError):
        return False
    if len(signature) != ED25519_SIGNATURE_BYTES:
        return False
    try:
        public_key.verify(signature, data)
    except InvalidSignature:
        return False
    return True


def verify_answer(
    parsed: ParsedAnswer,
    public_keys: Mapping[str, Ed25519PublicKey],
    *,
    nonce: str | None,
    now: int,
    queries: Sequence[TargetQuery] | None = None,
    max_answer_age_s: int | None = None,
) -> list[VerifiedResult]:
    """The results of ``parsed`` once every check of docs/v2.md, "Verifying
    an answer", passes, in request order.

    ``nonce`` is the one sent (None when the request had none);
    ``max_answer_age_s``, when given, bounds ``|now - signed_at|``; with
    ``queries`` (the request sent) the results must answer exactly those
    targets in order, each ``match`` must be backed by a stated
    observation with the submitted hashes (``spki_sha256`` included), and
    a match says ``matched_by`` exactly when its entry submitted
    ``spki_sha256`` alone (V6). A ``match`` whose statement says
    the DANE backend decided (rule S6) must carry DANE's ``match`` on that
    certificate (on one of the stated ones without ``queries``). Statements
    no result names are ignored.

    Error handling: raises :class:`VerificationError` (502) naming the
    failed check; never returns a partially verified list.
    """
    envelope_key = public_keys.get(parsed.key_id)
    if envelope_key is None:
        raise VerificationError("answer signed with an unknown key id")
    if not verify_signature(envelope_key, parsed.signed_bytes, parsed.signature):
        raise VerificationError("bad answer signature")
    if parsed.nonce != nonce:
        raise VerificationError("wrong nonce")
    if max_answer_age_s is not None and abs(now - parsed.signed_at) > max_answer_age_s:
        raise VerificationError("answer signed too long ago (or in the future)")
    by_signature = _verified_statements(parsed.statements, public_keys)
    if queries is not None and [q.target for q in queries] != [r.target for r in parsed.results]:
        raise VerificationError("results do not answer the targets asked, in order")
    return [
        _verify_result(result, by_signature, now, None if queries is None else queries[index])
        for index, result in enumerate(parsed.results)
    ]


def _verified_statements(
    statements: Sequence[ParsedStatement], public_keys: Mapping[str, Ed25519PublicKey]
) -> dict[str, ParsedStatement]:
    """The statements by signature, each signed by a key of ``public_keys``;
    raises :class:`VerificationError` at the first that is not."""
    by_signature: dict[str, ParsedStatement] = {}
    for stated in statements:
        statement_key = public_keys.get(stated.key_id)
        if statement_key is None:
            raise VerificationError(f"statement for {stated.target} has an unknown key id")
        if not verify_signature(statement_key, stated.signed_bytes, stated.signature):
            raise VerificationError(f"bad statement signature for {stated.target}")
        by_signature[stated.signature] = stated
    return by_signature


def _verify_result(
    result: ParsedResult,
    by_signature: Mapping[str, ParsedStatement],
    now: int,
    query: TargetQuery | None,
) -> VerifiedResult:
    """``result`` bound to its unexpired statement (and, with ``query``, a
    ``match`` backed by it); raises :class:`VerificationError` otherwise."""
    stated = None
    if result.statement_signature is not None:
        stated = by_signature.get(result.statement_signature)
        if stated is None or stated.target != result.target:
            raise VerificationError(
                f"result for {result.target} is not bound to a statement of its target"
            )
        if stated.valid_until < now:
            raise VerificationError(f"statement for {result.target} expired")
    elif result.verdict in (VERDICT_MATCH, VERDICT_MISMATCH):
        raise VerificationError(f"{result.verdict} for {result.target} without a statement")
    if result.verdict == VERDICT_MATCH:
        assert stated is not None  # match without statement refused above
        backing = stated.observations
        if query is not None:
            if (result.matched_by is not None) != query.key_only:
                raise VerificationError(
                    f"match for {result.target} does not say whether it is by key alone"
                )
            backing = tuple(
                o for o in stated.observations
                if (query.sha256 is None or o.sha256 == query.sha256)
                and (query.sha1 is None or o.sha1 == query.sha1)
                and (query.spki_sha256 is None or o.spki_sha256 == query.spki_sha256)
            )
            if not backing:
                raise VerificationError(f"match for {result.target} not backed by its statement")
        verification = stated.verification
        if verification is not None and verification.backend == "dane":
            _check_dane_match(result.target, verification, backing)
    return VerifiedResult(
        target=result.target,
        verdict=result.verdict,
        observations=stated.observations if stated is not None else (),
        valid_until=stated.valid_until if stated is not None else None,
        verification=stated.verification if stated is not None else None,
        consistency=stated.consistency if stated is not None else None,
        matched_by=result.matched_by,
    )


def _check_dane_match(
    target: Target,
    verification: ParsedVerification,
    backing: Sequence[StatementObservation],
) -> None:
    """Rule S6: a ``match`` the DANE backend decided is DANE's ``match`` on
    the certificate asked about: the evidence says a record vouches for one
    of the ``backing`` observations (those with the submitted hashes; every
    stated one when the query is not known), the main judged certificate
    (``dane.sha256``) or one of ``dane.judged`` with its ``matched``."""
    dane = verification.dane
    if dane is None or not any(dane.vouches_for(o.sha256) for o in backing):
        raise VerificationError(f"match for {target} not backed by its DANE evidence")


def verify_statement(
    entry: object, public_keys: Mapping[str, Ed25519PublicKey], *, now: int
) -> ParsedStatement:
    """A pushed statement (``{"signature": ..., "statement": {...}}``, as in
    WebSocket ``observation`` events) parsed and verified: known key, valid
    signature over its canonical bytes, not expired.

    Error handling: ``ProtocolError`` 502 when malformed;
    ``VerificationError`` when it does not verify or has expired.
    """
    parsed = parse_statement_entry(0, entry)
    key = public_keys.get(parsed.key_id)
    if key is None:
        raise VerificationError(f"statement signed by unknown key {parsed.key_id}")
    if not verify_signature(key, parsed.signed_bytes, parsed.signature):
        raise VerificationError("statement signature does not verify")
    if parsed.valid_until < now:
        raise VerificationError("statement has expired")
    return parsed
