"""The modern "v2" API (issue 7): batched queries, Ed25519-signed statements
and answers, and the key document of ``GET /v2/key``.

Sans-IO: no Trio, no sockets, no clock reads (``now`` and ``signed_at`` are
parameters), no key files. Signing is a callable the caller passes in
(``sign(data: bytes) -> base64 str``, e.g.
:meth:`notary.state.crypto.Ed25519Signer.sign`); verification uses
``cryptography``'s Ed25519 directly.

Canonical JSON (:func:`canonical_json`) -- what is signed
-------------------------------------------------------
C1. Values: objects (``dict``) whose keys are ASCII strings; arrays (``list``
    or ``tuple``); strings; integers ``n`` with ``|n| <= 2**53 - 1``; ``true``;
    ``false``; ``null``. Anything else is refused, never coerced: floats (even
    ``1.0``), NaN and infinities, non-ASCII or non-string keys, strings that
    are not sequences of Unicode scalar values (lone surrogates), nesting
    deeper than :data:`MAX_CANONICAL_DEPTH` arrays/objects.
C2. No whitespace anywhere: ``,`` between members and elements, ``:`` between
    a key and its value, nothing else between tokens.
C3. Object members are sorted by key, by code point (the keys are ASCII, so
    this is byte order and UTF-16 order alike); each key appears once.
C4. Integers in plain decimal: an optional ``-``, no leading zeros, no ``+``,
    fraction or exponent. ``true``, ``false``, ``null`` in lower case.
C5. Strings: ``"``, then every character as itself except ``"`` -> ``\\"``,
    ``\\`` -> ``\\\\``, U+0008 -> ``\\b``, U+0009 -> ``\\t``, U+000A -> ``\\n``,
    U+000C -> ``\\f``, U+000D -> ``\\r``, and the other characters U+0000 to
    U+001F -> ``\\u00xx`` (four lower-case hex digits); everything else,
    including ``/``, U+007F, non-ASCII and U+2028/U+2029, is written as
    itself; then ``"``. There is **no Unicode normalisation**: a string is
    encoded as given, NFC or not. (What the notary signs is ASCII except the
    client's nonce, and R5 keeps that to printable ASCII.)
C6. The text is UTF-8, without BOM and without a trailing newline.
C7. On this value subset the encoding is exactly RFC 8785 (JCS), and exactly
    Python's ``json.dumps(v, sort_keys=True, separators=(",", ":"),
    ensure_ascii=False).encode("utf-8")``. A verifier parses the document and
    re-encodes the parsed values: the bytes on the wire need not be canonical
    (``"\\u0041"`` and ``"A"`` are the same signed value).

Signed objects
--------------
S1. A *statement* says what the notary observed for one target::

        {"type": "notary.v2.statement", "target": "<Target.key>",
         "observations": [{"sha256": HEX64, "spki_sha256": HEX64,
                           "sha1": HEX40, "first_seen": INT, "last_seen": INT,
                           "addresses": [STR, ...]}, ...],
         "signed_at": INT, "valid_until": INT, "key_id": KEYID}

    Observations newest first, in :class:`~notary.model.observations.Timeline`
    order, at most :data:`MAX_STATEMENT_OBSERVATIONS` (the newest ones);
    hex in lower case; times are whole Unix seconds; ``valid_until =
    signed_at + valid_for_s``.
S2. An *envelope* (the per-request part) says what the notary answers to one
    request::

        {"type": "notary.v2.answer", "nonce": STR | null, "signed_at": INT,
         "key_id": KEYID,
         "results": [{"target": "<Target.key>", "verdict": VERDICT,
                      "statement_signature": B64 | null}, ...]}

    ``results[i]`` answers ``targets[i]`` of the request, in order.
S3. A signature is Ed25519 (RFC 8032, pure Ed25519, no context) over
    ``canonical_json(object)``, written in standard base64 with padding
    (RFC 4648 section 4): 88 characters.
S4. A key id is the first 16 characters of the lower-case hex SHA-256 of the
    key's raw 32-byte public key (:func:`key_id_of`).
S5. The answer document (``POST /v2/query``) is::

        {"answer": ENVELOPE, "signature": B64,
         "statements": [{"signature": B64, "statement": STATEMENT}, ...]}

    with each statement referenced by some result listed once. The server
    writes it canonically, but clients must not rely on that.

Why two signatures (the cost scheme)
------------------------------------
Statements are signed when a target's observations change (every successful
probe moves ``last_seen``, so in practice after each probe) and re-signed
when ``valid_until`` approaches (:func:`statement_due`); the server keeps the
signed statement bytes ready, as for the legacy protocols. The per-request
fields -- nonce, verdicts, the order of the batch -- go into the envelope,
signed once per request whatever the batch size: one Ed25519 signature (tens
of microseconds) per request instead of one per target. The envelope binds
each verdict and the nonce to a statement by the statement's *signature*:
Ed25519 signatures are deterministic and strictly verified (``s < L``), and a
valid signature under a trusted key determines the signed statement as well
as a hash of it would, so the verifier needs no second digest.

A verifier (:func:`verify_answer`) checks, in order: the envelope's key id is
trusted and its signature is valid; the nonce equals the one sent; every
statement's key id is trusted and its signature valid; each result's
``statement_signature`` is the signature of a statement of the same target;
each such statement has ``valid_until >= now``.

Requests (:func:`parse_query_request`)
--------------------------------------
R1. The body is at most ``max_body_bytes`` (else 413), UTF-8 JSON (else 400)
    with no repeated key in any object and no NaN/Infinity.
R2. The top level is an object with ``targets`` (required) and ``nonce``
    (optional); no other key.
R3. ``targets`` is a non-empty array of at most ``max_batch`` entries (more
    is a 413: the client should split its batch). A target may appear more
    than once (e.g. with two hashes); each entry is answered, in order.
R4. An entry is an object with ``host`` (string, normalised by
    :func:`~notary.model.targets.make_target`) and ``port`` (JSON integer
    1-65535, both required), ``sha256`` and ``sha1`` (optional: 32 or 20
    bytes as hex digits, either case, plain or as colon-separated pairs); no
    other key.
R5. ``nonce`` is null or 1 to :data:`MAX_NONCE_CHARS` printable ASCII
    characters (U+0020 to U+007E).
R6. Every error is a :class:`~notary.errors.ProtocolError` (a
    :class:`~notary.errors.BadTarget` for host and port) whose message names
    the field (``targets[3].port: ...``) and never echoes the input; no
    other exception escapes, whatever the bytes.

Verdicts (:func:`verdict_of`)
-----------------------------
V1. ``match``: a hash was submitted, and the certificate of the newest
    observation, or of an observation seen within ``fresh_for_s``, has every
    submitted hash (both must agree when both are given).
V2. ``mismatch``: a hash was submitted, the notary has fresh observations,
    and none matches.
V3. ``unknown``: otherwise -- no hash submitted (nothing to judge: the
    observations are the answer), no observation, or only stale ones that do
    not include the newest match.
V4. ``unreachable`` and ``refused`` are decided by the caller when a probe
    failed or the policy forbade it (:data:`VERDICT_UNREACHABLE`,
    :data:`VERDICT_REFUSED`).
V5. Only the observations a statement carries are judged, so a ``match`` is
    always backed by an observation in the signed statement.

Error handling: request defects are ``ProtocolError`` 400/413 (safe to send);
a malformed answer or key document is ``ProtocolError`` 502 (the notary asked
misbehaved); a well-formed answer that fails verification (signature, key,
freshness, nonce, binding) is :class:`VerificationError`, also 502. Misuse of
the server-side API (a bad verdict, a float in a statement) is ``ValueError``
or ``TypeError``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from notary.errors import BadTarget, ProtocolError
from notary.model.observations import Observation, Timeline
from notary.model.targets import Target, make_target
from notary.protocol.convergence import Decision
from notary.protocol.strictjson import DuplicateKey as _DuplicateKey
from notary.protocol.strictjson import loads as _loads

__all__ = [
    "ANSWER_TYPE",
    "CONTENT_TYPE",
    "KEYS_TYPE",
    "KEY_ALGORITHM",
    "MAX_ANSWER_BYTES",
    "MAX_ANSWER_RESULTS",
    "MAX_CANONICAL_DEPTH",
    "MAX_KEY_DOCUMENT_BYTES",
    "MAX_NONCE_CHARS",
    "MAX_PUBLISHED_KEYS",
    "MAX_SAFE_INTEGER",
    "MAX_STATEMENT_OBSERVATIONS",
    "STATEMENT_TYPE",
    "VERDICTS",
    "VERDICT_MATCH",
    "VERDICT_MISMATCH",
    "VERDICT_REFUSED",
    "VERDICT_UNKNOWN",
    "VERDICT_UNREACHABLE",
    "ParsedAnswer",
    "ParsedResult",
    "ParsedStatement",
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
    "canonical_json",
    "decide",
    "envelope",
    "key_document",
    "key_id_of",
    "parse_answer_document",
    "parse_key_document",
    "parse_query_request",
    "publish_key",
    "sign_statement",
    "statement",
    "statement_bytes",
    "statement_due",
    "trusted_keys",
    "verdict_of",
    "verify_answer",
]

CONTENT_TYPE = b"application/json"
STATEMENT_TYPE = "notary.v2.statement"
ANSWER_TYPE = "notary.v2.answer"
KEYS_TYPE = "notary.v2.keys"
KEY_ALGORITHM = "ed25519"

VERDICT_MATCH = "match"
VERDICT_MISMATCH = "mismatch"
VERDICT_UNKNOWN = "unknown"
VERDICT_UNREACHABLE = "unreachable"
VERDICT_REFUSED = "refused"
VERDICTS = frozenset(
    {VERDICT_MATCH, VERDICT_MISMATCH, VERDICT_UNKNOWN, VERDICT_UNREACHABLE, VERDICT_REFUSED}
)

#: Largest integer magnitude in canonical JSON (C1): exact in every JSON
#: implementation, including JavaScript's.
MAX_SAFE_INTEGER = 2**53 - 1
#: Deepest nesting of arrays and objects :func:`canonical_json` encodes; the
#: notary's documents are four levels deep.
MAX_CANONICAL_DEPTH = 16
#: Longest nonce (R5).
MAX_NONCE_CHARS = 128
#: Most observations in one statement (the newest ones, S1).
MAX_STATEMENT_OBSERVATIONS = 64
#: Most addresses per observation a client accepts.
MAX_ADDRESSES = 64
#: Largest answer document a client parses.
MAX_ANSWER_BYTES = 16 * 1024 * 1024
#: Most results a client accepts in one answer.
MAX_ANSWER_RESULTS = 4096
#: Largest key document a client parses, and most keys in it.
MAX_KEY_DOCUMENT_BYTES = 64 * 1024
MAX_PUBLISHED_KEYS = 16
ED25519_SIGNATURE_BYTES = 64
ED25519_PUBLIC_KEY_BYTES = 32
KEY_ID_CHARS = 16
SHA256_BYTES = 32
SHA1_BYTES = 20

_REQUEST_KEYS = frozenset({"targets", "nonce"})
_TARGET_KEYS = frozenset({"host", "port", "sha256", "sha1"})
_NONCE_RE = re.compile(r"[\x20-\x7e]+")
_LOWER_HEX_RE = re.compile(r"[0-9a-f]*")
_BASE64_RE = re.compile(r"[A-Za-z0-9+/]+={0,2}")


class VerificationError(ProtocolError):
    """A well-formed v2 answer failed verification: unknown key id, bad
    signature, a result not bound to its statement, an expired statement, a
    wrong nonce, results that do not answer the query. Status 502."""

    status = 502


# -- canonical JSON (C1-C7) --------------------------------------------------------


def canonical_json(value: object) -> bytes:
    """``value`` in canonical JSON (module docstring, C1-C7).

    Raises ``TypeError`` for a value of another type (float, bytes, set, a
    non-string key, ...) and ``ValueError`` for an integer out of range, a
    non-ASCII key, a lone surrogate or nesting deeper than
    :data:`MAX_CANONICAL_DEPTH`.
    """
    _check_canonical(value, 0)
    text = json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("strings must be Unicode scalar values (no lone surrogates)") from None


def _check_canonical(value: object, depth: int) -> None:
    if value is None or isinstance(value, bool | str):
        return
    if isinstance(value, int):
        if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            raise ValueError("integer out of the range +-(2**53 - 1)")
        return
    if isinstance(value, dict | list | tuple):
        if depth >= MAX_CANONICAL_DEPTH:
            raise ValueError("nesting too deep")
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise TypeError("object keys must be strings")
                if not key.isascii():
                    raise ValueError("object keys must be ASCII")
                _check_canonical(item, depth + 1)
        else:
            for item in value:
                _check_canonical(item, depth + 1)
        return
    raise TypeError(f"{type(value).__name__} has no canonical JSON form")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# -- requests (R1-R6) --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TargetQuery:
    """One entry of a request: a target and the hashes the client saw (None
    when not submitted)."""

    target: Target
    sha256: bytes | None = None
    sha1: bytes | None = None


@dataclass(frozen=True, slots=True)
class QueryRequest:
    """A parsed ``POST /v2/query`` body: targets in request order."""

    targets: tuple[TargetQuery, ...]
    nonce: str | None = None


def parse_query_request(body: bytes, *, max_batch: int, max_body_bytes: int) -> QueryRequest:
    """The request in ``body`` (module docstring, R1-R6).

    Error handling: ``ProtocolError`` 413 for a body longer than
    ``max_body_bytes`` or more than ``max_batch`` targets; ``ProtocolError``
    400 for anything else malformed; ``BadTarget`` (400) for a host or port
    that does not normalise. Messages name the field and never echo input.
    """
    if len(body) > max_body_bytes:
        raise ProtocolError("body: too large", status=413)
    try:
        document = _loads(body)
    except _DuplicateKey:
        raise ProtocolError("body: repeated key in an object") from None
    except ValueError:
        raise ProtocolError("body: not UTF-8 JSON") from None
    if not isinstance(document, dict):
        raise ProtocolError("body: must be a JSON object")
    if not document.keys() <= _REQUEST_KEYS:
        raise ProtocolError("body: unknown field (expected targets, nonce)")
    nonce = document.get("nonce")
    if nonce is not None and not (
        isinstance(nonce, str) and len(nonce) <= MAX_NONCE_CHARS and _NONCE_RE.fullmatch(nonce)
    ):
        raise ProtocolError(
            f"nonce: must be 1-{MAX_NONCE_CHARS} printable ASCII characters or null"
        )
    if "targets" not in document:
        raise ProtocolError("targets: missing")
    entries = document["targets"]
    if not isinstance(entries, list) or not entries:
        raise ProtocolError("targets: must be a non-empty array")
    if len(entries) > max_batch:
        raise ProtocolError(f"targets: more than {max_batch} targets", status=413)
    return QueryRequest(
        tuple(_parse_target_query(index, entry) for index, entry in enumerate(entries)), nonce
    )


def _parse_target_query(index: int, entry: object) -> TargetQuery:
    where = f"targets[{index}]"
    if not isinstance(entry, dict):
        raise ProtocolError(f"{where}: must be an object")
    if not entry.keys() <= _TARGET_KEYS:
        raise ProtocolError(f"{where}: unknown field (expected host, port, sha256, sha1)")
    if "host" not in entry:
        raise BadTarget(f"{where}.host: missing")
    host = entry["host"]
    if not isinstance(host, str):
        raise BadTarget(f"{where}.host: must be a string")
    if "port" not in entry:
        raise BadTarget(f"{where}.port: missing")
    port = entry["port"]
    if not _is_int(port) or not 1 <= port <= 65535:
        raise BadTarget(f"{where}.port: must be an integer 1-65535")
    try:
        target = make_target(host, port)
    except BadTarget as exc:
        raise BadTarget(f"{where}.host: {exc.message}") from None
    sha256 = _parse_digest(entry.get("sha256"), SHA256_BYTES, f"{where}.sha256")
    sha1 = _parse_digest(entry.get("sha1"), SHA1_BYTES, f"{where}.sha1")
    return TargetQuery(target, sha256, sha1)


def _parse_digest(value: object, size: int, where: str) -> bytes | None:
    """``size`` bytes written as hex (either case), plain or as
    colon-separated pairs; None for a missing or null field."""
    if value is None:
        return None
    if isinstance(value, str) and len(value) in (2 * size, 3 * size - 1):
        text = value.lower()
        if len(text) == 3 * size - 1:
            pairs = text.split(":")
            text = "".join(pairs) if all(len(pair) == 2 for pair in pairs) else ""
        if len(text) == 2 * size and _LOWER_HEX_RE.fullmatch(text):
            return bytes.fromhex(text)
    raise ProtocolError(f"{where}: must be {2 * size} hex digits or null")


# -- verdicts (V1-V5) --------------------------------------------------------------


def _matches(observation: Observation, sha256: bytes | None, sha1: bytes | None) -> bool:
    certificate = observation.certificate
    return (sha256 is None or certificate.sha256 == sha256) and (
        sha1 is None or certificate.sha1 == sha1
    )


def verdict_of(
    timeline: Timeline | None,
    sha256: bytes | None,
    sha1: bytes | None,
    *,
    now: int,
    fresh_for_s: int,
) -> str:
    """``match``, ``mismatch`` or ``unknown`` for the submitted hashes
    (module docstring, V1-V5). ``unreachable`` and ``refused`` are for the
    caller to give when a probe failed or was refused."""
    if sha256 is None and sha1 is None:
        return VERDICT_UNKNOWN
    observations = (
        timeline.observations[:MAX_STATEMENT_OBSERVATIONS] if timeline is not None else ()
    )
    if not observations:
        return VERDICT_UNKNOWN
    if _matches(observations[0], sha256, sha1):
        return VERDICT_MATCH
    fresh = [o for o in observations if o.is_fresh(now, fresh_for_s)]
    if any(_matches(o, sha256, sha1) for o in fresh):
        return VERDICT_MATCH
    return VERDICT_MISMATCH if fresh else VERDICT_UNKNOWN


def decide(
    timeline: Timeline | None,
    sha256: bytes | None,
    sha1: bytes | None,
    *,
    now: int,
    fresh_for_s: int,
    reprobe_after_s: int,
) -> Decision:
    """Whether a v2 entry can be answered now, with the rules of
    :func:`notary.protocol.convergence.decide`: a fresh match, or a fresh
    newest observation when no hash is submitted, is answered at once; an
    unknown or stale hash needs a probe unless the newest observation is
    younger than ``reprobe_after_s`` (no probe loops by random hashes); no
    history always needs a probe."""
    newest = timeline.newest if timeline is not None else None
    if timeline is None or newest is None:
        return Decision.PROBE
    if sha256 is None and sha1 is None:
        return Decision.ANSWER if newest.is_fresh(now, fresh_for_s) else Decision.PROBE
    if any(
        _matches(o, sha256, sha1) and o.is_fresh(now, fresh_for_s)
        for o in timeline.observations[:MAX_STATEMENT_OBSERVATIONS]
    ):
        return Decision.ANSWER
    if newest.is_fresh(now, reprobe_after_s):
        return Decision.ANSWER
    return Decision.PROBE


# -- statements (S1) ---------------------------------------------------------------


def statement(
    timeline: Timeline, *, key_id: str, signed_at: int, valid_for_s: int
) -> dict[str, Any]:
    """The statement of ``timeline`` (S1), to sign with :func:`sign_statement`.

    Raises ``ValueError`` for a negative ``valid_for_s``.
    """
    if valid_for_s < 0:
        raise ValueError("valid_for_s must not be negative")
    return {
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


def statement_bytes(statement: Mapping[str, Any]) -> bytes:
    """The bytes a statement's signature covers: its canonical JSON."""
    return canonical_json(dict(statement))


@dataclass(frozen=True, slots=True)
class SignedStatement:
    """A statement ready to serve: its canonical bytes, its signature and the
    entry of the answer document's ``statements`` array (``entry``),
    prepared once when the target's observations change."""

    target: str
    valid_until: int
    statement: bytes
    signature: str
    entry: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.signature, str) or not _BASE64_RE.fullmatch(self.signature):
            raise ValueError("signature must be base64 text")
        entry = b'{"signature":"%s","statement":%s}' % (
            self.signature.encode("ascii"),
            self.statement,
        )
        object.__setattr__(self, "entry", entry)


def sign_statement(statement: Mapping[str, Any], sign: Callable[[bytes], str]) -> SignedStatement:
    """Encode ``statement`` and sign it once with ``sign`` (bytes -> base64)."""
    data = statement_bytes(statement)
    return SignedStatement(
        target=statement["target"],
        valid_until=statement["valid_until"],
        statement=data,
        signature=sign(data),
    )


def statement_due(signed: SignedStatement, *, now: int, renew_before_s: int) -> bool:
    """True when ``signed`` expires within ``renew_before_s``: sign a new one
    from the same timeline so no client ever receives an expired one."""
    return signed.valid_until - now <= renew_before_s


# -- envelopes and answer documents (S2, S5) ---------------------------------------


@dataclass(frozen=True, slots=True)
class QueryResult:
    """The answer to one request entry: its verdict and the target's signed
    statement (None when the notary has no observation to state)."""

    target: Target
    verdict: str
    statement: SignedStatement | None = None


def envelope(
    results: Sequence[QueryResult], *, nonce: str | None, signed_at: int, key_id: str
) -> dict[str, Any]:
    """The per-request object to sign (S2), ``results`` in request order.

    Raises ``ValueError`` for a verdict outside :data:`VERDICTS`, a statement
    of another target, or ``match``/``mismatch`` without a statement.
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
        rows.append(
            {
                "target": result.target.key,
                "verdict": result.verdict,
                "statement_signature": signed.signature if signed is not None else None,
            }
        )
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
    """The answer document (S5): the envelope, its signature and each
    distinct statement once (by signature), in first-seen order.

    ``envelope_bytes`` may pass the canonical bytes already computed for
    signing, so the envelope is not encoded twice.
    """
    if not _BASE64_RE.fullmatch(envelope_signature):
        raise ValueError("signature must be base64 text")
    if envelope_bytes is None:
        envelope_bytes = canonical_json(dict(envelope))
    seen: set[str] = set()
    entries = []
    for signed in statements:
        if signed.signature not in seen:
            seen.add(signed.signature)
            entries.append(signed.entry)
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
    ``sign``) whatever the number of results."""
    body = envelope(results, nonce=nonce, signed_at=signed_at, key_id=key_id)
    data = canonical_json(body)
    return answer_document(
        (r.statement for r in results if r.statement is not None),
        body,
        sign(data),
        envelope_bytes=data,
    )


# -- the client side: parsing ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StatementObservation:
    """One observation as a statement states it."""

    sha256: bytes
    spki_sha256: bytes
    sha1: bytes
    first_seen: int
    last_seen: int
    addresses: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ParsedStatement:
    """A statement from an answer document, not yet verified; ``signed_bytes``
    is its canonical re-encoding, what ``signature`` must cover."""

    target: Target
    observations: tuple[StatementObservation, ...]
    signed_at: int
    valid_until: int
    key_id: str
    signature: str
    signed_bytes: bytes


@dataclass(frozen=True, slots=True)
class ParsedResult:
    target: Target
    verdict: str
    statement_signature: str | None


@dataclass(frozen=True, slots=True)
class ParsedAnswer:
    """An answer document taken apart, not yet verified."""

    nonce: str | None
    signed_at: int
    key_id: str
    results: tuple[ParsedResult, ...]
    signature: str
    signed_bytes: bytes
    statements: tuple[ParsedStatement, ...]


def _bad_answer(message: str) -> ProtocolError:
    return ProtocolError(f"malformed v2 answer: {message}", status=502)


def _object(value: object, keys: frozenset[str], where: str) -> dict[str, Any]:
    if not isinstance(value, dict) or value.keys() != keys:
        raise _bad_answer(f"{where} must be an object with {', '.join(sorted(keys))}")
    return value


def _int_field(obj: Mapping[str, Any], name: str, where: str) -> int:
    value = obj[name]
    if not _is_int(value) or not 0 <= value <= MAX_SAFE_INTEGER:
        raise _bad_answer(f"{where}.{name} must be a non-negative integer")
    return value


def _str_field(obj: Mapping[str, Any], name: str, where: str) -> str:
    value = obj[name]
    if not isinstance(value, str):
        raise _bad_answer(f"{where}.{name} must be a string")
    return value


def _signature_field(obj: Mapping[str, Any], name: str, where: str) -> str:
    value = _str_field(obj, name, where)
    if len(value) > 2 * ED25519_SIGNATURE_BYTES or not _BASE64_RE.fullmatch(value):
        raise _bad_answer(f"{where}.{name} must be base64")
    return value


def _hex_field(obj: Mapping[str, Any], name: str, size: int, where: str) -> bytes:
    value = _str_field(obj, name, where)
    if len(value) != 2 * size or not _LOWER_HEX_RE.fullmatch(value):
        raise _bad_answer(f"{where}.{name} must be {2 * size} lower-case hex digits")
    return bytes.fromhex(value)


def _target_field(obj: Mapping[str, Any], name: str, where: str) -> Target:
    text = _str_field(obj, name, where)
    host, _, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        target = make_target(host, port)
    except BadTarget:
        raise _bad_answer(f"{where}.{name} is not a target") from None
    if target.key != text:
        raise _bad_answer(f"{where}.{name} is not a normalised target")
    return target


def _signed_bytes(value: dict[str, Any], where: str) -> bytes:
    try:
        return canonical_json(value)
    except (TypeError, ValueError):
        raise _bad_answer(f"{where} has no canonical form") from None


_ANSWER_DOCUMENT_KEYS = frozenset({"answer", "signature", "statements"})
_ENVELOPE_KEYS = frozenset({"type", "nonce", "signed_at", "key_id", "results"})
_RESULT_KEYS = frozenset({"target", "verdict", "statement_signature"})
_STATEMENT_ENTRY_KEYS = frozenset({"statement", "signature"})
_STATEMENT_KEYS = frozenset(
    {"type", "target", "observations", "signed_at", "valid_until", "key_id"}
)
_OBSERVATION_KEYS = frozenset(
    {"sha256", "spki_sha256", "sha1", "first_seen", "last_seen", "addresses"}
)


def parse_answer_document(data: bytes) -> ParsedAnswer:
    """Take apart an answer document (S5) from any notary, without verifying
    it (that is :func:`verify_answer`): check its shape and rebuild the
    canonical bytes each signature covers.

    Error handling: ``ProtocolError`` with status 502 and a short message for
    any defect (size over :data:`MAX_ANSWER_BYTES`, not strict UTF-8 JSON,
    a missing, unknown or mistyped field, an unknown verdict or type, more
    than :data:`MAX_ANSWER_RESULTS` results); never another exception.
    """
    if not isinstance(data, bytes | bytearray):
        raise _bad_answer("not bytes")
    if len(data) > MAX_ANSWER_BYTES:
        raise _bad_answer("too large")
    try:
        document = _loads(data)
    except ValueError:
        raise _bad_answer("not strict UTF-8 JSON") from None
    document = _object(document, _ANSWER_DOCUMENT_KEYS, "document")
    body = _object(document["answer"], _ENVELOPE_KEYS, "answer")
    if body["type"] != ANSWER_TYPE:
        raise _bad_answer(f"answer.type must be {ANSWER_TYPE}")
    nonce = body["nonce"]
    if nonce is not None and not isinstance(nonce, str):
        raise _bad_answer("answer.nonce must be a string or null")
    rows = body["results"]
    if not isinstance(rows, list) or len(rows) > MAX_ANSWER_RESULTS:
        raise _bad_answer(f"answer.results must be an array of at most {MAX_ANSWER_RESULTS}")
    results = tuple(_parse_result(index, row) for index, row in enumerate(rows))
    entries = document["statements"]
    if not isinstance(entries, list) or len(entries) > MAX_ANSWER_RESULTS:
        raise _bad_answer(f"statements must be an array of at most {MAX_ANSWER_RESULTS}")
    return ParsedAnswer(
        nonce=nonce,
        signed_at=_int_field(body, "signed_at", "answer"),
        key_id=_str_field(body, "key_id", "answer"),
        results=results,
        signature=_signature_field(document, "signature", "document"),
        signed_bytes=_signed_bytes(body, "answer"),
        statements=tuple(_parse_statement(index, entry) for index, entry in enumerate(entries)),
    )


def _parse_result(index: int, row: object) -> ParsedResult:
    where = f"answer.results[{index}]"
    row = _object(row, _RESULT_KEYS, where)
    verdict = row["verdict"]
    if not isinstance(verdict, str) or verdict not in VERDICTS:
        raise _bad_answer(f"{where}.verdict is not a known verdict")
    signature = row["statement_signature"]
    return ParsedResult(
        _target_field(row, "target", where),
        verdict,
        None if signature is None else _signature_field(row, "statement_signature", where),
    )


def _parse_statement(index: int, entry: object) -> ParsedStatement:
    where = f"statements[{index}]"
    entry = _object(entry, _STATEMENT_ENTRY_KEYS, where)
    signature = _signature_field(entry, "signature", where)
    where += ".statement"
    body = _object(entry["statement"], _STATEMENT_KEYS, where)
    if body["type"] != STATEMENT_TYPE:
        raise _bad_answer(f"{where}.type must be {STATEMENT_TYPE}")
    rows = body["observations"]
    if not isinstance(rows, list) or len(rows) > MAX_STATEMENT_OBSERVATIONS:
        raise _bad_answer(
            f"{where}.observations must be an array of at most {MAX_STATEMENT_OBSERVATIONS}"
        )
    signed_at = _int_field(body, "signed_at", where)
    valid_until = _int_field(body, "valid_until", where)
    if valid_until < signed_at:
        raise _bad_answer(f"{where}.valid_until is before signed_at")
    return ParsedStatement(
        target=_target_field(body, "target", where),
        observations=tuple(
            _parse_observation(f"{where}.observations[{i}]", row) for i, row in enumerate(rows)
        ),
        signed_at=signed_at,
        valid_until=valid_until,
        key_id=_str_field(body, "key_id", where),
        signature=signature,
        signed_bytes=_signed_bytes(body, where),
    )


def _parse_observation(where: str, row: object) -> StatementObservation:
    row = _object(row, _OBSERVATION_KEYS, where)
    addresses = row["addresses"]
    if (
        not isinstance(addresses, list)
        or len(addresses) > MAX_ADDRESSES
        or not all(isinstance(a, str) for a in addresses)
    ):
        raise _bad_answer(f"{where}.addresses must be an array of strings")
    first_seen = _int_field(row, "first_seen", where)
    last_seen = _int_field(row, "last_seen", where)
    if last_seen < first_seen:
        raise _bad_answer(f"{where}.last_seen is before first_seen")
    return StatementObservation(
        sha256=_hex_field(row, "sha256", SHA256_BYTES, where),
        spki_sha256=_hex_field(row, "spki_sha256", SHA256_BYTES, where),
        sha1=_hex_field(row, "sha1", SHA1_BYTES, where),
        first_seen=first_seen,
        last_seen=last_seen,
        addresses=tuple(addresses),
    )


# -- the client side: verification -----------------------------------------------


@dataclass(frozen=True, slots=True)
class VerifiedResult:
    """A verified answer to one request entry. ``observations`` and
    ``valid_until`` come from the signed statement; they are empty and None
    when the notary sent none (``unknown``, ``unreachable``, ``refused``
    without history)."""

    target: Target
    verdict: str
    observations: tuple[StatementObservation, ...]
    valid_until: int | None


def _verify(public_key: Ed25519PublicKey, data: bytes, signature_b64: str) -> bool:
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
    """The results of ``parsed`` once every check passes, in request order.

    Checks, in order: the answer's key id is in ``public_keys`` and its
    signature is valid; the answer's nonce equals ``nonce`` (None when the
    request had none); when ``max_answer_age_s`` is given, the answer's
    ``signed_at`` is within that many seconds of ``now`` (either way); each
    statement's key id is known and its signature valid; each result naming
    a ``statement_signature`` has a statement with that signature, for its
    target, with ``valid_until >= now``; ``match``/``mismatch`` come with a
    statement. With ``queries`` (the request sent), the results must answer
    exactly those targets in order, and a ``match`` must be backed by a
    stated observation with the submitted hashes. Statements no result names
    are ignored.

    Error handling: raises :class:`VerificationError` (502) naming the
    failed check; never returns a partially verified list.
    """
    envelope_key = public_keys.get(parsed.key_id)
    if envelope_key is None:
        raise VerificationError("answer signed with an unknown key id")
    if not _verify(envelope_key, parsed.signed_bytes, parsed.signature):
        raise VerificationError("bad answer signature")
    if parsed.nonce != nonce:
        raise VerificationError("wrong nonce")
    if max_answer_age_s is not None and abs(now - parsed.signed_at) > max_answer_age_s:
        raise VerificationError("answer signed too long ago (or in the future)")
    by_signature: dict[str, ParsedStatement] = {}
    for stated in parsed.statements:
        statement_key = public_keys.get(stated.key_id)
        if statement_key is None:
            raise VerificationError(f"statement for {stated.target} has an unknown key id")
        if not _verify(statement_key, stated.signed_bytes, stated.signature):
            raise VerificationError(f"bad statement signature for {stated.target}")
        by_signature[stated.signature] = stated
    if queries is not None and [q.target for q in queries] != [r.target for r in parsed.results]:
        raise VerificationError("results do not answer the targets asked, in order")
    verified = []
    for index, result in enumerate(parsed.results):
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
        if queries is not None and result.verdict == VERDICT_MATCH:
            query = queries[index]
            assert stated is not None  # match without statement refused above
            if not any(
                (query.sha256 is None or o.sha256 == query.sha256)
                and (query.sha1 is None or o.sha1 == query.sha1)
                for o in stated.observations
            ):
                raise VerificationError(f"match for {result.target} not backed by its statement")
        verified.append(
            VerifiedResult(
                target=result.target,
                verdict=result.verdict,
                observations=stated.observations if stated is not None else (),
                valid_until=stated.valid_until if stated is not None else None,
            )
        )
    return verified


# -- keys (S4, GET /v2/key) --------------------------------------------------------


def key_id_of(public_raw: bytes) -> str:
    """The key id of a raw 32-byte Ed25519 public key (S4): the first 16
    lower-case hex characters of its SHA-256."""
    return hashlib.sha256(public_raw).hexdigest()[:KEY_ID_CHARS]


@dataclass(frozen=True, slots=True)
class PublishedKey:
    """One signing key of the notary, valid from ``not_before`` to
    ``not_after`` (Unix seconds, inclusive)."""

    key_id: str
    public_key_raw: bytes
    not_before: int
    not_after: int

    def public_key(self) -> Ed25519PublicKey:
        return Ed25519PublicKey.from_public_bytes(self.public_key_raw)

    def is_valid_at(self, now: int) -> bool:
        return self.not_before <= now <= self.not_after


def publish_key(public_raw: bytes, *, not_before: int, not_after: int) -> PublishedKey:
    """A :class:`PublishedKey` with its key id computed (S4).

    Raises ``ValueError`` unless ``public_raw`` is 32 bytes and the times
    are integers with ``0 <= not_before <= not_after <= 2**53 - 1``.
    """
    if not isinstance(public_raw, bytes) or len(public_raw) != ED25519_PUBLIC_KEY_BYTES:
        raise ValueError("an Ed25519 public key is 32 bytes")
    if not (
        _is_int(not_before)
        and _is_int(not_after)
        and 0 <= not_before <= not_after <= MAX_SAFE_INTEGER
    ):
        raise ValueError("need integers 0 <= not_before <= not_after")
    return PublishedKey(key_id_of(public_raw), public_raw, not_before, not_after)


def key_document(keys: Sequence[PublishedKey]) -> bytes:
    """The ``GET /v2/key`` body, in canonical JSON::

        {"type": "notary.v2.keys", "keys": [{"algorithm": "ed25519",
          "key_id": KEYID, "public_key": B64 (raw 32 bytes),
          "not_before": INT, "not_after": INT}, ...]}

    It is not signed: clients fetch it over authenticated HTTPS or from the
    bundle, and trust each key for its validity period.
    """
    return canonical_json(
        {
            "type": KEYS_TYPE,
            "keys": [
                {
                    "algorithm": KEY_ALGORITHM,
                    "key_id": key.key_id,
                    "public_key": base64.b64encode(key.public_key_raw).decode("ascii"),
                    "not_before": key.not_before,
                    "not_after": key.not_after,
                }
                for key in keys
            ],
        }
    )


_KEY_DOCUMENT_KEYS = frozenset({"type", "keys"})
_PUBLISHED_KEY_KEYS = frozenset({"algorithm", "key_id", "public_key", "not_before", "not_after"})


def _bad_keys(message: str) -> ProtocolError:
    return ProtocolError(f"malformed v2 key document: {message}", status=502)


def parse_key_document(data: bytes) -> tuple[PublishedKey, ...]:
    """The keys of a ``GET /v2/key`` body, in document order.

    Error handling: ``ProtocolError`` 502 for any defect: not strict UTF-8
    JSON, too large, a missing or unknown field, another algorithm, a public
    key that is not 32 bytes of base64 or not an Ed25519 key, a key id that
    is not the key's (S4), a repeated key id, ``not_after < not_before``,
    more than :data:`MAX_PUBLISHED_KEYS` keys. Never another exception.
    """
    if not isinstance(data, bytes | bytearray) or len(data) > MAX_KEY_DOCUMENT_BYTES:
        raise _bad_keys("not bytes or too large")
    try:
        document = _loads(data)
    except ValueError:
        raise _bad_keys("not strict UTF-8 JSON") from None
    if not isinstance(document, dict) or document.keys() != _KEY_DOCUMENT_KEYS:
        raise _bad_keys("must be an object with type, keys")
    if document["type"] != KEYS_TYPE:
        raise _bad_keys(f"type must be {KEYS_TYPE}")
    rows = document["keys"]
    if not isinstance(rows, list) or len(rows) > MAX_PUBLISHED_KEYS:
        raise _bad_keys(f"keys must be an array of at most {MAX_PUBLISHED_KEYS}")
    keys: list[PublishedKey] = []
    for index, row in enumerate(rows):
        where = f"keys[{index}]"
        if not isinstance(row, dict) or row.keys() != _PUBLISHED_KEY_KEYS:
            raise _bad_keys(f"{where} must have {', '.join(sorted(_PUBLISHED_KEY_KEYS))}")
        if row["algorithm"] != KEY_ALGORITHM:
            raise _bad_keys(f"{where}.algorithm must be {KEY_ALGORITHM}")
        encoded = row["public_key"]
        try:
            if not isinstance(encoded, str) or len(encoded) > 64:
                raise ValueError
            raw = base64.b64decode(encoded, validate=True)
            key = publish_key(raw, not_before=row["not_before"], not_after=row["not_after"])
            key.public_key()
        except (binascii.Error, ValueError, TypeError):
            raise _bad_keys(f"{where} is not a valid Ed25519 key with its validity") from None
        if row["key_id"] != key.key_id:
            raise _bad_keys(f"{where}.key_id is not the id of its key")
        if any(k.key_id == key.key_id for k in keys):
            raise _bad_keys(f"{where} repeats a key")
        keys.append(key)
    return tuple(keys)


def trusted_keys(keys: Iterable[PublishedKey], *, now: int) -> dict[str, Ed25519PublicKey]:
    """The ``public_keys`` argument of :func:`verify_answer`: the keys of
    ``keys`` valid at ``now``, by key id."""
    return {key.key_id: key.public_key() for key in keys if key.is_valid_at(now)}


def verify_statement(
    entry: object, public_keys: Mapping[str, Ed25519PublicKey], *, now: int
) -> ParsedStatement:
    """A pushed statement (``{"signature": ..., "statement": {...}}``, as in
    WebSocket ``observation`` events) parsed and verified: known key, valid
    signature over its canonical bytes, not expired.

    Error handling: ``ProtocolError`` 502 when malformed;
    ``VerificationError`` when it does not verify or has expired.
    """
    parsed = _parse_statement(0, entry)
    key = public_keys.get(parsed.key_id)
    if key is None:
        raise VerificationError(f"statement signed by unknown key {parsed.key_id}")
    if not _verify(key, parsed.signed_bytes, parsed.signature):
        raise VerificationError("statement signature does not verify")
    if parsed.valid_until < now:
        raise VerificationError("statement has expired")
    return parsed
