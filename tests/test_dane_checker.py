"""The DANE checker's judging of a whole probe (``notary.service.dane``:
``DaneChecker.judge``, ``needs_chain``) and what a record says a DANE
verdict is for its statement (``notary.service.records._dane_substance``),
for sites that serve several certificates at once (issue 31). No I/O:
reports are built here from trustme chains (a root, an intermediate, two
leaves under it, as a split site's two addresses serve them)."""

from __future__ import annotations

import hashlib

import pytest
import trustme

from notary.model.dane import DaneOutcome, DaneVerdict, DnssecStatus, Tlsa, TlsaLookup
from notary.model.observations import Certificate, ProbeReport, ProbeResult
from notary.model.targets import Target
from notary.service.dane import DaneChecker, needs_chain
from notary.service.records import _dane_substance
from tests.support.chains import HOST, chain_of, record

TARGET = Target(HOST, 443)
NOW = 1_770_000_000


@pytest.fixture(scope="module")
def chains() -> tuple[list[bytes], list[bytes]]:
    intermediate = trustme.CA().create_child_ca()
    return chain_of(intermediate.issue_cert(HOST)), chain_of(intermediate.issue_cert(HOST))


def result(chain: list[bytes], address: str, *, with_chain: bool = True) -> ProbeResult:
    """A handshake at ``address`` that showed ``chain`` (its leaf alone, as
    another worker's probe read back from the store, unless ``with_chain``)."""
    return ProbeResult(TARGET, Certificate.from_der(chain[0]),
                       tuple(chain) if with_chain else (), address, NOW)


def report(*results: ProbeResult) -> ProbeReport:
    return ProbeReport(TARGET, results, tuple(dict.fromkeys(r.address for r in results)),
                       observed_at=NOW)


def checker() -> DaneChecker:
    return DaneChecker((), timeout_s=1.0, max_reuse_s=3600, failure_reuse_s=30,
                       clock=lambda: NOW)


def secure(*records: Tlsa) -> TlsaLookup:
    return TlsaLookup(DnssecStatus.SECURE, records, 300, NOW)


def sha(chain: list[bytes]) -> bytes:
    return hashlib.sha256(chain[0]).digest()


def test_every_certificate_of_the_probe_is_judged_whichever_address_answered_first(
    chains,
) -> None:
    a, b = chains
    lookup = secure(record(3, 1, 1, b[0]))
    counting = checker()
    made = counting.judge(lookup, report(result(a, "192.0.2.1"), result(b, "192.0.2.2")))
    assert made.outcome is DaneOutcome.MATCH and made.leaf_sha256 == sha(b)
    assert {j.sha256: j.matched is not None for j in made.judgements} == {
        sha(a): False, sha(b): True}
    assert counting.checked["match"] == 1 and counting.checked["mismatch"] == 0  # one check
    assert checker().judge(lookup, report(result(b, "192.0.2.2"), result(a, "192.0.2.1"))) == made


def test_a_leaf_without_its_chain_is_judged_on_the_leaf_alone(chains) -> None:
    a, b = chains
    anchor = secure(record(2, 0, 1, a[1]))
    made = checker().judge(anchor, report(result(a, "192.0.2.1", with_chain=False)))
    assert made.outcome is DaneOutcome.MISMATCH
    made = checker().judge(anchor, report(
        result(a, "192.0.2.1", with_chain=False), result(b, "192.0.2.2")))
    assert made.vouches_for(sha(b), None) and not made.vouches_for(sha(a), None)


def judged_on(lookup: TlsaLookup, probe: ProbeReport) -> tuple[DaneVerdict, ProbeReport]:
    return checker().judge(lookup, probe), probe


def test_needs_chain_when_a_trust_anchor_might_vouch_for_a_leaf_served_alone(chains) -> None:
    a, b = chains
    ta, ee_a = record(2, 0, 1, a[1]), record(3, 1, 1, a[0])
    bare_a = result(a, "192.0.2.1", with_chain=False)
    bare_b = result(b, "192.0.2.2", with_chain=False)
    # A DANE-TA record, a leaf without its chain: probe again for it, on a
    # mismatch and, on a split site, on a match for the other certificate.
    assert needs_chain(*judged_on(secure(ta), report(bare_a)))
    assert needs_chain(*judged_on(secure(ta), report(result(a, "192.0.2.1"), bare_b)))
    assert needs_chain(*judged_on(secure(ee_a, ta), report(bare_a, bare_b)))
    # Not when every leaf came with its chain, when the leaf served alone is
    # vouched for already, without a DANE-TA record, or when the records
    # judge no certificate.
    assert not needs_chain(*judged_on(secure(ta), report(result(a, "192.0.2.1"))))
    assert not needs_chain(*judged_on(secure(ee_a, ta), report(bare_a, result(b, "192.0.2.2"))))
    assert not needs_chain(*judged_on(secure(ee_a), report(bare_a, bare_b)))
    unusable = Tlsa(0, 0, 1, hashlib.sha256(a[1]).digest())  # PKIX-TA: never used
    assert not needs_chain(*judged_on(secure(unusable), report(bare_a)))
    denial = TlsaLookup(DnssecStatus.SECURE_DENIAL, (), 300, NOW)
    assert not needs_chain(*judged_on(denial, report(bare_a)))


def test_a_verdict_s_substance_is_what_it_vouches_for_not_the_order_seen(chains) -> None:
    a, b = chains
    ee_a, ee_b = record(3, 1, 1, a[0]), record(3, 1, 1, b[0])
    first = checker().judge(
        secure(ee_a, ee_b), report(result(a, "192.0.2.1"), result(b, "192.0.2.2")))
    # The other address first, the resolver's RRset rotated, checked later.
    again = checker().judge(
        TlsaLookup(DnssecStatus.SECURE, (ee_b, ee_a), 300, NOW + 600),
        report(result(b, "192.0.2.2"), result(a, "192.0.2.1")))
    assert again != first and _dane_substance(again) == _dane_substance(first)
    # Another judgement (b not vouched for now), another certificate judged
    # (b not seen), other records: another substance.
    for other in (
        checker().judge(secure(ee_a, Tlsa(3, 1, 1, bytes(32))),
                        report(result(a, "192.0.2.1"), result(b, "192.0.2.2"))),
        checker().judge(secure(ee_a, ee_b), report(result(a, "192.0.2.1"))),
        checker().judge(secure(ee_a, ee_b, record(3, 0, 1, a[0])),
                        report(result(a, "192.0.2.1"), result(b, "192.0.2.2"))),
    ):
        assert _dane_substance(other) != _dane_substance(first)
    assert _dane_substance(None) is None
