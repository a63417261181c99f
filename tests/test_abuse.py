"""Limits and abuse controls (``[limits]``, ``[server] opt_out`` and
``legacy_tls``, ``[http] max_requests_per_connection``, ``[answers]
failures_at_deadline``): the pure parts, then a running notary on loopback.

Loopback clients are exempt from per-client limits by default, so the tests
that exercise them set ``exempt_clients = []``. Several loopback addresses
(127.0.0.x, 127.0.y.1) stand for clients of one or several prefixes.
"""

from __future__ import annotations

import hashlib
import json
import math
import ssl
import time
from pathlib import Path

import pytest
import trio
import trio.testing

from notary.config import Endpoint, HttpConfig, LimitsConfig, load_config
from notary.errors import ConfigError, ProbeRefused
from notary.model.policy import AddressPolicy
from notary.model.ratelimit import RateLimited
from notary.outbound.dialer import dial
from notary.protocol import v2
from notary.protocol.http import RequestReader
from notary.server.connection import serve_http_connection
from notary.server.websocket import WebSocketLimits, WebSocketService
from notary.service.abuse import AbuseControls, ProbeThrottled
from notary.state import crypto
from tests.support.legacy_tls import local_openssl_speaks_tls10, tls10_index
from tests.support.notaries import (
    client_context,
    legacy_query,
    open_notary,
    parse_response,
    send_raw,
    sha1_fp,
)
from tests.support.tls_targets import (
    closed_port,
    open_garbage_target,
    open_tls_target,
)

NAME = "www.example.test"
ABSENT_FP = ":".join(["AB"] * 20)
NO_EXEMPTIONS = {"exempt_clients": ()}


def random_fp(i: int) -> str:
    return ":".join(f"{b:02X}" for b in hashlib.sha1(b"%d" % i).digest())


# -- the address policy: opt-out ---------------------------------------------------------


def test_opt_out_names_cover_their_subdomains_only() -> None:
    policy = AddressPolicy.from_cidrs((), ["Example.ORG.", "xn--bcher-kva.example"])
    for host in ("example.org", "www.example.org", "a.b.example.org", "xn--bcher-kva.example"):
        assert policy.name_refusal(host) == "opt-out", host
    for host in ("xexample.org", "example.org.evil.test", "org", "example.com", "192.0.2.1"):
        assert policy.name_refusal(host) is None, host
    with pytest.raises(ProbeRefused, match="opt-out"):
        policy.check_name("www.example.org")


def test_opt_out_networks_win_over_the_allow_list_and_cover_embedded_forms() -> None:
    policy = AddressPolicy.from_cidrs(
        ["127.0.0.0/8"], ["127.0.0.5", "198.51.100.0/24", "2001:db8:1::/48"]
    )
    for address in (
        "127.0.0.5", "::ffff:127.0.0.5", "198.51.100.9", "64:ff9b::c633:6409",  # NAT64
        "2002:c633:6409::1",  # 6to4
        "2001:db8:1::77",
    ):
        assert policy.refusal(address) == "opt-out", address
    assert policy.refusal("127.0.0.6") is None  # allowed
    assert policy.refusal("203.0.113.1") == "documentation"  # the usual rules
    assert AddressPolicy().refusal("8.8.8.8") is None


@pytest.mark.parametrize("entry", ["", "bad name!", "10.0.0.1/8", "-x.example", 7])
def test_bad_opt_out_entries_are_config_errors(entry: object) -> None:
    with pytest.raises(ConfigError):
        AddressPolicy.from_cidrs((), [entry])  # type: ignore[list-item]


async def test_an_opted_out_name_is_never_resolved() -> None:
    asked: list[str] = []

    async def resolver(host: str, port: int) -> list[str]:
        asked.append(host)
        return ["127.0.0.1"]

    policy = AddressPolicy.from_cidrs(["127.0.0.0/8"], ["example.test"])
    with pytest.raises(ProbeRefused):
        await dial("www.example.test", 443, policy=policy, resolver=resolver)
    assert asked == []


# -- configuration -----------------------------------------------------------------------


def server_overrides(tmp_path: Path, **extra: dict) -> dict:
    return {
        "server": {"key_file": tmp_path / "k", "cert_file": tmp_path / "c",
                   "db_file": tmp_path / "d"},
        **extra,
    }


def test_limit_defaults(tmp_path: Path) -> None:
    config = load_config(None, server_overrides(tmp_path))
    assert config.limits == LimitsConfig()
    assert config.limits.exempt_clients == ("127.0.0.0/8", "::1/128")
    assert (config.server.opt_out, config.server.legacy_tls) == ((), False)
    assert config.http.max_requests_per_connection == 1000
    assert config.answers.failures_at_deadline is True


@pytest.mark.parametrize(
    ("section", "values", "message"),
    [
        ("limits", {"queries_per_s_per_prefix": -1}, "queries_per_s_per_prefix must be 0"),
        ("limits", {"query_burst": 0}, "query_burst must be greater than 0"),
        ("limits", {"max_connections_per_prefix": 2, "max_connections_per_address": 3},
         "max_connections_per_prefix must be at least"),
        ("limits", {"exempt_clients": ["nope"]}, "exempt_clients"),
        ("limits", {"max_tracked": 0}, "max_tracked"),
        ("limits", {"log_bytes_per_s_per_prefix": -1}, "log_bytes_per_s_per_prefix must be 0"),
        ("limits", {"log_burst_bytes": 0}, "log_burst_bytes must be greater than 0"),
        ("limits", {"unknown": 1}, "unknown key"),
        ("http", {"max_requests_per_connection": 0}, "max_requests_per_connection"),
    ],
)
def test_limit_validation(tmp_path: Path, section: str, values: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, server_overrides(tmp_path, **{section: values}))


def test_server_opt_out_and_legacy_tls_are_validated(tmp_path: Path) -> None:
    overrides = server_overrides(tmp_path)
    overrides["server"]["opt_out"] = ("example.org", "10.0.0.1/8")
    with pytest.raises(ConfigError, match=r"\[server\] opt_out: .*10.0.0.1/8"):
        load_config(None, overrides)
    overrides["server"].update(opt_out=(), legacy_tls="yes")
    with pytest.raises(ConfigError, match="legacy_tls must be true or false"):
        load_config(None, overrides)


def test_a_full_v2_batch_must_fit_in_the_query_burst(tmp_path: Path) -> None:
    overrides = server_overrides(
        tmp_path, v2={"key_file": tmp_path / "v2.key", "max_batch": 200}
    )
    with pytest.raises(ConfigError, match="query_burst must be at least"):
        load_config(None, overrides)
    overrides["limits"] = {"queries_per_s_per_prefix": 0}  # off: no constraint
    load_config(None, overrides)


def test_sighup_reads_the_opt_out_list_again(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from notary.server.app import Reloader

    overrides = server_overrides(tmp_path)
    overrides["server"]["opt_out"] = ("example.org", "192.0.2.0/24")
    prober = SimpleNamespace(policy=AddressPolicy())
    relay = SimpleNamespace(trusted=None, policy=AddressPolicy())
    reloader = Reloader(
        lambda: load_config(None, overrides), prober=prober, relay=relay,  # type: ignore[arg-type]
        api=SimpleNamespace(bundle_bytes=None), bundle_file=None,  # type: ignore[arg-type]
    )
    reloaded = reloader.read()
    assert reloaded is not None
    reloader.apply(reloaded)
    assert prober.policy.name_refusal("www.example.org") == "opt-out"
    assert prober.policy.refusal("192.0.2.10") == "opt-out"
    assert relay.policy.refusal("192.0.2.10") == "documentation"  # not the relay's business


# -- AbuseControls -----------------------------------------------------------------------


def test_exempt_clients_have_no_limits() -> None:
    controls = AbuseControls(LimitsConfig())
    assert controls.client_address("127.0.0.1") is None
    assert controls.client_address("::1") is None
    assert controls.client_address("::ffff:127.0.0.1") is None
    assert controls.client_address("?") is None
    assert controls.client_address("192.0.2.1") == bytes([192, 0, 2, 1])


def test_a_probe_is_charged_to_both_budgets_or_to_none() -> None:
    limits = LimitsConfig(
        probes_per_s_per_prefix=1.0, probe_burst=2, probes_per_minute_per_target=2,
    )
    controls = AbuseControls(limits)
    client = b"\xc0\x00\x02"
    controls.admit_probe(client, "a:443", 0.0)
    with pytest.raises(ProbeThrottled):  # a: one probe per 30 s
        controls.admit_probe(client, "a:443", 0.0)
    controls.admit_probe(client, "b:443", 0.0)  # the client's budget held
    with pytest.raises(RateLimited) as raised:
        controls.admit_probe(client, "c:443", 0.0)
    assert raised.value.retry_after_s == 1
    controls.admit_probe(None, "c:443", 0.0)  # unlimited client
    with pytest.raises(ProbeThrottled):
        controls.admit_probe(None, "c:443", 0.0)
    controls.refund_probe("c:443")  # c was refused by policy
    controls.admit_probe(None, "c:443", 0.0)
    stats = controls.statistics()
    assert (stats.probes_refused_client, stats.probes_refused_target) == (1, 2)
    assert controls.target_spacing_s == 30.0


def test_the_destination_budget_is_keyed_by_the_resolved_address_prefix() -> None:
    controls = AbuseControls(LimitsConfig(
        probes_per_s_per_destination_prefix=1.0, destination_probe_burst=3,
    ))
    for address in ("192.0.2.1", "192.0.2.200", "192.0.2.7"):  # one /24
        controls.admit_destination(address, 0.0)
    with pytest.raises(ProbeThrottled):
        controls.admit_destination("192.0.2.99", 0.0)
    controls.admit_destination("198.51.100.1", 0.0)  # another /24
    controls.admit_destination("2001:db8:1:2::1", 0.0)
    controls.admit_destination("2001:db8:1:ffff::1", 0.0)
    controls.admit_destination("2001:db8:1::9", 0.0)
    with pytest.raises(ProbeThrottled):  # one /48
        controls.admit_destination("2001:db8:1:1::1", 0.0)
    controls.admit_destination("192.0.2.99", 1.0)  # refilled
    assert controls.statistics().probes_refused_destination == 2


def test_limits_off() -> None:
    controls = AbuseControls(LimitsConfig(
        queries_per_s_per_prefix=0, probes_per_s_per_prefix=0, probes_per_minute_per_target=0,
        probes_per_s_per_destination_prefix=0, log_bytes_per_s_per_prefix=0,
    ))
    for _ in range(1000):
        controls.admit_query(b"\x01\x02\x03", 0.0, 100)
        controls.charge_log(b"\x01\x02\x03", 0.0, 60_000)
        assert controls.log_wait_s(b"\x01\x02\x03", 0.0) == 0.0
        controls.admit_probe(b"\x01\x02\x03", "a:443", 0.0)
        controls.admit_destination("192.0.2.1", 0.0)
    assert controls.statistics().tracked == {}


# -- one connection: requests per connection, WebSocket errors ---------------------------------


async def test_the_last_request_allowed_on_a_connection_says_close() -> None:
    client, server = trio.testing.memory_stream_pair()
    seen: list[bool] = []

    async def handler(request) -> tuple[bytes, bool]:
        seen.append(request.keep_alive)
        alive = b"keep-alive" if request.keep_alive else b"close"
        return b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: " + alive + b"\r\n\r\n", (
            request.keep_alive
        )

    limits = HttpConfig(max_requests_per_connection=3)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_http_connection, server, handler, limits)
        await client.send_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 5)
        received = b""
        with trio.fail_after(5):
            while chunk := await client.receive_some(65536):
                received += chunk
    assert seen == [True, True, False]
    assert received.count(b"HTTP/1.1 200") == 3 and received.endswith(
        b"Connection: close\r\n\r\n"
    )


async def test_a_websocket_query_over_the_rate_gets_an_error_message() -> None:
    import trio_websocket

    calls: list[bytes | None] = []

    async def answer(query: v2.QueryRequest, client: bytes | None = None) -> bytes:
        calls.append(client)
        if len(calls) > 1:
            raise RateLimited("too many queries; retry later", retry_after_s=7)
        return b'{"ok":true}'

    service = WebSocketService(answer_query=answer, limits=WebSocketLimits(), max_batch=10)
    client_stream, server_stream = trio.testing.memory_stream_pair()

    async def serve() -> None:
        reader = RequestReader()
        requests: list = []
        while not requests:
            requests = reader.feed(await server_stream.receive_some(4096))
        await service.serve(
            server_stream, requests[0], reader.leftover, peer="192.0.2.1", client=b"\xc0\0\2"
        )

    query = {"type": "query", "targets": [{"host": "a.example.test", "port": 443}]}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        ws = await trio_websocket.wrap_client_stream(nursery, client_stream, "n.test", "/v2/ws")
        replies = []
        for request_id in (1, 2, 3):
            await ws.send_message(json.dumps({**query, "id": request_id}))
            replies.append(json.loads(await ws.get_message()))
        await ws.aclose()
        nursery.cancel_scope.cancel()
    assert replies[0] == {"type": "answer", "id": 1, "answer": {"ok": True}}
    for request_id, reply in ((2, replies[1]), (3, replies[2])):  # still open: an error each
        assert reply == {"type": "error", "id": request_id, "status": 429, "retry_after": 7,
                         "message": "too many queries; retry later"}
    assert calls == [b"\xc0\0\2"] * 3


# -- a running notary ---------------------------------------------------------------------


async def tls_exchange(port: int, request: bytes, *, source: str | None = None) -> bytes:
    """Send ``request`` over TLS from ``source`` (a loopback address) and
    read until the server closes."""
    with trio.fail_after(20):
        tcp = await trio.open_tcp_stream("127.0.0.1", port, local_address=source)
        stream = trio.SSLStream(
            tcp, client_context(), server_hostname=None, https_compatible=True
        )
        async with stream:
            await stream.send_all(request)
            chunks = []
            while chunk := await stream.receive_some(65536):
                chunks.append(chunk)
    return b"".join(chunks)


def split_responses(data: bytes) -> list[bytes]:
    """Responses with ``Content-Length`` bodies, one after the other."""
    responses = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        length = parse_response(head + b"\r\n\r\n").headers.get(b"content-length", b"0")
        responses.append(head + b"\r\n\r\n" + rest[: int(length)])
        data = rest[int(length):]
    return responses


def post(target: str, fingerprint: str, *, version: str = "1.0") -> bytes:
    body = f"fingerprint={fingerprint}".encode()
    return (
        f"POST /target/{target} HTTP/{version}\r\nHost: n\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def test_queries_over_the_burst_get_429_with_retry_after_then_recover(
    tmp_path: Path,
) -> None:
    limits = {**NO_EXEMPTIONS, "queries_per_s_per_prefix": 0.01, "query_burst": 3}
    async with open_tls_target(names=[NAME, "b.example.test"]) as site:
        names = {NAME: [site.host], "b.example.test": [site.host]}
        async with open_notary(tmp_path, names=names, limits=limits) as notary:
            target = f"{NAME}+{site.port}"
            good = sha1_fp(site.leaf_der(NAME))
            # Query 1 probes (the slow path), 2 and 3 are cache hits (the fast path).
            for _ in range(3):
                assert (await legacy_query(notary.port, target, good)).status == 200
            assert site.accepted == 1
            limited = await legacy_query(notary.port, target, good)
            assert limited.status == 429
            # A token comes every 100 s (0.01 per second), less the time the test took.
            assert 90 <= int(limited.headers[b"retry-after"]) <= 100
            assert limited.body == b"too many queries; retry later\n"
            # The slow path is limited too, before any probe.
            other = await legacy_query(notary.port, f"b.example.test+{site.port}", None)
            assert other.status == 429 and 90 <= int(other.headers[b"retry-after"]) <= 100
            assert site.accepted == 1
            # Keep-alive: the 429 keeps the connection; every query counts.
            answers = split_responses(await tls_exchange(
                notary.port, post(target, good, version="1.1") * 2
                + b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n",
            ))
            assert [parse_response(a).status for a in answers] == [429, 429, 200]
            # Another /24 has its own bucket.
            assert (await tls_exchange_status(notary.port, post(target, good), "127.0.1.1")) == 200
            # A hundred seconds later the bucket holds one token again.
            notary.clock.advance(100.0)
            assert (await legacy_query(notary.port, target, good)).status == 200
            assert (await legacy_query(notary.port, target, good)).status == 429
            notary.clock.advance(1000.0)  # full: the burst again
            for _ in range(3):
                assert (await legacy_query(notary.port, target, good)).status == 200
            stats = notary.running.abuse.statistics()
            assert stats.queries_refused >= 5
            answered = notary.running.service.answered["convergence"]
            assert answered[429] >= 3  # the fast path counts its refusals


async def tls_exchange_status(port: int, request: bytes, source: str) -> int:
    return parse_response(await tls_exchange(port, request, source=source)).status


async def test_on_demand_probes_per_client_prefix_get_429(tmp_path: Path) -> None:
    limits = {**NO_EXEMPTIONS, "probes_per_s_per_prefix": 0.01, "probe_burst": 1}
    async with open_tls_target(names=[NAME, "b.example.test"]) as site:
        names = {NAME: [site.host], "b.example.test": [site.host]}
        async with open_notary(tmp_path, names=names, limits=limits) as notary:
            assert (await legacy_query(notary.port, f"{NAME}+{site.port}", None)).status == 200
            refused = await legacy_query(notary.port, f"b.example.test+{site.port}", None)
            assert refused.status == 429
            assert 90 <= int(refused.headers[b"retry-after"]) <= 100
            assert site.accepted == 1
            # What is cached is still answered: only probes are limited here.
            assert (await legacy_query(notary.port, f"{NAME}+{site.port}", None)).status == 200


async def test_v2_queries_count_one_per_target(tmp_path: Path) -> None:
    key_path = tmp_path / "v2.key"
    crypto.write_ed25519_private_key(key_path, crypto.generate_ed25519_key())
    limits = {**NO_EXEMPTIONS, "queries_per_s_per_prefix": 0.01, "query_burst": 5}
    async with open_notary(
        tmp_path / "n", v2={"key_file": key_path, "max_batch": 5}, limits=limits,
        answers={"failures_at_deadline": False},
    ) as notary:
        dead = closed_port()

        async def ask(count: int) -> tuple[int, bytes]:
            body = json.dumps({"targets": [
                {"host": "127.0.0.1", "port": dead} for _ in range(count)
            ]}).encode()
            answer = await send_raw(notary.port, (
                "POST /v2/query HTTP/1.0\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode() + body)
            return answer.status, answer.headers.get(b"retry-after", b"")

        assert await ask(4) == (200, b"")
        status, retry_after = await ask(2)  # one token left, two asked
        assert status == 429 and 90 <= int(retry_after) <= 100
        assert await ask(1) == (200, b"")


async def test_perspectives_queries_are_limited_too(tmp_path: Path) -> None:
    key_path = tmp_path / "perspectives.key"
    key = crypto.generate_perspectives_key()
    crypto.write_new_file(key_path, crypto.private_key_pem(key), mode=0o600)
    section = {"key_file": key_path, "listen": (Endpoint("127.0.0.1", 0),)}
    limits = {**NO_EXEMPTIONS, "queries_per_s_per_prefix": 0.01, "query_burst": 1}
    async with open_tls_target(names=[NAME]) as site:
        async with open_notary(
            tmp_path / "n", names={NAME: [site.host]}, perspectives=section, limits=limits
        ) as notary:
            request = f"GET /?host={NAME}&port={site.port}&service_type=2 HTTP/1.0\r\n\r\n"

            async def ask() -> tuple[int, bytes]:
                with trio.fail_after(20):
                    stream = await trio.open_tcp_stream(
                        "127.0.0.1", notary.running.perspectives[0].port
                    )
                    async with stream:
                        await stream.send_all(request.encode())
                        data = b""
                        while chunk := await stream.receive_some(65536):
                            data += chunk
                answer = parse_response(data)
                return answer.status, answer.headers.get(b"retry-after", b"")

            assert await ask() == (404, b"")  # unknown: probed in the background
            status, retry_after = await ask()
            assert status == 429 and 90 <= int(retry_after) <= 100


async def test_connections_per_address_and_per_prefix_are_capped(tmp_path: Path) -> None:
    limits = {
        **NO_EXEMPTIONS, "max_connections_per_address": 2, "max_connections_per_prefix": 3,
    }

    async def is_open(stream: trio.SocketStream) -> bool:
        """Whether the notary keeps ``stream`` (it waits for a TLS hello)."""
        with trio.move_on_after(0.3):
            try:
                return await stream.receive_some(1) != b""
            except trio.BrokenResourceError:
                return False
        return True

    async with open_notary(tmp_path, limits=limits) as notary:
        held = []

        async def connect(source: str) -> trio.SocketStream:
            stream = await trio.open_tcp_stream("127.0.0.1", notary.port, local_address=source)
            held.append(stream)
            return stream

        try:
            assert await is_open(await connect("127.0.0.1"))
            assert await is_open(await connect("127.0.0.1"))
            assert not await is_open(await connect("127.0.0.1"))  # a third from one address
            assert await is_open(await connect("127.0.0.2"))
            assert not await is_open(await connect("127.0.0.3"))  # a fourth from the /24
            assert await is_open(await connect("127.0.1.1"))  # another /24
            await held[0].aclose()
            await trio.sleep(0.1)
            assert await is_open(await connect("127.0.0.3"))  # room again
            stats = notary.running.abuse.statistics()
            assert (stats.connections_refused_address, stats.connections_refused_prefix) == (1, 1)
        finally:
            for stream in held:
                await stream.aclose()


async def test_relay_connections_per_address_are_capped(tmp_path: Path) -> None:
    limits = {**NO_EXEMPTIONS, "max_connections_per_address": 1}
    async with open_notary(tmp_path, limits=limits) as notary:
        first = await trio.open_tcp_stream("127.0.0.1", notary.relay_port)
        try:
            second = await trio.open_tcp_stream("127.0.0.1", notary.relay_port)
            with trio.fail_after(5):
                assert await second.receive_some(1) == b""  # closed at once, no answer
            await second.aclose()
            assert notary.running.relay_handler.statistics().refused["per-client"] == 1
        finally:
            await first.aclose()


async def test_max_requests_per_connection_then_connection_close(tmp_path: Path) -> None:
    async with open_notary(tmp_path, http={"max_requests_per_connection": 3}) as notary:
        data = await tls_exchange(notary.port, b"GET / HTTP/1.1\r\nHost: n\r\n\r\n" * 5)
    answers = [parse_response(a) for a in split_responses(data)]
    assert [a.status for a in answers] == [200, 200, 200]
    assert [a.headers[b"connection"] for a in answers] == [b"keep-alive", b"keep-alive", b"close"]


async def test_a_target_is_probed_at_most_n_times_a_minute(tmp_path: Path) -> None:
    async with open_tls_target(names=[NAME]) as site:
        async with open_notary(
            tmp_path, names={NAME: [site.host]},
            limits={"probes_per_minute_per_target": 1},  # one probe per 60 s at most
            answers={"reprobe_after_s": 0},  # every unknown fingerprint asks for a probe
            rescan={"enabled": False},
        ) as notary:
            target = f"{NAME}+{site.port}"
            good = sha1_fp(site.leaf_der(NAME))
            statuses = [(await legacy_query(notary.port, target, random_fp(i))).status
                        for i in range(6)]
            # Answered from the probe of a moment ago: it sees another certificate.
            assert statuses == [409] * 6
            assert site.accepted == 1
            assert (await legacy_query(notary.port, target, good)).status == 200
            notary.clock.advance(50.0)  # reprobe_after_s has passed: a probe is due...
            for i in range(3):  # ...and throttled: answered from the probe 50 s ago
                assert (await legacy_query(notary.port, target, random_fp(99 + i))).status == 409
            assert site.accepted == 1
            assert notary.running.abuse.statistics().probes_refused_target >= 3
            notary.clock.advance(11.0)  # over 60 s after the first probe: one more
            for i in range(5):
                await legacy_query(notary.port, target, random_fp(100 + i))
            assert site.accepted == 2


async def test_a_throttled_query_within_a_sub_second_spacing_is_answered_from_the_probe(
    tmp_path: Path,
) -> None:
    """With more than 60 probes a minute per target the spacing is under a
    second, and observations are dated in whole seconds: a query throttled
    a moment after a probe was answered "could not observe" (issue 30, item
    17) instead of from the observation just made."""
    async with open_tls_target(names=[NAME]) as site:
        async with open_notary(
            tmp_path, names={NAME: [site.host]},
            limits={"probes_per_minute_per_target": 61},  # one probe per 0.98 s at most
            answers={"reprobe_after_s": 0, "failures_at_deadline": False},
            rescan={"enabled": False},
        ) as notary:
            # Probed half a second into a second (the observation is dated
            # at its start), asked again 0.6 s later: within the spacing,
            # in the next second.
            now = time.time()
            notary.clock.offset = math.floor(now) + 1.5 - now
            target = f"{NAME}+{site.port}"
            assert (await legacy_query(notary.port, target, random_fp(1))).status == 409
            notary.clock.advance(0.6)
            assert (await legacy_query(notary.port, target, random_fp(2))).status == 409
            assert site.accepted == 1
            assert notary.running.abuse.statistics().probes_refused_target == 1


async def test_a_failing_target_is_not_probed_in_a_loop(tmp_path: Path) -> None:
    """Failures leave no observation, so ``reprobe_after_s`` cannot stop a
    loop of probes; the per-target spacing does."""
    async with open_garbage_target() as garbage:
        async with open_notary(
            tmp_path, limits={"probes_per_minute_per_target": 1},
            answers={"failures_at_deadline": False}, rescan={"enabled": False},
        ) as notary:
            for _ in range(5):
                answer = await legacy_query(notary.port, f"127.0.0.1+{garbage.port}", ABSENT_FP)
                assert answer.status == 503
            assert garbage.accepted == 1


async def test_opt_out_by_name_and_by_cidr(tmp_path: Path) -> None:
    async with open_tls_target(names=[NAME, "elsewhere.test"]) as site:
        names = {NAME: [site.host], "elsewhere.test": [site.host], "fine.test": [site.host]}
        async with open_notary(
            tmp_path, names=names, server={"opt_out": ("example.test", "127.0.0.1/32")},
        ) as notary:
            for target in (
                f"{NAME}+{site.port}",  # under an opted-out name
                f"example.test+{site.port}",  # the name itself
                f"elsewhere.test+{site.port}",  # resolves into an opted-out network
                f"127.0.0.1+{site.port}",  # in it
            ):
                answer = await legacy_query(notary.port, target, None)
                assert answer.status == 403, target
                assert answer.body == b"target refused by this notary's policy\n"
            assert site.accepted == 0
            assert notary.running.prober.statistics().failures["refused"] == 4
            # A refusal charges no probe to the target: asked again, still 403.
            assert (await legacy_query(notary.port, f"{NAME}+{site.port}", None)).status == 403


async def test_failures_look_alike_and_come_at_the_probe_deadline(tmp_path: Path) -> None:
    async with open_garbage_target() as garbage:
        failing = [
            f"127.0.0.1+{closed_port()}",  # connection refused
            f"127.0.0.1+{garbage.port}",  # not TLS
            "nowhere.test+443",  # does not resolve
        ]
        async with open_notary(tmp_path / "a", probe={"timeout_s": 1.0}) as notary:
            bodies = set()
            for target in failing:
                started = trio.current_time()
                answer = await legacy_query(notary.port, target, ABSENT_FP)
                elapsed = trio.current_time() - started
                assert answer.status == 503
                assert 0.95 <= elapsed < 5.0, (target, elapsed)
                bodies.add(answer.body)
            assert bodies == {b"could not observe the target's certificate\n"}
        async with open_notary(
            tmp_path / "b", probe={"timeout_s": 1.0}, answers={"failures_at_deadline": False}
        ) as notary:
            started = trio.current_time()
            answer = await legacy_query(notary.port, failing[0], ABSENT_FP)
            assert answer.status == 503 and trio.current_time() - started < 0.9


async def test_rate_tables_stay_bounded(tmp_path: Path) -> None:
    limits = {**NO_EXEMPTIONS, "max_tracked": 4, "queries_per_s_per_prefix": 1.0,
              "query_burst": 5}
    async with open_notary(tmp_path, limits=limits) as notary:
        for third in range(12):  # twelve client prefixes
            request = b"GET /target/10.0.0.1+443 HTTP/1.0\r\n\r\n"  # a refused target
            answer = await tls_exchange(notary.port, request, source=f"127.0.{third}.1")
            assert parse_response(answer).status == 403
            assert len(notary.running.abuse.queries) <= 4
        tracked = notary.running.abuse.statistics().tracked
        assert all(count <= 4 for count in tracked.values()), tracked
        assert notary.running.abuse.queries.sweeps >= 2


# -- the notary's own TLS ------------------------------------------------------------------


async def test_legacy_tls_off_refuses_tls10_and_on_accepts_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if not local_openssl_speaks_tls10(tmp_path):
        pytest.skip("this OpenSSL cannot complete a TLS 1.0 handshake even at security level 0")
    async with open_notary(tmp_path / "modern") as notary:
        with pytest.raises(trio.BrokenResourceError):
            await tls10_index(notary.port)
        modern = await send_raw(notary.port, b"GET / HTTP/1.0\r\n\r\n")
        assert modern.status == 200
        assert "legacy_tls" not in caplog.text
    async with open_notary(tmp_path / "legacy", server={"legacy_tls": True}) as notary:
        assert await tls10_index(notary.port) == 200
        assert (await send_raw(notary.port, b"GET / HTTP/1.0\r\n\r\n")).status == 200
        assert "legacy_tls is on" in caplog.text


async def test_the_modern_notary_offers_only_aead_suites(tmp_path: Path) -> None:
    async with open_notary(tmp_path) as notary:
        for cipher in ("AES128-SHA", "ECDHE-RSA-AES128-SHA", "ECDHE-RSA-AES128-SHA256"):
            context = client_context()
            context.maximum_version = ssl.TLSVersion.TLSv1_2
            context.set_ciphers(cipher)
            with pytest.raises(trio.BrokenResourceError):
                tcp = await trio.open_tcp_stream("127.0.0.1", notary.port)
                async with trio.SSLStream(tcp, context, server_hostname=None) as stream:
                    await stream.do_handshake()
        context = client_context()
        context.maximum_version = ssl.TLSVersion.TLSv1_2
        tcp = await trio.open_tcp_stream("127.0.0.1", notary.port)
        async with trio.SSLStream(tcp, context, server_hostname=None) as stream:
            await stream.do_handshake()
            assert stream.version() == "TLSv1.2"
            assert stream.cipher()[0] in ("ECDHE-RSA-AES256-GCM-SHA384",
                                          "ECDHE-RSA-AES128-GCM-SHA256",
                                          "ECDHE-RSA-CHACHA20-POLY1305")
        response = await send_raw(notary.port, b"GET / HTTP/1.0\r\n\r\n")  # TLS 1.3
        assert response.status == 200
