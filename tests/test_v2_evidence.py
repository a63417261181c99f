"""A v2 statement's ``verification`` object (docs/v2.md, rule S6), on the
client's side: parsed strictly, covered by the statement's signature, a
DANE-decided ``match`` backed by DANE's evidence, and shown by `notary
check`.

The evidence is made the server's way: ``notary.model.dane.verdict`` on a
real chain (trustme: a root, an intermediate, a leaf) and a TLSA lookup,
then ``notary.protocol.v2.evidence.verification`` into
``v2.statement(..., verification=...)``, signed with an Ed25519 key.
Loopback only: the scripted notaries listen on 127.0.0.1.
"""

from __future__ import annotations

import copy
import hashlib
import json
import ssl
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
import trio
import trustme
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from notary.cli.report import report_table
from notary.client import check as client
from notary.errors import ProtocolError
from notary.model.dane import (
    DaneJudgement,
    DaneMatch,
    DaneOutcome,
    DaneVerdict,
    DnssecStatus,
    Presented,
    Tlsa,
    TlsaLookup,
    verdict,
    verdict_on,
)
from notary.model.observations import Certificate, Observation, Timeline
from notary.model.targets import Target
from notary.protocol import v2
from notary.protocol.v2 import QueryResult, TargetQuery, VerificationError
from notary.protocol.v2.evidence import verification
from notary.protocol.voting import Outcome, Verdict
from notary.state import crypto
from tests.support.hostile_notaries import http, open_hostile_notary, read_request, sends
from tests.support.tls_targets import LOCALHOST, static_resolver

HOST = "www.example.test"
TARGET = Target(HOST, 443)
NOW = 1_770_000_000
DAY = 86400
CHECKED_AT = NOW - 30


# -- certificates, verdicts, statements ---------------------------------------------


def _chain(leaf: trustme.LeafCert) -> list[bytes]:
    return [ssl.PEM_cert_to_DER_cert(blob.bytes().decode("ascii")) for blob in leaf.cert_chain_pems]


_ROOT = trustme.CA()
_INTERMEDIATE = _ROOT.create_child_ca()
#: The site's chain (leaf first), and another certificate for the same name.
CHAIN = _chain(_INTERMEDIATE.issue_cert(HOST))
OTHER_CHAIN = _chain(trustme.CA().issue_cert(HOST))
LEAF = Certificate.from_der(CHAIN[0])
OTHER = Certificate.from_der(OTHER_CHAIN[0])
SIGNER = crypto.Ed25519Signer(crypto.generate_ed25519_key())
KEYS = {SIGNER.key_id: Ed25519PublicKey.from_public_bytes(SIGNER.public_raw)}


def dane_ee(der: bytes) -> Tlsa:
    """A ``3 1 1`` record for ``der``'s key (computed here, not by the module)."""
    spki = x509.load_der_x509_certificate(der).public_key().public_bytes(
        Encoding.DER, PublicFormat.SubjectPublicKeyInfo
    )
    return Tlsa(3, 1, 1, hashlib.sha256(spki).digest())


def judged(
    status: DnssecStatus, records: tuple[Tlsa, ...] = (), chain: list[bytes] = CHAIN
) -> DaneVerdict:
    lookup = TlsaLookup(status, records if status is DnssecStatus.SECURE else (), 300, CHECKED_AT)
    return verdict(lookup, chain, HOST, datetime.fromtimestamp(NOW, UTC), max_reuse_s=600)


def match_verdict() -> DaneVerdict:
    """Secure records, the second of two vouches for the leaf."""
    return judged(DnssecStatus.SECURE, (dane_ee(OTHER_CHAIN[0]), dane_ee(CHAIN[0])))


def mismatch_verdict() -> DaneVerdict:
    return judged(DnssecStatus.SECURE, (dane_ee(OTHER_CHAIN[0]),))


def timeline(*certificates: Certificate, target: Target = TARGET) -> Timeline:
    observations = tuple(
        Observation(c, NOW - (i + 2) * DAY, NOW - i * DAY - 60, ("192.0.2.1",),
                    ((NOW - (i + 2) * DAY, NOW - i * DAY - 60),))
        for i, c in enumerate(certificates)
    )
    return Timeline(target, observations)


def signed(
    evidence: dict[str, Any] | None, *certificates: Certificate, signed_at: int = NOW,
    signer: crypto.Ed25519Signer = SIGNER, target: Target = TARGET,
) -> v2.SignedStatement:
    body = v2.statement(
        timeline(*(certificates or (LEAF,)), target=target), key_id=signer.key_id,
        signed_at=signed_at,
        valid_for_s=DAY, verification=evidence,
    )
    return v2.sign_statement(body, signer.sign)


def entry_of(statement: v2.SignedStatement) -> dict[str, Any]:
    """The ``{"signature", "statement"}`` entry as a client receives it."""
    return json.loads(statement.entry)


def answer_of(verdict_name: str, statement: v2.SignedStatement, *, nonce: str = "n") -> bytes:
    return v2.answer_bytes(
        [QueryResult(TARGET, verdict_name, statement)], nonce=nonce, signed_at=NOW,
        key_id=SIGNER.key_id, sign=SIGNER.sign,
    )


def verify(data: bytes, query: TargetQuery | None = None) -> v2.VerifiedResult:
    (result,) = v2.verify_answer(
        v2.parse_answer_document(data), KEYS, nonce="n", now=NOW,
        queries=None if query is None else [query],
    )
    return result


# -- parsing ------------------------------------------------------------------------------


def test_the_evidence_round_trips() -> None:
    dane = match_verdict()
    statement = signed(verification("dane", dane))
    parsed = v2.verify_statement(entry_of(statement), KEYS, now=NOW)
    assert parsed.verification == v2.ParsedVerification(
        backend="dane",
        dane=v2.ParsedDane(
            outcome="match", dnssec="secure", checked_at=CHECKED_AT, sha256=LEAF.sha256,
            tlsa=(dane_ee(OTHER_CHAIN[0]), dane_ee(CHAIN[0])), matched=1,
        ),
    )
    assert parsed.verification.dane.matched_record == dane_ee(CHAIN[0])
    result = verify(answer_of(v2.VERDICT_MATCH, statement), TargetQuery(TARGET, sha1=LEAF.sha1))
    assert result.verification == parsed.verification


def test_a_large_rrset_is_cut_but_keeps_the_record_that_matched() -> None:
    """Past MAX_STATEMENT_TLSA records the statement is cut; the matched
    record stays in it (last), and records without data are left out."""
    from notary.protocol.v2.evidence import MAX_STATEMENT_TLSA

    others = tuple(Tlsa(3, 1, 1, bytes([i]) * 32) for i in range(MAX_STATEMENT_TLSA + 4))
    empty = Tlsa(3, 0, 0, b"")
    dane = judged(DnssecStatus.SECURE, (empty, *others, dane_ee(CHAIN[0])))
    assert dane.outcome.value == "match"
    parsed = v2.verify_statement(entry_of(signed(verification("dane", dane))), KEYS, now=NOW)
    stated = parsed.verification.dane
    assert len(stated.tlsa) == MAX_STATEMENT_TLSA and empty not in stated.tlsa
    assert stated.tlsa[:-1] == others[:MAX_STATEMENT_TLSA - 1]
    assert stated.matched == MAX_STATEMENT_TLSA - 1
    assert stated.matched_record == dane_ee(CHAIN[0])
    result = verify(answer_of(v2.VERDICT_MATCH, signed(verification("dane", dane))),
                    TargetQuery(TARGET, sha1=LEAF.sha1))
    assert result.verification.dane.matched_record == dane_ee(CHAIN[0])
    # A mismatch among many records: the first sixteen with data.
    missed = judged(DnssecStatus.SECURE, (empty, *others))
    stated = v2.verify_statement(entry_of(signed(verification("dane", missed))), KEYS,
                                 now=NOW).verification.dane
    assert stated.tlsa == others[:MAX_STATEMENT_TLSA] and stated.matched is None


def test_large_records_are_cut_to_a_loggable_size_keeping_the_one_that_matched() -> None:
    """Sixteen records of whole certificates (matching type 0) made a
    statement whose log entry passed 65,535 bytes: the log refused it, and
    every v2 answer for the site was 503 (issue 30). The evidence keeps the
    first records within ``MAX_STATEMENT_TLSA_CHARS``, and the matched one."""
    from notary.protocol.v2.evidence import MAX_STATEMENT_TLSA, MAX_STATEMENT_TLSA_CHARS

    big = tuple(Tlsa(3, 0, 0, bytes([i]) * 4000) for i in range(MAX_STATEMENT_TLSA))
    dane = judged(DnssecStatus.SECURE, (*big, dane_ee(CHAIN[0])))
    assert dane.outcome.value == "match"
    statement = signed(verification("dane", dane))
    assert len(statement.entry) < 65_535
    stated = v2.verify_statement(entry_of(statement), KEYS, now=NOW).verification.dane
    assert stated.matched_record == dane_ee(CHAIN[0]) and stated.matched == len(stated.tlsa) - 1
    kept = stated.tlsa[:-1]
    assert kept == big[:len(kept)] and 1 <= len(kept) < MAX_STATEMENT_TLSA
    assert sum(len(str(record)) for record in stated.tlsa) <= MAX_STATEMENT_TLSA_CHARS
    # A mismatch: the first records within the bound.
    missed = judged(DnssecStatus.SECURE, big)
    stated = v2.verify_statement(entry_of(signed(verification("dane", missed))), KEYS,
                                 now=NOW).verification.dane
    assert stated.tlsa == big[:len(stated.tlsa)] and stated.matched is None
    assert sum(len(str(record)) for record in stated.tlsa) <= MAX_STATEMENT_TLSA_CHARS


@pytest.mark.parametrize(("backend", "made", "outcome", "dnssec", "records"), [
    ("dane", mismatch_verdict, "mismatch", "secure", 1),
    ("perspective", lambda: judged(DnssecStatus.SECURE_DENIAL), "no-tlsa", "secure-denial", 0),
    ("perspective", lambda: judged(DnssecStatus.SECURE, (Tlsa(1, 1, 1, b"\1" * 32),)),
     "no-tlsa", "secure", 1),  # only unusable records
    ("perspective", lambda: judged(DnssecStatus.INSECURE), "insecure", "insecure", 0),
    ("dane", lambda: judged(DnssecStatus.BOGUS), "bogus", "bogus", 0),
    ("dane", lambda: judged(DnssecStatus.RESOLVER_FAILURE), "resolver-failure",
     "resolver-failure", 0),
])
def test_each_outcome_parses(
    backend: str, made: Callable[[], DaneVerdict], outcome: str, dnssec: str, records: int
) -> None:
    parsed = v2.verify_statement(entry_of(signed(verification(backend, made()))), KEYS, now=NOW)
    assert parsed.verification is not None and parsed.verification.backend == backend
    dane = parsed.verification.dane
    assert dane is not None
    assert (dane.outcome, dane.dnssec, len(dane.tlsa), dane.matched) == (
        outcome, dnssec, records, None)
    assert dane.sha256 == LEAF.sha256 and dane.matched_record is None


@pytest.mark.parametrize("status", [DnssecStatus.BOGUS, DnssecStatus.RESOLVER_FAILURE])
def test_a_dnssec_failure_before_any_probe_judges_no_certificate(status: DnssecStatus) -> None:
    """The name's own lookup failed: no certificate was probed, so none was
    judged (``sha256`` null), in a statement that may have no observation."""
    lookup = TlsaLookup(status, checked_at=CHECKED_AT)
    failed = verdict(lookup, (), HOST, datetime.fromtimestamp(NOW, UTC), failure_reuse_s=30)
    evidence = verification("dane", failed)
    assert evidence["dane"]["sha256"] is None
    body = v2.statement(Timeline(TARGET), key_id=SIGNER.key_id, signed_at=NOW, valid_for_s=DAY,
                        verification=evidence)
    parsed = v2.verify_statement(entry_of(v2.sign_statement(body, SIGNER.sign)), KEYS, now=NOW)
    assert parsed.observations == ()
    dane = parsed.verification.dane if parsed.verification is not None else None
    assert dane is not None and (dane.outcome, dane.sha256) == (status.value, None)
    text = client.backend_text(parsed.verification, now=NOW)
    assert text.startswith("DANE: ") and "checked 30 s ago" in text


def test_no_dane_check_is_null() -> None:
    parsed = v2.verify_statement(entry_of(signed(verification("dane", None))), KEYS, now=NOW)
    assert parsed.verification == v2.ParsedVerification("dane", None)


def test_a_statement_without_verification_is_as_before() -> None:
    statement = signed(None)
    assert b"verification" not in statement.statement
    plain = v2.statement(timeline(LEAF), key_id=SIGNER.key_id, signed_at=NOW, valid_for_s=DAY)
    assert v2.statement_bytes(plain) == statement.statement  # byte for byte
    parsed = v2.verify_statement(entry_of(statement), KEYS, now=NOW)
    assert parsed.verification is None
    result = verify(answer_of(v2.VERDICT_MATCH, statement), TargetQuery(TARGET, sha1=LEAF.sha1))
    assert (result.verdict, result.verification) == (v2.VERDICT_MATCH, None)


def _set(path: str, value: object) -> Callable[[dict[str, Any]], None]:
    """Set ``statement.verification.<path>`` (dotted) to ``value``."""

    def change(statement: dict[str, Any]) -> None:
        *parents, last = ["verification", *path.split(".")] if path else ["verification"]
        node = statement
        for name in parents:
            node = node[name]
        node[last] = value

    return change


def _drop(path: str) -> Callable[[dict[str, Any]], None]:
    def change(statement: dict[str, Any]) -> None:
        *parents, last = ["verification", *path.split(".")]
        node = statement
        for name in parents:
            node = node[name]
        del node[last]

    return change


_GOOD = str(dane_ee(CHAIN[0]))
_MALFORMED = {
    "verification null": _set("", None),
    "verification an array": _set("", []),
    "verification a string": _set("", "dane"),
    "extra member": _set("extra", 1),
    "backend missing": _drop("backend"),
    "dane missing": _drop("dane"),
    "backend unknown": _set("backend", "network"),
    "backend upper case": _set("backend", "DANE"),
    "backend a number": _set("backend", 1),
    "backend null": _set("backend", None),
    "dane an array": _set("dane", []),
    "dane a string": _set("dane", "match"),
    "dane extra member": _set("dane.ttl", 300),
    "outcome missing": _drop("dane.outcome"),
    "dnssec missing": _drop("dane.dnssec"),
    "checked_at missing": _drop("dane.checked_at"),
    "sha256 missing": _drop("dane.sha256"),
    "tlsa missing": _drop("dane.tlsa"),
    "matched missing": _drop("dane.matched"),
    "outcome unknown": _set("dane.outcome", "ok"),
    "outcome a number": _set("dane.outcome", 0),
    "dnssec unknown": _set("dane.dnssec", "validated"),
    "dnssec null": _set("dane.dnssec", None),
    "match from an insecure zone": _set("dane.dnssec", "insecure"),
    "match from a secure denial": _set("dane.dnssec", "secure-denial"),
    "match from bogus": _set("dane.dnssec", "bogus"),
    "checked_at a float": _set("dane.checked_at", float(CHECKED_AT)),
    "checked_at negative": _set("dane.checked_at", -1),
    "checked_at a string": _set("dane.checked_at", str(CHECKED_AT)),
    "checked_at true": _set("dane.checked_at", True),
    "checked_at too large": _set("dane.checked_at", 2**53),
    "checked_at null": _set("dane.checked_at", None),
    "sha256 upper case": _set("dane.sha256", LEAF.sha256.hex().upper()),
    "sha256 short": _set("dane.sha256", LEAF.sha256.hex()[:62]),
    "sha256 a sha1": _set("dane.sha256", LEAF.sha1.hex()),
    "sha256 colons": _set("dane.sha256", ":".join(f"{b:02x}" for b in LEAF.sha256)),
    "sha256 null": _set("dane.sha256", None),
    "sha256 not hex": _set("dane.sha256", "g" * 64),
    "tlsa an object": _set("dane.tlsa", {"0": _GOOD}),
    "tlsa a string": _set("dane.tlsa", _GOOD),
    "tlsa null": _set("dane.tlsa", None),
    "tlsa too many": _set("dane.tlsa", [_GOOD] * (v2.MAX_STATEMENT_TLSA + 1)),
    "tlsa record a number": _set("dane.tlsa", [_GOOD, 3]),
    "tlsa record not hex": _set("dane.tlsa", [_GOOD, "3 1 1 zz"]),
    "tlsa record three fields": _set("dane.tlsa", [_GOOD, "3 1 1"]),
    "tlsa record field over 255": _set("dane.tlsa", [_GOOD, "256 1 1 " + "ab" * 32]),
    "tlsa record negative field": _set("dane.tlsa", [_GOOD, "-3 1 1 " + "ab" * 32]),
    "tlsa record upper-case hex": _set("dane.tlsa", [_GOOD, "3 1 1 " + "AB" * 32]),
    "tlsa record split hex": _set("dane.tlsa", [_GOOD, "3 1 1 " + "ab" * 16 + " " + "ab" * 16]),
    "tlsa record extra spaces": _set("dane.tlsa", [_GOOD, " 3  1 1 " + "ab" * 32]),
    "tlsa record empty": _set("dane.tlsa", [_GOOD, ""]),
    "matched null on a match": _set("dane.matched", None),
    "matched out of range": _set("dane.matched", 2),
    "matched negative": _set("dane.matched", -1),
    "matched a float": _set("dane.matched", 1.0),
    "matched true": _set("dane.matched", True),
    "matched a string": _set("dane.matched", "1"),
    "matched an unusable record": _set("dane.tlsa", [_GOOD, "1 1 1 " + "ab" * 32]),
    "match without records": _set("dane.tlsa", []),
    "match judging no certificate": _set("dane.sha256", None),
}
_MALFORMED_OTHERS = {
    # On a mismatch (one record, matched null).
    "mismatch with matched set": ("mismatch", _set("dane.matched", 0)),
    "mismatch from a secure denial": ("mismatch", _set("dane.dnssec", "secure-denial")),
    # On a secure denial (no records).
    "no-tlsa from bogus": ("no-tlsa", _set("dane.dnssec", "bogus")),
    "no-tlsa from an insecure zone": ("no-tlsa", _set("dane.dnssec", "insecure")),
    "records of a secure denial": ("no-tlsa", _set("dane.tlsa", [_GOOD])),
    # On an unsigned zone.
    "records of an insecure zone": ("insecure", _set("dane.tlsa", [_GOOD])),
    "insecure from a secure zone": ("insecure", _set("dane.dnssec", "secure")),
    "bogus from a resolver failure": ("bogus", _set("dane.dnssec", "resolver-failure")),
    # A null sha256 says no certificate was judged: DNSSEC failures only.
    "mismatch judging no certificate": ("mismatch", _set("dane.sha256", None)),
    "no-tlsa judging no certificate": ("no-tlsa", _set("dane.sha256", None)),
    "insecure judging no certificate": ("insecure", _set("dane.sha256", None)),
    "a failure judging an empty string": ("bogus", _set("dane.sha256", "")),
}
_MADE = {
    "match": match_verdict,
    "mismatch": mismatch_verdict,
    "no-tlsa": lambda: judged(DnssecStatus.SECURE_DENIAL),
    "insecure": lambda: judged(DnssecStatus.INSECURE),
    "bogus": lambda: judged(DnssecStatus.BOGUS),
}


def _assert_malformed(entry: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError) as raised:
        v2.verify_statement(entry, KEYS, now=NOW)
    assert type(raised.value) is ProtocolError  # refused as malformed, before any signature
    assert raised.value.status == 502
    assert raised.value.message.startswith("malformed v2 answer: statements[0].statement")
    document = {
        "answer": json.loads(v2.canonical_json(v2.envelope(
            [], nonce="n", signed_at=NOW, key_id=SIGNER.key_id))),
        "signature": SIGNER.sign(b"x"), "statements": [entry],
    }
    with pytest.raises(ProtocolError) as raised:
        v2.parse_answer_document(json.dumps(document).encode())
    assert type(raised.value) is ProtocolError and raised.value.status == 502


@pytest.mark.parametrize("change", list(_MALFORMED.values()), ids=list(_MALFORMED))
def test_a_malformed_match_evidence_is_a_502(change: Callable[[dict[str, Any]], None]) -> None:
    entry = entry_of(signed(verification("dane", match_verdict())))
    change(entry["statement"])
    _assert_malformed(entry)


@pytest.mark.parametrize(
    ("outcome", "change"), list(_MALFORMED_OTHERS.values()), ids=list(_MALFORMED_OTHERS)
)
def test_malformed_evidence_of_other_outcomes_is_a_502(
    outcome: str, change: Callable[[dict[str, Any]], None]
) -> None:
    entry = entry_of(signed(verification("dane", _MADE[outcome]())))
    change(entry["statement"])
    _assert_malformed(entry)


def test_malformed_evidence_never_raises_another_exception() -> None:
    """Every member of the evidence replaced by values of every JSON type."""
    values: list[object] = [None, True, 0, -1, 2**60, 1.5, "", "x", [], [None], {}, {"a": 1}]
    entry = entry_of(signed(verification("dane", match_verdict())))
    paths = ["", "backend", "dane", *(f"dane.{k}" for k in entry["statement"]["verification"]["dane"])]
    for path in paths:
        for value in values:
            changed = copy.deepcopy(entry)
            _set(path, value)(changed["statement"])
            try:
                v2.verify_statement(changed, KEYS, now=NOW)
            except ProtocolError as exc:
                assert exc.status == 502
            # else: a valid value of another shape cannot pass the signature


# -- signatures ----------------------------------------------------------------------------


_TAMPERED = {
    "backend": _set("backend", "perspective"),
    "dane removed": _set("dane", None),
    "checked_at": _set("dane.checked_at", CHECKED_AT + 1),
    "sha256": _set("dane.sha256", OTHER.sha256.hex()),
    "tlsa record": _set("dane.tlsa", [_GOOD, _GOOD]),
    "tlsa order": _set("dane.tlsa", [_GOOD, str(dane_ee(OTHER_CHAIN[0]))]),
    "matched": _set("dane.matched", 0),
    "verification removed": lambda statement: statement.pop("verification"),
}


@pytest.mark.parametrize("change", list(_TAMPERED.values()), ids=list(_TAMPERED))
def test_tampered_evidence_breaks_the_signature(change: Callable[[dict[str, Any]], None]) -> None:
    statement = signed(verification("dane", match_verdict()))
    entry = entry_of(statement)
    change(entry["statement"])
    with pytest.raises(VerificationError, match="signature does not verify"):
        v2.verify_statement(entry, KEYS, now=NOW)
    document = json.loads(answer_of(v2.VERDICT_MATCH, statement))
    change(document["statements"][0]["statement"])
    with pytest.raises(VerificationError, match="bad statement signature"):
        verify(json.dumps(document).encode())


def test_outcome_and_status_tampered_together_break_the_signature() -> None:
    entry = entry_of(signed(verification("perspective", judged(DnssecStatus.SECURE_DENIAL))))
    _set("dane.outcome", "insecure")(entry["statement"])
    _set("dane.dnssec", "insecure")(entry["statement"])
    with pytest.raises(VerificationError, match="signature does not verify"):
        v2.verify_statement(entry, KEYS, now=NOW)


def test_evidence_added_to_a_plain_statement_breaks_its_signature() -> None:
    entry = entry_of(signed(None))
    entry["statement"]["verification"] = verification("perspective", None)
    with pytest.raises(VerificationError, match="signature does not verify"):
        v2.verify_statement(entry, KEYS, now=NOW)


# -- verifying a DANE-decided match ---------------------------------------------------------


@pytest.mark.parametrize("query", [
    TargetQuery(TARGET, sha1=LEAF.sha1),
    TargetQuery(TARGET, sha256=LEAF.sha256),
    TargetQuery(TARGET, sha256=LEAF.sha256, sha1=LEAF.sha1),
    None,
], ids=["sha1", "sha256", "both", "no-query"])
def test_a_dane_match_backed_by_its_evidence_verifies(query: TargetQuery | None) -> None:
    statement = signed(verification("dane", match_verdict()), LEAF, OTHER)
    result = verify(answer_of(v2.VERDICT_MATCH, statement), query)
    assert result.verdict == v2.VERDICT_MATCH
    assert result.verification is not None and result.verification.backend == "dane"


@pytest.mark.parametrize("query", [TargetQuery(TARGET, sha1=LEAF.sha1), None],
                         ids=["query", "no-query"])
def test_a_dane_match_on_mismatch_evidence_is_refused(query: TargetQuery | None) -> None:
    statement = signed(verification("dane", mismatch_verdict()))
    with pytest.raises(VerificationError, match="not backed by its DANE evidence"):
        verify(answer_of(v2.VERDICT_MATCH, statement), query)


@pytest.mark.parametrize("made", [
    lambda: judged(DnssecStatus.SECURE_DENIAL), lambda: judged(DnssecStatus.INSECURE),
    lambda: judged(DnssecStatus.BOGUS), lambda: None,
], ids=["no-tlsa", "insecure", "bogus", "not-checked"])
def test_a_dane_match_without_a_dane_match_is_refused(made: Callable[[], DaneVerdict | None]) -> None:
    statement = signed(verification("dane", made()))
    with pytest.raises(VerificationError, match="not backed by its DANE evidence"):
        verify(answer_of(v2.VERDICT_MATCH, statement), TargetQuery(TARGET, sha1=LEAF.sha1))


def test_a_dane_match_on_another_certificate_is_refused() -> None:
    """DANE vouched for OTHER; the client asked about LEAF, which the
    statement also lists (so the perspective's check alone would pass)."""
    other_match = judged(DnssecStatus.SECURE, (dane_ee(OTHER_CHAIN[0]),), OTHER_CHAIN)
    assert other_match.outcome.value == "match"
    statement = signed(verification("dane", other_match), LEAF, OTHER)
    data = answer_of(v2.VERDICT_MATCH, statement)
    for query in (TargetQuery(TARGET, sha1=LEAF.sha1), TargetQuery(TARGET, sha256=LEAF.sha256)):
        with pytest.raises(VerificationError, match="not backed by its DANE evidence"):
            verify(data, query)
    assert verify(data, TargetQuery(TARGET, sha1=OTHER.sha1)).verdict == v2.VERDICT_MATCH
    # Without the query: the judged certificate must be one the statement lists.
    unlisted = signed(verification("dane", other_match), LEAF)
    with pytest.raises(VerificationError, match="not backed by its DANE evidence"):
        verify(answer_of(v2.VERDICT_MATCH, unlisted))


@pytest.mark.parametrize("made", [
    lambda: judged(DnssecStatus.SECURE_DENIAL), lambda: judged(DnssecStatus.INSECURE),
    lambda: judged(DnssecStatus.SECURE, (Tlsa(1, 1, 1, b"\1" * 32),)), lambda: None,
], ids=["no-tlsa", "insecure", "only-unusable", "not-checked"])
def test_a_perspective_match_with_dane_evidence_verifies(
    made: Callable[[], DaneVerdict | None],
) -> None:
    statement = signed(verification("perspective", made()))
    result = verify(answer_of(v2.VERDICT_MATCH, statement), TargetQuery(TARGET, sha1=LEAF.sha1))
    assert result.verdict == v2.VERDICT_MATCH
    assert result.verification is not None and result.verification.backend == "perspective"


@pytest.mark.parametrize("verdict_name", [
    v2.VERDICT_MISMATCH, v2.VERDICT_UNKNOWN, v2.VERDICT_UNREACHABLE, v2.VERDICT_REFUSED,
])
def test_other_verdicts_need_no_dane_match(verdict_name: str) -> None:
    statement = signed(verification("dane", mismatch_verdict()))
    result = verify(answer_of(verdict_name, statement), TargetQuery(TARGET, sha1=LEAF.sha1))
    assert result.verdict == verdict_name and result.verification is not None


def test_the_perspective_check_still_comes_first() -> None:
    """A DANE match on LEAF does not back a match for a certificate the
    statement does not list."""
    statement = signed(verification("dane", match_verdict()))
    with pytest.raises(VerificationError, match="not backed by its statement"):
        verify(answer_of(v2.VERDICT_MATCH, statement), TargetQuery(TARGET, sha1=OTHER.sha1))


# -- `notary check` -------------------------------------------------------------------------


def _parsed(evidence: dict[str, Any] | None) -> v2.ParsedVerification | None:
    return v2.verify_statement(entry_of(signed(evidence)), KEYS, now=NOW).verification


@pytest.mark.parametrize(("evidence", "asked", "shown"), [
    (None, None, "network perspective"),
    (verification("perspective", None), None, "network perspective (DANE not checked)"),
    (verification("perspective", judged(DnssecStatus.SECURE_DENIAL)), None,
     "DANE: no TLSA; network perspective decided"),
    (verification("perspective", judged(DnssecStatus.INSECURE)), None,
     "DANE: zone not signed; network perspective decided"),
    (verification("dane", match_verdict()), [LEAF.sha256],
     f"DANE: match, TLSA 3 1 1 {dane_ee(CHAIN[0]).data.hex()[:16]}..., checked 30 s ago"),
    (verification("dane", match_verdict()), [],
     f"DANE: match for another certificate, TLSA 3 1 1 {dane_ee(CHAIN[0]).data.hex()[:16]}..., "
     "checked 30 s ago"),
    (verification("dane", mismatch_verdict()), None, "DANE: mismatch, 1 TLSA record, checked 30 s ago"),
    (verification("dane", judged(DnssecStatus.SECURE_DENIAL)), None, "DANE: no TLSA, checked 30 s ago"),
    (verification("dane", judged(DnssecStatus.BOGUS)), None,
     "DANE: DNSSEC validation failed, checked 30 s ago"),
    (verification("dane", judged(DnssecStatus.RESOLVER_FAILURE)), None,
     "DANE: no answer from the resolver, checked 30 s ago"),
    (verification("dane", None), None, "DANE: not checked yet"),
])
def test_backend_text(evidence: dict[str, Any] | None, asked: list[bytes] | None, shown: str) -> None:
    assert client.backend_text(_parsed(evidence), now=NOW, asked=asked) == shown


def _scripted_v2_notary(evidence: dict[str, Any] | None, verdict_name: str):
    """A v2 notary answering every query with ``verdict_name`` and a fresh
    statement of LEAF carrying ``evidence``, bound to the request's nonce."""
    key_document = http(v2.key_document([
        v2.publish_key(SIGNER.public_raw, not_before=0, not_after=2**40)
    ]))

    def make(requests: list[bytes]):
        async def handle(stream: trio.SSLStream[trio.SocketStream]) -> None:
            request = await read_request(stream)
            requests.append(request)
            if request.startswith(b"GET /v2/key "):
                await stream.send_all(key_document)
                return
            query = json.loads(request.partition(b"\r\n\r\n")[2])
            now = int(time.time())
            target = Target(query["targets"][0]["host"], query["targets"][0]["port"])
            statement = signed(evidence, LEAF, signed_at=now, target=target)
            body = v2.answer_bytes(
                [QueryResult(target, verdict_name, statement)], nonce=query["nonce"],
                signed_at=now, key_id=SIGNER.key_id, sign=SIGNER.sign,
            )
            await stream.send_all(http(body))

        return handle

    return make


async def test_check_shows_which_backend_vouched() -> None:
    """Three v2 notaries (DANE match, perspective after no TLSA, perspective
    only) and a Convergence notary answering 303."""
    dane_match = match_verdict()
    checked = time.time()
    async with (
        open_hostile_notary(handler=_scripted_v2_notary(
            verification("dane", dane_match), v2.VERDICT_MATCH), name="Dane") as dane,
        open_hostile_notary(handler=_scripted_v2_notary(
            verification("perspective", judged(DnssecStatus.SECURE_DENIAL)), v2.VERDICT_MATCH),
            name="Perspective") as perspective,
        open_hostile_notary(handler=_scripted_v2_notary(None, v2.VERDICT_MATCH),
                            name="Plain") as plain,
        open_hostile_notary(handler=_scripted_v2_notary(
            verification("dane", judged(DnssecStatus.SECURE_DENIAL)), v2.VERDICT_UNKNOWN),
            name="Undecided") as undecided,
    ):
        report = await client.check(
            Target(LOCALHOST, 443), [dane.bundle, perspective.bundle, plain.bundle,
                                     undecided.bundle],
            fingerprint=LEAF.sha1, relay=None, timeout_s=10.0, use_v2=True, quorum=4,
            resolver=static_resolver({}),
        )
    rows = {a.notary: a for a in report.answers}
    assert {name: a.verdict for name, a in rows.items()} == {
        "Dane": Verdict.SUCCESS, "Perspective": Verdict.SUCCESS, "Plain": Verdict.SUCCESS,
        "Undecided": Verdict.INCONCLUSIVE,
    }
    assert {name: a.backend for name, a in rows.items()} == {
        "Dane": "dane", "Perspective": "perspective", "Plain": "perspective", "Undecided": "dane",
    }
    prefix = f"DANE: match, TLSA 3 1 1 {dane_ee(CHAIN[0]).data.hex()[:16]}..., checked "
    assert rows["Dane"].detail.startswith(prefix) and rows["Dane"].detail.endswith(" s ago")
    ago = int(rows["Dane"].detail.removeprefix(prefix).removesuffix(" s ago"))
    assert abs(ago - (int(checked) - CHECKED_AT)) <= 5
    assert rows["Perspective"].detail == "DANE: no TLSA; network perspective decided"
    assert rows["Plain"].detail == "network perspective"
    assert rows["Undecided"].detail.startswith("unknown; DANE: no TLSA, checked ")
    assert report.tally.outcome is Outcome.VERIFIED
    table = report_table(report, now=time.time()).splitlines()
    assert len(table) == 7 and all(line.isprintable() for line in table)
    assert prefix in next(line for line in table if line.startswith("Dane "))


async def test_check_shows_a_convergence_303_as_inconclusive() -> None:
    reason = b"inconclusive: the site publishes no TLSA records (DNSSEC-proven)\n"
    async with (
        open_hostile_notary(sends(http(reason, 303)), name="Dane") as dane,
        open_hostile_notary(sends(http(b"", 303)), name="Busy") as busy,
        open_hostile_notary(sends(http(b"\xff\xfe\n", 303)), name="Garbled") as garbled,
    ):
        report = await client.check(
            Target(LOCALHOST, 443), [dane.bundle, busy.bundle, garbled.bundle],
            fingerprint=LEAF.sha1, relay=None, timeout_s=10.0, quorum=3,
            resolver=static_resolver({}),
        )
    rows = {a.notary: a for a in report.answers}
    assert all(a.verdict is Verdict.INCONCLUSIVE and a.backend is None for a in rows.values())
    assert rows["Dane"].detail == (
        "inconclusive (HTTP 303): the site publishes no TLSA records (DNSSEC-proven)"
    )
    assert rows["Busy"].detail == rows["Garbled"].detail == "inconclusive (HTTP 303)"
    assert (report.tally.outcome, report.tally.counted, report.tally.stood_aside) == (
        Outcome.INCONCLUSIVE, 0, 3)


# -- several certificates at once: `judged` (issue 31) -------------------------------------

#: A second certificate the site serves at another address, from the same
#: intermediate as LEAF (a DANE-TA record on it vouches for both).
SECOND_CHAIN = _chain(_INTERMEDIATE.issue_cert(HOST))
SECOND = Certificate.from_der(SECOND_CHAIN[0])


def split_verdict(records: tuple[Tlsa, ...], *chains: list[bytes]) -> DaneVerdict:
    """The verdict on every chain a probe of a split site saw."""
    lookup = TlsaLookup(DnssecStatus.SECURE, records, 300, CHECKED_AT)
    return verdict_on(lookup, [Presented.of(chain) for chain in chains], HOST,
                      datetime.fromtimestamp(NOW, UTC), max_reuse_s=600)


def both_vouched() -> DaneVerdict:
    """Two `3 1 1` records, one for each certificate (after an unrelated one)."""
    return split_verdict(
        (dane_ee(OTHER_CHAIN[0]), dane_ee(SECOND_CHAIN[0]), dane_ee(CHAIN[0])), CHAIN,
        SECOND_CHAIN)


def one_vouched() -> DaneVerdict:
    """A record for LEAF only: SECOND is judged, and not vouched for."""
    return split_verdict((dane_ee(CHAIN[0]),), SECOND_CHAIN, CHAIN)


def split_statement(dane: DaneVerdict | None) -> v2.SignedStatement:
    return signed(verification("dane", dane), LEAF, SECOND)


def test_each_certificate_judged_is_stated_with_the_record_that_vouched() -> None:
    dane = both_vouched()
    evidence = verification("dane", dane)["dane"]
    main, other = sorted([LEAF, SECOND], key=lambda c: c.sha256)
    assert evidence["sha256"] == main.sha256.hex()
    assert evidence["tlsa"] == [str(dane_ee(OTHER_CHAIN[0])), str(dane_ee(SECOND_CHAIN[0])),
                                str(dane_ee(CHAIN[0]))]
    index = {LEAF.sha256: 2, SECOND.sha256: 1}
    assert evidence["matched"] == index[main.sha256]
    assert evidence["judged"] == [{"sha256": other.sha256.hex(), "matched": index[other.sha256]}]
    parsed = v2.verify_statement(entry_of(split_statement(dane)), KEYS, now=NOW)
    stated = parsed.verification.dane
    assert stated.judged == (v2.ParsedJudgement(other.sha256, index[other.sha256]),)
    assert stated.record_for(LEAF.sha256) == dane_ee(CHAIN[0])
    assert stated.record_for(SECOND.sha256) == dane_ee(SECOND_CHAIN[0])
    assert stated.record_for(OTHER.sha256) is None
    assert v2.stated_vouched(dane) == {LEAF.sha256, SECOND.sha256}


@pytest.mark.parametrize("asked", [LEAF, SECOND], ids=["leaf", "second"])
@pytest.mark.parametrize("made", [both_vouched, lambda: split_verdict(
    (dane_ee(OTHER_CHAIN[0]), Tlsa(2, 0, 1, hashlib.sha256(CHAIN[1]).digest())), CHAIN,
    SECOND_CHAIN)], ids=["two-ee-records", "one-ta-record"])
def test_a_dane_match_for_any_certificate_judged_verifies(
    made: Callable[[], DaneVerdict], asked: Certificate,
) -> None:
    statement = split_statement(made())
    for query in (TargetQuery(TARGET, sha1=asked.sha1), TargetQuery(TARGET, sha256=asked.sha256),
                  TargetQuery(TARGET, sha256=asked.sha256, sha1=asked.sha1), None):
        result = verify(answer_of(v2.VERDICT_MATCH, statement), query)
        assert result.verdict == v2.VERDICT_MATCH
    text = client.backend_text(_parsed_of(statement), now=NOW, asked=[asked.sha256])
    assert text.startswith("DANE: match, TLSA ") and "another" not in text


def _parsed_of(statement: v2.SignedStatement) -> v2.ParsedVerification | None:
    return v2.verify_statement(entry_of(statement), KEYS, now=NOW).verification


def test_a_shared_trust_anchor_is_stated_once() -> None:
    anchor = Tlsa(2, 0, 1, hashlib.sha256(CHAIN[1]).digest())
    evidence = verification("dane", split_verdict((anchor,), CHAIN, SECOND_CHAIN))["dane"]
    assert evidence["tlsa"] == [str(anchor)] and evidence["matched"] == 0
    assert [entry["matched"] for entry in evidence["judged"]] == [0]


def test_a_dane_match_for_a_certificate_no_record_vouches_for_is_refused() -> None:
    """SECOND is judged (the statement says so) and no record vouches for
    it: a match for it is refused, one for LEAF verifies, and a mismatch
    for SECOND is what the evidence backs."""
    dane = one_vouched()
    statement = split_statement(dane)
    (entry,) = verification("dane", dane)["dane"]["judged"]
    assert entry == {"sha256": SECOND.sha256.hex(), "matched": None}
    data = answer_of(v2.VERDICT_MATCH, statement)
    for query in (TargetQuery(TARGET, sha1=SECOND.sha1), TargetQuery(TARGET, sha256=SECOND.sha256)):
        with pytest.raises(VerificationError, match="not backed by its DANE evidence"):
            verify(data, query)
    assert verify(data, TargetQuery(TARGET, sha1=LEAF.sha1)).verdict == v2.VERDICT_MATCH
    assert verify(answer_of(v2.VERDICT_MISMATCH, statement),
                  TargetQuery(TARGET, sha1=SECOND.sha1)).verdict == v2.VERDICT_MISMATCH
    assert client.backend_text(_parsed_of(statement), now=NOW, asked=[SECOND.sha256]).startswith(
        "DANE: match for another certificate, TLSA 3 1 1 ")


def test_a_mismatch_states_every_certificate_judged() -> None:
    dane = split_verdict((dane_ee(OTHER_CHAIN[0]),), CHAIN, SECOND_CHAIN)
    evidence = verification("dane", dane)["dane"]
    assert evidence["outcome"] == "mismatch" and evidence["matched"] is None
    assert [entry["matched"] for entry in evidence["judged"]] == [None]
    data = answer_of(v2.VERDICT_MATCH, split_statement(dane))
    for asked in (LEAF, SECOND):
        with pytest.raises(VerificationError, match="not backed by its DANE evidence"):
            verify(data, TargetQuery(TARGET, sha1=asked.sha1))


def test_one_certificate_judged_states_no_judged() -> None:
    """A statement judging one certificate is byte for byte as before
    `judged` existed: the verdict on one chain among several probes, or
    several outcomes that judge no certificate."""
    single = split_verdict((dane_ee(CHAIN[0]),), CHAIN, CHAIN)  # seen twice
    assert single == judged(DnssecStatus.SECURE, (dane_ee(CHAIN[0]),))
    assert "judged" not in verification("dane", single)["dane"]
    assert verification("dane", split_verdict((dane_ee(CHAIN[0]),), CHAIN)) == verification(
        "dane", judged(DnssecStatus.SECURE, (dane_ee(CHAIN[0]),)))
    for status in (DnssecStatus.SECURE_DENIAL, DnssecStatus.INSECURE):
        lookup = TlsaLookup(status, (), 300, CHECKED_AT)
        several = verdict_on(lookup, [Presented.of(CHAIN), Presented.of(SECOND_CHAIN)], HOST,
                             datetime.fromtimestamp(NOW, UTC), max_reuse_s=600)
        assert "judged" not in verification("perspective", several)["dane"]


def test_the_evidence_on_one_certificate_is_the_members_it_always_had() -> None:
    """What a notary signed before `judged` existed, member for member (a
    client older than it parses it, and its bytes are the same)."""
    assert verification("dane", match_verdict()) == {"backend": "dane", "dane": {
        "outcome": "match", "dnssec": "secure", "checked_at": CHECKED_AT,
        "sha256": LEAF.sha256.hex(),
        "tlsa": [str(dane_ee(OTHER_CHAIN[0])), str(dane_ee(CHAIN[0]))], "matched": 1,
    }}
    assert verification("dane", mismatch_verdict())["dane"] == {
        "outcome": "mismatch", "dnssec": "secure", "checked_at": CHECKED_AT,
        "sha256": LEAF.sha256.hex(), "tlsa": [str(dane_ee(OTHER_CHAIN[0]))], "matched": None,
    }


_JUDGED_MALFORMED = {
    "judged null": _set("dane.judged", None),
    "judged empty": _set("dane.judged", []),
    "judged an object": _set("dane.judged", {"sha256": "00" * 32, "matched": None}),
    "judged too many": _set("dane.judged", [
        {"sha256": f"{i:064x}", "matched": None} for i in range(1, v2.MAX_STATEMENT_JUDGED + 2)
    ]),
    "entry a string": _set("dane.judged", ["00" * 32]),
    "entry extra member": _set("dane.judged", [{"sha256": "00" * 32, "matched": None, "x": 1}]),
    "entry sha256 missing": _set("dane.judged", [{"matched": None}]),
    "entry matched missing": _set("dane.judged", [{"sha256": "00" * 32}]),
    "entry sha256 upper case": _set("dane.judged", [{"sha256": "AB" * 32, "matched": None}]),
    "entry sha256 short": _set("dane.judged", [{"sha256": "ab" * 31, "matched": None}]),
    "entry sha256 null": _set("dane.judged", [{"sha256": None, "matched": None}]),
    "entry the main certificate": lambda statement: _set("dane.judged", [
        {"sha256": statement["verification"]["dane"]["sha256"], "matched": None}])(statement),
    "entries twice": _set("dane.judged", [{"sha256": "01" * 32, "matched": None}] * 2),
    "entries descending": _set("dane.judged", [
        {"sha256": "02" * 32, "matched": None}, {"sha256": "01" * 32, "matched": None}]),
    "entry matched out of range": _set("dane.judged", [{"sha256": "01" * 32, "matched": 3}]),
    "entry matched negative": _set("dane.judged", [{"sha256": "01" * 32, "matched": -1}]),
    "entry matched a float": _set("dane.judged", [{"sha256": "01" * 32, "matched": 0.0}]),
    "entry matched true": _set("dane.judged", [{"sha256": "01" * 32, "matched": True}]),
    "entry matched a string": _set("dane.judged", [{"sha256": "01" * 32, "matched": "0"}]),
}


@pytest.mark.parametrize("change", list(_JUDGED_MALFORMED.values()), ids=list(_JUDGED_MALFORMED))
def test_a_malformed_judged_is_a_502(change: Callable[[dict[str, Any]], None]) -> None:
    entry = entry_of(split_statement(both_vouched()))
    change(entry["statement"])
    _assert_malformed(entry)


@pytest.mark.parametrize(("made", "judged_value"), [
    (one_vouched, [{"sha256": "01" * 32, "matched": None}]),  # fine on a match...
    (lambda: judged(DnssecStatus.SECURE_DENIAL), [{"sha256": "01" * 32, "matched": None}]),
    (lambda: judged(DnssecStatus.INSECURE), [{"sha256": "01" * 32, "matched": None}]),
    (lambda: judged(DnssecStatus.BOGUS), [{"sha256": "01" * 32, "matched": None}]),
    (lambda: split_verdict((dane_ee(OTHER_CHAIN[0]),), CHAIN, SECOND_CHAIN),
     [{"sha256": "01" * 32, "matched": 0}]),  # vouched for on a mismatch
    (lambda: split_verdict((Tlsa(1, 1, 1, b"\1" * 32), dane_ee(CHAIN[0])), CHAIN, SECOND_CHAIN),
     [{"sha256": "01" * 32, "matched": 0}]),  # an unusable record
], ids=["valid-on-match", "no-tlsa", "insecure", "bogus", "matched-on-mismatch", "unusable"])
def test_judged_only_where_certificates_are_judged(
    made: Callable[[], DaneVerdict], judged_value: list[dict[str, Any]]
) -> None:
    entry = entry_of(signed(verification("dane", made()), LEAF, SECOND))
    _set("dane.judged", judged_value)(entry["statement"])
    if made is one_vouched:  # well formed: refused by the signature only
        with pytest.raises(VerificationError, match="signature does not verify"):
            v2.verify_statement(entry, KEYS, now=NOW)
        return
    _assert_malformed(entry)


_JUDGED_TAMPERED = {
    "judged removed": _drop("dane.judged"),
    "a null matched set": lambda statement: statement["verification"]["dane"]["judged"][0]
    .__setitem__("matched", 0),
    "another certificate": lambda statement: statement["verification"]["dane"]["judged"][0]
    .__setitem__("sha256", "ff" * 32),
    "an entry added": lambda statement: statement["verification"]["dane"]["judged"].append(
        {"sha256": "ff" * 32, "matched": 0}),
}


@pytest.mark.parametrize("change", list(_JUDGED_TAMPERED.values()), ids=list(_JUDGED_TAMPERED))
def test_tampering_with_judged_is_refused(change: Callable[[dict[str, Any]], None]) -> None:
    """A notary's statement saying SECOND is judged and not vouched for,
    altered to vouch for it (or anything else): the signature breaks, so a
    match for SECOND never verifies."""
    statement = split_statement(one_vouched())
    entry = entry_of(statement)
    change(entry["statement"])
    with pytest.raises(VerificationError, match="signature does not verify"):
        v2.verify_statement(entry, KEYS, now=NOW)
    document = json.loads(answer_of(v2.VERDICT_MATCH, statement))
    change(document["statements"][0]["statement"])
    with pytest.raises(VerificationError, match="bad statement signature"):
        verify(json.dumps(document).encode(), TargetQuery(TARGET, sha1=SECOND.sha1))


def _fake_verdict(records: tuple[Tlsa, ...], judgements: list[DaneJudgement]) -> DaneVerdict:
    """A verdict made of ``judgements`` (hashes and matches made up: the
    evidence reads nothing else), the main one first in SHA-256 order."""
    ordered = sorted(judgements, key=lambda j: j.sha256)
    main = next((j for j in ordered if j.matched is not None), ordered[0])
    outcome = DaneOutcome.MATCH if main.matched is not None else DaneOutcome.MISMATCH
    return DaneVerdict(
        outcome, TlsaLookup(DnssecStatus.SECURE, records, 300, CHECKED_AT), main.matched,
        main.sha256, main.sha1, NOW + 300, tuple(j for j in ordered if j is not main),
    )


def _ee(i: int) -> Tlsa:
    return Tlsa(3, 1, 1, hashlib.sha256(b"key %d" % i).digest())


def test_the_records_that_vouched_are_kept_first_then_the_first_others() -> None:
    """Ten unrelated records first in the RRset, then one record per
    certificate for six certificates: the six are kept (in their place:
    after the unrelated ones kept), then the first unrelated ones in the
    room left (16 records in all)."""
    unrelated = tuple(Tlsa(3, 1, 1, bytes([0xE0 + i]) * 32) for i in range(10))
    vouching = tuple(_ee(i) for i in range(6))
    judgements = [
        DaneJudgement(bytes([i + 1]) * 32, bytes([i + 1]) * 20, DaneMatch(record, 10 + i, 0))
        for i, record in enumerate(vouching)
    ]
    dane = _fake_verdict((*unrelated, *vouching), judgements)
    evidence = verification("dane", dane)["dane"]
    assert evidence["tlsa"] == [str(r) for r in (*unrelated, *vouching)]
    assert [e["matched"] for e in evidence["judged"]] == [11, 12, 13, 14, 15]
    assert evidence["matched"] == 10
    # Eleven unrelated ones: the sixteenth slot goes to a record that vouched.
    more = (*unrelated, Tlsa(3, 1, 1, b"\xee" * 32))
    dane = _fake_verdict((*more, *vouching), [
        DaneJudgement(j.sha256, j.sha1, DaneMatch(j.matched.record, 11 + i, 0))
        for i, j in enumerate(judgements) if j.matched is not None
    ])
    evidence = verification("dane", dane)["dane"]
    assert evidence["tlsa"] == [str(r) for r in (*unrelated, *vouching)]
    assert len(evidence["judged"]) == 5 and v2.stated_vouched(dane) == {
        j.sha256 for j in judgements}


def test_beyond_sixteen_records_that_vouched_the_last_certificates_are_left_out() -> None:
    """Twenty certificates, each vouched for by its own record: the main
    one and the first fifteen others (SHA-256 order) are stated with their
    records; the last four are left out of `judged`, so the notary never
    answers a match it cannot back. Certificates no record vouches for
    cost no record: still stated."""
    records = tuple(_ee(i) for i in range(20))
    vouched = [DaneJudgement(bytes([i + 1]) * 32, bytes([i + 1]) * 20, DaneMatch(r, i, 0))
               for i, r in enumerate(records)]
    unvouched = [DaneJudgement(bytes([0x80 + i]) * 32, bytes([0x80 + i]) * 20) for i in range(3)]
    dane = _fake_verdict(records, [*vouched, *unvouched])
    evidence = verification("dane", dane)["dane"]
    assert evidence["tlsa"] == [str(r) for r in records[:16]]
    stated = {bytes.fromhex(e["sha256"]): e["matched"] for e in evidence["judged"]}
    assert stated == {
        **{j.sha256: i for i, j in enumerate(vouched[1:16], start=1)},
        **{j.sha256: None for j in unvouched},
    }
    assert v2.stated_vouched(dane) == {j.sha256 for j in vouched[:16]}
    entry = entry_of(signed(verification("dane", dane)))
    v2.verify_statement(entry, KEYS, now=NOW)  # well formed


def test_judged_entries_count_against_the_characters_of_the_evidence() -> None:
    """Records as large as the bound allows and sixty-three certificates
    judged: the entries take their share of the 16,384 characters, so the
    statement's log entry stays within its bound."""
    from notary.protocol import tlog
    from notary.protocol.v2.evidence import JUDGED_ENTRY_CHARS

    big = tuple(Tlsa(3, 0, 0, bytes([i]) * 500) for i in range(v2.MAX_STATEMENT_TLSA))
    judgements = [DaneJudgement(b"\0" * 32, b"\0" * 20, DaneMatch(big[0], 0, 0)), *(
        DaneJudgement(bytes([i]) * 32, bytes([i]) * 20) for i in range(1, 64))]
    dane = _fake_verdict(big, judgements)
    evidence = verification("dane", dane)["dane"]
    assert len(evidence["judged"]) == v2.MAX_STATEMENT_JUDGED
    chars = sum(len(r) for r in evidence["tlsa"]) + JUDGED_ENTRY_CHARS * len(evidence["judged"])
    assert chars <= v2.MAX_STATEMENT_TLSA_CHARS
    assert len(evidence["tlsa"]) < v2.MAX_STATEMENT_TLSA
    assert all(len(json.dumps(e, separators=(",", ":"))) + 1 <= JUDGED_ENTRY_CHARS
               for e in evidence["judged"])
    statement = signed(verification("dane", dane))
    assert len(statement.entry) <= tlog.MAX_ENTRY_BYTES


def test_more_certificates_judged_than_a_client_parses_are_cut() -> None:
    """A verdict judging more certificates than `judged` may hold (a timeline
    kept larger than a statement's 64 observations): the first 63 in
    SHA-256 order are stated, the statement still parses, and a match for
    one left out has nothing to back it."""
    record = _ee(0)
    judgements = [DaneJudgement(i.to_bytes(32, "big"), i.to_bytes(20, "big"),
                                DaneMatch(record, 0, 0)) for i in range(1, 101)]
    dane = _fake_verdict((record,), judgements)
    evidence = verification("dane", dane)["dane"]
    stated = [bytes.fromhex(entry["sha256"]) for entry in evidence["judged"]]
    assert stated == [j.sha256 for j in judgements[1:1 + v2.MAX_STATEMENT_JUDGED]]
    v2.verify_statement(entry_of(signed(verification("dane", dane))), KEYS, now=NOW)
    assert v2.stated_vouched(dane) == {j.sha256 for j in judgements[:64]}
