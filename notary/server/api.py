"""Routing of the HTTPS query API (Convergence ``/target/...``, Perspectives
``/?host=...``, the index, the bundle file) and of the plain-HTTP Perspectives
port onto the query service. With ``web`` (``notary.server.web``), ``/``,
``/site...`` and ``/static/...`` are the web pages for people; without it
``/`` is a plain-text index.

Every bad request gets a short unsigned plain-text answer with the right
status; nothing here raises to the connection handler. A query over its
client's rate gets 429 with ``Retry-After`` (whole seconds).

``client`` (every entry point takes it; None: unlimited) is the client
prefix key of the connection (``notary.service.abuse``), bound per
connection by ``app.ConnectionHandler``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from notary.errors import ProtocolError
from notary.model.ratelimit import Overloaded, RateLimited
from notary.model.targets import Target
from notary.protocol import bundle, convergence, http, perspectives, v2
from notary.protocol.http import Request
from notary.server.logapi import LOG_PREFIX, LogPages
from notary.server.web import WebPages
from notary.server.witness import ADD_CHECKPOINT_PATH, WITNESS_PREFIX, Witness
from notary.service.query import Answer, QueryService
from notary.web.headers import is_cross_site_request

TARGET_PREFIX = b"/target/"
V2_QUERY_PATH = b"/v2/query"
V2_KEY_PATH = b"/v2/key"
MAX_TARGET_BYTES = 1024
#: Most entries of the memo from a raw ``host+port`` path segment to its
#: normalised target; the memo is emptied when it is full.
TARGET_MEMO_ENTRIES = 4096
#: The 403 of a query a browser sent for another site's page.
CROSS_SITE_MESSAGE = "queries are not accepted from another site's page"


def refuse_cross_site(request: Request) -> None:
    """Raise ``ProtocolError`` (403) when a browser sent ``request`` for
    another site's page (``Origin`` / ``Sec-Fetch-Site``): every endpoint
    that can start a probe refuses it, so no page elsewhere spends its
    visitors' query and probe budgets here. Programs and the 2011 add-on
    send neither header and are unaffected."""
    if is_cross_site_request(request.headers):
        raise ProtocolError(CROSS_SITE_MESSAGE, status=403)


def _extra_headers(exc: ProtocolError, path: bytes) -> tuple[tuple[bytes, bytes], ...]:
    """The headers an error answer needs: ``Allow`` (405), ``Retry-After``
    (429; a 503 of ``Overloaded``)."""
    if exc.status == 405:
        return ((b"Allow", _allowed_methods(path)),)
    if isinstance(exc, RateLimited | Overloaded):
        return ((b"Retry-After", b"%d" % exc.retry_after_s),)
    return ()


def _allowed_methods(path: bytes) -> bytes:
    """The ``Allow`` header of a 405 for ``path``."""
    if path.startswith(TARGET_PREFIX):
        return b"GET, POST"
    return b"POST" if path in (V2_QUERY_PATH, ADD_CHECKPOINT_PATH) else b"GET"


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
        web: WebPages | None = None,
        rejected: Counter[tuple[str, int]] | None = None,
        log: LogPages | None = None,
        witness: Witness | None = None,
    ) -> None:
        self._service = service
        #: The witness endpoint under ``/v2/witness/`` (None: not a witness).
        self._witness = witness
        #: The transparency log's pages under ``/v2/log/`` (None: no log).
        self._log = log
        #: The web pages (None: ``/`` is the plain-text index).
        self._web = web
        self._perspectives = perspectives
        #: The ``/v2/key`` body; None when v2 is not served.
        self._v2_key_document = v2_key_document
        self._v2_max_batch = v2_max_batch
        self._v2_max_body_bytes = v2_max_body_bytes
        self._index = index_text.encode("utf-8")
        self._bundle_path = bundle_path.encode("ascii") if bundle_path else None
        self._bundle_bytes = bundle_bytes
        #: /target/ queries' parser, with its memo of raw path segments.
        self._queries = convergence.query_parser(
            prefix=TARGET_PREFIX, max_target_bytes=MAX_TARGET_BYTES,
            max_entries=TARGET_MEMO_ENTRIES,
        )
        #: Queries refused before the service saw them: (protocol, status)
        #: -> count (the service counts the ones it answers; the metrics,
        #: given the same counter, read it).
        self.rejected: Counter[tuple[str, int]] = rejected if rejected is not None else Counter()

    @property
    def bundle_bytes(self) -> bytes | None:
        """The served bundle; replaced on reload (SIGHUP), and with it the
        identity the web page shows."""
        return self._bundle_bytes

    @bundle_bytes.setter
    def bundle_bytes(self, data: bytes | None) -> None:
        self._bundle_bytes = data
        if self._web is not None and data is not None:
            self._web.use_bundle(data)

    def answer_at_once(
        self, request: Request, client: bytes | None = None
    ) -> tuple[bytes, bool] | None:
        """The fast path: the prepared response to a Convergence or
        Perspectives query the cache answers at once (or its 429, the client
        over its rate), without awaiting; None for anything else (including
        every error), which ``__call__`` then answers."""
        target = request.target
        if not target.startswith(TARGET_PREFIX):
            if self._perspectives and target.startswith(b"/?"):
                return perspectives_at_once(self._service, request, client)
            return None
        method = request.method
        if method != b"POST" and method != b"GET":
            return None
        if is_cross_site_request(request.headers):
            return None
        try:
            queried, fingerprint = self._queries.parse(method, target, request.body)
        except ProtocolError:
            return None
        keep_alive = request.keep_alive
        response = self._service.answer_at_once(queried, fingerprint, keep_alive, client)
        if response is None:
            return None
        return response, keep_alive

    async def __call__(
        self, request: Request, client: bytes | None = None
    ) -> tuple[bytes, bool] | tuple[bytes, bool, Callable[[], None]]:
        """The response and whether to keep the connection, and for an
        answer that holds bytes until sent (the log's pages) the function
        to call once it is sent or the connection ended
        (``serve_http_connection`` does)."""
        keep_alive = request.keep_alive
        try:
            path, _, query = request.target.partition(b"?")
            if path.startswith(TARGET_PREFIX):
                if request.method != b"POST" and request.method != b"GET":
                    raise ProtocolError("method not allowed", status=405)
                refuse_cross_site(request)
                answer = await self._service.answer(
                    *self._convergence_query(request, path), client
                )
            else:
                answer = await self._route(request, path, query, client)
        except ProtocolError as exc:
            path, _, query = request.target.partition(b"?")
            protocol = self._query_protocol(path, query)
            if protocol is not None:
                self.rejected[protocol, exc.status] += 1
            answer = Answer(
                exc.status, exc.message.encode("utf-8") + b"\n", b"text/plain; charset=utf-8",
                _extra_headers(exc, path),
            )
        if answer.status >= 500:
            keep_alive = keep_alive and answer.status == 503
        if answer.release is not None:
            return answer.response(keep_alive), keep_alive, answer.release
        return answer.response(keep_alive), keep_alive

    def _query_protocol(self, path: bytes, query: bytes) -> str | None:
        """The protocol of a rejected request that asked a query (counted
        with the answered ones), None for other paths."""
        if path.startswith(TARGET_PREFIX):
            return "convergence"
        if path == V2_QUERY_PATH and self._v2_key_document is not None:
            return "v2"
        if path == b"/" and query and self._perspectives:
            return "perspectives"
        return None

    async def _route(
        self, request: Request, path: bytes, query: bytes, client: bytes | None
    ) -> Answer:
        if self._v2_key_document is not None and path in (V2_QUERY_PATH, V2_KEY_PATH):
            return await self._v2(request, path, client)
        if self._log is not None and path.startswith(LOG_PREFIX):
            return await self._log.answer(
                request.method, path, query, client=client, keep_alive=request.keep_alive
            )
        if self._witness is not None and path.startswith(WITNESS_PREFIX):
            return await self._witness.answer(request.method, path, request.body, client=client)
        if path == b"/" and self._perspectives and query and request.method == b"GET":
            target = perspectives.parse_query(query)
            if target is not None:
                refuse_cross_site(request)
                return await self._service.answer_perspectives(target, client)
        if self._web is not None and self._web.handles(path):
            return await self._web.answer(request, path, query, client)
        if request.method != b"GET":
            raise ProtocolError("method not allowed", status=405)
        if path == b"/":
            return Answer(200, self._index, b"text/plain; charset=utf-8")
        served = self.bundle_bytes
        if served is not None and self._bundle_path is not None and path == self._bundle_path:
            # PROTOCOLS.md names no type; Convergence clients recognise a
            # bundle by its ``.notary`` address, not its type.
            return Answer(200, served, bundle.CONTENT_TYPE, (
                (b"Content-Disposition", b'attachment; filename="' + path[1:] + b'"'),
                (b"X-Content-Type-Options", b"nosniff"),
            ))
        raise ProtocolError("not found", status=404)

    async def _v2(
        self, request: Request, path: bytes, client: bytes | None
    ) -> Answer:
        if path == V2_KEY_PATH:
            if request.method != b"GET":
                raise ProtocolError("method not allowed", status=405)
            assert self._v2_key_document is not None
            return Answer(200, self._v2_key_document, v2.CONTENT_TYPE)
        if request.method != b"POST":
            raise ProtocolError("method not allowed", status=405)
        refuse_cross_site(request)
        query = v2.parse_query_request(
            request.body, max_batch=self._v2_max_batch, max_body_bytes=self._v2_max_body_bytes
        )
        return await self._service.answer_v2(query, client)

    def _convergence_query(self, request: Request, path: bytes) -> tuple[Target, bytes | None]:
        """The target and fingerprint (None for ``GET``) of a ``/target/``
        query; ``ProtocolError`` for a bad one."""
        return self._queries.parse(request.method, path, request.body)


def perspectives_at_once(
    service: QueryService, request: Request, client: bytes | None
) -> tuple[bytes, bool] | None:
    """The fast path of ``GET /?host=&port=&service_type=2`` (``request``'s
    target begins with ``/?``): the response when the cache answers at
    once, None for anything else (the index page, errors, a cache miss)."""
    if request.method != b"GET" or is_cross_site_request(request.headers):
        return None
    try:
        target = perspectives.parse_query(request.target[2:])
    except ProtocolError:
        return None
    if target is None:
        return None
    response = service.answer_perspectives_at_once(target, request.keep_alive, client)
    if response is None:
        return None
    return response, request.keep_alive


class PerspectivesHandler:
    """The ``Handler`` of the plain-HTTP Perspectives port: ``GET
    /?host=&port=&service_type=2`` answers, ``GET /`` the index page."""

    def __init__(
        self, service: QueryService, *, index_page: bytes,
        rejected: Counter[tuple[str, int]] | None = None,
    ) -> None:
        self._service = service
        self._index_page = index_page
        #: As ``ApiHandler.rejected``.
        self.rejected: Counter[tuple[str, int]] = rejected if rejected is not None else Counter()

    def answer_at_once(
        self, request: Request, client: bytes | None = None
    ) -> tuple[bytes, bool] | None:
        """As ``ApiHandler.answer_at_once``, for the Perspectives queries."""
        if not request.target.startswith(b"/?"):
            return None
        return perspectives_at_once(self._service, request, client)

    async def __call__(
        self, request: Request, client: bytes | None = None
    ) -> tuple[bytes, bool]:
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
            refuse_cross_site(request)
            answer = await self._service.answer_perspectives(target, client)
        except ProtocolError as exc:
            if request.target.startswith(b"/?"):
                self.rejected["perspectives", exc.status] += 1
            extra = _extra_headers(exc, b"/")
            return http.error_response(
                exc.status, exc.message, keep_alive=keep_alive, extra_headers=extra
            ), keep_alive
        return answer.response(keep_alive), keep_alive
