"""The client side: taking apart an answer document from any notary, without
verifying it (docs/v2.md, "Parsing an answer"), a statement's
``verification`` object (rule S6) and ``consistency`` (rule S8) included.
Every defect is a ``ProtocolError`` 502."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from notary.errors import BadTarget, ProtocolError
from notary.model.consistency import Consistency, ConsistencyKind, summarise
from notary.model.dane import Tlsa
from notary.model.targets import Target, make_target
from notary.protocol.strictjson import loads
from notary.protocol.v2.canonical import MAX_SAFE_INTEGER, canonical_json, is_json_int
from notary.protocol.v2.constants import (
    ANSWER_TYPE,
    BASE64_RE,
    ED25519_SIGNATURE_BYTES,
    LOWER_HEX_RE,
    MATCHED_BY,
    MAX_CONSISTENCY_ADDRESSES,
    MAX_STATEMENT_OBSERVATIONS,
    SHA1_BYTES,
    SHA256_BYTES,
    STATEMENT_TYPE,
    VERDICT_MATCH,
    VERDICTS,
)
from notary.protocol.v2.evidence import (
    BACKENDS,
    DANE_OUTCOMES,
    DNSSEC_STATUSES,
    MAX_STATEMENT_JUDGED,
    MAX_STATEMENT_TLSA,
)

#: Most addresses per observation a client accepts.
MAX_ADDRESSES = 64
#: Largest answer document a client parses.
MAX_ANSWER_BYTES = 16 * 1024 * 1024
#: Most results a client accepts in one answer.
MAX_ANSWER_RESULTS = 4096

_ANSWER_DOCUMENT_KEYS = frozenset({"answer", "signature", "statements"})
_ENVELOPE_KEYS = frozenset({"type", "nonce", "signed_at", "key_id", "results"})
_RESULT_KEYS = frozenset({"target", "verdict", "statement_signature"})
#: A result may also say its match is by key (``matched_by``, rules S2, V6).
_MATCHED_BY_RESULT_KEYS = _RESULT_KEYS | {"matched_by"}
_STATEMENT_ENTRY_KEYS = frozenset({"statement", "signature"})
_STATEMENT_KEYS = frozenset(
    {"type", "target", "observations", "signed_at", "valid_until", "key_id"}
)
_OBSERVATION_KEYS = frozenset(
    {"sha256", "spki_sha256", "sha1", "first_seen", "last_seen", "addresses"}
)
#: A statement may also carry ``verification`` (rule S6), ``log`` (S7) and
#: ``consistency`` (S8).
_OPTIONAL_STATEMENT_KEYS = frozenset({"verification", "log", "consistency"})
_CONSISTENCY_KEYS = frozenset({"kind", "addresses", "current"})
_CONSISTENCY_KINDS = frozenset(kind.value for kind in ConsistencyKind)
_LOG_PROMISE_KEYS = frozenset({"origin", "merge_by"})
#: An entry may also carry its ``inclusion`` in the notary's log (rule S7).
_LOGGED_ENTRY_KEYS = _STATEMENT_ENTRY_KEYS | {"inclusion"}
_INCLUSION_KEYS = frozenset({"checkpoint", "index", "proof"})
#: Hashes in an inclusion proof, at most (a tree of 2**63 leaves needs 63).
MAX_PROOF_HASHES = 63
#: A checkpoint's signed note in an ``inclusion``, at most, in UTF-8 bytes
#: (what a client keeps of it, ``notary.client.checkpoints``, is bounded by
#: the same constant).
MAX_CHECKPOINT_BYTES = 8192
_VERIFICATION_KEYS = frozenset({"backend", "dane"})
_DANE_KEYS = frozenset({"outcome", "dnssec", "checked_at", "sha256", "tlsa", "matched"})
#: The evidence may also judge the other certificates of the current set
#: (``judged``, rule S6), each ``{"sha256": ..., "matched": ...}``, on a
#: match or a mismatch only.
_JUDGED_DANE_KEYS = _DANE_KEYS | {"judged"}
_JUDGED_KEYS = frozenset({"sha256", "matched"})
_JUDGING_OUTCOMES = frozenset({"match", "mismatch"})
#: The DNSSEC status each DANE outcome comes from (``notary.model.dane.verdict``).
#: The outcomes whose evidence may judge no certificate (``sha256`` null):
#: DNSSEC failed before a probe saw one.
_UNJUDGED_OUTCOMES = frozenset({"bogus", "resolver-failure"})
_OUTCOME_STATUSES = {
    "match": frozenset({"secure"}),
    "mismatch": frozenset({"secure"}),
    "no-tlsa": frozenset({"secure", "secure-denial"}),
    "insecure": frozenset({"insecure"}),
    "bogus": frozenset({"bogus"}),
    "resolver-failure": frozenset({"resolver-failure"}),
}


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
class ParsedJudgement:
    """One entry of a DANE evidence's ``judged`` (rule S6): another
    certificate of the current set (``sha256``) and the index in ``tlsa``
    of the record that vouches for it (``matched``; None: none does)."""

    sha256: bytes
    matched: int | None


@dataclass(frozen=True, slots=True)
class ParsedDane:
    """A statement's DANE evidence (rule S6): the ``outcome`` and the
    ``dnssec`` status of the TLSA lookup (``notary.model.dane``'s values),
    when it was made (``checked_at``, Unix seconds), the certificate judged
    (``sha256``: the probed leaf, the main one when several were; None for
    ``bogus`` and ``resolver-failure`` when DNSSEC failed before a probe
    saw one), the validated records (``tlsa``, empty unless ``dnssec`` is
    ``secure``), the index in ``tlsa`` of the record that vouched
    (``matched``; set exactly when ``outcome`` is ``match``) and the other
    certificates judged (``judged``; empty when the statement has none)."""

    outcome: str
    dnssec: str
    checked_at: int
    sha256: bytes | None
    tlsa: tuple[Tlsa, ...]
    matched: int | None
    judged: tuple[ParsedJudgement, ...] = ()

    @property
    def matched_record(self) -> Tlsa | None:
        """The record that vouched (None unless ``outcome`` is ``match``)."""
        return None if self.matched is None else self.tlsa[self.matched]

    def record_for(self, sha256: bytes) -> Tlsa | None:
        """The record this evidence says vouches for the certificate whose
        SHA-256 is ``sha256``: the main one's, or a ``judged`` one's; None
        when it says none does, or says nothing of that certificate."""
        if self.outcome != "match":
            return None
        if sha256 == self.sha256:
            return self.matched_record
        for judgement in self.judged:
            if judgement.sha256 == sha256:
                return None if judgement.matched is None else self.tlsa[judgement.matched]
        return None

    def vouches_for(self, sha256: bytes) -> bool:
        """Whether this evidence says a record vouches for ``sha256``."""
        return self.record_for(sha256) is not None


@dataclass(frozen=True, slots=True)
class ParsedVerification:
    """A statement's ``verification`` (rule S6): which backend decided the
    answer (``"dane"`` or ``"perspective"``) and the DANE evidence (None:
    no DANE check was made)."""

    backend: str
    dane: ParsedDane | None


@dataclass(frozen=True, slots=True)
class ParsedStatement:
    """A statement from an answer document, not yet verified; ``signed_bytes``
    is its canonical re-encoding, what ``signature`` must cover (the
    ``verification`` object included). ``verification`` is None when the
    notary sent none (it verifies by network perspective alone)."""

    target: Target
    observations: tuple[StatementObservation, ...]
    signed_at: int
    valid_until: int
    key_id: str
    signature: str
    signed_bytes: bytes
    verification: ParsedVerification | None = None
    #: The log's promise (rule S7; None: the notary keeps no log).
    log: ParsedLogPromise | None = None
    #: The proof that the log has the statement (None: not yet, or no log).
    inclusion: ParsedInclusion | None = None
    #: The statement's log entry: its answer-document entry as signed,
    #: ``{"signature":...,"statement":...}`` in canonical form.
    entry_bytes: bytes = b""
    #: The consistency of the target's current set (rule S8; None: the
    #: notary sent none, as notaries before S8 and statements without
    #: observations). Checked against ``observations``, not yet verified.
    consistency: Consistency | None = None


@dataclass(frozen=True, slots=True)
class ParsedLogPromise:
    """A statement's ``log`` member: in the log ``origin`` by ``merge_by``."""

    origin: str
    merge_by: int


@dataclass(frozen=True, slots=True)
class ParsedInclusion:
    """An entry's ``inclusion``: its index, the RFC 9162 proof, and the
    signed checkpoint (note text) the proof leads to, none verified yet."""

    checkpoint: str
    index: int
    proof: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class ParsedResult:
    """One result of an envelope, not yet verified; ``matched_by`` is
    ``"spki"`` for a match by the submitted key alone (rule V6), else None."""

    target: Target
    verdict: str
    statement_signature: str | None
    matched_by: str | None = None


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


def parse_answer_document(data: bytes) -> ParsedAnswer:
    """Take apart an answer document (rule S5) without verifying it (that is
    :func:`notary.protocol.v2.verify_answer`): check its shape and rebuild
    the canonical bytes each signature covers.

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
        document = loads(data)
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
        statements=tuple(
            parse_statement_entry(index, entry) for index, entry in enumerate(entries)
        ),
    )


def parse_statement_entry(index: int, entry: object) -> ParsedStatement:
    """Entry ``index`` of an answer document's ``statements`` (``{"signature":
    ..., "statement": {...}}``), not verified; ``ProtocolError`` 502 when
    malformed."""
    where = f"statements[{index}]"
    logged = isinstance(entry, dict) and "inclusion" in entry
    entry = _object(entry, _LOGGED_ENTRY_KEYS if logged else _STATEMENT_ENTRY_KEYS, where)
    signature = _signature_field(entry, "signature", where)
    inclusion = _parse_inclusion(f"{where}.inclusion", entry["inclusion"]) if logged else None
    entry_where = where
    where += ".statement"
    body = entry["statement"]
    if isinstance(body, dict):
        body = _object(body, _STATEMENT_KEYS | (body.keys() & _OPTIONAL_STATEMENT_KEYS), where)
    else:
        body = _object(body, _STATEMENT_KEYS, where)
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
    observations = tuple(
        _parse_observation(f"{where}.observations[{i}]", row) for i, row in enumerate(rows)
    )
    return ParsedStatement(
        target=_target_field(body, "target", where),
        observations=observations,
        consistency=(
            _parse_consistency(f"{where}.consistency", body["consistency"], observations)
            if "consistency" in body else None
        ),
        signed_at=signed_at,
        valid_until=valid_until,
        key_id=_str_field(body, "key_id", where),
        signature=signature,
        verification=(
            _parse_verification(f"{where}.verification", body["verification"])
            if "verification" in body else None
        ),
        signed_bytes=_signed_bytes(body, where),
        log=_parse_log_promise(f"{where}.log", body["log"]) if "log" in body else None,
        inclusion=inclusion,
        entry_bytes=_signed_bytes(
            {"signature": signature, "statement": body}, entry_where
        ),
    )


def _parse_log_promise(where: str, value: object) -> ParsedLogPromise:
    promise = _object(value, _LOG_PROMISE_KEYS, where)
    return ParsedLogPromise(
        origin=_str_field(promise, "origin", where),
        merge_by=_int_field(promise, "merge_by", where),
    )


def _parse_inclusion(where: str, value: object) -> ParsedInclusion:
    inclusion = _object(value, _INCLUSION_KEYS, where)
    checkpoint = _str_field(inclusion, "checkpoint", where)
    # A character is at least one byte: the cheap check first.
    if (
        len(checkpoint) > MAX_CHECKPOINT_BYTES
        or len(checkpoint.encode("utf-8", "surrogatepass")) > MAX_CHECKPOINT_BYTES
    ):
        raise _bad_answer(f"{where}.checkpoint is longer than {MAX_CHECKPOINT_BYTES} bytes")
    index = _int_field(inclusion, "index", where)
    if index < 0:
        raise _bad_answer(f"{where}.index must not be negative")
    nodes = inclusion["proof"]
    if not isinstance(nodes, list) or len(nodes) > MAX_PROOF_HASHES:
        raise _bad_answer(f"{where}.proof must be an array of at most {MAX_PROOF_HASHES} hashes")
    proof = []
    for node in nodes:
        decoded = _base64_hash(node)
        if decoded is None:
            raise _bad_answer(f"{where}.proof holds something other than base64 SHA-256 hashes")
        proof.append(decoded)
    return ParsedInclusion(checkpoint, index, tuple(proof))


def _base64_hash(value: object) -> bytes | None:
    if not isinstance(value, str) or len(value) != 44:
        return None
    try:
        decoded = base64.b64decode(value, validate=True)
    except ValueError:
        return None
    return decoded if len(decoded) == 32 else None


def _parse_result(index: int, row: object) -> ParsedResult:
    where = f"answer.results[{index}]"
    by_key = isinstance(row, dict) and "matched_by" in row
    row = _object(row, _MATCHED_BY_RESULT_KEYS if by_key else _RESULT_KEYS, where)
    verdict = row["verdict"]
    if not isinstance(verdict, str) or verdict not in VERDICTS:
        raise _bad_answer(f"{where}.verdict is not a known verdict")
    matched_by = None
    if by_key:
        matched_by = _name_field(row, "matched_by", MATCHED_BY, where)
        if verdict != VERDICT_MATCH:
            raise _bad_answer(f"{where}.matched_by is only for a match")
    signature = row["statement_signature"]
    return ParsedResult(
        _target_field(row, "target", where),
        verdict,
        None if signature is None else _signature_field(row, "statement_signature", where),
        matched_by,
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


def _parse_consistency(
    where: str, value: object, observations: tuple[StatementObservation, ...]
) -> Consistency:
    """Rule S8: ``{"kind": ..., "addresses": [...], "current": [...]}``,
    well formed and the one the statement's own observations give: the
    current set is its first ``len(current)`` observations (they are in
    ``last_seen`` order, newest first), and ``kind`` and ``addresses`` are
    what their addresses make of it (``notary.model.consistency.summarise``,
    the first :data:`MAX_CONSISTENCY_ADDRESSES` addresses)."""
    value = _object(value, _CONSISTENCY_KEYS, where)
    kind = _name_field(value, "kind", _CONSISTENCY_KINDS, where)
    addresses = value["addresses"]
    if (
        not isinstance(addresses, list)
        or len(addresses) > MAX_CONSISTENCY_ADDRESSES
        or not all(isinstance(a, str) for a in addresses)
    ):
        raise _bad_answer(
            f"{where}.addresses must be an array of at most {MAX_CONSISTENCY_ADDRESSES} strings"
        )
    rows = value["current"]
    if not isinstance(rows, list) or not 1 <= len(rows) <= MAX_STATEMENT_OBSERVATIONS:
        raise _bad_answer(
            f"{where}.current must be an array of 1 to {MAX_STATEMENT_OBSERVATIONS} hashes"
        )
    current = []
    for row in rows:
        if not isinstance(row, str) or len(row) != 2 * SHA256_BYTES or not LOWER_HEX_RE.fullmatch(
            row
        ):
            raise _bad_answer(f"{where}.current must hold {2 * SHA256_BYTES} lower-case hex digits")
        current.append(bytes.fromhex(row))
    stated = observations[: len(current)]
    if [o.sha256 for o in stated] != current:
        raise _bad_answer(f"{where}.current is not the statement's first observations")
    expected = summarise((o.sha256, o.addresses) for o in stated)
    if (
        kind != expected.kind.value
        or tuple(addresses) != expected.addresses[:MAX_CONSISTENCY_ADDRESSES]
    ):
        raise _bad_answer(f"{where} does not agree with the statement's observations")
    return Consistency(ConsistencyKind(kind), tuple(addresses), tuple(current))


def _parse_verification(where: str, value: object) -> ParsedVerification:
    """Rule S6: ``{"backend": ..., "dane": null | {...}}``."""
    value = _object(value, _VERIFICATION_KEYS, where)
    backend = _name_field(value, "backend", BACKENDS, where)
    dane = value["dane"]
    return ParsedVerification(
        backend=backend, dane=None if dane is None else _parse_dane(f"{where}.dane", dane)
    )


def _parse_dane(where: str, value: object) -> ParsedDane:
    judging = isinstance(value, dict) and "judged" in value
    value = _object(value, _JUDGED_DANE_KEYS if judging else _DANE_KEYS, where)
    outcome = _name_field(value, "outcome", DANE_OUTCOMES, where)
    dnssec = _name_field(value, "dnssec", DNSSEC_STATUSES, where)
    if dnssec not in _OUTCOME_STATUSES[outcome]:
        raise _bad_answer(f"{where}.outcome {outcome} cannot come from DNSSEC status {dnssec}")
    rows = value["tlsa"]
    if not isinstance(rows, list) or len(rows) > MAX_STATEMENT_TLSA:
        raise _bad_answer(f"{where}.tlsa must be an array of at most {MAX_STATEMENT_TLSA}")
    if rows and dnssec != "secure":
        raise _bad_answer(f"{where}.tlsa must be empty unless dnssec is secure")
    tlsa = tuple(_tlsa(f"{where}.tlsa[{i}]", row) for i, row in enumerate(rows))
    matched = value["matched"]
    if outcome == "match":
        if not is_json_int(matched) or not 0 <= matched < len(tlsa):
            raise _bad_answer(f"{where}.matched must be an index into tlsa for a match")
        if not tlsa[matched].usable:
            raise _bad_answer(f"{where}.matched names an unusable record")
    elif matched is not None:
        raise _bad_answer(f"{where}.matched must be null unless outcome is match")
    sha256 = None
    if value["sha256"] is not None or outcome not in _UNJUDGED_OUTCOMES:
        sha256 = _hex_field(value, "sha256", SHA256_BYTES, where)
    return ParsedDane(
        outcome=outcome,
        dnssec=dnssec,
        checked_at=_int_field(value, "checked_at", where),
        sha256=sha256,
        tlsa=tlsa,
        matched=matched,
        judged=(
            _parse_judged(f"{where}.judged", value["judged"], outcome, sha256, tlsa)
            if judging else ()
        ),
    )


def _parse_judged(
    where: str, rows: object, outcome: str, main: bytes | None, tlsa: tuple[Tlsa, ...]
) -> tuple[ParsedJudgement, ...]:
    """Rule S6's ``judged``: on a match or a mismatch only, 1 to
    ``MAX_STATEMENT_JUDGED`` entries in ascending ``sha256`` order, none of
    them the main certificate, each ``matched`` null or the index of a
    usable record (null on a mismatch: it vouches for none of them)."""
    if outcome not in _JUDGING_OUTCOMES:
        raise _bad_answer(f"{where} is only for a match or a mismatch")
    if not isinstance(rows, list) or not 1 <= len(rows) <= MAX_STATEMENT_JUDGED:
        raise _bad_answer(f"{where} must be an array of 1 to {MAX_STATEMENT_JUDGED} entries")
    judged: list[ParsedJudgement] = []
    for index, row in enumerate(rows):
        here = f"{where}[{index}]"
        row = _object(row, _JUDGED_KEYS, here)
        sha256 = _hex_field(row, "sha256", SHA256_BYTES, here)
        if sha256 == main:
            raise _bad_answer(f"{here}.sha256 is the main certificate's")
        if judged and sha256 <= judged[-1].sha256:
            raise _bad_answer(f"{where} must be in ascending sha256 order, each once")
        matched = row["matched"]
        if matched is not None:
            if outcome != "match":
                raise _bad_answer(f"{here}.matched must be null on a mismatch")
            if not is_json_int(matched) or not 0 <= matched < len(tlsa):
                raise _bad_answer(f"{here}.matched must be null or an index into tlsa")
            if not tlsa[matched].usable:
                raise _bad_answer(f"{here}.matched names an unusable record")
        judged.append(ParsedJudgement(sha256, matched))
    return tuple(judged)


def _tlsa(where: str, value: object) -> Tlsa:
    """A TLSA record as the notary writes it: ``"3 1 1 <lower-case hex>"``."""
    if not isinstance(value, str):
        raise _bad_answer(f"{where} must be a string")
    try:
        record = Tlsa.parse(value)
    except ValueError:
        raise _bad_answer(f"{where} is not a TLSA record") from None
    if str(record) != value:
        raise _bad_answer(f"{where} is not a TLSA record in its normalised form")
    return record


# -- field checks: each returns the field's value or raises ProtocolError 502 ------


def _bad_answer(message: str) -> ProtocolError:
    return ProtocolError(f"malformed v2 answer: {message}", status=502)


def _object(value: object, keys: frozenset[str], where: str) -> dict[str, Any]:
    if not isinstance(value, dict) or value.keys() != keys:
        raise _bad_answer(f"{where} must be an object with {', '.join(sorted(keys))}")
    return value


def _int_field(obj: Mapping[str, Any], name: str, where: str) -> int:
    value = obj[name]
    if not is_json_int(value) or not 0 <= value <= MAX_SAFE_INTEGER:
        raise _bad_answer(f"{where}.{name} must be a non-negative integer")
    return value


def _str_field(obj: Mapping[str, Any], name: str, where: str) -> str:
    value = obj[name]
    if not isinstance(value, str):
        raise _bad_answer(f"{where}.{name} must be a string")
    return value


def _name_field(obj: Mapping[str, Any], name: str, names: frozenset[str], where: str) -> str:
    value = obj[name]
    if not isinstance(value, str) or value not in names:
        raise _bad_answer(f"{where}.{name} must be one of {', '.join(sorted(names))}")
    return value


def _signature_field(obj: Mapping[str, Any], name: str, where: str) -> str:
    value = _str_field(obj, name, where)
    if len(value) > 2 * ED25519_SIGNATURE_BYTES or not BASE64_RE.fullmatch(value):
        raise _bad_answer(f"{where}.{name} must be base64")
    return value


def _hex_field(obj: Mapping[str, Any], name: str, size: int, where: str) -> bytes:
    value = _str_field(obj, name, where)
    if len(value) != 2 * size or not LOWER_HEX_RE.fullmatch(value):
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
    """The canonical bytes a signature over ``value`` covers (rule C7)."""
    try:
        return canonical_json(value)
    except (TypeError, ValueError):
        raise _bad_answer(f"{where} has no canonical form") from None
