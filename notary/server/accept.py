"""Accepting connections on a listening socket, a whole queue at a time.

``trio.serve_listeners`` accepts one connection per scheduler round (each
``accept`` is a checkpoint). Under load a round takes "active connections x
their work", so new connections wait in the kernel's accept queue, unserved,
until it overflows (measured: ``bench/RESULTS.md``, scenario 6). Here each
wake-up accepts every connection queued (up to ``ACCEPT_BATCH``) before
yielding.

Resource handling: ``serve_socket`` owns the listening socket it is given and
closes it when it returns (cancelled); each accepted connection is a
``trio.SocketStream`` owned by its handler task, closed when the handler
returns. Error handling: running out of file descriptors or memory is
logged and retried after ``CAPACITY_PAUSE_S`` (as Trio does); a connection
reset before it was accepted is skipped; any other error propagates.
"""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

log = logging.getLogger(__name__)

@dataclass(slots=True)
class ConnectionCounts:
    """A listener's connections: open now and refused (closed at once);
    its handler updates them, the metrics read them."""

    open_connections: int = 0
    refused_connections: int = 0


#: Connections accepted per wake-up at most: a flood cannot hold the loop.
ACCEPT_BATCH = 256
CAPACITY_PAUSE_S = 0.1
_CAPACITY_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}
_GONE_ERRNOS = {errno.ECONNABORTED, errno.EPROTO, errno.EPERM}

Handler = Callable[[trio.SocketStream], Awaitable[object]]


async def serve_socket(listening: socket.socket, handler: Handler, nursery: trio.Nursery) -> None:
    """Accept on ``listening`` until cancelled, each connection a task of
    ``nursery`` running ``handler``."""
    listening.setblocking(False)
    with listening:
        while True:
            await trio.lowlevel.wait_readable(listening)
            for _ in range(ACCEPT_BATCH):
                try:
                    connection, _ = listening.accept()
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
                stream = trio.SocketStream(trio.socket.from_stdlib_socket(connection))
                nursery.start_soon(_run_handler, handler, stream)


async def _run_handler(handler: Handler, stream: trio.SocketStream) -> None:
    try:
        await handler(stream)
    finally:
        await trio.aclose_forcefully(stream)
