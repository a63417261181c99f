"""A notary's answers for sites that serve several certificates at once
(issue 31): every certificate of the target's current set is vouched for in
every protocol, a certificate nobody serves is refused in every protocol,
and a split site is no "rotating" site for the scheduler.

A real notary on loopback (``tests.support.notaries``), each site on
several loopback addresses (``tests.support.sites``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from notary.config import Endpoint
from notary.model.targets import Target
from notary.protocol import v2
from notary.service.query import Outcome
from notary.state import crypto
from tests.support.http_client import http_get, post_json
from tests.support.notaries import NotaryUnderTest, legacy_query, open_notary, sha1_fp
from tests.support.perspectives import independent_verify, md5_fp
from tests.support.sites import has_ipv6_loopback, open_site
from tests.support.v2_queries import public_keys

#: ``[limits] probes_per_minute_per_target`` (4): one probe every 15 s.
TARGET_SPACING_S = 16
UNSERVED = hashlib.sha256(b"a certificate nobody serves").digest()


@asynccontextmanager
async def open_split_notary(
    tmp_path: Path, names: dict, **sections: object
) -> AsyncIterator[tuple[NotaryUnderTest, object]]:
    """A notary serving Convergence, Perspectives and v2, allowed to probe
    IPv4 and IPv6 loopback, failures answered at once; and its Perspectives
    public key."""
    v2_key = tmp_path / "v2.key"
    crypto.write_ed25519_private_key(v2_key, crypto.generate_ed25519_key())
    perspectives_key = tmp_path / "perspectives.key"
    key = crypto.generate_perspectives_key()
    crypto.write_new_file(perspectives_key, crypto.private_key_pem(key), mode=0o600)
    async with open_notary(
        tmp_path / "n", names=names, allow_targets=("127.0.0.0/8", "::1/128"),
        v2={"key_file": v2_key},
        perspectives={"key_file": perspectives_key, "listen": (Endpoint("127.0.0.1", 0),)},
        answers={"failures_at_deadline": False}, **sections,  # type: ignore[arg-type]
    ) as notary:
        yield notary, key.public_key()


async def v2_verdicts(notary: NotaryUnderTest, target: Target, hashes: list[bytes]) -> list[str]:
    """The verified v2 verdicts for ``target`` and each of the SHA-256 ``hashes``."""
    request = {"targets": [
        {"host": target.host, "port": target.port, "sha256": sha256.hex()} for sha256 in hashes
    ], "nonce": "split"}
    status, body = await post_json(notary.port, "/v2/query", request)
    assert status == 200
    queries = v2.parse_query_request(
        json.dumps(request).encode(), max_batch=100, max_body_bytes=1 << 20
    ).targets
    results = v2.verify_answer(
        v2.parse_answer_document(body), await public_keys(notary), nonce="split",
        now=int(notary.clock()), queries=queries,
    )
    return [result.verdict for result in results]


def current_at_latest(keys: list[tuple[str, list[tuple[int, int]]]], fp: str) -> bool:
    """Whether the key ``fp`` has a timespan holding the latest end of any
    key of one notary's reply: all a notary can do for a split site. (The
    2008 client then counts only the first such key of each reply:
    tests/protocol/test_split_sites_legacy.py, docs/sites.md "Sites that serve
    several certificates".)"""
    latest = max(end for _, spans in keys for _, end in spans)
    return any(
        start <= latest <= end for key, spans in keys if key == fp for start, end in spans
    )


async def test_every_certificate_of_a_split_site_is_vouched_in_every_protocol(
    tmp_path: Path,
) -> None:
    addresses = ("127.0.0.2", "127.0.0.3", "::1" if has_ipv6_loopback() else "127.0.0.4")
    async with open_site(addresses, alternating=("127.0.0.3",)) as site:
        async with open_split_notary(tmp_path, {site.name: list(addresses)}) as (notary, public):
            target, records = site.target(), notary.running.records
            convergence_target = f"{site.name}+{site.port}"
            # A first look (GET): one handshake per address.
            first = await legacy_query(notary.port, convergence_target, None)
            assert first.status == 200
            record = await records.lookup(target)
            assert record is not None and record.last_report is not None
            assert record.last_report.addresses == addresses
            assert len(record.last_report.leaves) == 3
            # The alternating address's other certificate: unknown, so
            # probed, sampled (several certificates seen lately): vouched.
            notary.clock.advance(TARGET_SPACING_S)
            for der in sorted(site.leaves()):
                answer = await legacy_query(notary.port, convergence_target, sha1_fp(der))
                assert answer.status == 200, der
            record = await records.lookup(target)
            assert record is not None and record.last_report is not None
            assert {leaf.der for leaf in record.last_report.served["127.0.0.3"]} == set(
                site.at("127.0.0.3").leaf_ders
            )  # both, in one probe
            assert {o.certificate.der for o in record.timeline.observations} == site.leaves()
            # A certificate nobody serves: 409 with the whole list.
            notary.clock.advance(TARGET_SPACING_S)
            refused = await legacy_query(notary.port, convergence_target, ":".join(["AB"] * 20))
            assert refused.status == 409
            listed = {row["fingerprint"] for row in json.loads(refused.body)["fingerprintList"]}
            assert listed == {sha1_fp(der) for der in site.leaves()}
            # v2: a match for each, a mismatch for the one nobody serves.
            hashes = [hashlib.sha256(der).digest() for der in sorted(site.leaves())]
            assert await v2_verdicts(notary, target, [*hashes, UNSERVED]) == [
                *["match"] * 4, "mismatch"
            ]
            # Perspectives: each key, each current for the 2008 client.
            port = notary.running.perspectives[0].port
            status, _, xml = await http_get(port, f"/?host={site.name}&port={site.port}")
            assert status == 200
            keys = independent_verify(xml, f"{site.name}:{site.port},2", public)
            assert {fp for fp, _ in keys} == {md5_fp(der) for der in site.leaves()}
            assert all(current_at_latest(keys, md5_fp(der)) for der in site.leaves())
            assert not current_at_latest(keys, md5_fp(b"nobody"))


async def test_a_rotation_spread_over_addresses(tmp_path: Path) -> None:
    """A new certificate appears at one address first: vouched at once
    (probed as unknown), the others' still vouched, and only that probe is a
    change for the scheduler."""
    addresses = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
    async with open_site(addresses) as site:
        async with open_split_notary(tmp_path, {site.name: list(addresses)}) as (notary, _):
            target, records = site.target(), notary.running.records
            convergence_target = f"{site.name}+{site.port}"
            old = {a: site.leaf_der(a) for a in addresses}
            assert (await legacy_query(notary.port, convergence_target, None)).status == 200
            new = site.replace_certificate("127.0.0.2")
            notary.clock.advance(TARGET_SPACING_S)
            assert (await legacy_query(notary.port, convergence_target, sha1_fp(new))).status == 200
            record = await records.lookup(target)
            assert record is not None and record.last_probe_changed  # a certificate new to it
            for der in old.values():  # still fresh: vouched
                assert (await legacy_query(notary.port, convergence_target, sha1_fp(der))).status == 200
            assert await v2_verdicts(
                notary, target, [hashlib.sha256(d).digest() for d in (new, *old.values())]
            ) == ["match"] * 4
            again = await records.refresh(target)
            assert not again.last_probe_changed
            # The rest of the rotation: none is a change once each was seen.
            site.replace_certificate("127.0.0.3")
            assert (await records.refresh(target)).last_probe_changed
            assert not (await records.refresh(target)).last_probe_changed


async def test_an_address_hint_is_probed_only_within_the_notary_s_resolution(
    tmp_path: Path,
) -> None:
    addresses = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
    async with open_site(addresses) as site:
        names = {site.name: ["127.0.0.2", "127.0.0.3"]}  # 127.0.0.4: another site
        async with open_split_notary(
            tmp_path, names, probe={"max_addresses": 1}
        ) as (notary, _):
            service, target = notary.running.service, site.target()
            probed = await service.probe_for_query(target, None, None, address_hint="127.0.0.4")
            assert probed.outcome is Outcome.OBSERVED and probed.record is not None
            assert probed.record.last_report is not None
            assert probed.record.last_report.addresses == ("127.0.0.2",)
            assert site.at("127.0.0.4").accepted == 0
            notary.clock.advance(TARGET_SPACING_S)
            # Resolved by the notary (and left out by max_addresses): probed.
            probed = await service.probe_for_query(target, None, None, address_hint="127.0.0.3")
            assert probed.record is not None and probed.record.last_report is not None
            assert probed.record.last_report.addresses == ("127.0.0.2", "127.0.0.3")
            assert site.at("127.0.0.3").accepted == 1
            hints = notary.running.prober.statistics().hints
            assert (hints["added"], hints["ignored"]) == (1, 1)


async def test_a_v2_entry_s_address_reaches_the_probe(tmp_path: Path) -> None:
    """The v2 ``address`` field (R4) is the probe's hint: an address the
    notary's own resolution returned is probed and its certificate vouched
    for; another is not connected to, and its certificate stays unknown to
    the notary (``mismatch``)."""
    addresses = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
    async with open_site(addresses) as site:
        names = {site.name: ["127.0.0.2", "127.0.0.3"]}  # 127.0.0.4: another site
        async with open_split_notary(
            tmp_path, names, probe={"max_addresses": 1}
        ) as (notary, _):
            target = site.target()
            hidden = hashlib.sha256(site.leaf_der("127.0.0.4")).hexdigest()
            request = {"targets": [
                {"host": target.host, "port": target.port, "sha256": hidden,
                 "address": "127.0.0.4"},
            ]}
            status, _ = await post_json(notary.port, "/v2/query", request)
            assert status == 200 and site.at("127.0.0.4").accepted == 0
            notary.clock.advance(TARGET_SPACING_S)
            third = hashlib.sha256(site.leaf_der("127.0.0.3")).hexdigest()
            request = {"targets": [
                {"host": target.host, "port": target.port, "sha256": third,
                 "address": "127.0.0.3"},
            ], "nonce": "hint"}
            status, body = await post_json(notary.port, "/v2/query", request)
            assert status == 200 and site.at("127.0.0.3").accepted == 1
            queries = v2.parse_query_request(
                json.dumps(request).encode(), max_batch=100, max_body_bytes=1 << 20
            ).targets
            (result,) = v2.verify_answer(
                v2.parse_answer_document(body), await public_keys(notary), nonce="hint",
                now=int(notary.clock()), queries=queries,
            )
            assert result.verdict == "match"
            assert await v2_verdicts(notary, target, [bytes.fromhex(hidden)]) == ["mismatch"]


@pytest.mark.parametrize("samples", [1, 4])
async def test_a_split_site_is_no_change_once_its_certificates_are_known(
    tmp_path: Path, samples: int
) -> None:
    """Whatever mix of its certificates a probe sees, a split site is not a
    rotating one for the scheduler (``last_probe_changed``): two addresses
    alternating two certificates each show two new ones at the second
    probe, then nothing new."""
    addresses = ("127.0.0.2", "127.0.0.3")
    async with open_site(addresses, alternating=addresses) as site:
        async with open_split_notary(
            tmp_path, {site.name: list(addresses)}, probe={"samples_per_address": samples},
        ) as (notary, _):
            records = notary.running.records
            seen = [await records.refresh(site.target()) for _ in range(5)]
    assert [record.last_probe_changed for record in seen] == [False, True, False, False, False]
    assert {o.certificate.der for o in seen[-1].timeline.observations} == site.leaves()


@pytest.mark.parametrize(("addresses", "refused"), [
    (("127.0.0.2",), 0),  # one new certificate: the probe's own token, 3 left
    (("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"), 4),  # four: 3 more, none left
])
async def test_each_new_certificate_a_probe_shows_costs_its_client_a_probe(
    tmp_path: Path, addresses: tuple[str, ...], refused: int,
) -> None:
    """A probe of every address can make the store keep several new
    certificates (up to 36 at the defaults, ~320 kB) where one probe kept
    one: each beyond the first is charged to the client's probe budget, so
    what a client makes the notary keep stays bounded by its probe rate."""
    async with open_site(addresses) as site, open_site(
        ("127.0.0.6",), name="other.example.test"
    ) as other:
        names = {site.name: list(addresses), other.name: ["127.0.0.6"]}
        async with open_split_notary(
            tmp_path, names,
            limits={"exempt_clients": (), "probes_per_s_per_prefix": 0.0001, "probe_burst": 4},
        ) as (notary, _):
            assert (await legacy_query(notary.port, f"{site.name}+{site.port}", None)).status == 200
            statuses = [
                (await legacy_query(notary.port, f"{other.name}+{other.port}", sha1_fp(bytes([i]))))
                .status for i in range(4)
            ]
    # Each query below asks a fingerprint nobody serves: a probe each time,
    # until the budget is spent (429); the per-target spacing answers the
    # rest from the probe just made (409).
    assert statuses.count(429) == refused
