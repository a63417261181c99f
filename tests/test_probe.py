"""Tests of notary.outbound.probe against local targets (tests/support/tls_targets.py).

Every connection goes to 127.0.0.1; names are resolved only by the fake
``static_resolver``.
"""

from __future__ import annotations

import hashlib
import logging
import socket
import ssl

import pytest
import trio
import trio.testing
import trustme

from notary.errors import (
    ProbeConnectFailed,
    ProbeError,
    ProbeHandshakeFailed,
    ProbeRefused,
    ProbeResolveFailed,
    ProbeTimeout,
)
from notary.model.policy import AddressPolicy
from notary.model.targets import Target
from notary.outbound.dialer import system_resolver
from notary.outbound.probe import DEFAULT_MAX_HANDSHAKE_BYTES, open_prober
from tests.support.odd_certificates import ODD_KEYS, odd_certificate
from tests.support.tls_targets import (
    LOCALHOST,
    closed_port,
    open_certificate_only_target,
    open_garbage_target,
    open_stalled_target,
    open_tls_target,
    open_truncating_proxy,
    static_resolver,
    with_probe_section,
)

NAME_A = "www.example.test"
NAME_B = "mail.example.test"
LOOPBACK_ONLY = AddressPolicy.from_cidrs(["127.0.0.0/8"])
NOW = 1_700_000_000.75
TLS_VERSIONS = pytest.mark.parametrize(
    "tls_version",
    [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3],
    ids=["tls1.2", "tls1.3"],
)


def prober(resolver=None, **overrides):
    """``open_prober`` with test defaults: loopback allowed, a fake resolver
    knowing NAME_A and NAME_B, a fixed clock."""
    settings = {
        "policy": LOOPBACK_ONLY,
        "timeout_s": 10.0,
        "max_concurrent": 8,
        "resolver": resolver or static_resolver({NAME_A: [LOCALHOST], NAME_B: [LOCALHOST]}),
        "clock": lambda: NOW,
    }
    settings.update(overrides)
    return open_prober(**with_probe_section(settings))


# -- what is observed -----------------------------------------------------------


@TLS_VERSIONS
async def test_each_sni_name_gets_its_own_certificate(tls_version):
    async with (
        open_tls_target([NAME_A, NAME_B], maximum_version=tls_version) as server,
        prober() as p,
    ):
        a = (await p.probe(server.target(NAME_A))).primary
        b = (await p.probe(server.target(NAME_B))).primary
    assert server.server_names == [NAME_A, NAME_B]
    assert a.leaf.der != b.leaf.der
    for result, name in ((a, NAME_A), (b, NAME_B)):
        served = server.leaf_der(name)
        assert result.target == Target(name, server.port)
        assert result.leaf.der == served
        assert result.leaf.sha1 == hashlib.sha1(served).digest()
        assert result.leaf.sha256 == hashlib.sha256(served).digest()
        assert result.leaf.md5 == hashlib.md5(served).digest()
        assert result.chain == server.chain_der(name)
        assert len(result.chain) == 2  # leaf and one intermediate
        assert result.chain[0] == served
        assert result.address == LOCALHOST
        assert result.observed_at == int(NOW)


@TLS_VERSIONS
async def test_ip_literal_is_not_resolved_and_sends_no_sni(tls_version):
    resolver = static_resolver({})
    async with (
        open_tls_target([NAME_A], maximum_version=tls_version) as server,
        prober(resolver) as p,
    ):
        result = (await p.probe(server.target())).primary  # 127.0.0.1
    assert server.server_names == [None]
    assert resolver.calls == []
    assert result.leaf.der == server.leaf_der(None) != server.leaf_der(NAME_A)
    assert result.chain == server.chain_der(None)
    assert result.address == LOCALHOST


async def test_unknown_sni_name_gets_the_default_certificate():
    async with open_tls_target([NAME_A]) as server, prober() as p:
        result = (await p.probe(server.target(NAME_B))).primary
    assert server.server_names == [NAME_B]
    assert result.leaf.der == server.leaf_der(None)


async def test_a_new_probe_sees_a_replaced_certificate():
    async with open_tls_target([NAME_A]) as server, prober() as p:
        before = (await p.probe(server.target(NAME_A))).primary
        new_der = server.replace_certificate(NAME_A)
        after = (await p.probe(server.target(NAME_A))).primary
    assert before.leaf.der != after.leaf.der
    assert after.leaf.der == new_der
    assert server.accepted == 2  # no caching in the prober


@pytest.mark.parametrize(
    ("tls_version", "recorded"),
    [
        (ssl.TLSVersion.TLSv1, "TLSv1"),
        (ssl.TLSVersion.TLSv1_1, "TLSv1.1"),
        (ssl.TLSVersion.TLSv1_2, "TLSv1.2"),
        (ssl.TLSVersion.TLSv1_3, "TLSv1.3"),
    ],
    ids=["tls1.0", "tls1.1", "tls1.2", "tls1.3"],
)
async def test_a_site_speaking_one_tls_version_is_observed_with_that_version(
    tls_version, recorded
):
    if not getattr(ssl, f"HAS_{tls_version.name}"):
        pytest.skip(f"this OpenSSL has no {recorded}")
    async with (
        open_tls_target([NAME_A], minimum_version=tls_version, maximum_version=tls_version)
        as server,
        prober() as p,
    ):
        result = (await p.probe(server.target(NAME_A))).primary
        statistics = p.statistics()
    assert server.server_names == [NAME_A]
    assert result.leaf.der == server.leaf_der(NAME_A)
    assert result.chain == server.chain_der(NAME_A)
    assert result.tls_version == recorded
    assert statistics.tls_versions == {recorded: 1}


@pytest.mark.parametrize("kind", ODD_KEYS)
async def test_a_certificate_whose_key_cryptography_cannot_load_is_recorded(kind, caplog):
    """Over the wire: OpenSSL parses the certificate, the prober records it."""
    odd = odd_certificate(kind)
    intermediate = ssl.PEM_cert_to_DER_cert(trustme.CA().cert_pem.bytes().decode("ascii"))
    async with open_certificate_only_target([odd.der, intermediate]) as server, prober() as p:
        result = (await p.probe(server.target())).primary
    assert result.leaf.der == odd.der
    assert result.chain == (odd.der, intermediate)
    assert result.leaf.sha1 == hashlib.sha1(odd.der).digest()
    assert result.leaf.sha256 == hashlib.sha256(odd.der).digest()
    assert result.leaf.md5 == hashlib.md5(odd.der).digest()
    assert result.leaf.spki_sha256 == hashlib.sha256(odd.spki_der).digest()
    assert result.tls_version == "TLSv1.2"
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_the_certificate_only_target_serves_like_a_real_server():
    """The hand-written TLS 1.2 server above is a fair stand-in: an
    ordinary chain comes out of the prober as it went in."""
    issued = trustme.CA().issue_cert(NAME_A)
    chain = tuple(ssl.PEM_cert_to_DER_cert(p.bytes().decode("ascii")) for p in issued.cert_chain_pems)
    async with open_certificate_only_target(chain) as server, prober() as p:
        result = (await p.probe(server.target(NAME_A))).primary
    assert result.chain == chain
    assert result.tls_version == "TLSv1.2"


async def test_the_handshake_is_aborted_once_certificates_are_in():
    async with open_tls_target([NAME_A]) as server:
        async with prober() as p:
            await p.probe(server.target(NAME_A))
        await server.wait_handshakes_ended(1)
    assert server.handshakes_completed == 0
    assert server.handshakes_failed == 1


async def test_ipv4_mapped_answer_is_connected_to_as_ipv4():
    resolver = static_resolver({NAME_A: ["::ffff:127.0.0.1"]})
    async with open_tls_target([NAME_A]) as server, prober(resolver) as p:
        result = (await p.probe(server.target(NAME_A))).primary
    assert result.address == LOCALHOST


# -- policy -------------------------------------------------------------------


async def test_refused_name_never_reaches_the_target():
    async with open_tls_target([NAME_A]) as server, prober(policy=AddressPolicy()) as p:
        with pytest.raises(ProbeRefused, match="loopback"):
            await p.probe(server.target(NAME_A))
        assert p.statistics().failures == {"refused": 1}
    assert server.accepted == 0


async def test_refused_ip_literal_never_reaches_the_target():
    resolver = static_resolver({})
    async with open_tls_target([NAME_A]) as server, prober(resolver, policy=AddressPolicy()) as p:
        with pytest.raises(ProbeRefused):
            await p.probe(server.target())
    assert server.accepted == 0
    assert resolver.calls == []


async def test_refused_answers_are_dropped_and_an_allowed_one_is_used():
    # Only 127.0.0.1 is allowed; 127.0.0.2 (loopback, refused) is listed
    # first and must be skipped. Non-addresses are dropped too.
    resolver = static_resolver({NAME_A: ["127.0.0.2", "not-an-address", LOCALHOST]})
    policy = AddressPolicy.from_cidrs(["127.0.0.1/32"])
    async with open_tls_target([NAME_A]) as server, prober(resolver, policy=policy) as p:
        result = (await p.probe(server.target(NAME_A))).primary
    assert result.address == LOCALHOST
    assert server.accepted == 1


# -- failures -----------------------------------------------------------------


async def test_unknown_name_fails_to_resolve():
    async with prober() as p:
        with pytest.raises(ProbeResolveFailed):
            await p.probe(Target("nowhere.example.test", 443))
        assert p.statistics().failures == {"dns": 1}


async def test_empty_answer_fails_to_resolve():
    async with prober(static_resolver({NAME_A: []})) as p:
        with pytest.raises(ProbeResolveFailed):
            await p.probe(Target(NAME_A, 443))


async def test_resolver_oserror_is_mapped():
    async def broken(host: str, port: int) -> list[str]:
        await trio.lowlevel.checkpoint()
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    async with prober(broken) as p:
        with pytest.raises(ProbeResolveFailed) as info:
            await p.probe(Target(NAME_A, 443))
    assert "known" not in info.value.message  # no resolver internals leak


async def test_system_resolver_returns_ip_literals_without_dns():
    assert await system_resolver(LOCALHOST, 443) == [LOCALHOST]


async def test_system_resolver_maps_gaierror(monkeypatch):
    async def fail(*args, **kwargs):
        await trio.lowlevel.checkpoint()
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(trio.socket, "getaddrinfo", fail)
    with pytest.raises(ProbeResolveFailed):
        await system_resolver("nowhere.example.test", 443)


async def test_closed_port_fails_to_connect():
    async with prober() as p:
        with pytest.raises(ProbeConnectFailed):
            await p.probe(Target(NAME_A, closed_port()))
        assert p.statistics().failures == {"connect": 1}


async def test_closed_ipv6_loopback_port_fails_to_connect():
    try:
        port = closed_port("::1")
    except OSError:
        pytest.skip("no IPv6 loopback")
    policy = AddressPolicy.from_cidrs(["::1/128"])
    async with prober(policy=policy) as p:
        with pytest.raises(ProbeConnectFailed):
            await p.probe(Target("::1", port))


async def test_a_bug_in_a_probe_does_not_break_the_prober(caplog):
    async def buggy(host: str, port: int) -> list[str]:
        await trio.lowlevel.checkpoint()
        if host == NAME_B:
            raise RuntimeError("resolver bug")
        return [LOCALHOST]

    async with open_tls_target([NAME_A]) as server, prober(buggy) as p:
        with pytest.raises(ProbeError) as info:
            await p.probe(server.target(NAME_B))
        assert type(info.value) is ProbeError
        assert info.value.message == "probe failed"
        result = (await p.probe(server.target(NAME_A))).primary
        assert result.leaf.der == server.leaf_der(NAME_A)
        assert p.statistics().failures == {"error": 1}
    assert "resolver bug" in caplog.text


async def test_a_leaf_without_intermediates():
    async with open_tls_target([NAME_A], intermediates=0) as server, prober() as p:
        result = (await p.probe(server.target(NAME_A))).primary
    assert result.chain == (server.leaf_der(NAME_A),)


async def test_every_address_is_probed_and_a_failing_one_is_reported():
    async with open_tls_target([NAME_A]) as server:
        # The first answer goes to a loopback address with nothing on the
        # port (127.0.0.2:<server port> is refused: the server is bound to
        # 127.0.0.1 only), the second works.
        resolver = static_resolver({NAME_A: ["127.0.0.2", LOCALHOST]})
        async with prober(resolver) as p:
            report = await p.probe(server.target(NAME_A))
            statistics = p.statistics()
    assert report.addresses == ("127.0.0.2", LOCALHOST)
    assert [r.address for r in report.results] == [LOCALHOST]
    assert report.failures == (("127.0.0.2", "connect"),)
    assert report.primary.address == LOCALHOST
    assert server.accepted == 1
    assert (statistics.succeeded, statistics.failures) == (1, {})
    assert statistics.address_failures == {"connect": 1}


async def test_stalled_target_times_out(autojump_clock):
    async with open_stalled_target() as stalled, prober(timeout_s=5.0) as p:
        start = trio.current_time()
        with pytest.raises(ProbeTimeout, match="in time"):
            await p.probe(stalled.target(NAME_A))
        assert trio.current_time() - start == pytest.approx(5.0, abs=0.1)
        assert p.statistics().failures == {"timeout": 1}
    assert stalled.accepted == 1


async def test_garbage_is_not_tls():
    async with open_garbage_target() as garbage, prober() as p:
        with pytest.raises(ProbeHandshakeFailed, match="does not speak TLS"):
            await p.probe(garbage.target(NAME_A))
        assert p.statistics().failures == {"handshake": 1}


@TLS_VERSIONS
@pytest.mark.parametrize("reset", [False, True], ids=["close", "reset"])
async def test_connection_lost_after_server_hello(tls_version, reset):
    async with (
        open_tls_target([NAME_A], maximum_version=tls_version) as server,
        open_truncating_proxy(server, records=1, reset=reset) as proxy,
        prober() as p,
    ):
        with pytest.raises(ProbeHandshakeFailed):
            await p.probe(proxy.target(NAME_A))


async def test_connection_closed_before_any_answer():
    # b"": reads the ClientHello, closes without a word
    async with open_garbage_target(b"") as silent, prober() as p:
        with pytest.raises(ProbeHandshakeFailed, match="closed"):
            await p.probe(silent.target(NAME_A))


@TLS_VERSIONS
async def test_chain_beyond_the_byte_limit_fails(tls_version):
    async with open_tls_target([NAME_A], intermediates=12, maximum_version=tls_version) as server:
        async with prober(max_handshake_bytes=4096) as p:
            with pytest.raises(ProbeHandshakeFailed, match="certificate chain too large"):
                await p.probe(server.target(NAME_A))
        async with prober() as p:  # the default limit is far larger
            result = (await p.probe(server.target(NAME_A))).primary
    assert len(result.chain) == 13
    assert sum(map(len, result.chain)) > 4096
    assert DEFAULT_MAX_HANDSHAKE_BYTES == 256 * 1024


# -- single flight and limits ---------------------------------------------------


async def test_a_finished_probe_is_not_reused():
    async with open_tls_target([NAME_A]) as server, prober() as p:
        first = await p.probe(server.target(NAME_A))
        second = await p.probe(server.target(NAME_A))
        assert p.statistics().started == 2
    assert first == second
    assert server.accepted == 2


async def test_queueing_counts_against_the_deadline(autojump_clock):
    outcomes = {}

    async def ask(p, target):
        try:
            await p.probe(target)
        except ProbeTimeout as exc:
            outcomes[target.host] = exc.message

    resolver = static_resolver({NAME_A: [LOCALHOST], NAME_B: [LOCALHOST]})
    # Both start at the same (virtual) instant, one after the other: the
    # second waits for the only slot until its deadline.
    async with (
        open_stalled_target() as stalled,
        prober(resolver, max_concurrent=1, timeout_s=2.0) as p,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(ask, p, stalled.target(NAME_A))
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(ask, p, stalled.target(NAME_B))
    assert outcomes == {
        NAME_A: "target did not answer in time",
        NAME_B: "too many probes in progress",
    }
    assert stalled.accepted == 1


@pytest.mark.parametrize(
    "overrides",
    [{"timeout_s": 0}, {"max_concurrent": 0}, {"max_handshake_bytes": 0}],
)
async def test_bad_limits_are_refused(overrides):
    with pytest.raises(ValueError):
        async with prober(**overrides):
            pass
