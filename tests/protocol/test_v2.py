"""The v2 API core: canonical JSON, requests, verdicts, statements, answers, keys.

The canonical encoding and the signatures are checked against independent
implementations written here from the documented rules (``_independent_*``),
not against the module's own encoder.
"""

from __future__ import annotations

import base64
import datetime
import functools
import hashlib
import json
import stat

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding
from hypothesis import given, settings
from hypothesis import strategies as st

from notary.errors import BadTarget, ProtocolError, UsageError
from notary.model.observations import Certificate, Observation, Timeline
from notary.model.targets import Target
from notary.protocol import v2
from notary.protocol.convergence import Decision
from notary.protocol.v2 import (
    QueryResult,
    TargetQuery,
    VerificationError,
    canonical_json,
    parse_query_request,
    verdict_of,
)
from notary.state import crypto

DAY = 86400
NOW = 1_770_000_000
EXAMPLE = Target("example.com", 443)
OTHER = Target("other.example", 8443)
V6 = Target("2001:db8::1", 443)


# -- fixtures (module-level, so hypothesis tests can use them) ---------------------


@functools.cache
def certs() -> tuple[Certificate, ...]:
    key = ec.generate_private_key(ec.SECP256R1())
    when = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    return tuple(
        Certificate.from_der(
            crypto.make_self_signed_certificate(key, f"c{i}.test", now=when).public_bytes(
                Encoding.DER
            )
        )
        for i in range(3)
    )


@functools.cache
def signer() -> crypto.Ed25519Signer:
    return crypto.Ed25519Signer(crypto.generate_ed25519_key())


@functools.cache
def other_signer() -> crypto.Ed25519Signer:
    return crypto.Ed25519Signer(crypto.generate_ed25519_key())


def keys_of(*signers: crypto.Ed25519Signer) -> dict[str, Ed25519PublicKey]:
    return {s.key_id: Ed25519PublicKey.from_public_bytes(s.public_raw) for s in signers}


def observation(cert, first, last, addresses=("192.0.2.1",)):
    return Observation(cert, first, last, tuple(addresses), ((first, last),))


def timeline_of(target, *observations):
    return Timeline(target, tuple(observations))


def signed(timeline, *, by=None, signed_at=NOW, valid_for_s=DAY):
    by = by or signer()
    body = v2.statement(timeline, key_id=by.key_id, signed_at=signed_at, valid_for_s=valid_for_s)
    return v2.sign_statement(body, by.sign)


def batch():
    """Three results: a match, a mismatch, and an unreachable target with no
    history; plus the request they answer."""
    c = certs()
    example = timeline_of(EXAMPLE, observation(c[0], NOW - 10 * DAY, NOW - 60))
    other = timeline_of(
        OTHER,
        observation(c[1], NOW - 5 * DAY, NOW - 100, ("192.0.2.7", "2001:db8::7")),
        observation(c[2], NOW - 30 * DAY, NOW - 6 * DAY),
    )
    queries = [
        TargetQuery(EXAMPLE, sha256=c[0].sha256),
        TargetQuery(OTHER, sha1=c[2].sha1),
        TargetQuery(V6),
    ]
    results = [
        QueryResult(EXAMPLE, v2.VERDICT_MATCH, signed(example)),
        QueryResult(OTHER, v2.VERDICT_MISMATCH, signed(other)),
        QueryResult(V6, v2.VERDICT_UNREACHABLE, None),
    ]
    return queries, results


def answer(results=None, *, nonce="n-1", signed_at=NOW, by=None):
    by = by or signer()
    if results is None:
        results = batch()[1]
    return v2.answer_bytes(
        results, nonce=nonce, signed_at=signed_at, key_id=by.key_id, sign=by.sign
    )


# -- independent implementations (from the module docstring only) ------------------

_SHORT_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
}


def _independent_string(text: str) -> str:
    out = ['"']
    for ch in text:
        if ch in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[ch])
        elif ord(ch) < 0x20:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _independent_text(value) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return _independent_string(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(_independent_text(v) for v in value) + "]"
    if isinstance(value, dict):
        members = sorted(value.items(), key=lambda kv: kv[0].encode("ascii"))
        return (
            "{"
            + ",".join(_independent_string(k) + ":" + _independent_text(v) for k, v in members)
            + "}"
        )
    raise TypeError(type(value))


def independent_canonical(value) -> bytes:
    """Rules C1-C6 of notary.protocol.v2, written out by hand."""
    return _independent_text(value).encode("utf-8")


def independent_verify(data: bytes, keys: dict[str, bytes], *, nonce, now) -> list[dict]:
    """Verify an answer document with only ``json`` and ``cryptography``
    (and base64 to read signatures), following the module docstring:
    envelope signature, nonce, statement signatures, binding, freshness.
    Raises ``ValueError`` on any failure; returns the results."""

    def canonical(value) -> bytes:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()

    def check(key_id, value, signature):
        if key_id not in keys:
            raise ValueError("unknown key")
        try:
            Ed25519PublicKey.from_public_bytes(keys[key_id]).verify(
                base64.b64decode(signature, validate=True), canonical(value)
            )
        except InvalidSignature:
            raise ValueError("bad signature") from None

    document = json.loads(data)
    envelope = document["answer"]
    check(envelope["key_id"], envelope, document["signature"])
    if envelope["nonce"] != nonce:
        raise ValueError("nonce")
    statements = {}
    for entry in document["statements"]:
        check(entry["statement"]["key_id"], entry["statement"], entry["signature"])
        statements[entry["signature"]] = entry["statement"]
    for result in envelope["results"]:
        if result["statement_signature"] is None:
            continue
        stated = statements[result["statement_signature"]]
        if stated["target"] != result["target"] or stated["valid_until"] < now:
            raise ValueError("binding or expiry")
    return envelope["results"]


# -- canonical JSON ------------------------------------------------------------


def test_canonical_vector():
    value = {"b": 1, "a": [True, None, False, 'é\n\x1f"\\/\x7f\u2028'], "A": -(2**53 - 1), "": {}}
    expected = (
        '{"":{},"A":-9007199254740991,"a":[true,null,false,"é\\n\\u001f\\"\\\\/\x7f\u2028"],"b":1}'
    )
    assert canonical_json(value) == expected.encode("utf-8")
    assert canonical_json(value) == independent_canonical(value)


def test_canonical_is_not_normalised():
    decomposed = "e\u0301"
    assert canonical_json(decomposed) == b'"e\xcc\x81"'
    assert canonical_json("\u00e9") == b'"\xc3\xa9"'


json_leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53 - 1), max_value=2**53 - 1)
    | st.text(st.characters(exclude_categories=("Cs",)))
)
json_values = st.recursive(
    json_leaves,
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(
            st.text(st.characters(max_codepoint=127), max_size=8), children, max_size=5
        )
    ),
    max_leaves=30,
)


@given(json_values)
def test_canonical_matches_independent_encoder_and_round_trips(value):
    encoded = canonical_json(value)
    assert encoded == independent_canonical(value)
    assert canonical_json(json.loads(encoded)) == encoded


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (1.0, TypeError),
        (float("nan"), TypeError),
        ({"a": [0.5]}, TypeError),
        (2**53, ValueError),
        (-(2**53), ValueError),
        ({"é": 1}, ValueError),
        ({1: 1}, TypeError),
        ("\ud800", ValueError),
        (b"bytes", TypeError),
        ({1, 2}, TypeError),
        ([[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]], ValueError),
    ],
)
def test_canonical_refuses(value, error):
    with pytest.raises(error):
        canonical_json(value)


# -- requests --------------------------------------------------------------------

SHA256_HEX = "ab" * 32
SHA1_HEX = "cd" * 20


def body(value) -> bytes:
    return json.dumps(value).encode()


def parse(data: bytes, max_batch=10, max_body_bytes=4096):
    return parse_query_request(data, max_batch=max_batch, max_body_bytes=max_body_bytes)


def test_parse_request_good():
    request = parse(
        body(
            {
                "nonce": "abc 123",
                "targets": [
                    {"host": "Example.COM.", "port": 443, "sha256": SHA256_HEX.upper()},
                    {"host": "[::FFFF:192.0.2.1]", "port": 8443, "sha1": SHA1_HEX},
                    {"host": "bücher.example", "port": 1, "sha256": None, "sha1": None},
                    {"host": "example.com", "port": 443, "sha1": ":".join(["CD"] * 20)},
                ],
            }
        )
    )
    assert request.nonce == "abc 123"
    assert request.targets == (
        TargetQuery(EXAMPLE, bytes.fromhex(SHA256_HEX), None),
        TargetQuery(Target("192.0.2.1", 8443), None, bytes.fromhex(SHA1_HEX)),
        TargetQuery(Target("xn--bcher-kva.example", 1)),
        TargetQuery(EXAMPLE, None, bytes.fromhex(SHA1_HEX)),  # duplicates are answered
    )


def test_parse_request_without_nonce_and_null_nonce():
    one = [{"host": "example.com", "port": 443}]
    assert parse(body({"targets": one})).nonce is None
    assert parse(body({"targets": one, "nonce": None})).nonce is None


GOOD = {"host": "example.com", "port": 443}


@pytest.mark.parametrize(
    ("data", "status", "message"),
    [
        (b"", 400, "body:"),
        (b"\xff{}", 400, "body:"),
        (b"[]", 400, "body: must be a JSON object"),
        (b'"x"', 400, "body: must be a JSON object"),
        (b"null", 400, "body: must be a JSON object"),
        (b"{" * 5000 + b"}" * 5000, 400, "body:"),
        (b"[" * 100000, 413, "body: too large"),
        (b'{"targets": [], "targets": []}', 400, "body: repeated key"),
        (b'{"targets": [{"host": "a.b", "port": NaN}]}', 400, "body:"),
        (body({"targets": [GOOD], "extra": 1}), 400, "body: unknown field"),
        (body({}), 400, "targets: missing"),
        (body({"targets": []}), 400, "targets: must be a non-empty array"),
        (body({"targets": {"host": "a"}}), 400, "targets: must be a non-empty array"),
        (body({"targets": [GOOD] * 11}), 413, "targets: more than 10 targets"),
        (body({"targets": [GOOD], "nonce": ""}), 400, "nonce:"),
        (body({"targets": [GOOD], "nonce": "x" * 129}), 400, "nonce:"),
        (body({"targets": [GOOD], "nonce": "é"}), 400, "nonce:"),
        (body({"targets": [GOOD], "nonce": "a\nb"}), 400, "nonce:"),
        (body({"targets": [GOOD], "nonce": 5}), 400, "nonce:"),
        (body({"targets": [GOOD, 5]}), 400, "targets[1]: must be an object"),
        (body({"targets": [GOOD, {**GOOD, "md5": "x"}]}), 400, "targets[1]: unknown field"),
        (body({"targets": [{"port": 443}]}), 400, "targets[0].host: missing"),
        (body({"targets": [{"host": 5, "port": 443}]}), 400, "targets[0].host: must be a string"),
        (body({"targets": [{"host": "a..b", "port": 443}]}), 400, "targets[0].host: "),
        (body({"targets": [{"host": "127.1", "port": 443}]}), 400, "targets[0].host: invalid IPv4"),
        (body({"targets": [{"host": "fe80::1%eth0", "port": 1}]}), 400, "targets[0].host:"),
        (body({"targets": [{"host": "a.b"}]}), 400, "targets[0].port: missing"),
        (
            body({"targets": [{"host": "a.b", "port": "443"}]}),
            400,
            "targets[0].port: must be an integer 1-65535",
        ),
        (
            body({"targets": [{"host": "a.b", "port": 0}]}),
            400,
            "targets[0].port: must be an integer 1-65535",
        ),
        (
            body({"targets": [{"host": "a.b", "port": 65536}]}),
            400,
            "targets[0].port: must be an integer",
        ),
        (
            body({"targets": [{"host": "a.b", "port": 443.0}]}),
            400,
            "targets[0].port: must be an integer",
        ),
        (
            body({"targets": [{"host": "a.b", "port": True}]}),
            400,
            "targets[0].port: must be an integer",
        ),
        (b'{"targets": [{"host": "a.b", "port": ' + b"9" * 4000 + b"}]}", 400, "targets[0].port:"),
        (
            body({"targets": [{**GOOD, "sha256": SHA256_HEX[:-2]}]}),
            400,
            "targets[0].sha256: must be 64 hex",
        ),
        (body({"targets": [{**GOOD, "sha256": "zz" * 32}]}), 400, "targets[0].sha256:"),
        (
            body({"targets": [{**GOOD, "sha256": ":".join(["abc"] * 16)}]}),
            400,
            "targets[0].sha256:",
        ),
        (body({"targets": [{**GOOD, "sha256": 5}]}), 400, "targets[0].sha256:"),
        (body({"targets": [{**GOOD, "sha1": SHA256_HEX}]}), 400, "targets[0].sha1: must be 40 hex"),
        (body({"targets": [{**GOOD, "sha1": "\u0660" * 40}]}), 400, "targets[0].sha1:"),
    ],
)
def test_parse_request_bad(data, status, message):
    with pytest.raises(ProtocolError) as info:
        parse(data, max_body_bytes=20000)
    assert info.value.status == status
    assert info.value.message.startswith(message)


def test_bad_host_and_port_are_bad_target():
    with pytest.raises(BadTarget):
        parse(body({"targets": [{"host": "a..b", "port": 443}]}))
    with pytest.raises(BadTarget):
        parse(body({"targets": [{"host": "a.b", "port": -1}]}))


def test_messages_never_echo_input():
    with pytest.raises(ProtocolError) as info:
        parse(body({"targets": [{"host": "a.b", "port": 1, "<script>": 1}]}))
    assert "<script>" not in info.value.message


def _assert_client_error(data: bytes) -> None:
    try:
        parse(data, max_batch=4, max_body_bytes=2048)
    except ProtocolError as exc:  # BadTarget included
        assert exc.status in (400, 413)
        assert exc.message


entry_values = st.fixed_dictionaries(
    {},
    optional={
        "host": json_values | st.sampled_from(["example.com", "[::1]", "1.2.3.4", "é.example"]),
        "port": json_values | st.integers(min_value=-5, max_value=70000),
        "sha256": json_values | st.just(SHA256_HEX),
        "sha1": json_values | st.just(SHA1_HEX),
    },
)
request_values = (
    st.fixed_dictionaries(
        {},
        optional={
            "targets": st.lists(entry_values | json_values, max_size=6) | json_values,
            "nonce": json_values,
        },
    )
    | json_values
)


@given(request_values)
@settings(max_examples=300)
def test_parse_request_fuzz_json(value):
    _assert_client_error(json.dumps(value).encode())


@given(st.binary(max_size=400))
def test_parse_request_fuzz_bytes(data):
    _assert_client_error(data)


@given(request_values, st.integers(min_value=0, max_value=80), st.binary(max_size=4))
def test_parse_request_fuzz_truncated_and_spliced(value, cut, junk):
    data = json.dumps(value).encode()
    _assert_client_error(data[:cut] + junk + data[cut:])


# -- verdicts --------------------------------------------------------------------


class TestVerdicts:
    def verdict(self, timeline, sha256=None, sha1=None):
        return verdict_of(timeline, sha256, sha1, now=NOW, fresh_for_s=DAY)

    def test_no_history_or_no_hash_is_unknown(self):
        c = certs()
        assert self.verdict(None, c[0].sha256) == "unknown"
        assert self.verdict(timeline_of(EXAMPLE), c[0].sha256) == "unknown"
        fresh = timeline_of(EXAMPLE, observation(c[0], NOW - 10, NOW - 10))
        assert self.verdict(fresh) == "unknown"

    def test_fresh_match_and_mismatch(self):
        c = certs()
        timeline = timeline_of(
            EXAMPLE,
            observation(c[0], NOW - 100, NOW - 10),
            observation(c[1], NOW - 200, NOW - 50),  # fresh, not newest
            observation(c[2], NOW - 9 * DAY, NOW - 8 * DAY),  # stale
        )
        assert self.verdict(timeline, c[0].sha256) == "match"
        assert self.verdict(timeline, None, c[1].sha1) == "match"
        assert self.verdict(timeline, c[2].sha256) == "mismatch"
        assert self.verdict(timeline, b"\0" * 32) == "mismatch"

    def test_both_hashes_must_name_one_certificate(self):
        c = certs()
        timeline = timeline_of(EXAMPLE, observation(c[0], NOW - 10, NOW - 10))
        assert self.verdict(timeline, c[0].sha256, c[0].sha1) == "match"
        assert self.verdict(timeline, c[0].sha256, c[1].sha1) == "mismatch"

    def test_stale_newest_still_matches_else_unknown(self):
        c = certs()
        timeline = timeline_of(
            EXAMPLE,
            observation(c[0], NOW - 9 * DAY, NOW - 3 * DAY),
            observation(c[1], NOW - 19 * DAY, NOW - 10 * DAY),
        )
        assert self.verdict(timeline, c[0].sha256) == "match"
        assert self.verdict(timeline, c[1].sha256) == "unknown"
        assert self.verdict(timeline, c[2].sha256) == "unknown"

    def test_constants(self):
        assert {"match", "mismatch", "unknown", "unreachable", "refused"} == v2.VERDICTS

    def test_decide(self):
        c = certs()
        kw = {"now": NOW, "fresh_for_s": DAY, "reprobe_after_s": 60}
        assert v2.decide(None, None, None, **kw) is Decision.PROBE
        fresh = timeline_of(EXAMPLE, observation(c[0], NOW - 100, NOW - 100))
        assert v2.decide(fresh, c[0].sha256, None, **kw) is Decision.ANSWER
        assert v2.decide(fresh, None, None, **kw) is Decision.ANSWER
        assert v2.decide(fresh, c[1].sha256, None, **kw) is Decision.PROBE
        just = timeline_of(EXAMPLE, observation(c[0], NOW - 10, NOW - 10))
        assert v2.decide(just, c[1].sha256, None, **kw) is Decision.ANSWER
        stale = timeline_of(EXAMPLE, observation(c[0], NOW - 3 * DAY, NOW - 2 * DAY))
        assert v2.decide(stale, None, None, **kw) is Decision.PROBE


# -- statements ------------------------------------------------------------------


def test_statement_fields():
    c = certs()
    timeline = timeline_of(
        V6,
        observation(c[1], 100, 200, ("2001:db8::7",)),
        observation(c[0], 300, 400, ("192.0.2.1", "192.0.2.2")),
    )
    body = v2.statement(timeline, key_id="00" * 8, signed_at=500, valid_for_s=60)
    assert body == {
        "type": "notary.v2.statement",
        "target": "[2001:db8::1]:443",
        "observations": [
            {
                "sha256": c[0].sha256.hex(),
                "spki_sha256": c[0].spki_sha256.hex(),
                "sha1": c[0].sha1.hex(),
                "first_seen": 300,
                "last_seen": 400,
                "addresses": ["192.0.2.1", "192.0.2.2"],
            },
            {
                "sha256": c[1].sha256.hex(),
                "spki_sha256": c[1].spki_sha256.hex(),
                "sha1": c[1].sha1.hex(),
                "first_seen": 100,
                "last_seen": 200,
                "addresses": ["2001:db8::7"],
            },
        ],
        "signed_at": 500,
        "valid_until": 560,
        "key_id": "00" * 8,
    }
    assert v2.statement_bytes(body) == independent_canonical(body)


def test_statement_is_capped_to_newest_observations():
    c = certs()
    many = [observation(c[i % 3], i, i) for i in range(v2.MAX_STATEMENT_OBSERVATIONS + 5)]
    body = v2.statement(timeline_of(EXAMPLE, *many), key_id="k", signed_at=0, valid_for_s=0)
    assert len(body["observations"]) == v2.MAX_STATEMENT_OBSERVATIONS
    assert body["observations"][0]["last_seen"] == v2.MAX_STATEMENT_OBSERVATIONS + 4


def test_sign_statement_signs_once_and_renewal():
    s = crypto.Ed25519Signer(crypto.generate_ed25519_key())
    timeline = timeline_of(EXAMPLE, observation(certs()[0], 1, 2))
    body = v2.statement(timeline, key_id=s.key_id, signed_at=NOW, valid_for_s=DAY)
    one = v2.sign_statement(body, s.sign)
    assert s.signatures_made == 1
    assert one.statement == independent_canonical(body)
    assert crypto.verify_ed25519(s.public_raw, one.statement, one.signature)
    assert one.entry == b'{"signature":"%s","statement":%s}' % (
        one.signature.encode(),
        one.statement,
    )
    assert not v2.statement_due(one, now=NOW, renew_before_s=3600)
    assert v2.statement_due(one, now=NOW + DAY - 3600, renew_before_s=3600)


# -- answers: round trip ------------------------------------------------------------


def test_answer_round_trip_one_signature_per_request():
    queries, results = batch()
    s = crypto.Ed25519Signer(crypto.generate_ed25519_key())
    before = s.signatures_made
    data = v2.answer_bytes(results, nonce="n-1", signed_at=NOW, key_id=s.key_id, sign=s.sign)
    assert s.signatures_made == before + 1
    parsed = v2.parse_answer_document(data)
    # statements were signed by signer(), the envelope by s: both trusted
    verified = v2.verify_answer(
        parsed, keys_of(signer(), s), nonce="n-1", now=NOW + 100, queries=queries
    )
    assert [(r.target, r.verdict) for r in verified] == [
        (EXAMPLE, "match"),
        (OTHER, "mismatch"),
        (V6, "unreachable"),
    ]
    assert verified[0].observations[0].sha256 == certs()[0].sha256
    assert verified[0].valid_until == NOW + DAY
    assert verified[1].observations[0].addresses == ("192.0.2.7", "2001:db8::7")
    assert verified[2].observations == () and verified[2].valid_until is None


def test_document_is_canonical_and_independently_verifiable():
    data = answer()
    assert independent_canonical(json.loads(data)) == data
    keys = {signer().key_id: signer().public_raw}
    results = independent_verify(data, keys, nonce="n-1", now=NOW)
    assert [r["verdict"] for r in results] == ["match", "mismatch", "unreachable"]
    document = json.loads(data)
    assert len(document["statements"]) == 2
    assert len(base64.b64decode(document["signature"])) == 64


def test_duplicate_targets_share_one_statement():
    _, results = batch()
    data = answer([results[0], results[0], results[1]])
    document = json.loads(data)
    assert len(document["statements"]) == 2
    parsed = v2.parse_answer_document(data)
    verified = v2.verify_answer(parsed, keys_of(signer()), nonce="n-1", now=NOW)
    assert [r.target for r in verified] == [EXAMPLE, EXAMPLE, OTHER]


def test_no_nonce_and_answer_age():
    data = answer(nonce=None, signed_at=NOW)
    parsed = v2.parse_answer_document(data)
    assert v2.verify_answer(
        parsed, keys_of(signer()), nonce=None, now=NOW + 10, max_answer_age_s=60
    )
    with pytest.raises(VerificationError, match="too long ago"):
        v2.verify_answer(parsed, keys_of(signer()), nonce=None, now=NOW + 61, max_answer_age_s=60)


def test_envelope_refuses_misuse():
    _, results = batch()
    with pytest.raises(ValueError):
        v2.envelope([QueryResult(EXAMPLE, "maybe", None)], nonce=None, signed_at=0, key_id="k")
    with pytest.raises(ValueError):
        v2.envelope([QueryResult(EXAMPLE, "match", None)], nonce=None, signed_at=0, key_id="k")
    with pytest.raises(ValueError):
        v2.envelope(
            [QueryResult(OTHER, "match", results[0].statement)], nonce=None, signed_at=0, key_id="k"
        )


# -- answers: every failure ---------------------------------------------------------


def tampered(data: bytes, change) -> bytes:
    document = json.loads(data)
    change(document)
    return json.dumps(document).encode()


def verify(data: bytes, *, keys=None, nonce="n-1", now=NOW, queries=None):
    parsed = v2.parse_answer_document(data)
    return v2.verify_answer(
        parsed,
        keys if keys is not None else keys_of(signer()),
        nonce=nonce,
        now=now,
        queries=queries,
    )


def _flip(signature: str) -> str:
    raw = bytearray(base64.b64decode(signature))
    raw[5] ^= 1
    return base64.b64encode(bytes(raw)).decode()


def _set_verdict(d):
    d["answer"]["results"][1]["verdict"] = "match"


def _set_nonce(d):
    d["answer"]["nonce"] = "n-2"


def _set_last_seen(d):
    d["statements"][0]["statement"]["observations"][0]["last_seen"] += 1


def _set_valid_until(d):
    d["statements"][0]["statement"]["valid_until"] += DAY


def _flip_envelope_signature(d):
    d["signature"] = _flip(d["signature"])


def _flip_statement_signature(d):
    d["statements"][0]["signature"] = _flip(d["statements"][0]["signature"])


def _swap_statements(d):
    d["statements"][0]["statement"], d["statements"][1]["statement"] = (
        d["statements"][1]["statement"],
        d["statements"][0]["statement"],
    )


def _add_address(d):
    d["statements"][1]["statement"]["observations"][0]["addresses"].append("203.0.113.9")


def _statement_key_id(d):
    d["statements"][0]["statement"]["key_id"] = other_signer().key_id


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (_set_verdict, "bad answer signature"),
        (_set_nonce, "bad answer signature"),
        (_flip_envelope_signature, "bad answer signature"),
        (_set_last_seen, "bad statement signature"),
        (_set_valid_until, "bad statement signature"),
        (_add_address, "bad statement signature"),
        (_flip_statement_signature, "bad statement signature"),
        (_swap_statements, "bad statement signature"),
        (_statement_key_id, "bad statement signature"),
    ],
)
def test_tampered_field_fails(change, message):
    data = tampered(answer(), change)
    with pytest.raises(VerificationError, match=message) as info:
        verify(data, keys=keys_of(signer(), other_signer()))
    assert info.value.status == 502
    with pytest.raises(ValueError):
        independent_verify(data, {signer().key_id: signer().public_raw}, nonce="n-1", now=NOW)


def test_unknown_key_ids():
    with pytest.raises(VerificationError, match="unknown key id"):
        verify(answer(), keys={})
    with pytest.raises(VerificationError, match="unknown key id"):
        verify(answer(), keys=keys_of(other_signer()))
    # envelope by a trusted key, statements by an untrusted one
    _, results = batch()
    c = certs()
    foreign = signed(timeline_of(EXAMPLE, observation(c[0], 1, NOW)), by=other_signer())
    data = answer([QueryResult(EXAMPLE, "match", foreign), *results[1:]])
    with pytest.raises(
        VerificationError, match=r"statement for example\.com:443 has an unknown key id"
    ):
        verify(data)


def test_envelope_signed_by_another_key_claiming_ours():
    impostor = other_signer()
    _, results = batch()
    body = v2.envelope(results, nonce="n-1", signed_at=NOW, key_id=signer().key_id)
    data = v2.answer_document(
        [r.statement for r in results if r.statement], body, impostor.sign(canonical_json(body))
    )
    with pytest.raises(VerificationError, match="bad answer signature"):
        verify(data)


def test_mismatching_statement_signature():
    """A correctly signed envelope whose results name a statement that is not
    in the document, or one of another target."""
    _, results = batch()
    extra = signed(timeline_of(EXAMPLE, observation(certs()[2], 1, 2)), signed_at=NOW + 1)
    body = v2.envelope(results, nonce="n-1", signed_at=NOW, key_id=signer().key_id)
    body["results"][0]["statement_signature"] = extra.signature
    data = v2.answer_document(
        [r.statement for r in results if r.statement], body, signer().sign(canonical_json(body))
    )
    with pytest.raises(VerificationError, match="not bound to a statement"):
        verify(data)
    body["results"][0]["statement_signature"] = results[1].statement.signature
    data = v2.answer_document(
        [r.statement for r in results if r.statement], body, signer().sign(canonical_json(body))
    )
    with pytest.raises(VerificationError, match="not bound to a statement of its target"):
        verify(data)


def test_verdict_without_statement_refused():
    body = v2.envelope(
        [QueryResult(EXAMPLE, "unknown")], nonce="n-1", signed_at=NOW, key_id=signer().key_id
    )
    body["results"][0]["verdict"] = "match"
    data = v2.answer_document([], body, signer().sign(canonical_json(body)))
    with pytest.raises(VerificationError, match=r"match for example\.com:443 without a statement"):
        verify(data)


def test_expired_statement_rejected():
    data = answer()
    assert verify(data, now=NOW + DAY)
    with pytest.raises(VerificationError, match="expired"):
        verify(data, now=NOW + DAY + 1)
    with pytest.raises(ValueError):
        independent_verify(
            data, {signer().key_id: signer().public_raw}, nonce="n-1", now=NOW + DAY + 1
        )


@pytest.mark.parametrize(("sent", "answered"), [("n-1", "n-2"), ("n-1", None), (None, "n-1")])
def test_wrong_nonce_rejected(sent, answered):
    with pytest.raises(VerificationError, match="wrong nonce"):
        verify(answer(nonce=answered), nonce=sent)


def test_results_must_answer_the_query():
    queries, _ = batch()
    data = answer()
    with pytest.raises(VerificationError, match="do not answer the targets"):
        verify(data, queries=queries[:2])
    with pytest.raises(VerificationError, match="do not answer the targets"):
        verify(data, queries=[queries[1], queries[0], queries[2]])
    wrong_hash = [TargetQuery(EXAMPLE, sha256=certs()[1].sha256), *queries[1:]]
    with pytest.raises(VerificationError, match="not backed by its statement"):
        verify(data, queries=wrong_hash)


def test_unreferenced_statements_are_ignored():
    _, results = batch()
    body = v2.envelope(results[2:], nonce="n-1", signed_at=NOW, key_id=signer().key_id)
    data = v2.answer_document(
        [r.statement for r in results if r.statement], body, signer().sign(canonical_json(body))
    )
    assert [r.target for r in verify(data)] == [V6]


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xff",
        b"[]",
        b'{"answer": {}, "signature": "", "statements": []}',
        b"{" * 10000,
        b'{"answer": 1, "answer": 2}',
    ],
)
def test_parse_answer_rejects_malformed(data):
    with pytest.raises(ProtocolError) as info:
        v2.parse_answer_document(data)
    assert info.value.status == 502
    assert not isinstance(info.value, VerificationError)


def _extra_field(d):
    d["answer"]["extra"] = 1


def _float_time(d):
    d["answer"]["signed_at"] = 1.5


def _bad_verdict(d):
    d["answer"]["results"][0]["verdict"] = ["match"]


def _bad_target(d):
    d["answer"]["results"][0]["target"] = "Example.com:443"


def _bad_hex(d):
    d["statements"][0]["statement"]["observations"][0]["sha1"] = "AB" * 20


def _bad_type(d):
    d["statements"][0]["statement"]["type"] = "notary.v3.statement"


def _bad_times(d):
    d["statements"][0]["statement"]["valid_until"] = 0


def _big_int(d):
    d["answer"]["signed_at"] = 2**60


@pytest.mark.parametrize(
    "change",
    [
        _extra_field,
        _float_time,
        _bad_verdict,
        _bad_target,
        _bad_hex,
        _bad_type,
        _bad_times,
        _big_int,
    ],
)
def test_parse_answer_rejects_bad_fields(change):
    with pytest.raises(ProtocolError) as info:
        v2.parse_answer_document(tampered(answer(), change))
    assert info.value.status == 502


@given(st.binary(max_size=300))
def test_parse_answer_fuzz_bytes(data):
    try:
        v2.parse_answer_document(data)
    except ProtocolError as exc:
        assert exc.status == 502


@given(st.integers(min_value=0, max_value=2000), st.binary(min_size=1, max_size=3))
@settings(max_examples=200, deadline=None)
def test_parse_and_verify_spliced_answers_fail_cleanly(cut, junk):
    data = answer()
    cut %= len(data)
    spliced = data[:cut] + junk + data[cut + 1 :]
    try:
        verify(spliced)
    except ProtocolError as exc:
        assert exc.status == 502


# -- keys ------------------------------------------------------------------------


def test_key_ids_agree():
    s = signer()
    assert s.key_id == v2.key_id_of(s.public_raw) == crypto.ed25519_key_id(s.public_raw)
    assert s.key_id == hashlib.sha256(s.public_raw).hexdigest()[:16]


def test_key_document_round_trip():
    keys = [
        v2.publish_key(signer().public_raw, not_before=NOW - DAY, not_after=NOW + 365 * DAY),
        v2.publish_key(other_signer().public_raw, not_before=NOW - 400 * DAY, not_after=NOW - DAY),
    ]
    data = v2.key_document(keys)
    assert data == independent_canonical(json.loads(data))
    row = json.loads(data)["keys"][0]
    assert row == {
        "algorithm": "ed25519",
        "key_id": signer().key_id,
        "public_key": base64.b64encode(signer().public_raw).decode(),
        "not_before": NOW - DAY,
        "not_after": NOW + 365 * DAY,
    }
    parsed = v2.parse_key_document(data)
    assert parsed == tuple(keys)
    trusted = v2.trusted_keys(parsed, now=NOW)
    assert list(trusted) == [signer().key_id]
    assert verify(answer(), keys=trusted)


def _wrong_id(d):
    d["keys"][0]["key_id"] = "0" * 16


def _short_key(d):
    d["keys"][0]["public_key"] = base64.b64encode(b"\1" * 31).decode()


def _other_algorithm(d):
    d["keys"][0]["algorithm"] = "rsa"


def _reversed_validity(d):
    d["keys"][0]["not_before"] = d["keys"][0]["not_after"] + 1


def _repeated_key(d):
    d["keys"].append(dict(d["keys"][0]))


def _float_validity(d):
    d["keys"][0]["not_after"] = 1e12


def _missing_field(d):
    del d["keys"][0]["not_after"]


@pytest.mark.parametrize(
    "change",
    [
        _wrong_id,
        _short_key,
        _other_algorithm,
        _reversed_validity,
        _repeated_key,
        _float_validity,
        _missing_field,
    ],
)
def test_key_document_rejects(change):
    data = v2.key_document([v2.publish_key(signer().public_raw, not_before=0, not_after=NOW)])
    with pytest.raises(ProtocolError) as info:
        v2.parse_key_document(tampered(data, change))
    assert info.value.status == 502


@given(st.binary(max_size=200))
def test_key_document_fuzz(data):
    try:
        v2.parse_key_document(data)
    except ProtocolError as exc:
        assert exc.status == 502


# -- crypto helpers --------------------------------------------------------------


@pytest.mark.parametrize(
    "signature",
    [
        "",
        "!!!",
        "AAAA",
        base64.b64encode(b"\0" * 64).decode(),
        base64.b64encode(b"\0" * 65).decode(),
        None,
        5,
    ],
)
def test_verify_ed25519_never_raises(signature):
    assert crypto.verify_ed25519(signer().public_raw, b"data", signature) is False


def test_verify_ed25519_keys():
    s = signer()
    good = s.sign(b"data")
    assert crypto.verify_ed25519(s.public_raw, b"data", good)
    assert crypto.verify_ed25519(Ed25519PublicKey.from_public_bytes(s.public_raw), b"data", good)
    assert not crypto.verify_ed25519(other_signer().public_raw, b"data", good)
    assert not crypto.verify_ed25519(b"short", b"data", good)
    assert not crypto.verify_ed25519("not a key", b"data", good)
    assert not crypto.verify_ed25519(s.public_raw, "text", good)


def test_ed25519_key_files(tmp_path):
    key = crypto.generate_ed25519_key()
    path = tmp_path / "v2.key"
    crypto.write_ed25519_private_key(path, key)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    loaded = crypto.load_ed25519_private_key(path)
    assert crypto.ed25519_public_raw(loaded) == crypto.ed25519_public_raw(key)
    assert crypto.ed25519_public_key_pem(key).startswith("-----BEGIN PUBLIC KEY-----")
    with pytest.raises(UsageError, match="exists"):
        crypto.write_ed25519_private_key(path, key)
    crypto.write_ed25519_private_key(path, crypto.generate_ed25519_key(), force=True)


def test_load_ed25519_key_errors(tmp_path):
    with pytest.raises(UsageError, match="cannot read"):
        crypto.load_ed25519_private_key(tmp_path / "missing")
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"not a key")
    with pytest.raises(UsageError, match="not an unencrypted PEM"):
        crypto.load_ed25519_private_key(garbage)
    ec_key = tmp_path / "ec.key"
    ec_key.write_bytes(crypto.private_key_pem(ec.generate_private_key(ec.SECP256R1())))
    with pytest.raises(UsageError, match="not an Ed25519 key"):
        crypto.load_ed25519_private_key(ec_key)
    with pytest.raises(UsageError):
        crypto.Ed25519Signer(ec.generate_private_key(ec.SECP256R1()))


# -- a statement signed earlier: when it still gives every verdict (issue 30, item 5) -----


LAG = DAY // 4


@st.composite
def sightings_changes(draw):
    """A timeline and a later one of the same target: either the same
    certificates and first sightings with later last sightings and other
    addresses, or (sometimes) a change beyond sightings."""
    count = draw(st.integers(1, 3))
    chosen = draw(st.permutations(range(3)))[:count]
    stated = []
    current = []
    for index in chosen:
        first = NOW - draw(st.integers(0, 3 * DAY))
        last = first + draw(st.integers(0, DAY))
        later = last + draw(st.sampled_from([0, 0, 1, 600, DAY // 2, 2 * DAY]))
        stated.append(observation(certs()[index], first, last))
        current.append(observation(certs()[index], first, later, ("198.51.100.7",)))
    kind = draw(st.sampled_from(["sightings", "sightings", "new", "first_seen", "dropped"]))
    if kind == "new" and count < 3:
        spare = next(i for i in range(3) if i not in chosen)
        current.append(observation(certs()[spare], NOW, NOW))
    elif kind == "first_seen":
        moved = current[0]
        current[0] = observation(moved.certificate, moved.first_seen - 1, moved.last_seen)
    elif kind == "dropped" and count > 1:
        current.pop()
    else:
        kind = "sightings"
    return timeline_of(EXAMPLE, *stated), timeline_of(EXAMPLE, *current), kind


@settings(max_examples=500, deadline=None)
@given(sightings_changes(), st.data())
def test_a_statement_within_its_sightings_lag_gives_every_verdict(change, data):
    stated, current, kind = change
    deadline = v2.sightings_deadline(v2.stated_timeline(stated), current, LAG)
    if kind != "sightings":
        assert deadline is None
        return
    assert deadline is not None
    # The times where verdicts may turn: each sighting, a lag or a day after it.
    edges = sorted({
        o.last_seen + shift for t in (stated, current) for o in t.observations
        for shift in (0, LAG - 1, LAG, DAY - 1, DAY)
    })
    now = data.draw(st.sampled_from(edges)) + data.draw(st.integers(-2, 2))
    for sha256 in [c.sha256 for c in certs()] + [None]:
        for fresh_for_s in (LAG, DAY, 4 * DAY):
            if now < deadline:
                assert verdict_of(stated, sha256, None, now=now, fresh_for_s=fresh_for_s) == (
                    verdict_of(current, sha256, None, now=now, fresh_for_s=fresh_for_s)
                )


def test_sightings_deadline_examples() -> None:
    a, b, _ = certs()
    stated = timeline_of(EXAMPLE, observation(a, NOW - 100, NOW - 50), observation(b, 0, 10))
    # Only addresses differ: the statement stands for good.
    moved = timeline_of(EXAMPLE, observation(a, NOW - 100, NOW - 50, ("203.0.113.9",)),
                        observation(b, 0, 10))
    assert v2.sightings_deadline(stated, moved, LAG) == float("inf")
    # A later sighting of a: until a's stated one is LAG old.
    later = timeline_of(EXAMPLE, observation(a, NOW - 100, NOW), observation(b, 0, 10))
    assert v2.sightings_deadline(stated, later, LAG) == NOW - 50 + LAG
    # b seen again (now the newest): until b's old sighting is LAG old, long past.
    again = timeline_of(EXAMPLE, observation(a, NOW - 100, NOW - 50), observation(b, 0, NOW))
    assert v2.sightings_deadline(stated, again, LAG) == 10 + LAG
    # The stated form keeps hashes and times, not DER, runs or addresses.
    kept = v2.stated_timeline(later)
    assert [o.certificate.der for o in kept.observations] == [b"", b""]
    assert [o.certificate.sha256 for o in kept.observations] == [a.sha256, b.sha256]
    assert [(o.first_seen, o.last_seen, o.addresses) for o in kept.observations] == [
        (NOW - 100, NOW, ()), (0, 10, ()),
    ]
