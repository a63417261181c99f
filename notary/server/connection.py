"""One HTTP/1.x connection: receive with timeouts, parse with the sans-IO
reader, hand each request to the application, send the response.

Resource handling: ``serve_http_connection`` owns ``stream`` from the moment it
is called and always closes it before returning.

Error handling: a protocol error is answered with its status and the
connection closed; an exception from the application (a bug) is logged with
its traceback and answered 500, and the connection closed, so it never ends
the listener or the worker; a peer that stalls past a timeout, resets, or breaks TLS is
dropped silently (nothing to answer); any of those are normal events, not
errors, and are not logged per connection.

Timeouts (the ``[http]`` section, ``HttpConfig``), kept by a ``Watchdog``
and coarse: each fires between its nominal time and ``MAX_LATENESS_S``
(0.5 s) after it, never before:

* the head of a request must arrive whole within ``header_timeout_s`` of the
  connection's start (first request) or of the receive that brought its
  first bytes (later requests); past it the client gets 408 and the
  connection is closed;
* between requests (nothing of the next one received yet) the connection
  may stay idle ``keepalive_timeout_s``, counted afresh at each receive; past
  it the connection is closed without an answer;
* each response (and the 408 or protocol-error answer) must be sent within
  ``send_timeout_s``; a client that does not read is dropped when it passes;
* after a 408 or protocol-error answer the connection lingers: what the
  client still sends is read and discarded, until it closes or pauses for
  ``linger_idle_s``, for at most ``linger_timeout_s`` (so closing does not
  reset the connection under the answer; these two are exact: they follow
  an error, off the hot path);
* the handler (the application) runs without a connection deadline: it keeps
  its own (the query deadline).

Parking (issue 35): a connection on the notary's own streams, served with a
fast path and a running ``notary.server.parking.Parking``, waits for its
next request parked there instead of in a receive; the parking answers the
requests the fast path answers, keeps the connection's keep-alive deadline, and hands the
connection back for anything else, which the loop then handles as if it had
received it (the same answers, deadlines and errors as without parking).

Requests: at most ``max_requests_per_connection`` are served on one
connection; the last is handed to the application as if the client had asked
to close (its answer says ``Connection: close``), then the connection closes.

Graceful stop (``Watchdog.stop``, one watchdog shared by every connection of
a notary's listeners): a connection waiting for its next request closes at
once, and one in the middle of a request answers it and then closes.

Mechanism (issues 21 and 35): per phase the loop only stores a number, the
phase's deadline on the watchdog's coarse clock, in its ``Watched`` entry;
the watchdog's sweeper wakes every ``TICK_S``, reads Trio's clock once and
wakes the connections whose deadline passed. Moving a ``CancelScope``
deadline instead (what this loop did before) costs a reordering of Trio's
deadline heap and a clock read per phase, three times a request: a tenth of
a cache hit's CPU (bench/RESULTS.md, "Hot path II"). A connection on one of
the notary's own streams (``SocketStream``, ``TlsStream``: they have
``interrupt``) is woken where it waits on its socket: Trio's
``notify_closing`` raises ``trio.ClosedResourceError`` there, and the
stream stays open (for the 408). Any other stream runs in a
``trio.CancelScope`` the watchdog cancels; entering and leaving one costs
~10 us, a tenth of a plain connection's CPU (issue 35). A wake that finds the
connection's task between two waits changes nothing; the next sweep wakes
it again if its deadline is still passed, so in that race a timeout fires up
to a tick later than ``MAX_LATENESS_S``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from math import inf
from typing import cast

import trio

from notary.config import HttpConfig
from notary.errors import ProtocolError
from notary.protocol.http import Request, RequestReader, error_response
from notary.server.accept import ConnectionCounts
from notary.server.parking import Parking
from notary.server.sockstream import SocketStream
from notary.server.tlsstream import TlsStream

log = logging.getLogger(__name__)

RECEIVE_BYTES = 64 * 1024
CLOSE_TIMEOUT_S = 1.0
#: The answer to a request whose handler raised (a bug, logged with its
#: traceback): the connection is closed after it.
INTERNAL_ERROR = error_response(500, "internal error")
#: The streams over TCP, which ``linger_before_close`` half-closes.
TCP_STREAMS = (trio.SocketStream, SocketStream)
#: Streams closed at once, without waiting (no shielded wait needed).
CLOSE_AT_ONCE = (SocketStream, TlsStream)
#: What a connection on a stream without ``interrupt`` runs in instead of a
#: cancel scope (see "Mechanism").
NO_SCOPE = nullcontext()
#: Most bytes read and discarded after an error answer (see ``_linger``).
LINGER_BYTES = 4 * 1024 * 1024

#: The application: a request in, (response bytes, keep the connection) out,
#: or with a third member, a function the loop calls exactly once when the
#: response has been sent or the connection ended before (bytes an answer
#: holds for a slow reader are counted until then: the log's pages).
#: Called ``handler(request)``, or ``handler(request, client)`` when the
#: connection has a ``client`` (see ``serve_http_connection``).
Handler = Callable[
    ..., Awaitable["tuple[bytes, bool] | tuple[bytes, bool, Callable[[], None]]"]
]
#: The application's synchronous fast path, called ``answer_at_once(request,
#: client)``: the same answer when it is ready without awaiting (a cache
#: hit), else None and ``Handler`` is awaited.
FastHandler = Callable[[Request, "bytes | None"], "tuple[bytes, bool] | None"]
#: Takes over a connection after an upgrade request (``GET`` with
#: ``Upgrade:``) for its path: the stream, the request, the bytes after it.
#: It owns the stream from then on.
UpgradeHandler = Callable[[trio.abc.Stream, Request, bytes], Awaitable[None]]


#: How often the watchdog sweeps, and so how late a timeout may fire:
#: deadlines are set on the watchdog's clock, up to one tick old, plus one
#: tick, so that none fires early; the sweep that sees one passed comes at
#: most one tick after it.
TICK_S = 0.25
MAX_LATENESS_S = 2 * TICK_S


class Watched:
    """One connection as the watchdog sees it: how to wake it (``wake``: its
    stream's ``interrupt`` or its cancel scope's ``cancel``), the deadline of
    its current phase (on the watchdog's clock; ``inf``: none) and whether it
    waits for a next request (``idle``: a graceful stop closes it now).
    Watched from ``__enter__`` to ``__exit__`` (``Watchdog.watch``; a class,
    not a generator-based context manager: a few microseconds less for each
    connection)."""

    __slots__ = ("_watching", "deadline", "idle", "wake")

    def __init__(
        self, wake: Callable[[], object], deadline: float, watching: set[Watched]
    ) -> None:
        self.wake = wake
        self.deadline = deadline
        self.idle = False
        self._watching = watching

    def __enter__(self) -> Watched:
        self._watching.add(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._watching.discard(self)


class Watchdog:
    """The coarse timeouts and the graceful stop of HTTP connections.

    ``serve_notary`` owns the notary's watchdog and runs its sweeper
    (``run``) in its nursery, for as long as connections are served; a
    connection served without one gets a watchdog of its own for its
    lifetime. ``stop`` wakes the connections that wait for a request (and
    cancels the scopes entered with ``cancel_on_stop``), and each sweep
    wakes them again while they stay; the others see ``stopping`` after
    their current request and close.

    ``now`` is the watchdog's clock: Trio's time at the last sweep or the
    last connection registered, at most ``TICK_S`` old while the sweeper
    runs on time. Phase deadlines are ``now + timeout + TICK_S``
    (``deadline``), so a timeout fires within ``MAX_LATENESS_S`` after it
    and never before (a loop lagging more than a tick behind its sleeps
    fires by its lag early)."""

    def __init__(self, tick_s: float = TICK_S) -> None:
        self.tick_s = tick_s
        self.now = -inf
        self.stopping = False
        self._watched: set[Watched] = set()
        #: Cancel scopes to cancel on stop: upgraded connections (WebSockets).
        self._on_stop: set[trio.CancelScope] = set()

    def deadline(self, timeout_s: float) -> float:
        """The deadline of a phase that may last ``timeout_s`` from now."""
        return self.now + timeout_s + self.tick_s

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Sweep every ``tick_s`` until cancelled: wake the connections past
        their deadline (and, once stopping, those still idle)."""
        current_time = trio.current_time
        self.now = current_time()
        task_status.started()
        while True:
            await trio.sleep(self.tick_s)
            now = self.now = current_time()
            stopping = self.stopping
            for watched in self._watched:
                if watched.deadline <= now or (stopping and watched.idle):
                    watched.wake()

    def watch(self, wake: Callable[[], object], timeout_s: float) -> Watched:
        """Watch a connection that ``wake`` wakes, its first phase lasting
        ``timeout_s``, for the duration of the ``with`` block."""
        self.now = trio.current_time()
        return Watched(wake, self.deadline(timeout_s), self._watched)

    def stop(self) -> None:
        self.stopping = True
        for watched in self._watched:
            if watched.idle:
                watched.wake()
        for scope in self._on_stop:
            scope.cancel()
        self._on_stop.clear()

    @contextmanager
    def cancel_on_stop(self) -> Iterator[trio.CancelScope]:
        """A cancel scope cancelled by ``stop`` (at once if already
        stopping): for connections that never become idle, e.g. WebSockets."""
        with trio.CancelScope() as scope:
            if self.stopping:
                scope.cancel()
            self._on_stop.add(scope)
            try:
                yield scope
            finally:
                self._on_stop.discard(scope)


async def serve_http_connection(
    stream: trio.abc.Stream,
    handler: Handler,
    limits: HttpConfig,
    upgrades: Mapping[bytes, UpgradeHandler] | None = None,
    answer_at_once: FastHandler | None = None,
    watchdog: Watchdog | None = None,
    client: bytes | None = None,
    *,
    tls_counts: ConnectionCounts | None = None,
    parking: Parking | None = None,
) -> None:
    """Serve HTTP/1.x on ``stream``, within the ``[http]`` ``limits``, until
    the peer is done or ``watchdog`` stops; an upgrade request to a path of
    ``upgrades`` hands the connection over (outside this loop's deadlines:
    the new protocol keeps its own). ``answer_at_once``, when given, is
    tried first for each request. ``watchdog``: the notary's (None: one of
    the connection's own, swept in a task of its own). ``client``: who the
    application limits this connection as (its client prefix key,
    ``notary.service.abuse``); passed on with every request when not None.
    ``tls_counts``: ``stream`` is a ``TlsStream`` whose handshake is the
    connection's first phase, bounded by ``tls_handshake_timeout_s`` on the
    watchdog like the others (a cancel scope of its own cost a tenth of a
    resumed connection, bench/RESULTS.md), and counted there once made.
    ``parking``: where a connection on the notary's own streams waits
    between requests, when it has ``answer_at_once`` (see "Parking"; None:
    in its receive)."""
    if watchdog is None:
        async with trio.open_nursery() as nursery:
            watchdog = Watchdog()
            await nursery.start(watchdog.run)
            await serve_http_connection(
                stream, handler, limits, upgrades, answer_at_once, watchdog, client,
                tls_counts=tls_counts, parking=parking,
            )
            nursery.cancel_scope.cancel()
        return
    try:
        handoff = await _serve(
            stream, handler, limits, upgrades or {}, answer_at_once, watchdog, client,
            tls_counts, parking,
        )
        if handoff is not None:
            take_over, request, leftover = handoff
            with watchdog.cancel_on_stop():
                await take_over(stream, request, leftover)
    except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError, OSError):
        pass
    finally:
        if isinstance(stream, CLOSE_AT_ONCE):
            stream.close()
        else:
            with trio.move_on_after(CLOSE_TIMEOUT_S) as scope:
                scope.shield = True
                await stream.aclose()


async def _serve(
    stream: trio.abc.Stream,
    handler: Handler,
    limits: HttpConfig,
    upgrades: Mapping[bytes, UpgradeHandler],
    answer_at_once: FastHandler | None,
    watchdog: Watchdog,
    client: bytes | None,
    tls_counts: ConnectionCounts | None,
    parking: Parking | None,
) -> tuple[UpgradeHandler, Request, bytes] | None:
    """The keep-alive loop of one connection, kept as one function on
    purpose: it is the hot path (a call per phase costs a measurable share of
    a cache hit, bench/RESULTS.md) and reads top to bottom as the
    connection's life. Returns the upgrade to run, or None when the
    connection is done."""
    reader = RequestReader(
        max_header_bytes=limits.max_header_bytes,
        max_headers=limits.max_headers,
        max_body_bytes=limits.max_body_bytes,
    )
    requests_left = limits.max_requests_per_connection
    # Each phase's timeout plus the watchdog's tick (Watchdog.deadline),
    # added once here rather than per phase.
    tick_s = watchdog.tick_s
    header_s = limits.header_timeout_s + tick_s
    keepalive_s = limits.keepalive_timeout_s + tick_s
    send_s = limits.send_timeout_s + tick_s
    receive_some = stream.receive_some
    send_all = stream.send_all
    # Woken by the watchdog only: past a phase's deadline, or on a graceful
    # stop while idle (module docstring, "Mechanism"). ``receiving`` says
    # which phase it was.
    interrupt = getattr(stream, "interrupt", None)
    scope = None
    if interrupt is None:
        scope = trio.CancelScope()
        interrupt = scope.cancel
    woken = False
    receiving = True
    # The head of a request must arrive whole within header_timeout_s of its
    # first byte (or of the connection's start): a client dripping bytes
    # cannot hold the connection open. Between requests, keepalive_timeout_s.
    first_phase_s = limits.header_timeout_s if tls_counts is None else limits.tls_handshake_timeout_s
    # Between requests a connection on the notary's own streams, with a fast
    # path, parks instead of receiving (``notary.server.parking``).
    if answer_at_once is None or not isinstance(stream, CLOSE_AT_ONCE):
        parking = None
    fast_path = cast(FastHandler, answer_at_once)
    own = cast("SocketStream | TlsStream", stream)
    with (
        scope if scope is not None else NO_SCOPE,
        watchdog.watch(interrupt, first_phase_s) as watched,
    ):
        try:
            head_deadline: float | None = watched.deadline
            if tls_counts is not None:
                tls = cast(TlsStream, stream)
                await tls.do_handshake()
                tls_counts.tls_handshakes += 1
                if tls.session_reused:
                    tls_counts.tls_resumed += 1
                head_deadline = watched.deadline = watchdog.now + header_s
            while True:
                if head_deadline is None and reader.in_request:
                    head_deadline = watchdog.now + header_s
                idle = not reader.in_request
                if idle:
                    # Between requests: a graceful stop closes the connection now.
                    if watchdog.stopping:
                        return None
                    watched.idle = True
                receiving = True
                if head_deadline is not None:
                    watched.deadline = head_deadline
                else:
                    watched.deadline = watchdog.now + keepalive_s
                error: BaseException | None = None
                declined = False  # the fast path declined the first request already
                back = None
                if idle and parking is not None and own.parkable:
                    back = await parking.park(
                        own, reader, fast_path, client, requests_left, watched, keepalive_s
                    )
                if back is not None:
                    requests_left = back.requests_left
                    if back.woken:
                        raise trio.ClosedResourceError  # a watchdog wake, as the stream's
                    watched.idle = receiving = False
                    if back.unsent:
                        watched.deadline = watchdog.now + send_s
                        await send_all(back.unsent)
                    if not back.keep_alive or back.eof or (
                        back.unsent and (watchdog.stopping or not requests_left)
                    ):
                        return None
                    error = back.error
                    requests = back.requests
                    declined = back.declined
                else:
                    data = await receive_some(RECEIVE_BYTES)
                    watched.idle = receiving = False
                    if not data:
                        return None
                    try:
                        requests = reader.feed(data)
                    except ProtocolError as exc:
                        error = exc
                if error is not None:
                    if not isinstance(error, ProtocolError):
                        raise error
                    watched.deadline = watchdog.now + send_s
                    await send_all(error_response(error.status, error.message))
                    await linger_before_close(
                        stream, timeout_s=limits.linger_timeout_s, idle_s=limits.linger_idle_s
                    )
                    return None
                for request in requests:
                    requests_left -= 1
                    if not requests_left:
                        request = _last_request(request)
                    if request.upgrade and upgrades and request.method == b"GET":
                        take_over = upgrades.get(request.target.partition(b"?")[0])
                        if take_over is not None:
                            return take_over, request, reader.leftover
                    release = None
                    try:
                        answered = (
                            answer_at_once(request, client)
                            if answer_at_once is not None and not declined else None
                        )
                        declined = False
                        if answered is None:
                            watched.deadline = inf  # the handler keeps its own deadlines
                            if client is None:
                                slow = await handler(request)
                            else:
                                slow = await handler(request, client)
                            if len(slow) == 3:
                                release = slow[2]
                            answered = slow[0], slow[1]
                    except Exception:  # a bug: this request's 500, not the worker's end
                        log.exception("internal error answering %s %r",
                                      request.method.decode("latin-1"), request.target[:200])
                        answered = INTERNAL_ERROR, False
                    response, keep_alive = answered
                    watched.deadline = watchdog.now + send_s
                    try:
                        await send_all(response)
                    finally:
                        if release is not None:
                            release()  # sent, or the connection ends here
                    if not keep_alive or watchdog.stopping or not requests_left:
                        return None
                if reader.finished:
                    return None
                if requests:
                    head_deadline = None
        except trio.ClosedResourceError:
            # Our own stream, woken where it waited; another stream's
            # ClosedResourceError is its own.
            if scope is not None:
                raise
            woken = True
    if (woken or (scope is not None and scope.cancelled_caught)) and receiving and reader.in_request:
        # A stalled request gets 408; an idle keep-alive connection just closes.
        with trio.move_on_after(limits.send_timeout_s):
            await send_all(error_response(408, "request timeout"))
            await linger_before_close(
                stream, timeout_s=limits.linger_timeout_s, idle_s=limits.linger_idle_s
            )
    return None


async def linger_before_close(
    stream: trio.abc.Stream, *, timeout_s: float, idle_s: float, max_bytes: int = LINGER_BYTES
) -> None:
    """After a refusal or error answer, before the caller closes: half-close
    (plain TCP; TLS has no half-close) and read and discard what the client
    still sends, until it closes, sends nothing for ``idle_s``, ``timeout_s``
    passed or ``max_bytes`` were read. Closing with unread bytes in the
    receive buffer makes the kernel reset the connection, and the reset can
    destroy the answer before the client reads it (say, a 431 to a client
    still sending a huge head). Used by the HTTP loop and the relay. Errors
    end it: the answer has been sent."""
    with trio.move_on_after(timeout_s):
        try:
            if isinstance(stream, TCP_STREAMS):
                await stream.send_eof()
            drained = 0
            while drained < max_bytes:
                with trio.move_on_after(idle_s) as pause:
                    data = await stream.receive_some(RECEIVE_BYTES)
                if pause.cancelled_caught or not data:
                    return
                drained += len(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return


def _last_request(request: Request) -> Request:
    """``request`` as if its client had asked to close the connection: the
    last one ``max_requests_per_connection`` allows."""
    return Request(
        request.method, request.target, request.version, request.headers, request.body,
        False, request.upgrade,
    )
