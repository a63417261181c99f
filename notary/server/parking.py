"""Idle keep-alive connections, parked in one epoll set: the requests the
cache answers at once are answered there, by one task, without waking the
connections' own tasks (issue 35, the keep-alive goal). HTTPS and plain
HTTP alike: a connection on the notary's own streams (``TlsStream``,
``SocketStream``) is read and written through its driver (the TLS driver's
connection, or ``sockstream.PlainDriver``).

Why: a connection whose task waits for its next request costs a Trio task
step for every request: the scheduler's batch, the task's coroutines
resumed and suspended, an ``Outcome`` made and unwrapped. Measured with
callgrind, a step is ~17,000 instructions, a quarter of a keep-alive cache
hit's (bench/RESULTS.md, "Parked keep-alive connections"). Parked, a
connection costs nothing until its socket is readable; one task
(``Parking.run``) then reads, parses and answers the ready connections of a
whole ``epoll_wait`` in one step, as an event-driven server does.

The connection's task stays its owner. It parks (``Parking.park``) where it
would wait for its next request: not in the middle of one, not while its
stream holds bytes read ahead (OpenSSL's), not before a PROXY-refusing
stream judged its first bytes (``parkable``), not once the notary stops. While it
is parked, ``Parking`` answers each complete request the application's fast
path answers (``answer_at_once``: a cache hit, or its 429) on the
connection's own driver, and keeps the connection's watchdog entry as
the task would (its keep-alive deadline, counted afresh at each request).
Anything else is handed back to the task (``Handback``), which goes on
exactly where a receive would have returned:

* requests the fast path does not answer (or raised on: the task calls it
  again, and its error handling answers 500), an upgrade, the last request
  ``max_requests_per_connection`` allows, and those after them;
* a partial request (its head deadline then runs in the task), a protocol
  error (the task answers it), the end of the connection or a broken one;
* a response the socket did not take at once (the task sends it, under its
  send deadline), or one that closes the connection;
* more reads on one connection than ``MAX_READS`` in one wake;
* a wake from the watchdog (a deadline passed, or a graceful stop), the
  task's cancellation (it is removed, and cancelled as from any wait), and
  the end of ``run`` (every parked connection is handed back, woken).

Resource handling: ``serve_notary`` owns the ``Parking`` and runs ``run``
in its nursery; ``run`` owns the epoll set (made when it starts, closed when
it ends) and a connection's registration in it while the connection is
parked. The connections' sockets stay their tasks' (their streams).

Error handling: nothing one connection does ends ``run``. A TLS or socket
error is handed back as ``trio.BrokenResourceError``; a protocol error as
itself; an unexpected exception (a bug) as itself, which ends that
connection in its task (logged there, as any bug of a connection's). Only
``run``'s cancellation ends it.
"""

from __future__ import annotations

import contextlib
import select
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import trio
from outcome import Value
from trio.lowlevel import (
    Abort,
    current_task,
    notify_closing,
    reschedule,
    wait_readable,
    wait_task_rescheduled,
)

from notary.server.sockstream import DEFAULT_RECEIVE_BYTES
from notary.server.tlsdriver import WANT_READ

if TYPE_CHECKING:
    from notary.protocol.http import Request, RequestReader
    from notary.server.connection import FastHandler, Watchdog, Watched
    from notary.server.sockstream import SocketStream
    from notary.server.tlsstream import TlsStream

__all__ = ["MAX_EVENTS", "MAX_READS", "Handback", "Parking", "ParkingStatistics"]

#: Ready connections served per wake of ``run``; more wait for the next one.
MAX_EVENTS = 256
#: Reads of one connection per wake: past them it is handed back to its
#: task (OpenSSL may hold more of what it read, which epoll cannot see).
MAX_READS = 8


@dataclass(frozen=True, slots=True)
class ParkingStatistics:
    """A snapshot of a ``Parking``: ``parked`` connections now; ``served``:
    requests answered on parked connections since start; ``handed_back``:
    parked connections handed back to their tasks since start."""

    parked: int
    served: int
    handed_back: int


class Handback:
    """What a parked connection's task does first when it is woken: send
    ``unsent`` (a response the socket did not take at once), then end the
    connection if ``keep_alive`` is false, or if ``eof`` (the client
    ended it), or act on ``woken`` (a watchdog wake: as its stream's
    ``interrupt``) or ``error`` (``ProtocolError``: answer it; anything
    else: raise it); else answer ``requests`` (complete, not answered
    yet; the first without the fast path if ``declined``) and go on. ``requests_left``: the connection's count of requests
    it may still make, after those answered while it was parked."""

    __slots__ = (
        "declined", "eof", "error", "keep_alive", "requests", "requests_left", "unsent", "woken",
    )

    def __init__(self, requests_left: int) -> None:
        self.requests: list[Request] = []
        #: The fast path returned None for the first of ``requests``: the
        #: task goes straight to its handler for it.
        self.declined = False
        self.unsent = b""
        self.keep_alive = True
        self.eof = False
        self.woken = False
        self.error: BaseException | None = None
        self.requests_left = requests_left


class _Parked:
    """One parked connection (``Parking`` only)."""

    __slots__ = (
        "answer", "client", "fd", "keepalive_s", "reader", "requests_left", "task", "tls",
        "wake_before", "watched",
    )

    def __init__(
        self, stream: SocketStream | TlsStream, reader: RequestReader, answer: FastHandler,
        client: bytes | None, requests_left: int, watched: Watched, keepalive_s: float,
    ) -> None:
        self.fd = stream.fileno
        self.tls = stream.driver
        self.reader = reader
        self.answer = answer
        self.client = client
        self.requests_left = requests_left
        self.watched = watched
        self.keepalive_s = keepalive_s
        self.wake_before: Callable[[], object] = watched.wake
        self.task = current_task()


class Parking:
    """See the module docstring. ``watchdog``: the notary's (its clock sets
    a parked connection's keep-alive deadline, its ``stopping`` ends the
    parking of all). ``served``: the requests answered here;
    ``handed_back``: the wakes of parked tasks (the metrics read them in
    ``statistics``)."""

    def __init__(self, watchdog: Watchdog, *, max_events: int = MAX_EVENTS) -> None:
        self._watchdog = watchdog
        self._max_events = max_events
        self._epoll: select.epoll | None = None
        self._parked: dict[int, _Parked] = {}
        self.served = 0
        self.handed_back = 0

    @property
    def running(self) -> bool:
        """Whether connections can park (``run`` is running)."""
        return self._epoll is not None

    @property
    def parked(self) -> int:
        """How many connections are parked now."""
        return len(self._parked)

    def statistics(self) -> ParkingStatistics:
        return ParkingStatistics(len(self._parked), self.served, self.handed_back)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve the parked connections until cancelled; then hand every one
        back, woken (see the module docstring)."""
        epoll = self._epoll = select.epoll()
        try:
            task_status.started()
            parked = self._parked
            while True:
                await wait_readable(epoll)
                for fd, _ in epoll.poll(0, self._max_events):
                    entry = parked.get(fd)
                    if entry is not None:
                        self._serve(entry)
        finally:
            for entry in list(self._parked.values()):
                self._wake(entry)
            self._epoll = None
            notify_closing(epoll)
            epoll.close()

    async def park(
        self, stream: SocketStream | TlsStream, reader: RequestReader, answer: FastHandler,
        client: bytes | None, requests_left: int, watched: Watched, keepalive_s: float,
    ) -> Handback | None:
        """Park the calling connection's task until its connection needs it
        (see the module docstring), and say why (``Handback``); None, at
        once, when it cannot park (``run`` is not running, or epoll refused
        the socket): the caller then receives as it would without. The caller
        checked that ``reader`` is between requests and that ``stream`` may
        park (its ``parkable``).
        ``keepalive_s``: the deadline's distance from the watchdog's clock
        after each request answered here (``Watchdog.deadline``'s)."""
        epoll = self._epoll
        if epoll is None:
            return None
        entry = _Parked(stream, reader, answer, client, requests_left, watched, keepalive_s)
        try:
            epoll.register(entry.fd, select.EPOLLIN)
        except OSError:
            return None  # not parked: the caller receives as without parking
        self._parked[entry.fd] = entry
        watched.wake = partial(self._wake, entry)

        def abort(_: object) -> Abort:
            self._unpark(entry, self._epoll)
            return Abort.SUCCEEDED

        back: Handback = await wait_task_rescheduled(abort)
        return back

    def _wake(self, entry: _Parked) -> None:
        """Hand ``entry`` back woken: a watchdog wake, or the end of ``run``."""
        back = Handback(entry.requests_left)
        back.woken = True
        self._hand_back(entry, back, self._epoll)

    def _unpark(self, entry: _Parked, epoll: select.epoll | None) -> bool:
        """Take ``entry`` out; False if it was out already (handed back, or
        cancelled: its file descriptor may be another connection's now)."""
        if self._parked.get(entry.fd) is not entry:
            return False
        del self._parked[entry.fd]
        entry.watched.wake = entry.wake_before
        if epoll is not None:
            # A socket closed meanwhile has left the set already.
            with contextlib.suppress(OSError, ValueError):
                epoll.unregister(entry.fd)
        return True

    def _hand_back(self, entry: _Parked, back: Handback, epoll: select.epoll | None) -> None:
        if not self._unpark(entry, epoll):
            return  # out already: a watchdog wake after another reason
        self.handed_back += 1
        reschedule(entry.task, Value(back))

    def _serve(self, entry: _Parked) -> None:
        """Read, answer what the fast path answers, and hand the connection
        back when it needs its task; never raises."""
        try:
            back = self._answer_ready(entry)
        except (ssl.SSLError, OSError) as exc:
            broken = trio.BrokenResourceError(exc)
            broken.__cause__ = exc
            back = _failed(entry, broken)
        except Exception as exc:  # a protocol error; or a bug: that connection's end only
            back = _failed(entry, exc)
        if back is not None:  # None: it stays parked
            self._hand_back(entry, back, self._epoll)

    def _answer_ready(self, entry: _Parked) -> Handback | None:
        """Answer what is ready on ``entry``: None while it stays parked,
        else what its task must do."""
        tls, reader, answer, client = entry.tls, entry.reader, entry.answer, entry.client
        watchdog = self._watchdog
        for _ in range(MAX_READS):
            data = tls.receive(DEFAULT_RECEIVE_BYTES)
            if data.__class__ is not bytes:
                if data == WANT_READ:
                    return None  # a wake with nothing to read: stay parked
                return Handback(entry.requests_left)  # a TLS 1.3 key update's answer to write
            if not data:
                back = Handback(entry.requests_left)
                back.eof = True
                return back
            requests = reader.feed(data)
            for index, request in enumerate(requests):
                if watchdog.stopping or entry.requests_left <= 1 or request.upgrade:
                    return _requests_back(entry, requests[index:])
                try:
                    answered = answer(request, client)
                except Exception:  # the task calls it again; its error handling answers
                    return _requests_back(entry, requests[index:])
                if answered is None:
                    back = _requests_back(entry, requests[index:])
                    back.declined = True
                    return back
                entry.requests_left -= 1
                self.served += 1
                response, keep_alive = answered
                sent = tls.send(response)
                if sent != len(response) or not keep_alive:
                    back = _requests_back(entry, requests[index + 1:])
                    back.unsent = response if sent < 0 else response[sent:]
                    back.keep_alive = keep_alive
                    return back
            entry.watched.deadline = watchdog.now + entry.keepalive_s
            if reader.in_request or reader.finished:
                return Handback(entry.requests_left)
            if not tls.pending():
                # Read again only what OpenSSL holds: the socket's next
                # bytes wake ``run`` (a read that finds nothing costs a
                # system call).
                return None
        return Handback(entry.requests_left)


def _failed(entry: _Parked, error: BaseException) -> Handback:
    back = Handback(entry.requests_left)
    back.error = error
    return back


def _requests_back(entry: _Parked, requests: list[Request]) -> Handback:
    back = Handback(entry.requests_left)
    back.requests = requests
    return back
