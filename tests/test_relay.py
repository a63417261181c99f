"""The bounce relay end to end: real notaries, real sockets, loopback only.

Notary A (the bounce, 127.0.0.1) relays to notary B (127.0.0.2, its own key
and bundle). Clients always CONNECT to port 4242; A's ``dial_port`` maps that
to B's ephemeral API port, so the tests need no fixed port. Names reach
loopback addresses through the injected resolver.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from notary.config import RelayConfig
from notary.errors import UsageError
from notary.protocol import convergence
from notary.server.relay import RelayHandler, TrustedDestinations
from notary.state import crypto
from tests.support.notaries import (
    NotaryUnderTest,
    exchange_over_tls,
    legacy_request,
    open_notary,
    parse_response,
)
from tests.support.relay import (
    A_HOST,
    B_HOST,
    B_NAME,
    TIMEOUT_S,
    connect_request,
    open_client,
    open_pair,
    open_recording_destination,
    read_all,
    read_head,
    refused,
    write_bundle,
)

CLIENT_SOURCE = "127.0.0.3"  # the client's own address, which B must not see
DEAD_HOST = "127.0.0.9"  # nothing listens there


async def bounce(relay_port: int, request: bytes) -> tuple[bytes, trio.SocketStream]:
    """Send ``request`` to the relay; return its answer head and the stream."""
    stream = await open_client(relay_port)
    await stream.send_all(request)
    head, rest = await read_head(stream)
    assert rest == b""
    return head, stream


def assert_signed_by(notary: NotaryUnderTest, body: bytes) -> None:
    answer = convergence.parse_answer(body)
    key = notary.certificate.public_key()
    assert crypto.verify_convergence_signature(key, answer.payload, answer.signature_b64)


# -- bouncing to a real notary ---------------------------------------------------------


async def test_legacy_client_bounces_through_a_to_b_and_verifies_b(tmp_path: Path) -> None:
    async with open_pair(tmp_path, b_hosts=[B_NAME]) as (a, b):
        with trio.fail_after(TIMEOUT_S):
            head, stream = await bounce(a.relay_port, connect_request(B_NAME))
            assert head == (
                b"HTTP/1.0 200 Connection Established\r\n"
                b"Proxy-Agent: notary\r\n"
                b"X-Convergence-Notary: " + B_NAME.encode()
            )
            # B is asked about A's API port: a TLS target on loopback.
            target = f"{A_HOST}+{a.port}"
            answer = await exchange_over_tls(stream, legacy_request(target, None))
        assert answer.peer_sha1 == b.sha1_pin  # the tunnel ends at B, pinned
        assert answer.status == 200
        assert_signed_by(b, answer.body)
        with pytest.raises(AssertionError):
            assert_signed_by(a, answer.body)
        statistics = a.running.relay_handler.statistics()
        assert statistics.tunnels_opened == 1
        assert statistics.bytes_to_destinations > 0 and statistics.bytes_to_clients > 0
        assert b.running.relay_handler.statistics().tunnels_opened == 0


async def test_first_destination_to_connect_wins(tmp_path: Path) -> None:
    async with open_pair(tmp_path, b_hosts=[DEAD_HOST, B_HOST]) as (a, b):
        with trio.fail_after(TIMEOUT_S):
            head, stream = await bounce(a.relay_port, connect_request(DEAD_HOST, B_HOST))
            assert head.startswith(b"HTTP/1.0 200 ")
            assert head.endswith(b"X-Convergence-Notary: " + B_HOST.encode())
            answer = await exchange_over_tls(stream, legacy_request(f"{A_HOST}+{a.port}", None))
        assert answer.peer_sha1 == b.sha1_pin
        assert_signed_by(b, answer.body)


async def test_bytes_sent_with_the_connect_head_reach_the_destination(tmp_path: Path) -> None:
    """A client that does not wait for the 200 (its ClientHello in the same
    segment as the head) still gets its bytes through."""
    async with open_pair(tmp_path) as (a, b):
        with trio.fail_after(TIMEOUT_S):
            tcp = await open_client(a.relay_port)
            early = _EarlyStream(tcp, connect_request(B_HOST))
            answer = await exchange_over_tls(early, legacy_request(f"{A_HOST}+{a.port}", None))
        assert early.relay_head.startswith(b"HTTP/1.0 200 ")
        assert answer.peer_sha1 == b.sha1_pin and answer.status == 200


class _EarlyStream(trio.abc.Stream):
    """Prepends the CONNECT head to the first send (the ClientHello) and
    strips the relay's answer head from what is received."""

    def __init__(self, tcp: trio.SocketStream, head: bytes) -> None:
        self._tcp = tcp
        self._head: bytes | None = head
        self.relay_head = b""
        self._pending = b""

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._head is not None:
            data, self._head = self._head + bytes(data), None
        await self._tcp.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._tcp.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if not self.relay_head:
            self.relay_head, self._pending = await read_head(self._tcp)
        if self._pending:
            data, self._pending = self._pending, b""
            return data
        return await self._tcp.receive_some(max_bytes)

    async def send_eof(self) -> None:
        await self._tcp.send_eof()

    async def aclose(self) -> None:
        await self._tcp.aclose()


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed (.ci/install-tools)")
async def test_curl_reaches_b_through_the_relay_with_the_pinned_key(tmp_path: Path) -> None:
    async with open_pair(tmp_path, b_hosts=[DEAD_HOST, B_HOST]) as (a, b):
        spki = b.certificate.public_key().public_bytes(
            Encoding.DER, PublicFormat.SubjectPublicKeyInfo
        )
        import base64

        pin = "sha256//" + base64.b64encode(hashlib.sha256(spki).digest()).decode()
        argv = [
            "curl", "--silent", "--show-error", "--insecure", "--max-time", "20",
            "--noproxy", "", "--proxytunnel", "--proxy", f"http://{A_HOST}:{a.relay_port}",
            "--proxy-header", f"X-Convergence-Notary: {B_HOST}+4242",
            "--pinnedpubkey", pin,
            "--data", f"fingerprint={convergence.format_fingerprint(a.sha1_pin)}",
            f"https://{DEAD_HOST}:4242/target/{A_HOST}+{a.port}",
        ]
        env = {"PATH": os.environ["PATH"]}  # no proxy variables from the machine
        with trio.fail_after(TIMEOUT_S + 5):
            done = await trio.run_process(argv, capture_stdout=True, capture_stderr=True, env=env)
        assert done.returncode == 0, done.stderr.decode()
        assert_signed_by(b, done.stdout)
        rows = json.loads(done.stdout)["fingerprintList"]
        assert [row["fingerprint"] for row in rows] == [
            convergence.format_fingerprint(a.sha1_pin)
        ]


# -- what the destination sees, and privacy ---------------------------------------------


@asynccontextmanager
async def open_public_relay(
    tmp_path: Path, dial_port: int, **relay: object
) -> AsyncIterator[NotaryUnderTest]:
    settings = {"destinations": "public", "dial_port": dial_port, **relay}
    async with open_notary(tmp_path / "a", host=A_HOST, relay=settings) as a:
        yield a


async def test_destination_sees_the_relay_not_the_client_and_nothing_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with open_recording_destination() as (port, peers):
        async with open_public_relay(tmp_path, port) as a:
            with trio.fail_after(TIMEOUT_S):
                stream = await open_client(a.relay_port, source=CLIENT_SOURCE)
                async with stream:
                    await stream.send_all(connect_request("127.0.0.4"))
                    head, rest = await read_head(stream)
                    assert head.startswith(b"HTTP/1.0 200 ")
                    assert rest + await read_all(stream) == b"hello from the destination"
    assert peers and CLIENT_SOURCE not in peers
    assert CLIENT_SOURCE not in caplog.text  # not even at debug level


async def test_ten_megabytes_each_way_arrive_intact_with_half_close(tmp_path: Path) -> None:
    upload = os.urandom(10 * 1024 * 1024)
    download = os.urandom(10 * 1024 * 1024)

    async def echo_digest_then_send(stream: trio.SocketStream) -> None:
        # Reads until the client half-closes, then answers: the relay must
        # pass the end of file on without closing the other direction.
        received = await read_all(stream)
        await stream.send_all(hashlib.sha256(received).digest() + download)

    async with open_recording_destination(echo_digest_then_send) as (port, _):
        async with open_public_relay(tmp_path, port) as a:
            with trio.fail_after(60):
                stream = await open_client(a.relay_port)
                async with stream:
                    await stream.send_all(connect_request("127.0.0.4"))
                    head, rest = await read_head(stream)
                    assert head.startswith(b"HTTP/1.0 200 ")
                    await stream.send_all(upload)
                    await stream.send_eof()
                    answer = rest + await read_all(stream)
    assert answer[:32] == hashlib.sha256(upload).digest()
    assert answer[32:] == download
    statistics = a.running.relay_handler.statistics()
    assert statistics.bytes_to_destinations >= len(upload)
    assert statistics.bytes_to_clients >= len(download)


# -- refusals ---------------------------------------------------------------------------


async def test_all_destinations_dead_is_404_unable_to_connect(tmp_path: Path) -> None:
    async with open_pair(tmp_path, b_hosts=[DEAD_HOST, "127.0.0.10"]) as (a, _b):
        answer = await refused(a.relay_port, connect_request(DEAD_HOST, "127.0.0.10"))
    assert answer.status == 404
    assert answer.headers[b"connection"] == b"close"
    assert a.running.relay_handler.statistics().refused["unreachable"] == 1


@pytest.mark.parametrize(
    ("request_bytes", "status", "reason"),
    [
        (b"GET / HTTP/1.1\r\nHost: notary\r\n\r\n", 403, "forbidden"),
        (b"POST /target/a+443 HTTP/1.0\r\nContent-Length: 0\r\n\r\n", 403, "forbidden"),
        (b"CONNECT 127.0.0.2:443 HTTP/1.1\r\n\r\n", 403, "forbidden"),
        (b"CONNECT 127.0.0.2:4242 HTTP/1.1\r\nX-Convergence-Notary: 127.0.0.2+80\r\n\r\n",
         403, "forbidden"),
        (b"CONNECT 127.0.0.5:4242 HTTP/1.1\r\n\r\n", 403, "untrusted"),
        (b"CONNECT 127.0.0.2:4242 HTTP/1.1\r\nX-Convergence-Notary: outsider.test+4242\r\n\r\n",
         403, "untrusted"),
        (b"CONNECT bad_host:4242 HTTP/1.1\r\n\r\n", 400, "malformed"),
        (b"CONNECT 127.0.0.2:4242 HTTP/1.1\r\nX-Big: " + b"x" * 5000 + b"\r\n\r\n",
         431, "malformed"),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 400, "malformed"),
    ],
)
async def test_refusals_are_answered_and_closed(
    tmp_path: Path, request_bytes: bytes, status: int, reason: str
) -> None:
    async with open_pair(tmp_path) as (a, _b):
        answer = await refused(a.relay_port, request_bytes)
        statistics = a.running.relay_handler.statistics()
    assert answer.status == status
    assert answer.headers[b"connection"] == b"close"
    assert statistics.refused[reason] == 1
    assert statistics.tunnels_opened == 0


async def test_forbidden_request_gets_the_page(tmp_path: Path) -> None:
    async with open_pair(tmp_path) as (a, _b):
        answer = await refused(a.relay_port, b"GET / HTTP/1.1\r\nHost: notary\r\n\r\n")
    assert answer.headers[b"content-type"].startswith(b"text/html")
    assert b"relays Convergence clients" in answer.body


async def test_policy_refuses_loopback_unless_allowed(tmp_path: Path) -> None:
    async with open_recording_destination() as (port, peers):
        async with open_public_relay(tmp_path, port, allow_addresses=()) as a:
            answer = await refused(a.relay_port, connect_request("127.0.0.4"))
            statistics = a.running.relay_handler.statistics()
    assert answer.status == 403
    assert b"refused by policy" in answer.body
    assert statistics.refused["policy"] == 1
    assert peers == []  # never connected


async def test_too_many_tunnels_is_503(tmp_path: Path) -> None:
    async def hold(stream: trio.SocketStream) -> None:
        await read_all(stream)

    async with open_recording_destination(hold) as (port, _):
        async with open_public_relay(tmp_path, port, max_tunnels=1) as a:
            with trio.fail_after(TIMEOUT_S):
                first = await open_client(a.relay_port)
                async with first:
                    await first.send_all(connect_request("127.0.0.4"))
                    head, _ = await read_head(first)
                    assert head.startswith(b"HTTP/1.0 200 ")
                    answer = await refused(a.relay_port, connect_request("127.0.0.4"))
                    assert answer.status == 503
                    assert a.running.relay_handler.statistics().tunnels == 1
                # once the first tunnel is gone, a new one is accepted
                while a.running.relay_handler.statistics().connections:  # noqa: ASYNC110 (a counter, no event)
                    await trio.sleep(0.01)
                head, second = await bounce(a.relay_port, connect_request("127.0.0.4"))
                await second.aclose()
                assert head.startswith(b"HTTP/1.0 200 ")
    assert a.running.relay_handler.statistics().refused["busy"] == 1


async def test_off_mode_serves_a_page_and_relays_nothing(tmp_path: Path) -> None:
    async with open_recording_destination() as (port, peers):
        async with open_public_relay(tmp_path, port, destinations="off") as a:
            page = await refused(a.relay_port, b"GET / HTTP/1.1\r\nHost: n\r\n\r\n")
            head = await refused(a.relay_port, b"HEAD / HTTP/1.1\r\nHost: n\r\n\r\n")
            connect = await refused(a.relay_port, connect_request("127.0.0.4"))
    assert page.status == 200 and b"does not relay" in page.body
    assert head.status == 200 and head.body == b""
    assert connect.status == 403
    assert peers == []


# -- timeouts (autojump clock; the relay handler over in-memory streams) ----------------


def memory_relay(**settings: object) -> RelayHandler:
    config = RelayConfig(listen=(), destinations="public", **settings)

    async def no_names(host: str, port: int) -> list[str]:
        raise AssertionError("no name is resolved here")

    return RelayHandler(config, trusted=None, resolver=no_names)


async def test_slow_connect_head_gets_408_on_time(autojump_clock: trio.testing.MockClock) -> None:
    relay = memory_relay(head_timeout_s=5.0)
    client, server = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(relay, server)
        start = trio.current_time()
        await client.send_all(b"CONNECT 127.0.0.4:4242 HTTP/1.1\r\n")  # and nothing more
        answer = parse_response(await read_all(client))
        assert answer.status == 408
        assert 5.0 <= trio.current_time() - start < 5.0 + 1.5  # + the lingering drain
    assert relay.statistics().refused["timeout"] == 1
    assert relay.statistics().connections == 0


async def test_idle_tunnel_is_closed_on_time(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async def silent(stream: trio.SocketStream) -> None:
        await read_all(stream)

    async with open_recording_destination(silent) as (port, _):
        relay = memory_relay(dial_port=port, idle_timeout_s=30.0, allow_addresses=("127.0.0.4",))
        client, server = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(relay, server)
            await client.send_all(connect_request("127.0.0.4"))
            head, _ = await read_head(client)
            assert head.startswith(b"HTTP/1.0 200 ")
            opened = trio.current_time()
            await client.send_all(b"ping")  # activity restarts the idle clock
            await trio.sleep(20)
            await client.send_all(b"ping")
            pinged = trio.current_time()
            assert await read_all(client) == b""  # closed by the relay
            assert 30.0 <= trio.current_time() - pinged < 31.0
            assert trio.current_time() - opened >= 50.0
        assert relay.statistics().tunnels == 0


async def test_tunnel_lifetime_is_bounded(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async def chatty(stream: trio.SocketStream) -> None:
        while True:
            await stream.send_all(b".")
            await trio.sleep(1)

    async with open_recording_destination(chatty) as (port, _):
        relay = memory_relay(dial_port=port, idle_timeout_s=5.0, max_lifetime_s=60.0,
                             allow_addresses=("127.0.0.4",))
        client, server = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(relay, server)
            await client.send_all(connect_request("127.0.0.4"))
            await read_head(client)
            opened = trio.current_time()
            received = await read_all(client)  # never idle, yet closed
            assert 60.0 <= trio.current_time() - opened < 61.5
            assert len(received) >= 50


# -- trusted bundles ----------------------------------------------------------------------


async def test_sighup_reloads_the_trusted_bundles(tmp_path: Path) -> None:
    async with open_pair(tmp_path) as (a, b):
        assert (await refused(a.relay_port, connect_request(B_NAME))).status == 403
        write_bundle(tmp_path / "trusted" / "named.notary", b, [B_NAME])
        os.kill(os.getpid(), signal.SIGHUP)
        trusted = a.running.relay_handler.trusted
        assert trusted is not None
        with trio.fail_after(TIMEOUT_S):
            while B_NAME not in trusted:  # noqa: ASYNC110 (the signal task sets no event)
                await trio.sleep(0.01)
            head, stream = await bounce(a.relay_port, connect_request(B_NAME))
            await stream.aclose()
        assert head.startswith(b"HTTP/1.0 200 ")
        assert trusted.bundle_count == 2


async def test_a_bad_bundle_on_reload_keeps_the_previous_set(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with open_pair(tmp_path) as (a, _b):
        trusted = a.running.relay_handler.trusted
        assert trusted is not None and B_HOST in trusted
        (tmp_path / "trusted" / "broken.notary").write_text("{not json")
        assert trusted.reload() is False
        assert B_HOST in trusted
        assert "broken.notary" in caplog.text
        head, stream = await bounce(a.relay_port, connect_request(B_HOST))
        await stream.aclose()
        assert head.startswith(b"HTTP/1.0 200 ")


def test_a_bad_bundle_at_start_is_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.notary"
    bad.write_text('{"version": 1}')
    with pytest.raises(UsageError, match=r"bad\.notary"):
        TrustedDestinations([bad])
    with pytest.raises(UsageError, match="cannot read trusted bundle"):
        TrustedDestinations([tmp_path / "missing.notary"])
