"""``TlsStream``: server-side TLS straight on the accepted socket, for the
HTTPS listeners (issues 21 and 35).

``trio.SSLStream`` runs OpenSSL over memory buffers: every record OpenSSL
reads or writes is copied through a ``MemoryBIO`` and moved by a Trio stream
underneath, with a retry loop, conflict detectors and a lock per operation.
That suits any transport; ours is always a TCP socket. Here OpenSSL reads
and writes the non-blocking socket itself, through the TLS driver
(``notary.server.tlsdriver``: compiled over OpenSSL's own API, or its twin
over ``ssl.SSLSocket``), and the stream only waits when the driver says
OpenSSL would block (``WANT_READ``, ``WANT_WRITE``).

Behaviour, as ``SSLStream(..., https_compatible=True)``:

* ``do_handshake`` runs the server side of the handshake; the caller bounds
  it in time. ``receive_some`` and ``send_all`` need it done first;
* a client that closes without ``close_notify`` (most HTTPS clients) ends
  the stream like a clean close: ``receive_some`` returns ``b""``;
* ``receive_some`` is always a checkpoint; ``send_all`` only when it must
  wait for the socket. A receive that follows a send yields to the
  scheduler *before* reading: the connection then reads its next request
  after the other ready tasks ran, by when a keep-alive client has often
  sent it, instead of at once, finding nothing (a failed read, a wait
  registered with epoll). Measured: 25 -> 19 us per HTTPS keep-alive
  request, 94 -> 89 per one-target ``/v2/query`` (``bench/RESULTS.md``). A
  connection closed after its answer pays nothing (no receive follows);
  yielding in ``send_all`` instead cost it ~14 us. On plain HTTP the
  yield measured slower: ``sockstream`` waits before reading instead;
* ``aclose`` sends ``close_notify`` if the socket takes it at once, never
  waits for the client's, and closes the socket. TLS has no half-close.

Resource handling: the stream owns the socket from construction (``socket``:
the socket given, or with the pure driver the ``ssl.SSLSocket`` that took
over its file descriptor) and closes it in ``aclose``. Error handling: a TLS
or socket error is ``trio.BrokenResourceError`` (its cause the
``ssl.SSLError`` or ``OSError``); use after ``aclose`` is
``trio.ClosedResourceError``. Each connection's task is its only sender and
receiver (the WebSocket library serialises its own sends), so there is no
conflict detection.
"""

from __future__ import annotations

import socket
import ssl

import trio
from trio.lowlevel import (
    cancel_shielded_checkpoint,
    checkpoint,
    checkpoint_if_cancelled,
    notify_closing,
    wait_readable,
    wait_writable,
)

from notary.server.sockstream import DEFAULT_RECEIVE_BYTES, tune_tcp_socket
from notary.server.tlsdriver import WANT_READ, ServerContext

__all__ = ["ServerContext", "TlsStream"]


class TlsStream(trio.abc.Stream):
    """See the module docstring. ``server``: the listener's
    ``tlsdriver.ServerContext`` (made once, from its ``ssl.SSLContext``)."""

    def __init__(self, sock: socket.socket, server: ServerContext) -> None:
        sock.setblocking(False)
        tune_tcp_socket(sock)
        self._tls = server.connection(sock)
        #: The TLS driver's connection (``notary.server.parking`` reads and
        #: writes through it while the stream's task is parked).
        self.driver = self._tls
        #: The socket (``getpeername``); the stream closes it.
        self.socket: socket.socket = self._tls.socket
        #: Its file descriptor.
        self.fileno = self._fd = self.socket.fileno()
        self._closed = False
        self._handshaken = False
        #: The last operation was a send: the next receive yields first.
        self._sent = False

    @property
    def session_reused(self) -> bool:
        """Whether the handshake resumed a session (a ticket or a session id)."""
        return bool(self._tls.session_reused)

    @property
    def parkable(self) -> bool:
        """Whether the connection may wait parked for its next request
        (``notary.server.parking``): once handshaken, and while OpenSSL
        holds no bytes it read ahead from the socket (a receive returns
        them without waiting; epoll cannot see them)."""
        return self._handshaken and not self._tls.pending()

    def version(self) -> str | None:
        """The TLS version agreed (``"TLSv1.3"``), None before the handshake."""
        return self._tls.version()

    async def do_handshake(self) -> None:
        """The server side of the handshake (at most once; a checkpoint)."""
        if self._closed:
            raise trio.ClosedResourceError("the stream is closed")
        if self._handshaken:
            await checkpoint()
            return
        handshake = self._tls.handshake
        await checkpoint_if_cancelled()
        while True:
            try:
                want = handshake()
            except (ssl.SSLError, OSError) as exc:
                raise trio.BrokenResourceError(exc) from exc
            if not want:
                break
            if want == WANT_READ:
                await wait_readable(self._fd)
            else:
                await wait_writable(self._fd)
            if self._closed:
                raise trio.ClosedResourceError("the stream is closed")
        self._handshaken = True
        await cancel_shielded_checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._closed:
            raise trio.ClosedResourceError("the stream is closed")
        receive = self._tls.receive
        size = max_bytes or DEFAULT_RECEIVE_BYTES
        yielded = self._sent
        if yielded:  # see the module docstring: a keep-alive client's next request
            self._sent = False
            await checkpoint()
        else:
            await checkpoint_if_cancelled()
        while True:
            try:
                data = receive(size)
            except (ssl.SSLError, OSError) as exc:
                raise trio.BrokenResourceError(exc) from exc
            if data.__class__ is bytes:
                if not yielded:
                    await cancel_shielded_checkpoint()
                return data
            if data == WANT_READ:
                await wait_readable(self._fd)
            else:  # a TLS 1.3 key update's answer
                await wait_writable(self._fd)
            yielded = True
            if self._closed:
                raise trio.ClosedResourceError("the stream is closed")

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the stream is closed")
        send = self._tls.send
        # OpenSSL writes all or nothing (no partial-write mode); after a
        # would-block it must be called again with the same bytes.
        with memoryview(data) as remaining:
            while remaining:
                try:
                    sent = send(remaining)
                except (ssl.SSLError, OSError) as exc:
                    raise trio.BrokenResourceError(exc) from exc
                if sent > 0:
                    remaining = remaining[sent:]
                    continue
                if sent == WANT_READ:
                    await wait_readable(self._fd)
                else:
                    await wait_writable(self._fd)
                if self._closed:
                    raise trio.ClosedResourceError("the stream is closed")
        self._sent = True
        if not data:
            await checkpoint()

    async def wait_send_all_might_not_block(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the stream is closed")
        await wait_writable(self._fd)

    @property
    def closed(self) -> bool:
        """Whether ``aclose`` was called."""
        return self._closed

    def interrupt(self) -> None:
        """Wake the task waiting on the socket, if one is: its wait raises
        ``trio.ClosedResourceError``; the stream stays open (the HTTP loop's
        watchdog, ``notary.server.connection``)."""
        if not self._closed:
            notify_closing(self._fd)

    async def aclose(self) -> None:
        self.close()
        await checkpoint()

    def close(self) -> None:
        """Send ``close_notify`` if the socket takes it at once, and close
        (what ``aclose`` does, without waiting)."""
        if not self._closed:
            self._closed = True
            # One try: the close_notify goes out if the socket takes it; the
            # client's answer is not awaited (as browsers and Trio's
            # https_compatible streams do not).
            self._tls.close()
            notify_closing(self._fd)
            self.socket.close()
