"""Timeouts of one HTTP connection (``serve_http_connection``), on Trio's
autojump clock: the head deadline (408), the keep-alive idle close, the send
deadline for a client that does not read, and no deadline on the handler.
The watchdog's timeouts are coarse: each fires between its nominal time and
``MAX_LATENESS_S`` after it, never before (``on_time``); the linger after an
error answer is exact."""

from __future__ import annotations

import socket
from math import inf

import trio
import trio.testing

from notary.config import HttpConfig
from notary.protocol.http import Request, parse_response
from notary.server.connection import MAX_LATENESS_S, Watchdog, serve_http_connection
from notary.server.sockstream import SocketStream

LIMITS = HttpConfig(header_timeout_s=10.0, keepalive_timeout_s=30.0, send_timeout_s=5.0)
GET = b"GET / HTTP/1.1\r\nHost: n\r\n\r\n"


def on_time(elapsed: float, nominal: float) -> bool:
    """Whether a coarse timeout that should fire ``nominal`` seconds after
    something fired ``elapsed`` seconds after it: not early, at most
    ``MAX_LATENESS_S`` late."""
    return nominal <= elapsed <= nominal + MAX_LATENESS_S


def make_handler(calls: list[float], body: bytes = b"hello", sleep_s: float = 0.0):
    async def handler(request: Request) -> tuple[bytes, bool]:
        calls.append(trio.current_time())
        if sleep_s:
            await trio.sleep(sleep_s)
        head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n" % len(body)
        head += b"Connection: keep-alive\r\n\r\n" if request.keep_alive else b"Connection: close\r\n\r\n"
        return head + body, request.keep_alive

    return handler


async def read_until_closed(stream: trio.abc.Stream) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and when it closed."""
    data = b""
    while chunk := await stream.receive_some(65536):
        data += chunk
    return data, trio.current_time()


async def read_response(stream: trio.abc.Stream, length: int) -> bytes:
    data = b""
    while len(data) < length:
        chunk = await stream.receive_some(65536)
        assert chunk, "closed early"
        data += chunk
    return data


async def test_a_slow_head_gets_408_on_time(autojump_clock: trio.testing.MockClock) -> None:
    client, server = trio.testing.memory_stream_pair()
    calls: list[float] = []
    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        nursery.start_soon(serve_http_connection, server, make_handler(calls), LIMITS)
        # Drip one byte a second: the head deadline does not move.
        for byte in GET[:8]:
            await client.send_all(bytes([byte]))
            await trio.sleep(1.0)
        data, closed_at = await read_until_closed(client)
    assert parse_response(data).status == 408
    # Answered at the head deadline, then the notary lingers (a memory
    # stream has no half-close) until the client has sent nothing for
    # linger_idle_s.
    assert on_time(closed_at - start, LIMITS.header_timeout_s + LIMITS.linger_idle_s)
    assert calls == []


async def test_a_later_slow_head_gets_408_on_time(autojump_clock: trio.testing.MockClock) -> None:
    client, server = trio.testing.memory_stream_pair()
    calls: list[float] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_http_connection, server, make_handler(calls), LIMITS)
        await client.send_all(GET)
        await read_response(client, 10)
        await trio.sleep(20.0)  # idle, within the keep-alive timeout
        await client.send_all(b"GET / HT")
        started = trio.current_time()
        data, closed_at = await read_until_closed(client)
    assert b"408 Request Timeout" in data
    assert on_time(closed_at - started, LIMITS.header_timeout_s + LIMITS.linger_idle_s)
    assert len(calls) == 1


async def test_idle_keep_alive_is_closed_on_time(autojump_clock: trio.testing.MockClock) -> None:
    client, server = trio.testing.memory_stream_pair()
    calls: list[float] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_http_connection, server, make_handler(calls), LIMITS)
        # Each request restarts the idle timer: 25 s gaps keep it open.
        for _ in range(3):
            await client.send_all(GET)
            first = await client.receive_some(65536)
            assert first.startswith(b"HTTP/1.1 200 OK")
            answered_at = trio.current_time()
            await trio.sleep(25.0)
        data, closed_at = await read_until_closed(client)
    assert data == b""  # closed without an answer
    assert on_time(closed_at - answered_at, LIMITS.keepalive_timeout_s)
    assert len(calls) == 3


async def test_the_first_request_has_the_head_deadline(autojump_clock: trio.testing.MockClock) -> None:
    client, server = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        nursery.start_soon(serve_http_connection, server, make_handler([]), LIMITS)
        data, closed_at = await read_until_closed(client)
    assert data == b""  # nothing received: nothing to answer
    assert on_time(closed_at - start, LIMITS.header_timeout_s)


async def test_a_client_that_never_reads_is_dropped_within_the_send_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    client, server = trio.testing.lockstep_stream_pair()
    finished: list[float] = []

    async def serve() -> None:
        await serve_http_connection(server, make_handler([], body=b"x" * 100_000), LIMITS)
        finished.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        await client.send_all(GET)
        sent_at = trio.current_time()
        await trio.sleep(LIMITS.send_timeout_s * 10)  # never reads
        assert finished, "the connection was not dropped"
        nursery.cancel_scope.cancel()
    assert on_time(finished[0] - sent_at, LIMITS.send_timeout_s)


async def test_a_held_answer_is_released_once_sent_or_when_the_connection_ends(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A handler's third member (the log pages' release of the bytes they
    hold for a slow reader) is called once: after the send, or when the
    connection is dropped in the middle of it."""
    released: list[bytes] = []

    def holding(body: bytes):
        plain = make_handler([], body=body)

        async def handler(request: Request):
            response, keep_alive = await plain(request)
            return response, keep_alive, lambda: released.append(request.target)

        return handler

    client, server = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_http_connection, server, holding(b"small"), LIMITS)
        await client.send_all(GET)
        expected = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: keep-alive\r\n\r\nsmall"
        assert await read_response(client, len(expected)) == expected
        await trio.testing.wait_all_tasks_blocked()
        assert released == [b"/"]
        await client.aclose()
    assert released == [b"/"]

    released.clear()
    client, server = trio.testing.lockstep_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_http_connection, server, holding(b"x" * 100_000), LIMITS)
        await client.send_all(GET)
        await trio.sleep(1.0)  # never reads: the send waits
        assert released == []
        await trio.sleep(LIMITS.send_timeout_s * 2)  # dropped at the send deadline
        assert released == [b"/"]
        nursery.cancel_scope.cancel()
    assert released == [b"/"]


async def test_the_handler_runs_without_a_connection_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    client, server = trio.testing.memory_stream_pair()
    calls: list[float] = []
    slow = make_handler(calls, sleep_s=100.0)  # longer than every timeout
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_http_connection, server, slow, LIMITS)
        await client.send_all(GET + b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n")
        data, _ = await read_until_closed(client)
    assert data.count(b"HTTP/1.1 200 OK") == 2
    assert len(calls) == 2


async def test_a_protocol_error_is_answered_and_closed(autojump_clock: trio.testing.MockClock) -> None:
    client, server = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_http_connection, server, make_handler([]), LIMITS)
        await client.send_all(b"GARBAGE\r\n\r\n")
        data, _ = await read_until_closed(client)
    assert parse_response(data).status == 400


async def test_after_an_error_the_connection_lingers_a_bounded_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A client that goes on sending after its request was refused gets the
    answer, its bytes are read and discarded (so closing does not reset the
    connection under the answer), and the connection closes
    ``linger_timeout_s`` after the answer however long the client goes on."""
    client, server = trio.testing.memory_stream_pair()
    calls: list[float] = []
    sent = 0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_http_connection, server, make_handler(calls), LIMITS)
        start = trio.current_time()
        await client.send_all(b"GET / HTTP/1.1\r\nX: " + b"v" * 9000 + b"\r\n")

        async def keep_sending() -> None:
            nonlocal sent
            try:
                while True:
                    await client.send_all(b"v" * 1000)
                    sent += 1000
                    await trio.sleep(0.01)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

        nursery.start_soon(keep_sending)
        data, closed_at = await read_until_closed(client)
        nursery.cancel_scope.cancel()
    assert parse_response(data).status == 431
    assert closed_at - start == LIMITS.linger_timeout_s
    assert sent >= 50_000  # the client sent throughout; nothing more was answered
    assert calls == []


async def test_a_client_that_closes_ends_the_linger_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    client, server = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        done = trio.Event()

        async def serve() -> None:
            await serve_http_connection(server, make_handler([]), LIMITS)
            done.set()

        nursery.start_soon(serve)
        start = trio.current_time()
        await client.send_all(b"BAD\x00 / HTTP/1.1\r\n\r\n")
        data = await client.receive_some(65536)
        await client.aclose()
        await done.wait()
    assert parse_response(data).status == 400
    assert trio.current_time() == start  # no linger once the client is gone


async def test_a_client_that_stops_sending_ends_the_linger_after_the_idle_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    client, server = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_http_connection, server, make_handler([]), LIMITS)
        start = trio.current_time()
        await client.send_all(b"GET / HTTP/1.1\r\nX: " + b"v" * 9000 + b"\r\n")
        await trio.sleep(0.2)
        await client.send_all(b"v" * 1000)  # within linger_idle_s: read, the linger goes on
        data, closed_at = await read_until_closed(client)
    assert parse_response(data).status == 431
    assert closed_at - start == 0.2 + LIMITS.linger_idle_s


async def test_a_head_completed_just_before_its_deadline_is_served(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Coarse, never early: the last byte of the head at 0.01 s before the
    deadline, on a connection opened between two sweeps, is answered."""
    client, server = trio.testing.memory_stream_pair()
    calls: list[float] = []
    async with trio.open_nursery() as nursery:
        watchdog = Watchdog()
        await nursery.start(watchdog.run)
        await trio.sleep(watchdog.tick_s * 0.6)  # the watchdog's clock is now stale
        start = trio.current_time()
        nursery.start_soon(serve_http_connection, server, make_handler(calls), LIMITS, None, None,
                           watchdog)
        await client.send_all(GET[:-1])
        await trio.sleep(LIMITS.header_timeout_s - 0.01)
        await client.send_all(GET[-1:])
        answer = await read_response(client, 10)
        assert answer.startswith(b"HTTP/1.1 200 OK")
        assert calls and calls[0] - start < LIMITS.header_timeout_s
        nursery.cancel_scope.cancel()


async def test_one_watchdog_times_out_each_connection_on_its_own(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Many connections under one watchdog: each idle one closes at its own
    keep-alive deadline, the busy ones stay, and a graceful stop closes the
    idle ones at once while a request in progress is answered first."""
    async with trio.open_nursery() as nursery:
        watchdog = Watchdog()
        await nursery.start(watchdog.run)
        pairs = [trio.testing.memory_stream_pair() for _ in range(6)]
        release = trio.Event()

        async def waits(request: Request) -> tuple[bytes, bool]:
            await release.wait()
            return await make_handler([])(request)

        start = trio.current_time()
        for index, (client, server) in enumerate(pairs):
            await trio.sleep(2.0)
            handler = waits if index == 5 else make_handler([])
            nursery.start_soon(serve_http_connection, server, handler, LIMITS, None, None,
                               watchdog)
            await client.send_all(GET)
            if index < 5:
                assert (await read_response(client, 10)).startswith(b"HTTP/1.1 200 OK")
        answered = trio.current_time()
        # The first connection (answered at start + 2 s) closes at its
        # keep-alive deadline; the later ones are still open then.
        data, closed_at = await read_until_closed(pairs[0][0])
        assert data == b"" and on_time(closed_at - (start + 2.0), LIMITS.keepalive_timeout_s)
        await pairs[4][0].send_all(GET)  # the fifth goes on: its idle timer restarts
        assert (await read_response(pairs[4][0], 10)).startswith(b"HTTP/1.1 200 OK")
        watchdog.stop()
        # Idle ones close at once; the one in its handler answers, then closes.
        stopped = trio.current_time()
        for client, _ in pairs[1:5]:
            data, closed_at = await read_until_closed(client)
            assert data == b"" and closed_at == stopped
        release.set()
        data, _ = await read_until_closed(pairs[5][0])
        assert data.startswith(b"HTTP/1.1 200 OK") and b"Connection: keep-alive" in data
        assert answered - start == 12.0
        nursery.cancel_scope.cancel()


async def test_a_handler_that_raises_is_a_500_and_the_connection_closes(
    autojump_clock: trio.testing.MockClock, caplog,
) -> None:
    """A bug in the application answers its request 500 (logged with the
    traceback) and closes that connection; the loop returns normally, so
    neither the listener nor the worker ends with it."""
    client, server = trio.testing.memory_stream_pair()

    async def broken(request: Request) -> tuple[bytes, bool]:
        raise RuntimeError("a bug")

    def broken_at_once(request: Request, client: bytes | None) -> None:
        if request.target == b"/at-once":
            raise KeyError("another bug")

    for target in (b"/", b"/at-once"):
        client, server = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_http_connection, server, broken, LIMITS, None, broken_at_once)
            await client.send_all(b"GET " + target + b" HTTP/1.1\r\nHost: n\r\n\r\n" + GET)
            data, _ = await read_until_closed(client)
        answer = parse_response(data)
        assert answer.status == 500 and answer.header(b"Connection") == b"close"
        assert data.count(b"HTTP/1.1") == 1  # the request behind it is not served
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 2 and all(r.exc_info for r in errors)
    assert "internal error answering GET" in errors[0].getMessage()


async def test_the_sweeper_wakes_a_late_connection_until_it_moves_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A wake may find the connection's task between two waits (it changes
    nothing then): each sweep wakes a connection past its deadline again,
    until it sets a new deadline or is no longer watched; a graceful stop
    wakes the idle ones at once and at each sweep after."""
    woken: list[str] = []
    async with trio.open_nursery() as nursery:
        watchdog = Watchdog()
        await nursery.start(watchdog.run)
        with (
            watchdog.watch(lambda: woken.append("late"), 1.0) as late,
            watchdog.watch(lambda: woken.append("busy"), 1.0) as busy,
            watchdog.watch(lambda: woken.append("idle"), 60.0) as idle,
        ):
            busy.deadline = inf  # in its handler
            idle.idle = True
            # Half-tick offsets: no sweep falls on the instant this task wakes
            # (at one instant, which runs first is not defined).
            await trio.sleep(1.0 + MAX_LATENESS_S + 2.5 * watchdog.tick_s)
            assert woken.count("late") >= 3 and set(woken) == {"late"}
            late.deadline = watchdog.deadline(60.0)  # it moved on
            woken.clear()
            await trio.sleep(2 * watchdog.tick_s)
            assert woken == []
            watchdog.stop()
            assert woken == ["idle"]
            await trio.sleep(2.5 * watchdog.tick_s)
            assert set(woken) == {"idle"} and len(woken) >= 3
        woken.clear()
        await trio.sleep(2 * watchdog.tick_s)
        assert woken == []  # no longer watched
        nursery.cancel_scope.cancel()


def socket_pair() -> tuple[SocketStream, socket.socket]:
    ours, theirs = socket.socketpair()
    theirs.settimeout(10)
    return SocketStream(ours), theirs


async def test_a_connection_on_our_own_stream_is_woken_where_it_waits() -> None:
    """The notary's streams are woken in their wait (``interrupt``), not
    cancelled: a stalled head still gets its 408 on the same stream, and an
    idle keep-alive connection closes at its deadline, never early. Real
    sockets and time (short timeouts)."""
    limits = HttpConfig(header_timeout_s=0.3, keepalive_timeout_s=0.4, send_timeout_s=1.0,
                        linger_idle_s=0.1)
    stalled, stalled_peer = socket_pair()
    idle, idle_peer = socket_pair()
    with stalled_peer, idle_peer, trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            start = trio.current_time()
            nursery.start_soon(serve_http_connection, stalled, make_handler([]), limits)
            nursery.start_soon(serve_http_connection, idle, make_handler([]), limits)
            stalled_peer.sendall(GET[:-2])
            idle_peer.sendall(GET)
            answered = await trio.to_thread.run_sync(stalled_peer.recv, 4096)
            assert parse_response(answered).status == 408
            assert trio.current_time() - start >= limits.header_timeout_s
            kept = await trio.to_thread.run_sync(idle_peer.recv, 4096)
            assert kept.startswith(b"HTTP/1.1 200 OK")  # answered at once, then idle
            assert await trio.to_thread.run_sync(idle_peer.recv, 4096) == b""
            assert trio.current_time() - start >= limits.keepalive_timeout_s
    assert stalled.closed and idle.closed
