"""Budgets that must really bound what a client can make the notary do
(issue 17, items 4, 5, 6 and 12), on a running notary on loopback.

Loopback clients are exempt from per-client limits by default, so tests of
per-client budgets set ``exempt_clients = []``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import trio

from notary.config import ProbeConfig
from notary.model.targets import Target
from tests.support.notaries import legacy_query, open_notary, sha1_fp
from tests.support.tls_targets import closed_port, open_tls_target

NAME = "www.example.test"
NO_EXEMPTIONS = {"exempt_clients": ()}


def random_fp(i: int) -> str:
    return ":".join(f"{b:02X}" for b in hashlib.sha1(b"%d" % i).digest())


# -- item 4: what a query registers with the rescan scheduler -----------------------------


async def test_a_query_over_its_probe_budget_registers_nothing(tmp_path: Path) -> None:
    limits = {**NO_EXEMPTIONS, "probes_per_s_per_prefix": 0.01, "probe_burst": 1}
    async with open_tls_target(names=[NAME, "b.example.test"]) as site:
        names = {NAME: [site.host], "b.example.test": [site.host]}
        async with open_notary(tmp_path, names=names, limits=limits) as notary:
            scheduler = notary.running.scheduler
            assert scheduler is not None
            assert (await legacy_query(notary.port, f"{NAME}+{site.port}", None)).status == 200
            refused = await legacy_query(notary.port, f"b.example.test+{site.port}", None)
            assert refused.status == 429
            assert scheduler.due_at(Target(NAME, site.port)) is not None
            assert scheduler.due_at(Target("b.example.test", site.port)) is None
            assert scheduler.statistics().targets_known == 1


async def test_only_targets_a_probe_reached_are_registered(tmp_path: Path) -> None:
    """A name that does not resolve, and a target the policy refuses, are
    never rescanned; a port that refuses connections at an allowed address
    was reached (the scheduler retries it with its back-off)."""
    port = closed_port()
    async with open_notary(
        tmp_path, names={"nowhere.test": []},
        answers={"failures_at_deadline": False},
    ) as notary:
        scheduler = notary.running.scheduler
        assert scheduler is not None
        for target in ("nowhere.test+443", "192.0.2.1+443", f"127.0.0.1+{port}"):
            answer = await legacy_query(notary.port, target, None)
            assert answer.status in (403, 503), target
        assert scheduler.due_at(Target("nowhere.test", 443)) is None
        assert scheduler.due_at(Target("192.0.2.1", 443)) is None
        assert scheduler.due_at(Target("127.0.0.1", port)) is not None
        assert scheduler.statistics().targets_known == 1


async def test_a_v2_entry_over_the_probe_budget_registers_nothing(tmp_path: Path) -> None:
    from tests.support.http_client import post_json
    from tests.support.notaries import open_v2_notary

    limits = {**NO_EXEMPTIONS, "probes_per_s_per_prefix": 0.01, "probe_burst": 1}
    async with open_tls_target(names=[NAME, "b.example.test"]) as site:
        names = {NAME: [site.host], "b.example.test": [site.host]}
        async with open_v2_notary(tmp_path, names, limits=limits) as notary:
            scheduler = notary.running.scheduler
            assert scheduler is not None
            request = {"nonce": "n-1", "targets": [
                {"host": NAME, "port": site.port},
                {"host": "b.example.test", "port": site.port},
            ]}
            status, _ = await post_json(notary.port, "/v2/query", request)
            assert status == 200
            assert site.accepted == 1  # one entry probed, the other over the budget
            known = [scheduler.due_at(Target(n, site.port)) is not None
                     for n in (NAME, "b.example.test")]
            assert sorted(known) == [False, True]


# -- item 12: a rotation seen by a client within reprobe_after_s ---------------------------


async def test_a_new_certificate_is_probed_within_reprobe_after_s(tmp_path: Path) -> None:
    """A client presenting a fingerprint the notary has not seen makes it
    probe whenever the per-target budget allows (default: 4 a minute, one
    every 15 s), even within ``reprobe_after_s`` (60 s) of the last probe:
    a legitimate rotation gets 200, not a signed 409."""
    async with open_tls_target(names=[NAME]) as site:
        async with open_notary(
            tmp_path, names={NAME: [site.host]}, rescan={"enabled": False},
        ) as notary:
            target = f"{NAME}+{site.port}"
            old = sha1_fp(site.leaf_der(NAME))
            assert (await legacy_query(notary.port, target, old)).status == 200
            assert site.accepted == 1
            new = sha1_fp(site.replace_certificate(NAME))
            notary.clock.advance(20.0)  # within reprobe_after_s, past the spacing
            assert notary.config.answers.reprobe_after_s > 20
            assert (await legacy_query(notary.port, target, new)).status == 200
            assert site.accepted == 2
            # The budget is spent now: the probe of a moment ago answers.
            assert (await legacy_query(notary.port, target, random_fp(1))).status == 409
            # The old certificate was seen 20 s ago: still vouched for.
            assert (await legacy_query(notary.port, target, old)).status == 200
            assert site.accepted == 2


async def test_without_a_per_target_budget_reprobe_after_s_stops_the_loop(
    tmp_path: Path,
) -> None:
    async with open_tls_target(names=[NAME]) as site:
        async with open_notary(
            tmp_path, names={NAME: [site.host]}, rescan={"enabled": False},
            limits={"probes_per_minute_per_target": 0},
        ) as notary:
            target = f"{NAME}+{site.port}"
            assert (await legacy_query(notary.port, target, None)).status == 200
            for i in range(3):
                assert (await legacy_query(notary.port, target, random_fp(i))).status == 409
            assert site.accepted == 1


# -- item 6: no other site's page spends a visitor's budget here ----------------------------

FOREIGN = (b"Origin", b"https://attacker.test")
CROSS_SITE = (b"Sec-Fetch-Site", b"cross-site")


def request_bytes(
    method: str, path: str, headers: tuple[tuple[bytes, bytes], ...] = (), body: bytes = b"",
    content_type: bytes = b"text/plain",
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: 127.0.0.1", b"Connection: close"]
    lines += [name + b": " + value for name, value in headers]
    if method == "POST":
        lines += [b"Content-Type: " + content_type, b"Content-Length: %d" % len(body)]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def test_cross_site_requests_are_told_from_programs_and_our_own_pages() -> None:
    from notary.web.headers import is_cross_site_request

    assert is_cross_site_request(((b"Host", b"n.test"), (b"Origin", b"https://a.test")))
    assert is_cross_site_request(((b"sec-fetch-site", b"cross-site"),))
    assert is_cross_site_request(((b"SEC-FETCH-SITE", b"same-site"),))
    assert is_cross_site_request(((b"Origin", b"null"), (b"Host", b"n.test")))
    assert not is_cross_site_request(())  # curl, the 2011 add-on
    assert not is_cross_site_request(((b"Host", b"n.test"), (b"Origin", b"https://n.test")))
    assert not is_cross_site_request(((b"Sec-Fetch-Site", b"same-origin"),))
    assert not is_cross_site_request(((b"Sec-Fetch-Site", b"none"),))
    assert not is_cross_site_request(
        ((b"Host", b"n.test"), (b"Origin", b"moz-extension://5e2c0ab1-uuid"))
    )


async def test_every_probing_endpoint_refuses_another_sites_page(tmp_path: Path) -> None:
    from tests.support.http_client import http_get
    from tests.support.notaries import send_raw
    from tests.support.perspectives import open_perspectives_notary

    async with open_tls_target(names=[NAME]) as site:
        async with open_perspectives_notary(tmp_path, {NAME: [site.host]}) as (notary, _):
            target = f"{NAME}+{site.port}"
            fp = sha1_fp(site.leaf_der(NAME)).encode()
            form = b"fingerprint=" + fp
            refused = [
                request_bytes("GET", f"/target/{target}", (FOREIGN,)),
                request_bytes("POST", f"/target/{target}", (CROSS_SITE,), form,
                              b"application/x-www-form-urlencoded"),
                request_bytes("GET", f"/?host={NAME}&port={site.port}&service_type=2",
                              (FOREIGN,)),
            ]
            for raw in refused:
                answer = await send_raw(notary.port, raw)
                assert answer.status == 403, raw
                assert b"another site" in answer.body
            assert site.accepted == 0  # nothing was probed
            # Programs (no such headers) and the notary's own pages are served.
            assert (await send_raw(notary.port, request_bytes("GET", f"/target/{target}"))
                    ).status == 200
            assert site.accepted == 1
            own = ((b"Origin", b"https://127.0.0.1"),)
            assert (await send_raw(notary.port, request_bytes("GET", f"/target/{target}", own))
                    ).status == 200
            # A cached target too: the fast path refuses it as well.
            assert (await send_raw(notary.port, request_bytes("GET", f"/target/{target}",
                                                              (FOREIGN,)))).status == 403
            # The plain-HTTP Perspectives port.
            port = notary.running.perspectives[0].port
            with trio.fail_after(20):
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                async with stream:
                    await stream.send_all(request_bytes(
                        "GET", f"/?host={NAME}&port={site.port}&service_type=2", (CROSS_SITE,)
                    ))
                    data = b""
                    while chunk := await stream.receive_some(65536):
                        data += chunk
            assert data.startswith(b"HTTP/1.1 403")
            status, _, _ = await http_get(port, f"/?host={NAME}&port={site.port}&service_type=2")
            assert status == 200


async def test_v2_and_websocket_refuse_another_sites_page(tmp_path: Path) -> None:
    import json

    from tests.support.notaries import open_v2_notary, send_raw

    async with open_tls_target(names=[NAME]) as site:
        async with open_v2_notary(tmp_path, {NAME: [site.host]}) as notary:
            body = json.dumps({"nonce": "n", "targets": [{"host": NAME, "port": site.port}]})
            answer = await send_raw(notary.port, request_bytes(
                "POST", "/v2/query", (FOREIGN,), body.encode()  # a "simple" text/plain POST
            ))
            assert answer.status == 403
            upgrade = request_bytes("GET", "/v2/ws", (
                (b"Upgrade", b"websocket"), (b"Connection", b"Upgrade"),
                (b"Sec-WebSocket-Key", b"dGhlIHNhbXBsZSBub25jZQ=="),
                (b"Sec-WebSocket-Version", b"13"), FOREIGN,
            ))
            assert (await send_raw(notary.port, upgrade)).status == 403
            assert site.accepted == 0
            answer = await send_raw(notary.port, request_bytes(
                "POST", "/v2/query", (), body.encode(), b"application/json"
            ))
            assert answer.status == 200
            assert site.accepted == 1


# -- item 5: the politeness limit is keyed by the address a probe connects to --------------


async def test_five_names_of_one_address_share_one_destination_budget(tmp_path: Path) -> None:
    names = [f"n{index}.example.test" for index in range(5)]
    async with open_tls_target(names=names) as site:
        async with open_notary(
            tmp_path, names={name: [site.host] for name in names},
            limits={"probes_per_s_per_destination_prefix": 0.001, "destination_probe_burst": 2},
            answers={"failures_at_deadline": False}, rescan={"enabled": False},
        ) as notary:
            statuses = [
                (await legacy_query(notary.port, f"{name}+{site.port}", None)).status
                for name in names
            ]
            assert statuses == [200, 200, 503, 503, 503]
            assert site.accepted == 2  # no connection for a throttled probe
            stats = notary.running.abuse.statistics()
            assert stats.probes_refused_destination == 3


async def test_the_prober_admits_every_probe_by_its_resolved_address() -> None:
    """On-demand and scheduled probes alike go through ``Prober.probe``:
    the limit is applied there, after resolution, before connecting."""
    from notary.config import LimitsConfig
    from notary.errors import ProbeThrottled
    from notary.model.policy import AddressPolicy
    from notary.outbound.probe import open_prober
    from notary.service.abuse import AbuseControls
    from tests.support.tls_targets import static_resolver

    controls = AbuseControls(LimitsConfig(
        probes_per_s_per_destination_prefix=0.001, destination_probe_burst=1,
    ))
    admitted: list[str] = []

    def admit(address: str) -> None:
        admitted.append(address)
        controls.admit_destination(address, 0.0)

    async with open_tls_target(names=["a.example.test", "b.example.test"]) as site:
        resolver = static_resolver({"a.example.test": ["127.0.0.1"],
                                    "b.example.test": ["127.0.0.1"]})
        async with open_prober(
            ProbeConfig(timeout_s=10.0, max_concurrent=4),
            policy=AddressPolicy.from_cidrs(["127.0.0.0/8"]), resolver=resolver,
            admit_destination=admit,
        ) as prober:
            await prober.probe(Target("a.example.test", site.port))
            with pytest.raises(ProbeThrottled):  # another name, the same address
                await prober.probe(Target("b.example.test", site.port))
            assert prober.statistics().failures == {"throttled": 1}
    assert admitted == ["127.0.0.1", "127.0.0.1"]
    assert site.accepted == 1


CROSS_SITE_CORPUS = sorted(
    (Path(__file__).parent / "corpus" / "requests").glob("cross-site-*.http")
)


def test_the_cross_site_corpus_is_there() -> None:
    assert len(CROSS_SITE_CORPUS) >= 6


async def test_each_cross_site_corpus_request_is_refused_without_a_probe(
    tmp_path: Path,
) -> None:
    """``tests/corpus/requests/cross-site-*.http``, each sent as it is over
    TLS (they also go through the request reader in tests/test_fuzz.py)."""
    from notary.state import crypto
    from tests.support.notaries import open_v2_notary, send_raw

    key_path = tmp_path / "perspectives.key"
    crypto.write_new_file(
        key_path, crypto.private_key_pem(crypto.generate_perspectives_key()), mode=0o600
    )
    async with open_v2_notary(tmp_path, {}, perspectives={"key_file": key_path}) as notary:
        for path in CROSS_SITE_CORPUS:
            answer = await send_raw(notary.port, path.read_bytes())
            assert answer.status == 403, path.name
        assert notary.running.prober.statistics().started == 0
        assert notary.running.service.answered["convergence"] == {}
