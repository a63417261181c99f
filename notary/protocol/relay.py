"""The Convergence bounce relay, sans-IO (PROTOCOLS.md 1.5): what a
``CONNECT`` request asks for, and the bytes the relay answers with.

A client hides its address from the notary it asks by tunnelling through
another notary's relay port::

    CONNECT <hostA>:4242 HTTP/1.1
    Host: <hostA>
    X-Convergence-Notary: <hostB>+4242     (zero or more)

Rules this module keeps:

1. Only ``CONNECT`` is relayed, and only to port :data:`RELAY_PORT` (4242);
   anything else is a :class:`RelayRefused` (403).
2. Every destination is a normalised host (:func:`~notary.model.targets.normalise_host`)
   and a public DNS name or an IP literal
   (:func:`~notary.model.targets.check_public_name`: no ``localhost``,
   ``.local``, ``.onion``, single label, ...), in every relay mode: a
   malformed or non-public one is a :class:`~notary.errors.ProtocolError`
   (400), as are more destinations than the caller's bound.
3. Destinations keep the client's order (the request-target first, then the
   headers in order), without duplicates.

Which destinations may be connected to (bundles, address policy) is decided
by the server (``notary.server.relay``), not here.
"""

from __future__ import annotations

import enum
import html
from collections.abc import Iterable
from dataclasses import dataclass

from notary.errors import BadTarget, PeerError, ProtocolError
from notary.model.targets import check_public_name, normalise_host, parse_port
from notary.protocol.bundle import Bundle
from notary.protocol.http import SERVER_NAME, Request, error_response, response

__all__ = [
    "DESTINATION_HEADER",
    "RELAY_PORT",
    "ConnectRequest",
    "RelayMode",
    "RelayRefused",
    "bundle_hosts",
    "connection_established",
    "parse_connect_request",
    "refusal",
    "relay_page",
]

#: The only port a relay connects to: the notaries' "relay API" port.
RELAY_PORT = 4242
#: Further hosts of the same target notary, ``host+4242`` each.
DESTINATION_HEADER = b"x-convergence-notary"
#: The status line's reason when no destination connects (the original's).
UNREACHABLE_REASON = "Unable to connect"


class RelayMode(enum.StrEnum):
    """Which destinations the relay connects to (config ``[relay] destinations``)."""

    #: Only hosts listed in the operator's trusted ``.notary`` bundles.
    BUNDLES = "bundles"
    #: Any host whose resolved addresses the address policy allows.
    PUBLIC = "public"
    #: No relaying: the port serves a page saying what this notary is.
    OFF = "off"


class RelayRefused(PeerError):
    """The relay will not serve this request (not CONNECT, wrong port,
    destination not allowed): 403 and close."""

    status = 403


@dataclass(frozen=True, slots=True)
class ConnectRequest:
    """A valid relay request: the hosts to try, in the client's order."""

    destinations: tuple[str, ...]


def parse_connect_request(request: Request, *, max_destinations: int) -> ConnectRequest:
    """The destinations a ``CONNECT`` request names (rules 1-3).

    Error handling: :class:`RelayRefused` (403) for another method or a port
    other than 4242; ``ProtocolError`` (400) for a malformed destination or
    more than ``max_destinations`` of them.
    """
    if request.method != b"CONNECT":
        raise RelayRefused("only CONNECT to port 4242 is relayed")
    texts = [request.target]
    for name, value in request.headers:
        if name.lower() == DESTINATION_HEADER:
            texts.extend(part.strip() for part in value.split(b",") if part.strip())
    destinations: list[str] = []
    for text in texts:
        host = _parse_destination(text)
        if host not in destinations:
            destinations.append(host)
        if len(destinations) > max_destinations:
            raise ProtocolError(f"more than {max_destinations} destinations")
    return ConnectRequest(tuple(destinations))


def _parse_destination(raw: bytes) -> str:
    """``host:4242``, ``[v6]:4242``, ``host+4242`` or a bare host (the port
    is then 4242, as the original relay assumed)."""
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise ProtocolError("destination must be ASCII") from None
    port: str | None
    if "+" in text:
        host, _, port = text.rpartition("+")
    elif text.startswith("["):
        host, bracket, port = text.rpartition("]:")
        if bracket:
            host += "]"
        else:
            host, port = text, None
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    else:  # a bare name, or a bare IPv6 literal
        host, port = text, None
    try:
        if port is not None and parse_port(port) != RELAY_PORT:
            raise RelayRefused("only CONNECT to port 4242 is relayed")
        if not host:
            raise BadTarget("missing host")
        normal = normalise_host(host)
        check_public_name(normal)
        return normal
    except BadTarget as exc:
        raise ProtocolError(f"bad destination: {exc.message}") from None


def bundle_hosts(bundles: Iterable[Bundle]) -> frozenset[str]:
    """The normalised hosts of ``bundles``: the destinations a relay in
    ``bundles`` mode may connect to."""
    return frozenset(normalise_host(host.host) for bundle in bundles for host in bundle.hosts)


def connection_established(host: str) -> bytes:
    """The relay's answer once ``host`` (the destination that connected)
    accepted the tunnel; the original's bytes with our agent name."""
    return (
        b"HTTP/1.0 200 Connection Established\r\nProxy-Agent: "
        + SERVER_NAME
        + b"\r\nX-Convergence-Notary: "
        + host.encode("ascii")
        + b"\r\n\r\n"
    )


def refusal(error: PeerError) -> bytes:
    """The answer to a request the relay will not serve; always closes.
    404 carries the original's reason phrase, ``Unable to connect``."""
    reason = UNREACHABLE_REASON if error.status == 404 else None
    return error_response(error.status, error.message, reason=reason)


def relay_page(*, mode: RelayMode, notary_name: str | None, status: int = 200) -> bytes:
    """A short HTML page for browsers that visit the relay port: what this
    notary is and whether it relays."""
    name = html.escape(notary_name) if notary_name else "A certificate notary"
    if mode is RelayMode.OFF:
        relays = "This notary does not relay connections."
    else:
        relays = (
            "This port relays Convergence clients to other notaries "
            f"(CONNECT to port {RELAY_PORT}) so that they need not reveal "
            "their address to the notary they ask."
        )
    body = (
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>"
        f"{name}</title></head>\n<body><h1>{name}</h1>\n"
        "<p>This host runs a certificate notary: ask it which certificate a site "
        "serves, from where it stands (Convergence protocol, HTTPS ports 443 and "
        f"{RELAY_PORT}).</p>\n<p>{html.escape(relays)}</p>\n</body></html>\n"
    ).encode()
    return response(status, body, content_type=b"text/html; charset=utf-8")
