"""DANE against resolvers that misbehave (issue 30, items 12-16): a small
fake resolver on loopback UDP (``tests.support.fakedns``, a Trio task) that
sends stray and malformed datagrams before its answer, stays silent,
refuses, answers denials without an SOA, and counts what it is asked.
Each fault at the lookup (``notary.outbound.tlsa``) and through a serving
notary."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import dns.rcode
import pytest
import trio

from notary.config import Endpoint
from notary.errors import ProbeResolveFailed
from notary.model.dane import DnssecStatus
from notary.model.targets import Target
from notary.outbound.dialer import system_resolver
from notary.outbound.tlsa import lookup_tlsa, resolver_through
from notary.protocol.convergence import format_fingerprint
from notary.state import crypto
from tests.support.chains import ee_record
from tests.support.fakedns import (
    Answerer,
    FakeResolver,
    open_fake_resolver,
    rcode_answers,
    silent,
    validated_root,
    zone_answers,
)
from tests.support.http_client import http_get
from tests.support.notaries import NotaryUnderTest, legacy_query, open_notary, send_raw
from tests.support.polling import wait_for
from tests.support.tls_targets import TLSTarget, open_tls_target

NAME = "www.test"


def site_records(site: TLSTarget, name: str = NAME) -> dict[tuple[str, str], list[str]]:
    """The A and TLSA records of ``name`` on ``site`` (a DANE-EE match)."""
    return {
        (f"{name}.", "A"): [site.host],
        (f"_{site.port}._tcp.{name}.", "TLSA"): [ee_record(site.leaf_der(name))],
    }


@asynccontextmanager
async def fake_dane_notary(
    tmp_path: Path, resolver: FakeResolver, backends: tuple[str, ...] = ("dane",),
    name: str = "n", **sections: Mapping[str, object],
):
    """A notary with DANE among ``backends`` and v2 on, resolving names and
    looking up TLSA records through the fake ``resolver``."""
    key_path = tmp_path / f"{name}-v2.key"
    crypto.write_ed25519_private_key(key_path, crypto.generate_ed25519_key())
    settings: dict[str, Any] = {
        "verify": {"backends": backends},
        "dns": {"resolvers": (Endpoint(*resolver.address),), "timeout_s": 1.0},
        "answers": {"failures_at_deadline": False},
        "v2": {"key_file": key_path},
    }
    for section, values in sections.items():
        settings[section] = {**settings.get(section, {}), **values}
    async with open_notary(tmp_path / name, resolver=system_resolver, **settings) as notary:
        yield notary


async def ask(notary: NotaryUnderTest, site: TLSTarget, name: str, der: bytes | None):
    fingerprint = format_fingerprint(hashlib.sha1(der).digest()) if der is not None else None
    return await legacy_query(notary.port, f"{name}+{site.port}", fingerprint)


# -- item 12: a datagram that is not the answer is ignored until the deadline


async def test_stray_and_malformed_datagrams_before_the_answer_are_ignored() -> None:
    async with open_tls_target(names=[NAME]) as site:
        records: Mapping[tuple[str, str], Sequence[str]] = site_records(site)
        async with open_fake_resolver(zone_answers(records), strays=True) as fake:
            lookup = await lookup_tlsa(Target(NAME, site.port), fake.address, 2.0)
            addresses = await resolver_through([fake.address], 2.0)(NAME, site.port)
    assert lookup.status is DnssecStatus.SECURE
    assert [str(record) for record in lookup.records] == [ee_record(site.leaf_der(NAME))]
    assert addresses == [site.host]


async def test_an_answer_dnspython_cannot_read_is_a_resolver_failure(monkeypatch) -> None:
    """Whatever dnspython lets out on a resolver's bytes (here a
    ``ValueError``) is a failed lookup, never an exception in the caller."""
    import dns.asyncquery

    async def unreadable(*args: object, **kwargs: object) -> None:
        raise ValueError("a parser's surprise")

    monkeypatch.setattr(dns.asyncquery, "udp_with_fallback", unreadable)
    lookup = await lookup_tlsa(Target(NAME, 443), ("127.0.0.1", 9), 1.0)
    assert lookup.status is DnssecStatus.RESOLVER_FAILURE
    with pytest.raises(ProbeResolveFailed):
        await resolver_through([("127.0.0.1", 9)], 1.0)(NAME, 443)


async def test_a_dane_match_stays_a_match_through_stray_datagrams(tmp_path: Path) -> None:
    async with open_tls_target(names=[NAME]) as site:
        answer: Answerer = zone_answers(site_records(site))
        async with open_fake_resolver(answer, strays=True) as fake, \
                fake_dane_notary(tmp_path, fake) as notary:
            assert (await ask(notary, site, NAME, site.leaf_der(NAME))).status == 200
    assert (f"_{site.port}._tcp.{NAME}.", "TLSA") in fake.asked


# -- item 16: an IP literal has no TLSA records, and no query is sent for it


async def test_an_ip_literal_is_insecure_without_a_query() -> None:
    async with open_fake_resolver(zone_answers({})) as fake:
        for host in ("127.0.0.21", "::1"):
            lookup = await lookup_tlsa(Target(host, 443), fake.address, 1.0)
            assert lookup.status is DnssecStatus.INSECURE, host
            assert lookup.ttl > 0  # reused, as long as [verify] dane_reuse_max_s allows
            assert await resolver_through([fake.address], 1.0)(host, 443) == [host]
    assert fake.datagrams == 0


async def test_ip_literal_targets_are_decided_by_the_perspective_without_dns(
    tmp_path: Path,
) -> None:
    """Under "DANE, then perspective" an IP literal is a zone DNSSEC cannot
    secure: the perspective decides (and the statement says DANE found the
    target insecure); under DANE alone it is inconclusive (303, unknown).
    Not one datagram reaches the resolver, for IPv4 and IPv6 literals."""
    from tests.support.v2_queries import ask_v2

    for backends in (("dane", "perspective"), ("dane",)):
        async with open_fake_resolver(zone_answers({})) as fake:
            for host in ("127.0.0.1", "::1"):
                allowed = {"allow_targets": ("127.0.0.0/8", "::1/128")}
                async with open_tls_target(names=[], host=host) as site, fake_dane_notary(
                    tmp_path, fake, backends, name=f"{len(backends)}-{host}", server=allowed,
                ) as notary:
                    before = fake.datagrams
                    leaf = site.leaf_der()  # no SNI for an address: the default one
                    answer = await ask(notary, site, f"[{host}]" if ":" in host else host, leaf)
                    found = await ask_v2(notary, site, host, leaf)
                    assert fake.datagrams == before, (backends, host)
                dane = found["statement"]["verification"]["dane"]
                assert (dane["outcome"], dane["dnssec"]) == ("insecure", "insecure")
                if backends == ("dane",):
                    assert answer.status == 303 and b"not signed" in answer.body, host
                    assert found["verdict"] == "unknown", host
                else:
                    assert answer.status == 200, (host, answer)
                    assert found["verdict"] == "match", host
                    assert found["statement"]["verification"]["backend"] == "perspective"


# -- item 15: a denial without an SOA (no negative TTL) is reused for a floor


@pytest.mark.parametrize("denial", ["nodata", "nxdomain"])
@pytest.mark.parametrize("ad", [True, False])
async def test_a_denial_without_soa_is_reused_not_a_503(
    tmp_path: Path, denial: str, ad: bool
) -> None:
    """A denial with no SOA (a static local zone answers so) has no negative
    TTL: its verdict is reused for ``[verify] dane_reuse_min_s`` rather than
    expiring at once, which made every later query probe again, be
    throttled by the per-target budget, and answer 503 for a certificate
    vouched for a moment before."""
    async with open_tls_target(names=[NAME]) as site:
        records = {(f"{NAME}.", "A"): [site.host]}
        if denial == "nodata":
            records[(f"_{site.port}._tcp.{NAME}.", "TXT")] = ['"no TLSA here"']
        answer = validated_root(zone_answers(records, soa=False, ad=ad))
        async with open_fake_resolver(answer) as fake, fake_dane_notary(
            tmp_path, fake, ("dane", "perspective"),
        ) as notary:
            leaf = site.leaf_der(NAME)
            assert (await ask(notary, site, NAME, leaf)).status == 200
            probes = site.accepted
            for _ in range(5):  # within the floor (30 s by default): no new probe
                notary.clock.advance(5)
                assert (await ask(notary, site, NAME, leaf)).status == 200
            assert site.accepted == probes
            notary.clock.advance(10)  # past it: checked again, still vouched for
            assert (await ask(notary, site, NAME, leaf)).status == 200
            assert site.accepted > probes


async def test_a_throttled_query_uses_the_verdict_of_the_recent_probe(tmp_path: Path) -> None:
    """A query throttled by the per-target budget is answered from the
    observation of the recent probe (invariant 6); the DANE verdict made
    with that probe answers with it, even when its TTL (1 s here) ran out."""
    async with open_tls_target(names=[NAME]) as site:
        answer = zone_answers({(f"{NAME}.", "A"): [site.host]}, ttl=1)
        async with open_fake_resolver(answer) as fake, fake_dane_notary(
            tmp_path, fake, ("dane", "perspective"), verify={"dane_reuse_min_s": 1},
            limits={"probes_per_minute_per_target": 1},
        ) as notary:
            leaf = site.leaf_der(NAME)
            assert (await ask(notary, site, NAME, leaf)).status == 200
            notary.clock.advance(5)  # the verdict expired; the target's next probe is 55 s off
            assert (await ask(notary, site, NAME, leaf)).status == 200


# -- item 13: a failed lookup of the name itself is counted, and says why


async def test_the_name_lookup_says_how_dnssec_failed() -> None:
    """``resolver_through`` tells a validation failure (SERVFAIL) and a
    resolver that does not answer (silence, REFUSED) from a name without
    addresses; a silent resolver is asked once, within the deadline."""
    cases = [
        (rcode_answers(dns.rcode.SERVFAIL), "bogus"),
        (rcode_answers(dns.rcode.REFUSED), "resolver-failure"),
        (silent, "resolver-failure"),
        (zone_answers({}), None),  # NXDOMAIN: the name has no address, nothing failed
    ]
    for answer, dnssec in cases:
        async with open_fake_resolver(answer) as fake:
            started = trio.current_time()
            with pytest.raises(ProbeResolveFailed) as raised:
                await resolver_through([fake.address], 0.5)(NAME, 443)
            assert trio.current_time() - started < 5  # 0.5 s asked; a loaded machine
        assert getattr(raised.value, "dnssec", None) == dnssec, answer
        if answer is silent:
            assert fake.asked == [(f"{NAME}.", "A")]  # not asked AAAA after its silence


async def v2_of(notary: NotaryUnderTest, site: TLSTarget, name: str, der: bytes) -> dict:
    from tests.support.v2_queries import ask_v2

    return await ask_v2(notary, site, name, der)


async def dane_checks(notary: NotaryUnderTest, outcome: str) -> float:
    from tests.support.metrics import value

    metrics = notary.running.metrics
    assert metrics is not None
    return value((await metrics.render()).decode(), "notary_dane_checks_total", outcome=outcome)


@pytest.mark.parametrize(("answer", "outcome", "message"), [
    (rcode_answers(dns.rcode.SERVFAIL), "bogus", b"failed DNSSEC validation"),
    (rcode_answers(dns.rcode.REFUSED), "resolver-failure", b"could not look up"),
    (silent, "resolver-failure", b"could not look up"),
])
@pytest.mark.parametrize("backends", [("dane",), ("dane", "perspective")])
async def test_a_failed_name_lookup_is_counted_and_answered_with_its_reason(
    tmp_path: Path, answer: Answerer, outcome: str, message: bytes, backends: tuple[str, ...],
) -> None:
    """The name's own A lookup fails (validation, a refusal, silence): the
    check is counted by outcome, Convergence answers DANE's message, v2 signs
    a statement (no observation) whose evidence names the outcome and judges
    no certificate, Perspectives knows nothing (404) and the target is not
    registered for rescans (its query stopped at the name lookup)."""
    key_path = tmp_path / "perspectives.key"
    crypto.write_new_file(
        key_path, crypto.private_key_pem(crypto.generate_perspectives_key()), mode=0o600)
    async with open_tls_target(names=[NAME]) as site:
        async with open_fake_resolver(answer) as fake, fake_dane_notary(
            tmp_path, fake, backends, perspectives={"key_file": key_path},
        ) as notary:
            leaf = site.leaf_der(NAME)
            first = await ask(notary, site, NAME, leaf)
            assert first.status == 503 and message in first.body
            assert await dane_checks(notary, outcome) == 1
            # Reused for [verify] dane_failure_reuse_s: no new lookup.
            asked = len(fake.asked)
            again = await ask(notary, site, NAME, leaf)
            assert again.status == 503 and message in again.body
            found = await v2_of(notary, site, NAME, leaf)
            assert len(fake.asked) == asked and await dane_checks(notary, outcome) == 1
            assert found["verdict"] == "unreachable"
            statement = found["statement"]
            assert statement["observations"] == []
            assert statement["verification"] == {"backend": "dane", "dane": {
                "outcome": outcome, "dnssec": outcome, "checked_at": statement["verification"][
                    "dane"]["checked_at"], "sha256": None, "tlsa": [], "matched": None}}
            perspectives = await send_raw(notary.port, (
                f"GET /?host={NAME}&port={site.port}&service_type=2 HTTP/1.0\r\n\r\n").encode())
            assert perspectives.status == 404
            scheduler = notary.running.scheduler
            assert scheduler is not None and scheduler.statistics().targets_known == 0
    assert site.accepted == 0  # never connected to: the name did not resolve


async def test_a_known_site_whose_name_turns_bogus_is_a_503_that_says_so(
    tmp_path: Path,
) -> None:
    """A site vouched for by DANE whose zone's signatures then fail: 503
    with DANE's message, never its old match; the v2 statement keeps the
    history and says the DNSSEC validation failed."""
    async with open_tls_target(names=[NAME]) as site:
        good = zone_answers(site_records(site))
        failing = rcode_answers(dns.rcode.SERVFAIL)
        now = [good]
        async with open_fake_resolver(lambda query: now[0](query)) as fake, \
                fake_dane_notary(tmp_path, fake, ("dane", "perspective")) as notary:
            leaf = site.leaf_der(NAME)
            assert (await ask(notary, site, NAME, leaf)).status == 200
            now[0] = failing
            notary.clock.advance(400)  # past the records' TTL (300 s)
            answer = await ask(notary, site, NAME, leaf)
            assert answer.status == 503 and b"failed DNSSEC validation" in answer.body
            found = await v2_of(notary, site, NAME, leaf)
            assert await dane_checks(notary, "bogus") == 1
    assert found["verdict"] == "unreachable"
    assert [o["sha256"] for o in found["statement"]["observations"]] == [
        hashlib.sha256(leaf).hexdigest()]
    dane = found["statement"]["verification"]["dane"]
    assert (dane["outcome"], dane["sha256"]) == ("bogus", None)


async def test_a_probe_failing_beside_a_bogus_tlsa_lookup_says_why(tmp_path: Path) -> None:
    """The name resolves (a static map) but nothing listens at its port, and
    the TLSA lookup fails validation: counted, and answered as bogus."""
    from tests.support.tls_targets import static_resolver

    with trio.socket.socket() as closed:  # a port nothing listens on
        await closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    async with open_fake_resolver(rcode_answers(dns.rcode.SERVFAIL)) as fake:
        settings = {
            "verify": {"backends": ("dane", "perspective")},
            "dns": {"resolvers": (Endpoint(*fake.address),), "timeout_s": 1.0},
            "answers": {"failures_at_deadline": False},
        }
        async with open_notary(
            tmp_path / "n", resolver=static_resolver({NAME: ["127.0.0.1"]}), **settings,
        ) as notary:
            answer = await legacy_query(notary.port, f"{NAME}+{port}", None)
            assert answer.status == 503 and b"failed DNSSEC validation" in answer.body
            assert await dane_checks(notary, "bogus") == 1


# -- item 14: the resolvers must validate; /readyz says when they do not


async def readyz(notary: NotaryUnderTest) -> tuple[int, bytes]:
    status, _, body = await http_get(notary.running.admin[0].port, "/readyz")
    return status, body


async def ready_is(notary: NotaryUnderTest, status: int) -> bool:
    return (await readyz(notary))[0] == status


async def test_readyz_follows_the_resolver_validation_check(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """A resolver silent at start-up: the notary starts (a warning), and
    ``/readyz`` answers 503 with the reason until a check (every ``[dns]
    validation_recheck_s``) finds it validating; a resolver that stops
    setting the AD bit makes it 503 again, saying so. ``/readyz`` itself
    never asks the resolver."""
    validating = zone_answers({(".", "SOA"): ["ns. hostmaster. 1 3600 600 86400 300"]})
    plain = zone_answers({(".", "SOA"): ["ns. hostmaster. 1 3600 600 86400 300"]}, ad=False)
    now: list[Answerer] = [silent]
    async with open_fake_resolver(lambda query: now[0](query)) as fake, fake_dane_notary(
        tmp_path, fake, dns={"timeout_s": 0.5, "validation_recheck_s": 0.2},
    ) as notary:
        assert any("did not answer the DNSSEC check" in r.getMessage() for r in caplog.records)
        status, body = await readyz(notary)
        where = f"127.0.0.1:{fake.address[1]}"
        assert status == 503
        assert body == (f"DNS resolver {where} did not answer the DNSSEC check "
                        "(no answer to . SOA within 0.5 s)\n").encode()
        now[0] = validating
        await wait_for(lambda: ready_is(notary, 200))
        now[0] = plain
        await wait_for(lambda: ready_is(notary, 503))
        status, body = await readyz(notary)
        assert body.startswith(f"DNS resolver {where} does not validate DNSSEC".encode())
    assert fake.asked.count((".", "SOA")) >= 3
    assert all(question == (".", "SOA") for question in fake.asked)


async def test_readyz_reads_the_last_check_and_asks_nothing(tmp_path: Path) -> None:
    validating = zone_answers({(".", "SOA"): ["ns. hostmaster. 1 3600 600 86400 300"]})
    async with open_fake_resolver(validating) as fake, fake_dane_notary(tmp_path, fake) as notary:
        asked = len(fake.asked)
        assert asked == 1  # the start-up check
        for _ in range(20):
            assert await readyz(notary) == (200, b"ready\n")
        assert len(fake.asked) == asked


async def test_the_check_name_is_configured(tmp_path: Path) -> None:
    """``[dns] validation_check_name``: the name asked (a lab's own signed
    zone)."""
    validating = zone_answers({("lab.test.", "SOA"): ["ns. hostmaster. 1 3600 600 86400 300"]})
    async with open_fake_resolver(validating) as fake, fake_dane_notary(
        tmp_path, fake, dns={"validation_check_name": "lab.test"},
    ) as notary:
        assert await readyz(notary) == (200, b"ready\n")
    assert fake.asked == [("lab.test.", "SOA")]


async def test_a_bug_in_one_targets_dane_check_fails_that_query_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """An exception nobody foresaw in a refresh (here the DANE check) ended
    ``Records`` and the notary with it: it is that target's failed probe,
    logged with its traceback, and the notary goes on."""
    from notary.service.dane import DaneChecker

    async def broken(self: DaneChecker, target: Target) -> None:
        raise RuntimeError("a bug in the DANE check")

    monkeypatch.setattr(DaneChecker, "lookup", broken)
    async with open_tls_target(names=[NAME, "other.test"]) as site:
        records = {**site_records(site), **site_records(site, "other.test")}
        async with open_fake_resolver(zone_answers(records)) as fake, fake_dane_notary(
            tmp_path, fake
        ) as notary:
            for name in (NAME, "other.test"):
                answer = await ask(notary, site, name, site.leaf_der(name))
                assert answer.status == 503
            status, _, _ = await http_get(notary.running.admin[0].port, "/healthz")
            assert status == 200
    assert "RuntimeError: a bug in the DANE check" in caplog.text
