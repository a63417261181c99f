"""HTTP/1.x requests in, response bytes out: the sans-IO edge of every
listener, built on httptools (llhttp) for parsing.

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

DEFAULT_MAX_HEADER_BYTES = 8 * 1024
DEFAULT_MAX_HEADERS = 64
DEFAULT_MAX_BODY_BYTES = 4 * 1024
SERVER_NAME = b"notary"
#: The version llhttp reports for a request line without one (``GET /x``,
#: HTTP/0.9's only form). A written ``HTTP/0.9`` is reported the same way;
#: HTTP/0.9 requests never carried that token, so it is malformed too (400).
_NO_VERSION = "0.9"


class Request:
    """One complete HTTP request.

    A plain slotted class (not a dataclass: one is built per request, and the
    generated machinery costs more than the parsing); treat it as immutable.
    Equal when every field is equal.
    """

    __slots__ = ("body", "headers", "keep_alive", "method", "target", "upgrade", "version")

    def __init__(
        self,
        method: bytes,
        target: bytes,  # the request-target as sent, e.g. b"/target/example.com+443"
        version: str,  # "1.0" or "1.1"
        headers: tuple[tuple[bytes, bytes], ...],
        body: bytes,
        keep_alive: bool,
        upgrade: bool = False,
    ) -> None:
        self.method = method
        self.target = target
        self.version = version
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive
        self.upgrade = upgrade

    def _fields(self) -> tuple:
        return (
            self.method, self.target, self.version, self.headers, self.body,
            self.keep_alive, self.upgrade,
        )

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not Request:
            return NotImplemented
        return self._fields() == other._fields()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return (
            f"Request(method={self.method!r}, target={self.target!r}, "
            f"version={self.version!r}, headers={self.headers!r}, body={self.body!r}, "
            f"keep_alive={self.keep_alive!r}, upgrade={self.upgrade!r})"
        )

    def header(self, name: bytes) -> bytes | None:
        """The value of the first header called ``name`` (case-insensitive)."""
        return first_header(self.headers, name)


def first_header(headers: tuple[tuple[bytes, bytes], ...], name: bytes) -> bytes | None:
    """The value of the first of ``headers`` called ``name`` (case-insensitive)."""
    name = name.lower()
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


class RequestReader:
    """Feed it the bytes of one connection; it returns complete requests.

    Error handling: ``feed`` raises ``ProtocolError`` (carrying the status to
    answer with) when the peer breaks HTTP or a bound; the connection should
    then be answered with that status and closed. Requests completed before
    the error are lost with it only if they were in the same ``feed`` call.
    """

    __slots__ = (
        "_blank_lines",
        "_body",
        "_completed",
        "_error",
        "_head_bytes",
        "_headers",
        "_idle_bytes",
        "_in_request",
        "_keep_alive",
        "_max_body_bytes",
        "_max_header_bytes",
        "_max_headers",
        "_message",
        "_method",
        "_parser",
        "_progressed",
        "_target",
        "_version",
        "finished",
        "leftover",
    )

    def __init__(
        self,
        *,
        max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
        max_headers: int = DEFAULT_MAX_HEADERS,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> None:
        self._max_header_bytes = max_header_bytes
        self._max_headers = max_headers
        self._max_body_bytes = max_body_bytes
        self._parser = httptools.HttpRequestParser(self)
        # The request being received (valid while ``_in_request``): kept in
        # the reader's own slots, reset by ``on_message_begin``.
        self._in_request = False
        #: Counts messages begun: tells ``feed`` whether a new one started.
        self._message = 0
        self._target = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._body = b""
        self._head_bytes = 0
        #: Bytes fed, in whole ``feed`` calls, since the last parser callback:
        #: httptools buffers a header name/value until it ends, unseen by us.
        self._idle_bytes = 0
        self._method = b""
        self._version = "1.1"
        self._keep_alive = True
        self._completed: list[Request] = []
        self._error: ProtocolError | None = None
        self._progressed = False
        #: Only empty lines received since the last request (invariant 5).
        self._blank_lines = False
        self.finished = False
        #: Bytes received after an upgrade request's head (invariant 3).
        self.leftover = b""

    @property
    def in_request(self) -> bool:
        """True while part of a request has been received (empty lines
        before a request line included: invariant 5)."""
        return self._in_request or self._blank_lines

    def feed(self, data: bytes) -> list[Request]:
        """Parse ``data``; return the requests it completed (maybe none)."""
        if self.finished or not data:
            return []
        in_request_before = self._in_request
        message_before = self._message
        self._progressed = False
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            self.finished = True
            offset = upgrade.args[0] if upgrade.args else len(data)
            self.leftover = bytes(data[offset:])
        except httptools.HttpParserCallbackError:
            # httptools does not chain the callback's exception: _fail kept it.
            self.finished = True
            error, self._error = self._error, None
            if error is None:
                raise
            raise error from None
        except httptools.HttpParserError as exc:
            self.finished = True
            last = self._completed[-1] if self._completed else None
            if last is None or last.keep_alive:
                if str(exc) == "Invalid HTTP version":  # llhttp's own check
                    raise ProtocolError("HTTP version not supported", status=505) from None
                raise ProtocolError(f"malformed request: {_reason(exc)}") from None
            # Bytes after a request that closes the connection are ignored.
        if self._in_request:
            if in_request_before and self._message == message_before and not self._progressed:
                # No callback fired: every byte of ``data`` went into httptools'
                # buffer of an unfinished header line (invariant 1).
                self._idle_bytes += len(data)
                if self._idle_bytes > self._max_header_bytes:
                    self.finished = True
                    raise ProtocolError("request header too large", status=431)
            else:
                self._idle_bytes = 0
        elif self._message == message_before and not self._completed:
            # No request began or ended: llhttp skipped every byte, which it
            # does only for the empty lines before a request line.
            self._blank_lines = True
        done = self._completed
        if done:
            self._completed = []
            last = done[-1]
            if not last.keep_alive or last.upgrade:
                self.finished = True
        return done

    # -- httptools callbacks ------------------------------------------------------

    def on_message_begin(self) -> None:
        self._progressed = True
        self._in_request = True
        self._blank_lines = False
        self._message += 1
        self._target = b""
        self._headers = []
        self._body = b""
        self._head_bytes = 0
        self._idle_bytes = 0
        self._method = b""
        self._version = "1.1"
        self._keep_alive = True

    def on_url(self, url: bytes) -> None:
        self._progressed = True
        self._target += url
        self._head_bytes += len(url)
        if self._head_bytes > self._max_header_bytes:
            self._fail(ProtocolError("request header too large", status=431))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._progressed = True
        self._head_bytes += len(name) + len(value) + 4
        if self._head_bytes > self._max_header_bytes:
            self._fail(ProtocolError("request header too large", status=431))
        headers = self._headers
        if len(headers) >= self._max_headers:
            self._fail(ProtocolError("too many header fields", status=431))
        headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._progressed = True
        parser = self._parser
        version = self._version = parser.get_http_version()
        if version != "1.1" and version != "1.0":
            if version == _NO_VERSION:
                self._fail(ProtocolError("malformed request: no HTTP version"))
            self._fail(ProtocolError("HTTP version not supported", status=505))
        self._method = parser.get_method()
        self._keep_alive = parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self._progressed = True
        if len(self._body) + len(body) > self._max_body_bytes:
            self._fail(ProtocolError("request body too large", status=413))
        self._body += body

    def on_message_complete(self) -> None:
        self._progressed = True
        self._in_request = False
        upgrade = self._parser.should_upgrade()
        self._completed.append(
            Request(
                self._method,
                self._target,
                self._version,
                tuple(self._headers),
                self._body,
                self._keep_alive and not upgrade,
                upgrade,
            )
        )

    def _fail(self, error: ProtocolError) -> None:
        self._error = error
        raise error


def _reason(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text[:80]


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
    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = bytearray()
        self.complete = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((bytes(name), bytes(value)))

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.complete = True


def parse_response(data: bytes) -> Response:
    """The response in ``data``: everything a server sent before it closed
    the connection (the client asked with ``Connection: close``). A body
    without ``Content-Length`` runs to the end of ``data``.

    Error handling: ``ProtocolError`` with status 502 (the server
    misbehaved) for a malformed or truncated response.
    """
    parts = _ResponseParts()
    parser = httptools.HttpResponseParser(parts)
    try:
        parser.feed_data(data)
    except httptools.HttpParserError as exc:
        raise ProtocolError(f"malformed response: {_reason(exc)}", status=502) from None
    headers = tuple(parts.headers)
    status = parser.get_status_code()
    if not parts.complete:
        framed = any(
            name.lower() in (b"content-length", b"transfer-encoding") for name, _ in headers
        )
        if framed or not data or b"\r\n\r\n" not in data:
            raise ProtocolError("truncated response", status=502)
    return Response(status, headers, bytes(parts.body))
