"""The admin listener: plain HTTP for operators and their tools, on loopback
by default (``[admin] listen``; an empty list serves none).

* ``GET /metrics``: the Prometheus text format (``notary.server.metrics``).
* ``GET /healthz``: liveness, ``200 ok`` whenever the event loop runs.
* ``GET /readyz``: readiness, ``200 ready`` when the listeners are serving,
  the store is writable (the writer's batch in hand has not failed), at
  most ``[admin] max_writer_lag_rows`` observations wait for the writer
  and, with DANE on, the ``[dns] resolvers`` validate DNSSEC as their last
  check found (``notary.service.dane.ResolverValidation``: checked every
  ``[dns] validation_recheck_s``, never per request); else ``503`` with one
  failing reason per line. Warnings that do not fail it (a resolver that
  does not validate under ``[dns] require_validation = false``) follow,
  each on a line of its own starting ``warning: ``.

Any other path is 404, any other method on these paths 405 (with ``Allow:
GET``). In a node of several workers every worker accepts on the admin
socket: ``/metrics`` is the node's aggregate, ``/healthz`` and ``/readyz``
speak for the worker that took the connection.

Resource handling: :class:`AdminServer` serves one accepted TCP stream per
call, through the project's HTTP loop (``serve_http_connection``, the
``[http]`` timeouts and size limits), and owns that stream; at most
``ADMIN_MAX_CONNECTIONS`` at once, the others are closed at once.

Error handling: nothing raises to the listener. A scrape that fails to
render (a bug, or unreadable multiprocess files) is logged with its traceback
and answered 500: the notary keeps serving queries.
"""

from __future__ import annotations

import logging

import trio

from notary.config import AdminConfig, HttpConfig
from notary.outbound.writer import Storage, StorageStatistics
from notary.protocol import http
from notary.protocol.http import Request
from notary.server.accept import ConnectionCounts
from notary.server.connection import serve_http_connection
from notary.server.metrics import CONTENT_TYPE, NotaryMetrics
from notary.service.dane import ResolverValidation

__all__ = ["ADMIN_MAX_CONNECTIONS", "AdminServer", "readiness_problems"]

log = logging.getLogger(__name__)

#: Admin connections at once (scrapers and probes of an orchestrator).
ADMIN_MAX_CONNECTIONS = 64
METRICS_PATH = b"/metrics"
HEALTH_PATH = b"/healthz"
READY_PATH = b"/readyz"
_PATHS = (METRICS_PATH, HEALTH_PATH, READY_PATH)


def readiness_problems(
    *, serving: bool, writer: StorageStatistics, max_writer_lag_rows: int
) -> list[str]:
    """Why a worker is not ready (empty: it is)."""
    problems = []
    if not serving:
        problems.append("listeners not serving (starting or stopping)")
    if writer.failing:
        problems.append("store not writable: the last batch write failed and is being retried")
    if writer.queued > max_writer_lag_rows:
        problems.append(
            f"writer lagging: {writer.queued} observations queued, more than "
            f"{max_writer_lag_rows} ([admin] max_writer_lag_rows)"
        )
    return problems


class AdminServer:
    """The handler of the admin listeners (``notary.server.accept.serve_socket``).

    ``serving`` is False until the notary's listeners are all up, and should
    be set False again when it starts to stop; ``/readyz`` reports it.
    """

    def __init__(
        self, config: AdminConfig, http: HttpConfig, *, metrics: NotaryMetrics, storage: Storage,
        counts: ConnectionCounts | None = None, resolvers: ResolverValidation | None = None,
    ) -> None:
        self._metrics = metrics
        self._storage = storage
        #: Whether DANE's resolvers validate (None: DANE is off).
        self._resolvers = resolvers
        self._max_writer_lag_rows = config.max_writer_lag_rows
        self._limits = http
        self.serving = False
        #: Its connections, open and refused (the metrics read them).
        self.counts = counts if counts is not None else ConnectionCounts()

    async def __call__(self, tcp: trio.SocketStream) -> None:
        counts = self.counts
        if counts.open_connections >= ADMIN_MAX_CONNECTIONS:
            counts.refused_connections += 1
            await trio.aclose_forcefully(tcp)
            return
        counts.open_connections += 1
        try:
            await serve_http_connection(tcp, self.handle, self._limits)
        finally:
            counts.open_connections -= 1

    def readiness_problems(self) -> list[str]:
        problems = readiness_problems(
            serving=self.serving,
            writer=self._storage.statistics(),
            max_writer_lag_rows=self._max_writer_lag_rows,
        )
        if self._resolvers is not None:
            problems += self._resolvers.problems()
        return problems

    def readiness_warnings(self) -> list[str]:
        """What ``/readyz`` says without failing."""
        return self._resolvers.warnings() if self._resolvers is not None else []

    async def handle(self, request: Request) -> tuple[bytes, bool]:
        """One request: the ``Handler`` of ``serve_http_connection``."""
        keep_alive = request.keep_alive
        path = request.target.partition(b"?")[0]
        if path not in _PATHS:
            return http.error_response(404, "not found", keep_alive=keep_alive), keep_alive
        if request.method != b"GET":
            return http.error_response(
                405, "method not allowed", keep_alive=keep_alive,
                extra_headers=((b"Allow", b"GET"),),
            ), keep_alive
        if path == METRICS_PATH:
            try:
                body = await self._metrics.render()
            except Exception:
                log.exception("rendering /metrics failed")
                return http.error_response(
                    500, "metrics unavailable", keep_alive=keep_alive
                ), keep_alive
            return http.response(
                200, body, content_type=CONTENT_TYPE, keep_alive=keep_alive
            ), keep_alive
        if path == HEALTH_PATH:
            return http.response(200, b"ok\n", keep_alive=keep_alive), keep_alive
        problems = self.readiness_problems()
        lines = problems or ["ready"]
        lines += [f"warning: {warning}" for warning in self.readiness_warnings()]
        body = "".join(f"{line}\n" for line in lines).encode("utf-8")
        return http.response(503 if problems else 200, body, keep_alive=keep_alive), keep_alive
