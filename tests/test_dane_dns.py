"""TLSA lookups through a real validating resolver (``unbound``) in front of
a real authoritative server (``nsd``) serving a zone signed in the test,
all on loopback (``tests.support.dnssec``): each DNSSEC status, and the
DANE verdict on a real chain."""

from __future__ import annotations

import hashlib
import socket
from datetime import UTC, datetime

import pytest
import trio
import trustme

from notary.model.dane import DaneOutcome, DnssecStatus, verdict
from notary.model.targets import Target
from notary.outbound.tlsa import lookup_tlsa
from tests.support.chains import chain_of, spki
from tests.support.dnssec import INSECURE_ZONE, dnssec_stack

HOST = "www.test"
NOW = datetime.now(UTC)


def tlsa_for(der: bytes) -> str:
    return f"3 1 1 {hashlib.sha256(spki(der)).hexdigest()}"


def test_each_dnssec_status_and_the_dane_verdict() -> None:
    chain = chain_of(trustme.CA().issue_cert(HOST))
    other = chain_of(trustme.CA().issue_cert(HOST))
    records = [
        ("_443._tcp.www.test.", "TLSA", tlsa_for(chain[0])),
        ("_8443._tcp.www.test.", "TLSA", tlsa_for(other[0])),
        ("www.test.", "A", "127.0.0.2"),
    ]
    unsigned = [(f"_443._tcp.www.{INSECURE_ZONE}", "TLSA", tlsa_for(chain[0]))]
    with dnssec_stack(records, unsigned=unsigned) as stack:
        async def main() -> dict[str, object]:
            found = {}
            for label, target in (
                ("match", Target(HOST, 443)), ("mismatch", Target(HOST, 8443)),
                ("nodata", Target(HOST, 25)), ("nxdomain", Target("absent.test", 443)),
                ("insecure", Target(f"www.{INSECURE_ZONE.rstrip('.')}", 443)),
            ):
                found[label] = await lookup_tlsa(target, stack.resolver, timeout_s=5)
            return found

        found = trio.run(main)
    assert found["match"].status is DnssecStatus.SECURE and found["match"].ttl == 300
    assert verdict(found["match"], chain, HOST, NOW).outcome is DaneOutcome.MATCH
    assert verdict(found["mismatch"], chain, HOST, NOW).outcome is DaneOutcome.MISMATCH
    for label in ("nodata", "nxdomain"):
        assert found[label].status is DnssecStatus.SECURE_DENIAL, label
        assert verdict(found[label], chain, HOST, NOW).outcome is DaneOutcome.NO_TLSA
    assert found["insecure"].status is DnssecStatus.INSECURE
    assert verdict(found["insecure"], chain, HOST, NOW).outcome is DaneOutcome.INSECURE


def test_a_zone_whose_signatures_expired_is_bogus_never_a_match() -> None:
    chain = chain_of(trustme.CA().issue_cert(HOST))
    with dnssec_stack([("_443._tcp.www.test.", "TLSA", tlsa_for(chain[0]))],
                      expired=True) as stack:
        lookup = trio.run(lookup_tlsa, Target(HOST, 443), stack.resolver, 5)
    assert lookup.status is DnssecStatus.BOGUS and lookup.records == ()
    assert verdict(lookup, chain, HOST, NOW).outcome is DaneOutcome.BOGUS


def test_a_resolver_that_does_not_answer_is_a_failure_within_the_deadline() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:  # bound, never answers
        silent.bind(("127.0.0.1", 0))

        async def main():
            started = trio.current_time()
            lookup = await lookup_tlsa(Target(HOST, 443), silent.getsockname(), 0.5)
            return lookup, trio.current_time() - started

        lookup, elapsed = trio.run(main)
    assert lookup.status is DnssecStatus.RESOLVER_FAILURE
    assert elapsed < 5  # the deadline held (0.5 s asked; generous for a loaded machine)


def test_the_prober_resolves_names_through_the_validating_resolver() -> None:
    """The prober's name path end to end: the name resolves through unbound
    (its answer validated) to a loopback TLS target, which is probed."""
    from notary.errors import ProbeResolveFailed
    from notary.model.policy import AddressPolicy
    from notary.outbound.probe import open_prober
    from notary.outbound.tlsa import resolver_through
    from tests.support.tls_targets import open_tls_target, with_probe_section

    async def main() -> None:
        async with open_tls_target(names=[HOST]) as site:
            with dnssec_stack([("www.test.", "A", "127.0.0.1")]) as stack:
                settings = {"policy": AddressPolicy.from_cidrs(["127.0.0.0/8"]),
                            "timeout_s": 10.0,
                            "resolver": resolver_through([stack.resolver], 2.0)}
                async with open_prober(**with_probe_section(settings)) as prober:
                    result = (await prober.probe(Target(HOST, site.port))).primary
                    assert result.address == "127.0.0.1"
                    assert result.leaf.der == site.leaf_der(HOST)
                    with pytest.raises(ProbeResolveFailed):
                        await prober.probe(Target("absent.test", site.port))
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:
                silent.bind(("127.0.0.1", 0))
                lookup = resolver_through([silent.getsockname()], 0.3)
                with pytest.raises(ProbeResolveFailed):
                    await lookup(HOST, 443)

    trio.run(main)


def test_the_validation_check_reads_the_ad_bit() -> None:
    """``check_validation``: unbound validates the signed (private) root;
    nsd, the zone's authoritative server asked directly, answers without the
    AD bit; a silent socket and a SERVFAIL are no answer, within the
    deadline."""
    from notary.outbound.tlsa import Validation, check_validation

    with dnssec_stack([]) as stack, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:
        silent.bind(("127.0.0.1", 0))

        async def main() -> list:
            found = [await check_validation(where, ".", 2.0)
                     for where in (stack.resolver, stack.authority)]
            started = trio.current_time()
            found.append(await check_validation(silent.getsockname(), ".", 0.5))
            assert trio.current_time() - started < 5
            return found

        validates, authority, quiet = trio.run(main)
    assert validates.result is Validation.VALIDATES
    assert authority.result is Validation.DOES_NOT_VALIDATE
    assert authority.detail == "answered . SOA without the AD bit"
    assert quiet.result is Validation.NO_ANSWER and "within 0.5 s" in quiet.detail
