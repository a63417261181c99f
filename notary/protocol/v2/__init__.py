"""The v2 signed API: batched queries, Ed25519-signed statements and answers,
and the key document of ``GET /v2/key``. The wire format and its numbered
rules (C1-C7, S1-S8, R1-R6, V1-V6) are specified in ``docs/v2.md``.

Sans-IO: no Trio, no sockets, no clock reads (``now`` and ``signed_at`` are
parameters), no key files. Signing is a callable the caller passes in
(``sign(data: bytes) -> base64 str``, e.g.
:meth:`notary.state.crypto.Ed25519Signer.sign`); verification uses
``cryptography``'s Ed25519 directly.

Modules, in import order: ``constants`` (names and sizes shared by the
others), ``canonical`` (C1-C7), ``requests`` (R1-R6), ``verdicts`` (V1-V6),
``evidence`` (S6: the ``verification`` object of a notary running DANE),
``statements`` (S1, S3, S8), ``documents`` (S2, S5: the server's answer),
``parsing`` and ``verification`` (the client's side of an answer), ``keys``
(S4 and the key document). Import the names from this package.

Errors: request defects are ``ProtocolError`` 400/413 (safe to send); a
malformed answer or key document is ``ProtocolError`` 502; a well-formed
answer that fails verification is :class:`VerificationError` (502). Misuse
of the server-side API (a bad verdict, a float in a statement) is
``ValueError`` or ``TypeError``.
"""

from __future__ import annotations

from notary.protocol import strictjson
from notary.protocol.v2.canonical import MAX_CANONICAL_DEPTH, MAX_SAFE_INTEGER, canonical_json
from notary.protocol.v2.constants import (
    ANSWER_TYPE,
    CONTENT_TYPE,
    ED25519_SIGNATURE_BYTES,
    MATCHED_BY,
    MATCHED_BY_SPKI,
    MAX_CONSISTENCY_ADDRESSES,
    MAX_STATEMENT_OBSERVATIONS,
    SHA1_BYTES,
    SHA256_BYTES,
    STATEMENT_TYPE,
    VERDICT_MATCH,
    VERDICT_MISMATCH,
    VERDICT_REFUSED,
    VERDICT_UNKNOWN,
    VERDICT_UNREACHABLE,
    VERDICTS,
)
from notary.protocol.v2.documents import QueryResult, answer_bytes, answer_document, envelope
from notary.protocol.v2.evidence import (
    BACKENDS,
    DANE_OUTCOMES,
    DNSSEC_STATUSES,
    MAX_STATEMENT_JUDGED,
    MAX_STATEMENT_TLSA,
    MAX_STATEMENT_TLSA_CHARS,
    stated_vouched,
)
from notary.protocol.v2.keys import (
    ED25519_PUBLIC_KEY_BYTES,
    KEY_ALGORITHM,
    KEY_ID_CHARS,
    KEYS_TYPE,
    MAX_KEY_DOCUMENT_BYTES,
    MAX_PUBLISHED_KEYS,
    PublishedKey,
    key_document,
    key_id_of,
    parse_key_document,
    publish_key,
    trusted_keys,
)
from notary.protocol.v2.logproof import (
    LoggedStatement,
    inclusion_item,
    open_checkpoint_note,
    verify_checkpoint,
    verify_logged,
)
from notary.protocol.v2.parsing import (
    MAX_ADDRESSES,
    MAX_ANSWER_BYTES,
    MAX_ANSWER_RESULTS,
    MAX_CHECKPOINT_BYTES,
    ParsedAnswer,
    ParsedDane,
    ParsedInclusion,
    ParsedJudgement,
    ParsedLogPromise,
    ParsedResult,
    ParsedStatement,
    ParsedVerification,
    StatementObservation,
    parse_answer_document,
    parse_statement_entry,
)
from notary.protocol.v2.requests import (
    MAX_ADDRESS_CHARS,
    MAX_NONCE_CHARS,
    QueryRequest,
    TargetQuery,
    parse_query_request,
)
from notary.protocol.v2.statements import (
    LogSlot,
    SignedStatement,
    answer_item,
    consistency_member,
    log_promise,
    sign_statement,
    stated_timeline,
    statement,
    statement_bytes,
    statement_due,
)
from notary.protocol.v2.verdicts import decide, matched_by, sightings_deadline, verdict_of
from notary.protocol.v2.verification import (
    VerificationError,
    VerifiedResult,
    verify_answer,
    verify_statement,
)

__all__ = [
    "ANSWER_TYPE",
    "BACKENDS",
    "CONTENT_TYPE",
    "DANE_OUTCOMES",
    "DNSSEC_STATUSES",
    "ED25519_PUBLIC_KEY_BYTES",
    "ED25519_SIGNATURE_BYTES",
    "KEYS_TYPE",
    "KEY_ALGORITHM",
    "KEY_ID_CHARS",
    "MATCHED_BY",
    "MATCHED_BY_SPKI",
    "MAX_ADDRESSES",
    "MAX_ADDRESS_CHARS",
    "MAX_ANSWER_BYTES",
    "MAX_ANSWER_RESULTS",
    "MAX_CANONICAL_DEPTH",
    "MAX_CHECKPOINT_BYTES",
    "MAX_CONSISTENCY_ADDRESSES",
    "MAX_KEY_DOCUMENT_BYTES",
    "MAX_NONCE_CHARS",
    "MAX_PUBLISHED_KEYS",
    "MAX_SAFE_INTEGER",
    "MAX_STATEMENT_JUDGED",
    "MAX_STATEMENT_OBSERVATIONS",
    "MAX_STATEMENT_TLSA",
    "MAX_STATEMENT_TLSA_CHARS",
    "SHA1_BYTES",
    "SHA256_BYTES",
    "STATEMENT_TYPE",
    "VERDICTS",
    "VERDICT_MATCH",
    "VERDICT_MISMATCH",
    "VERDICT_REFUSED",
    "VERDICT_UNKNOWN",
    "VERDICT_UNREACHABLE",
    "LogSlot",
    "LoggedStatement",
    "ParsedAnswer",
    "ParsedDane",
    "ParsedInclusion",
    "ParsedJudgement",
    "ParsedLogPromise",
    "ParsedResult",
    "ParsedStatement",
    "ParsedVerification",
    "PublishedKey",
    "QueryRequest",
    "QueryResult",
    "SignedStatement",
    "StatementObservation",
    "TargetQuery",
    "VerificationError",
    "VerifiedResult",
    "answer_bytes",
    "answer_document",
    "answer_item",
    "canonical_json",
    "consistency_member",
    "decide",
    "envelope",
    "inclusion_item",
    "key_document",
    "key_id_of",
    "log_promise",
    "matched_by",
    "open_checkpoint_note",
    "parse_answer_document",
    "parse_key_document",
    "parse_query_request",
    "parse_statement_entry",
    "publish_key",
    "sightings_deadline",
    "sign_statement",
    "stated_timeline",
    "stated_vouched",
    "statement",
    "statement_bytes",
    "statement_due",
    "trusted_keys",
    "verdict_of",
    "verify_answer",
    "verify_checkpoint",
    "verify_logged",
    "verify_statement",
]

#: The strict JSON loader behind every v2 parser (requests, answers, keys),
#: shared with the Convergence answer parser.
_loads = strictjson.loads
