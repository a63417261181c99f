"""DANE for sites that serve several certificates at once (issue 31 with
issue 20): each certificate a probe saw is judged on its own against the
site's TLSA records, in every protocol and on the page.

Real servers on loopback only: a site served at three loopback addresses,
each with its own certificate (``tests.support.sites``), named in a zone
signed in the test and served by ``nsd`` behind a validating ``unbound``
(``tests.support.dnssec``), through which the notary resolves the name and
looks up its TLSA records, as in production.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from notary.client import check as client
from notary.model.dane import Tlsa
from notary.protocol import v2
from notary.protocol.voting import Verdict
from tests.support.chains import ee_record
from tests.support.client_world import bundle_of
from tests.support.dane_notaries import dane_notary
from tests.support.dnssec import dnssec_stack
from tests.support.http_client import post_json
from tests.support.notaries import NotaryUnderTest, legacy_query, send_raw, sha1_fp
from tests.support.sites import Site, open_site
from tests.support.tls_targets import static_resolver
from tests.support.v2_queries import public_keys

ADDRESSES = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
UNSERVED = hashlib.sha256(b"a certificate nobody serves").digest()
#: Past a verdict's reuse (the records' TTL, 0 when unbound caches nothing:
#: ``[verify] dane_reuse_min_s``, 30 s) and the target's probe spacing.
PAST_REUSE_S = 120


def sha(der: bytes) -> bytes:
    return hashlib.sha256(der).digest()


def split_zone(site: Site, *tlsa: str) -> list[tuple[str, str, str]]:
    """The signed zone's records: the site's name at each of its addresses,
    and the TLSA records ``tlsa`` on its port."""
    return [
        *((f"{site.name}.", "A", address) for address in site.addresses),
        *((f"_{site.port}._tcp.{site.name}.", "TLSA", record) for record in tlsa),
    ]


async def ask(notary: NotaryUnderTest, site: Site, der: bytes | None) -> int:
    """Convergence's status for ``der`` (None: a GET)."""
    answer = await legacy_query(
        notary.port, f"{site.name}+{site.port}", sha1_fp(der) if der is not None else None)
    return answer.status


async def ask_v2(
    notary: NotaryUnderTest, site: Site, hashes: list[bytes]
) -> tuple[list[v2.VerifiedResult], dict]:
    """The v2 results for ``site`` and each SHA-256 of ``hashes``, verified
    as a client does (check 6 included: a DANE match backed by the
    evidence), and the statement the first one names, as JSON."""
    request = {"targets": [
        {"host": site.name, "port": site.port, "sha256": sha256.hex()} for sha256 in hashes
    ], "nonce": "dane-split"}
    status, body = await post_json(notary.port, "/v2/query", request)
    assert status == 200, body
    queries = v2.parse_query_request(
        json.dumps(request).encode(), max_batch=100, max_body_bytes=1 << 20).targets
    results = v2.verify_answer(
        v2.parse_answer_document(body), await public_keys(notary), nonce="dane-split",
        now=int(notary.clock()), queries=queries,
    )
    document = json.loads(body)
    statements = {entry["signature"]: entry["statement"] for entry in document["statements"]}
    return results, statements[document["answer"]["results"][0]["statement_signature"]]


def vouched_in(dane: dict) -> dict[str, str | None]:
    """What a statement's DANE evidence says of each certificate it judged:
    its SHA-256 (hex) and the record that vouches for it (None: none)."""
    tlsa = dane["tlsa"]
    said = {dane["sha256"]: tlsa[dane["matched"]] if dane["matched"] is not None else None}
    for entry in dane.get("judged", []):
        said[entry["sha256"]] = tlsa[entry["matched"]] if entry["matched"] is not None else None
    return said


async def test_tlsa_records_for_two_of_three_certificates_vouch_for_those_two(
    tmp_path: Path,
) -> None:
    async with open_site(ADDRESSES) as site:
        a, b, c = (site.leaf_der(address) for address in ADDRESSES)
        with dnssec_stack(split_zone(site, ee_record(a), ee_record(b))) as stack:
            async with dane_notary(tmp_path, stack.resolver, ("dane",)) as notary:
                # One probe sees every address; each certificate is judged.
                assert await ask(notary, site, a) == 200
                record = await notary.running.records.lookup(site.target())
                assert record is not None and record.last_report is not None
                assert set(record.last_report.addresses) == set(ADDRESSES)
                assert await ask(notary, site, b) == 200
                assert await ask(notary, site, c) == 409  # served, not vouched for
                assert await ask(notary, site, None) == 200
                assert await ask(notary, site, b"nobody serves this") == 409

                # v2: a match for each vouched one, its evidence in the
                # signed statement; a mismatch for the third and for one
                # nobody serves.
                results, statement = await ask_v2(notary, site, [sha(a), sha(b), sha(c), UNSERVED])
                assert [r.verdict for r in results] == ["match", "match", "mismatch", "mismatch"]
                dane = statement["verification"]["dane"]
                assert dane["outcome"] == "match"
                assert sorted(dane["tlsa"]) == sorted([ee_record(a), ee_record(b)])
                assert dane["sha256"] == min(sha(a), sha(b)).hex()  # the first vouched for
                assert vouched_in(dane) == {
                    sha(a).hex(): ee_record(a), sha(b).hex(): ee_record(b), sha(c).hex(): None}
                judged = [entry["sha256"] for entry in dane["judged"]]
                assert judged == sorted(judged) and len(judged) == 2
                for result, der in zip(results[:2], (a, b), strict=True):
                    assert result.verification is not None and result.verification.dane
                    assert result.verification.dane.record_for(sha(der)) == Tlsa.parse(
                        ee_record(der))

                # The page says how many of the served certificates DANE
                # vouches for, and marks both records.
                page = await send_raw(
                    notary.port, f"GET /site/{site.name}+{site.port} HTTP/1.0\r\n\r\n".encode())
                assert page.status == 200
                assert b"DANE judged each of the 3 certificates" in page.body
                assert b"its records vouch for 2 of them" in page.body
                assert page.body.count(b"(vouches)") == 2

                # notary check --v2 from a client whose own connection
                # reached one address: vouched at the second, refused at
                # the third, with the record that vouched shown.
                bundles = [bundle_of(notary, "Dane")]
                for address, der, expected in (
                    ("127.0.0.3", b, Verdict.SUCCESS), ("127.0.0.4", c, Verdict.FAILURE),
                ):
                    report = await client.check(
                        site.target(), bundles, relay=None, timeout_s=10.0, use_v2=True,
                        quorum=1, resolver=static_resolver({site.name: [address]}),
                    )
                    (row,) = report.answers
                    assert (row.verdict, row.backend) == (expected, "dane"), row.detail
                    if expected is Verdict.SUCCESS:
                        assert row.detail.startswith(f"DANE: match, {_shown(ee_record(der))}")


def _shown(record: str) -> str:
    """How ``notary check`` shows a TLSA record: its data cut to 16 hex digits."""
    usage, selector, matching, data = record.split()
    return f"TLSA {usage} {selector} {matching} {data[:16]}..."


async def test_a_dane_ta_record_vouches_for_every_chain_leading_to_it(tmp_path: Path) -> None:
    """Each address sends its leaf and the site's intermediate: one ``2 0 1``
    record on the intermediate vouches for the three certificates, and the
    statement states it once for all."""
    async with open_site(ADDRESSES, intermediate=True) as site:
        leaves = [site.leaf_der(address) for address in ADDRESSES]
        intermediate = site.at(ADDRESSES[0]).chains[0][1]
        anchor = f"2 0 1 {hashlib.sha256(intermediate).hexdigest()}"
        with dnssec_stack(split_zone(site, anchor)) as stack:
            async with dane_notary(tmp_path, stack.resolver, ("dane",)) as notary:
                for der in leaves:
                    assert await ask(notary, site, der) == 200
                results, statement = await ask_v2(notary, site, [*map(sha, leaves), UNSERVED])
                assert [r.verdict for r in results] == ["match"] * 3 + ["mismatch"]
                dane = statement["verification"]["dane"]
                assert dane["tlsa"] == [anchor] and dane["matched"] == 0
                assert [entry["matched"] for entry in dane["judged"]] == [0, 0]
                assert vouched_in(dane) == {sha(der).hex(): anchor for der in leaves}


async def test_judgements_are_carried_while_the_records_stay_and_dropped_when_they_change(
    tmp_path: Path,
) -> None:
    """An address that does not answer a probe keeps its certificate
    vouched for (it is still current, and the same records judged it);
    once the records change, the certificate is judged by nothing: refused."""
    second = ADDRESSES[1]
    async with open_site(ADDRESSES) as site:
        a, b, c = (site.leaf_der(address) for address in ADDRESSES)
        with dnssec_stack(split_zone(site, ee_record(a), ee_record(b)), cache_max_ttl=0) as stack:
            async with dane_notary(
                tmp_path, stack.resolver, ("dane",), probe={"timeout_s": 2.0},
            ) as notary:
                records = notary.running.records
                assert await ask(notary, site, a) == 200  # every address answered
                record = await records.lookup(site.target())
                assert record is not None and record.dane is not None
                checked = record.dane.lookup.checked_at
                site.at(second).stalled = True
                notary.clock.advance(PAST_REUSE_S)
                assert await ask(notary, site, a) == 200  # a probe and a lookup again
                record = await records.lookup(site.target())
                assert record is not None and record.last_report is not None
                assert record.dane is not None
                assert [address for address, _ in record.last_report.failures] == [second]
                assert sha(b) not in {leaf.sha256 for leaf in record.last_report.leaves}
                assert record.dane.lookup.checked_at >= checked + PAST_REUSE_S
                # b was not seen by that probe: its judgement is carried.
                assert await ask(notary, site, b) == 200
                assert await ask(notary, site, c) == 409
                results, statement = await ask_v2(notary, site, [sha(b), sha(c)])
                assert [r.verdict for r in results] == ["match", "mismatch"]
                assert vouched_in(statement["verification"]["dane"])[sha(b).hex()] == (
                    ee_record(b))

                # The records change: they name a and c now.
                stack.replace(split_zone(site, ee_record(a), ee_record(c)))
                notary.clock.advance(PAST_REUSE_S)
                assert await ask(notary, site, a) == 200
                record = await records.lookup(site.target())
                assert record is not None and record.dane is not None
                assert sorted(map(str, record.dane.lookup.records)) == sorted(
                    [ee_record(a), ee_record(c)])
                assert sha(b) not in {j.sha256 for j in record.dane.judgements}
                assert await ask(notary, site, c) == 200
                assert await ask(notary, site, b) == 409
                results, statement = await ask_v2(notary, site, [sha(a), sha(b), sha(c)])
                assert [r.verdict for r in results] == ["match", "mismatch", "match"]
                said = vouched_in(statement["verification"]["dane"])
                assert said == {sha(a).hex(): ee_record(a), sha(c).hex(): ee_record(c)}


async def test_a_certificate_vouched_for_beyond_what_a_statement_shows_is_no_match(
    tmp_path: Path,
) -> None:
    """The notary keeps two certificates of a target (``[store]
    max_certificates_per_target``) and the site serves three, each vouched
    for: DANE still vouches for the third in Convergence, which signs no
    evidence, but a v2 match would name a statement without it (V5): the
    verdict is ``unknown``, and the answer verifies."""
    async with open_site(ADDRESSES) as site:
        leaves = [site.leaf_der(address) for address in ADDRESSES]
        with dnssec_stack(split_zone(site, *map(ee_record, leaves))) as stack:
            async with dane_notary(
                tmp_path, stack.resolver, ("dane",), store={"max_certificates_per_target": 2},
            ) as notary:
                for der in leaves:
                    assert await ask(notary, site, der) == 200
                record = await notary.running.records.lookup(site.target())
                assert record is not None and record.dane is not None
                kept = {o.certificate.sha256 for o in record.timeline.observations}
                assert len(kept) == 2 and len(record.dane.judgements) == 3
                results, _ = await ask_v2(notary, site, [sha(der) for der in leaves])
                assert [r.verdict for r in results] == [
                    "match" if sha(der) in kept else "unknown" for der in leaves]
