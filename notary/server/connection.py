"""One HTTP/1.x connection: receive with timeouts, parse with the sans-IO
reader, hand each request to the application, send the response.

Resource handling: ``serve_http_connection`` owns ``stream`` from the moment it
is called and always closes it before returning.

Error handling: a protocol error is answered with its status and the
connection closed; a peer that stalls past a timeout, resets, or breaks TLS is
dropped silently (nothing to answer); any of those are normal events, not
errors, and are not logged per connection.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from notary.errors import ProtocolError
from notary.protocol.http import Request, RequestReader, error_response

RECEIVE_BYTES = 64 * 1024
CLOSE_TIMEOUT_S = 1.0

#: The application: a request in, (response bytes, keep the connection) out.
Handler = Callable[[Request], Awaitable[tuple[bytes, bool]]]


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    header_timeout_s: float = 10.0
    keepalive_timeout_s: float = 30.0
    send_timeout_s: float = 10.0
    max_header_bytes: int = 8 * 1024
    max_headers: int = 64
    max_body_bytes: int = 4 * 1024


async def serve_http_connection(
    stream: trio.abc.Stream, handler: Handler, limits: ConnectionLimits
) -> None:
    try:
        await _serve(stream, handler, limits)
    except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError, OSError):
        pass
    finally:
        with trio.move_on_after(CLOSE_TIMEOUT_S) as scope:
            scope.shield = True
            await stream.aclose()


async def _serve(stream: trio.abc.Stream, handler: Handler, limits: ConnectionLimits) -> None:
    reader = RequestReader(
        max_header_bytes=limits.max_header_bytes,
        max_headers=limits.max_headers,
        max_body_bytes=limits.max_body_bytes,
    )
    # The head of a request must arrive whole within header_timeout_s of its
    # first byte (or of the connection's start): a client dripping bytes
    # cannot hold the connection open. Between requests, keepalive_timeout_s.
    head_deadline: float | None = trio.current_time() + limits.header_timeout_s
    while True:
        if head_deadline is None and reader.in_request:
            head_deadline = trio.current_time() + limits.header_timeout_s
        if head_deadline is not None:
            deadline = head_deadline
        else:
            deadline = trio.current_time() + limits.keepalive_timeout_s
        with trio.move_on_at(deadline) as scope:
            data = await stream.receive_some(RECEIVE_BYTES)
        if scope.cancelled_caught:
            # A stalled request gets 408; an idle keep-alive connection just closes.
            if reader.in_request:
                await _send(stream, error_response(408, "request timeout"), limits)
            return
        if not data:
            return
        try:
            requests = reader.feed(data)
        except ProtocolError as exc:
            await _send(stream, error_response(exc.status, exc.message), limits)
            return
        for request in requests:
            response, keep_alive = await handler(request)
            await _send(stream, response, limits)
            if not keep_alive:
                return
        if reader.finished:
            return
        if requests:
            head_deadline = None


async def _send(stream: trio.abc.Stream, data: bytes, limits: ConnectionLimits) -> None:
    with trio.fail_after(limits.send_timeout_s):
        await stream.send_all(data)
