"""`notary check` and sites that serve several certificates (issue 31,
items 4 and 5): the address the client's own connection reached goes with
a v2 question; a notary's row says when the site is split or rotating (the
statement's signed consistency, docs/v2.md S8); ``--json`` carries the
consistency and which addresses served which certificate.

The notary's side of a split site is a statement built from a timeline of
sightings at several addresses (``tests.support.observations``), answered
through a stand-in for the network exchange; the real notaries of
``tests/test_client.py`` check the same path end to end for a site at one
address (loopback only).
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from notary.cli.report import report_json, report_table
from notary.client import check as client
from notary.model.consistency import Consistency, ConsistencyKind
from notary.model.observations import Timeline
from notary.model.targets import Target
from notary.protocol import v2
from notary.protocol.bundle import Bundle, BundleHost, make_bundle
from notary.protocol.http import Response
from notary.protocol.voting import Threshold, Verdict, tally
from notary.state import crypto
from tests.support.client_world import SITE, bundle_of, open_world, run_check
from tests.support.observations import certificate, sightings_timeline
from tests.support.tls_targets import open_tls_target, static_resolver

DAY = 86400
TARGET = Target("www.example.test", 443)


@functools.cache
def v2_signer() -> crypto.Ed25519Signer:
    return crypto.Ed25519Signer(crypto.generate_ed25519_key())


@functools.cache
def tls_pem() -> str:
    key = crypto.generate_rsa_key()
    return crypto.certificate_pem(crypto.make_self_signed_certificate(key, "n.test")).decode()


def some_bundle() -> Bundle:
    return make_bundle(
        name="Split-aware", location="https://127.0.0.1/split.notary",
        hosts=[BundleHost("127.0.0.1", 4433, 4242, tls_pem())],
    )


def split_site(now: int) -> Timeline:
    """Three addresses with a certificate each, a fourth serving the third's;
    an older certificate no longer served."""
    return sightings_timeline([
        ("a", "127.0.0.2", now - 30), ("b", "127.0.0.3", now - 20),
        ("c", "127.0.0.4", now - 10), ("c", "::1", now - 5), ("old", "127.0.0.2", now - 3 * DAY),
    ])


class FakeNotary:
    """Stands in for the network exchange of ``notary.client.check``: keeps
    each request and answers ``/v2/query`` with a signed answer about
    ``timeline``, judging the submitted SHA-1 as a notary would."""

    def __init__(self, timeline: Timeline, now: int) -> None:
        self.timeline = timeline
        self.now = now
        self.requests: list[bytes] = []

    async def keys(self, bundle, relay, resolver):
        signer = v2_signer()
        return {signer.key_id: Ed25519PublicKey.from_public_bytes(signer.public_raw)}, (
            bundle.hosts[0]
        )

    async def exchange(self, bundle, relay, resolver, build):
        host = bundle.hosts[0]
        request = build(host)
        self.requests.append(request)
        body = json.loads(request.split(b"\r\n\r\n", 1)[1])
        (entry,) = body["targets"]
        sha1 = bytes.fromhex(entry["sha1"])
        signer = v2_signer()
        verdict = v2.verdict_of(self.timeline, None, sha1, now=self.now, fresh_for_s=DAY)
        statement = v2.sign_statement(v2.statement(
            self.timeline, key_id=signer.key_id, signed_at=self.now, valid_for_s=DAY,
            fresh_for_s=DAY,
        ), signer.sign)
        answer = v2.answer_bytes(
            [v2.QueryResult(self.timeline.target, verdict, statement)], nonce=body["nonce"],
            signed_at=self.now, key_id=signer.key_id, sign=signer.sign,
        )
        return Response(200, (), answer), host


@pytest.fixture
def fake_notary(monkeypatch: pytest.MonkeyPatch) -> FakeNotary:
    now = int(time.time())
    notary = FakeNotary(split_site(now), now)
    monkeypatch.setattr(client, "_v2_keys", notary.keys)
    monkeypatch.setattr(client, "exchange", notary.exchange)
    return notary


# -- the row and the request -----------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "b", "c"])
async def test_a_notary_vouches_for_each_certificate_of_a_split_site(
    fake_notary: FakeNotary, name: str
) -> None:
    answer = await client._ask_v2(
        some_bundle(), TARGET, certificate(name).sha1, None, static_resolver({}),
        address="127.0.0.3",
    )
    assert answer.verdict is Verdict.SUCCESS
    assert answer.detail == "network perspective; split site: 3 certificates at 4 addresses"
    assert answer.consistency is not None and answer.consistency.kind is ConsistencyKind.SPLIT
    assert [o.sha256 for o in answer.observations][:3] == [
        certificate(n).sha256 for n in ("c", "b", "a")
    ]
    (request,) = fake_notary.requests
    (entry,) = json.loads(request.split(b"\r\n\r\n", 1)[1])["targets"]
    assert entry == {"host": TARGET.host, "port": 443, "sha1": certificate(name).sha1.hex(),
                     "address": "127.0.0.3"}


async def test_a_certificate_out_of_the_current_set_is_not_vouched_for(
    fake_notary: FakeNotary,
) -> None:
    for name in ("old", "man-in-the-middle"):
        answer = await client._ask_v2(
            some_bundle(), TARGET, certificate(name).sha1, None, static_resolver({})
        )
        assert answer.verdict is Verdict.FAILURE
        assert answer.detail.startswith("mismatch; network perspective; split site")
    entries = [json.loads(r.split(b"\r\n\r\n", 1)[1])["targets"][0] for r in fake_notary.requests]
    assert all("address" not in entry for entry in entries)  # none given: none sent


@pytest.mark.parametrize(("consistency", "words"), [
    (None, ""),
    (Consistency(ConsistencyKind.STABLE, ("192.0.2.1", "192.0.2.2"), (b"a",)), ""),
    (Consistency(ConsistencyKind.SPLIT, ("192.0.2.1", "192.0.2.2"), (b"a", b"b")),
     "split site: 2 certificates at 2 addresses"),
    (Consistency(ConsistencyKind.ROTATING, ("192.0.2.1",), (b"a", b"b")),
     "rotating site: 2 certificates at 1 address"),
])
def test_consistency_words(consistency: Consistency | None, words: str) -> None:
    assert client.consistency_text(consistency) == words


# -- the report ------------------------------------------------------------------------


async def test_the_table_and_json_show_which_addresses_served_which_certificate(
    fake_notary: FakeNotary,
) -> None:
    fingerprint = certificate("b").sha1
    answers = (
        await client._ask_v2(some_bundle(), TARGET, fingerprint, None, static_resolver({})),
        client.NotaryAnswer("Legacy", Verdict.SUCCESS, host="127.0.0.9", status=200),
    )
    report = client.CheckReport(
        target=TARGET, fingerprint=fingerprint, threshold=Threshold.MAJORITY, strict=False,
        answers=answers, tally=tally((a.verdict for a in answers), Threshold.MAJORITY),
    )
    rows = report_table(report, now=fake_notary.now).splitlines()
    split_row = next(row for row in rows if row.startswith("Split-aware"))
    assert split_row.endswith("network perspective; split site: 3 certificates at 4 addresses")
    document = json.loads(report_json(report))
    split, legacy = document["notaries"]
    sha = {name: certificate(name).sha256.hex() for name in ("a", "b", "c", "old")}
    assert split["consistency"] == {
        "kind": "split", "certificates": 3,
        "addresses": ["127.0.0.2", "127.0.0.3", "127.0.0.4", "::1"],
        "current": [sha["c"], sha["b"], sha["a"]],
    }
    by_sha = {c["sha256"]: c for c in split["certificates"]}
    assert by_sha[sha["c"]]["addresses"] == ["::1", "127.0.0.4"]  # newest first, as stated
    assert by_sha[sha["c"]]["current"] is True and by_sha[sha["old"]]["current"] is False
    assert by_sha[sha["b"]]["sha1"] == ":".join(f"{x:02X}" for x in certificate("b").sha1)
    assert split["addresses"] == [
        {"address": "127.0.0.2", "sha256": [sha["a"], sha["old"]]},
        {"address": "127.0.0.3", "sha256": [sha["b"]]},
        {"address": "127.0.0.4", "sha256": [sha["c"]]},
        {"address": "::1", "sha256": [sha["c"]]},
    ]
    assert (legacy["consistency"], legacy["certificates"], legacy["addresses"]) == (None, [], [])


# -- against real notaries on loopback -------------------------------------------------


async def test_fetch_site_says_which_address_it_reached() -> None:
    async with open_tls_target(names=[SITE]) as site:
        fetched = await client.fetch_site(
            Target(SITE, site.port), timeout_s=10.0, resolver=static_resolver({SITE: [site.host]})
        )
    assert fetched.address == site.host
    assert hashlib.sha256(fetched.der).digest() == hashlib.sha256(site.leaf_der(SITE)).digest()


async def test_a_v2_check_of_a_site_at_one_address_is_stable(tmp_path: Path) -> None:
    async with open_world(tmp_path, with_v2=True) as (site, notaries):
        bundles = [bundle_of(n, f"Notary {i}") for i, n in enumerate(notaries[:2])]
        report = await run_check(site, bundles, use_v2=True)
    document = json.loads(report_json(report))
    for notary in document["notaries"]:
        assert notary["verdict"] == "success"
        assert notary["consistency"]["kind"] == "stable"
        assert notary["consistency"]["addresses"] == [site.host]
        assert notary["addresses"] == [
            {"address": site.host, "sha256": [hashlib.sha256(site.leaf_der(SITE)).hexdigest()]}
        ]
    assert all("site:" not in answer.detail for answer in report.answers)
