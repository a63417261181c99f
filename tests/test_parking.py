"""``notary.server.parking``: idle keep-alive HTTPS connections parked in
one epoll set, their fast-path requests answered there, everything else
handed back to the connection's task, which goes on as if it had received.

Real TLS over socket pairs, against Trio's own TLS client, and plain HTTP
(each test of both marked ``setup``), through ``serve_http_connection`` as
the listeners run it: the answers and their
order (hits, misses, pipelined, partial heads), each reason to hand a
connection back (a protocol error, the end, a reset, a response the socket
does not take, a closing answer, the last request allowed, a fast path
that raises), the timeouts and the graceful stop of a parked connection,
its task's cancellation, the end of ``Parking.run``, and a plain API
stream that must judge its first bytes before it parks. ``make test`` runs
them on both TLS drivers."""

from __future__ import annotations

import socket
import ssl
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest
import trio
import trio.testing

from notary.config import HttpConfig
from notary.protocol.http import Request
from notary.server.accept import ConnectionCounts
from notary.server.connection import MAX_LATENESS_S, Watchdog, serve_http_connection
from notary.server.parking import Parking
from notary.server.proxyprotocol import HeaderRefusingStream
from notary.server.sockstream import SocketStream
from notary.server.tlsstream import ServerContext, TlsStream
from tests.support.tls_pairs import server_and_client_contexts

LIMITS = HttpConfig(header_timeout_s=10.0, keepalive_timeout_s=30.0, send_timeout_s=5.0,
                    linger_idle_s=0.1, linger_timeout_s=1.0)


def get(path: str, *, close: bool = False) -> bytes:
    connection = b"Connection: close\r\n" if close else b""
    return b"GET %s HTTP/1.1\r\nHost: n\r\n%s\r\n" % (path.encode(), connection)


def response(body: bytes, keep_alive: bool) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: %s\r\n\r\n%s" % (
        len(body), b"keep-alive" if keep_alive else b"close", body,
    )


@dataclass
class App:
    """The fast path answers ``/hit...`` (``big`` bytes of body for
    ``/big``; it raises for ``/bug``), the handler the rest; both note
    what they answered."""

    fast: list[bytes] = field(default_factory=list)
    asked: list[bytes] = field(default_factory=list)
    slow: list[bytes] = field(default_factory=list)
    big: int = 4 * 1024 * 1024
    #: ``/gate`` waits for it in the handler.
    gate: trio.Event = field(default_factory=trio.Event)

    def answer_at_once(self, request: Request, client: bytes | None) -> tuple[bytes, bool] | None:
        self.asked.append(request.target)
        if request.target == b"/bug":
            raise RuntimeError("a bug in the fast path")
        if request.target == b"/big":
            self.fast.append(request.target)
            return response(b"x" * self.big, request.keep_alive), request.keep_alive
        if not request.target.startswith(b"/hit"):
            return None
        self.fast.append(request.target)
        return response(b"fast " + request.target, request.keep_alive), request.keep_alive

    async def handler(self, request: Request) -> tuple[bytes, bool]:
        if request.target == b"/bug":
            raise RuntimeError("a bug in the handler")
        if request.target == b"/gate":
            await self.gate.wait()
        self.slow.append(request.target)
        return response(b"slow " + request.target, request.keep_alive), request.keep_alive


@pytest.fixture(scope="module")
def contexts() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    return server_and_client_contexts()


@dataclass
class Setup:
    """How ``serving`` connects: TLS with ``contexts``, or plain HTTP."""

    contexts: tuple[ssl.SSLContext, ssl.SSLContext]
    plain: bool


@pytest.fixture(params=["tls", "plain"])
def setup(request, contexts) -> Setup:
    return Setup(contexts, request.param == "plain")


@dataclass
class Served:
    client: trio.abc.Stream
    raw: socket.socket  # the client's socket, for resets
    stream: TlsStream | SocketStream
    parking: Parking
    watchdog: Watchdog
    app: App
    done: trio.Event
    task: trio.CancelScope


@asynccontextmanager
async def serving(
    setup: Setup, *, app: App | None = None, limits: HttpConfig = LIMITS,
    parking_runs: bool = True, beside: Served | None = None,
    stream_of: Callable[[socket.socket], SocketStream] = SocketStream,
) -> AsyncIterator[Served]:
    """One connection served as an HTTPS (or, ``setup.plain``, a plain HTTP)
    listener serves it (plain: on ``stream_of``'s stream), with a running
    ``Parking`` (unless ``parking_runs`` is false; ``beside``'s, with its
    watchdog, when given), its client handshaken."""
    server_context, client_context = setup.contexts
    app = app if app is not None else App()
    watchdog = beside.watchdog if beside is not None else Watchdog()
    parking = beside.parking if beside is not None else Parking(watchdog)
    ours, theirs = socket.socketpair()
    transport = trio.SocketStream(trio.socket.from_stdlib_socket(theirs))
    stream: TlsStream | SocketStream
    client: trio.abc.Stream
    if setup.plain:
        stream, client = stream_of(ours), transport
    else:
        stream = TlsStream(ours, ServerContext(server_context))
        client = trio.SSLStream(transport, client_context, server_hostname="localhost")
    done = trio.Event()
    task = trio.CancelScope()

    async def serve() -> None:
        with task:
            await serve_http_connection(
                stream, app.handler, limits, None, app.answer_at_once, watchdog, None,
                tls_counts=None if setup.plain else ConnectionCounts(), parking=parking,
            )
        done.set()

    async with trio.open_nursery() as nursery:
        if beside is None:
            await nursery.start(watchdog.run)
            if parking_runs:
                await nursery.start(parking.run)
        nursery.start_soon(serve)
        if isinstance(client, trio.SSLStream):
            await client.do_handshake()
        yield Served(client, theirs, stream, parking, watchdog, app, done, task)
        nursery.cancel_scope.cancel()


async def read_exactly(stream: trio.abc.Stream, length: int) -> bytes:
    data = b""
    while len(data) < length:
        chunk = await stream.receive_some(65536)
        assert chunk, f"closed after {len(data)} of {length} bytes"
        data += chunk
    return data


async def ask(served: Served, *requests: bytes) -> None:
    """Send ``requests`` in one write."""
    await served.client.send_all(b"".join(requests))


async def expect(served: Served, *answers: bytes) -> None:
    expected = b"".join(answers)
    assert await read_exactly(served.client, len(expected)) == expected


async def closed_by_server(client: trio.abc.Stream) -> bytes:
    """What the server sent before it closed (a reset counts as a close)."""
    data = b""
    try:
        while chunk := await client.receive_some(65536):
            data += chunk
    except trio.BrokenResourceError:
        pass
    return data


async def hit_then_park(served: Served) -> None:
    """A first hit answered, and the connection parked after it."""
    await ask(served, get("/hit/1"))
    await expect(served, response(b"fast /hit/1", True))
    await parked(served)


async def parked(served: Served, count: int = 1) -> None:
    """Wait until ``count`` connections are parked."""
    await parked_in(served.parking, count)


async def parked_in(parking: Parking, count: int) -> None:
    with trio.fail_after(10):
        while parking.parked != count:  # noqa: ASYNC110 (a count, no event to wait on)
            await trio.sleep(0.001)


async def test_keep_alive_hits_are_answered_while_the_connection_is_parked(setup) -> None:
    with trio.fail_after(20):
        async with serving(setup) as served:
            for index in range(50):
                await ask(served, get(f"/hit/{index}"))
                await expect(served, response(b"fast /hit/%d" % index, True))
            await parked(served)
            assert served.parking.served == 50
            assert served.parking.handed_back == 0
            assert served.app.slow == []


async def test_a_request_the_fast_path_leaves_is_handed_to_the_task_which_parks_again(
    setup,
) -> None:
    with trio.fail_after(20):
        async with serving(setup) as served:
            for path in ("/hit/1", "/slow/1", "/hit/2", "/slow/2", "/hit/3"):
                await ask(served, get(path))
                kind = b"fast" if path.startswith("/hit") else b"slow"
                await expect(served, response(kind + b" " + path.encode(), True))
            await parked(served)
            assert served.app.slow == [b"/slow/1", b"/slow/2"]
            assert served.parking.served == 3
            assert served.parking.handed_back == 2
            # The fast path was asked once for each (not again by the task).
            assert served.app.asked == [b"/hit/1", b"/slow/1", b"/hit/2", b"/slow/2", b"/hit/3"]


async def test_pipelined_requests_are_answered_in_order(setup) -> None:
    with trio.fail_after(20):
        async with serving(setup) as served:
            await ask(served, get("/hit/1"), get("/slow/1"), get("/hit/2"), get("/hit/3"))
            await expect(
                served, response(b"fast /hit/1", True), response(b"slow /slow/1", True),
                response(b"fast /hit/2", True), response(b"fast /hit/3", True),
            )
            # The first hit was answered parked; the rest by the task.
            assert served.parking.served == 1
            assert served.app.fast == [b"/hit/1", b"/hit/2", b"/hit/3"]
            assert served.app.asked == [b"/hit/1", b"/slow/1", b"/hit/2", b"/hit/3"]
            await ask(served, get("/hit/4"), get("/hit/5"))
            await expect(served, response(b"fast /hit/4", True), response(b"fast /hit/5", True))
            await parked(served)


async def test_a_partial_head_is_finished_by_the_task(setup) -> None:
    with trio.fail_after(20):
        async with serving(setup) as served:
            request = get("/hit/1")
            await parked(served)
            await ask(served, request[:10])
            await parked(served, 0)  # handed back with the head begun
            await ask(served, request[10:])
            await expect(served, response(b"fast /hit/1", True))
            assert served.parking.served == 0
            await parked(served)


async def test_a_stalled_head_after_parking_gets_408_on_time(
    setup, autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving(setup) as served:
        await ask(served, get("/hit/1"))
        await expect(served, response(b"fast /hit/1", True))
        await parked(served)
        await ask(served, get("/hit/2")[:12])
        sent_at = trio.current_time()
        answer = await closed_by_server(served.client)
        elapsed = trio.current_time() - sent_at
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert LIMITS.header_timeout_s <= elapsed <= LIMITS.header_timeout_s + MAX_LATENESS_S + 1.0


async def test_a_parked_connection_idle_past_its_keep_alive_is_closed_on_time(
    setup, autojump_clock: trio.testing.MockClock,
) -> None:
    async with serving(setup) as served:
        # Each request answered parked restarts the idle timer.
        for index in range(3):
            await ask(served, get(f"/hit/{index}"))
            await expect(served, response(b"fast /hit/%d" % index, True))
            answered_at = trio.current_time()
            await trio.sleep(LIMITS.keepalive_timeout_s - 5)
        assert served.parking.served == 3
        assert await closed_by_server(served.client) == b""
        closed_at = trio.current_time()
        await served.done.wait()
        assert served.parking.parked == 0
    idle = closed_at - answered_at
    assert LIMITS.keepalive_timeout_s <= idle <= LIMITS.keepalive_timeout_s + MAX_LATENESS_S + 1.0


async def test_a_graceful_stop_closes_a_parked_connection_at_once(setup) -> None:
    with trio.fail_after(20):
        async with serving(setup) as served:
            await hit_then_park(served)
            served.watchdog.stop()
            assert await closed_by_server(served.client) == b""
            await served.done.wait()
            assert served.parking.parked == 0


async def test_a_parked_task_cancelled_leaves_the_parking(setup) -> None:
    with trio.fail_after(20):
        async with serving(setup) as served:
            await parked(served)
            served.task.cancel()
            await served.done.wait()
            assert served.parking.parked == 0
            assert served.stream.closed
            # The parking serves on: another connection parks and is answered.
            async with serving(setup) as other:
                await ask(other, get("/hit/2"))
                await expect(other, response(b"fast /hit/2", True))


async def test_without_a_running_parking_the_task_receives_itself(setup) -> None:
    with trio.fail_after(20):
        async with serving(setup, parking_runs=False) as served:
            for index in range(3):
                await ask(served, get(f"/hit/{index}"))
                await expect(served, response(b"fast /hit/%d" % index, True))
            assert served.parking.parked == 0 and served.parking.served == 0
            assert served.app.fast == [b"/hit/0", b"/hit/1", b"/hit/2"]


async def _run_in(scope: trio.CancelScope, parking: Parking) -> None:
    with scope:
        await parking.run()


async def test_the_end_of_run_wakes_the_parked_connections(contexts) -> None:
    """``run`` cancelled with a connection parked: the connection is handed
    back woken, and its task closes it (as at a graceful stop)."""
    with trio.fail_after(20):
        server_context, client_context = contexts
        app = App()
        watchdog = Watchdog()
        parking = Parking(watchdog)
        ours, theirs = socket.socketpair()
        stream = TlsStream(ours, ServerContext(server_context))
        client = trio.SSLStream(
            trio.SocketStream(trio.socket.from_stdlib_socket(theirs)), client_context,
            server_hostname="localhost",
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(watchdog.run)
            parking_scope = trio.CancelScope()
            nursery.start_soon(_run_in, parking_scope, parking)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(
                lambda: serve_http_connection(
                    stream, app.handler, LIMITS, None, app.answer_at_once, watchdog, None,
                    tls_counts=ConnectionCounts(), parking=parking,
                )
            )
            await client.do_handshake()
            await parked_in(parking, 1)
            parking_scope.cancel()
            assert await closed_by_server(client) == b""
            assert parking.handed_back == 1
            nursery.cancel_scope.cancel()
        assert stream.closed


async def test_a_protocol_error_while_parked_is_answered(setup) -> None:
    with trio.fail_after(20):
        async with serving(setup) as served:
            await parked(served)
            await ask(served, b"NOT HTTP AT ALL\r\n\r\n")
            answer = await closed_by_server(served.client)
            await served.done.wait()
    assert answer.startswith(b"HTTP/1.1 400 ")


async def test_a_client_that_closes_while_parked_ends_the_connection(setup) -> None:
    with trio.fail_after(20):
        async with serving(setup) as served:
            await hit_then_park(served)
            await served.client.aclose()
            await served.done.wait()
            assert served.parking.parked == 0
            assert served.stream.closed


async def test_a_client_that_resets_while_parked_ends_the_connection(setup) -> None:
    with trio.fail_after(20):
        async with serving(setup) as served:
            await parked(served)
            served.raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            served.raw.close()
            await served.done.wait()
            assert served.parking.parked == 0


async def test_an_answer_that_closes_is_sent_then_the_connection_closed(setup) -> None:
    with trio.fail_after(20):
        async with serving(setup) as served:
            await parked(served)
            await ask(served, get("/hit/last", close=True), get("/hit/never"))
            answer = await closed_by_server(served.client)
            await served.done.wait()
            assert answer == response(b"fast /hit/last", False)
            assert served.app.fast == [b"/hit/last"]


async def test_the_last_request_allowed_is_answered_by_the_task_with_close(setup) -> None:
    limits = HttpConfig(max_requests_per_connection=3)
    with trio.fail_after(20):
        async with serving(setup, limits=limits) as served:
            await ask(served, get("/hit/1"))
            await expect(served, response(b"fast /hit/1", True))
            await ask(served, get("/hit/2"))
            await expect(served, response(b"fast /hit/2", True))
            await ask(served, get("/hit/3"))
            answer = await closed_by_server(served.client)
            assert answer == response(b"fast /hit/3", False)
            assert served.parking.served == 2


async def test_a_fast_path_that_raises_is_a_500_from_the_task(setup, caplog) -> None:
    with trio.fail_after(20):
        async with serving(setup) as served:
            await hit_then_park(served)
            await ask(served, get("/bug"))
            answer = await closed_by_server(served.client)
            await served.done.wait()
    assert answer.startswith(b"HTTP/1.1 500 ")
    assert "internal error answering GET" in caplog.text


async def test_a_client_that_never_reads_is_dropped_and_others_are_served(
    setup, autojump_clock: trio.testing.MockClock,
) -> None:
    """A response the socket does not take at once is handed to the task,
    which sends it under its send deadline; meanwhile the parking answers
    the other connections."""
    async with serving(setup) as stuck, serving(setup, beside=stuck) as other:
        await parked(stuck, 2)
        await ask(stuck, get("/big"))
        asked_at = trio.current_time()
        await parked(stuck, 1)  # handed back with its answer unsent
        assert stuck.parking.handed_back == 1
        for index in range(5):
            await ask(other, get(f"/hit/{index}"))
            await expect(other, response(b"fast /hit/%d" % index, True))
        await stuck.done.wait()
        dropped_after = trio.current_time() - asked_at
        assert stuck.parking.served == 6
    assert LIMITS.send_timeout_s <= dropped_after <= LIMITS.send_timeout_s + MAX_LATENESS_S + 1.0


class HeldStream(trio.abc.Stream):
    """A client's transport that, once ``holding``, holds what it is given
    to send until ``flush``: TLS records sent one by one reach the server
    in one write."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner
        self.holding = False
        self.held = b""

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if not self.holding:
            await self.inner.send_all(data)
            return
        self.held += bytes(data)
        await trio.lowlevel.checkpoint()

    async def flush(self) -> None:
        held, self.held = self.held, b""
        await self.inner.send_all(held)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_records_openssl_read_ahead_are_answered_before_parking(contexts) -> None:
    """Two requests in two TLS records that reach the socket in one write:
    the compiled driver reads both records at once and returns the first;
    the second, held by OpenSSL where epoll cannot see it, must be answered
    before the connection parks (again), whether the parking or the task
    read them (else it waits for the keep-alive timeout)."""
    server_context, client_context = contexts
    app = App()
    watchdog = Watchdog()
    parking = Parking(watchdog)
    ours, theirs = socket.socketpair()
    stream = TlsStream(ours, ServerContext(server_context))
    held = HeldStream(trio.SocketStream(trio.socket.from_stdlib_socket(theirs)))
    client = trio.SSLStream(held, client_context, server_hostname="localhost")
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(watchdog.run)
            await nursery.start(parking.run)
            nursery.start_soon(
                lambda: serve_http_connection(
                    stream, app.handler, LIMITS, None, app.answer_at_once, watchdog, None,
                    tls_counts=ConnectionCounts(), parking=parking,
                )
            )
            await client.do_handshake()
            held.holding = True
            await parked_in(parking, 1)
            # Read by the parking.
            await client.send_all(get("/hit/a"))
            await client.send_all(get("/hit/b"))
            await held.flush()
            expected = response(b"fast /hit/a", True) + response(b"fast /hit/b", True)
            assert await read_exactly(client, len(expected)) == expected
            assert parking.served == 2
            # Read by the task: a head begun is handed to it; the records
            # ending it and of the next request come together.
            await client.send_all(get("/hit/c")[:10])
            await held.flush()
            await parked_in(parking, 0)
            await client.send_all(get("/hit/c")[10:])
            await client.send_all(get("/hit/d"))
            await held.flush()
            expected = response(b"fast /hit/c", True) + response(b"fast /hit/d", True)
            assert await read_exactly(client, len(expected)) == expected
            await parked_in(parking, 1)
            nursery.cancel_scope.cancel()


async def test_a_stale_wake_of_an_earlier_parking_changes_nothing(setup) -> None:
    """A watchdog wake kept from an earlier parking of a connection (the same
    file descriptor, parked again) must not hand the new parking back."""
    with trio.fail_after(20):
        async with serving(setup) as served:
            await parked(served)
            (watched,) = served.watchdog._watched
            stale_wake = watched.wake
            await ask(served, get("/slow/1"))  # handed back, answered, parked again
            await expect(served, response(b"slow /slow/1", True))
            await parked(served)
            handed_back = served.parking.handed_back
            stale_wake()
            assert served.parking.parked == 1
            assert served.parking.handed_back == handed_back
            await ask(served, get("/hit/1"))
            await expect(served, response(b"fast /hit/1", True))


async def test_a_socket_closed_under_a_parked_connection_does_not_end_the_parking(
    setup,
) -> None:
    """A parked connection's socket closed by someone else has left the
    epoll set already: handing the connection back must not fail, and the
    parking serves on."""
    with trio.fail_after(20):
        async with serving(setup) as served, serving(setup, beside=served) as other:
            await parked(served, 2)
            served.stream.close()  # under the parked task
            served.watchdog.stop()  # wakes every parked connection
            await served.done.wait()
            await other.done.wait()
            assert served.parking.running and served.parking.parked == 0


async def test_a_proxy_refusing_stream_parks_only_once_its_first_bytes_are_judged(
    contexts,
) -> None:
    """A plain API connection from an address not allowed to send a PROXY
    header is refused if its first bytes begin one: those bytes are read in
    its task, never parked; after them it parks like any other."""
    counts = ConnectionCounts()
    plain = Setup(contexts, plain=True)
    with trio.fail_after(20):
        async with serving(
            plain, stream_of=lambda sock: HeaderRefusingStream(sock, "127.0.0.1", counts),
        ) as served:
            await trio.testing.wait_all_tasks_blocked()
            assert served.parking.parked == 0
            await hit_then_park(served)
            await ask(served, get("/hit/2"))
            await expect(served, response(b"fast /hit/2", True))
            assert served.parking.served == 1
        async with serving(
            plain, stream_of=lambda sock: HeaderRefusingStream(sock, "127.0.0.1", counts),
        ) as refused:
            await ask(refused, b"PROXY TCP4 192.0.2.1 127.0.0.1 1 2\r\n" + get("/hit/3"))
            assert await closed_by_server(refused.client) == b""
            await refused.done.wait()
    assert counts.proxy_refused == 1
