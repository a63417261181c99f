"""``notary.server.tlsstream.TlsStream``, the HTTPS listeners' stream, over
a real socket pair against Trio's own TLS client: the handshake, both
directions, a send larger than the socket buffers (OpenSSL would block and
is called again), a client leaving without ``close_notify``, our
``close_notify``, a client that is not speaking TLS, checkpoints, and use
after close."""

from __future__ import annotations

import socket
import ssl

import pytest
import trio
import trio.testing

from notary.server.tlsstream import ServerContext, TlsStream
from tests.support.tls_pairs import server_and_client_contexts
from tests.support.waking import still_serves, woken_by


@pytest.fixture(scope="module")
def contexts() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    return server_and_client_contexts()


def pair(contexts: tuple[ssl.SSLContext, ssl.SSLContext]) -> tuple[TlsStream, trio.SSLStream]:
    server_context, client_context = contexts
    ours, theirs = socket.socketpair()
    stream = TlsStream(ours, ServerContext(server_context))
    client = trio.SSLStream(
        trio.SocketStream(trio.socket.from_stdlib_socket(theirs)), client_context,
        server_hostname="localhost",
    )
    return stream, client


async def handshake(stream: TlsStream, client: trio.SSLStream) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream.do_handshake)
        nursery.start_soon(client.do_handshake)


async def test_both_directions_after_the_handshake(contexts) -> None:
    stream, client = pair(contexts)
    with trio.fail_after(10):
        await handshake(stream, client)
        await stream.do_handshake()  # a second call does nothing
        assert stream.version() in ("TLSv1.2", "TLSv1.3")
        assert not stream.session_reused
        got = b""
        for index in range(20):
            await client.send_all(b"request %d\n" % index)
            got += await stream.receive_some(4096)
            await stream.send_all(b"answer %d\n" % index)
            assert await client.receive_some(4096) == b"answer %d\n" % index
        await stream.send_all(b"")  # nothing to send: nothing sent
        await stream.aclose()
        # Our close_notify reaches the client: a clean end, not an error.
        assert await client.receive_some(10) == b""
    assert got == b"".join(b"request %d\n" % i for i in range(20))


async def test_a_send_larger_than_the_buffers_waits_for_the_reader(contexts) -> None:
    stream, client = pair(contexts)
    data = bytes(range(256)) * 40_000  # 10 MB: OpenSSL's writes would block many times
    received = bytearray()

    async def read_all() -> None:
        while len(received) < len(data):
            received.extend(await client.receive_some(1 << 20))

    with trio.fail_after(30):
        await handshake(stream, client)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_all)
            await stream.send_all(memoryview(data))
        await stream.aclose()
    assert bytes(received) == data


async def test_a_client_leaving_without_close_notify_ends_the_stream(contexts) -> None:
    stream, client = pair(contexts)
    with trio.fail_after(10):
        await handshake(stream, client)
        await client.send_all(b"last words")
        await client.transport_stream.aclose()  # no close_notify, as most HTTPS clients
        assert await stream.receive_some(100) == b"last words"
        assert await stream.receive_some(100) == b""
        await stream.aclose()


async def test_a_client_not_speaking_tls_breaks_the_handshake(contexts) -> None:
    server_context, _ = contexts
    ours, theirs = socket.socketpair()
    stream = TlsStream(ours, ServerContext(server_context))
    with theirs, trio.fail_after(10):
        theirs.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        with pytest.raises(trio.BrokenResourceError) as caught:
            await stream.do_handshake()
        assert isinstance(caught.value.__cause__, ssl.SSLError)
        await stream.aclose()
    assert stream.closed


async def test_a_handshake_waits_for_the_client_and_can_be_cancelled(contexts) -> None:
    server_context, _ = contexts
    ours, theirs = socket.socketpair()
    stream = TlsStream(ours, ServerContext(server_context))
    with theirs:
        with trio.move_on_after(0.2) as scope:
            await stream.do_handshake()  # the client never speaks
        assert scope.cancelled_caught
        await stream.aclose()


async def test_every_receive_is_a_checkpoint(contexts) -> None:
    stream, client = pair(contexts)
    with trio.fail_after(10):
        await handshake(stream, client)
        await client.send_all(b"waiting already")
        await trio.sleep(0.05)
        with trio.CancelScope() as scope:
            scope.cancel()
            with pytest.raises(trio.Cancelled):
                await stream.receive_some(100)
        # Nothing was consumed by the cancelled receive.
        assert await stream.receive_some(100) == b"waiting already"
        await stream.aclose()
        await client.aclose()


async def test_use_after_close(contexts) -> None:
    stream, client = pair(contexts)
    with trio.fail_after(10):
        await handshake(stream, client)
        await stream.aclose()
        await stream.aclose()  # twice is fine
        for call in (stream.receive_some, stream.do_handshake,
                     stream.wait_send_all_might_not_block):
            with pytest.raises(trio.ClosedResourceError):
                await call()
        with pytest.raises(trio.ClosedResourceError):
            await stream.send_all(b"x")
    assert stream.socket.fileno() == -1


async def test_a_close_wakes_another_task_waiting_on_the_socket(contexts) -> None:
    """A WebSocket's reader waits in ``receive_some`` while its writer
    closes: the reader wakes with ``ClosedResourceError``, at once."""
    stream, client = pair(contexts)
    with trio.fail_after(10):
        await handshake(stream, client)
        # The client sends nothing: the receive waits until the close.
        raised = await woken_by(lambda: stream.receive_some(100), stream.aclose)
        assert raised == [trio.ClosedResourceError]
        await client.aclose()


async def test_an_interrupt_wakes_a_waiting_receive_and_leaves_the_stream_open(contexts) -> None:
    """The HTTP loop's watchdog wakes a connection where it waits
    (``interrupt``), in the handshake or after: the wait raises
    ``ClosedResourceError`` and the stream goes on (the 408 goes out on it)."""
    stream, client = pair(contexts)
    with trio.fail_after(10):
        # The client says nothing yet: the handshake waits.
        assert await woken_by(stream.do_handshake, stream.interrupt) == [trio.ClosedResourceError]
        await handshake(stream, client)
        raised = await woken_by(lambda: stream.receive_some(10), stream.interrupt)
        assert raised == [trio.ClosedResourceError] and not stream.closed
        await still_serves(stream, client)
        await stream.aclose()
        await client.aclose()
