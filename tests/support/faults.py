"""Socket-level faults for tests: what one peer can do to a TCP connection,
as data plus a few functions, on loopback only.

:class:`ClientFault`: the test is the *client* of one of the notary's
listeners (a :class:`Surface`: a port, TLS or not, one valid request).
:func:`apply` does the fault once; :func:`client_faults` says which faults
apply to a kind of surface. A test is then a parametrisation over surfaces
and faults (the enum values read well as test ids).

Waits are Trio's: on the autojump clock a drip of one byte a second or a
stall of a minute costs no real time (loopback I/O between tasks of one
run is ready as soon as it is sent, so the clock only jumps when every
task truly waits). A reset is an RST: ``SO_LINGER`` 0, then close.

Nothing here asserts: a fault reports what the peer saw (:class:`Injected`)
and the test asserts what must hold (the node still answers, its
connection counts return to zero).
"""

from __future__ import annotations

import contextlib
import enum
import os
import socket
import ssl
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from tests.support.notaries import client_context

__all__ = [
    "DRIP_INTERVAL_S",
    "ClientFault",
    "Injected",
    "Surface",
    "apply",
    "client_faults",
    "client_hello",
    "reset",
    "websocket_frame",
    "whole_http_answer",
]

LOCALHOST = "127.0.0.1"
#: A drip: one byte per this many seconds (of Trio's clock).
DRIP_INTERVAL_S = 1.0
#: How long a client fault waits for the notary's side of the story (an
#: answer, the end of the connection) before giving up: longer than any
#: deadline of the notaries under test, so that a connection the notary
#: never closes shows in its connection counts, not here.
PEER_PATIENCE_S = 120.0
#: How long a client that never reads goes on sending before it stops
#: (and keeps the connection open, silent).
FLOOD_FOR_S = 1.0
#: Copies of a surface's request a flooding client pipelines.
FLOOD_COPIES = 500
#: A flooding client's receive buffer: small, so the notary's answers
#: back up at once.
SMALL_RCVBUF = 4096
#: A moment for the other side to take what was sent (before a reset).
SETTLE_S = 0.1
_RECEIVE_BYTES = 64 * 1024


def reset(sock: socket.socket | trio.socket.SocketType) -> None:
    """Abort ``sock`` with an RST (``SO_LINGER`` 0, then close)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


# -- the test as a client ------------------------------------------------------------


class ClientFault(enum.Enum):
    """What a client does to a listener (the values are the test ids)."""

    #: Connect, then RST before the server accepts (the kernel queues a
    #: connection that is already reset: issue 30, item 1).
    RESET_BEFORE_ACCEPT = "reset-before-accept"
    #: The same with the first bytes of the request (TLS: of the
    #: ClientHello) in the receive queue before the RST.
    DATA_THEN_RESET_BEFORE_ACCEPT = "data-then-reset-before-accept"
    #: TLS: half a ClientHello, then RST.
    RESET_MID_HANDSHAKE = "reset-mid-handshake"
    #: TLS: a whole ClientHello, the first bytes of the server's answer,
    #: then RST (the server waits for the client's Finished).
    RESET_AFTER_SERVER_HELLO = "reset-after-server-hello"
    #: Half the request, then RST.
    RESET_MID_REQUEST = "reset-mid-request"
    #: Pipelined requests (the surface's ``flood``), the first bytes of the
    #: answers, then RST while the server is still sending.
    RESET_MID_ANSWER = "reset-mid-answer"
    #: Half the request, then ``shutdown(SHUT_WR)``; read what comes.
    HALF_CLOSE_MID_REQUEST = "half-close-mid-request"
    #: The whole request, then ``shutdown(SHUT_WR)``; read what comes.
    HALF_CLOSE_AFTER_REQUEST = "half-close-after-request"
    #: Pipelined requests with a small receive buffer, never a read; the
    #: connection stays open (the test closes it at the end).
    NEVER_READS = "never-reads"
    #: The request one byte a second (TLS: one record per byte), then read.
    DRIP = "drip"
    #: A request with a body sent with ``Expect: 100-continue``: the head,
    #: a second's wait (as curl does), then the body; read the answer.
    EXPECT_CONTINUE = "expect-100-continue"
    #: An ``Upgrade: websocket`` request to a path that upgrades nothing,
    #: with a second request pipelined after it; read what comes.
    UPGRADE_ELSEWHERE = "upgrade-elsewhere"


#: Faults every TCP listener gets.
_ANY_LISTENER = (
    ClientFault.RESET_BEFORE_ACCEPT,
    ClientFault.DATA_THEN_RESET_BEFORE_ACCEPT,
)
#: Faults of whoever reads requests on a connection.
_ANY_REQUEST = (
    ClientFault.RESET_MID_REQUEST,
    ClientFault.RESET_MID_ANSWER,
    ClientFault.HALF_CLOSE_MID_REQUEST,
    ClientFault.HALF_CLOSE_AFTER_REQUEST,
    ClientFault.NEVER_READS,
    ClientFault.DRIP,
)
_TLS = (ClientFault.RESET_MID_HANDSHAKE, ClientFault.RESET_AFTER_SERVER_HELLO)
_HTTP = (ClientFault.EXPECT_CONTINUE, ClientFault.UPGRADE_ELSEWHERE)


def client_faults(
    *, listener: bool = True, tls: bool = False, http: bool = False,
) -> tuple[ClientFault, ...]:
    """The faults that apply to a surface: ``listener`` (its own port: the
    faults before any request; False for a path on another listener's
    port, whose port faults that listener's tests do), ``tls``, ``http``
    (an HTTP/1.1 request loop: ``Expect``, ``Upgrade``)."""
    faults: list[ClientFault] = []
    if listener:
        faults += _ANY_LISTENER
        if tls:
            faults += _TLS
    faults += _ANY_REQUEST
    if http:
        faults += _HTTP
    return tuple(faults)


@dataclass(frozen=True, slots=True)
class Surface:
    """A listener (or a path on one) as a client fault sees it.

    ``request``: one valid request the surface answers (an HTTP one keeps
    the connection alive: ``HTTP/1.1`` without ``Connection: close``);
    ``flood``: what a client that pipelines sends (default: ``request``
    ``FLOOD_COPIES`` times); ``post``: a request with a body, for
    ``EXPECT_CONTINUE`` (default: ``request``); ``handshake``: sent first,
    and the head of its answer read, before the fault (a WebSocket's
    upgrade, for the faults of the frames that follow)."""

    name: str
    port: int
    request: bytes
    tls: bool = False
    flood: bytes = b""
    post: bytes = b""
    handshake: bytes = b""
    host: str = LOCALHOST

    @property
    def flood_bytes(self) -> bytes:
        return self.flood or self.request * FLOOD_COPIES


@dataclass(slots=True)
class Injected:
    """What a client fault saw: ``answer``, the bytes the server sent
    (decrypted); ``closed``, whether the server ended the connection;
    ``held``, sockets the fault leaves open (a client that never reads),
    for :meth:`close` once the test has checked what it wanted."""

    answer: bytes = b""
    closed: bool = False
    held: list[trio.socket.SocketType] = field(default_factory=list)

    def close(self) -> None:
        for sock in self.held:
            sock.close()
        self.held.clear()


class _Client:
    """One client connection: the TCP socket and the stream over it
    (TLS, without SNI or verification, when the surface has TLS)."""

    def __init__(self, sock: trio.socket.SocketType, stream: trio.abc.Stream) -> None:
        self.sock = sock
        self.stream = stream

    @classmethod
    async def open(cls, surface: Surface, *, rcvbuf: int = 0, handshake: bool = True) -> _Client:
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        await sock.connect((surface.host, surface.port))
        stream: trio.abc.Stream = trio.SocketStream(sock)
        if surface.tls and handshake:
            stream = trio.SSLStream(
                stream, client_context(), server_hostname=None, https_compatible=True
            )
            await stream.do_handshake()
        return cls(sock, stream)

    async def send(self, data: bytes) -> bool:
        """Send ``data``; False when the server has gone."""
        try:
            await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        return True

    async def receive(self) -> bytes:
        """Some bytes, b"" at the end (a reset is an end too)."""
        try:
            return await self.stream.receive_some(_RECEIVE_BYTES)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return b""

    async def read_to_end(
        self, seen: Injected, *, until: Callable[[bytes], bool] | None = None
    ) -> None:
        """Read into ``seen`` until the server closes (or ``until`` what was
        read), for at most ``PEER_PATIENCE_S``."""
        with trio.move_on_after(PEER_PATIENCE_S):
            while until is None or not until(seen.answer):
                data = await self.receive()
                if not data:
                    seen.closed = True
                    return
                seen.answer += data

    def half_close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)

    def reset(self) -> None:
        reset(self.sock)

    def close(self) -> None:
        self.sock.close()


async def apply(fault: ClientFault, surface: Surface) -> Injected:
    """Do ``fault`` once to ``surface`` (see :class:`ClientFault`) and
    return what the client saw; every socket is closed, but those a client
    that never reads keeps open (``Injected.held``)."""
    seen = Injected()
    if fault in (ClientFault.RESET_BEFORE_ACCEPT, ClientFault.DATA_THEN_RESET_BEFORE_ACCEPT):
        # A blocking connect and close with no checkpoint between: the
        # listener (a task of this very Trio run) cannot accept in between.
        with socket.create_connection((surface.host, surface.port)) as sock:
            if fault is ClientFault.DATA_THEN_RESET_BEFORE_ACCEPT:
                sock.sendall(client_hello()[:40] if surface.tls else surface.request[:10])
            reset(sock)
        await trio.lowlevel.checkpoint()
        return seen
    if fault in (ClientFault.RESET_MID_HANDSHAKE, ClientFault.RESET_AFTER_SERVER_HELLO):
        client = await _Client.open(surface, handshake=False)
        hello = client_hello()
        if fault is ClientFault.RESET_MID_HANDSHAKE:
            await client.send(hello[: len(hello) // 2])
            await trio.sleep(SETTLE_S)
        else:
            await client.send(hello)
            with trio.move_on_after(PEER_PATIENCE_S):
                seen.answer = await client.receive()
        client.reset()
        return seen
    rcvbuf = SMALL_RCVBUF if fault in (ClientFault.NEVER_READS, ClientFault.RESET_MID_ANSWER) else 0
    client = await _Client.open(surface, rcvbuf=rcvbuf)
    try:
        if surface.handshake:
            await client.send(surface.handshake)
            await client.read_to_end(Injected(), until=lambda data: b"\r\n\r\n" in data)
        await _apply_on(fault, surface, client, seen)
    finally:
        if not seen.held:
            client.close()
    return seen


async def _apply_on(
    fault: ClientFault, surface: Surface, client: _Client, seen: Injected
) -> None:
    request = surface.request
    half = request[: len(request) // 2]
    if fault is ClientFault.RESET_MID_REQUEST:
        await client.send(half)
        await trio.sleep(SETTLE_S)
        client.reset()
    elif fault is ClientFault.RESET_MID_ANSWER:
        with trio.move_on_after(FLOOD_FOR_S):
            await client.send(surface.flood_bytes)
        with trio.move_on_after(PEER_PATIENCE_S):
            seen.answer = await client.receive()
        client.reset()
    elif fault in (ClientFault.HALF_CLOSE_MID_REQUEST, ClientFault.HALF_CLOSE_AFTER_REQUEST):
        await client.send(half if fault is ClientFault.HALF_CLOSE_MID_REQUEST else request)
        client.half_close()
        await client.read_to_end(seen)
    elif fault is ClientFault.NEVER_READS:
        with trio.move_on_after(FLOOD_FOR_S):
            await client.send(surface.flood_bytes)
        seen.held.append(client.sock)
    elif fault is ClientFault.DRIP:
        for byte in request:
            if not await client.send(bytes([byte])):
                break
            await trio.sleep(DRIP_INTERVAL_S)
        await client.read_to_end(seen)
    elif fault is ClientFault.EXPECT_CONTINUE:
        head, _, body = (surface.post or request).partition(b"\r\n\r\n")
        await client.send(head + b"\r\nExpect: 100-continue\r\n\r\n")
        await trio.sleep(1.0)  # curl's wait for a 100 that may not come
        await client.send(body)
        await client.read_to_end(seen, until=whole_http_answer)
    elif fault is ClientFault.UPGRADE_ELSEWHERE:
        head, _, body = request.partition(b"\r\n\r\n")
        upgrade = (
            b"\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13"
            b"\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
        )
        await client.send(head + upgrade + body + request)
        await client.read_to_end(seen)
    else:  # pragma: no cover - a fault without a branch is a bug of this module
        raise AssertionError(fault)


def whole_http_answer(data: bytes) -> bool:
    """Whether ``data`` holds a whole final HTTP answer (with its
    ``Content-Length`` body), after any interim (1xx) ones."""
    while True:
        head, found, rest = data.partition(b"\r\n\r\n")
        if not found:
            return False
        status = head.split(b" ", 2)[1:2]
        if not (status and status[0].startswith(b"1")):
            break
        data = rest
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return len(rest) >= length


def client_hello() -> bytes:
    """The bytes of a real TLS ClientHello (no SNI)."""
    outgoing = ssl.MemoryBIO()
    client = client_context().wrap_bio(ssl.MemoryBIO(), outgoing, server_hostname=None)
    with contextlib.suppress(ssl.SSLWantReadError):
        client.do_handshake()
    return outgoing.read()


def websocket_frame(payload: bytes, opcode: int = 0x1) -> bytes:
    """A final, masked client frame (RFC 6455) carrying ``payload``."""
    mask = os.urandom(4)
    length = len(payload)
    if length < 126:
        header = struct.pack("!BB", 0x80 | opcode, 0x80 | length)
    elif length < 1 << 16:
        header = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, length)
    else:
        header = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, length)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return header + mask + masked
