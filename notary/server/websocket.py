"""The v2 WebSocket (``wss://<api host>:<api port>/v2/ws``): batch queries
and live watches over one connection, with trio-websocket.

Messages are JSON objects. Client to server:

* ``{"type": "query", "id": ID, "targets": [...], "nonce": ...}``: the same
  request as ``POST /v2/query``; answered ``{"type": "answer", "id": ID,
  "answer": <the /v2/query answer document>}``.
* ``{"type": "watch", "id": ID, "host": H, "port": P}`` /
  ``{"type": "unwatch", ...}``: answered ``{"type": "watching" |
  "unwatched", "id": ID, "target": "host:port"}``.
* ``{"type": "figures", "id": ID}``: subscribe to the live figures (the web
  page's; ``notary.service.figures``), answered at once ``{"type":
  "figures", "id": ID, "figures": {"queries_per_s": ..., "cache_hit_ratio":
  ..., "probes_per_s": ..., "targets_known": ..., "uptime_s": ...}}`` and
  pushed the same with ``"id": null`` every ``FIGURES_INTERVAL_S``;
  ``{"type": "stop_figures", "id": ID}`` ends it (``figures_stopped``).
  One figures document is made per interval however many subscribe.

Server to client, pushed: ``{"type": "observation", "target": "host:port",
"statement": {"signature": ..., "statement": ...}}`` whenever any probe
(on-demand or scheduled) of a watched target sees a certificate other than
the one it saw before; the statement is the v2 statement signed for that
change (verify it as in ``notary.protocol.v2``). A bad message gets
``{"type": "error", "id": ID or null, "status": 400, "message": ...}`` and the
connection stays open. A query over the client's rate (``[limits]``, one per
target) gets ``{"type": "error", "status": 429, "retry_after": SECONDS, ...}``
and the connection stays open.

Rules this module keeps:

1. Bounded: messages of at most ``max_message_bytes`` (larger: close 1009,
   by trio-websocket), at most ``max_watches`` per connection, at most
   ``max_connections_per_address`` connections per client address, and a
   send queue of ``send_queue_messages`` per connection: a client that does
   not read is closed with 1008 ("send queue full"), never allowed to grow
   memory.
2. Alive: the server pings every ``ping_interval_s`` and closes (1001) a
   connection whose pong does not come within ``ping_timeout_s``; a
   connection with no message from the client for ``idle_timeout_s`` is
   closed (1000).

Resource handling: :meth:`WebSocketService.serve` owns the stream it is given and
a nursery for the connection's reader, writer and pinger; everything is
closed when it returns. The watch hub (``notary.service.watch``) holds only
the connections' bounded channels.

Error handling: a malformed message is answered with an error message; a
peer that breaks the protocol or the transport ends the connection
silently; nothing raises to the caller.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import partial

import trio
import trio_websocket

from notary.config import WebSocketConfig
from notary.errors import PeerError
from notary.model.ratelimit import RateLimited
from notary.model.targets import make_target
from notary.protocol import v2
from notary.protocol.http import Request
from notary.service.watch import FiguresHub, WatchHub
from notary.web.headers import is_cross_site_request

__all__ = [
    "FIGURES_INTERVAL_S", "WATCH_PATH", "WebSocketLimits", "WebSocketService",
    "WebSocketStatistics",
]

logger = logging.getLogger(__name__)

WATCH_PATH = b"/v2/ws"
#: Close codes (RFC 6455): normal, going away, policy violation.
CLOSE_NORMAL, CLOSE_GOING_AWAY, CLOSE_POLICY = 1000, 1001, 1008
#: How often live figures are pushed to their subscribers.
FIGURES_INTERVAL_S = 5.0


#: What ends a connection because its peer broke the protocol or the
#: transport (ended silently: nothing to answer, nothing to log).
_PEER_GONE = (
    trio_websocket.ConnectionClosed, trio_websocket.HandshakeError,
    trio.BrokenResourceError, trio.ClosedResourceError,
)

#: The limits of rule 1 and 2 are the ``[websocket]`` config section.
WebSocketLimits = WebSocketConfig


class _Connection:
    def __init__(self, limits: WebSocketLimits) -> None:
        self.send, self.receive = trio.open_memory_channel[bytes](limits.send_queue_messages)
        self.watching: set[str] = set()
        self.too_slow = False

    def push(self, message: bytes) -> None:
        try:
            self.send.send_nowait(message)
        except trio.WouldBlock:
            self.too_slow = True
        except trio.ClosedResourceError:
            pass


def handshake_bytes(request: Request) -> bytes:
    """The request head again, for trio-websocket to read (our reader has
    consumed the bytes; the parsed request carries everything it needs)."""
    lines = [b"%s %s HTTP/%s" % (request.method, request.target, request.version.encode())]
    lines += [name + b": " + value for name, value in request.headers]
    return b"\r\n".join(lines) + b"\r\n\r\n"


class _ReplayStream(trio.abc.Stream):
    """``stream`` with ``prefix`` received first."""

    def __init__(self, stream: trio.abc.Stream, prefix: bytes) -> None:
        self._stream = stream
        self._prefix = prefix

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self._prefix:
            size = len(self._prefix) if max_bytes is None else max_bytes
            data, self._prefix = self._prefix[:size], self._prefix[size:]
            await trio.lowlevel.checkpoint()
            return data
        return await self._stream.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self._stream.aclose()


@dataclass(frozen=True, slots=True)
class WebSocketStatistics:
    """A snapshot of a :class:`WebSocketService`: ``connections`` and
    ``watches`` open now; ``events_published`` (observations pushed to
    watchers, once per change however many watch) and ``rejected_queries``
    (``query`` messages answered with an error, by status): cumulative.
    Answered queries are counted by the query service."""

    connections: int
    watches: int
    events_published: int
    rejected_queries: Mapping[int, int]
    figures_subscribers: int = 0


class WebSocketCounts:
    """What the WebSocket connections count, with the watch hub: open
    connections by client address and refused queries by status. Made
    before the service, which updates it, and the metrics, which read it."""

    def __init__(self, hub: WatchHub | None = None) -> None:
        self.hub = hub if hub is not None else WatchHub()
        self.by_address: Counter[str] = Counter()
        self.rejected_queries: Counter[int] = Counter()

    def statistics(self, figures_subscribers: int = 0) -> WebSocketStatistics:
        return WebSocketStatistics(
            connections=sum(self.by_address.values()),
            watches=self.hub.watcher_count(),
            events_published=self.hub.events_published,
            rejected_queries=dict(self.rejected_queries),
            figures_subscribers=figures_subscribers,
        )


class WebSocketService:
    """Serves ``/v2/ws`` connections for one notary: the watch hub, the
    per-address connection counts and the query answerer they share."""

    def __init__(
        self,
        *,
        answer_query: Callable[..., Awaitable[bytes]],
        limits: WebSocketLimits,
        max_batch: int,
        hub: WatchHub | None = None,
        figures: Callable[[], Awaitable[Mapping[str, object]]] | None = None,
        counts: WebSocketCounts | None = None,
    ) -> None:
        self._counts = counts if counts is not None else WebSocketCounts(hub)
        #: Who watches which target; the query service publishes to it.
        self.hub = self._counts.hub
        #: The live figures' subscribers; ``figures`` makes the documents.
        self.figures = FiguresHub(figures)
        self._answer_query = answer_query
        self._limits = limits
        self._max_batch = max_batch
        self._by_address = self._counts.by_address
        self._rejected_queries = self._counts.rejected_queries

    @property
    def connections(self) -> int:
        return sum(self._by_address.values())

    def statistics(self) -> WebSocketStatistics:
        return self._counts.statistics(self.figures.subscribers)

    async def serve_figures(
        self, interval_s: float = FIGURES_INTERVAL_S, *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Push the live figures to their subscribers every ``interval_s``
        until cancelled; nothing is made while nobody subscribes."""
        task_status.started()
        hub = self.figures
        while True:
            await trio.sleep(interval_s)
            if hub.subscribers and hub.source is not None:
                hub.publish(await hub.source())

    async def serve(
        self, stream: trio.abc.Stream, request: Request, leftover: bytes, *, peer: str,
        client: bytes | None = None,
    ) -> None:
        """Run one WebSocket connection until it ends (see the module
        docstring); owns ``stream`` and closes it. ``client``: the client
        prefix key its queries are limited as (None: unlimited)."""
        limits = self._limits
        try:
            if is_cross_site_request(request.headers):
                # Queries start probes: another site's page must not open
                # a WebSocket here with its visitors' budgets (CSWSH).
                with trio.move_on_after(limits.ping_timeout_s):
                    await stream.send_all(
                        b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n"
                        b"Connection: close\r\n\r\n"
                    )
                return
            if self._by_address[peer] >= limits.max_connections_per_address:
                with trio.move_on_after(limits.ping_timeout_s):
                    await stream.send_all(
                        b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 0\r\n"
                        b"Connection: close\r\n\r\n"
                    )
                return
            self._by_address[peer] += 1
            try:
                await self._run(stream, request, leftover, client)
            finally:
                self._by_address[peer] -= 1
                if not self._by_address[peer]:
                    del self._by_address[peer]
        except _PEER_GONE:
            pass
        finally:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)

    async def _run(
        self, stream: trio.abc.Stream, request: Request, leftover: bytes, client: bytes | None
    ) -> None:
        """The handshake and the messages of one accepted connection. The
        peer going away (before the 101 too: a reset, a half-close, frames
        sent before it) ends it quietly: out of the connection's nursery
        its errors come in an exception group."""
        limits = self._limits
        try:
            async with trio.open_nursery() as nursery:
                replay = _ReplayStream(stream, handshake_bytes(request) + leftover)
                ws_request = await trio_websocket.wrap_server_stream(
                    nursery, replay, message_queue_size=1,
                    max_message_size=limits.max_message_bytes,
                )
                ws = await ws_request.accept()
                answer_query = self._answer_query
                if client is not None:
                    answer_query = partial(answer_query, client=client)
                await _serve(
                    ws, nursery, answer_query, self.hub, limits, self._max_batch,
                    self._rejected_queries, self.figures,
                )
                nursery.cancel_scope.cancel()
        except* _PEER_GONE:
            pass


async def _serve(
    ws: trio_websocket.WebSocketConnection,
    nursery: trio.Nursery,
    answer_query: Callable[[v2.QueryRequest], Awaitable[bytes]],
    hub: WatchHub,
    limits: WebSocketLimits,
    max_batch: int,
    rejected_queries: Counter[int],
    figures: FiguresHub,
) -> None:
    connection = _Connection(limits)
    done = trio.Event()

    async def writer() -> None:
        async for message in connection.receive:
            if connection.too_slow:
                break
            await ws.send_message(message.decode("utf-8"))
        if connection.too_slow:
            # The queue overflowed: say why once what is in flight is sent.
            # Never cancel a send midway (that would cut a frame in two).
            with trio.move_on_after(limits.ping_timeout_s):
                await ws.aclose(CLOSE_POLICY, "send queue full")

    async def pinger() -> None:
        while True:
            await trio.sleep(limits.ping_interval_s)
            with trio.move_on_after(limits.ping_timeout_s) as scope:
                await ws.ping()
            if scope.cancelled_caught:
                with trio.move_on_after(limits.ping_timeout_s):
                    await ws.aclose(CLOSE_GOING_AWAY, "no pong")
                return

    async def reader() -> None:
        while True:
            with trio.move_on_after(limits.idle_timeout_s) as scope:
                message = await ws.get_message()
            if scope.cancelled_caught:
                with trio.move_on_after(limits.ping_timeout_s):
                    await ws.aclose(CLOSE_NORMAL, "idle")
                return
            await _handle(
                message, connection, answer_query, hub, limits, max_batch, rejected_queries,
                figures,
            )

    async def guarded(task: Callable[[], Awaitable[None]]) -> None:
        # Each task ends the connection when the peer goes away; none may
        # raise into the nursery (the others are cancelled by the caller).
        try:
            await task()
        except (trio_websocket.ConnectionClosed, trio.BrokenResourceError,
                trio.ClosedResourceError):
            pass
        finally:
            done.set()

    try:
        for task in (writer, pinger, reader):
            nursery.start_soon(guarded, task)
        await done.wait()
    finally:
        for key in connection.watching:
            hub.unsubscribe(key, connection)
        figures.unsubscribe(connection)
        connection.send.close()


async def _handle(
    message: str | bytes,
    connection: _Connection,
    answer_query: Callable[[v2.QueryRequest], Awaitable[bytes]],
    hub: WatchHub,
    limits: WebSocketLimits,
    max_batch: int,
    rejected_queries: Counter[int],
    figures: FiguresHub,
) -> None:
    request_id: object = None
    kind: object = None
    try:
        raw = message.encode("utf-8") if isinstance(message, str) else message
        try:
            document = json.loads(raw)
        except (ValueError, RecursionError):
            raise PeerError("message is not JSON") from None
        if not isinstance(document, dict):
            raise PeerError("message must be a JSON object")
        request_id = document.pop("id", None)
        if request_id is not None and not isinstance(request_id, str | int):
            request_id = None
            raise PeerError("id must be a string or an integer")
        kind = document.pop("type", None)
        if kind == "query":
            query = v2.parse_query_request(
                json.dumps(document).encode(), max_batch=max_batch,
                max_body_bytes=limits.max_message_bytes,
            )
            body = await answer_query(query)
            connection.push(
                b'{"answer":' + body + b',"id":' + json.dumps(request_id).encode()
                + b',"type":"answer"}'
            )
            return
        if kind in ("watch", "unwatch"):
            _watch(kind, document, request_id, connection, hub, limits)
            return
        if kind in ("figures", "stop_figures"):
            await _figures(kind, document, request_id, connection, figures)
            return
        raise PeerError("type must be query, watch, unwatch, figures or stop_figures")
    except PeerError as exc:
        if kind == "query":
            rejected_queries[exc.status] += 1
        error: dict[str, object] = {
            "id": request_id, "message": exc.message, "status": exc.status, "type": "error",
        }
        if isinstance(exc, RateLimited):
            error["retry_after"] = exc.retry_after_s
        connection.push(json.dumps(error, sort_keys=True).encode())


def _watch(
    kind: str, document: dict, request_id: object, connection: _Connection, hub: WatchHub,
    limits: WebSocketLimits,
) -> None:
    """A ``watch`` or ``unwatch`` message. Raises ``PeerError``."""
    if set(document) != {"host", "port"}:
        raise PeerError(f"{kind} needs host and port, nothing else")
    port = document["port"]
    if isinstance(port, bool) or not isinstance(port, int):
        raise PeerError("port must be an integer 1-65535")
    target = make_target(str(document["host"]), port)
    if kind == "watch":
        if target.key not in connection.watching:
            if len(connection.watching) >= limits.max_watches:
                raise PeerError(f"at most {limits.max_watches} watches per connection")
            connection.watching.add(target.key)
            hub.subscribe(target.key, connection)
        reply = "watching"
    else:
        connection.watching.discard(target.key)
        hub.unsubscribe(target.key, connection)
        reply = "unwatched"
    connection.push(json.dumps(
        {"id": request_id, "target": target.key, "type": reply}, sort_keys=True
    ).encode())


async def _figures(
    kind: str, document: dict, request_id: object, connection: _Connection,
    figures: FiguresHub,
) -> None:
    """A ``figures`` or ``stop_figures`` message. Raises ``PeerError``."""
    if kind == "stop_figures":
        figures.unsubscribe(connection)
        connection.push(json.dumps(
            {"id": request_id, "type": "figures_stopped"}, sort_keys=True
        ).encode())
        return
    if figures.source is None:
        raise PeerError("live figures are not served here", status=404)
    if document:
        raise PeerError("figures takes only an id")
    figures.subscribe(connection)
    connection.push(json.dumps(
        {"figures": await figures.source(), "id": request_id, "type": "figures"},
        sort_keys=True,
    ).encode())
