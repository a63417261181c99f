"""``notary.server.accept.serve_socket``: every queued connection is taken
in one wake-up, handlers own their streams, capacity errors pause and
retry, and the listening socket is closed on cancellation."""

from __future__ import annotations

import errno
import socket
import ssl
import struct
from collections.abc import Callable

import pytest
import trio
import trio.testing
import trustme

from notary.server import accept
from notary.server.accept import serve_socket
from notary.server.sockstream import SocketStream
from notary.server.tlsstream import ServerContext, TlsStream


def listening_socket() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(512)
    return sock


def failing_listener(failures: list[OSError]) -> socket.socket:
    """A listening socket whose accepting raises each of ``failures`` (the
    last first) before it accepts (``_accept``, the C call the loop makes)."""

    class Flaky(socket.socket):
        def _accept(self):  # type: ignore[override]
            if failures:
                raise failures.pop()
            return super()._accept()

    return Flaky(fileno=listening_socket().detach())


async def test_every_queued_connection_is_taken_in_one_wake_up() -> None:
    listening = listening_socket()
    port = listening.getsockname()[1]
    # 200 connections queued in the kernel before the loop first runs.
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(200)]
    seen: list[trio.SocketStream] = []
    handled = trio.Event()

    async def handler(stream: trio.SocketStream) -> None:
        seen.append(stream)
        if len(seen) == len(clients):
            handled.set()
        await trio.sleep_forever()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_socket, listening, handler, nursery)
            with trio.fail_after(10):
                await handled.wait()
            # All were started by the same few wake-ups: the accept loop ran
            # once per batch, not once per scheduler round per connection.
            assert len(seen) == 200
            nursery.cancel_scope.cancel()
    finally:
        for client in clients:
            client.close()
    assert listening.fileno() == -1  # closed by serve_socket
    assert all(stream.socket.fileno() == -1 for stream in seen)  # closed after the handler


async def test_capacity_errors_pause_and_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    failures = [OSError(errno.EMFILE, "Too many open files")]
    flaky = failing_listener(failures)
    port = flaky.getsockname()[1]
    monkeypatch.setattr(accept, "CAPACITY_PAUSE_S", 0.01)
    got = trio.Event()

    async def handler(stream: trio.SocketStream) -> None:
        await stream.send_all(b"hello")
        got.set()

    with socket.create_connection(("127.0.0.1", port)) as client:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_socket, flaky, handler, nursery)
            with trio.fail_after(10):
                await got.wait()
            nursery.cancel_scope.cancel()
        assert client.recv(5) == b"hello"
    assert failures == []


def reset_before_accept(port: int) -> None:
    """Connect and reset (SO_LINGER 0) before the server accepts: the
    connection is queued in the kernel already reset."""
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.connect(("127.0.0.1", port))
    client.close()


def tls_stream_maker() -> Callable[[socket.socket], TlsStream]:
    ca = trustme.CA()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    server = ServerContext(context)
    return lambda connection: TlsStream(connection, server)


@pytest.mark.parametrize("data_first", [False, True], ids=["reset", "data-then-reset"])
async def test_a_connection_reset_before_its_tls_stream_is_made_is_skipped(
    data_first: bool,
) -> None:
    """A TLS stream's construction reads the socket (``wrap_socket``): a
    connection reset in the accept queue raised ``ConnectionResetError`` (or
    ``SSLError``: "Closed before TLS handshake with data in recv buffer") out
    of the accept loop and ended the listener (issue 30, item 1)."""
    listening = listening_socket()
    port = listening.getsockname()[1]
    for _ in range(4):
        if data_first:
            client = socket.create_connection(("127.0.0.1", port))
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.sendall(b"\x16\x03\x01")
            client.close()
        else:
            reset_before_accept(port)
    served = trio.Event()

    async def handler(stream: TlsStream) -> None:
        await stream.do_handshake()
        await stream.send_all(b"hello")
        served.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_socket, listening, handler, nursery, tls_stream_maker())
        await trio.sleep(0.1)  # the loop takes the reset connections first
        with socket.create_connection(("127.0.0.1", port)) as tcp:
            tcp.setblocking(False)
            stream = trio.SSLStream(
                trio.SocketStream(trio.socket.from_stdlib_socket(tcp)),
                _client_context(), server_hostname=None,
            )
            with trio.fail_after(10):
                await stream.do_handshake()
                assert await stream.receive_some(5) == b"hello"
                await served.wait()
        nursery.cancel_scope.cancel()


async def test_a_handler_that_raises_ends_its_connection_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    listening = listening_socket()
    port = listening.getsockname()[1]
    calls = 0

    async def handler(stream: trio.SocketStream) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a bug")
        await stream.send_all(b"hello")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_socket, listening, handler, nursery)
        with socket.create_connection(("127.0.0.1", port)) as first:
            first.settimeout(10)
            assert await trio.to_thread.run_sync(first.recv, 5) == b""  # closed
        with socket.create_connection(("127.0.0.1", port)) as second:
            second.settimeout(10)
            assert await trio.to_thread.run_sync(second.recv, 5) == b"hello"
        nursery.cancel_scope.cancel()
    assert "connection handler failed" in caplog.text
    assert "RuntimeError: a bug" in caplog.text


@pytest.mark.parametrize("code", [errno.ECONNRESET, errno.ENETUNREACH, errno.EHOSTUNREACH])
async def test_errors_accept_reports_for_one_connection_are_skipped(code: int) -> None:
    failures = [OSError(code, "gone")]
    flaky = failing_listener(failures)
    port = flaky.getsockname()[1]

    async def handler(stream: trio.SocketStream) -> None:
        await stream.send_all(b"hello")

    with socket.create_connection(("127.0.0.1", port)) as client:
        client.settimeout(10)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_socket, flaky, handler, nursery)
            assert await trio.to_thread.run_sync(client.recv, 5) == b"hello"
            nursery.cancel_scope.cancel()
    assert failures == []


def _client_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


@pytest.mark.parametrize("make_stream", [accept.trio_stream, SocketStream],
                         ids=["trio-stream", "our-stream"])
async def test_only_a_stream_its_handler_left_open_is_closed_by_force(
    monkeypatch: pytest.MonkeyPatch, make_stream: Callable[[socket.socket], trio.abc.Stream],
) -> None:
    """A forced close costs a cancelled scope: it is paid for a stream the
    handler left open, not for one it closed, whether the stream says so
    (``closed``) or only its socket does (``trio.SocketStream``)."""
    forced: list[trio.abc.Stream] = []
    real = trio.aclose_forcefully

    async def counting(stream: trio.abc.AsyncResource) -> None:
        forced.append(stream)  # type: ignore[arg-type]
        await real(stream)

    monkeypatch.setattr(trio, "aclose_forcefully", counting)
    listening = listening_socket()
    port = listening.getsockname()[1]
    seen: list[trio.abc.Stream] = []
    done = trio.Event()

    async def handler(stream: trio.abc.Stream) -> None:
        seen.append(stream)
        if len(seen) == 1:
            await stream.aclose()  # the second is left open
        if len(seen) == 2:
            done.set()

    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_socket, listening, handler, nursery, make_stream)
            with trio.fail_after(10):
                await done.wait()
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    finally:
        for client in clients:
            client.close()
    assert forced == [seen[1]]
    assert all(accept._closed(stream) for stream in seen)
