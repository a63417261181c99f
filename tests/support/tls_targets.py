"""Local probe targets for tests: TLS servers and misbehaving peers on 127.0.0.1.

Everything here listens on ``127.0.0.1`` port 0 and is an async context
manager that owns its own nursery: the server runs while the block runs and is
cancelled (every connection closed) when it exits. Nothing here resolves a
name or connects anywhere but loopback.

- :func:`open_tls_target` -- a TLS server (stdlib ``ssl`` + ``trio.SSLStream``)
  serving one certificate per SNI name and a default one when no SNI (or an
  unknown name) is sent; certificates can be swapped at runtime; it counts
  accepted connections and records the SNI of every ClientHello.
- :func:`open_stalled_target` -- accepts TCP and never answers.
- :func:`open_garbage_target` -- answers the ClientHello with non-TLS bytes.
- :func:`open_certificate_only_target` -- a hand-written TLS 1.2 server that
  sends any certificate bytes (even ones OpenSSL could not serve).
- :func:`open_truncating_proxy` -- relays to a TLS target but cuts the
  server's answer after N TLS records (close, or TCP reset).
- :func:`open_raw_target` -- any other behaviour, from a handler.
- :func:`closed_port` -- a port on 127.0.0.1 nobody listens on.
- :func:`static_resolver` -- a fake resolver for ``open_prober(resolver=...)``.

Usage::

    async with open_tls_target(names=["www.example.test"]) as server:
        resolver = static_resolver({"www.example.test": [server.host]})
        async with open_prober(ProbeConfig(), policy=..., resolver=resolver) as prober:
            result = (await prober.probe(server.target("www.example.test"))).primary
        assert result.leaf.der == server.leaf_der("www.example.test")
"""

from __future__ import annotations

import dataclasses
import socket
import ssl
import struct
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field

import trio
import trustme

from notary.config import ProbeConfig
from notary.errors import ProbeResolveFailed
from notary.model.targets import Target

__all__ = [
    "DEFAULT_NAME",
    "GARBAGE",
    "LOCALHOST",
    "RawTarget",
    "ServedCertificate",
    "StaticResolver",
    "TLSTarget",
    "closed_port",
    "open_certificate_only_target",
    "open_garbage_target",
    "open_raw_target",
    "open_stalled_target",
    "open_tls_target",
    "open_truncating_proxy",
    "static_resolver",
]

#: The only address these servers listen on.
LOCALHOST = "127.0.0.1"
#: The name on the certificate served without SNI or for an unknown SNI name.
DEFAULT_NAME = "default.example.test"
#: What the garbage target answers: an HTTP error, as a plain-HTTP port would.
GARBAGE = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
#: No test server connection lives longer than this.
CONNECTION_TIMEOUT_S = 30.0
#: The ciphers of a server asked to accept TLS 1.0 or 1.1.
LEGACY_CIPHERS = "DEFAULT:@SECLEVEL=0"
_RECEIVE_BYTES = 64 * 1024
_TLS_RECORD_HEADER = 5


def _pem_to_der(pem: bytes) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pem.decode("ascii"))


class _Counter:
    """A count that tasks can wait on reaching a value."""

    def __init__(self) -> None:
        self.value = 0
        self._waiters: list[tuple[int, trio.Event]] = []

    def increment(self) -> None:
        self.value += 1
        for goal, event in self._waiters:
            if self.value >= goal:
                event.set()
        self._waiters = [(g, e) for g, e in self._waiters if not e.is_set()]

    async def wait_for(self, goal: int) -> None:
        if self.value >= goal:
            await trio.lowlevel.checkpoint()
            return
        event = trio.Event()
        self._waiters.append((goal, event))
        await event.wait()


@dataclass(frozen=True, slots=True)
class ServedCertificate:
    """A certificate a :class:`TLSTarget` serves: ``chain_der`` is what goes
    on the wire, leaf first (leaf and intermediates, not the root)."""

    name: str
    chain_der: tuple[bytes, ...]

    @property
    def leaf_der(self) -> bytes:
        return self.chain_der[0]


class TLSTarget:
    """A running TLS server made by :func:`open_tls_target`.

    Attributes: ``host`` (``127.0.0.1`` unless asked otherwise) and ``port``; ``ca`` (the
    trustme root); ``server_names``: the SNI of every ClientHello received, in
    order (``None`` when the client sent none).
    """

    def __init__(
        self,
        *,
        names: Sequence[str],
        default_name: str,
        intermediates: int,
        minimum_version: ssl.TLSVersion,
        maximum_version: ssl.TLSVersion | None,
    ) -> None:
        if intermediates < 0:
            raise ValueError("intermediates must be >= 0")
        self.host = LOCALHOST
        self.port = 0
        self.ca = trustme.CA(path_length=max(intermediates, 1))
        issuer = self.ca
        for _ in range(intermediates):
            issuer = issuer.create_child_ca()
        self._issuer = issuer
        self._minimum_version = minimum_version
        self._maximum_version = maximum_version
        self._default_name = default_name.lower()
        self._served: dict[str, ServedCertificate] = {}
        self._contexts: dict[str, ssl.SSLContext] = {}
        for name in (self._default_name, *(n.lower() for n in names)):
            self._issue(name)
        self.server_names: list[str | None] = []
        self._accepted = _Counter()
        self._completed = _Counter()
        self._failed = _Counter()
        self._ended = _Counter()
        self._gate = trio.Event()
        self._gate.set()

    # -- what is served --------------------------------------------------

    @property
    def names(self) -> tuple[str, ...]:
        """The SNI names with their own certificate (not the default)."""
        return tuple(n for n in self._served if n != self._default_name)

    def served(self, name: str | None = None) -> ServedCertificate:
        """The certificate currently served for SNI ``name`` (``None``: the
        default one, also served for unknown names)."""
        key = self._default_name if name is None else name.lower()
        return self._served.get(key, self._served[self._default_name])

    def leaf_der(self, name: str | None = None) -> bytes:
        return self.served(name).leaf_der

    def chain_der(self, name: str | None = None) -> tuple[bytes, ...]:
        return self.served(name).chain_der

    def replace_certificate(self, name: str | None = None) -> bytes:
        """Issue a new certificate for ``name`` (``None``: the default) and
        serve it to every handshake from now on; returns the new leaf DER.
        Also adds ``name`` if it had no certificate of its own yet."""
        return self._issue(self._default_name if name is None else name.lower()).leaf_der

    def target(self, name: str | None = None) -> Target:
        """The :class:`Target` for ``name`` on this server's port (``None``:
        the IP literal ``127.0.0.1``, so no SNI is sent)."""
        return Target(self.host if name is None else name.lower(), self.port)

    def _issue(self, name: str) -> ServedCertificate:
        leaf = self._issuer.issue_cert(name)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        with warnings.catch_warnings():  # TLS 1.0 and 1.1 are deprecated: asked for
            warnings.simplefilter("ignore", DeprecationWarning)
            context.minimum_version = self._minimum_version
            if self._maximum_version is not None:
                context.maximum_version = self._maximum_version
        if self._minimum_version < ssl.TLSVersion.TLSv1_2:
            # OpenSSL 3 refuses TLS 1.0/1.1 above security level 0 (SHA-1).
            context.set_ciphers(LEGACY_CIPHERS)
        leaf.configure_cert(context)
        context.sni_callback = self._on_server_name
        served = ServedCertificate(
            name=name, chain_der=tuple(_pem_to_der(p.bytes()) for p in leaf.cert_chain_pems)
        )
        self._served[name] = served
        self._contexts[name] = context
        return served

    def _on_server_name(
        self, ssl_object: ssl.SSLObject, server_name: str | None, _context: ssl.SSLContext
    ) -> None:
        self.server_names.append(server_name)
        if server_name is not None:
            context = self._contexts.get(server_name.lower())
            if context is not None:
                ssl_object.context = context

    # -- counters --------------------------------------------------------

    @property
    def accepted(self) -> int:
        """TCP connections accepted so far."""
        return self._accepted.value

    @property
    def handshakes_completed(self) -> int:
        return self._completed.value

    @property
    def handshakes_failed(self) -> int:
        """Handshakes the client broke off (a probe that aborts after the
        certificates counts here) or that failed otherwise."""
        return self._failed.value

    async def wait_accepted(self, count: int) -> None:
        """Wait until at least ``count`` connections were accepted."""
        await self._accepted.wait_for(count)

    async def wait_handshakes_ended(self, count: int) -> None:
        """Wait until at least ``count`` handshakes completed or failed."""
        await self._ended.wait_for(count)

    # -- holding handshakes ----------------------------------------------

    def pause(self) -> None:
        """Hold every accepted connection before its handshake until
        :meth:`resume` (to keep a probe in progress deterministically)."""
        if self._gate.is_set():
            self._gate = trio.Event()

    def resume(self) -> None:
        self._gate.set()

    # -- serving ---------------------------------------------------------

    async def _handle(self, stream: trio.SocketStream) -> None:
        self._accepted.increment()
        async with stream:
            with trio.move_on_after(CONNECTION_TIMEOUT_S):
                await self._gate.wait()
                tls = trio.SSLStream(stream, self._contexts[self._default_name], server_side=True)
                try:
                    await tls.do_handshake()
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self._failed.increment()
                    self._ended.increment()
                    return
                self._completed.increment()
                self._ended.increment()
                try:
                    while await tls.receive_some(_RECEIVE_BYTES):
                        pass
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass


@asynccontextmanager
async def open_tls_target(
    names: Iterable[str] = ("www.example.test",),
    *,
    default_name: str = DEFAULT_NAME,
    intermediates: int = 1,
    minimum_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2,
    maximum_version: ssl.TLSVersion | None = None,
    host: str = LOCALHOST,
    port: int = 0,
) -> AsyncIterator[TLSTarget]:
    """Run a TLS server on ``host`` (a loopback literal; port 0 unless
    ``port`` is given) serving, for each name in
    ``names``, its own certificate (SNI), and a certificate for
    ``default_name`` otherwise.

    Each certificate is issued by a chain of ``intermediates`` intermediate
    CAs under one root; the server sends the leaf and the intermediates (use a
    large number for a "huge chain"). ``minimum_version``/``maximum_version``
    pin the TLS versions the server accepts (a minimum below TLS 1.2 also
    lowers the server to OpenSSL security level 0, which TLS 1.0 and 1.1
    need in OpenSSL 3).
    """
    server = TLSTarget(
        names=tuple(names),
        default_name=default_name,
        intermediates=intermediates,
        minimum_version=minimum_version,
        maximum_version=maximum_version,
    )
    server.host = host
    async with _serving(server._handle, host=host, port=port) as bound_port:
        server.port = bound_port
        yield server


@dataclass(slots=True)
class RawTarget:
    """A running plain-TCP server made by :func:`open_raw_target` and friends."""

    host: str = LOCALHOST
    port: int = 0
    _accepted: _Counter = field(default_factory=_Counter)

    @property
    def accepted(self) -> int:
        """TCP connections accepted so far."""
        return self._accepted.value

    async def wait_accepted(self, count: int) -> None:
        await self._accepted.wait_for(count)

    def target(self, name: str | None = None) -> Target:
        """The :class:`Target` for ``name`` (``None``: ``127.0.0.1``) on this port."""
        return Target(self.host if name is None else name.lower(), self.port)


@asynccontextmanager
async def open_raw_target(
    handler: Callable[[trio.SocketStream], Awaitable[None]],
) -> AsyncIterator[RawTarget]:
    """Run ``handler`` for every connection accepted on ``127.0.0.1`` (port
    0). The stream is closed after the handler returns (or after
    ``CONNECTION_TIMEOUT_S``), and when the block exits."""
    server = RawTarget()

    async def handle(stream: trio.SocketStream) -> None:
        server._accepted.increment()
        async with stream:
            with trio.move_on_after(CONNECTION_TIMEOUT_S):
                await handler(stream)

    async with _serving(handle) as port:
        server.port = port
        yield server


async def _stall(_stream: trio.SocketStream) -> None:
    await trio.sleep_forever()


def open_stalled_target() -> AbstractAsyncContextManager[RawTarget]:
    """A server that accepts TCP connections and never sends a byte."""
    return open_raw_target(_stall)


def open_garbage_target(payload: bytes = GARBAGE) -> AbstractAsyncContextManager[RawTarget]:
    """A server that reads the ClientHello, answers ``payload`` (non-TLS
    bytes) and closes."""

    async def answer(stream: trio.SocketStream) -> None:
        try:
            await stream.receive_some(_RECEIVE_BYTES)
            await stream.send_all(payload)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    return open_raw_target(answer)


def open_certificate_only_target(
    chain_der: Sequence[bytes],
) -> AbstractAsyncContextManager[RawTarget]:
    """A hand-written TLS 1.2 server that answers any ClientHello with a
    ServerHello and a Certificate message carrying ``chain_der`` as given,
    then reads until the client leaves.

    For certificates OpenSSL cannot serve (a key it cannot load has no
    private key to match): a probe aborts after the Certificate message, so
    it never notices that nothing follows. It picks
    ECDHE-ECDSA-AES128-GCM-SHA256 (OpenSSL clients offer it by default),
    sends a fixed server random (not a downgrade sentinel) and the
    renegotiation_info extension, without which OpenSSL 3 clients refuse
    the ServerHello.
    """
    server_hello = (
        b"\x03\x03" + bytes(range(32)) + b"\x00"  # version, random, no session id
        + b"\xc0\x2b\x00"  # cipher suite, no compression
        + _vector(b"\xff\x01\x00\x01\x00", 2)  # extensions: renegotiation_info
    )
    certificate = _vector(b"".join(_vector(der, 3) for der in chain_der), 3)
    flight = _tls12_record(_handshake_message(2, server_hello)) + _tls12_record(
        _handshake_message(11, certificate)
    )

    async def answer(stream: trio.SocketStream) -> None:
        try:
            await _receive_record(stream)  # the ClientHello
            await stream.send_all(flight)
            while await stream.receive_some(_RECEIVE_BYTES):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    return open_raw_target(answer)


def _vector(data: bytes, length_bytes: int) -> bytes:
    return len(data).to_bytes(length_bytes, "big") + data


def _handshake_message(message_type: int, body: bytes) -> bytes:
    return bytes([message_type]) + _vector(body, 3)


def _tls12_record(fragment: bytes) -> bytes:
    return b"\x16\x03\x03" + _vector(fragment, 2)


async def _receive_record(stream: trio.SocketStream) -> bytes:
    """One whole TLS record (or what came before the peer closed)."""
    data = b""
    while len(data) < _TLS_RECORD_HEADER or len(data) < _TLS_RECORD_HEADER + int.from_bytes(
        data[3:5], "big"
    ):
        chunk = await stream.receive_some(_RECEIVE_BYTES)
        if not chunk:
            break
        data += chunk
    return data


def open_truncating_proxy(
    upstream: TLSTarget, *, records: int = 1, reset: bool = False
) -> AbstractAsyncContextManager[RawTarget]:
    """A server that relays each connection to ``upstream`` but passes on
    only the first ``records`` TLS records of the server's answer (1: just
    the ServerHello), then closes the client connection -- with a TCP reset
    (RST) when ``reset``."""

    async def relay(client: trio.SocketStream) -> None:
        try:
            server = await trio.open_tcp_stream(LOCALHOST, upstream.port)
            async with server, trio.open_nursery() as nursery:
                nursery.start_soon(_pipe, client, server)
                await _forward_records(server, client, records)
                nursery.cancel_scope.cancel()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        if reset:
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    return open_raw_target(relay)


async def _pipe(source: trio.SocketStream, sink: trio.SocketStream) -> None:
    try:
        while data := await source.receive_some(_RECEIVE_BYTES):
            await sink.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


async def _forward_records(
    source: trio.SocketStream, sink: trio.SocketStream, records: int
) -> None:
    buffer = b""
    sent = 0
    while sent < records:
        while len(buffer) >= _TLS_RECORD_HEADER:
            length = int.from_bytes(buffer[3:5], "big")
            end = _TLS_RECORD_HEADER + length
            if len(buffer) < end or sent >= records:
                break
            await sink.send_all(buffer[:end])
            buffer = buffer[end:]
            sent += 1
        if sent >= records:
            return
        data = await source.receive_some(_RECEIVE_BYTES)
        if not data:
            return
        buffer += data


@asynccontextmanager
async def _serving(
    handler: Callable[[trio.SocketStream], Awaitable[None]],
    *,
    host: str = LOCALHOST,
    port: int = 0,
) -> AsyncIterator[int]:
    listeners = await trio.open_tcp_listeners(port, host=host)
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, handler, listeners)
        try:
            yield port
        finally:
            nursery.cancel_scope.cancel()


def closed_port(host: str = LOCALHOST) -> int:
    """A TCP port on ``host`` (a loopback literal: ``127.0.0.1`` or ``::1``)
    that nothing listens on: bound, read, closed. (Another process could take
    it meanwhile; on a test machine that is negligible.) Raises ``OSError``
    if ``host`` cannot be bound (no IPv6)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class StaticResolver:
    """A fake :data:`notary.outbound.dialer.Resolver`: answers from ``mapping`` (name ->
    IP address strings; edit it to simulate a DNS change), raises
    ``ProbeResolveFailed`` for names it does not know, and records every
    ``(host, port)`` it was asked in ``calls``. Never touches the network."""

    def __init__(self, mapping: Mapping[str, Sequence[str]]) -> None:
        self.mapping: dict[str, list[str]] = {k.lower(): list(v) for k, v in mapping.items()}
        self.calls: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        await trio.lowlevel.checkpoint()
        self.calls.append((host, port))
        try:
            return list(self.mapping[host.lower()])
        except KeyError:
            raise ProbeResolveFailed("name did not resolve") from None


def static_resolver(mapping: Mapping[str, Sequence[str]]) -> StaticResolver:
    """``static_resolver({"www.example.test": ["127.0.0.1"]})``."""
    return StaticResolver(mapping)


def with_probe_section(settings: dict) -> dict:
    """``open_prober``'s arguments from flat test settings: the ``[probe]``
    keys among them (``timeout_s``, ``max_concurrent``,
    ``max_handshake_bytes``) become its ``ProbeConfig``."""
    keys = {f.name for f in dataclasses.fields(ProbeConfig)}
    section = ProbeConfig(**{k: v for k, v in settings.items() if k in keys})
    return {"probe": section, **{k: v for k, v in settings.items() if k not in keys}}
