"""The PROXY protocol on the plain API listener (``[server]
proxy_protocol_from``, notary.server.proxyprotocol) at the socket level, on
loopback: an edge at 127.0.0.1, another client at 127.0.9.2
(client sockets bound to them).

* a header's address is the client's for the per-client limits: two header
  addresses in two prefixes get two query budgets, one address (or one
  prefix) shares one; connections per address count the header's address;
* refused, closed without an answer and counted: a header from an address
  not allowed to send one, a connection from the edge without one, a bad
  one (oversized, garbage v1 fields, a wrong v2 signature, version,
  command), one too slow (a byte a second, cut at the head timeout);
* the socket faults of tests.support.faults on the edge's connections (a
  reset before or in the header, a half-close after part of it, a drip,
  ...) and on the others': the listener keeps answering, the connections
  it counts return to zero and nothing is logged at ERROR.

Real edges (nginx, HAProxy) in front: tests/test_edge.py.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
import trio.testing

from notary.config import Endpoint
from notary.protocol.proxyheader import V2_SIGNATURE
from tests.support.edge import exchange, proxy_v1, proxy_v2
from tests.support.faults import (  # noqa: F401 (the clock: a fixture)
    ClientFault,
    Injected,
    Surface,
    apply,
    client_faults,
    fault_matrix,
    patient_autojump_clock,
    reset,
)
from tests.support.notaries import NotaryUnderTest, open_notary, parse_response, send_raw
from tests.support.tls_targets import LOCALHOST, TLSTarget, open_tls_target

SITE = "www.example.test"
EDGE = LOCALHOST
ELSEWHERE = "127.0.9.2"  # another /24 than the edge's: another budget
HEADER_TIMEOUT_S = 10.0
HTTP = {"header_timeout_s": HEADER_TIMEOUT_S, "keepalive_timeout_s": 30.0,
        "send_timeout_s": 5.0, "linger_timeout_s": 1.0}
CONNECTIONS_GONE_WITHIN_S = 45.0


@dataclass
class World:
    notary: NotaryUnderTest
    site: TLSTarget

    @property
    def port(self) -> int:
        return self.notary.running.plain_api[0].port

    @property
    def query(self) -> bytes:
        """A cache hit, HTTP/1.0: the notary answers and closes."""
        return f"GET /target/{SITE}+{self.site.port} HTTP/1.0\r\n\r\n".encode()

    def metric(self, name: str) -> float:
        """A sample of the notary's metrics for the plain API listener."""
        metrics = self.notary.running.metrics
        assert metrics is not None
        metrics.fold()
        wanted = f'{name}{{listener="plain_api"}}'
        for line in metrics.exposition().decode().splitlines():
            sample, _, number = line.rpartition(" ")
            if sample == wanted:
                return float(number)
        raise AssertionError(f"no {wanted}")

    @property
    def refused(self) -> float:
        return self.metric("notary_http_proxy_refused_connections_total")

    @property
    def open_connections(self) -> float:
        return self.metric("notary_http_connections")


@asynccontextmanager
async def open_world(tmp_path: Path, **limits: object) -> AsyncIterator[World]:
    """A notary whose plain API listener takes PROXY headers from 127.0.0.1,
    with a site in its cache; ``limits``: ``[limits]`` settings (no client
    exempt: the loopback clients are limited too)."""
    async with open_tls_target(names=[SITE]) as site, open_notary(
        tmp_path / "notary", names={SITE: [site.host]},
        server={"plain_api": (Endpoint(LOCALHOST, 0),), "proxy_protocol_from": (f"{EDGE}/32",)},
        limits={"exempt_clients": (), **limits}, http=HTTP,
        answers={"failures_at_deadline": False}, rescan={"enabled": False},
        store={"feed_interval_ms": 3_600_000},
        admin={"listen": (Endpoint(LOCALHOST, 0),), "metrics_interval_s": 3600.0},
    ) as notary:
        await notary.running.stored.settled.wait()
        world = World(notary, site)
        assert (await send_raw(notary.port, world.query)).status == 200  # now in cache
        yield world


def status(answer: bytes) -> int:
    assert answer, "closed without an answer"
    return parse_response(answer).status


# -- the header's address is the client's ----------------------------------------------


@pytest.mark.parametrize("header", [
    proxy_v1("192.0.2.7"), proxy_v2("192.0.2.7"), proxy_v1("2001:db8::7"),
    proxy_v2("2001:db8::7", tlvs=b"\x01\x00\x08http/1.1"),
    proxy_v2(None, command=0),  # LOCAL: a health check, the edge's own address
    b"PROXY UNKNOWN\r\n",
], ids=["v1", "v2", "v1-ipv6", "v2-ipv6-tlv", "v2-local", "v1-unknown"])
async def test_a_query_after_a_header_is_answered(tmp_path: Path, header: bytes) -> None:
    async with open_world(tmp_path) as world:
        assert status(await exchange(world.port, header + world.query)) == 200
        # Sent in pieces, the header and the request alike.
        data = header + world.query
        sock = trio.socket.socket()
        await sock.connect((LOCALHOST, world.port))
        async with trio.SocketStream(sock) as stream:
            for at in range(0, len(data), 5):
                await stream.send_all(data[at:at + 5])
                await trio.sleep(0.01)
            answer = b""
            while chunk := await stream.receive_some(65536):
                answer += chunk
        assert status(answer) == 200
        assert world.refused == 0


async def test_header_addresses_get_their_own_query_budgets(tmp_path: Path) -> None:
    # A budget of 2 queries per client prefix, hardly refilled.
    async with open_world(tmp_path, queries_per_s_per_prefix=0.0001, query_burst=2) as world:
        query = world.query

        async def ask(header: bytes) -> int:
            return status(await exchange(world.port, header + query))

        assert [await ask(proxy_v2("192.0.2.7")) for _ in range(2)] == [200, 200]
        assert await ask(proxy_v1("192.0.2.7")) == 429  # one address: one budget
        assert await ask(proxy_v2("192.0.2.200")) == 429  # one prefix (/24): one budget
        assert [await ask(proxy_v1("198.51.100.7")) for _ in range(2)] == [200, 200]
        assert await ask(proxy_v2("198.51.100.7")) == 429
        assert await ask(proxy_v2("2001:db8:1::7")) == 200
        # The edge's own budget is its own (LOCAL), and so is a direct client's.
        assert await ask(proxy_v2(None, command=0)) == 200
        assert status(await exchange(world.port, query, source=ELSEWHERE)) == 200


async def test_connections_per_address_count_the_header_address(tmp_path: Path) -> None:
    async with open_world(
        tmp_path, max_connections_per_address=1, max_connections_per_prefix=1
    ) as world:
        # One connection of 192.0.2.7 held open, in the middle of its request.
        held = trio.socket.socket()
        await held.connect((LOCALHOST, world.port))
        await held.send(proxy_v2("192.0.2.7") + b"GET /target/")
        with trio.fail_after(10):
            while world.open_connections != 1:  # noqa: ASYNC110 (a counter, no event)
                await trio.sleep(0.01)
        try:
            assert await exchange(world.port, proxy_v1("192.0.2.7") + world.query) == b""
            assert await exchange(world.port, proxy_v2("192.0.2.8") + world.query) == b""
            assert status(await exchange(world.port, proxy_v2("198.51.100.7") + world.query)) == 200
        finally:
            held.close()
        with trio.fail_after(10):
            while world.open_connections != 0:  # noqa: ASYNC110
                await trio.sleep(0.01)
        assert status(await exchange(world.port, proxy_v1("192.0.2.7") + world.query)) == 200
        assert world.refused == 0  # refused for the limit, not for the header


# -- refusals ----------------------------------------------------------------------


@pytest.mark.parametrize("header", [proxy_v1("192.0.2.7"), proxy_v2("192.0.2.7")],
                         ids=["v1", "v2"])
async def test_a_header_from_an_address_not_allowed_is_refused(
    tmp_path: Path, header: bytes, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="notary.server.proxyprotocol")
    async with open_world(tmp_path) as world:
        assert await exchange(world.port, header + world.query, source=ELSEWHERE) == b""
        assert world.refused == 1
        # Without one, the same address is served; so is a request whose
        # first bytes could have begun a header ("P" of POST, sent alone).
        assert status(await exchange(world.port, world.query, source=ELSEWHERE)) == 200
        post = f"POST /target/{SITE}+{world.site.port} HTTP/1.0\r\nContent-Length: 0\r\n\r\n"
        sock = trio.socket.socket()
        await sock.bind((ELSEWHERE, 0))
        await sock.connect((LOCALHOST, world.port))
        async with trio.SocketStream(sock) as stream:
            await stream.send_all(b"P")
            await trio.sleep(0.05)
            await stream.send_all(post[1:].encode())
            answer = b""
            while chunk := await stream.receive_some(65536):
                answer += chunk
        assert status(answer) in (200, 400)  # answered: no fingerprint in the form is a 400
        assert world.refused == 1
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG] == [
        "PROXY protocol: closed a connection from an address not in [server] "
        "proxy_protocol_from that began with a PROXY header"
    ]  # no client address in a log line


#: What an edge might send instead of a valid header.
BAD_HEADERS = {
    "none": b"",  # the request alone
    "v2-oversized": V2_SIGNATURE + b"\x21\x11\xff\xff",  # 65,551 bytes declared
    "v2-over-536": V2_SIGNATURE + b"\x21\x11\x02\x09" + b"\0" * 521,
    "v2-bad-signature": b"\r\n\r\n\x00\r\nQUIT\r\x21\x11\x00\x0c" + b"\0" * 12,
    "v2-version-1": V2_SIGNATURE + b"\x11\x11\x00\x0c" + b"\0" * 12,
    "v2-command-2": V2_SIGNATURE + b"\x22\x11\x00\x0c" + b"\0" * 12,
    "v2-udp": V2_SIGNATURE + b"\x21\x12\x00\x0c" + b"\0" * 12,
    "v2-short-block": V2_SIGNATURE + b"\x21\x21\x00\x0c" + b"\0" * 12,
    "v1-garbage-address": b"PROXY TCP4 192.0.2.300 192.0.2.1 1 2\r\n",
    "v1-garbage-port": b"PROXY TCP4 192.0.2.3 192.0.2.1 01 2\r\n",
    "v1-garbage-family": b"PROXY TCP9 192.0.2.3 192.0.2.1 1 2\r\n",
    "v1-bare-lf": b"PROXY TCP4 192.0.2.3 192.0.2.1 1 2\n",
    "v1-no-crlf": b"PROXY TCP4 " + b"9" * 120,
    "v1-binary": b"PROXY \x00\xff\x10\r\n",
}


@pytest.mark.parametrize("name", BAD_HEADERS)
async def test_an_edge_without_a_valid_header_is_refused(
    tmp_path: Path, name: str, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="notary.server.proxyprotocol")
    async with open_world(tmp_path) as world:
        assert await exchange(world.port, BAD_HEADERS[name] + world.query) == b""
        assert world.refused == 1
        [logged] = [r.getMessage() for r in caplog.records if r.name.endswith("proxyprotocol")]
        assert logged.startswith(f"PROXY protocol: closed a connection from the edge {EDGE} (")
        assert status(await exchange(world.port, proxy_v2("192.0.2.7") + world.query)) == 200


@pytest.mark.parametrize("header", [proxy_v1("192.0.2.7"), proxy_v2("192.0.2.7")],
                         ids=["v1", "v2"])
async def test_a_header_a_byte_a_second_is_cut_at_the_head_timeout(
    tmp_path: Path, header: bytes, autojump_clock: trio.testing.MockClock,
) -> None:
    assert len(header) > HEADER_TIMEOUT_S + 2  # so it cannot be whole in time
    async with open_world(tmp_path) as world:
        sock = trio.socket.socket()
        await sock.connect((LOCALHOST, world.port))
        start = trio.current_time()
        sent = 0
        async with trio.SocketStream(sock) as stream:
            try:
                for byte in header + world.query:
                    await stream.send_all(bytes([byte]))
                    sent += 1
                    await trio.sleep(1.0)
                answer = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                answer = b""
        # Cut without an answer before the header was whole, soon after the
        # timeout (a send fails once the notary has closed: a reset).
        assert answer == b""
        assert sent < len(header)
        assert trio.current_time() - start <= HEADER_TIMEOUT_S + 3
        assert world.refused == 1
        assert world.open_connections == 0


# -- socket faults -------------------------------------------------------------------


def surfaces(world: World) -> dict[str, Surface]:
    """The plain API listener as the faults see it: the edge's connections
    (each request after a header) and another client's (no header)."""
    query = world.query.replace(b"HTTP/1.0", b"HTTP/1.1\r\nHost: notary", 1)
    form = (f"POST /target/{SITE}+{world.site.port} HTTP/1.1\r\nHost: notary\r\n"
            f"Content-Length: 71\r\n\r\nfingerprint={':'.join(['AB'] * 20)}\r\n").encode()
    v1, v2 = proxy_v1("192.0.2.7"), proxy_v2("192.0.2.7")
    return {
        "edge-v1": Surface("edge-v1", world.port, v1 + query, post=v1 + form),
        "edge-v2": Surface("edge-v2", world.port, v2 + query, post=v2 + form),
        "elsewhere": Surface("elsewhere", world.port, query, post=form, source=ELSEWHERE),
    }


#: The v2 header holds "\r\n\r\n", where the HTTP faults split a request's
#: head from its body: those faults go with the v1 header only.
FAULTS = {
    "edge-v1": client_faults(http=True),
    "edge-v2": client_faults(),
    "elsewhere": client_faults(http=True),
}
MATRIX = fault_matrix(FAULTS)


@pytest.mark.parametrize(("surface", "fault"), MATRIX)
async def test_a_fault_ends_only_its_own_connection(
    tmp_path: Path, surface: str, fault: ClientFault, caplog: pytest.LogCaptureFixture,
    autojump_clock: trio.testing.MockClock,
) -> None:
    caplog.set_level(logging.ERROR)
    held: list[Injected] = []
    try:
        async with open_world(tmp_path) as world:
            target = surfaces(world)[surface]
            for _ in range(3):
                held.append(await apply(fault, target))
            await assert_listener_answers(world)
            await assert_connections_return_to_zero(world)
    finally:
        for injected in held:
            injected.close()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


@pytest.mark.parametrize("header", [proxy_v1("192.0.2.7"), proxy_v2("192.0.2.7")],
                         ids=["v1", "v2"])
@pytest.mark.parametrize("end", ["reset", "half-close", "stall"])
async def test_an_edge_that_stops_inside_its_header(
    tmp_path: Path, header: bytes, end: str, caplog: pytest.LogCaptureFixture,
    autojump_clock: trio.testing.MockClock,
) -> None:
    caplog.set_level(logging.ERROR)
    async with open_world(tmp_path) as world:
        for cut in (1, 5, 13, len(header) - 1):
            partial = Surface("edge", world.port, header[:cut])
            client = await apply_partial(partial, end)
            client.close()
        await assert_listener_answers(world)
        await assert_connections_return_to_zero(world)
        assert world.refused == 4
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def apply_partial(surface: Surface, end: str) -> trio.socket.SocketType:
    """Send ``surface.request`` (part of a header), then reset, half-close
    and read to the end, or wait (the notary's head timeout ends it)."""
    sock = trio.socket.socket()
    await sock.connect((surface.host, surface.port))
    await sock.send(surface.request)
    await trio.sleep(0.1)
    if end == "reset":
        reset(sock)
        return sock
    if end == "half-close":
        sock.shutdown(trio.socket.SHUT_WR)
    with trio.fail_after(HEADER_TIMEOUT_S + 5):
        while await sock.recv(65536):
            pass
    return sock


async def assert_listener_answers(world: World) -> None:
    assert status(await exchange(world.port, proxy_v2("192.0.2.7") + world.query)) == 200
    assert status(await exchange(world.port, proxy_v1("192.0.2.7") + world.query)) == 200
    assert status(await exchange(world.port, world.query, source=ELSEWHERE)) == 200


async def assert_connections_return_to_zero(world: World) -> None:
    with trio.move_on_after(CONNECTIONS_GONE_WITHIN_S):
        while world.open_connections:  # noqa: ASYNC110 (a counter, no event)
            await trio.sleep(1.0)
    assert world.open_connections == 0
