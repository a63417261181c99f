"""``notary.server.sockstream.SocketStream``, the HTTP listeners' stream,
over a real socket pair: what it receives and sends, both ways of reading
(waiting first after a drained read, or reading first), a send larger than
the socket buffers, half-close, close, and its errors."""

from __future__ import annotations

import socket

import pytest
import trio

from notary.server.sockstream import SocketStream
from tests.support.waking import still_serves, woken_by


def pair(*, wait_when_drained: bool = True) -> tuple[SocketStream, trio.SocketStream]:
    ours, theirs = socket.socketpair()
    stream = SocketStream(ours, wait_when_drained=wait_when_drained)
    return stream, trio.SocketStream(trio.socket.from_stdlib_socket(theirs))


@pytest.mark.parametrize("wait_when_drained", [True, False])
async def test_it_receives_what_is_sent_in_order(wait_when_drained: bool) -> None:
    stream, peer = pair(wait_when_drained=wait_when_drained)
    async with stream, peer:
        got = b""
        for index in range(20):
            chunk = b"request %d\n" % index
            await peer.send_all(chunk)
            got += await stream.receive_some(4096)
        # Bytes already waiting are read at once, however the last read ended.
        await peer.send_all(b"a" * 10 + b"b" * 10)
        await trio.sleep(0.01)
        first = await stream.receive_some(10)
        rest = await stream.receive_some(4096)
    assert got == b"".join(b"request %d\n" % i for i in range(20))
    assert first + rest == b"a" * 10 + b"b" * 10


async def test_a_send_larger_than_the_buffers_waits_for_the_reader() -> None:
    stream, peer = pair()
    data = bytes(range(256)) * 40_000  # 10 MB: far more than the socket buffers
    received = bytearray()

    async def read_all() -> None:
        while len(received) < len(data):
            received.extend(await peer.receive_some(1 << 20))

    async with stream, peer, trio.open_nursery() as nursery:
        nursery.start_soon(read_all)
        await stream.send_all(data)
    assert bytes(received) == data


async def test_half_close_and_close() -> None:
    stream, peer = pair()
    async with peer:
        await stream.send_eof()
        assert await peer.receive_some(10) == b""  # the peer sees the end
        await peer.send_all(b"still readable")
        assert await stream.receive_some(100) == b"still readable"
        await stream.aclose()
        await stream.aclose()  # twice is fine
        with pytest.raises(trio.ClosedResourceError):
            await stream.receive_some(10)
        with pytest.raises(trio.ClosedResourceError):
            await stream.send_all(b"x")
    assert stream.socket.fileno() == -1


async def test_a_peer_that_resets_is_a_broken_resource() -> None:
    stream, peer = pair()
    async with stream:
        await peer.aclose()
        assert await stream.receive_some(10) == b""
        with pytest.raises(trio.BrokenResourceError):
            for _ in range(100):  # the reset shows on a later send
                await stream.send_all(b"x" * 65536)


async def test_closing_wakes_a_waiting_receive() -> None:
    stream, peer = pair()
    async with peer:
        with trio.fail_after(10):
            raised = await woken_by(lambda: stream.receive_some(10), stream.aclose)
    assert raised == [trio.ClosedResourceError]


async def test_an_interrupt_wakes_a_waiting_receive_and_leaves_the_stream_open() -> None:
    """The HTTP loop's watchdog wakes a connection where it waits
    (``interrupt``): the wait raises ``ClosedResourceError`` and the stream
    still sends and receives (the 408 goes out on it)."""
    stream, peer = pair()
    async with stream, peer:
        stream.interrupt()  # nobody waits: nothing happens
        with trio.fail_after(10):
            raised = await woken_by(lambda: stream.receive_some(10), stream.interrupt)
            assert raised == [trio.ClosedResourceError] and not stream.closed
            await still_serves(stream, peer)
    stream.interrupt()  # closed: nothing happens (its fd may be another's now)


async def test_every_receive_is_a_checkpoint() -> None:
    """Data always waiting still lets the other tasks run, and a cancelled
    scope stops the receive."""
    stream, peer = pair(wait_when_drained=False)
    async with stream, peer:
        await peer.send_all(b"x" * 1000)
        turns = 0

        async def other() -> None:
            nonlocal turns
            while True:
                turns += 1
                await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(other)
            for _ in range(50):  # more is always waiting: read at once, and yield
                assert await stream.receive_some(1) == b"x"
            # Trio runs a batch's tasks in a random order: the other task
            # ran unless 50 fair coins all fell one way.
            assert turns > 0
            nursery.cancel_scope.cancel()
        with trio.CancelScope() as scope:
            scope.cancel()
            await stream.receive_some(1)
        assert scope.cancelled_caught
