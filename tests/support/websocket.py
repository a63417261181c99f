"""The v2 WebSocket service (``notary.server.websocket``) on in-memory
streams, for tests: a ``Server`` that answers each query with an echo of its
targets, a trio-websocket client wired to it (``open_client``) and one
request and its answer (``ask``). Nothing touches a socket."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager

import trio
import trio.testing
import trio_websocket

from notary.protocol import v2
from notary.protocol.http import RequestReader
from notary.server.websocket import WebSocketLimits, WebSocketService


class Server:
    def __init__(
        self, limits: WebSocketLimits,
        figures: Callable[[], Awaitable[Mapping[str, object]]] | None = None,
    ) -> None:
        self.queries: list[v2.QueryRequest] = []
        self.service = WebSocketService(
            answer_query=self.answer, limits=limits, max_batch=10, figures=figures
        )

    async def answer(self, query: v2.QueryRequest) -> bytes:
        self.queries.append(query)
        return json.dumps({"echo": [t.target.key for t in query.targets]}).encode()


@asynccontextmanager
async def open_client(
    server: Server, *, peer: str = "192.0.2.1", max_message_size: int = 1 << 20,
    lockstep: bool = False,
) -> AsyncIterator[trio_websocket.WebSocketConnection]:
    """A trio-websocket client wired to the service by a memory stream (with
    ``lockstep``, one that holds nothing: a send waits for the reader); the
    server side parses the handshake with our reader first, as the API
    connection does."""
    pair = trio.testing.lockstep_stream_pair if lockstep else trio.testing.memory_stream_pair
    client_stream, server_stream = pair()

    async def serve() -> None:
        reader = RequestReader()
        while True:
            requests = reader.feed(await server_stream.receive_some(4096))
            if requests:
                break
        await server.service.serve(server_stream, requests[0], reader.leftover, peer=peer)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        ws = await trio_websocket.wrap_client_stream(
            nursery, client_stream, "notary.test", "/v2/ws", max_message_size=max_message_size
        )
        try:
            yield ws
        finally:
            await ws.aclose()
            nursery.cancel_scope.cancel()


async def ask(ws: trio_websocket.WebSocketConnection, message: dict) -> dict:
    await ws.send_message(json.dumps(message))
    return json.loads(await ws.get_message())
