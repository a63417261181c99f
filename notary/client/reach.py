"""Reaching a notary of a bundle: a TCP connection to one of its hosts,
directly or tunnelled through another notary's relay (the legacy CONNECT
bounce), TLS authenticated by the bundle's SHA-1 pin, and one HTTP/1.1
request whose response is read until the notary closes.

Shared by ``notary check`` (``notary.client.check``), its log checks
(``notary.client.logcheck``) and the log monitor (``notary.client.logfetch``).

Resource handling: each function that opens a connection owns it until it
returns it; ``exchange`` closes its own. Error handling: ``NotaryFailed``
(the notary could not be asked, with a short detail and the host tried)
and ``RelayFailed`` (the relay could not be used: another may be tried);
nothing else escapes from a network failure.
"""

from __future__ import annotations

import hashlib
import ssl
from collections.abc import Callable

import trio

from notary.errors import NotaryError, PeerError, ProbeError
from notary.model.policy import ANY_ADDRESS
from notary.model.targets import normalise_host
from notary.outbound.dialer import Resolver, dial_first
from notary.protocol import convergence
from notary.protocol.bundle import Bundle, BundleHost
from notary.protocol.http import Response, parse_response
from notary.protocol.relay import DESTINATION_HEADER, RELAY_PORT
from notary.state import crypto

__all__ = [
    "MAX_RESPONSE_BYTES",
    "NotaryFailed",
    "RelayFailed",
    "RequestBuilder",
    "connect_bounced",
    "connect_direct",
    "exchange",
    "host_authority",
    "http_request",
    "pinned_tls",
    "wire_host",
]


#: The largest answer read from a notary or relay.
MAX_RESPONSE_BYTES = 1024 * 1024


class RelayFailed(Exception):
    """The relay could not be reached or refused the tunnel."""


class NotaryFailed(Exception):
    """A notary could not be asked: no connection, wrong pin, bad answer."""

    def __init__(self, detail: str, host: BundleHost | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.host = host


RequestBuilder = Callable[[BundleHost], bytes]


def wire_host(host: BundleHost) -> str:
    """``host``'s name as it goes on the wire and to the resolver: an A-label
    name (IDNA) or a canonical IP literal.

    Error handling: ``NotaryFailed`` when the bundle's host is not a host
    (a bundle made without validation).
    """
    try:
        return normalise_host(host.host)
    except NotaryError:
        raise NotaryFailed("its bundle names a host that is not a host name") from None


def host_authority(name: str) -> str:
    """A wire host for a Host header or a CONNECT target: IPv6 in brackets."""
    return f"[{name}]" if ":" in name else name


def http_request(
    method: str, path: str, host: BundleHost, body: bytes = b"", content_type: bytes = b""
) -> bytes:
    authority = host_authority(wire_host(host))
    head = f"{method} {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n"
    if method == "POST":
        head += f"Content-Type: {content_type.decode('ascii')}\r\nContent-Length: {len(body)}\r\n"
    return (head + "\r\n").encode("ascii") + body


async def exchange(
    bundle: Bundle, relay: Bundle | None, resolver: Resolver, build: RequestBuilder
) -> tuple[Response, BundleHost]:
    """One request to ``bundle`` (directly or through ``relay``) over TLS
    pinned to the host that answered; the response, read until close.

    Error handling: ``NotaryFailed`` with a short detail; ``RelayFailed``.
    """
    try:
        if relay is None:
            tcp, host = await connect_direct(bundle, resolver)
        else:
            tcp, host = await connect_bounced(bundle, relay, resolver)
    except PeerError as exc:
        raise NotaryFailed(str(exc)) from None
    stream = await pinned_tls(bundle, host, tcp)
    try:
        await stream.send_all(build(host))
        data = bytearray()
        while chunk := await stream.receive_some(64 * 1024):
            data += chunk
            if len(data) > MAX_RESPONSE_BYTES:
                raise NotaryFailed("answer too large", host)
    except (trio.BrokenResourceError, ssl.SSLError, OSError):
        raise NotaryFailed("connection failed", host) from None
    finally:
        await trio.aclose_forcefully(stream)
    try:
        return parse_response(bytes(data)), host
    except PeerError as exc:
        raise NotaryFailed(str(exc), host) from None


async def pinned_tls(
    bundle: Bundle, host: BundleHost, tcp: trio.SocketStream
) -> trio.SSLStream[trio.SocketStream]:
    """TLS over ``tcp`` to ``host``, authenticated by the SHA-1 pin of its
    bundle certificate. Owns ``tcp``: closed on failure.

    Error handling: ``NotaryFailed``.
    """
    # Notaries close without close_notify (as HTTPS servers may); answers are
    # framed by Content-Length and signed, so truncation cannot pass.
    stream = trio.SSLStream(
        tcp, crypto.unverified_client_context(), server_hostname=None, https_compatible=True
    )
    try:
        await stream.do_handshake()
        der = stream.getpeercert(binary_form=True) or b""
        pins = {h.sha1_pin for h in bundle.hosts if h.host == host.host} or {
            h.sha1_pin for h in bundle.hosts
        }
        if convergence.format_fingerprint(hashlib.sha1(der).digest()) not in pins:
            raise NotaryFailed("certificate does not match the bundle's pin", host)
    except (trio.BrokenResourceError, ssl.SSLError, OSError):
        await trio.aclose_forcefully(stream)
        raise NotaryFailed("connection failed", host) from None
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
    return stream


async def connect_direct(
    bundle: Bundle, resolver: Resolver
) -> tuple[trio.SocketStream, BundleHost]:
    destinations = [(wire_host(h), h.ssl_port) for h in bundle.hosts]
    try:
        stream, index = await dial_first(destinations, policy=ANY_ADDRESS, resolver=resolver)
    except ProbeError:
        raise PeerError("could not connect to any of its hosts") from None
    return stream, bundle.hosts[index]


async def connect_bounced(
    bundle: Bundle, relay: Bundle, resolver: Resolver
) -> tuple[trio.SocketStream, BundleHost]:
    """A tunnel through ``relay`` to one of ``bundle``'s hosts.

    Error handling: ``RelayFailed`` when the relay cannot be reached or
    refuses; ``PeerError`` when it could not reach the notary (404).
    """
    try:
        destinations = [(wire_host(h), h.http_port) for h in relay.hosts]
    except NotaryFailed:  # the relay's bundle is broken: another relay may do
        raise RelayFailed from None
    try:
        stream, _index = await dial_first(destinations, policy=ANY_ADDRESS, resolver=resolver)
    except ProbeError:
        raise RelayFailed from None
    try:
        connected = await _open_tunnel(stream, bundle)
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
    return stream, _host_named(bundle, connected)


async def _open_tunnel(stream: trio.SocketStream, bundle: Bundle) -> str:
    """Send the legacy CONNECT for ``bundle``'s hosts; return the host the
    relay says it reached."""
    first, *others = (host_authority(wire_host(host)) for host in bundle.hosts)
    request = f"CONNECT {first}:{RELAY_PORT} HTTP/1.1\r\nHost: {first}\r\n"
    for other in others:
        request += f"X-Convergence-Notary: {other}+{RELAY_PORT}\r\n"
    try:
        await stream.send_all((request + "\r\n").encode("ascii"))
        answer = parse_response(await _read_head(stream))
    except (trio.BrokenResourceError, PeerError):
        raise RelayFailed from None
    if answer.status == 404:
        raise PeerError("the relay could not reach it")
    if answer.status != 200:
        raise RelayFailed
    return (answer.header(DESTINATION_HEADER) or b"").decode("ascii", "replace")


def _host_named(bundle: Bundle, name: str) -> BundleHost:
    """The host of ``bundle`` the relay says it reached (the first if the
    relay did not say, or said something else: the pin check decides)."""
    try:
        wanted = normalise_host(name)
    except NotaryError:
        return bundle.hosts[0]
    for host in bundle.hosts:
        if normalise_host(host.host) == wanted:
            return host
    return bundle.hosts[0]


async def _read_head(stream: trio.SocketStream) -> bytes:
    """Bytes up to and including the relay's blank line; nothing more is
    read, so the TLS bytes that follow stay in the stream."""
    data = bytearray()
    while not data.endswith(b"\r\n\r\n"):
        if len(data) > 16 * 1024:
            raise RelayFailed
        byte = await stream.receive_some(1)
        if not byte:
            raise RelayFailed
        data += byte
    return bytes(data)
