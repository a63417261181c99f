"""Sites that serve several certificates at once (issue 31; the "Citibank
problem"): the prober observes every address of a name, samples those of
sites seen serving several certificates, and stays within its budgets.

Loopback only: each site is ``tests.support.sites`` (127.0.0.2, 127.0.0.3,
... and ``::1``), its name mapped to its addresses by a static resolver.
The notary's answers for such sites are ``tests/test_sites_answers.py``'s.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from notary.config import ProbeConfig
from notary.errors import ProbeThrottled, ProbeTimeout
from notary.model.policy import AddressPolicy
from notary.outbound.probe import open_prober
from tests.support.faults import patient_autojump_clock  # noqa: F401 (the clock: a fixture)
from tests.support.sites import has_ipv6_loopback, loopback_policy, open_site
from tests.support.tls_targets import static_resolver

NOW = 1_700_000_000.0
IPV6 = pytest.mark.skipif(not has_ipv6_loopback(), reason="no IPv6 loopback")


class Clock:
    """Unix seconds a test moves forward."""

    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def prober(resolver, *, policy=None, clock=None, **settings):
    """``open_prober`` for loopback sites: ``settings`` are ``[probe]`` keys
    (or ``admit_destination``)."""
    admit = settings.pop("admit_destination", None)
    section = ProbeConfig(**{"timeout_s": 10.0, "max_concurrent": 16, **settings})
    return open_prober(
        section, policy=policy or loopback_policy(), resolver=resolver,
        clock=clock or (lambda: NOW), admit_destination=admit,
    )


def served_ders(report) -> dict[str, set[bytes]]:
    return {address: {leaf.der for leaf in leaves} for address, leaves in report.served.items()}


# -- every address --------------------------------------------------------------


async def test_every_address_is_observed_with_its_own_certificate() -> None:
    addresses = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
    async with open_site(addresses) as site, prober(site.resolver()) as p:
        report = await p.probe(site.target())
        statistics = p.statistics()
    assert report.addresses == addresses
    assert served_ders(report) == {a: {site.leaf_der(a)} for a in addresses}
    assert len(site.leaves()) == 3 and {leaf.der for leaf in report.leaves} == site.leaves()
    assert report.failures == ()
    assert {r.observed_at for r in report.results} == {report.observed_at} == {int(NOW)}
    assert report.primary.address == "127.0.0.2"
    assert all(site.at(a).accepted == 1 for a in addresses)
    assert (statistics.started, statistics.succeeded) == (1, 1)
    assert (statistics.connections, statistics.handshakes) == (3, 3)


@IPV6
async def test_ipv4_and_ipv6_serving_different_certificates_are_both_observed() -> None:
    async with open_site(("127.0.0.2", "::1")) as site, prober(site.resolver()) as p:
        report = await p.probe(site.target())
    assert served_ders(report) == {
        "127.0.0.2": {site.leaf_der("127.0.0.2")}, "::1": {site.leaf_der("::1")},
    }
    assert site.leaf_der("127.0.0.2") != site.leaf_der("::1")


async def test_an_alternating_address_shows_both_certificates_when_sampled() -> None:
    async with open_site(("127.0.0.2", "127.0.0.3"), alternating=("127.0.0.3",)) as site:
        async with prober(site.resolver()) as p:
            once = await p.probe(site.target())
            sampled = await p.probe(site.target(), samples_per_address=4)
    alternating = site.at("127.0.0.3")
    assert len(served_ders(once)["127.0.0.3"]) == 1  # one handshake per address
    assert served_ders(sampled)["127.0.0.3"] == set(alternating.leaf_ders)
    assert {leaf.der for leaf in sampled.leaves} == site.leaves()
    # Sampling stops at the first handshake showing nothing new: the
    # alternating address gave A, B, then A again; the stable one X, then X.
    assert alternating.accepted == 1 + 3
    assert site.at("127.0.0.2").accepted == 1 + 2
    assert sampled.handshakes == 5
    assert len(sampled.sightings) == 3


async def test_sampling_stops_at_a_certificate_seen_at_another_address() -> None:
    async with open_site(("127.0.0.2", "127.0.0.3", "127.0.0.4"), distinct=False) as site:
        async with prober(site.resolver()) as p:
            report = await p.probe(site.target(), samples_per_address=4)
    assert len(report.leaves) == 1
    assert site.accepted == 3 + 1  # only the first to show it looked again


async def test_a_name_with_200_addresses_is_probed_at_most_max_addresses() -> None:
    addresses = [f"127.0.1.{i}" for i in range(200)]
    async with open_site(addresses, distinct=False) as site:
        async with prober(site.resolver(), max_addresses=8) as p:
            report = await p.probe(site.target())
            remembered = p.statistics().remembered
    assert report.addresses == tuple(addresses[:8])
    assert site.accepted == 8
    assert [site.at(a).accepted for a in addresses[:9]] == [1] * 8 + [0]
    assert remembered == 32  # a name's share of the address memory


@IPV6
async def test_only_the_addresses_the_policy_allows_are_touched() -> None:
    addresses = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "::1")
    policy = AddressPolicy.from_cidrs(["127.0.0.2/32", "127.0.0.4/32"])  # allow_targets
    async with open_site(addresses) as site:
        async with prober(site.resolver(extra=["10.0.0.1", "::ffff:127.0.0.3"]),
                          policy=policy) as p:
            report = await p.probe(site.target())
    assert report.addresses == ("127.0.0.2", "127.0.0.4")
    assert [site.at(a).accepted for a in addresses] == [1, 0, 1, 0]
    assert served_ders(report) == {a: {site.leaf_der(a)} for a in ("127.0.0.2", "127.0.0.4")}


async def test_a_refused_or_closed_address_is_a_failure_in_the_report() -> None:
    async with open_site(("127.0.0.2",)) as site, prober(site.resolver(extra=["127.0.0.9"])) as p:
        report = await p.probe(site.target())
        statistics = p.statistics()
    assert report.addresses == ("127.0.0.2", "127.0.0.9")
    assert report.failures == (("127.0.0.9", "connect"),)
    assert statistics.failures == {} and statistics.address_failures == {"connect": 1}


# -- the client's address hint ---------------------------------------------------


async def test_an_address_hint_outside_the_notary_s_resolution_is_ignored_unconnected(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("DEBUG", logger="notary.outbound.probe")
    async with open_site(("127.0.0.2", "127.0.0.3", "127.0.0.4")) as site:
        resolver = static_resolver({site.name: ["127.0.0.2"]})
        async with prober(resolver, policy=AddressPolicy.from_cidrs(["127.0.0.0/30"])) as p:
            report = await p.probe(site.target(), extra_addresses=["127.0.0.4", "127.0.0.1",
                                                                   "not an address"])
            hints = p.statistics().hints
    assert report.addresses == ("127.0.0.2",)
    assert site.at("127.0.0.4").accepted == 0  # another site's address: never connected
    assert hints == {"added": 0, "present": 0, "ignored": 3}
    assert "not an address the notary's resolution of the name returned" in caplog.text
    assert "refused by policy" in caplog.text  # 127.0.0.4 is outside 127.0.0.0/30


async def test_an_address_hint_the_notary_resolved_lately_is_probed() -> None:
    clock = Clock()
    addresses = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
    async with open_site(addresses) as site:
        resolver = site.resolver()
        async with prober(resolver, clock=clock, max_addresses=1, address_memory_s=3600) as p:
            # Resolved, left out of the probe (max_addresses), then hinted.
            report = await p.probe(site.target(), extra_addresses=["127.0.0.3"])
            assert report.addresses == ("127.0.0.2", "127.0.0.3")
            assert served_ders(report)["127.0.0.3"] == {site.leaf_der("127.0.0.3")}
            # A later resolution drops 127.0.0.4: still a hint within the memory...
            resolver.mapping[site.name] = ["127.0.0.2"]
            clock.now += 3600
            report = await p.probe(site.target(), extra_addresses=["::ffff:127.0.0.4"])
            assert report.addresses == ("127.0.0.2", "127.0.0.4")
            # ...not after it.
            clock.now += 1
            report = await p.probe(site.target(), extra_addresses=["127.0.0.4", "127.0.0.2"])
            assert report.addresses == ("127.0.0.2",)
            hints = p.statistics().hints
    assert hints == {"added": 2, "present": 1, "ignored": 1}
    assert [site.at(a).accepted for a in addresses] == [3, 1, 1]


async def test_an_ip_literal_is_one_address_and_takes_no_hint() -> None:
    async with open_site(("127.0.0.2", "127.0.0.3")) as site:
        async with prober(site.resolver()) as p:
            await p.probe(site.target())  # the name's resolution knows both
            literal = site.target().__class__("127.0.0.2", site.port)
            report = await p.probe(literal, extra_addresses=["127.0.0.3"])
    assert report.addresses == ("127.0.0.2",)
    assert site.at("127.0.0.3").accepted == 1


# -- budgets ----------------------------------------------------------------------


async def test_each_connection_holds_a_slot_of_the_global_limit() -> None:
    addresses = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")
    async with open_site(addresses, stalled=addresses) as site:
        async with prober(site.resolver(), max_concurrent=2) as p, trio.open_nursery() as nursery:
            nursery.start_soon(p.probe, site.target())
            await site.wait_accepted(2)
            await trio.testing.wait_all_tasks_blocked()
            statistics = p.statistics()
            assert (statistics.started, statistics.in_flight, statistics.queued) == (1, 2, 2)
            nursery.cancel_scope.cancel()
    assert site.accepted == 2


async def test_each_connection_takes_a_destination_token() -> None:
    admitted: list[str] = []

    def admit(address: str) -> None:
        if address == "127.0.0.4":
            raise ProbeThrottled("could not observe the target's certificate")
        admitted.append(address)

    addresses = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
    async with open_site(addresses, alternating=("127.0.0.3",)) as site:
        async with prober(site.resolver(), admit_destination=admit) as p:
            report = await p.probe(site.target(), samples_per_address=4)
            connections = p.statistics().connections
        assert report.failures == (("127.0.0.4", "throttled"),)
        assert sorted(admitted) == ["127.0.0.2"] * 2 + ["127.0.0.3"] * 3  # each sample too
        assert len(admitted) == connections == site.accepted
        # Every address throttled: nothing connected, the probe is throttled.
        only_throttled = static_resolver({site.name: ["127.0.0.4"]})
        async with prober(only_throttled, admit_destination=admit) as p:
            with pytest.raises(ProbeThrottled):
                await p.probe(site.target())
        assert site.at("127.0.0.4").accepted == 0


async def test_a_stalled_address_ends_at_the_deadline_with_the_others_recorded(
    autojump_clock: trio.testing.MockClock,
) -> None:
    addresses = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
    async with open_site(addresses, stalled=("127.0.0.3",)) as site:
        async with prober(site.resolver(), timeout_s=5.0) as p:
            started = trio.current_time()
            report = await p.probe(site.target())
            took = trio.current_time() - started
    assert took == pytest.approx(5.0, abs=0.1)
    assert served_ders(report) == {a: {site.leaf_der(a)} for a in ("127.0.0.2", "127.0.0.4")}
    assert report.failures == (("127.0.0.3", "timeout"),)


async def test_a_probe_whose_every_address_stalls_times_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    addresses = ("127.0.0.2", "127.0.0.3")
    async with open_site(addresses, stalled=addresses) as site:
        async with prober(site.resolver(), timeout_s=5.0) as p:
            with pytest.raises(ProbeTimeout, match="did not answer in time"):
                await p.probe(site.target())
            assert p.statistics().failures == {"timeout": 1}
    assert site.accepted == 2
