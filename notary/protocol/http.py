"""HTTP/1.x requests in, response bytes out: the sans-IO edge of every
listener, built on httptools (llhttp) for parsing. ``Request`` and
``RequestReader`` live in ``notary.protocol.hotpath`` (compiled, with a
pure-Python twin) and are re-exported here; the invariants below are theirs.

Invariants
1. Memory is bounded: the head of a request (request line and headers) may not
   exceed ``max_header_bytes`` nor ``max_headers`` fields, and its body
   ``max_body_bytes``; beyond that a ``ProtocolError`` with 431 or 413.
2. A malformed request (llhttp refuses it: bad line, obsolete folding,
   conflicting Content-Length/Transfer-Encoding, NUL bytes, ...) is a
   ``ProtocolError`` with 400, and so is a request line without an HTTP
   version (``GET /x``: HTTP/0.9's form); any other HTTP version than
   1.0/1.1 is 505.
3. Requests are returned whole and in order (pipelining works); after a
   request that does not keep the connection alive, or an upgrade request,
   the reader is ``finished`` and ignores further bytes. After an upgrade
   (``CONNECT``, ``Upgrade:``) the bytes that followed the head in the same
   ``feed`` call are kept in ``leftover``: they belong to the new protocol.
4. Every response carries ``Content-Length``; ``Connection: close`` when the
   connection is to be closed after it.
5. Empty lines before a request line (llhttp skips them, as RFC 9112 2.2
   allows) count as the start of the next request for ``in_request``: a
   client cannot keep an idle connection alive with blank lines, the head
   deadline of the connection loop applies from the first of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus

import httptools

from notary.errors import ProtocolError
from notary.protocol.hotpath import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_HEADER_BYTES,
    DEFAULT_MAX_HEADERS,
    Request,
    RequestReader,
    first_header,
)

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_HEADERS",
    "DEFAULT_MAX_HEADER_BYTES",
    "Request",
    "RequestReader",
    "Response",
    "error_response",
    "first_header",
    "parse_response",
    "response",
    "status_line",
]

SERVER_NAME = b"notary"


# -- responses ------------------------------------------------------------------

_STATUS_LINES = {
    status.value: f"HTTP/1.1 {status.value} {status.phrase}\r\n".encode("ascii")
    for status in HTTPStatus
}


def status_line(status: int, reason: str | None = None) -> bytes:
    """``HTTP/1.1 <status> <reason>``: the standard phrase unless ``reason``
    (ASCII, no control characters) is given."""
    if reason is not None:
        if status not in _STATUS_LINES:
            raise ValueError(f"unknown HTTP status {status}")
        if not reason.isascii() or not reason.isprintable():
            raise ValueError("reason phrase must be printable ASCII")
        return f"HTTP/1.1 {status} {reason}\r\n".encode("ascii")
    line = _STATUS_LINES.get(status)
    if line is None:
        raise ValueError(f"unknown HTTP status {status}")
    return line


def response(
    status: int,
    body: bytes,
    *,
    content_type: bytes = b"text/plain; charset=utf-8",
    keep_alive: bool = False,
    extra_headers: tuple[tuple[bytes, bytes], ...] = (),
    reason: str | None = None,
) -> bytes:
    """A complete HTTP/1.1 response (invariant 4)."""
    parts = [
        status_line(status, reason),
        b"Server: ",
        SERVER_NAME,
        b"\r\nContent-Type: ",
        content_type,
        b"\r\nContent-Length: ",
        str(len(body)).encode("ascii"),
        b"\r\nConnection: keep-alive\r\n" if keep_alive else b"\r\nConnection: close\r\n",
    ]
    for name, value in extra_headers:
        parts += [name, b": ", value, b"\r\n"]
    parts += [b"\r\n", body]
    return b"".join(parts)


def error_response(
    status: int,
    message: str,
    *,
    keep_alive: bool = False,
    extra_headers: tuple[tuple[bytes, bytes], ...] = (),
    reason: str | None = None,
) -> bytes:
    """A small unsigned plain-text error answer: ``message`` and a newline."""
    body = message.encode("utf-8", "replace") + b"\n"
    return response(
        status, body, keep_alive=keep_alive, extra_headers=extra_headers, reason=reason
    )


# -- responses received (the client side) -----------------------------------------


@dataclass(frozen=True, slots=True)
class Response:
    """A complete HTTP response received by a client."""

    status: int
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes

    def header(self, name: bytes) -> bytes | None:
        """The value of the first header called ``name`` (case-insensitive)."""
        return first_header(self.headers, name)


class _ResponseParts:
    """httptools' callbacks for ``parse_response``: interim (1xx) answers
    before the response are dropped, bytes after it are noted."""

    def __init__(self) -> None:
        self.parser: httptools.HttpResponseParser | None = None
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = bytearray()
        #: The head of the message being parsed is whole.
        self.head_done = False
        self.complete = False
        #: Another message began after the response was complete.
        self.trailing = False

    def on_message_begin(self) -> None:
        if self.complete:
            self.trailing = True
        else:  # the first message, or the one after an interim answer
            self.headers.clear()
            self.body.clear()
            self.head_done = False

    def on_headers_complete(self) -> None:
        if not self.complete:
            self.head_done = True

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.complete:
            self.headers.append((bytes(name), bytes(value)))

    def on_body(self, body: bytes) -> None:
        if not self.complete:
            self.body += body

    def on_message_complete(self) -> None:
        if self.complete:
            return
        assert self.parser is not None
        status = self.parser.get_status_code()
        if 100 <= status < 200 and status != SWITCHING_PROTOCOLS:
            return  # 100 Continue, 103 Early Hints...: the response follows
        self.status = status
        self.complete = True


#: A server that switches protocols answers no request of ours (none asks
#: to upgrade): for a client, it is a malformed answer.
SWITCHING_PROTOCOLS = 101


def parse_response(data: bytes) -> Response:
    """The response in ``data``: everything a server sent before it closed
    the connection (the client asked with ``Connection: close``). A body
    without ``Content-Length`` runs to the end of ``data``. Interim answers
    (``100 Continue``, ``103 Early Hints``, any 1xx but 101) before it are
    skipped, as RFC 9110 15.2 asks of clients.

    Error handling: ``ProtocolError`` with status 502 (the server
    misbehaved) for a malformed or truncated response, a ``101`` (no
    request of ours asks to switch protocols), a final status outside
    200-599, only interim answers, or bytes after the response.
    """
    parts = _ResponseParts()
    parser = parts.parser = httptools.HttpResponseParser(parts)
    try:
        parser.feed_data(data)
    except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
        # httptools raises HttpParserUpgrade (not an HttpParserError) or
        # "Pause on CONNECT/Upgrade" for a 101.
        if parser.get_status_code() == SWITCHING_PROTOCOLS:
            raise ProtocolError("unexpected 101 Switching Protocols", status=502) from None
        reason = (str(exc) or type(exc).__name__)[:80]
        raise ProtocolError(f"malformed response: {reason}", status=502) from None
    if parts.trailing:
        raise ProtocolError("malformed response: more bytes after it", status=502)
    headers = tuple(parts.headers)
    if not parts.complete:
        framed = any(
            name.lower() in (b"content-length", b"transfer-encoding") for name, _ in headers
        )
        status = parser.get_status_code()
        if framed or not parts.head_done or 100 <= status < 200:
            raise ProtocolError("truncated response", status=502)
        parts.status = status
    if not 200 <= parts.status <= 599:
        raise ProtocolError(f"malformed response: status {parts.status}", status=502)
    return Response(parts.status, headers, bytes(parts.body))
