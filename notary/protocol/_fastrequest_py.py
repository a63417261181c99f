"""The request path's hot parts, pure Python (issue 21): the twin of the
compiled ``notary.protocol._fastrequest``, and the reference of its
behaviour. ``notary.protocol.hotpath`` picks one (``notary.extensions``);
the test suite and the fuzz tests run against both.

* ``Request`` and ``RequestReader``: HTTP/1.x requests parsed by httptools
  (the reader is the parser's callback object; the invariants are
  ``notary.protocol.http``'s);
* ``plain_form_fingerprint``: the fingerprint of the form body every
  Convergence client sends, or None for any other body;
* ``ConvergenceQueries``: the target and fingerprint of a ``/target/`` query,
  with a memo of the targets' path segments.

Sans-IO: no sockets, no clock.
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Callable

import httptools

from notary.errors import ProtocolError
from notary.model.targets import Target

DEFAULT_MAX_HEADER_BYTES = 8 * 1024
DEFAULT_MAX_HEADERS = 64
DEFAULT_MAX_BODY_BYTES = 4 * 1024
#: The version llhttp reports for a request line without one (``GET /x``,
#: HTTP/0.9's only form). A written ``HTTP/0.9`` is reported the same way;
#: HTTP/0.9 requests never carried that token, so it is malformed too (400).
_NO_VERSION = "0.9"
_PLAIN_FORM_RE = re.compile(rb"fingerprint=([0-9A-Fa-f]{2}(?::[0-9A-Fa-f]{2}){19})")


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
        return self._fields() == other._fields()

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
        self._in_request = False
        #: Counts messages begun: tells ``feed`` whether a new one started.
        self._message = 0
        self._idle_bytes = 0
        self._new_request()
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

    def _new_request(self) -> None:
        """The request being received (valid while ``_in_request``), kept in
        the reader's own slots: their values before its first byte."""
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

    def on_message_begin(self) -> None:
        self._progressed = True
        self._in_request = True
        self._blank_lines = False
        self._message += 1
        self._new_request()

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


def first_header(headers: tuple[tuple[bytes, bytes], ...], name: bytes) -> bytes | None:
    """The value of the first of ``headers`` called ``name`` (case-insensitive)."""
    name = name.lower()
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


def browser_headers(
    headers: tuple[tuple[bytes, bytes], ...],
) -> tuple[bytes | None, bytes | None, bytes | None] | None:
    """The first ``Origin``, ``Host`` and ``Sec-Fetch-Site`` of ``headers``,
    or None when there is neither an ``Origin`` nor a ``Sec-Fetch-Site`` (a
    request no browser sent: the common case, decided in one pass)."""
    origin = host = fetch_site = None
    for name, value in headers:
        size = len(name)
        if size == 6:
            if origin is None and name.lower() == b"origin":
                origin = value
        elif size == 4:
            if host is None and name.lower() == b"host":
                host = value
        elif size == 14 and fetch_site is None and name.lower() == b"sec-fetch-site":
            fetch_site = value
    if origin is None and fetch_site is None:
        return None
    return origin, host, fetch_site


def _reason(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text[:80]


# -- Convergence queries ------------------------------------------------------------


def plain_form_fingerprint(body: bytes) -> bytes | None:
    """The 20 bytes of ``body`` when it is exactly ``fingerprint=AA:BB:...``
    (20 hex pairs, either case, colons unencoded: what every client sends);
    None for any other body (the general form parser then decides)."""
    match = _PLAIN_FORM_RE.fullmatch(body)
    if match is None:
        return None
    return binascii.a2b_hex(match[1].replace(b":", b""))


class ConvergenceQueries:
    """Parses ``/target/<host>+<port>[/<ip>]`` queries: the target (through
    ``parse_segment``, memoised: normalisation is pure, so the memo is exact;
    errors are never stored; at most ``max_entries``, emptied when full) and,
    for ``POST``, the fingerprint of the form body (``plain_form_fingerprint``,
    else ``parse_form``). Both parsers raise ``ProtocolError``."""

    __slots__ = ("_max_entries", "_max_target_bytes", "_memo", "_parse_form", "_parse_segment",
                 "_prefix_bytes")

    def __init__(
        self, *, prefix: bytes, max_target_bytes: int, max_entries: int,
        parse_segment: Callable[[bytes], Target], parse_form: Callable[[bytes], bytes],
    ) -> None:
        self._prefix_bytes = len(prefix)
        self._max_target_bytes = max_target_bytes
        self._max_entries = max_entries
        self._parse_segment = parse_segment
        self._parse_form = parse_form
        self._memo: dict[bytes, Target] = {}

    def parse(self, method: bytes, path: bytes, body: bytes) -> tuple[Target, bytes | None]:
        """The target and fingerprint (None unless ``POST``) of a query whose
        ``path`` starts with the prefix (a query string after it, ``?...``,
        is ignored); ``ProtocolError`` for a bad one (414 for a target over
        ``max_target_bytes``)."""
        rest = path[self._prefix_bytes:].partition(b"?")[0]
        if len(rest) > self._max_target_bytes:
            raise ProtocolError("target too long", status=414)
        # The IP after the target is accepted and not used (the notary
        # observes from its own vantage).
        segment = rest.partition(b"/")[0]
        memo = self._memo
        target = memo.get(segment)
        if target is None:
            target = self._parse_segment(segment)
            if len(memo) >= self._max_entries:
                memo.clear()
            memo[segment] = target
        if method == b"POST":
            fingerprint = plain_form_fingerprint(body)
            if fingerprint is None:
                fingerprint = self._parse_form(body)
            return target, fingerprint
        return target, None

    def __len__(self) -> int:
        return len(self._memo)

    def __contains__(self, segment: object) -> bool:
        """Whether the memo holds the path segment ``segment``."""
        return segment in self._memo
