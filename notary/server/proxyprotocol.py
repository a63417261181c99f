"""The PROXY protocol at the plain API listeners' socket edge (``[server]
proxy_protocol_from``, docs/edge.md): who must send a header, reading it
off the socket, and refusing it from anyone else.

A listener with the option set makes one of two streams per accepted
socket (``edge_stream``), by the TCP peer's address:

* from a trusted edge (an address of ``proxy_protocol_from``): an
  ``EdgeStream``, a plain ``SocketStream`` whose HTTP loop starts only once
  ``read_proxy_header`` has taken the header off the socket, and not a byte
  more: it peeks (``MSG_PEEK``) and consumes exactly the header's bytes, so
  the HTTP loop reads the client's bytes from the socket as on any plain
  connection, with no wrapper on its hot path. The header's source address
  is the client's from then on (limits, prefixes, connections per address);
  a header naming none (``LOCAL``, ``UNSPEC``, ``UNKNOWN``) leaves the edge's;
* from anywhere else: a ``HeaderRefusingStream``, whose first receive reads
  until the first bytes tell whether they begin a PROXY header (at most 12
  bytes are ever held back) and refuses the connection if they do; the HTTP
  loop's head timeout bounds that first receive. Later receives are the
  plain stream's.

Listeners without the option never see this module.

Every refusal closes the connection without an answer (the spec: "abort the
connection"; an HTTP error would tell a scanner what it found), is counted
in ``ConnectionCounts.proxy_refused`` (``notary_http_proxy_refused_connections``)
and logged at debug level: an edge's with its address and the reason (a
misconfigured edge shows there), a client's without its address (no log
line carries a client's).

Resource handling: the streams own their sockets as ``SocketStream`` does;
``read_proxy_header`` closes nothing (its caller closes the stream).
Error handling: ``read_proxy_header`` raises ``ProxyHeaderError`` (a bad or
missing header, the end of the connection before its end) or
``trio.BrokenResourceError`` (a reset); a ``HeaderRefusingStream`` raises
``trio.BrokenResourceError`` from ``receive_some`` for a header, which the
HTTP loop takes as a peer gone.
"""

from __future__ import annotations

import logging
import socket

import trio
from trio.lowlevel import checkpoint_if_cancelled, wait_readable

from notary.model.ratelimit import Exemptions, packed_address
from notary.protocol.proxyheader import (
    MAX_HEADER_BYTES,
    ProxyHeader,
    ProxyHeaderError,
    parse_proxy_header,
    starts_with_proxy_header,
)
from notary.server.accept import ConnectionCounts
from notary.server.sockstream import DEFAULT_RECEIVE_BYTES, SocketStream

__all__ = [
    "EdgeStream",
    "HeaderRefusingStream",
    "TrustedEdges",
    "edge_stream",
    "read_proxy_header",
    "refused",
]

log = logging.getLogger(__name__)


class TrustedEdges:
    """The networks of ``[server] proxy_protocol_from``: who may (and then
    must) send a PROXY header. Error handling: ``ConfigError`` for a bad
    CIDR (validated with the config already)."""

    __slots__ = ("_networks",)

    def __init__(self, cidrs: tuple[str, ...]) -> None:
        self._networks = Exemptions.from_cidrs(cidrs)

    def __contains__(self, peer: str) -> bool:
        """Whether the TCP peer at ``peer`` (``getpeername()[0]``; an
        IPv4-mapped IPv6 address counts as its IPv4 address) is an edge."""
        packed = packed_address(peer)
        return packed is not None and packed in self._networks


class EdgeStream(SocketStream):
    """A connection from a trusted edge: ``peer`` its TCP peer's address;
    its first bytes are a PROXY header for ``read_proxy_header``."""

    def __init__(self, sock: socket.socket, peer: str) -> None:
        super().__init__(sock)
        self.peer = peer


class HeaderRefusingStream(EdgeStream):
    """A connection from an address not allowed to send a PROXY header:
    refused (``trio.BrokenResourceError`` from the first receive, counted in
    ``counts``) if its first bytes begin one."""

    def __init__(self, sock: socket.socket, peer: str, counts: ConnectionCounts) -> None:
        super().__init__(sock, peer)
        self._counts = counts
        self._sniffed = False

    @property
    def parkable(self) -> bool:
        """Only once its first bytes were judged (parked, they would not be)."""
        return self._sniffed

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._sniffed:
            return await SocketStream.receive_some(self, max_bytes)
        size = max_bytes or DEFAULT_RECEIVE_BYTES
        data = b""
        while True:
            chunk = await SocketStream.receive_some(self, size - len(data))
            if not chunk:  # the end: what came is for the HTTP loop to judge
                self._sniffed = True
                return data
            data += chunk
            verdict = starts_with_proxy_header(data)
            if verdict is None:
                continue
            if verdict:
                refused(self._counts, None, "not-allowed")
                raise trio.BrokenResourceError("a PROXY header from an address not allowed")
            self._sniffed = True
            return data


def edge_stream(
    sock: socket.socket, edges: TrustedEdges, counts: ConnectionCounts
) -> EdgeStream:
    """The stream of a socket accepted by a listener with ``[server]
    proxy_protocol_from``: an ``EdgeStream`` from a trusted edge, else a
    ``HeaderRefusingStream``. Error handling: ``OSError`` when the peer has
    gone already (the accept loop closes the socket)."""
    peer = str(sock.getpeername()[0])
    if peer in edges:
        return EdgeStream(sock, peer)
    return HeaderRefusingStream(sock, peer, counts)


async def read_proxy_header(sock: socket.socket) -> ProxyHeader:
    """Take the PROXY header off ``sock`` (non-blocking), leaving the bytes
    after it unread; waits as long as the header is incomplete (the caller
    bounds the wait). Error handling: see the module docstring."""
    await checkpoint_if_cancelled()
    seen = b""
    while True:
        try:
            data = sock.recv(MAX_HEADER_BYTES - len(seen), socket.MSG_PEEK)
        except BlockingIOError:
            await wait_readable(sock)
            continue
        except OSError as exc:
            raise trio.BrokenResourceError(exc) from exc
        if not data:
            raise ProxyHeaderError("closed", "the connection ended inside its PROXY header")
        header = parse_proxy_header(seen + data)
        # Consume what is the header's: all of it once it is whole; else
        # every byte so far (a header's, or a refusal's next time), so
        # that the next wait is for new bytes, not for those peeked.
        wanted = (header.length if header is not None else len(seen) + len(data)) - len(seen)
        try:
            while wanted:
                taken = sock.recv(wanted)
                if not taken:
                    raise ProxyHeaderError("closed", "the connection ended inside its PROXY header")
                seen += taken
                wanted -= len(taken)
        except OSError as exc:  # peeked bytes are there: only a reset gets here
            raise trio.BrokenResourceError(exc) from exc
        if header is not None:
            return header
        await wait_readable(sock)


def refused(counts: ConnectionCounts, edge: str | None, reason: str) -> None:
    """Count and log (debug) a connection closed for its PROXY header: from
    the ``edge`` at that address, or (None) from a client, whose address no
    log line carries (docs/security.md, "What is logged")."""
    counts.proxy_refused += 1
    if edge is None:
        log.debug("PROXY protocol: closed a connection from an address not in "
                  "[server] proxy_protocol_from that began with a PROXY header")
    else:
        log.debug("PROXY protocol: closed a connection from the edge %s (%s)", edge, reason)
