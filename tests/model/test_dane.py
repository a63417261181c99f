"""DANE matching (``notary.model.dane``) against associations computed here
independently of the module: ``cryptography``'s own SubjectPublicKeyInfo
encoding and ``hashlib``, on chains issued by trustme (a root, an
intermediate, a leaf)."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

import pytest
import trustme

from notary.model.dane import (
    DaneJudgement,
    DaneMatch,
    DaneOutcome,
    DaneVerdict,
    DnssecStatus,
    Presented,
    Tlsa,
    TlsaLookup,
    association,
    match,
    verdict,
    verdict_on,
)
from tests.support.chains import HOST, chain_of, der_of, record

NOW = datetime.now(UTC)


@pytest.fixture(scope="module")
def issued() -> tuple[trustme.CA, trustme.CA, trustme.LeafCert]:
    root = trustme.CA()
    intermediate = root.create_child_ca()
    return root, intermediate, intermediate.issue_cert(HOST)


@pytest.mark.parametrize("selector", [0, 1])
@pytest.mark.parametrize("matching_type", [0, 1, 2])
def test_dane_ee_matches_the_leaf_by_each_selector_and_matching_type(
    issued, selector: int, matching_type: int
) -> None:
    chain = chain_of(issued[2])
    wanted = record(3, selector, matching_type, chain[0])
    assert association(chain[0], selector, matching_type) == wanted.data
    assert match([wanted], chain, HOST, NOW) == DaneMatch(wanted, 0, 0)


def test_a_record_for_another_key_matches_nothing(issued) -> None:
    chain = chain_of(issued[2])
    other = chain_of(trustme.CA().issue_cert(HOST))[0]
    assert match([record(3, 1, 1, other), record(3, 0, 2, other)], chain, HOST, NOW) is None


def test_dane_ee_checks_neither_name_nor_validity(issued) -> None:
    expired = trustme.CA().issue_cert(
        "elsewhere.example.test", not_before=NOW - timedelta(days=30),
        not_after=NOW - timedelta(days=1),
    )
    chain = chain_of(expired)
    assert match([record(3, 1, 1, chain[0])], chain, HOST, NOW) is not None


def test_dane_ta_matches_a_presented_issuer_the_leaf_chains_to(issued) -> None:
    chain = chain_of(issued[2])
    anchor = record(2, 0, 1, chain[1])
    assert match([anchor], chain, HOST, NOW) == DaneMatch(anchor, 0, 1)
    by_key = record(2, 1, 1, chain[1])
    assert match([by_key], chain, HOST, NOW) == DaneMatch(by_key, 0, 1)


def test_dane_ta_checks_the_name_and_the_validity(issued) -> None:
    chain = chain_of(issued[2])
    anchor = record(2, 0, 1, chain[1])
    assert match([anchor], chain, "other.example.test", NOW) is None
    short = chain_of(issued[1].issue_cert(HOST, not_before=NOW - timedelta(days=1),
                                          not_after=NOW + timedelta(days=1)))
    assert match([anchor], short, HOST, NOW) is not None
    assert match([anchor], short, HOST, NOW + timedelta(days=2)) is None  # expired then


def test_dane_ta_needs_the_anchor_in_the_presented_chain(issued) -> None:
    root, _, leaf = issued
    chain = chain_of(leaf)
    root_der = der_of(root.cert_pem.bytes())
    assert match([record(2, 0, 1, root_der)], chain, HOST, NOW) is None  # not sent
    assert match([record(2, 0, 1, chain[0])], chain, HOST, NOW) is None  # the leaf is no TA


def test_dane_ta_of_an_unrelated_certificate_sent_along_matches_nothing(issued) -> None:
    chain = chain_of(issued[2])
    stranger = der_of(trustme.CA().cert_pem.bytes())
    assert match([record(2, 0, 1, stranger)], [chain[0], stranger], HOST, NOW) is None


def test_unusable_records_are_ignored_and_never_fail_a_match(issued) -> None:
    chain = chain_of(issued[2])
    good = record(3, 1, 1, chain[0])
    unusable = [
        record(1, 1, 1, chain[0]),  # PKIX-EE: no CA store here
        record(0, 0, 1, chain[1]),  # PKIX-TA
        Tlsa(3, 7, 1, good.data),  # unknown selector
        Tlsa(3, 1, 9, good.data),  # unknown matching type
        Tlsa(3, 1, 1, good.data[:31]),  # SHA2-256 of the wrong length
        Tlsa(3, 0, 0, b""),  # no data
    ]
    assert not any(r.usable for r in unusable)
    assert match(unusable, chain, HOST, NOW) is None
    assert match([*unusable, good], chain, HOST, NOW) == DaneMatch(good, len(unusable), 0)


def test_dane_ee_records_are_tried_first(issued) -> None:
    chain = chain_of(issued[2])
    anchor, leaf = record(2, 0, 1, chain[1]), record(3, 1, 1, chain[0])
    assert match([anchor, leaf], chain, HOST, NOW) == DaneMatch(leaf, 1, 0)


def test_hostile_chains_match_nothing() -> None:
    data = hashlib.sha256(b"x").digest()
    for chain in ([], [b""], [b"\x30\x03\x02\x01\x00"], [b"garbage", b"more"]):
        assert match([Tlsa(3, 1, 1, data), Tlsa(2, 0, 1, data)], chain, HOST, NOW) is None


@pytest.mark.parametrize(("text", "parsed"), [
    ("3 1 1 00ff", Tlsa(3, 1, 1, b"\x00\xff")),
    ("2 0 2 00 ff 10", Tlsa(2, 0, 2, b"\x00\xff\x10")),
])
def test_presentation_form(text: str, parsed: Tlsa) -> None:
    assert Tlsa.parse(text) == parsed
    assert Tlsa.parse(str(parsed)) == parsed


@pytest.mark.parametrize("text", ["3 1 1", "3 1 x 00", "3 1 1 0g", "256 1 1 00", "-1 1 1 00"])
def test_malformed_presentations_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        Tlsa.parse(text)


@pytest.mark.parametrize(("status", "ttl", "reused_s"), [
    (DnssecStatus.SECURE_DENIAL, 0, 30),  # a denial without an SOA: the floor
    (DnssecStatus.INSECURE, 0, 30),
    (DnssecStatus.SECURE_DENIAL, 10, 30),  # a TTL below the floor
    (DnssecStatus.SECURE_DENIAL, 300, 300),  # the TTL
    (DnssecStatus.INSECURE, 10**6, 3600),  # at most dane_reuse_max_s
    (DnssecStatus.BOGUS, 0, 5),  # a failure: dane_failure_reuse_s
    (DnssecStatus.RESOLVER_FAILURE, 300, 5),
])
def test_how_long_a_verdict_is_reused(status: DnssecStatus, ttl: int, reused_s: int) -> None:
    lookup = TlsaLookup(status, ttl=ttl, checked_at=1000)
    made = verdict(lookup, [], HOST, NOW, max_reuse_s=3600, min_reuse_s=30, failure_reuse_s=5)
    assert made.reuse_until == 1000 + reused_s


# -- several certificates at once (rule 5; issue 31's split sites) ---------------------------


@pytest.fixture(scope="module")
def split(issued) -> tuple[list[bytes], list[bytes]]:
    """Two chains a split site serves at two addresses: two leaves under
    one intermediate (which both addresses send)."""
    _, intermediate, _ = issued
    return chain_of(intermediate.issue_cert(HOST)), chain_of(intermediate.issue_cert(HOST))


def secure(*records: Tlsa) -> TlsaLookup:
    return TlsaLookup(DnssecStatus.SECURE, records, 300, 1000)


def judge(lookup: TlsaLookup, *chains: list[bytes]) -> DaneVerdict:
    return verdict_on(lookup, [Presented.of(chain) for chain in chains], HOST, NOW,
                      max_reuse_s=3600)


def sha(chain: list[bytes]) -> bytes:
    return hashlib.sha256(chain[0]).digest()


def sha1(chain: list[bytes]) -> bytes:
    return hashlib.sha1(chain[0]).digest()


def test_each_certificate_is_judged_and_vouched_for_on_its_own(split) -> None:
    a, b = split
    lookup = secure(record(3, 1, 1, a[0]), record(3, 1, 1, b[0]))
    made = judge(lookup, a, b)
    assert made.outcome is DaneOutcome.MATCH
    assert {j.sha256 for j in made.judgements} == {sha(a), sha(b)}
    assert all(j.matched is not None for j in made.judgements)
    for chain in (a, b):
        assert made.vouches_for(sha(chain), None) and made.vouches_for(None, sha1(chain))
        assert made.vouches_for(sha(chain), sha1(chain))
    assert not made.vouches_for(sha(a), sha1(b))  # both hashes must be one certificate's
    # Whichever address answered first: the same verdict, the main
    # certificate first in SHA-256 order.
    assert judge(lookup, b, a) == made
    assert made.leaf_sha256 == min(sha(a), sha(b))
    assert [j.sha256 for j in made.judgements] == sorted([sha(a), sha(b)])


def test_one_trust_anchor_vouches_for_every_chain_leading_to_it(split) -> None:
    a, b = split
    made = judge(secure(record(2, 0, 1, a[1])), a, b, a)  # a seen twice: judged once
    assert made.outcome is DaneOutcome.MATCH and len(made.judgements) == 2
    assert made.vouches_for(sha(a), None) and made.vouches_for(sha(b), None)
    assert {j.matched.certificate for j in made.judgements if j.matched} == {1}


def test_records_for_one_certificate_do_not_vouch_for_the_other(split) -> None:
    a, b = split
    for order in ((a, b), (b, a)):
        made = judge(secure(record(3, 1, 1, b[0])), *order)
        assert made.outcome is DaneOutcome.MATCH  # a record vouches for one of them
        assert made.leaf_sha256 == sha(b)  # the main certificate is the vouched one
        assert made.vouches_for(sha(b), None) and not made.vouches_for(sha(a), None)
        assert made.others == (DaneJudgement(sha(a), sha1(a), None),)
    missed = judge(secure(Tlsa(3, 1, 1, hashlib.sha256(b"another key").digest())), a, b)
    assert missed.outcome is DaneOutcome.MISMATCH and len(missed.judgements) == 2
    assert not missed.vouches_for(None, None)


def test_a_certificate_is_judged_through_each_chain_it_came_with(split) -> None:
    """One address sends the intermediate, another only the leaf: the leaf
    chains to the anchor through the first."""
    a, _ = split
    anchor = record(2, 0, 1, a[1])
    assert judge(secure(anchor), [a[0]]).outcome is DaneOutcome.MISMATCH
    made = judge(secure(anchor), [a[0]], a)
    assert made.outcome is DaneOutcome.MATCH and made.others == ()


def test_outcomes_that_judge_no_certificate_say_it_of_all(split) -> None:
    a, b = split
    for status, outcome in ((DnssecStatus.SECURE_DENIAL, DaneOutcome.NO_TLSA),
                            (DnssecStatus.INSECURE, DaneOutcome.INSECURE)):
        made = judge(TlsaLookup(status, (), 300, 1000), b, a)
        assert made.outcome is outcome and made.others == ()
        assert made.leaf_sha256 == min(sha(a), sha(b)) and made.matched is None
    unusable = judge(secure(record(1, 1, 1, a[0])), a, b)
    assert unusable.outcome is DaneOutcome.NO_TLSA and unusable.others == ()


def test_a_verdict_carries_the_judgements_of_certificates_its_probe_missed(split) -> None:
    """The probe saw only ``a`` (``b``'s address did not answer this time):
    ``b``, still current, keeps the verdict the same records gave it."""
    a, b = split
    lookup = secure(record(3, 1, 1, a[0]), record(3, 1, 1, b[0]))
    earlier = judge(lookup, a, b)
    now = judge(secure(*lookup.records), a)
    carried = now.carrying(earlier, {sha(a), sha(b)})
    assert carried.vouches_for(sha(b), None) and carried.vouches_for(sha(a), None)
    assert {j.sha256 for j in carried.judgements} == {sha(a), sha(b)}
    assert carried.reuse_until == now.reuse_until
    # Not beyond the current set, nor when the records changed, nor onto a
    # verdict that judged no certificate, nor over this probe's own verdict.
    assert now.carrying(earlier, {sha(a)}) == now
    other = secure(record(3, 1, 1, a[0]))
    assert judge(other, a).carrying(earlier, {sha(a), sha(b)}) == judge(other, a)
    denial = judge(TlsaLookup(DnssecStatus.SECURE_DENIAL, (), 300, 1000), a)
    assert denial.carrying(earlier, {sha(a), sha(b)}) == denial
    only_b = judge(secure(record(3, 1, 1, b[0])), a, b)
    assert judge(secure(record(3, 1, 1, b[0])), a).carrying(
        only_b, {sha(a), sha(b)}).vouches_for(sha(b), None)
    assert earlier.carrying(judge(secure(*lookup.records)), {sha(a)}) == earlier
    assert now.carrying(None, {sha(a), sha(b)}) == now


def test_a_single_chain_is_judged_as_before(issued) -> None:
    chain = chain_of(issued[2])
    made = verdict(secure(record(3, 1, 1, chain[0])), chain, HOST, NOW)
    assert (made.outcome, made.leaf_sha256, made.others) == (DaneOutcome.MATCH, sha(chain), ())
    assert made.judgements == (DaneJudgement(sha(chain), sha1(chain), made.matched),)
    failed = verdict(TlsaLookup(DnssecStatus.BOGUS, checked_at=1), [], HOST, NOW)
    assert failed.judgements == () and failed.main is None and failed.leaf_sha256 == b""


def test_judgements_are_carried_whatever_order_the_resolver_gave_the_records(split) -> None:
    """A resolver may rotate an RRset from one answer to the next (unbound
    does): the same records in another order are the same records, and a
    carried judgement names its record's place in the new order."""
    a, b = split
    ra, rb = record(3, 1, 1, a[0]), record(3, 1, 1, b[0])
    earlier = judge(secure(ra, rb), a, b)
    rotated = secure(rb, ra)
    carried = judge(rotated, a).carrying(earlier, {sha(a), sha(b)})
    assert carried == judge(rotated, a, b)
    assert {j.sha256: j.matched.index for j in carried.judgements if j.matched} == {
        sha(a): 1, sha(b): 0}
    # Another RRset (one record more, or one fewer) carries nothing.
    for other in (secure(ra), secure(ra, rb, record(3, 0, 1, a[0]))):
        assert judge(other, a).carrying(earlier, {sha(a), sha(b)}) == judge(other, a)
