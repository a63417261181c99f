"""The v2 API's answers for sites that serve several certificates (issue 31):
a statement's ``consistency`` (docs/v2.md, S8), requests with
``spki_sha256`` and ``address`` (R4), matches by key (V6) and the
envelope's ``matched_by`` (S2), from both sides: the notary building and
signing, a client parsing and verifying. Timelines are built from
sightings (``tests.support.observations``), no network."""

from __future__ import annotations

import copy
import datetime
import functools
import ipaddress
import json
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding
from hypothesis import given, settings
from hypothesis import strategies as st

from notary.errors import ProtocolError
from notary.model.consistency import ConsistencyKind
from notary.model.observations import Certificate, Observation, Timeline
from notary.model.targets import Target
from notary.protocol import tlog, v2
from notary.protocol.convergence import Decision
from notary.protocol.v2 import QueryResult, TargetQuery, VerificationError
from notary.state import crypto
from tests.support.observations import certificate, sightings_timeline

DAY = 86400
NOW = 1_770_000_000
SITE = "www.example.test"
TARGET = Target(SITE, 443)


@functools.cache
def signer() -> crypto.Ed25519Signer:
    return crypto.Ed25519Signer(crypto.generate_ed25519_key())


def keys() -> dict[str, Ed25519PublicKey]:
    return {signer().key_id: Ed25519PublicKey.from_public_bytes(signer().public_raw)}


@functools.cache
def same_key_pair() -> tuple[Certificate, Certificate]:
    """Two certificates with one key: a renewal that kept its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    made = []
    for day in (1, 2):
        when = datetime.datetime(2026, 1, day, tzinfo=datetime.UTC)
        der = crypto.make_self_signed_certificate(key, SITE, now=when).public_bytes(Encoding.DER)
        made.append(Certificate.from_der(der))
    return made[0], made[1]


def split_site() -> Timeline:
    """Three addresses with a certificate each, a fourth serving the third's."""
    return sightings_timeline([
        ("a", "127.0.0.2", NOW - 30), ("b", "127.0.0.3", NOW - 20),
        ("c", "127.0.0.4", NOW - 10), ("c", "::1", NOW - 5),
        ("old", "127.0.0.2", NOW - 3 * DAY),
    ])


def made(timeline: Timeline, *, fresh_for_s: int | None = DAY, **extra: Any) -> dict[str, Any]:
    return v2.statement(
        timeline, key_id=signer().key_id, signed_at=NOW, valid_for_s=DAY,
        fresh_for_s=fresh_for_s, **extra,
    )


def entry_of(statement: dict[str, Any]) -> dict[str, Any]:
    signed = v2.sign_statement(statement, signer().sign)
    return json.loads(signed.entry)


def sha(name: str) -> bytes:
    return certificate(name).sha256


# -- S8: the statement's consistency ---------------------------------------------


def test_a_split_site_states_its_current_set_and_addresses() -> None:
    statement = made(split_site())
    assert statement["consistency"] == {
        "kind": "split",
        "addresses": ["127.0.0.2", "127.0.0.3", "127.0.0.4", "::1"],
        "current": [sha("c").hex(), sha("b").hex(), sha("a").hex()],
    }
    # The stale certificate is stated (S1) but not current.
    assert len(statement["observations"]) == 4


@pytest.mark.parametrize(("sightings", "kind"), [
    ([("a", "192.0.2.1", NOW), ("a", "192.0.2.2", NOW)], "stable"),
    ([("a", "192.0.2.1", NOW - 1), ("b", "192.0.2.1", NOW)], "rotating"),
    ([("a", "192.0.2.1", NOW - 1), ("b", "192.0.2.2", NOW)], "split"),
])
def test_each_kind_is_signed_and_verified(sightings, kind) -> None:
    entry = entry_of(made(sightings_timeline(sightings)))
    parsed = v2.verify_statement(entry, keys(), now=NOW)
    assert parsed.consistency is not None and parsed.consistency.kind is ConsistencyKind(kind)
    assert parsed.consistency.current == tuple(o.sha256 for o in parsed.observations[
        : parsed.consistency.certificates
    ])


def test_the_consistency_is_as_of_signed_at() -> None:
    later = v2.statement(
        split_site(), key_id=signer().key_id, signed_at=NOW + DAY - 25, valid_for_s=DAY,
        fresh_for_s=DAY,
    )
    assert later["consistency"]["current"] == [sha("c").hex(), sha("b").hex()]


def test_without_fresh_for_s_or_observations_the_statement_is_as_before() -> None:
    timeline = split_site()
    old = made(timeline, fresh_for_s=None)
    assert "consistency" not in old
    new = made(timeline)
    del new["consistency"]
    assert v2.statement_bytes(new) == v2.statement_bytes(old)
    assert "consistency" not in made(Timeline(TARGET))
    with pytest.raises(ValueError, match="fresh_for_s"):
        made(timeline, fresh_for_s=-1)


def test_a_statement_without_consistency_stays_valid() -> None:
    parsed = v2.verify_statement(entry_of(made(split_site(), fresh_for_s=None)), keys(), now=NOW)
    assert parsed.consistency is None and len(parsed.observations) == 4


def test_only_the_stated_observations_count() -> None:
    # 70 current certificates: a statement states 64, and its current set
    # is among them; addresses beyond the 64th (in order) are left out.
    timeline = sightings_timeline(
        (f"c{i}", f"10.0.{i}.1", NOW - i) for i in range(v2.MAX_STATEMENT_OBSERVATIONS + 6)
    )
    statement = made(timeline)
    consistency = statement["consistency"]
    assert len(consistency["current"]) == v2.MAX_STATEMENT_OBSERVATIONS
    assert consistency["current"] == [o["sha256"] for o in statement["observations"]]
    assert len(consistency["addresses"]) == v2.MAX_CONSISTENCY_ADDRESSES
    assert consistency["addresses"] == sorted(consistency["addresses"])
    v2.verify_statement(entry_of(statement), keys(), now=NOW)  # the client agrees


def test_more_addresses_than_a_statement_states() -> None:
    sightings = [(f"c{i}", f"10.1.{i}.{j}", NOW - i) for i in range(12) for j in range(8)]
    statement = made(sightings_timeline(sightings))
    assert statement["consistency"]["kind"] == "split"
    addresses = statement["consistency"]["addresses"]
    everything = sorted({a for o in statement["observations"] for a in o["addresses"]})
    assert len(everything) == 96 and addresses == everything[: v2.MAX_CONSISTENCY_ADDRESSES]
    v2.verify_statement(entry_of(statement), keys(), now=NOW)


def test_the_largest_statement_fits_a_log_entry() -> None:
    """docs/v2.md S8: 64 observations of 8 IPv6 addresses each (64 in the
    consistency), 16 KiB of TLSA records, a 253-character host, a
    200-character log origin, times as large as C1 allows."""
    big = 2**53 - 1
    host = ("a" * 62 + ".") * 4 + "com"
    observations = tuple(
        Observation(
            certificate(f"big{i}"), big - 10, big - i,
            tuple(f"ffff:ffff:ffff:ffff:ffff:ffff:{i:04x}:{j:04x}" for j in range(8)),
        )
        for i in range(v2.MAX_STATEMENT_OBSERVATIONS)
    )
    timeline = Timeline(Target(host, 443), observations)
    tlsa = ["3 1 1 " + "ab" * ((v2.MAX_STATEMENT_TLSA_CHARS // v2.MAX_STATEMENT_TLSA - 6) // 2)]
    evidence = {"backend": "dane", "dane": {
        "outcome": "match", "dnssec": "secure", "checked_at": big, "sha256": "00" * 32,
        "tlsa": tlsa * v2.MAX_STATEMENT_TLSA, "matched": 0,
    }}
    statement = v2.statement(
        timeline, key_id=signer().key_id, signed_at=big - DAY, valid_for_s=DAY,
        verification=evidence, log={"origin": "o" * 200, "merge_by": big}, fresh_for_s=DAY,
    )
    assert len(statement["consistency"]["current"]) == v2.MAX_STATEMENT_OBSERVATIONS
    assert len(v2.sign_statement(statement, signer().sign).entry) <= tlog.MAX_ENTRY_BYTES


@pytest.mark.parametrize("vouched", [1, 16, 64])
def test_the_largest_statement_judging_every_certificate_fits_a_log_entry(vouched: int) -> None:
    """The same statement with DANE evidence built by the notary for a split
    site of 64 certificates, all judged (rule S6's ``judged``): records as
    large as the evidence's bound allows, vouching for the first
    ``vouched`` certificates, one record each."""
    from notary.model.dane import (
        DaneJudgement,
        DaneMatch,
        DaneOutcome,
        DaneVerdict,
        DnssecStatus,
        Tlsa,
        TlsaLookup,
    )
    from notary.protocol.v2.evidence import verification

    big = 2**53 - 1
    host = ("a" * 62 + ".") * 4 + "com"
    observations = tuple(
        Observation(
            certificate(f"big{i}"), big - 100, big - i,
            tuple(f"ffff:ffff:ffff:ffff:ffff:ffff:{i:04x}:{j:04x}" for j in range(8)),
        )
        for i in range(v2.MAX_STATEMENT_OBSERVATIONS)
    )
    timeline = Timeline(Target(host, 443), observations)
    size = v2.MAX_STATEMENT_TLSA_CHARS // v2.MAX_STATEMENT_TLSA - 6
    records = tuple(Tlsa(3, 0, 0, bytes([i]) * (size // 2)) for i in range(64))
    judgements = sorted((
        DaneJudgement(o.certificate.sha256, o.certificate.sha1,
                      DaneMatch(records[i], i, 0) if i < vouched else None)
        for i, o in enumerate(observations)
    ), key=lambda j: j.sha256)
    main = next(j for j in judgements if j.matched is not None)
    dane = DaneVerdict(
        DaneOutcome.MATCH, TlsaLookup(DnssecStatus.SECURE, records, 300, big), main.matched,
        main.sha256, main.sha1, big, tuple(j for j in judgements if j is not main),
    )
    evidence = verification("dane", dane)
    assert len(evidence["dane"]["judged"]) >= 1
    statement = v2.statement(
        timeline, key_id=signer().key_id, signed_at=big - DAY, valid_for_s=DAY,
        verification=evidence, log={"origin": "o" * 200, "merge_by": big}, fresh_for_s=DAY,
    )
    assert len(v2.sign_statement(statement, signer().sign).entry) <= tlog.MAX_ENTRY_BYTES


def test_the_current_set_is_what_v1_matches() -> None:
    timeline = split_site()
    current = set(made(timeline)["consistency"]["current"])
    for observation in timeline.observations:
        verdict = v2.verdict_of(
            timeline, observation.certificate.sha256, None, now=NOW, fresh_for_s=DAY
        )
        assert (verdict == v2.VERDICT_MATCH) == (observation.certificate.sha256.hex() in current)


# -- S8: a client refuses what does not agree, and the signature covers it -------


def consistency_entry() -> dict[str, Any]:
    return entry_of(made(split_site()))


def set_member(entry: dict[str, Any], name: str, value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(entry)
    changed["statement"]["consistency"][name] = value
    return changed


@pytest.mark.parametrize(("name", "value", "message"), [
    ("kind", "stable", "does not agree"),
    ("kind", "rotating", "does not agree"),
    ("kind", "chaotic", "kind must be one of"),
    ("kind", None, "kind must be one of"),
    ("addresses", ["127.0.0.2", "127.0.0.3", "127.0.0.4"], "does not agree"),
    ("addresses", ["::1", "127.0.0.2", "127.0.0.3", "127.0.0.4"], "does not agree"),
    ("addresses", "127.0.0.2", "addresses must be an array"),
    ("addresses", [1], "addresses must be an array"),
    ("addresses", ["x"] * 65, "addresses must be an array"),
    ("current", [], "current must be an array of 1 to 64"),
    ("current", "ab", "current must be an array"),
    ("current", ["AB" * 32], "lower-case hex"),
    ("current", ["ab" * 31], "lower-case hex"),
    ("current", [None], "lower-case hex"),
])
def test_a_client_refuses_a_malformed_or_disagreeing_consistency(name, value, message) -> None:
    entry = set_member(consistency_entry(), name, value)
    with pytest.raises(ProtocolError, match=message) as raised:
        v2.parse_statement_entry(0, entry)
    assert raised.value.status == 502


def test_a_current_set_that_is_not_the_first_observations_is_refused() -> None:
    entry = consistency_entry()
    current = entry["statement"]["consistency"]["current"]
    for wrong in ([current[1], current[0], current[2]], [current[0], current[2]],
                  [*current, *current]):
        with pytest.raises(ProtocolError, match="current is not the statement's first"):
            v2.parse_statement_entry(0, set_member(entry, "current", wrong))
    # The stale observation added: the first four, but not what they make.
    stale = entry["statement"]["observations"][3]["sha256"]
    with pytest.raises(ProtocolError, match="does not agree"):
        v2.parse_statement_entry(0, set_member(entry, "current", [*current, stale]))


@pytest.mark.parametrize("value", [None, [], "split", {"kind": "split"}])
def test_a_consistency_of_another_shape_is_refused(value) -> None:
    entry = copy.deepcopy(consistency_entry())
    entry["statement"]["consistency"] = value
    with pytest.raises(ProtocolError, match="consistency must be an object"):
        v2.parse_statement_entry(0, entry)
    entry["statement"]["consistency"] = {
        **consistency_entry()["statement"]["consistency"], "extra": 1
    }
    with pytest.raises(ProtocolError, match="consistency must be an object"):
        v2.parse_statement_entry(0, entry)


def test_tampering_with_the_consistency_breaks_the_signature() -> None:
    entry = consistency_entry()
    # Removed: still well formed (an older notary's statement), not signed so.
    removed = copy.deepcopy(entry)
    del removed["statement"]["consistency"]
    with pytest.raises(VerificationError, match="signature"):
        v2.verify_statement(removed, keys(), now=NOW)
    # Changed, and still agreeing with the observations: a current set of
    # one (the newest), stable at its addresses.
    shrunk = set_member(entry, "current", entry["statement"]["consistency"]["current"][:1])
    shrunk["statement"]["consistency"]["kind"] = "stable"
    shrunk["statement"]["consistency"]["addresses"] = ["127.0.0.4", "::1"]
    v2.parse_statement_entry(0, shrunk)  # well formed...
    with pytest.raises(VerificationError, match="signature"):
        v2.verify_statement(shrunk, keys(), now=NOW)  # ...but not what was signed


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**60), 2**60) | st.text(max_size=70),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.sampled_from(["kind", "addresses", "current", "x"]), children),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_any_consistency_value_parses_or_is_a_502(value) -> None:
    entry = copy.deepcopy(consistency_entry())
    entry["statement"]["consistency"] = value
    try:
        v2.parse_statement_entry(0, entry)
    except ProtocolError as exc:
        assert exc.status == 502


# -- R4: spki_sha256 and address ----------------------------------------------------


def parse(*entries: dict[str, Any]) -> v2.QueryRequest:
    data = json.dumps({"targets": list(entries)}).encode()
    return v2.parse_query_request(data, max_batch=10, max_body_bytes=65536)


GOOD = {"host": SITE, "port": 443}
SPKI = "ef" * 32


def test_spki_sha256_alone_or_with_the_others() -> None:
    request = parse(
        {**GOOD, "spki_sha256": SPKI.upper()},
        {**GOOD, "spki_sha256": ":".join([SPKI[:2]] * 32), "sha256": "ab" * 32, "sha1": "cd" * 20},
        {**GOOD, "spki_sha256": None},
    )
    first, second, third = request.targets
    assert first == TargetQuery(TARGET, spki_sha256=bytes.fromhex(SPKI))
    assert first.key_only and first.submitted
    assert second.spki_sha256 == bytes.fromhex(SPKI) and not second.key_only
    assert third == TargetQuery(TARGET) and not third.submitted


def test_entries_without_the_new_fields_parse_as_before() -> None:
    (query,) = parse({**GOOD, "sha1": "cd" * 20}).targets
    assert query == TargetQuery(TARGET, None, bytes.fromhex("cd" * 20))
    assert query.spki_sha256 is None and query.address is None


@pytest.mark.parametrize(("address", "normalised"), [
    ("192.0.2.1", "192.0.2.1"),
    ("2001:DB8:0:0:0:0:0:1", "2001:db8::1"),
    ("2001:db8::1", "2001:db8::1"),
    ("::ffff:192.0.2.7", "192.0.2.7"),
    ("::FFFF:C000:0207", "192.0.2.7"),
    ("::1", "::1"),
    ("ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"),
    (None, None),
])
def test_the_address_is_normalised(address, normalised) -> None:
    (query,) = parse({**GOOD, "address": address}).targets
    assert query.address == normalised


@pytest.mark.parametrize("address", [
    "", "[::1]", "fe80::1%eth0", "192.0.2.1:443", "01.2.3.4", "192.0.2", "192.0.2.256",
    "example.com", " 192.0.2.1", "192.0.2.1\n", "\uff11\uff19\uff12.0.2.1", "::1::", "x" * 10_000,
    "<script>", 3232235777, ["192.0.2.1"], {"v4": "192.0.2.1"}, True,
])
def test_junk_addresses_are_refused_naming_the_field(address) -> None:
    with pytest.raises(ProtocolError) as raised:
        parse(GOOD, {**GOOD, "address": address})
    error = raised.value
    assert error.status == 400
    assert error.message.startswith("targets[1].address: must be an IPv4 or IPv6 address")
    if isinstance(address, str) and address:
        assert address.strip() not in error.message


@pytest.mark.parametrize("value", ["ef" * 31, "zz" * 32, "ef" * 33, 7, ["ef" * 32], "ef:" * 31])
def test_bad_keys_are_refused_naming_the_field(value) -> None:
    expected = r"^targets\[0\]\.spki_sha256: must be 64 hex"
    with pytest.raises(ProtocolError, match=expected) as raised:
        parse({**GOOD, "spki_sha256": value})
    assert raised.value.status == 400


def test_an_unknown_field_names_the_known_ones() -> None:
    expected = "expected host, port, sha256, sha1, spki_sha256, address"
    with pytest.raises(ProtocolError, match=expected):
        parse({**GOOD, "spki": SPKI})


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60) | st.integers() | st.none() | st.booleans())
def test_any_address_parses_to_an_address_or_is_a_400(value) -> None:
    try:
        (query,) = parse({**GOOD, "address": value}).targets
    except ProtocolError as exc:
        assert exc.status == 400 and exc.message.startswith("targets[0].address:")
    else:
        assert query.address is None or str(ipaddress.ip_address(query.address)) == query.address


# -- V6: matches by key ---------------------------------------------------------------


def key_timeline() -> Timeline:
    """Two current certificates with their own keys, and a stale one."""
    return sightings_timeline([
        ("a", "192.0.2.1", NOW - 10), ("b", "192.0.2.2", NOW), ("gone", "192.0.2.3", NOW - 9 * DAY),
    ])


def judge(timeline: Timeline, query: TargetQuery) -> str:
    return v2.verdict_of(
        timeline, query.sha256, query.sha1, spki_sha256=query.spki_sha256,
        now=NOW, fresh_for_s=DAY,
    )


def test_a_key_alone_matches_any_certificate_of_the_current_set() -> None:
    timeline = key_timeline()
    for name in ("a", "b"):
        query = TargetQuery(TARGET, spki_sha256=certificate(name).spki_sha256)
        verdict = judge(timeline, query)
        assert verdict == v2.VERDICT_MATCH
        assert v2.matched_by(query, verdict) == v2.MATCHED_BY_SPKI


def test_a_stale_or_unknown_key_is_a_mismatch() -> None:
    timeline = key_timeline()
    for spki in (certificate("gone").spki_sha256, b"\x01" * 32):
        query = TargetQuery(TARGET, spki_sha256=spki)
        verdict = judge(timeline, query)
        assert verdict == v2.VERDICT_MISMATCH and v2.matched_by(query, verdict) is None


def test_a_key_with_a_certificate_hash_must_agree_with_it() -> None:
    timeline = key_timeline()
    a, b = certificate("a"), certificate("b")
    agreeing = TargetQuery(TARGET, sha256=a.sha256, spki_sha256=a.spki_sha256)
    assert judge(timeline, agreeing) == v2.VERDICT_MATCH
    assert v2.matched_by(agreeing, v2.VERDICT_MATCH) is None  # a match by certificate
    for disagreeing in (
        TargetQuery(TARGET, sha256=a.sha256, spki_sha256=b.spki_sha256),
        TargetQuery(TARGET, sha1=b.sha1, spki_sha256=a.spki_sha256),
    ):
        assert judge(timeline, disagreeing) == v2.VERDICT_MISMATCH


def test_a_renewal_with_the_same_key_matches_by_key() -> None:
    before, after = same_key_pair()
    assert before.spki_sha256 == after.spki_sha256 and before.sha256 != after.sha256
    timeline = Timeline(TARGET, (Observation(after, NOW - 100, NOW, ("192.0.2.1",)),))
    assert judge(timeline, TargetQuery(TARGET, sha256=before.sha256)) == v2.VERDICT_MISMATCH
    assert judge(timeline, TargetQuery(TARGET, spki_sha256=before.spki_sha256)) == (
        v2.VERDICT_MATCH
    )


def test_a_key_is_a_submitted_hash_for_answering_now_or_probing() -> None:
    timeline = key_timeline()

    def decide(spki: bytes, now: int) -> Decision:
        return v2.decide(timeline, None, None, spki_sha256=spki, now=now, fresh_for_s=DAY,
                         reprobe_after_s=300)

    assert decide(certificate("a").spki_sha256, NOW) is Decision.ANSWER
    assert decide(b"\x01" * 32, NOW) is Decision.ANSWER  # probed moments ago: that is the answer
    assert decide(b"\x01" * 32, NOW + 3600) is Decision.PROBE
    assert v2.decide(timeline, None, None, now=NOW, fresh_for_s=DAY,
                     reprobe_after_s=300) is Decision.ANSWER  # nothing submitted


# -- S2: matched_by in the envelope, and a client's checks ------------------------------


def signed_statement(timeline: Timeline) -> v2.SignedStatement:
    return v2.sign_statement(made(timeline), signer().sign)


def answer_for(results: list[QueryResult], nonce: str = "n") -> bytes:
    return v2.answer_bytes(
        results, nonce=nonce, signed_at=NOW, key_id=signer().key_id, sign=signer().sign
    )


def verify(data: bytes, queries: list[TargetQuery] | None) -> list[v2.VerifiedResult]:
    return v2.verify_answer(
        v2.parse_answer_document(data), keys(), nonce="n", now=NOW, queries=queries
    )


def test_an_answer_without_a_key_match_is_unchanged() -> None:
    statement = signed_statement(key_timeline())
    result = QueryResult(TARGET, v2.VERDICT_MATCH, statement)
    body = v2.envelope([result], nonce="n", signed_at=NOW, key_id=signer().key_id)
    assert body["results"] == [{
        "target": TARGET.key, "verdict": "match", "statement_signature": statement.signature,
    }]


def test_a_match_by_key_says_so_signed() -> None:
    timeline = key_timeline()
    query = TargetQuery(TARGET, spki_sha256=certificate("a").spki_sha256)
    result = QueryResult(TARGET, v2.VERDICT_MATCH, signed_statement(timeline),
                         v2.matched_by(query, v2.VERDICT_MATCH))
    data = answer_for([result])
    assert json.loads(data)["answer"]["results"][0]["matched_by"] == "spki"
    (verified,) = verify(data, [query])
    assert verified.verdict == v2.VERDICT_MATCH and verified.matched_by == "spki"
    assert verified.consistency is not None
    assert verified.consistency.kind is ConsistencyKind.SPLIT
    (without_query,) = verify(data, None)
    assert without_query.matched_by == "spki"
    # Removing it is not what was signed.
    document = json.loads(data)
    del document["answer"]["results"][0]["matched_by"]
    with pytest.raises(VerificationError, match="bad answer signature"):
        verify(json.dumps(document).encode(), [query])


@pytest.mark.parametrize(("verdict", "matched_by"), [
    (v2.VERDICT_MISMATCH, "spki"), (v2.VERDICT_UNKNOWN, "spki"), (v2.VERDICT_MATCH, "sha256"),
])
def test_matched_by_is_only_for_a_match_by_key(verdict, matched_by) -> None:
    result = QueryResult(TARGET, verdict, signed_statement(key_timeline()), matched_by)
    with pytest.raises(ValueError, match="matched_by"):
        v2.envelope([result], nonce=None, signed_at=NOW, key_id=signer().key_id)


def forged_answer(results: list[dict[str, Any]], statement: v2.SignedStatement) -> bytes:
    """An answer document signed by the trusted key around ``results`` as
    given (what a faulty notary could send)."""
    body = {"type": v2.ANSWER_TYPE, "nonce": "n", "signed_at": NOW,
            "key_id": signer().key_id, "results": results}
    data = v2.canonical_json(body)
    return v2.answer_document([statement], body, signer().sign(data), envelope_bytes=data)


@pytest.mark.parametrize(("verdict", "matched_by", "message"), [
    ("mismatch", "spki", "matched_by is only for a match"),
    ("match", "sha256", "matched_by must be one of spki"),
    ("match", None, "matched_by must be one of spki"),
])
def test_a_client_refuses_a_misplaced_matched_by(verdict, matched_by, message) -> None:
    statement = signed_statement(key_timeline())
    data = forged_answer([{"target": TARGET.key, "verdict": verdict, "matched_by": matched_by,
                           "statement_signature": statement.signature}], statement)
    with pytest.raises(ProtocolError, match=message) as raised:
        v2.parse_answer_document(data)
    assert raised.value.status == 502


def test_a_client_holds_the_match_to_what_it_submitted() -> None:
    timeline = key_timeline()
    statement = signed_statement(timeline)
    a = certificate("a")

    def row(matched_by: str | None) -> dict[str, Any]:
        base = {"target": TARGET.key, "verdict": "match",
                "statement_signature": statement.signature}
        return {**base, "matched_by": matched_by} if matched_by else base

    by_key = TargetQuery(TARGET, spki_sha256=a.spki_sha256)
    by_hash = TargetQuery(TARGET, sha256=a.sha256)
    # A key-only entry's match must say so; a hash entry's must not.
    with pytest.raises(VerificationError, match="by key alone"):
        verify(forged_answer([row(None)], statement), [by_key])
    with pytest.raises(VerificationError, match="by key alone"):
        verify(forged_answer([row("spki")], statement), [by_hash])
    # A match by a key no stated observation has is not backed.
    unknown = TargetQuery(TARGET, spki_sha256=b"\x02" * 32)
    with pytest.raises(VerificationError, match="not backed by its statement"):
        verify(forged_answer([row("spki")], statement), [unknown])
    # A key and a hash of two different certificates: no observation has both.
    mixed = TargetQuery(TARGET, sha256=a.sha256, spki_sha256=certificate("b").spki_sha256)
    with pytest.raises(VerificationError, match="not backed by its statement"):
        verify(forged_answer([row(None)], statement), [mixed])
