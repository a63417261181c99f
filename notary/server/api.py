"""Routing of the HTTPS query API (Convergence ``/target/...``, Perspectives
``/?host=...``, the index, the bundle file) and of the plain-HTTP Perspectives
port onto the query service.

Every bad request gets a short unsigned plain-text answer with the right
status; nothing here raises to the connection handler.
"""

from __future__ import annotations

from urllib.parse import unquote

from notary.errors import ProtocolError
from notary.protocol import convergence, http, perspectives, v2
from notary.protocol.http import Request
from notary.protocol.targets import Target, parse_convergence_target
from notary.server.query import Answer, QueryService

TARGET_PREFIX = b"/target/"
V2_QUERY_PATH = b"/v2/query"
V2_KEY_PATH = b"/v2/key"
MAX_TARGET_BYTES = 1024
#: Most entries of the memo from a raw ``host+port`` path segment to its
#: normalised target; the memo is emptied when it is full.
TARGET_MEMO_ENTRIES = 4096
def _allowed_methods(path: bytes) -> bytes:
    """The ``Allow`` header of a 405 for ``path``."""
    if path.startswith(TARGET_PREFIX):
        return b"GET, POST"
    return b"POST" if path == V2_QUERY_PATH else b"GET"


class ApiHandler:
    """The ``Handler`` of an API connection (see ``serve_http_connection``)."""

    def __init__(
        self,
        service: QueryService,
        *,
        index_text: str,
        bundle_path: str | None = None,
        bundle_bytes: bytes | None = None,
        perspectives: bool = False,
        v2_key_document: bytes | None = None,
        v2_max_batch: int = 100,
        v2_max_body_bytes: int = 0,
    ) -> None:
        self._service = service
        self._perspectives = perspectives
        #: The ``/v2/key`` body; None when v2 is not served.
        self._v2_key_document = v2_key_document
        self._v2_max_batch = v2_max_batch
        self._v2_max_body_bytes = v2_max_body_bytes
        self._index = index_text.encode("utf-8")
        self._bundle_path = bundle_path.encode("ascii") if bundle_path else None
        self._bundle_bytes = bundle_bytes
        #: Raw target path segment -> its Target. Normalisation is pure, so
        #: a memo is exact; errors are never stored. Bounded by clearing.
        self._targets: dict[bytes, Target] = {}

    async def __call__(self, request: Request) -> tuple[bytes, bool]:
        keep_alive = request.keep_alive
        try:
            path, _, query = request.target.partition(b"?")
            if path.startswith(TARGET_PREFIX):
                answer = await self._target(request, path[len(TARGET_PREFIX):])
                if answer.__class__ is bytes:  # a complete prepared response
                    return answer, keep_alive
                status, body, content_type, extra = (
                    answer.status, answer.body, answer.content_type, ()
                )
            else:
                status, body, content_type, extra = await self._route(request, path, query)
        except ProtocolError as exc:
            status, body = exc.status, exc.message.encode("utf-8") + b"\n"
            content_type, extra = b"text/plain; charset=utf-8", ()
            if status == 405:
                extra = ((b"Allow", _allowed_methods(request.target.partition(b"?")[0])),)
        if status >= 500:
            keep_alive = keep_alive and status == 503
        return (
            http.response(
                status, body, content_type=content_type, keep_alive=keep_alive,
                extra_headers=extra,
            ),
            keep_alive,
        )

    async def _route(
        self, request: Request, path: bytes, query: bytes
    ) -> tuple[int, bytes, bytes, tuple]:
        if self._v2_key_document is not None and path in (V2_QUERY_PATH, V2_KEY_PATH):
            return await self._v2(request, path)
        if request.method != b"GET":
            raise ProtocolError("method not allowed", status=405)
        if path == b"/":
            if self._perspectives and query:
                target = perspectives.parse_query(query)
                if target is not None:
                    answer = await self._service.answer_perspectives(target)
                    return answer.status, answer.body, answer.content_type, ()
            return 200, self._index, b"text/plain; charset=utf-8", ()
        if self._bundle_path is not None and path == self._bundle_path:
            return 200, self._bundle_bytes, b"application/octet-stream", (
                (b"Content-Disposition", b'attachment; filename="' + path[1:] + b'"'),
            )
        raise ProtocolError("not found", status=404)

    async def _v2(self, request: Request, path: bytes) -> tuple[int, bytes, bytes, tuple]:
        if path == V2_KEY_PATH:
            if request.method != b"GET":
                raise ProtocolError("method not allowed", status=405)
            assert self._v2_key_document is not None
            return 200, self._v2_key_document, v2.CONTENT_TYPE, ()
        if request.method != b"POST":
            raise ProtocolError("method not allowed", status=405)
        query = v2.parse_query_request(
            request.body, max_batch=self._v2_max_batch, max_body_bytes=self._v2_max_body_bytes
        )
        answer = await self._service.answer_v2(query)
        return answer.status, answer.body, answer.content_type, ()

    async def _target(self, request: Request, rest: bytes) -> bytes | Answer:
        """A Convergence query: the complete response prepared for a cache
        hit, else the ``Answer`` to wrap."""
        method = request.method
        if method != b"POST" and method != b"GET":
            raise ProtocolError("method not allowed", status=405)
        if len(rest) > MAX_TARGET_BYTES:
            raise ProtocolError("target too long", status=414)
        # /target/<host>+<port>[/<ip the client connected to>]: the IP is
        # accepted and not used (the notary observes from its own vantage).
        segment = rest.partition(b"/")[0]
        target = self._targets.get(segment)
        if target is None:
            target = _parse_target(segment)
            if len(self._targets) >= TARGET_MEMO_ENTRIES:
                self._targets.clear()
            self._targets[segment] = target
        fingerprint = None
        if method == b"POST":
            fingerprint = convergence.parse_fingerprint_form(request.body)
        return await self._service.respond(target, fingerprint, request.keep_alive)


def _parse_target(segment: bytes) -> Target:
    """The target named by a raw ``host+port`` path segment; ``ProtocolError``
    (400) when it names none."""
    try:
        text = unquote(segment.decode("ascii"), errors="strict")
    except (UnicodeDecodeError, ValueError):
        raise ProtocolError("target is not valid percent-encoded UTF-8") from None
    return parse_convergence_target(text)


class PerspectivesHandler:
    """The ``Handler`` of the plain-HTTP Perspectives port: ``GET
    /?host=&port=&service_type=2`` answers, ``GET /`` the index page."""

    def __init__(self, service: QueryService, *, index_page: bytes) -> None:
        self._service = service
        self._index_page = index_page

    async def __call__(self, request: Request) -> tuple[bytes, bool]:
        keep_alive = request.keep_alive
        try:
            path, _, query = request.target.partition(b"?")
            if path != b"/":
                raise ProtocolError("not found", status=404)
            if request.method != b"GET":
                raise ProtocolError("method not allowed", status=405)
            target = perspectives.parse_query(query)
            if target is None:
                return self._index_page, False
            answer = await self._service.answer_perspectives(target)
        except ProtocolError as exc:
            extra = ((b"Allow", b"GET"),) if exc.status == 405 else ()
            return http.error_response(
                exc.status, exc.message, keep_alive=keep_alive, extra_headers=extra
            ), keep_alive
        return http.response(
            answer.status, answer.body, content_type=answer.content_type, keep_alive=keep_alive
        ), keep_alive
