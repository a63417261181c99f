"""The bounce relay's I/O edge: one task per relay connection reads a
``CONNECT`` head, connects to the first destination that answers, and pipes
bytes both ways (PROTOCOLS.md 1.5; the sans-IO rules are in
:mod:`notary.protocol.relay`).

Rules this module keeps:

1. The relay is not an open proxy. In ``bundles`` mode it connects only to
   hosts of the operator's trusted ``.notary`` bundles, in ``public`` mode to
   any host; in both, only to addresses the address policy allows (checked
   after resolution, connected to by IP, as the prober does), and only to
   the configured ``dial_port`` (4242).
2. Bounded: at most ``max_tunnels`` relay connections at once (beyond it,
   503 and close), and, with ``abuse`` set, at most ``[limits]
   max_connections_per_address`` from one client address and
   ``max_connections_per_prefix`` from its prefix (beyond: closed at once,
   refusal reason ``per-client``); the head must arrive within ``head_timeout_s``; the
   destinations are tried in parallel within ``connect_timeout_s``; a tunnel
   idle for ``idle_timeout_s`` or open for ``max_lifetime_s`` is closed; at
   most ``buffer_bytes`` per direction are held in memory.
3. Private: nothing is logged per connection at ``info`` or above, and no
   log line ever carries a client's address (debug lines name destinations
   only).

Resource handling: :class:`RelayHandler` is called with an accepted TCP
stream and owns it from then on; it owns the destination stream it opens;
both are closed on every path before the call returns. Its pipe tasks live
in a nursery of that call.

Error handling: every refusal is answered (403, 404, 400, 408, 431, 503)
and the connection closed after a short lingering drain, so the client
reads the answer instead of a reset; a peer that resets or stalls is
dropped silently. A bad trusted bundle at start is a ``UsageError``; on
reload it is logged and the previous set kept.
"""

from __future__ import annotations

import logging
import math
import types
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import trio

from notary.config import RelayConfig
from notary.errors import PeerError, ProbeError, ProbeRefused, ProtocolError, UsageError
from notary.model.policy import AddressPolicy
from notary.outbound.dialer import Resolver, dial_first
from notary.protocol.bundle import BUNDLE_SUFFIX, BundleError, parse_bundle
from notary.protocol.http import Request, RequestReader, error_response
from notary.protocol.relay import (
    RelayMode,
    RelayRefused,
    bundle_hosts,
    connection_established,
    parse_connect_request,
    refusal,
    relay_page,
)
from notary.server.connection import linger_before_close
from notary.service.abuse import AbuseControls

__all__ = ["RelayHandler", "RelayStatistics", "TrustedDestinations", "read_trusted_bundles"]

logger = logging.getLogger(__name__)

#: Bytes asked of the client per receive while reading the head.
HEAD_RECEIVE_BYTES = 4 * 1024
#: The idle deadline of a tunnel moves at most this often (see ``_tunnel``).
IDLE_GRANULARITY_S = 1.0
#: A request on the relay port has no business carrying a body.
MAX_BODY_BYTES = 1024
#: After a refusal: how many bytes to drain (for at most ``[relay]
#: linger_timeout_s``) before closing (closing with unread bytes would reset
#: the connection and could destroy the answer before the client reads it).
LINGER_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class RelayStatistics:
    """A snapshot of a :class:`RelayHandler`'s counters.

    ``connections``: relay connections open now, in any phase; ``tunnels``:
    established tunnels open now; ``tunnels_opened``: since start;
    ``refused``: refusals by reason (``busy``, ``malformed``, ``timeout``,
    ``forbidden`` (method or port), ``untrusted`` (not in a bundle),
    ``policy``, ``unreachable``, ``off``, ``per-client`` (connections per
    client address or prefix)); bytes relayed each way.
    """

    connections: int
    tunnels: int
    tunnels_opened: int
    refused: Mapping[str, int]
    bytes_to_destinations: int
    bytes_to_clients: int


def read_trusted_bundles(paths: Sequence[Path]) -> tuple[frozenset[str], int]:
    """The hosts of every bundle in ``paths`` (``.notary`` files, or
    directories whose ``*.notary`` files are read), and how many bundles.

    Error handling: ``UsageError`` naming the file for an unreadable path or
    an invalid bundle.
    """
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files += sorted(p for p in path.iterdir() if p.name.endswith(BUNDLE_SUFFIX))
        else:
            files.append(path)
    bundles = []
    for file in files:
        try:
            data = file.read_bytes()
        except OSError as exc:
            raise UsageError(f"cannot read trusted bundle {file}: {exc.strerror}") from None
        try:
            bundles.append(parse_bundle(data))
        except BundleError as exc:
            raise UsageError(f"trusted bundle {file}: {exc}") from None
    return bundle_hosts(bundles), len(bundles)


class TrustedDestinations:
    """The hosts a relay in ``bundles`` mode may connect to, read from the
    operator's bundles at start and again on :meth:`reload` (SIGHUP)."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self._paths = tuple(paths)
        self.hosts, self.bundle_count = read_trusted_bundles(self._paths)

    def reload(self) -> bool:
        """Re-read the bundles; on error, log it and keep the previous hosts.
        Returns whether the new set is in use."""
        try:
            hosts, count = read_trusted_bundles(self._paths)
        except UsageError as exc:
            logger.error("relay: kept the previous trusted bundles: %s", exc)
            return False
        self.hosts, self.bundle_count = hosts, count
        logger.info("relay: %d trusted bundles, %d hosts", count, len(hosts))
        return True

    def __contains__(self, host: object) -> bool:
        return host in self.hosts


class RelayHandler:
    """Serves one relay connection per call; see the module docstring."""

    def __init__(
        self,
        config: RelayConfig,
        *,
        trusted: TrustedDestinations | None,
        resolver: Resolver,
        notary_name: str | None = None,
        abuse: AbuseControls | None = None,
    ) -> None:
        self._config = config
        self._mode = RelayMode(config.destinations)
        if (self._mode is RelayMode.BUNDLES) != (trusted is not None):
            raise ValueError("trusted destinations go with bundles mode, and only with it")
        self._trusted = trusted
        #: Which destination addresses may be connected to; replaced on reload.
        self.policy = AddressPolicy.from_cidrs(config.allow_addresses)
        self._resolver = resolver
        self._notary_name = notary_name
        self._connections = 0
        self._lingering = 0
        self._tunnels = 0
        self._tunnels_opened = 0
        self._refused: Counter[str] = Counter()
        self._bytes_to_destinations = 0
        self._bytes_to_clients = 0
        #: The per-client connection limits (None: none).
        self.abuse = abuse

    @property
    def mode(self) -> RelayMode:
        return self._mode

    @property
    def trusted(self) -> TrustedDestinations | None:
        """The trusted bundles' hosts (``bundles`` mode), else None."""
        return self._trusted

    def statistics(self) -> RelayStatistics:
        return RelayStatistics(
            connections=self._connections,
            tunnels=self._tunnels,
            tunnels_opened=self._tunnels_opened,
            refused=types.MappingProxyType(dict(self._refused)),
            bytes_to_destinations=self._bytes_to_destinations,
            bytes_to_clients=self._bytes_to_clients,
        )

    async def __call__(self, stream: trio.SocketStream) -> None:
        try:
            if self._connections >= self._config.max_tunnels:
                self._refused["busy"] += 1
                # Lingering refusals are bounded too: past the bound, just close.
                if self._lingering < self._config.max_tunnels:
                    self._lingering += 1
                    try:
                        await self._refuse(stream, error_response(503, "relay busy, try later"))
                    finally:
                        self._lingering -= 1
                return
            address = self._client_address(stream)
            abuse = self.abuse
            if (
                address is not None and abuse is not None
                and not abuse.relay_connections.open(address)
            ):
                self._refused["per-client"] += 1
                return
            self._connections += 1
            try:
                await self._serve(stream)
            finally:
                self._connections -= 1
                if address is not None and abuse is not None:
                    abuse.relay_connections.close(address)
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError):
            pass
        finally:
            # aclose() of a socket stream closes at once and never blocks
            # (aclose_forcefully would add a cancelled checkpoint per close).
            await _close(stream)

    def _client_address(self, stream: trio.SocketStream) -> bytes | None:
        """The packed address of the client if per-client limits apply to it."""
        if self.abuse is None:
            return None
        try:
            peer = str(stream.socket.getpeername()[0])
        except (OSError, AttributeError):
            return None
        return self.abuse.client_address(peer)

    async def _serve(self, stream: trio.SocketStream) -> None:
        config = self._config
        try:
            head = await self._read_head(stream)
        except ProtocolError as exc:
            self._refused["timeout" if exc.status == 408 else "malformed"] += 1
            await self._refuse(stream, refusal(exc))
            return
        if head is None:
            return
        request, leftover = head
        if self._mode is RelayMode.OFF:
            self._refused["off"] += 1
            status = 200 if request.method in (b"GET", b"HEAD") else 403
            await self._refuse(stream, self._page(request, status))
            return
        try:
            connect = parse_connect_request(request, max_destinations=config.max_destinations)
        except RelayRefused:
            self._refused["forbidden"] += 1
            await self._refuse(stream, self._page(request, 403))
            return
        except ProtocolError as exc:
            self._refused["malformed"] += 1
            await self._refuse(stream, refusal(exc))
            return
        try:
            trusted = self._trusted
            if trusted is not None and not all(h in trusted for h in connect.destinations):
                self._refused["untrusted"] += 1
                raise RelayRefused("destination is not a notary this relay trusts")
            destination, host = await self._dial_first(connect.destinations)
        except PeerError as exc:
            await self._refuse(stream, refusal(exc))
            return
        try:
            with trio.fail_after(config.head_timeout_s):
                await stream.send_all(connection_established(host))
            logger.debug("relay: tunnel to %s open", host)
            self._tunnels += 1
            self._tunnels_opened += 1
            try:
                await self._tunnel(stream, destination, leftover)
            finally:
                self._tunnels -= 1
        finally:
            await _close(destination)

    async def _read_head(self, stream: trio.SocketStream) -> tuple[Request, bytes] | None:
        """The first request and the bytes after its head; None when the
        client closed first. ``ProtocolError`` (408 on timeout) otherwise."""
        config = self._config
        reader = RequestReader(
            max_header_bytes=config.max_header_bytes,
            max_headers=config.max_headers,
            max_body_bytes=MAX_BODY_BYTES,
        )
        with trio.move_on_after(config.head_timeout_s):
            while True:
                data = await stream.receive_some(HEAD_RECEIVE_BYTES)
                if not data:
                    return None
                requests = reader.feed(data)
                if requests:
                    return requests[0], reader.leftover
        raise ProtocolError("request timeout", status=408)

    async def _dial_first(self, hosts: Sequence[str]) -> tuple[trio.SocketStream, str]:
        """Connect to ``hosts`` in parallel, the first to connect wins.

        Error handling: ``RelayRefused`` (403) when the policy refused every
        host; ``PeerError`` 404 when none connected in time.
        """
        port = self._config.dial_port
        with trio.move_on_after(self._config.connect_timeout_s):
            try:
                stream, index = await dial_first(
                    [(host, port) for host in hosts], policy=self.policy, resolver=self._resolver
                )
            except ProbeRefused:
                self._refused["policy"] += 1
                raise RelayRefused("destination refused by policy") from None
            except ProbeError:
                pass
            else:
                return stream, hosts[index]
        self._refused["unreachable"] += 1
        raise PeerError("unable to connect to the notary", status=404)

    async def _tunnel(
        self, client: trio.SocketStream, destination: trio.SocketStream, leftover: bytes
    ) -> None:
        """Pipe both ways until both sides finished sending (each end of
        file is passed on as a half-close), a side breaks, or a deadline
        (idle, lifetime) passes."""
        config = self._config
        end = trio.current_time() + config.max_lifetime_s

        with trio.CancelScope() as scope:
            moved_at = -math.inf

            def touch() -> None:
                # Moving a deadline is a heap operation: do it at most once per
                # IDLE_GRANULARITY_S, so the idle limit holds to within that.
                nonlocal moved_at
                now = trio.current_time()
                if now - moved_at >= IDLE_GRANULARITY_S:
                    moved_at = now
                    scope.deadline = min(end, now + config.idle_timeout_s)

            touch()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._pipe, client, destination, leftover, touch, scope, True)
                nursery.start_soon(self._pipe, destination, client, b"", touch, scope, False)
        if scope.cancelled_caught:
            logger.debug("relay: tunnel closed by a deadline")

    async def _pipe(
        self,
        source: trio.SocketStream,
        sink: trio.SocketStream,
        first: bytes,
        touch: Callable[[], None],
        scope: trio.CancelScope,
        upstream: bool,
    ) -> None:
        try:
            data = first
            while True:
                if data:
                    await sink.send_all(data)
                    touch()
                    if upstream:
                        self._bytes_to_destinations += len(data)
                    else:
                        self._bytes_to_clients += len(data)
                data = await source.receive_some(self._config.buffer_bytes)
                if not data:
                    break
                touch()
            await sink.send_eof()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            scope.cancel()  # one side is gone: end the whole tunnel

    async def _refuse(self, stream: trio.SocketStream, answer: bytes) -> None:
        """Send ``answer``, then linger (half-close, drain) before the caller
        closes (see ``LINGER_BYTES``)."""
        with trio.move_on_after(self._config.head_timeout_s):
            await stream.send_all(answer)
        timeout_s = self._config.linger_timeout_s
        await linger_before_close(
            stream, timeout_s=timeout_s, idle_s=timeout_s, max_bytes=LINGER_BYTES
        )

    def _page(self, request: Request, status: int) -> bytes:
        page = relay_page(mode=self._mode, notary_name=self._notary_name, status=status)
        if request.method == b"HEAD":
            return page[: page.index(b"\r\n\r\n") + 4]
        return page


async def _close(stream: trio.abc.AsyncResource) -> None:
    """Close ``stream`` even when the caller is being cancelled."""
    with trio.CancelScope(shield=True):
        await stream.aclose()
