"""Reading a notary's transparency log over HTTPS (docs/log.md, "Watching a
notary's log"): ``GET`` requests under ``/v2/log/`` to the first host of a
bundle that answers, over TLS pinned to the bundle's certificate as
``notary check`` does (:mod:`notary.client.check`), on one keep-alive
connection.

An I/O edge (Trio). :class:`LogFetcher` frames responses itself
(httptools, ``Content-Length``), so a whole log is read over one
connection rather than one TLS handshake per tile.

Resource handling: a :class:`LogFetcher` owns at most one connection,
opened on the first request (and again when the notary closed it), closed
by :meth:`LogFetcher.aclose` (``async with``). Every request, connecting
included, runs under ``timeout_s``, which a notary dripping bytes cannot
extend; at most ``max_bytes`` of body (and :data:`MAX_HEAD_BYTES` of
head) are read per response.

Error handling: every failure to get a complete response (no host
connects, wrong pin, timeout, connection lost, a malformed or oversized
response) is :class:`LogUnreachable` with a one-line reason; a response
with any status is returned (the caller decides what 404 means), but for
interim answers (1xx), which are skipped, and a notary's ``429``/``503``
with ``Retry-After`` (its per-client budget, or the bytes it holds for
slow readers: docs/security.md, "Limits"), which is asked again after that wait,
at most :data:`MAX_RETRY_AFTER_S` each and :data:`MAX_RETRIES` times.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from types import TracebackType

import httptools
import trio

from notary.client.check import DEFAULT_TIMEOUT_S, one_line
from notary.client.reach import NotaryFailed, connect_direct, host_authority, pinned_tls, wire_host
from notary.errors import NotaryError, PeerError
from notary.outbound.dialer import Resolver, system_resolver
from notary.protocol.bundle import Bundle, BundleHost

__all__ = ["LOG_PATH", "MAX_HEAD_BYTES", "LogFetcher", "LogResponse", "LogUnreachable"]

#: Where a notary serves its log (``notary.server.logapi``).
LOG_PATH = "/v2/log/"
#: The most bytes of a response's status line and headers read.
MAX_HEAD_BYTES = 16 * 1024
_CHUNK_BYTES = 64 * 1024
#: A request refused for now (429, 503 with ``Retry-After``) is made again
#: at most this many times, waiting at most this long each time.
MAX_RETRIES = 10
MAX_RETRY_AFTER_S = 60
#: Statuses a notary answers with ``Retry-After`` when it is busy.
_BUSY = (429, 503)


class LogUnreachable(NotaryError):
    """The notary's log could not be read: no host answered, its certificate
    is not the pinned one, no complete response in time, or a response that
    is not HTTP or larger than allowed."""


@dataclass(frozen=True, slots=True)
class LogResponse:
    status: int
    body: bytes
    #: ``Retry-After`` in whole seconds (None: absent or not a number).
    retry_after_s: int | None = None


class _Parts:
    """httptools callbacks: the body, and whether the message ended; an
    interim answer (1xx but 101, which httptools raises) is skipped."""

    def __init__(self) -> None:
        self.parser: httptools.HttpResponseParser | None = None
        self.body = bytearray()
        self.headers_done = False
        self.complete = False
        self.close = False
        self.retry_after: bytes | None = None

    def on_message_begin(self) -> None:
        self.body.clear()
        self.headers_done = False
        self.close = False
        self.retry_after = None

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"connection" and b"close" in value.lower():
            self.close = True
        elif name == b"retry-after":
            self.retry_after = bytes(value)

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        assert self.parser is not None
        if not 100 <= self.parser.get_status_code() < 200:
            self.complete = True


class LogFetcher:
    """``GET``s of one notary's log, from the first host of ``bundle``
    that answers; :attr:`host` is that host once connected.

    See the module docstring for resources and errors.
    """

    def __init__(
        self, bundle: Bundle, *, timeout_s: float = DEFAULT_TIMEOUT_S,
        resolver: Resolver = system_resolver,
    ) -> None:
        self._bundle = bundle
        self._timeout_s = timeout_s
        self._resolver = resolver
        self._stream: trio.SSLStream[trio.SocketStream] | None = None
        self.host: BundleHost | None = None
        #: Requests made, and connections opened (one per keep-alive run).
        self.requests = 0
        self.connections = 0

    async def __aenter__(self) -> LogFetcher:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection, if one is open."""
        if self._stream is not None:
            stream, self._stream = self._stream, None
            await trio.aclose_forcefully(stream)

    async def connect(self) -> BundleHost:
        """Connect (if not connected) and return the host that answered.
        Raises :class:`LogUnreachable`."""
        try:
            with trio.fail_after(self._timeout_s):
                await self._connect()
        except trio.TooSlowError:
            raise LogUnreachable(
                f"{self._bundle.name}: no connection within {self._timeout_s:g} s"
            ) from None
        assert self.host is not None
        return self.host

    async def get(self, path: str, *, max_bytes: int) -> LogResponse:
        """``GET /v2/log/<path>``: the response's status and body (at most
        ``max_bytes``). A connection the notary closed since the last
        response is replaced once. Raises :class:`LogUnreachable`."""
        url = LOG_PATH + path
        for _ in range(MAX_RETRIES):
            response = await self._get(url, max_bytes)
            wait = response.retry_after_s
            if response.status not in _BUSY or wait is None:
                return response
            await trio.sleep(min(wait, MAX_RETRY_AFTER_S))
        return await self._get(url, max_bytes)

    async def _get(self, url: str, max_bytes: int) -> LogResponse:
        """One ``GET`` of ``url`` (``get`` without the waits when busy)."""
        try:
            with trio.fail_after(self._timeout_s):
                reused = self._stream is not None
                try:
                    return await self._request(url, max_bytes)
                except _Closed:
                    if not reused:
                        raise LogUnreachable(
                            f"{self.host_name}: connection closed before answering {url}"
                        ) from None
                return await self._request(url, max_bytes)
        except trio.TooSlowError:
            await self.aclose()
            raise LogUnreachable(
                f"{self.host_name}: no answer to {url} within {self._timeout_s:g} s"
            ) from None
        except _Closed:
            raise LogUnreachable(
                f"{self.host_name}: connection closed before answering {url}"
            ) from None

    @property
    def host_name(self) -> str:
        """The notary's name and the host connected to, for messages."""
        host = f" ({self.host.host})" if self.host is not None else ""
        return f"{self._bundle.name}{host}"

    async def _connect(self) -> trio.SSLStream[trio.SocketStream]:
        if self._stream is not None:
            return self._stream
        try:
            tcp, host = await connect_direct(self._bundle, self._resolver)
            self._stream = await pinned_tls(self._bundle, host, tcp)
        except NotaryFailed as failed:
            raise LogUnreachable(f"{self._bundle.name}: {one_line(failed.detail)}") from None
        except PeerError as exc:
            raise LogUnreachable(f"{self._bundle.name}: {one_line(str(exc))}") from None
        self.host = host
        self.connections += 1
        return self._stream

    async def _request(self, url: str, max_bytes: int) -> LogResponse:
        """One request on the open connection (opened if none); ``_Closed``
        when the connection ends before any byte of the response."""
        stream = await self._connect()
        assert self.host is not None
        try:
            authority = host_authority(wire_host(self.host))
        except NotaryFailed as failed:
            await self.aclose()
            raise LogUnreachable(f"{self._bundle.name}: {failed.detail}") from None
        request = f"GET {url} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode("ascii")
        parts = _Parts()
        parser = parts.parser = httptools.HttpResponseParser(parts)
        received = 0
        self.requests += 1
        try:
            await stream.send_all(request)
            while not parts.complete:
                chunk = await stream.receive_some(_CHUNK_BYTES)
                if not chunk:
                    if received == 0:
                        raise _Closed
                    raise self._failed(f"truncated response to {url}")
                received += len(chunk)
                parser.feed_data(chunk)
                if not parts.headers_done and received > MAX_HEAD_BYTES:
                    raise self._failed(f"response head to {url} is too large")
                if len(parts.body) > max_bytes:
                    raise self._failed(f"response to {url} is larger than {max_bytes} bytes")
        except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError):
            await self.aclose()
            if received == 0:
                raise _Closed from None
            raise self._failed(f"connection lost during the response to {url}") from None
        except httptools.HttpParserUpgrade:
            await self.aclose()
            raise self._failed(f"unexpected upgrade in the response to {url}") from None
        except httptools.HttpParserError as exc:
            await self.aclose()
            reason = one_line(str(exc) or type(exc).__name__, 80)
            raise self._failed(f"malformed response to {url}: {reason}") from None
        except BaseException:
            await self.aclose()
            raise
        # (httptools' should_keep_alive() is reset once a message completes.)
        if parts.close or parser.get_http_version() != "1.1":
            await self.aclose()
        retry_after = parts.retry_after
        return LogResponse(
            parser.get_status_code(), bytes(parts.body),
            int(retry_after) if retry_after is not None and retry_after.isdigit()
            and len(retry_after) < 10 else None,
        )

    def _failed(self, reason: str) -> LogUnreachable:
        return LogUnreachable(f"{self.host_name}: {reason}")


class _Closed(Exception):
    """The connection ended before the response's first byte (a keep-alive
    connection the notary closed meanwhile)."""
