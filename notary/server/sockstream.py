"""``SocketStream``: a Trio stream over an accepted TCP socket, for the
HTTP listeners' hot path (issue 21).

``trio.SocketStream`` costs, per receive and per send, a conflict detector,
error translation in generator context managers, a checkpoint check and a
yield to the scheduler: per cache-hit request two scheduler round trips
through every coroutine frame of the connection. This stream calls the
socket directly and yields once per receive:

* ``receive_some`` is always a checkpoint (it yields once, whether data was
  waiting or not), so a client that always has bytes ready cannot starve
  the other tasks and a connection's cancellation is always delivered.
  When the previous receive emptied the socket (it got fewer bytes than
  asked) and ``wait_when_drained`` is set, it waits for the socket to be
  readable before reading: on a plain keep-alive connection the next
  request is rarely there yet, and a read that finds nothing is a wasted
  system call per request (the HTTPS listeners' connections do not use
  this stream: ``notary.server.tlsstream``);
* ``send_all`` is a checkpoint only when the socket's buffer is full and it
  must wait: a response that fits (every cache hit) is sent without
  yielding. Its caller, the HTTP loop, receives before each request, so
  every request still passes a checkpoint;
* there is no detection of two tasks sending (or receiving) at once: each
  connection's task is the only sender and the only receiver, but for an
  upgraded WebSocket whose library serialises its sends.

Resource handling: the stream owns the socket (``socket``, non-blocking)
from construction and closes it in ``aclose``. Error handling: a socket
error is ``trio.BrokenResourceError`` (its cause the ``OSError``); use after
``aclose`` is ``trio.ClosedResourceError``, as for Trio's streams.
"""

from __future__ import annotations

import contextlib
import socket

import trio
from trio.lowlevel import (
    cancel_shielded_checkpoint,
    checkpoint,
    checkpoint_if_cancelled,
    notify_closing,
    wait_readable,
    wait_writable,
)

from notary.server.tlsdriver import WANT_READ, WANT_WRITE

__all__ = ["SocketStream", "tune_tcp_socket"]

DEFAULT_RECEIVE_BYTES = 64 * 1024
#: Linux's TCP_NOTSENT_LOWAT (the socket module lacks the name), and the
#: value Trio's own stream sets.
TCP_NOTSENT_LOWAT = getattr(socket, "TCP_NOTSENT_LOWAT", 25)
NOTSENT_LOWAT_BYTES = 16 * 1024


def tune_tcp_socket(sock: socket.socket) -> None:
    """No Nagle delay, and a bound on the unsent bytes the kernel holds (as
    ``trio.SocketStream`` sets); nothing for a socket that is not TCP."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # The socket is writable again only once less than this is unsent,
        # which bounds what the kernel holds for a client that does not read
        # (and what it still delivers after a send timeout closed it).
        sock.setsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT, NOTSENT_LOWAT_BYTES)


class PlainDriver:
    """A plain socket's calls as the TLS driver's (``notary.server.tlsdriver``):
    ``notary.server.parking`` reads and writes a parked connection through
    either. Never waits: ``WANT_READ`` or ``WANT_WRITE`` when the socket
    would block; a failed system call raises ``OSError``."""

    __slots__ = ("_socket",)

    def __init__(self, sock: socket.socket) -> None:
        self._socket = sock

    def receive(self, max_bytes: int) -> bytes | int:
        try:
            return self._socket.recv(max_bytes)
        except BlockingIOError:
            return WANT_READ

    def send(self, data: bytes | bytearray | memoryview) -> int:
        """The bytes the socket took (maybe fewer than ``data``), or
        ``WANT_WRITE``."""
        try:
            return self._socket.send(data)
        except BlockingIOError:
            return WANT_WRITE

    def pending(self) -> bool:
        """Nothing is ever read ahead here."""
        return False


class SocketStream(trio.abc.HalfCloseableStream):
    """See the module docstring."""

    def __init__(self, sock: socket.socket, *, wait_when_drained: bool = True) -> None:
        sock.setblocking(False)
        tune_tcp_socket(sock)
        self.socket = sock
        #: Its file descriptor, and its calls for ``notary.server.parking``.
        self.fileno = sock.fileno()
        self.driver = PlainDriver(sock)
        self._closed = False
        #: The last receive got fewer bytes than asked: wait before reading
        #: (only with ``wait_when_drained``).
        self._drained = False
        self._wait_when_drained = wait_when_drained

    @property
    def closed(self) -> bool:
        """Whether ``aclose`` was called."""
        return self._closed

    @property
    def parkable(self) -> bool:
        """Whether the connection may wait parked for its next request
        (``notary.server.parking``): always, on a plain socket."""
        return True

    def interrupt(self) -> None:
        """Wake the task waiting on the socket, if one is: its wait raises
        ``trio.ClosedResourceError``; the stream stays open (the HTTP loop's
        watchdog, ``notary.server.connection``)."""
        if not self._closed:
            notify_closing(self.socket)

    def close(self) -> None:
        """Close the socket now (what ``aclose`` does, without waiting)."""
        if not self._closed:
            self._closed = True
            notify_closing(self.socket)
            self.socket.close()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._closed:
            raise trio.ClosedResourceError("the stream is closed")
        sock = self.socket
        size = max_bytes or DEFAULT_RECEIVE_BYTES
        if not self._drained:
            await checkpoint_if_cancelled()
            try:
                data = sock.recv(size)
            except BlockingIOError:
                pass
            except OSError as exc:
                raise trio.BrokenResourceError(exc) from exc
            else:
                self._drained = self._wait_when_drained and len(data) < size
                await cancel_shielded_checkpoint()
                return data
        while True:
            await wait_readable(sock)
            if self._closed:
                raise trio.ClosedResourceError("the stream is closed")
            try:
                data = sock.recv(size)
            except BlockingIOError:
                continue
            except OSError as exc:
                raise trio.BrokenResourceError(exc) from exc
            self._drained = self._wait_when_drained and len(data) < size
            return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the stream is closed")
        sock = self.socket
        try:
            sent = sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            raise trio.BrokenResourceError(exc) from exc
        if sent == len(data):
            return
        with memoryview(data) as view:
            remaining = view[sent:]
            while remaining:
                await wait_writable(sock)
                if self._closed:
                    raise trio.ClosedResourceError("the stream is closed")
                try:
                    sent = sock.send(remaining)
                except BlockingIOError:
                    continue
                except OSError as exc:
                    raise trio.BrokenResourceError(exc) from exc
                remaining = remaining[sent:]

    async def wait_send_all_might_not_block(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the stream is closed")
        await wait_writable(self.socket)

    async def send_eof(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the stream is closed")
        await checkpoint()
        try:
            self.socket.shutdown(socket.SHUT_WR)
        except OSError as exc:
            raise trio.BrokenResourceError(exc) from exc

    async def aclose(self) -> None:
        self.close()
        await checkpoint()

