"""The v2 WebSocket service (notary.server.websocket) over in-memory streams:
queries, watches and pushes, limits and timeouts (autojump clock)."""

from __future__ import annotations

import json

import pytest
import trio
import trio.testing
import trio_websocket

from notary.model.targets import Target
from notary.protocol.http import RequestReader
from notary.server.websocket import WebSocketLimits
from tests.support.websocket import Server, ask, open_client


async def test_query_watch_push_unwatch() -> None:
    server = Server(WebSocketLimits())
    async with open_client(server) as ws:
        answer = await ask(ws, {"type": "query", "id": 7, "targets": [
            {"host": "a.example.test", "port": 443}]})
        assert answer == {"type": "answer", "id": 7, "answer": {"echo": ["a.example.test:443"]}}
        watching = await ask(ws, {"type": "watch", "id": "w", "host": "A.example.test.",
                                  "port": 443})
        assert watching == {"type": "watching", "id": "w", "target": "a.example.test:443"}
        hub = server.service.hub
        assert hub.watched("a.example.test:443") and not hub.watched("b.example.test:443")
        entry = b'{"signature":"c2ln","statement":{"target":"a.example.test:443"}}'
        server.service.hub.publish(Target("a.example.test", 443), entry)
        server.service.hub.publish(Target("b.example.test", 443), entry)  # not watched
        event = json.loads(await ws.get_message())
        assert event == {"type": "observation", "target": "a.example.test:443",
                         "statement": json.loads(entry)}
        assert (await ask(ws, {"type": "unwatch", "id": 2, "host": "a.example.test",
                               "port": 443}))["type"] == "unwatched"
        server.service.hub.publish(Target("a.example.test", 443), entry)
        assert not hub.watched("a.example.test:443")
        assert (await ask(ws, {"type": "watch", "id": 3, "host": "c.example.test",
                               "port": 443}))["type"] == "watching"  # no event came first
    assert server.service.hub.watcher_count() == 0  # a closed connection leaves no watches


@pytest.mark.parametrize(
    ("message", "text"),
    [
        ("not json", "not JSON"),
        ("[1]", "JSON object"),
        ('{"type": "dance"}', "type must be"),
        ('{"type": "watch", "host": "a.example.test"}', "needs host and port"),
        ('{"type": "watch", "host": "a.example.test", "port": "443"}', "port must be"),
        ('{"type": "watch", "host": "bad_host", "port": 443}', ""),
        ('{"type": "query", "targets": []}', "targets"),
    ],
)
async def test_bad_messages_get_errors_and_the_connection_stays(message: str, text: str) -> None:
    async with open_client(Server(WebSocketLimits())) as ws:
        await ws.send_message(message)
        error = json.loads(await ws.get_message())
        assert error["type"] == "error" and error["status"] in (400, 413)
        assert text in error["message"]
        ok = await ask(ws, {"type": "watch", "id": 1, "host": "a.example.test", "port": 443})
        assert ok["type"] == "watching"


async def test_watches_per_connection_are_bounded() -> None:
    async with open_client(Server(WebSocketLimits(max_watches=2))) as ws:
        for i in range(2):
            assert (await ask(ws, {"type": "watch", "id": i, "host": f"h{i}.example.test",
                                   "port": 443}))["type"] == "watching"
        error = await ask(ws, {"type": "watch", "id": 9, "host": "h9.example.test", "port": 443})
        assert error["type"] == "error" and "at most 2 watches" in error["message"]


async def test_oversize_message_is_closed_with_1009() -> None:
    async with open_client(Server(WebSocketLimits(max_message_bytes=1000))) as ws:
        await ws.send_message("x" * 5000)
        with pytest.raises(trio_websocket.ConnectionClosed) as closed:
            await ws.get_message()
    assert closed.value.reason.code == 1009


async def test_a_slow_consumer_is_closed_with_1008(autojump_clock: trio.testing.MockClock) -> None:
    server = Server(WebSocketLimits(send_queue_messages=4))
    async with open_client(server, lockstep=True) as ws:
        await ask(ws, {"type": "watch", "id": 1, "host": "a.example.test", "port": 443})
        entry = b'{"signature":"c2ln","statement":{"big":"' + b"x" * 60000 + b'"}}'
        for _ in range(50):  # the client reads nothing meanwhile
            server.service.hub.publish(Target("a.example.test", 443), entry)
            await trio.sleep(0.01)
        codes = []
        with pytest.raises(trio_websocket.ConnectionClosed) as closed:
            while True:
                codes.append(await ws.get_message())
    assert closed.value.reason.code == 1008
    assert len(codes) <= 4 + 2  # what was queued (and in flight) before the close


async def test_idle_connection_is_closed(autojump_clock: trio.testing.MockClock) -> None:
    limits = WebSocketLimits(idle_timeout_s=60, ping_interval_s=1000)
    async with open_client(Server(limits)) as ws:
        start = trio.current_time()
        with pytest.raises(trio_websocket.ConnectionClosed) as closed:
            await ws.get_message()
        assert 60 <= trio.current_time() - start < 61
    assert closed.value.reason.code == 1000


async def test_connections_per_address_are_bounded() -> None:
    server = Server(WebSocketLimits(max_connections_per_address=1))
    async with open_client(server, peer="192.0.2.7") as first:
        assert (await ask(first, {"type": "watch", "id": 1, "host": "a.example.test",
                                  "port": 443}))["type"] == "watching"
        with pytest.raises(BaseException) as refused:
            async with open_client(server, peer="192.0.2.7"):
                pass
        rejected = _find(refused.value, trio_websocket.ConnectionRejected)
        assert rejected is not None and rejected.status_code == 429
        async with open_client(server, peer="192.0.2.8") as other:  # another address
            assert (await ask(other, {"type": "watch", "id": 1, "host": "b.example.test",
                                      "port": 443}))["type"] == "watching"
    assert server.service.connections == 0


def _find(error: BaseException, kind: type[BaseException]) -> BaseException | None:
    """``error`` or the first ``kind`` inside its exception groups."""
    if isinstance(error, kind):
        return error
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            found = _find(inner, kind)
            if found is not None:
                return found
    return None


async def test_figures_are_answered_then_pushed_until_stopped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    made = []

    async def figures() -> dict:
        made.append(trio.current_time())
        return {"queries_per_s": float(len(made))}

    server = Server(WebSocketLimits(idle_timeout_s=3600), figures)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.service.serve_figures, 5.0)
        await trio.sleep(12)  # nobody subscribed: nothing made
        assert made == []
        async with open_client(server) as ws:
            first = await ask(ws, {"type": "figures", "id": "f"})
            assert first == {"type": "figures", "id": "f", "figures": {"queries_per_s": 1.0}}
            pushed = json.loads(await ws.get_message())
            assert pushed["type"] == "figures" and pushed["id"] is None
            assert server.service.statistics().figures_subscribers == 1
            stopped = await ask(ws, {"type": "stop_figures", "id": 2})
            assert stopped == {"type": "figures_stopped", "id": 2}
            count = len(made)
            await trio.sleep(20)
            assert len(made) == count  # no subscriber, no figures made
            # A connection that closes leaves no subscription behind.
            await ask(ws, {"type": "figures", "id": 3})
        await trio.sleep(0.1)
        assert server.service.statistics().figures_subscribers == 0
        nursery.cancel_scope.cancel()


async def test_figures_without_a_source_are_refused() -> None:
    async with open_client(Server(WebSocketLimits())) as ws:
        error = await ask(ws, {"type": "figures", "id": 1})
        assert error["type"] == "error" and error["status"] == 404


@pytest.mark.parametrize("early", [b"", b"\x81\x85"], ids=["closed", "half-a-frame-then-closed"])
async def test_a_peer_gone_before_the_101_ends_its_connection_quietly(early: bytes) -> None:
    """A client that closes after its upgrade request (with or without
    frames sent before the 101) made ``ConnectionClosed`` escape ``serve``
    inside an exception group: the listener logged it as a failed handler
    (and before 7ed39a5 the notary ended)."""
    server = Server(WebSocketLimits())
    client_stream, server_stream = trio.testing.memory_stream_pair()
    await client_stream.send_all(
        b"GET /v2/ws HTTP/1.1\r\nHost: notary.test\r\nConnection: Upgrade\r\n"
        b"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n" + early
    )
    await client_stream.aclose()
    reader = RequestReader()
    [request] = reader.feed(await server_stream.receive_some(4096))
    with trio.fail_after(5):
        await server.service.serve(server_stream, request, reader.leftover, peer="192.0.2.1")
    assert server.service.connections == 0
