"""Slow and stalling clients against a running notary, over real loopback
sockets, on Trio's autojump clock: the notary's deadlines (``[http]``
``header_timeout_s``, ``keepalive_timeout_s``, ``send_timeout_s``,
``tls_handshake_timeout_s``) are checked on the (virtual) clock, and no
test waits for them in real time. They are the watchdog's coarse timeouts
(issues 21 and 35): each fires between its nominal time and
``MAX_LATENESS_S`` after it, never before.

Loopback I/O between two tasks of one Trio run is ready as soon as it is
sent, so the clock only jumps when every task truly waits for a deadline.
The connection loop alone, over memory streams, is tested in
tests/test_connection.py; here it is the whole server: listeners, TLS,
routing and the application.

Covered here and nowhere else: slowloris heads on each listener, a slow
body, keep-alive held open with blank lines (a bug, fixed in
``notary.protocol.http``: invariant 5), a client that never reads (its
answers block the notary's sends), a silent or dripping TLS handshake,
many slow clients at once while others are served, and ``max_connections``.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

from notary.config import Endpoint
from notary.protocol.http import RequestReader
from notary.server.connection import MAX_LATENESS_S
from notary.state import crypto
from tests.support.notaries import NotaryUnderTest, client_context, open_notary
from tests.support.tls_targets import LOCALHOST

HEADER_S = 10.0
KEEPALIVE_S = 30.0
SEND_S = 5.0
LINGER_S = 1.0
HANDSHAKE_S = 4.0
LIMITS = {
    "header_timeout_s": HEADER_S,
    "keepalive_timeout_s": KEEPALIVE_S,
    "send_timeout_s": SEND_S,
    "tls_handshake_timeout_s": HANDSHAKE_S,
    "linger_timeout_s": LINGER_S,
}
INDEX = b"GET / HTTP/1.1\r\nHost: notary\r\n\r\n"
#: Answered 404 with keep-alive on every listener (the Perspectives index
#: page closes the connection).
MISSING = b"GET /missing HTTP/1.1\r\nHost: notary\r\n\r\n"
INDEX_10 = b"GET / HTTP/1.0\r\n\r\n"
LISTENERS = ("https", "plain", "perspectives")


@pytest.fixture(autouse=True)
def one_rsa_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every notary of this module gets the same RSA key: generating one
    costs a fifth of a second, and nothing here depends on the key."""
    monkeypatch.setattr(crypto, "generate_rsa_key", lambda *args, **kwargs: _RSA_KEY)


_RSA_KEY = crypto.generate_rsa_key()


@asynccontextmanager
async def open_slow_notary(tmp_path: Path, **http: object) -> AsyncIterator[NotaryUnderTest]:
    key_path = tmp_path / "perspectives.key"
    crypto.write_new_file(
        key_path, crypto.private_key_pem(crypto.generate_perspectives_key()), mode=0o600
    )
    async with open_notary(
        tmp_path / "notary",
        server={"plain_api": (Endpoint(LOCALHOST, 0),)},
        perspectives={"key_file": key_path, "listen": (Endpoint(LOCALHOST, 0),)},
        http={**LIMITS, **http},
        rescan={"enabled": False},
        # No background work ticking along with the virtual clock.
        admin={"listen": (), "metrics_interval_s": 3600.0},
        serve_bundle=True,
    ) as notary:
        yield notary


def port_of(notary: NotaryUnderTest, listener: str) -> int:
    running = notary.running
    return {
        "https": running.api, "plain": running.plain_api, "perspectives": running.perspectives
    }[listener][0].port


async def connect(notary: NotaryUnderTest, listener: str, *, rcvbuf: int = 0) -> trio.abc.Stream:
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    await sock.connect((LOCALHOST, port_of(notary, listener)))
    tcp = trio.SocketStream(sock)
    if listener != "https":
        return tcp
    stream = trio.SSLStream(tcp, client_context(), server_hostname=None, https_compatible=True)
    await stream.do_handshake()
    return stream


async def read_until_closed(stream: trio.abc.Stream) -> bytes:
    return (await read_timed(stream, trio.current_time()))[0]


async def read_timed(stream: trio.abc.Stream, since: float) -> tuple[bytes, float, float]:
    """Read until the server closes: the bytes, when the first arrived and
    when the connection closed (seconds after ``since``)."""
    data = b""
    answered = None
    try:
        while chunk := await stream.receive_some(65536):
            if answered is None:
                answered = trio.current_time() - since
            data += chunk
    except trio.BrokenResourceError:
        pass
    closed = trio.current_time() - since
    return data, closed if answered is None else answered, closed


def assert_answered_at_deadline(answered: float, closed: float) -> None:
    """The 408 comes at the head deadline; the connection closes at once
    (plain TCP: half-closed) or once the linger has ended (TLS: the notary
    reads what the client still sends, at most ``linger_timeout_s``)."""
    assert HEADER_S <= answered <= HEADER_S + MAX_LATENESS_S
    assert answered <= closed <= answered + LINGER_S + 0.01


async def read_one_answer(stream: trio.abc.Stream) -> bytes:
    """One complete answer (every answer of the notary has Content-Length)."""
    data = b""
    while True:
        head, found, body = data.partition(b"\r\n\r\n")
        if found:
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            if len(body) >= length:
                return data
        chunk = await stream.receive_some(65536)
        assert chunk, f"closed before a whole answer: {data!r}"
        data += chunk


async def send_quietly(stream: trio.abc.Stream, data: bytes) -> bool:
    try:
        await stream.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return False
    return True


# -- slowloris heads and bodies ----------------------------------------------------


@pytest.mark.parametrize("listener", LISTENERS)
async def test_a_dripped_head_gets_408_at_the_header_deadline(
    tmp_path: Path, listener: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_slow_notary(tmp_path) as notary:
        stream = await connect(notary, listener)
        async with stream:
            start = trio.current_time()
            # One byte a second until just before the deadline (bytes sent
            # after it would meet a closed socket: a reset, which can
            # destroy the 408 before it is read).
            for byte in INDEX[: int(HEADER_S)]:
                await stream.send_all(bytes([byte]))
                await trio.sleep(1.0)
            answer, answered, closed = await read_timed(stream, start)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert_answered_at_deadline(answered, closed)


@pytest.mark.parametrize("listener", ["https", "plain"])
async def test_a_dripped_body_gets_408_at_the_header_deadline(
    tmp_path: Path, listener: str, autojump_clock: trio.testing.MockClock
) -> None:
    """The deadline covers the whole request: a fast head does not buy a
    slow body more time."""
    body = b"fingerprint=" + b"AB:" * 19 + b"AB"
    head = b"POST /target/127.0.0.1+443 HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body)
    async with open_slow_notary(tmp_path) as notary:
        stream = await connect(notary, listener)
        async with stream:
            start = trio.current_time()
            await stream.send_all(head)
            for byte in body[: int(HEADER_S * 2) - 1]:  # two bytes a second
                await stream.send_all(bytes([byte]))
                await trio.sleep(0.5)
            answer, answered, closed = await read_timed(stream, start)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert_answered_at_deadline(answered, closed)


@pytest.mark.parametrize("listener", ["https", "plain"])
async def test_a_second_request_dripped_after_a_first_gets_408(
    tmp_path: Path, listener: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_slow_notary(tmp_path) as notary:
        stream = await connect(notary, listener)
        async with stream:
            await stream.send_all(INDEX)
            assert (await read_one_answer(stream)).startswith(b"HTTP/1.1 200 ")
            await trio.sleep(KEEPALIVE_S - 1)  # idle, within the keep-alive timeout
            started = trio.current_time()
            for byte in INDEX[: int(HEADER_S / 2)]:  # one byte every 2 s
                await stream.send_all(bytes([byte]))
                await trio.sleep(2.0)
            answer, answered, closed = await read_timed(stream, started)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert_answered_at_deadline(answered, closed)


@pytest.mark.parametrize("listener", LISTENERS)
async def test_blank_lines_do_not_hold_a_keep_alive_connection(
    tmp_path: Path, listener: str, autojump_clock: trio.testing.MockClock
) -> None:
    """Empty lines before a request line are skipped by the parser; they used
    to restart the keep-alive timer at each receive, so one ``\\r\\n`` every
    29 s held a connection for ever. They now start the head deadline."""
    async with open_slow_notary(tmp_path) as notary:
        stream = await connect(notary, listener)
        async with stream:
            await stream.send_all(MISSING)
            assert (await read_one_answer(stream)).startswith(b"HTTP/1.1 404 ")
            started = trio.current_time()
            answer = b""
            with trio.move_on_after(10 * KEEPALIVE_S):
                async with trio.open_nursery() as nursery:

                    async def drip() -> None:
                        for _ in range(20):
                            if not await send_quietly(stream, b"\r\n"):
                                return
                            await trio.sleep(KEEPALIVE_S / 2)

                    nursery.start_soon(drip)
                    answer, answered, closed = await read_timed(stream, started)
                    nursery.cancel_scope.cancel()
    # The first blank line starts the head deadline.
    assert_answered_at_deadline(answered, closed)
    assert answer.startswith(b"HTTP/1.1 408 ")


def test_the_reader_counts_blank_lines_as_the_start_of_a_request() -> None:
    reader = RequestReader()
    assert reader.feed(INDEX) and not reader.in_request
    assert reader.feed(b"\r\n") == [] and reader.in_request
    [request] = reader.feed(b"\r\n" + INDEX)
    assert request.target == b"/" and not reader.in_request
    assert RequestReader().feed(b"\r\n") == []


@pytest.mark.parametrize("listener", LISTENERS)
async def test_an_idle_keep_alive_connection_is_closed_at_its_deadline(
    tmp_path: Path, listener: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_slow_notary(tmp_path) as notary:
        stream = await connect(notary, listener)
        async with stream:
            await stream.send_all(MISSING)
            assert (await read_one_answer(stream)).startswith(b"HTTP/1.1 404 ")
            answered = trio.current_time()
            assert await read_until_closed(stream) == b""
            assert KEEPALIVE_S <= trio.current_time() - answered <= KEEPALIVE_S + MAX_LATENESS_S


# -- clients that do not read ----------------------------------------------------------

#: Requests pipelined by a client that never reads their answers (under the
#: notary's requests-per-connection bound), each answered with the bundle
#: file: far more bytes than the socket buffers between them hold.
PIPELINED = 500
BUNDLE = b"GET /test.notary HTTP/1.1\r\nHost: notary\r\n\r\n"


@pytest.mark.parametrize("listener", ["https", "plain"])
@pytest.mark.parametrize("wait", ["before", "after"])
async def test_a_client_that_never_reads_is_dropped_at_the_send_deadline(
    tmp_path: Path, listener: str, wait: str, autojump_clock: trio.testing.MockClock
) -> None:
    """Pipelined requests whose answers fill every buffer: the notary's send
    blocks, and the connection is dropped ``send_timeout_s`` later. Reading
    just before that gets every answer; just after, only those already
    buffered, then the end."""
    async with open_slow_notary(tmp_path) as notary:
        stream = await connect(notary, listener, rcvbuf=4096)
        async with stream:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(send_quietly, stream, BUNDLE * PIPELINED)
                await trio.sleep(
                    SEND_S - 0.01 if wait == "before" else SEND_S + MAX_LATENESS_S + 0.01
                )
                read_at = trio.current_time()
                data = b""
                try:
                    while data.count(b"HTTP/1.1 200 ") < PIPELINED:
                        chunk = await stream.receive_some(65536)
                        if not chunk:
                            break
                        data += chunk
                except trio.BrokenResourceError:
                    pass
                assert trio.current_time() == read_at  # no waiting on the notary
                nursery.cancel_scope.cancel()
    answers = data.count(b"HTTP/1.1 200 ")
    if wait == "before":
        assert answers == PIPELINED
    else:
        assert 0 < answers < PIPELINED / 4


# -- TLS handshakes ----------------------------------------------------------------------


async def test_a_silent_tls_client_is_dropped_at_the_handshake_deadline(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_slow_notary(tmp_path) as notary:
        tcp = await trio.open_tcp_stream(LOCALHOST, port_of(notary, "https"))
        async with tcp:
            start = trio.current_time()
            assert await read_until_closed(tcp) == b""
            assert HANDSHAKE_S <= trio.current_time() - start <= HANDSHAKE_S + MAX_LATENESS_S


async def test_a_dripped_client_hello_is_dropped_at_the_handshake_deadline(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A real ClientHello, one byte a second: closed at the handshake's
    deadline (seen by a reader beside the dripping writer)."""
    hello = _client_hello()
    async with open_slow_notary(tmp_path) as notary:
        tcp = await trio.open_tcp_stream(LOCALHOST, port_of(notary, "https"))
        async with tcp, trio.open_nursery() as nursery:
            start = trio.current_time()

            async def drip() -> None:
                for byte in hello:
                    if not await send_quietly(tcp, bytes([byte])):
                        return
                    await trio.sleep(1.0)

            nursery.start_soon(drip)
            _, _, closed = await read_timed(tcp, start)
            nursery.cancel_scope.cancel()
            assert len(hello) > HANDSHAKE_S + 1  # the drip outlasts the deadline
            assert HANDSHAKE_S <= closed <= HANDSHAKE_S + MAX_LATENESS_S


def _client_hello() -> bytes:
    """The bytes of a real TLS ClientHello."""
    outgoing = ssl.MemoryBIO()
    client = client_context().wrap_bio(ssl.MemoryBIO(), outgoing, server_hostname=None)
    with contextlib.suppress(ssl.SSLWantReadError):
        client.do_handshake()
    return outgoing.read()


# -- many slow clients at once -------------------------------------------------------------


async def test_many_slow_clients_do_not_stop_the_others(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Forty slowloris connections on each plain listener: all get 408 at
    the header deadline, and quick clients are answered meanwhile."""
    async with open_slow_notary(tmp_path) as notary:
        closed_at: list[float] = []

        async def slowloris(listener: str) -> None:
            stream = await connect(notary, listener)
            async with stream:
                await stream.send_all(INDEX[:5])
                answer = await read_until_closed(stream)
                assert answer.startswith(b"HTTP/1.1 408 ")
                closed_at.append(trio.current_time())

        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            for listener in ("plain", "perspectives") * 40:
                nursery.start_soon(slowloris, listener)
            await trio.sleep(HEADER_S / 2)
            for listener in LISTENERS:
                quick = await connect(notary, listener)
                async with quick:
                    await quick.send_all(INDEX_10)
                    assert (await read_until_closed(quick)).startswith(b"HTTP/1.1 200 ")
            assert trio.current_time() - start == pytest.approx(HEADER_S / 2, abs=0.01)
    assert len(closed_at) == 80
    assert all(HEADER_S <= t - start <= HEADER_S + MAX_LATENESS_S for t in closed_at)


async def test_connections_beyond_max_connections_are_closed_at_once(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_slow_notary(tmp_path, max_connections=4) as notary:
        idle = [await connect(notary, "plain") for _ in range(4)]
        for stream in idle:
            await stream.send_all(INDEX[:3])  # each holds its slot until 408
        await trio.sleep(1)
        extra = await connect(notary, "plain")
        async with extra:
            await send_quietly(extra, INDEX_10)
            start = trio.current_time()
            assert await read_until_closed(extra) == b""
            assert trio.current_time() - start < 0.01
        for stream in idle:
            assert (await read_until_closed(stream)).startswith(b"HTTP/1.1 408 ")
            await stream.aclose()
        await trio.sleep(0.1)  # the slots are released when the handlers return
        again = await connect(notary, "plain")
        async with again:
            await again.send_all(INDEX_10)
            assert (await read_until_closed(again)).startswith(b"HTTP/1.1 200 ")
