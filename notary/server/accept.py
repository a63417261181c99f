"""Accepting connections on a listening socket, a whole queue at a time.

``trio.serve_listeners`` accepts one connection per scheduler round (each
``accept`` is a checkpoint). Under load a round takes "active connections x
their work", so new connections wait in the kernel's accept queue, unserved,
until it overflows (measured: ``bench/RESULTS.md``, scenario 6). Here each
wake-up accepts every connection queued (up to ``ACCEPT_BATCH``) before
yielding.

Nothing that happens to one connection ends the listener (docs/security.md,
"Security model"): a connection the peer reset before or while it was
accepted is skipped, whether ``accept`` or the stream's construction (a TLS
socket's, which reads the socket) notices; an error a handler raises is
logged with its traceback and ends that connection only.

Resource handling: ``serve_socket`` owns the listening socket it is given and
closes it when it returns (cancelled); each accepted connection is a
``trio.SocketStream`` owned by its handler task, closed when the handler
returns (a ``trio.SocketStream``, or what the listener's ``make_stream``
makes: ``notary.server.sockstream.SocketStream`` for the HTTP listeners). A
socket whose stream could not be made is closed at once.
Error handling: running out of file descriptors or memory is
logged and retried after ``CAPACITY_PAUSE_S`` (as Trio does); the other
errors of the listening socket itself propagate.
"""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

log = logging.getLogger(__name__)

@dataclass(slots=True)
class ConnectionCounts:
    """A listener's connections: open now, refused (closed at once), and
    its TLS handshakes; its handler updates them, the metrics read them."""

    open_connections: int = 0
    refused_connections: int = 0
    #: TLS handshakes completed, and those that resumed a session (a
    #: ticket or a cached session id).
    tls_handshakes: int = 0
    tls_resumed: int = 0
    #: Connections closed for their PROXY protocol header (missing, bad,
    #: late, or from an address not allowed to send one): the plain API
    #: listeners with ``[server] proxy_protocol_from`` only.
    proxy_refused: int = 0


#: Connections accepted per wake-up at most: a flood cannot hold the loop.
ACCEPT_BATCH = 256
CAPACITY_PAUSE_S = 0.1
_CAPACITY_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}
#: Errors ``accept`` reports for one connection, not the listening socket:
#: a reset or aborted connection, a firewall's verdict, and the pending
#: network errors Linux passes on the new socket (accept(2): "treat them
#: as EAGAIN by retrying").
_GONE_ERRNOS = {
    errno.ECONNABORTED, errno.ECONNRESET, errno.EPROTO, errno.EPERM, errno.ENETDOWN,
    errno.ENOPROTOOPT, errno.EHOSTDOWN, errno.ENONET, errno.EHOSTUNREACH, errno.EOPNOTSUPP,
    errno.ENETUNREACH,
}

Handler = Callable[[Any], Awaitable[object]]
#: Makes the stream a handler is given from an accepted socket (it owns the
#: socket from then on).
StreamMaker = Callable[[socket.socket], trio.abc.Stream]


def trio_stream(connection: socket.socket) -> trio.SocketStream:
    """Trio's own socket stream (the relay's and the admin listener's)."""
    return trio.SocketStream(trio.socket.from_stdlib_socket(connection))


async def serve_socket(
    listening: socket.socket, handler: Handler, nursery: trio.Nursery,
    make_stream: StreamMaker = trio_stream,
) -> None:
    """Accept on ``listening`` until cancelled, each connection a task of
    ``nursery`` running ``handler`` on the stream ``make_stream`` makes."""
    listening.setblocking(False)
    # What ``socket.accept`` does, less its conversion of the listener's
    # family and type to enums per connection (2 of its 5 us, issue 35).
    accept_fd = listening._accept  # type: ignore[attr-defined]
    kind = (int(listening.family), int(listening.type), listening.proto)
    with listening:
        while True:
            await trio.lowlevel.wait_readable(listening)
            for _ in range(ACCEPT_BATCH):
                try:
                    connection = socket.socket(*kind, accept_fd()[0])
                except BlockingIOError:
                    break
                except OSError as exc:
                    if exc.errno in _GONE_ERRNOS:
                        continue
                    if exc.errno not in _CAPACITY_ERRNOS:
                        raise
                    log.error("accept: %s; retrying in %gs", exc.strerror, CAPACITY_PAUSE_S)
                    await trio.sleep(CAPACITY_PAUSE_S)
                    break
                stream = _stream_of(connection, make_stream)
                if stream is not None:
                    nursery.start_soon(_run_handler, handler, stream)


def _stream_of(
    connection: socket.socket, make_stream: StreamMaker
) -> trio.abc.Stream | None:
    """The stream of an accepted ``connection``, or None (the socket closed)
    when it cannot be made: the peer reset it meanwhile (``OSError``,
    ``ssl.SSLError`` among them), or a bug, logged."""
    try:
        return make_stream(connection)
    except OSError:
        pass
    except Exception:
        log.exception("accept: could not set up a connection")
    connection.close()
    return None


async def _run_handler(handler: Handler, stream: trio.abc.Stream) -> None:
    try:
        await handler(stream)
    except Exception:
        # A bug in one connection's handling ends that connection, never
        # the listener (the handlers answer the errors they expect).
        log.exception("connection handler failed")
    finally:
        # The handlers close their streams; a forced close (a cancel scope,
        # cancelled: tens of microseconds) is paid only when one did not.
        if not _closed(stream):
            await trio.aclose_forcefully(stream)


def _closed(stream: trio.abc.Stream) -> bool:
    """Whether ``stream`` is closed: its ``closed`` (the HTTP listeners'
    streams), or its socket's file descriptor gone (``trio.SocketStream``:
    the relay's and the admin listener's)."""
    closed = getattr(stream, "closed", None)
    if closed is not None:
        return bool(closed)
    sock = getattr(stream, "socket", None)
    return sock is not None and sock.fileno() == -1
