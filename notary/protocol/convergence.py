"""Convergence protocol v1 (PROTOCOLS.md section 1): fingerprints, request
bodies, the exact answer bytes, and the decision rules.

Sans-IO: no sockets, no clock. ``now`` is always a parameter.

Invariants
1. Answer bytes are ``{"fingerprintList": [ENTRY, ...], "signature": "<b64>"}``
   with Python ``json.dumps`` default separators, keys in the order
   ``timestamp`` (``start``, ``finish``) then ``fingerprint``, timestamps as
   strings of whole seconds, entries by ``finish`` descending, no newline.
2. The signed bytes are the same object without ``signature``.
3. Fingerprints are emitted upper case; accepted in either case.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from urllib.parse import parse_qsl, unquote

from notary.errors import ProtocolError
from notary.model.observations import Observation, Timeline
from notary.model.targets import Target, parse_convergence_target
from notary.protocol import strictjson
from notary.protocol.hotpath import ConvergenceQueries, plain_form_fingerprint

SHA1_BYTES = 20
FINGERPRINT_CHARS = SHA1_BYTES * 3 - 1  # 59: "AA:" * 19 + "AA"
#: A form body carries one fingerprint; anything much larger is not ours.
MAX_FORM_BODY_BYTES = 1024
MAX_FORM_FIELDS = 8

CONTENT_TYPE = b"application/json"

_FINGERPRINT_RE = re.compile(r"[0-9A-Fa-f]{2}(?::[0-9A-Fa-f]{2}){19}")


def format_fingerprint(digest: bytes) -> str:
    """``digest`` as upper-case hex pairs joined by ``:``."""
    return digest.hex(":").upper()


def parse_fingerprint(text: str) -> bytes:
    """Parse ``AA:BB:...`` (20 pairs, either case) into 20 bytes.

    Raises ``ProtocolError`` (400) for anything else.
    """
    if len(text) != FINGERPRINT_CHARS or not _FINGERPRINT_RE.fullmatch(text):
        raise ProtocolError("fingerprint must be 20 hex pairs separated by colons")
    return bytes.fromhex(text.replace(":", ""))


def parse_fingerprint_form(body: bytes) -> bytes:
    """The fingerprint of a POST body ``fingerprint=<FP>``
    (application/x-www-form-urlencoded; the legacy client leaves colons
    unencoded, others send ``%3A``).

    Raises ``ProtocolError`` (400) when the body is too large, not a form, or
    has no single valid fingerprint field.
    """
    fingerprint = plain_form_fingerprint(body)
    if fingerprint is not None:
        return fingerprint
    return _parse_fingerprint_form_slowly(body)


def _parse_fingerprint_form_slowly(body: bytes) -> bytes:
    """``parse_fingerprint_form`` for any body (the general form parser)."""
    if len(body) > MAX_FORM_BODY_BYTES:
        raise ProtocolError("request body too large", status=413)
    try:
        text = body.decode("ascii")
        fields = parse_qsl(text, keep_blank_values=True, max_num_fields=MAX_FORM_FIELDS)
    except (UnicodeDecodeError, ValueError):
        raise ProtocolError("body must be a form with a fingerprint field") from None
    values = [value for name, value in fields if name == "fingerprint"]
    if not values:
        raise ProtocolError("missing fingerprint")
    if len(values) > 1:
        raise ProtocolError("more than one fingerprint")
    return parse_fingerprint(values[0].strip())


def parse_target_segment(segment: bytes) -> Target:
    """The target named by a raw ``host+port`` path segment (percent-encoded
    UTF-8); ``ProtocolError`` (400) when it names none."""
    try:
        text = unquote(segment.decode("ascii"), errors="strict")
    except (UnicodeDecodeError, ValueError):
        raise ProtocolError("target is not valid percent-encoded UTF-8") from None
    return parse_convergence_target(text)


def query_parser(*, prefix: bytes, max_target_bytes: int, max_entries: int) -> ConvergenceQueries:
    """The parser of ``<prefix><host>+<port>[/<ip>]`` queries (the target
    and, for ``POST``, the fingerprint form), with a memo of at most
    ``max_entries`` targets; its ``parse(method, path, body)`` raises
    ``ProtocolError`` (414 for a target over ``max_target_bytes``)."""
    return ConvergenceQueries(
        prefix=prefix, max_target_bytes=max_target_bytes, max_entries=max_entries,
        parse_segment=parse_target_segment, parse_form=_parse_fingerprint_form_slowly,
    )


# -- answer bytes ---------------------------------------------------------------

_ENTRY = '{"timestamp": {"start": "%d", "finish": "%d"}, "fingerprint": "%s"}'


@dataclass(frozen=True, slots=True)
class ListEntry:
    """One row of ``fingerprintList``."""

    sha1: bytes
    start: int
    finish: int


def entries_of(timeline: Timeline) -> list[ListEntry]:
    """The rows of ``timeline``, ordered by ``finish`` descending."""
    return sorted(
        (_entry(observation) for observation in timeline.observations),
        key=lambda entry: entry.finish,
        reverse=True,
    )


def _entry(observation: Observation) -> ListEntry:
    return ListEntry(observation.certificate.sha1, observation.first_seen, observation.last_seen)


def signed_payload(entries: Iterable[ListEntry]) -> bytes:
    """The bytes a notary signs: ``{"fingerprintList": [...]}`` (invariant 1, 2)."""
    rows = ", ".join(
        _ENTRY % (entry.start, entry.finish, format_fingerprint(entry.sha1)) for entry in entries
    )
    return ('{"fingerprintList": [' + rows + "]}").encode("ascii")


def answer_body(payload: bytes, signature_b64: str) -> bytes:
    """The wire body: ``payload`` with its final ``}`` replaced by
    ``, "signature": "<b64>"}``."""
    if not payload.endswith(b"}"):
        raise ValueError("payload must be a JSON object")
    return payload[:-1] + b', "signature": "' + signature_b64.encode("ascii") + b'"}'


@dataclass(frozen=True, slots=True)
class ParsedAnswer:
    """A Convergence answer body taken apart for verification."""

    entries: tuple[ListEntry, ...]
    payload: bytes
    signature_b64: str


#: Largest answer body a client parses (``notary check`` reads no more).
MAX_ANSWER_BYTES = 1024 * 1024
#: Longest signature: base64 of an 8192-bit RSA signature.
MAX_SIGNATURE_CHARS = 1368
#: Longest timestamp string: whole Unix seconds fit in 12 digits until
#: the year 33658.
MAX_TIMESTAMP_DIGITS = 12

_ANSWER_KEYS = frozenset({"fingerprintList", "signature"})
_ROW_KEYS = frozenset({"timestamp", "fingerprint"})
_TIMESTAMP_KEYS = frozenset({"start", "finish"})
_TIMESTAMP_RE = re.compile(rf"[0-9]{{1,{MAX_TIMESTAMP_DIGITS}}}")
_BASE64_RE = re.compile(r"[A-Za-z0-9+/]+={0,2}")


def _bad_answer(message: str) -> ProtocolError:
    return ProtocolError(f"malformed notary answer: {message}", status=502)


def _exact_object(value: object, keys: frozenset[str], where: str) -> dict[str, object]:
    if not isinstance(value, dict) or value.keys() != keys:
        raise _bad_answer(f"{where} must be an object with {', '.join(sorted(keys))}")
    return value


def _timestamp(value: object, where: str) -> int:
    if not isinstance(value, str) or not _TIMESTAMP_RE.fullmatch(value):
        raise _bad_answer(f"{where} must be a string of up to {MAX_TIMESTAMP_DIGITS} digits")
    return int(value)


def _parse_row(index: int, row: object) -> ListEntry:
    where = f"fingerprintList[{index}]"
    row = _exact_object(row, _ROW_KEYS, where)
    stamps = _exact_object(row["timestamp"], _TIMESTAMP_KEYS, f"{where}.timestamp")
    start = _timestamp(stamps["start"], f"{where}.timestamp.start")
    finish = _timestamp(stamps["finish"], f"{where}.timestamp.finish")
    if finish < start:
        raise _bad_answer(f"{where}.timestamp.finish is before start")
    fingerprint = row["fingerprint"]
    if not isinstance(fingerprint, str) or not _FINGERPRINT_RE.fullmatch(fingerprint):
        raise _bad_answer(f"{where}.fingerprint must be 20 hex pairs separated by colons")
    return ListEntry(bytes.fromhex(fingerprint.replace(":", "")), start, finish)


def parse_answer(body: bytes) -> ParsedAnswer:
    """Parse an answer from any notary and rebuild the bytes it signed (drop
    ``signature``, re-serialise with default separators, key order kept).

    As strict as the v2 parsers, with the same loader
    (:mod:`notary.protocol.strictjson`): at most :data:`MAX_ANSWER_BYTES`,
    strict UTF-8 JSON without repeated keys, and exactly the shape of
    invariant 1: an object with ``fingerprintList`` and ``signature`` only;
    each row exactly ``{"timestamp": {"start", "finish"}, "fingerprint"}``;
    timestamps strings of digits (no sign, space, ``_`` or number), ``finish``
    not before ``start``; fingerprints of 20 hex pairs; the signature base64
    of at most :data:`MAX_SIGNATURE_CHARS`. Nothing is coerced, so the
    payload rebuilt is the one a valid signature covers.

    Error handling: ``ProtocolError`` (status 502: the notary misbehaved)
    with a short message naming the defect (never the input); never another
    exception, whatever ``body`` holds.
    """
    if not isinstance(body, bytes | bytearray):
        raise _bad_answer("not bytes")
    if len(body) > MAX_ANSWER_BYTES:
        raise _bad_answer("too large")
    try:
        document = strictjson.loads(body)
    except ValueError:
        raise _bad_answer("not strict UTF-8 JSON") from None
    document = _exact_object(document, _ANSWER_KEYS, "answer")
    rows = document["fingerprintList"]
    if not isinstance(rows, list):
        raise _bad_answer("fingerprintList must be an array")
    entries = tuple(_parse_row(index, row) for index, row in enumerate(rows))
    signature = document.pop("signature")
    if (
        not isinstance(signature, str)
        or len(signature) > MAX_SIGNATURE_CHARS
        or not _BASE64_RE.fullmatch(signature)
    ):
        raise _bad_answer(f"signature must be base64 of at most {MAX_SIGNATURE_CHARS} characters")
    payload = json.dumps(document).encode("ascii")
    return ParsedAnswer(entries, payload, signature)


# -- decisions ------------------------------------------------------------------


class Decision(Enum):
    """What to do with a query before any probe."""

    ANSWER = "answer"  # answer from what is known now
    PROBE = "probe"  # probe first, then decide with ``status_after_probe``


def decide(
    timeline: Timeline | None,
    fingerprint: bytes | None,
    *,
    now: int,
    fresh_for_s: int,
    reprobe_after_s: int,
) -> Decision:
    """Whether a query (``fingerprint`` None for GET) can be answered now.

    * a fingerprint observed within ``fresh_for_s`` is vouched for at once;
    * a GET with a fresh newest observation is answered at once;
    * a fingerprint that is unknown or stale needs a probe, unless the target
      was probed less than ``reprobe_after_s`` ago: that probe is the answer
      (so nobody can make the notary probe a target in a loop by submitting
      random fingerprints);
    * a target with no history always needs a probe.
    """
    if timeline is None or timeline.newest is None:
        return Decision.PROBE
    newest = timeline.newest
    if fingerprint is None:
        return Decision.ANSWER if newest.is_fresh(now, fresh_for_s) else Decision.PROBE
    seen = timeline.find_sha1(fingerprint)
    if seen is not None and seen.is_fresh(now, fresh_for_s):
        return Decision.ANSWER
    if newest.is_fresh(now, reprobe_after_s):
        return Decision.ANSWER
    return Decision.PROBE


def status_of(timeline: Timeline, fingerprint: bytes | None, *, now: int, fresh_for_s: int) -> int:
    """The status of an answer from ``timeline`` after ``decide`` said ANSWER
    or a probe succeeded: 200 when the fingerprint (if any) is fresh in the
    timeline, else 409 (the notary sees something else)."""
    if fingerprint is None:
        return 200
    seen = timeline.find_sha1(fingerprint)
    if seen is not None and seen.is_fresh(now, fresh_for_s):
        return 200
    return 409


def answer_status(
    timeline: Timeline, fingerprint: bytes | None, now: int, fresh_for_s: int,
    reprobe_after_s: int,
) -> int | None:
    """``decide`` and ``status_of`` in one pass, for one ``now``: the status
    (200 or 409) when ``decide`` says ANSWER, None when it says PROBE. The
    hot path of a cache hit: one scan of the observations at most."""
    observations = timeline.observations
    if not observations:
        return None
    newest = observations[0]
    if fingerprint is None:
        return 200 if newest.last_seen >= now - fresh_for_s else None
    for observation in observations:
        if observation.certificate.sha1 == fingerprint:
            if observation.last_seen >= now - fresh_for_s:
                return 200
            break
    if newest.last_seen >= now - reprobe_after_s:
        return 409
    return None


def status_after_failed_probe(timeline: Timeline | None, fingerprint: bytes | None) -> int | None:
    """After a failed probe: 200 for a GET with history (the signed list shows
    its own age), otherwise None (answer 503: nothing the notary can vouch for
    now)."""
    if fingerprint is None and timeline is not None and timeline.observations:
        return 200
    return None
