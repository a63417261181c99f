"""Abuse of the bounce relay: forbidden destinations reached through names,
IP literal spellings, fan-out, and floods of CONNECTs and of silent
connections. Real notaries and sockets on loopback only: every address
outside 127.0.0.0/8 appears only in the injected resolver's answers, and
the dialer is wrapped by a guard that refuses (and records) any attempt
to connect to one, so a policy bug could not send a packet off the
machine.

Already covered in tests/test_relay.py (not repeated): loopback refused by
IP literal unless allowed, ports other than 4242 (request line and
header), hosts outside the trusted bundles, a second tunnel beyond
``max_tunnels=1``, a slow head (408), idle and lifetime bounds; in
tests/protocol/test_relay.py: the destination grammar.
"""

from __future__ import annotations

import ipaddress
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

from notary.errors import ProbeConnectFailed
from notary.outbound import dialer
from notary.state import crypto
from tests.support.notaries import NotaryUnderTest, open_notary
from tests.support.relay import (
    A_HOST,
    B_HOST,
    TIMEOUT_S,
    connect_request,
    open_client,
    open_pair,
    open_recording_destination,
    read_all,
    read_head,
    refused,
)

DESTINATION = "127.0.0.4"  # where open_recording_destination listens

_RSA_KEY = crypto.generate_rsa_key()


@pytest.fixture(autouse=True)
def one_rsa_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every notary of this module gets the same RSA key (a fifth of a
    second saved per notary; nothing here depends on the key)."""
    monkeypatch.setattr(crypto, "generate_rsa_key", lambda *args, **kwargs: _RSA_KEY)


@pytest.fixture
def dialled(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every address the notary tries to connect to; any outside loopback is
    refused here, before a socket is made."""
    attempts: list[str] = []
    real_open_stream = dialer._open_stream

    async def loopback_only(address: str, port: int) -> trio.SocketStream:
        attempts.append(address)
        if not ipaddress.ip_address(address).is_loopback:
            raise ProbeConnectFailed("test guard: only loopback")
        return await real_open_stream(address, port)

    monkeypatch.setattr(dialer, "_open_stream", loopback_only)
    return attempts


@asynccontextmanager
async def open_public_relay(
    tmp_path: Path, dial_port: int, names: dict[str, Sequence[str]], **relay: object
) -> AsyncIterator[NotaryUnderTest]:
    """Notary A on 127.0.0.1 relaying to any destination (``public``) on
    ``dial_port``, resolving ``names`` only."""
    settings = {"destinations": "public", "dial_port": dial_port, **relay}
    async with open_notary(
        tmp_path / "a", host=A_HOST, names=names, relay=settings, rescan={"enabled": False}
    ) as notary:
        yield notary


#: Names whose every address the default policy refuses (with loopback
#: allowed only as 127.0.0.0/8).
FORBIDDEN: dict[str, list[str]] = {
    "rfc1918-10.test": ["10.0.0.1"],
    "rfc1918-172.test": ["172.16.0.1"],
    "rfc1918-192.test": ["192.168.1.1"],
    "link-local-metadata.test": ["169.254.169.254"],
    "cgnat.test": ["100.64.0.1"],
    "unspecified.test": ["0.0.0.0"],
    "multicast.test": ["224.0.0.1"],
    "broadcast.test": ["255.255.255.255"],
    "documentation.test": ["192.0.2.1"],
    "ipv6-loopback.test": ["::1"],
    "ipv6-link-local.test": ["fe80::1"],
    "ipv6-ula.test": ["fd00::1"],
    "v4-mapped-private.test": ["::ffff:10.0.0.1"],
    "nat64-private.test": ["64:ff9b::a00:1"],
    "6to4-private.test": ["2002:a00:1::1"],
    "teredo.test": ["2001:0:4136:e378:8000:63bf:3fff:fdd2"],
    "all-bad.test": ["10.0.0.1", "::1", "169.254.169.254", "fe80::1"],
}


async def test_names_resolving_to_forbidden_addresses_are_refused_unconnected(
    tmp_path: Path, dialled: list[str]
) -> None:
    async with open_recording_destination() as (port, peers):
        async with open_public_relay(tmp_path, port, FORBIDDEN) as a:
            statuses = {}
            for name in FORBIDDEN:
                answer = await refused(a.relay_port, connect_request(name))
                statuses[name] = (answer.status, b"refused by policy" in answer.body)
            statistics = a.running.relay_handler.statistics()
    assert statuses == {name: (403, True) for name in FORBIDDEN}
    assert statistics.refused["policy"] == len(FORBIDDEN)
    assert statistics.tunnels_opened == 0
    assert dialled == [] and peers == []


async def test_a_name_resolving_to_loopback_is_refused_when_loopback_is_not_allowed(
    tmp_path: Path, dialled: list[str]
) -> None:
    """DNS rebinding: an innocent name answering with the relay's own
    neighbourhood is checked after resolution like an IP literal."""
    async with open_recording_destination() as (port, peers):
        names = {"rebound.test": [DESTINATION], "rebound6.test": ["::ffff:127.0.0.4"]}
        async with open_public_relay(tmp_path, port, names, allow_addresses=()) as a:
            for name in names:
                answer = await refused(a.relay_port, connect_request(name))
                assert answer.status == 403, name
    assert dialled == [] and peers == []


async def test_only_the_allowed_addresses_of_a_mixed_answer_are_dialled(
    tmp_path: Path, dialled: list[str]
) -> None:
    names = {"mixed.test": ["10.0.0.1", "fe80::1", "::ffff:127.0.0.4", DESTINATION]}
    async with open_recording_destination() as (port, peers):
        async with open_public_relay(tmp_path, port, names) as a:
            with trio.fail_after(TIMEOUT_S):
                stream = await open_client(a.relay_port)
                async with stream:
                    await stream.send_all(connect_request("mixed.test"))
                    head, rest = await read_head(stream)
                    assert head.startswith(b"HTTP/1.0 200 ")
                    assert rest + await read_all(stream) == b"hello from the destination"
    assert set(dialled) == {DESTINATION}  # the mapped spelling is the same address
    assert peers == [A_HOST]


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        pytest.param(b"CONNECT 10.0.0.1:4242 HTTP/1.1\r\n\r\n", 403, id="private-literal"),
        pytest.param(b"CONNECT [::1]:4242 HTTP/1.1\r\n\r\n", 403, id="ipv6-loopback"),
        pytest.param(b"CONNECT [::ffff:10.0.0.1]:4242 HTTP/1.1\r\n\r\n", 403,
                     id="v4-mapped-private"),
        pytest.param(b"CONNECT [fe80::1%25eth0]:4242 HTTP/1.1\r\n\r\n", 400, id="zone-id"),
        pytest.param(b"CONNECT 127.0.0.4:0 HTTP/1.1\r\n\r\n", 400, id="port-0"),
        pytest.param(b"CONNECT 127.0.0.4:65536 HTTP/1.1\r\n\r\n", 400, id="port-65536"),
        pytest.param(b"CONNECT 127.0.0.4:-1 HTTP/1.1\r\n\r\n", 400, id="port-minus-1"),
        pytest.param(b"CONNECT 127.0.0.4:abc HTTP/1.1\r\n\r\n", 400, id="port-abc"),
        # a bare host means port 4242, as the original relay assumed
        pytest.param(b"CONNECT 127.0.0.4 HTTP/1.1\r\n\r\n", 200, id="no-port"),
        pytest.param(b"CONNECT 127.0.0.4:4242:4242 HTTP/1.1\r\n\r\n", 400, id="two-ports"),
        pytest.param(b"CONNECT 0x7f.0.0.4:4242 HTTP/1.1\r\n\r\n", 400, id="hex-ipv4"),
        pytest.param(b"CONNECT 2130706436:4242 HTTP/1.1\r\n\r\n", 400, id="integer-ipv4"),
        pytest.param(b"CONNECT " + b"a" * 300 + b".test:4242 HTTP/1.1\r\n\r\n", 400,
                     id="long-name"),
        pytest.param(b"CONNECT http://127.0.0.4:4242/ HTTP/1.1\r\n\r\n", 400, id="absolute-uri"),
        pytest.param(b"CONNECT 127.0.0.4:4242 HTTP/1.0\r\nX-Convergence-Notary: "
                     b"10.0.0.1+4242\r\n\r\n", 200, id="one-forbidden-header-host"),
    ],
)
async def test_hostile_connect_requests(
    tmp_path: Path, dialled: list[str], request_bytes: bytes, status: int
) -> None:
    async with open_recording_destination() as (port, _peers):
        async with open_public_relay(tmp_path, port, {}) as a:
            with trio.fail_after(TIMEOUT_S):
                stream = await open_client(a.relay_port)
                async with stream:
                    await stream.send_all(request_bytes)
                    head, _rest = await read_head(stream)
    assert head.split(b" ")[1] == str(status).encode(), head
    assert all(ipaddress.ip_address(address).is_loopback for address in dialled)


async def test_the_v4_mapped_spelling_of_an_allowed_address_is_that_address(
    tmp_path: Path, dialled: list[str]
) -> None:
    async with open_recording_destination() as (port, peers):
        async with open_public_relay(tmp_path, port, {}) as a:
            with trio.fail_after(TIMEOUT_S):
                stream = await open_client(a.relay_port)
                async with stream:
                    await stream.send_all(connect_request("[::ffff:127.0.0.4]"))
                    head, _ = await read_head(stream)
    assert head.startswith(b"HTTP/1.0 200 ")
    assert dialled == [DESTINATION] and peers == [A_HOST]


async def test_fan_out_of_one_connect_is_bounded(tmp_path: Path, dialled: list[str]) -> None:
    """Eight destinations (the most one CONNECT may name), each resolving to
    twenty dead loopback addresses: at most eight addresses are dialled per
    destination, and the client gets 404 Unable to connect."""
    names = {
        f"n{i}.test": [f"127.0.{10 + i}.{j}" for j in range(1, 21)] for i in range(8)
    }
    async with open_public_relay(tmp_path, 9, names) as a:  # port 9 (discard): closed
        head = connect_request("n0.test", *(f"n{i}.test" for i in range(1, 8)))
        answer = await refused(a.relay_port, head)
    assert answer.status == 404
    assert len(dialled) <= 8 * dialer.MAX_ADDRESSES_PER_DIAL
    assert len(set(dialled)) == len(dialled)


async def test_untrusted_names_of_a_trusted_address_are_refused(
    tmp_path: Path, dialled: list[str]
) -> None:
    """Bundles mode trusts names, not what they resolve to: another name for
    the trusted notary B's address is refused, and so is B's address when
    the bundle names B by name."""
    async with open_pair(tmp_path, b_hosts=["notary-b.example.test"]) as (a, _b):
        for name in ("alias.test", B_HOST):
            answer = await refused(a.relay_port, connect_request(name))
            assert answer.status == 403, name
        statistics = a.running.relay_handler.statistics()
    assert statistics.refused["untrusted"] == 2
    assert dialled == []


# -- floods ---------------------------------------------------------------------------


async def test_a_flood_of_connects_beyond_max_tunnels_is_refused_at_once(
    tmp_path: Path, dialled: list[str]
) -> None:
    async def hold(stream: trio.SocketStream) -> None:
        await read_all(stream)

    async with open_recording_destination(hold) as (port, peers):
        async with open_public_relay(tmp_path, port, {}, max_tunnels=4) as a:
            heads: list[bytes] = []
            with trio.fail_after(TIMEOUT_S):
                async with trio.open_nursery() as nursery:
                    opened: list[trio.SocketStream] = []
                    done = trio.Event()

                    async def flood_one() -> None:
                        stream = await open_client(a.relay_port)
                        await stream.send_all(connect_request(DESTINATION))
                        try:
                            head, _ = await read_head(stream)
                        except trio.BrokenResourceError:
                            head = b"reset"  # refused past the bound on lingering refusals
                        heads.append(head)
                        if len(heads) == 40:
                            done.set()
                        if head.startswith(b"HTTP/1.0 200 "):
                            opened.append(stream)
                            await done.wait()
                        await stream.aclose()

                    for _ in range(40):
                        nursery.start_soon(flood_one)
                relay = a.running.relay_handler
                while relay.statistics().connections:  # noqa: ASYNC110 (a counter, no event)
                    await trio.sleep(0.01)
                statistics = relay.statistics()
                # After the flood, the relay serves again.
                stream = await open_client(a.relay_port)
                async with stream:
                    await stream.send_all(connect_request(DESTINATION))
                    head, _ = await read_head(stream)
                    assert head.startswith(b"HTTP/1.0 200 ")
    codes = [head.split(b" ")[1] if head.startswith(b"HTTP/") else b"closed" for head in heads]
    assert codes.count(b"200") == 4
    assert set(codes) <= {b"200", b"503", b"closed"}
    assert statistics.refused["busy"] == 36
    assert statistics.tunnels_opened == 4
    assert len(peers) == 5


async def test_silent_connections_hold_relay_slots_only_until_the_head_deadline(
    tmp_path: Path, dialled: list[str], autojump_clock: trio.testing.MockClock
) -> None:
    async with open_recording_destination() as (port, _peers):
        async with open_public_relay(
            tmp_path, port, {}, max_tunnels=4, head_timeout_s=5.0
        ) as a:
            silent = [await open_client(a.relay_port) for _ in range(4)]
            await trio.sleep(0.5)
            busy = await refused(a.relay_port, connect_request(DESTINATION))
            assert busy.status == 503
            for stream in silent:
                answer = await read_all(stream)
                assert answer.startswith(b"HTTP/1.1 408 ")
                await stream.aclose()
            assert trio.current_time() < 5.0 + 1.5  # the head deadline and the linger
            await trio.sleep(1.5)  # the lingering drains end
            head_stream = await open_client(a.relay_port)
            async with head_stream:
                await head_stream.send_all(connect_request(DESTINATION))
                head, _ = await read_head(head_stream)
    assert head.startswith(b"HTTP/1.0 200 ")
