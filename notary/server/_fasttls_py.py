"""Server-side TLS on a non-blocking socket, without waiting (issue 35): the
pure-Python twin of the compiled ``notary.server._fasttls``, and the
reference of its behaviour; ``notary.server.tlsdriver`` picks one and
``notary.server.tlsstream.TlsStream`` does the waiting.

A ``Connection`` never blocks and never raises for "would block": each call
returns ``WANT_READ`` or ``WANT_WRITE`` when OpenSSL needs the socket to be
readable or writable first, and the caller calls again with the same
arguments once it is. This twin runs ``ssl.SSLSocket`` (each "would block"
an exception caught here); the compiled one runs OpenSSL's ``SSL`` objects
over the same ``SSL_CTX``.

Resource handling: a ``Connection`` uses its socket (``socket``) but does
not close it: its owner (the stream) closes the socket after ``close``.
Error handling: a TLS failure raises ``ssl.SSLError``, a failed system call
``OSError``; a client that ends the connection without ``close_notify``
(most HTTPS clients), or resets it while the server reads, is an end, not
an error (``receive`` returns ``b""``, as Python's ``ssl`` does: its
``SSL_read_ex`` failing with no OpenSSL error is a ragged EOF).
Use after ``close`` raises ``ValueError``.
"""

from __future__ import annotations

import contextlib
import socket
import ssl

__all__ = ["WANT_READ", "WANT_WRITE", "Connection", "ServerContext"]

#: Returned when OpenSSL must read from the socket before it can go on.
WANT_READ = -1
#: Returned when OpenSSL must write to the socket before it can go on.
WANT_WRITE = -2


class ServerContext:
    """The server side of ``context`` (an ``ssl.SSLContext`` holding the
    certificate): makes one ``Connection`` per accepted socket. The compiled
    twin refuses (``ValueError``) a context with an SNI, keylog or message
    callback; this one accepts any."""

    def __init__(self, context: ssl.SSLContext) -> None:
        if not isinstance(context, ssl.SSLContext):
            raise TypeError("an ssl.SSLContext is needed")
        self.context = context

    def connection(self, sock: socket.socket) -> Connection:
        """A ``Connection`` over ``sock``, a connected non-blocking TCP socket
        (it is wrapped: ``Connection.socket`` is the socket to wait on and to
        close from then on)."""
        return Connection(self.context, sock)


class Connection:
    """One server-side TLS connection; see the module docstring."""

    def __init__(self, context: ssl.SSLContext, sock: socket.socket) -> None:
        #: The socket to wait on and to close (here the TLS socket, which
        #: took over the file descriptor of the socket given).
        tls = context.wrap_socket(
            sock, server_side=True, do_handshake_on_connect=False, suppress_ragged_eofs=True
        )
        self.socket: socket.socket = tls
        self._tls: ssl.SSLSocket | None = tls
        self._handshaken = False

    def _live(self) -> ssl.SSLSocket:
        if self._tls is None:
            raise ValueError("the TLS connection is closed")
        return self._tls

    def handshake(self) -> int:
        """Go on with the server side of the handshake: 0 once it is done,
        else ``WANT_READ`` or ``WANT_WRITE``."""
        tls = self._live()
        try:
            tls.do_handshake()
        except ssl.SSLWantReadError:
            return WANT_READ
        except ssl.SSLWantWriteError:
            return WANT_WRITE
        self._handshaken = True
        return 0

    def receive(self, max_bytes: int) -> bytes | int:
        """Up to ``max_bytes`` of the client's data (``b""``: the client
        ended the connection), or ``WANT_READ`` / ``WANT_WRITE`` (a TLS 1.3
        key update's answer)."""
        tls = self._live()
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        try:
            return tls.recv(max_bytes)
        except ssl.SSLWantReadError:
            return WANT_READ
        except ssl.SSLWantWriteError:
            return WANT_WRITE

    def send(self, data: bytes | bytearray | memoryview) -> int:
        """Send ``data`` whole (OpenSSL writes all or nothing) and return its
        length, or ``WANT_WRITE`` / ``WANT_READ``: then call again with the
        same bytes."""
        tls = self._live()
        with memoryview(data) as view:
            if not view.nbytes:
                return 0
            try:
                return tls.send(view)
            except ssl.SSLWantWriteError:
                return WANT_WRITE
            except ssl.SSLWantReadError:
                return WANT_READ

    def pending(self) -> bool:
        """Whether OpenSSL holds bytes of the client's it has read from the
        socket and not returned yet (``receive`` returns them at once)."""
        return self._tls is not None and self._tls.pending() > 0

    @property
    def session_reused(self) -> bool:
        """Whether the handshake resumed a session (a ticket or a session id)."""
        return self._tls is not None and bool(self._tls.session_reused)

    def version(self) -> str | None:
        """The TLS version agreed (``"TLSv1.3"``), None before the handshake."""
        if self._tls is None or not self._handshaken:
            return None
        return self._tls.version()

    def close(self) -> None:
        """Send ``close_notify`` if the handshake was made and the socket
        takes it at once (never waiting for the client's); the socket stays
        open for its owner to close. Calling it again does nothing."""
        tls, self._tls = self._tls, None
        if tls is not None and self._handshaken:
            with contextlib.suppress(ssl.SSLError, OSError, ValueError):
                tls.unwrap()
