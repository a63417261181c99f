"""``notary.server.accept.serve_socket``: every queued connection is taken
in one wake-up, handlers own their streams, capacity errors pause and
retry, and the listening socket is closed on cancellation."""

from __future__ import annotations

import errno
import socket

import pytest
import trio

from notary.server import accept
from notary.server.accept import serve_socket


def listening_socket() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(512)
    return sock


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
    listening = listening_socket()
    port = listening.getsockname()[1]
    failures = [OSError(errno.EMFILE, "Too many open files")]

    class Flaky(socket.socket):
        def accept(self):  # type: ignore[override]
            if failures:
                raise failures.pop()
            return super().accept()

    flaky = Flaky(fileno=listening.detach())
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
