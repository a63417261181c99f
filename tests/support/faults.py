"""Socket-level faults for tests: what one peer can do to a TCP connection,
as data plus a few functions, on loopback only.

Two sides, two tables:

* :class:`ClientFault`: the test is the *client* of one of the notary's
  listeners (a :class:`Surface`: a port, TLS or not, one valid request).
  :func:`apply` does the fault once; :func:`client_faults` says which
  faults apply to a kind of surface. A test is then a parametrisation over
  surfaces and faults (the enum values read well as test ids).
* :class:`ServerFault`: the test is the *server* an outbound client of the
  notary talks to (a prober target, a witness, a DNS resolver over TCP, a
  database). :func:`open_faulty_server` runs a loopback server that does
  the fault to every connection; what a healthy server would answer is
  the caller's :data:`Respond` function, so one server serves TLS
  targets, HTTPS witnesses and DNS over TCP alike.
  :func:`open_faulty_proxy` sits in front of a real server (PostgreSQL)
  and can pass, stall, drip or reset its connections at any moment.

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
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest
import trio
import trio.testing

from tests.support.notaries import client_context

#: The autojump clock of the fault suites jumps once the run has been idle
#: this long (real seconds), not at once: the notary works in worker threads
#: (its stores), and a clock jumping from deadline to deadline meanwhile
#: would both run its deadlines out and, spinning, starve the thread of the
#: GIL.
WORKER_THREAD_S = 0.001


@pytest.fixture(name="autojump_clock")
def patient_autojump_clock(autojump_clock: trio.testing.MockClock) -> trio.testing.MockClock:
    """pytest-trio's ``autojump_clock``, jumping after ``WORKER_THREAD_S``
    of idleness: a module that imports this fixture has it for its own."""
    autojump_clock.autojump_threshold = WORKER_THREAD_S
    return autojump_clock

__all__ = [
    "DRIP_INTERVAL_S",
    "INTERIM_ANSWERS",
    "ClientFault",
    "FaultyProxy",
    "FaultyServer",
    "Injected",
    "ProxyMode",
    "Respond",
    "ServerFault",
    "Surface",
    "apply",
    "client_faults",
    "client_hello",
    "http_respond",
    "open_faulty_proxy",
    "open_faulty_server",
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


def fault_matrix(faults_by_surface: dict[str, tuple[ClientFault, ...]]) -> list[object]:
    """The ``(surface, fault)`` parameters of a fault-matrix test, one per
    fault of each surface, named ``<surface>-<fault>``."""
    return [
        pytest.param(surface, fault, id=f"{surface}-{fault.value}")
        for surface, faults in faults_by_surface.items() for fault in faults
    ]


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
    #: The client's own address (another loopback address: 127.0.0.2, ...);
    #: empty: the kernel's choice.
    source: str = ""

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
        if surface.source:
            await sock.bind((surface.source, 0))
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
        source = (surface.source, 0) if surface.source else None
        with socket.create_connection((surface.host, surface.port), source_address=source) as sock:
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


# -- the test as a server ------------------------------------------------------------


class ServerFault(enum.Enum):
    """What a server does to the client connecting to it (test ids)."""

    #: RST at once.
    RESET_ON_ACCEPT = "reset-on-accept"
    #: TLS: the ClientHello read, half the server's first flight, RST;
    #: without TLS: the first bytes of the request read, RST.
    RESET_MID_HANDSHAKE = "reset-mid-handshake"
    #: The request read, half the answer sent, RST.
    RESET_MID_ANSWER = "reset-mid-answer"
    #: The request read, ``shutdown(SHUT_WR)`` instead of an answer.
    HALF_CLOSE_BEFORE_ANSWER = "half-close-before-answer"
    #: Nothing read, ever (TLS: after the handshake); the connection held.
    NEVER_READS = "never-reads"
    #: The request read, only an interim answer, then a clean close.
    ANSWER_100 = "answer-100"
    ANSWER_101 = "answer-101"
    ANSWER_103 = "answer-103"
    #: The request read, the answer one byte a second (TLS: a record per
    #: byte, so the client sees progress), then a clean close.
    DRIP = "drip"
    #: The request read, nothing answered; the connection held.
    STALL = "stall"


#: What the ``ANSWER_1xx`` faults send (an interim answer and nothing else).
INTERIM_ANSWERS = {
    ServerFault.ANSWER_100: b"HTTP/1.1 100 Continue\r\n\r\n",
    ServerFault.ANSWER_101: (
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
    ),
    ServerFault.ANSWER_103: b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n",
}

#: The answer a healthy server would give to the request received so far
#: (its plaintext, under TLS), or None while the request is incomplete.
Respond = Callable[[bytes], "bytes | None"]


def http_respond(answer: bytes) -> Respond:
    """``answer`` to any HTTP request, once its head and its
    ``Content-Length`` body are in."""

    def respond(request: bytes) -> bytes | None:
        head, found, body = request.partition(b"\r\n\r\n")
        if not found:
            return None
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        return answer if len(body) >= length else None

    return respond


class _ServerTls:
    """The server side of TLS over memory BIOs: the fault decides what
    bytes reach the socket, and when."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self.handshaken = False

    def feed(self, data: bytes) -> tuple[bytes, bytes]:
        """Take ``data`` from the client: (bytes for the client, plaintext)."""
        if data:
            self._incoming.write(data)
        else:
            self._incoming.write_eof()
        plain = b""
        with contextlib.suppress(ssl.SSLWantReadError, ssl.SSLZeroReturnError):
            if not self.handshaken:
                self._tls.do_handshake()
                self.handshaken = True
            while chunk := self._tls.read(_RECEIVE_BYTES):
                plain += chunk
        return self._outgoing.read(), plain

    def encrypt(self, data: bytes) -> bytes:
        self._tls.write(data)
        return self._outgoing.read()


@dataclass(slots=True)
class FaultyServer:
    """A running :func:`open_faulty_server`: its port, and the connections
    it accepted (``wait_accepted``)."""

    fault: ServerFault | None
    host: str = LOCALHOST
    port: int = 0
    accepted: int = 0
    _changed: trio.Event = field(default_factory=trio.Event)

    async def wait_accepted(self, count: int) -> None:
        while self.accepted < count:
            await self._changed.wait()

    def _accept(self) -> None:
        self.accepted += 1
        self._changed.set()
        self._changed = trio.Event()


@asynccontextmanager
async def open_faulty_server(
    fault: ServerFault | None, respond: Respond, *, tls: ssl.SSLContext | None = None,
    drip_interval_s: float = DRIP_INTERVAL_S,
) -> AsyncIterator[FaultyServer]:
    """A server on 127.0.0.1 (port 0) doing ``fault`` to every connection
    (None: none, the healthy server of a control case), until the block
    exits (every connection is closed then). ``respond``: what a healthy
    server answers; ``tls``: terminate TLS with this context first (else
    the bytes are the protocol's own: for a prober target, ``respond``
    gives the server's TLS flight)."""
    server = FaultyServer(fault)
    listeners = await trio.open_tcp_listeners(0, host=LOCALHOST)
    server.port = listeners[0].socket.getsockname()[1]

    async def handle(stream: trio.SocketStream) -> None:
        server._accept()
        try:
            await _serve_fault(fault, stream, respond, tls, drip_interval_s)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ssl.SSLError):
            pass
        finally:
            stream.socket.close()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, handle, listeners)
        try:
            yield server
        finally:
            nursery.cancel_scope.cancel()


async def _serve_fault(
    fault: ServerFault | None, stream: trio.SocketStream, respond: Respond,
    context: ssl.SSLContext | None, drip_interval_s: float,
) -> None:
    sock = stream.socket
    if fault is ServerFault.RESET_ON_ACCEPT:
        reset(sock)
        return
    if fault is ServerFault.NEVER_READS and context is None:
        await trio.sleep_forever()
    tls = _ServerTls(context) if context is not None else None
    if fault is ServerFault.RESET_MID_HANDSHAKE:
        data = await stream.receive_some(_RECEIVE_BYTES)
        if tls is not None:
            flight, _ = tls.feed(data)
            await stream.send_all(flight[: len(flight) // 2])
        await trio.sleep(SETTLE_S)
        reset(sock)
        return
    request = b""
    while True:
        data = await stream.receive_some(_RECEIVE_BYTES)
        if tls is not None:
            out, data_plain = tls.feed(data)
            if out:
                await stream.send_all(out)
            if not data:
                return
            if fault is ServerFault.NEVER_READS and tls.handshaken:
                await trio.sleep_forever()
            data = data_plain
        elif not data:
            return
        request += data
        answer = respond(request)
        if answer is not None:
            break
    if fault is ServerFault.STALL:
        await trio.sleep_forever()
    if fault is ServerFault.HALF_CLOSE_BEFORE_ANSWER:
        sock.shutdown(socket.SHUT_WR)
        while await stream.receive_some(_RECEIVE_BYTES):
            pass
        return
    if fault in INTERIM_ANSWERS:
        answer = INTERIM_ANSWERS[fault]
    if fault is ServerFault.DRIP:
        for byte in answer:
            await stream.send_all(tls.encrypt(bytes([byte])) if tls is not None else bytes([byte]))
            await trio.sleep(drip_interval_s)
        return
    wire = tls.encrypt(answer) if tls is not None else answer
    if fault is ServerFault.RESET_MID_ANSWER:
        await stream.send_all(wire[: max(1, len(wire) // 2)])
        await trio.sleep(SETTLE_S)
        reset(sock)
        return
    await stream.send_all(wire)
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
    with trio.move_on_after(PEER_PATIENCE_S):
        while await stream.receive_some(_RECEIVE_BYTES):
            pass


# -- a proxy that goes wrong on demand -----------------------------------------------


class ProxyMode(enum.Enum):
    """What a :class:`FaultyProxy` does to its connections, now."""

    PASS = "pass"  # relay both ways
    STALL = "stall"  # relay nothing (both ways), hold every connection
    DRIP = "drip"  # relay to the server; to the client, a byte per interval
    RESET = "reset"  # RST every connection (new ones at once)


@dataclass(slots=True)
class FaultyProxy:
    """A running :func:`open_faulty_proxy`; set ``mode`` at any time."""

    upstream: tuple[str, int]
    drip_interval_s: float
    port: int = 0
    accepted: int = 0
    _mode: ProxyMode = ProxyMode.PASS
    _changed: trio.Event = field(default_factory=trio.Event)
    _clients: set[trio.socket.SocketType] = field(default_factory=set)

    @property
    def mode(self) -> ProxyMode:
        return self._mode

    @mode.setter
    def mode(self, mode: ProxyMode) -> None:
        self._mode = mode
        self._changed.set()
        self._changed = trio.Event()
        if mode is ProxyMode.RESET:
            for sock in list(self._clients):
                reset(sock)

    async def _wait_passing(self) -> None:
        while self._mode is ProxyMode.STALL:
            await self._changed.wait()


@asynccontextmanager
async def open_faulty_proxy(
    upstream: tuple[str, int], *, drip_interval_s: float = DRIP_INTERVAL_S,
) -> AsyncIterator[FaultyProxy]:
    """A TCP proxy on 127.0.0.1 (port 0) to ``upstream`` (a loopback
    address), passing bytes until told otherwise (``FaultyProxy.mode``)."""
    proxy = FaultyProxy(upstream, drip_interval_s)
    listeners = await trio.open_tcp_listeners(0, host=LOCALHOST)
    proxy.port = listeners[0].socket.getsockname()[1]

    async def pipe(source: trio.SocketStream, sink: trio.SocketStream, to_client: bool) -> None:
        while True:
            await proxy._wait_passing()
            data = await source.receive_some(_RECEIVE_BYTES)
            if not data:
                await sink.send_eof()
                return
            await proxy._wait_passing()
            if to_client and proxy.mode is ProxyMode.DRIP:
                for byte in data:
                    await sink.send_all(bytes([byte]))
                    await trio.sleep(proxy.drip_interval_s)
            else:
                await sink.send_all(data)

    async def handle(client: trio.SocketStream) -> None:
        proxy.accepted += 1
        if proxy.mode is ProxyMode.RESET:
            reset(client.socket)
            return
        proxy._clients.add(client.socket)
        try:
            server = await trio.open_tcp_stream(*upstream)
            async with server, trio.open_nursery() as nursery:
                nursery.start_soon(pipe, client, server, False)
                nursery.start_soon(pipe, server, client, True)
        except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            proxy._clients.discard(client.socket)
            client.socket.close()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, handle, listeners)
        try:
            yield proxy
        finally:
            nursery.cancel_scope.cancel()
