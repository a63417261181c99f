"""Assembly of a notary process: keys, TLS, cache, storage, prober, query
service and listeners, all owned by one nursery.

Resource handling: ``serve_notary`` owns everything it opens (the storage and
its writer, the prober and its probe tasks, the listeners and a task per
connection) and releases them when it is cancelled.

Error handling: configuration problems (unreadable key, mismatching
certificate, busy port) raise ``UsageError``/``StoreError`` before
``task_status.started`` is called, so a caller learns of them at start.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import signal
import socket
import ssl
import threading
import time
import warnings
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio

from notary import __version__
from notary.config import Config, Endpoint, HttpConfig
from notary.errors import NotaryError, UsageError
from notary.model.policy import AddressPolicy
from notary.model.ratelimit import client_prefix
from notary.model.targets import Target
from notary.outbound.cosigned import (
    AwaitingWitnesses,
    CosignedCheckpoints,
    WitnessingStatistics,
)
from notary.outbound.dialer import Resolver, system_resolver
from notary.outbound.logappender import LogAppender
from notary.outbound.probe import Prober, open_prober
from notary.outbound.tlsa import resolver_through
from notary.outbound.witnessing import LogWitnesses
from notary.outbound.writer import Storage, open_storage
from notary.protocol import perspectives, v2
from notary.protocol.bundle import parse_bundle
from notary.protocol.hotpath import IMPLEMENTATION as HOTPATH_IMPLEMENTATION
from notary.protocol.proxyheader import ProxyHeaderError
from notary.server.accept import ConnectionCounts, StreamMaker, serve_socket, trio_stream
from notary.server.admin import AdminServer
from notary.server.api import ApiHandler, PerspectivesHandler
from notary.server.connection import Watchdog, serve_http_connection
from notary.server.logapi import LogPages
from notary.server.metrics import NotaryMetrics, Signer, Timings
from notary.server.parking import Parking
from notary.server.proxyprotocol import (
    EdgeStream,
    HeaderRefusingStream,
    TrustedEdges,
    edge_stream,
    read_proxy_header,
    refused,
)
from notary.server.relay import RelayHandler, TrustedDestinations
from notary.server.sockets import Sockets, bind_sockets, close_all
from notary.server.sockstream import SocketStream
from notary.server.tickets import TicketKeysUnavailable, install_ticket_keys
from notary.server.tlsstream import ServerContext, TlsStream
from notary.server.web import NotaryProfile, WebPages, notary_profile
from notary.server.websocket import (
    FIGURES_INTERVAL_S,
    WATCH_PATH,
    WebSocketCounts,
    WebSocketService,
)
from notary.server.witness import Witness
from notary.service.abuse import AbuseControls
from notary.service.claims import NodeProber
from notary.service.dane import DaneChecker, ResolverValidation
from notary.service.feed import follow_changes
from notary.service.figures import MIN_SAMPLE_INTERVAL_S, LiveFigures
from notary.service.query import QueryService
from notary.service.records import (
    BACKGROUND_REFRESHES_PER_PROBE_SLOT,
    Records,
    RecordSigner,
)
from notary.service.scheduler import RescanScheduler
from notary.service.stored_targets import StoredTargets
from notary.service.watch import WatchHub
from notary.state import crypto
from notary.state.cache import IMPLEMENTATION as CACHE_IMPLEMENTATION
from notary.state.cache import LRUCache

log = logging.getLogger(__name__)

#: How often a graceful stop checks whether every connection has finished.
DRAIN_POLL_S = 0.05
#: The notary's own TLS: AEAD ciphers with forward secrecy (TLS 1.2; TLS 1.3
#: has only such suites, OpenSSL's defaults).
MODERN_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"
#: ``[server] legacy_tls``: those first, then the CBC suites of 2011 clients
#: (TLS 1.0 needs security level 0 in OpenSSL 3); never RC4, 3DES, MD5,
#: export or anonymous suites.
LEGACY_CIPHERS = (
    "ECDHE+AESGCM:ECDHE+CHACHA20:ECDHE+AES:RSA+AESGCM:RSA+AES"
    ":!aNULL:!eNULL:!EXPORT:!RC4:!3DES:!MD5:!DSS:@SECLEVEL=0"
)


@dataclass(frozen=True, slots=True)
class RunningNotary:
    """What ``serve_notary`` hands to ``task_status.started``."""

    api: tuple[Endpoint, ...]  # the bound addresses (real ports when 0 was asked)
    plain_api: tuple[Endpoint, ...]  # plain-HTTP API listeners (usually none)
    perspectives: tuple[Endpoint, ...]  # Perspectives listeners (none when not served)
    relay: tuple[Endpoint, ...]  # the relay's bound addresses (empty: no relay)
    relay_handler: RelayHandler
    service: QueryService
    records: Records
    stored: StoredTargets  # the filter of stored targets
    storage: Storage
    prober: Prober
    scheduler: RescanScheduler | None  # None when rescanning is off
    cache: LRUCache
    #: Stop serving: close the listeners, end probes and connections, then
    #: let the writer commit everything queued and return.
    stop: Callable[[], None]
    #: Stop accepting, close idle connections, let the others finish their
    #: request (tunnels: their traffic) for up to ``timeout_s``, then ``stop``.
    stop_gracefully: Callable[[float], Awaitable[None]]
    admin: tuple[Endpoint, ...] = ()  # the admin listeners (/metrics, /healthz, /readyz)
    metrics: NotaryMetrics | None = None
    abuse: AbuseControls | None = None  # the per-client and per-target limits
    #: The notary's signers by protocol ("convergence", "perspectives", "v2").
    signers: Mapping[str, Signer] = field(default_factory=dict)
    log: LogAppender | None = None  # the transparency log (None: none kept)
    log_pages: LogPages | None = None  # its pages under /v2/log/ (None: none)
    log_witnesses: LogWitnesses | None = None  # who cosigns the log (None: nobody)
    cosigned: CosignedCheckpoints | None = None  # what they cosigned (None: nobody)
    witness: Witness | None = None  # the witness endpoint (None: not a witness)


def make_server_ssl_context(config: Config) -> ssl.SSLContext:
    """The notary's certificate (the one its bundle pins) over TLS 1.2+ with
    ``MODERN_CIPHERS``, no renegotiation, no compression; with ``[server]
    legacy_tls``, TLS 1.0+ and ``LEGACY_CIPHERS`` (for the 2011 add-on)."""
    key = crypto.load_private_key(config.server.key_file)
    cert = crypto.load_certificate(config.server.cert_file)
    crypto.check_key_matches_certificate(key, cert)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    if config.server.legacy_tls:
        with warnings.catch_warnings():  # TLSv1 is deprecated: that is the point
            warnings.simplefilter("ignore", DeprecationWarning)
            context.minimum_version = ssl.TLSVersion.TLSv1
        context.set_ciphers(LEGACY_CIPHERS)
    else:
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_ciphers(MODERN_CIPHERS)
    context.options |= (
        ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION | ssl.OP_CIPHER_SERVER_PREFERENCE
    )
    context.load_cert_chain(config.server.cert_file, config.server.key_file)
    context.set_alpn_protocols(["http/1.1"])
    return context


#: Allocations between two collections of the youngest generation (Python:
#: 700). Under load a worker holds thousands of live objects (coroutine
#: frames, cancel scopes, buffers of the connections in flight) that every
#: young collection walks again; the garbage they make dies by reference
#: counting, not by the collector.
GC_YOUNG_THRESHOLD = 20_000


def share_ticket_keys(context: ssl.SSLContext, keys: bytes) -> None:
    """Issue and accept ``context``'s TLS session tickets with ``keys``, the
    node's: a client resumes with whichever worker its reconnection reaches.
    Where this Python cannot (``TicketKeysUnavailable``), a warning and the
    worker's own keys."""
    try:
        install_ticket_keys(context, keys)
    except TicketKeysUnavailable as exc:
        log.warning("TLS session tickets not shared with the node's other workers (%s): a "
                    "reconnection that reaches another worker makes a full handshake", exc)
        return
    log.debug("TLS session tickets: the node's keys")


def bound_endpoint(listening: socket.socket) -> Endpoint:
    host, port = listening.getsockname()[:2]
    return Endpoint(host, port)


class ConnectionHandler:
    """Accepted TCP stream -> TLS handshake under a deadline (unless
    ``context`` is None: the plain-HTTP listener) -> HTTP loop. Drops
    connections beyond ``max_connections`` (shared by every listener using
    this handler) at once, and, with ``abuse``, those beyond a client's
    connections per address or prefix (shared by every handler given the
    same ``abuse``); the client's prefix is bound to the handler's calls
    for the query limits (``notary.service.abuse``)."""

    def __init__(
        self,
        context: ssl.SSLContext | None,
        handler: ApiHandler | PerspectivesHandler,
        http: HttpConfig,
        *,
        counts: ConnectionCounts,
        watchdog: Watchdog,
        websocket: WebSocketService | None = None,
        abuse: AbuseControls | None = None,
        parking: Parking | None = None,
    ) -> None:
        #: The TLS driver's side of ``context`` (None: plain HTTP).
        self._tls = ServerContext(context) if context is not None else None
        self._handler = handler
        self._abuse = abuse
        self._max_connections = http.max_connections
        self._limits = http
        self._websocket = websocket
        self._answer_at_once = handler.answer_at_once
        #: The timeouts and the graceful stop of the notary's connections.
        self.watchdog = watchdog
        #: Where its connections wait between requests (None: each in its
        #: own task, ``notary.server.parking``).
        self._parking = parking
        #: Its listeners' connections, open and refused (the metrics read them).
        self.counts = counts

    def make_stream(self, sock: socket.socket) -> SocketStream | TlsStream:
        """The stream an accepted socket is served on: TLS straight on the
        socket (its handshake is made by ``__call__``, under its deadline),
        or the plain socket stream."""
        if self._tls is None:
            return SocketStream(sock)
        return TlsStream(sock, self._tls)

    async def __call__(self, stream: SocketStream | TlsStream, peer: str | None = None) -> None:
        """Serve ``stream``, its client at ``peer`` (None: its TCP peer's)."""
        counts = self.counts
        if counts.open_connections >= self._max_connections:
            counts.refused_connections += 1
            await trio.aclose_forcefully(stream)
            return
        abuse = self._abuse
        if peer is None:
            peer = "?"
            if abuse is not None or self._websocket is not None:
                with contextlib.suppress(OSError):
                    peer = str(stream.socket.getpeername()[0])
        address = abuse.client_address(peer) if abuse is not None else None
        if address is not None and abuse is not None and not abuse.connections.open(address):
            counts.refused_connections += 1
            await trio.aclose_forcefully(stream)
            return
        counts.open_connections += 1
        try:
            await self._serve(stream, peer, address)
        finally:
            counts.open_connections -= 1
            if address is not None and abuse is not None:
                abuse.connections.close(address)

    async def _serve(
        self, stream: SocketStream | TlsStream, peer: str, address: bytes | None
    ) -> None:
        # A limited client's prefix goes with each of its requests (None:
        # unlimited, the handlers are called with the request alone).
        client = client_prefix(address) if address is not None else None
        handler, answer_at_once, limits = self._handler, self._answer_at_once, self._limits
        watchdog = self.watchdog
        upgrades = None
        if self._websocket is not None:
            upgrades = {WATCH_PATH: partial(self._websocket.serve, peer=peer, client=client)}
        await serve_http_connection(
            stream, handler, limits, upgrades, answer_at_once, watchdog, client,
            tls_counts=self.counts if isinstance(stream, TlsStream) else None,
            parking=self._parking,
        )


class EdgeConnectionHandler(ConnectionHandler):
    """The plain API listeners' handler with ``[server] proxy_protocol_from``
    (``notary.server.proxyprotocol``, docs/edge.md): a connection from an
    edge is counted as open while its PROXY header is read, for at most
    ``[http] header_timeout_s``, then served as its client's (the header's
    source); one from elsewhere as its own peer's, refused if it begins
    with a header. The other listeners use ``ConnectionHandler``, untouched."""

    def __init__(
        self, handler: ApiHandler, http: HttpConfig, *, edges: TrustedEdges,
        counts: ConnectionCounts, watchdog: Watchdog, abuse: AbuseControls | None = None,
        parking: Parking | None = None,
    ) -> None:
        super().__init__(
            None, handler, http, counts=counts, watchdog=watchdog, abuse=abuse, parking=parking
        )
        self._edges = edges

    def make_stream(self, sock: socket.socket) -> EdgeStream:
        return edge_stream(sock, self._edges, self.counts)

    async def __call__(  # type: ignore[override]
        self, stream: EdgeStream, peer: str | None = None
    ) -> None:
        if isinstance(stream, HeaderRefusingStream):
            await super().__call__(stream, stream.peer)
            return
        counts = self.counts
        if counts.open_connections >= self._max_connections:
            counts.refused_connections += 1
            await trio.aclose_forcefully(stream)
            return
        client = None
        counts.open_connections += 1
        try:
            with trio.move_on_after(self._limits.header_timeout_s):
                header = await read_proxy_header(stream.socket)
                client = header.source or stream.peer
            if client is None:
                refused(counts, stream.peer, "timeout")
        except ProxyHeaderError as exc:
            refused(counts, stream.peer, exc.reason)
        except trio.BrokenResourceError:
            refused(counts, stream.peer, "reset")
        finally:
            counts.open_connections -= 1
        if client is None:
            stream.close()
            return
        await super().__call__(stream, client)


def perspectives_index(config: Config) -> bytes:
    """The Perspectives index page: version, public key, published settings."""
    assert config.perspectives.key_file is not None
    key = crypto.load_private_key(config.perspectives.key_file)
    return perspectives.index_page(
        version=__version__,
        public_key_pem=crypto.public_key_pem(key),
        settings={
            "merge window (s)": str(config.store.merge_window_s),
            "probe timeout (s)": f"{config.probe.timeout_s:g}",
        },
    )


def index_text(config: Config) -> str:
    return (
        f"notary {__version__}: a certificate notary (Convergence protocol v1).\n"
        "Ask it which certificate a site serves:\n"
        "  GET  /target/<host>+<port>\n"
        "  POST /target/<host>+<port>   body: fingerprint=<SHA-1 AA:BB:...>\n"
    )


def make_v2_key_document(config: Config, signer: crypto.Ed25519Signer) -> bytes:
    """``/v2/key``: the key, valid from its file's date for ``key_valid_for_s``."""
    assert config.v2.key_file is not None
    try:
        born = int(config.v2.key_file.stat().st_mtime)
    except OSError as exc:
        raise UsageError(f"cannot read key {config.v2.key_file}: {exc.strerror}") from None
    key = v2.publish_key(
        signer.public_raw, not_before=born, not_after=born + config.v2.key_valid_for_s
    )
    return v2.key_document([key])


def make_scheduler(
    config: Config, prober: Prober,
    observed_age: Callable[[Target], Awaitable[float | None]] | None = None,
) -> RescanScheduler | None:
    """The rescan scheduler (None when ``[rescan]`` is off). On-demand probes
    come first: it holds back while queries' probes queue for ``prober``.
    ``observed_age``: for a store other workers probe into (its rule 11)."""
    rescan = config.rescan
    if not rescan.enabled:
        return None
    return RescanScheduler(
        rescan,
        probe_timeout_s=config.probe.scheduled_timeout_s,
        on_demand_busy=lambda: prober.statistics().queued > 0,
        observed_age=observed_age,
    )


def dns_resolvers(config: Config) -> list[tuple[str, int]]:
    """``[dns] resolvers`` as (address, port) pairs."""
    return [(endpoint.host, endpoint.port) for endpoint in config.dns.resolvers]


def make_dane_checker(config: Config, clock: Callable[[], float]) -> DaneChecker | None:
    """The DANE backend (None: DANE is not among ``[verify] backends``)."""
    if not config.verify.dane:
        return None
    return DaneChecker(
        dns_resolvers(config), timeout_s=config.dns.timeout_s,
        max_reuse_s=config.verify.dane_reuse_max_s, min_reuse_s=config.verify.dane_reuse_min_s,
        failure_reuse_s=config.verify.dane_failure_reuse_s, clock=clock,
    )


def make_resolver_validation(config: Config) -> ResolverValidation | None:
    """The check that ``[dns] resolvers`` validate DNSSEC (None: DANE is
    not among ``[verify] backends``)."""
    if not config.verify.dane:
        return None
    dns = config.dns
    return ResolverValidation(
        dns_resolvers(config), name=dns.validation_check_name, timeout_s=dns.timeout_s,
        recheck_s=dns.validation_recheck_s, required=dns.require_validation,
    )


async def check_resolvers_at_start(config: Config) -> None:
    """``notary serve``'s start-up check of ``[dns] resolvers`` (DANE on):
    ``UsageError`` when one does not validate DNSSEC and ``[dns]
    require_validation`` holds; a silent one is a warning in the log."""
    validation = make_resolver_validation(config)
    if validation is not None:
        await validation.check_at_start()


def make_node_prober(
    config: Config, storage: Storage, prober: Prober, clock: Callable[[], float]
) -> NodeProber:
    """Probes once per node for a worker sharing the store. A claim lasts as
    long as a probe and its write (a probe that waited in the prober's queue
    may outlive it: another worker then probes too); after the probe it
    stands as long as the write and two reads of the feed take. A worker
    that dies holding a claim delays the others that long at most."""
    feed_interval_s = config.store.feed_interval_ms / 1000
    write_s = config.store.batch_interval_ms / 1000
    return NodeProber(
        storage, prober, clock=clock, poll_interval_s=feed_interval_s,
        ttl_s=config.probe.timeout_s + write_s + 1.0,
        linger_s=write_s + 2 * feed_interval_s + 0.25,
    )


def store_observed_age(
    storage: Storage, clock: Callable[[], float]
) -> Callable[[Target], Awaitable[float | None]]:
    """Seconds since ``storage``'s newest observation of a target (None: none),
    by ``clock`` (Unix time, as the store's times). A store error propagates
    (the scheduler then probes)."""

    async def observed_age(target: Target) -> float | None:
        newest = (await storage.load_timeline(target)).newest
        return None if newest is None else clock() - newest.last_seen

    return observed_age


def make_relay_handler(
    config: Config, *, resolver: Resolver, notary_name: str | None,
    abuse: AbuseControls | None = None,
) -> RelayHandler:
    """The relay, with its trusted bundles read (``UsageError`` if one is bad)."""
    relay = config.relay
    trusted = None
    if relay.destinations == "bundles":
        trusted = TrustedDestinations(relay.bundles)
        if relay.listen and not trusted.hosts:
            log.warning(
                "relay: no trusted bundle lists a host ([relay] bundles), "
                "so every CONNECT is refused"
            )
    return RelayHandler(
        relay, trusted=trusted, resolver=resolver, notary_name=notary_name, abuse=abuse
    )


@dataclass(frozen=True, slots=True)
class _Reloaded:
    target_policy: AddressPolicy
    relay_policy: AddressPolicy
    bundle_bytes: bytes | None


class Reloader:
    """What SIGHUP changes without dropping a connection: the configuration
    is read again (``load``, None: not from a file) for the target policy
    (``[server] allow_targets`` and ``opt_out``), the relay's destination policy (``[relay]
    allow_addresses``) and the served bundle (``[server] bundle_file``,
    the same path); the relay's trusted bundles and the witness's bundles
    (``[witness] bundles``, the same paths) are read again. Any other
    change takes a restart.

    Error handling: a file that cannot be read or does not validate is
    logged and nothing of it is applied: the notary keeps its settings."""

    def __init__(
        self,
        load: Callable[[], Config] | None,
        *,
        prober: Prober,
        relay: RelayHandler,
        api: ApiHandler,
        bundle_file: Path | None,
        witness: Witness | None = None,
    ) -> None:
        self._load = load
        self._prober = prober
        self._relay = relay
        self._api = api
        self._bundle_file = bundle_file
        self._witness = witness

    def read(self) -> _Reloaded | None:
        """The new settings (blocking file reads: run it in a thread)."""
        if self._relay.trusted is not None:
            self._relay.trusted.reload()
        if self._witness is not None:
            self._witness.reload()
        if self._load is None:
            return None
        try:
            config = self._load()
            bundle = None
            if self._bundle_file is not None:
                bundle = read_served_bundle(self._bundle_file)[0]
        except NotaryError as exc:
            log.error("reload: kept the previous settings: %s", exc)
            return None
        return _Reloaded(
            AddressPolicy.from_cidrs(config.server.allow_targets, config.server.opt_out),
            AddressPolicy.from_cidrs(config.relay.allow_addresses),
            bundle,
        )

    def apply(self, reloaded: _Reloaded) -> None:
        self._prober.policy = reloaded.target_policy
        self._relay.policy = reloaded.relay_policy
        if reloaded.bundle_bytes is not None:
            self._api.bundle_bytes = reloaded.bundle_bytes
        log.info("reloaded: target policy, relay policy and served bundle")


async def reload_on_sighup(reloader: Reloader) -> None:
    """``reloader`` on every SIGHUP (main thread only: elsewhere Trio cannot
    receive signals, and this returns at once)."""
    if threading.current_thread() is not threading.main_thread():
        return
    with trio.open_signal_receiver(signal.SIGHUP) as signals:
        async for _ in signals:
            reloaded = await trio.to_thread.run_sync(reloader.read)
            if reloaded is not None:
                reloader.apply(reloaded)


@dataclass(slots=True)
class _Connections:
    nursery: trio.Nursery  # a task per connection
    accepting: trio.CancelScope  # the accept loops


async def run_connections(
    servers: Sequence[tuple[Callable[[Any], Awaitable[None]], list[socket.socket], StreamMaker]],
    done: trio.Event,
    task_status: trio.TaskStatus[_Connections] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept on every listener, each connection a task of a nursery owned
    here, until the ``accepting`` scope handed to ``task_status`` is
    cancelled (the listeners are closed then); return, setting ``done``, once
    every connection has ended too."""
    # What exists now (configuration, keys, caches' structures, modules)
    # lives as long as the worker: kept out of the collector's full sweeps,
    # which otherwise walk it again and again under load.
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    async with trio.open_nursery() as connections:
        with trio.CancelScope() as accepting:
            async with trio.open_nursery() as acceptors:
                for handler, listening_sockets, make_stream in servers:
                    for listening in listening_sockets:
                        acceptors.start_soon(
                            serve_socket, listening, handler, connections, make_stream
                        )
                task_status.started(_Connections(connections, accepting))
    done.set()


def read_served_bundle(path: Path) -> tuple[bytes, str]:
    """The bytes of the bundle served at ``/<name>.notary``, and its notary
    name; ``UsageError`` when it cannot be read or parsed."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read bundle {path}: {exc.strerror}") from None
    return data, parse_bundle(data).name


def check_config(config: Config) -> None:
    """Read what ``serve_notary`` reads at start (the key and certificate,
    which must match, the served bundle, the relay's bundles, the
    Perspectives and v2 keys), so that a supervisor or ``serve
    --check-config`` learns of a problem before serving: the first one
    raises ``UsageError`` (or ``NotaryError``) naming the file."""
    make_server_ssl_context(config)
    notary_name = None
    if config.server.bundle_file is not None:
        notary_name = read_served_bundle(config.server.bundle_file)[1]
    make_relay_handler(config, resolver=system_resolver, notary_name=notary_name)
    if config.perspectives.key_file is not None:
        crypto.load_private_key(config.perspectives.key_file)
    if config.v2.key_file is not None:
        crypto.load_ed25519_private_key(config.v2.key_file)


async def serve_notary(
    config: Config,
    *,
    resolver: Resolver = system_resolver,
    clock: Callable[[], float] = time.time,
    sockets: Sockets | None = None,
    reload_config: Callable[[], Config] | None = None,
    shared_store: bool = False,
    ticket_keys: bytes | None = None,
    task_status: trio.TaskStatus[RunningNotary] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a notary until cancelled (or stopped through ``RunningNotary``).

    ``sockets``: the listening sockets by role (``notary.server.sockets``),
    bound or inherited by the caller; they are bound here from the config
    when None. Either way they are closed when this returns.
    ``reload_config``: reads the configuration again on SIGHUP (``Reloader``).
    ``shared_store``: other processes (the node's other workers) write to the
    same database (their probes then count for the scheduler's rule 11; the
    change feed brings their changes either way). ``ticket_keys``: the TLS
    session-ticket keys the node's workers share (``notary.server.tickets``;
    None: OpenSSL's own, this process's alone)."""
    if sockets is None:
        sockets = bind_sockets(config)
    try:
        components = build_components(
            config, sockets, resolver=resolver, clock=clock, shared_store=shared_store,
            ticket_keys=ticket_keys,
        )
        await serve(components, reload_config=reload_config, task_status=task_status)
    finally:
        close_all(sockets)




@dataclass(frozen=True, slots=True)
class Components:
    """What a notary is built from, made from the configuration alone (files
    read, nothing opened): ``serve`` opens the rest around them."""

    config: Config
    sockets: Sockets
    resolver: Resolver
    clock: Callable[[], float]
    shared_store: bool  # other workers write the store (the scheduler's rule 11)
    tls: ssl.SSLContext
    policy: AddressPolicy
    abuse: AbuseControls
    relay: RelayHandler
    #: The signers by protocol ("convergence", "perspectives", "v2").
    signers: Mapping[str, Signer]
    record_signer: RecordSigner
    v2_signer: crypto.Ed25519Signer | None
    v2_key_document: bytes | None
    bundle_path: str | None  # where the bundle is served (None: not served)
    bundle_bytes: bytes | None
    cache: LRUCache
    stored: StoredTargets
    watch_hub: WatchHub | None  # None: no v2, no watchers
    timings: Timings
    log: LogAppender | None = None  # the transparency log (None: none kept)
    witness: Witness | None = None  # the witness endpoint (None: not a witness)
    log_witnesses: LogWitnesses | None = None  # who cosigns the log (None: nobody)
    cosigned: CosignedCheckpoints | None = None  # what they cosigned (None: nobody)
    #: Whether the resolvers DANE trusts validate (None: DANE is off).
    resolver_validation: ResolverValidation | None = None


def build_components(
    config: Config,
    sockets: Sockets,
    *,
    resolver: Resolver = system_resolver,
    clock: Callable[[], float] = time.time,
    shared_store: bool = False,
    ticket_keys: bytes | None = None,
) -> Components:
    """Read the keys, certificate and bundles and make what needs nothing
    opened, in dependency order (``ticket_keys``: see ``serve_notary``).
    Raises ``UsageError`` for a bad file.
    With DANE among the backends, names are resolved through the
    validating resolvers DANE trusts (unless a ``resolver`` is given)."""
    if config.verify.dane and resolver is system_resolver:
        resolver = resolver_through(dns_resolvers(config), config.dns.timeout_s)
    tls = make_server_ssl_context(config)
    if ticket_keys is not None:
        share_ticket_keys(tls, ticket_keys)
    if config.server.legacy_tls:
        log.warning(
            "legacy_tls is on: the API accepts TLS 1.0 and 1.1 clients and CBC ciphers "
            "(for the 2011 add-on); turn it off when no such client needs it"
        )
    abuse = AbuseControls(config.limits)
    bundle_path = bundle_bytes = notary_name = None
    if config.server.bundle_file is not None:
        bundle_bytes, notary_name = read_served_bundle(config.server.bundle_file)
        bundle_path = "/" + config.server.bundle_file.name
    signer = crypto.ConvergenceSigner(crypto.load_private_key(config.server.key_file))
    perspectives_signer = None
    if config.perspectives.key_file is not None:
        perspectives_signer = crypto.PerspectivesSigner(
            crypto.load_private_key(config.perspectives.key_file)
        )
    v2_signer = v2_key_document = None
    if config.v2.key_file is not None:
        v2_signer = crypto.Ed25519Signer(crypto.load_ed25519_private_key(config.v2.key_file))
        v2_key_document = make_v2_key_document(config, v2_signer)
    signers = {
        kind: kind_signer for kind, kind_signer in (
            ("convergence", signer), ("perspectives", perspectives_signer), ("v2", v2_signer),
        ) if kind_signer is not None
    }
    stored = StoredTargets(config.cache.bloom_expected_items, config.cache.bloom_false_positive_rate)
    statement_log = None
    fleet = config.store.backend == "postgresql"  # the log lives beside the observations
    # Statements waiting for their witnesses' cosignatures (None: no witness asked).
    awaiting = AwaitingWitnesses() if config.log.witnesses else None
    if config.log.enabled and v2_signer is not None and (fleet or config.server.db_file):
        from notary.state.pgtlogstore import PostgresLogStore
        from notary.state.tlogstore import LogStore

        statement_log = LogAppender(
            config.store.dsn if fleet else config.server.db_file,  # type: ignore[arg-type]
            origin=config.log.origin, signer=v2_signer,
            interval_s=config.log.checkpoint_interval_s,
            max_merge_delay_s=config.log.max_merge_delay_s, max_pending=config.log.max_pending,
            open_store=PostgresLogStore if fleet else LogStore,
            on_sequenced=awaiting.add if awaiting is not None else None,
        )
    log_witnesses = cosigned = None
    if statement_log is not None and awaiting is not None:
        cosigned = CosignedCheckpoints(
            statement_log, awaiting, [w.key for w in config.log.witnesses],
            min_cosignatures=config.log.min_cosignatures,
            interval_s=config.log.checkpoint_interval_s, wait_s=config.log.witness_wait_s,
        )
        log_witnesses = LogWitnesses(
            statement_log, config.log.witnesses, interval_s=config.log.checkpoint_interval_s,
            timeout_s=config.log.witness_timeout_s, retry_s=config.log.witness_retry_s,
            clock=clock, on_cosigned=cosigned.poke,
        )
    witness = None
    if config.witness.enabled and v2_signer is not None:
        from notary.state.witnessstore import PostgresWitnessStore, WitnessStore

        witness = Witness(
            config.store.dsn if fleet else config.server.db_file,  # type: ignore[arg-type]
            name=config.witness.name, logs=config.witness.logs, signer=v2_signer, clock=clock,
            open_store=PostgresWitnessStore if fleet else WitnessStore,
            bundles=config.witness.bundles, abuse=abuse,
        )
    return Components(
        config=config, sockets=sockets, resolver=resolver, clock=clock,
        # A PostgreSQL store is a fleet's: other nodes write it too.
        shared_store=shared_store or config.store.backend == "postgresql", tls=tls,
        policy=AddressPolicy.from_cidrs(config.server.allow_targets, config.server.opt_out),
        abuse=abuse,
        relay=make_relay_handler(config, resolver=resolver, notary_name=notary_name, abuse=abuse),
        signers=signers,
        record_signer=RecordSigner(
            signer, perspectives_signer, v2_signer, config.v2, clock, config.verify.backends,
            log=statement_log, fresh_for_s=config.answers.fresh_for_s,
            statements_per_target_per_hour=config.log.statements_per_target_per_hour,
            max_tracked=config.limits.max_tracked,
        ),
        v2_signer=v2_signer, v2_key_document=v2_key_document,
        bundle_path=bundle_path, bundle_bytes=bundle_bytes,
        cache=LRUCache(config.cache.max_entries, config.cache.max_bytes),
        stored=stored,
        watch_hub=WatchHub() if v2_signer is not None else None,
        timings=Timings(),
        log=statement_log, witness=witness, log_witnesses=log_witnesses, cosigned=cosigned,
        resolver_validation=make_resolver_validation(config),
    )


@dataclass(frozen=True, slots=True)
class _WitnessingSource:
    """The metrics' ``witnessing`` source: the follower's and the submitter's counts."""

    cosigned: CosignedCheckpoints
    submitter: LogWitnesses | None

    def statistics(self) -> WitnessingStatistics:
        return self.cosigned.statistics(self.submitter)


@dataclass(frozen=True, slots=True)
class Listener:
    """One row of the listener table: who serves which sockets, and how
    they are announced (``label``, with ``{}`` for the addresses)."""

    role: str  # the sockets' role (``notary.server.sockets``)
    handler: Callable[[Any], Awaitable[None]]
    sockets: Sequence[socket.socket]
    label: str
    #: The stream its connections are served on (the HTTP listeners: the
    #: hot path's ``SocketStream`` or ``TlsStream``, from their handler).
    make_stream: StreamMaker = trio_stream

    @property
    def endpoints(self) -> tuple[Endpoint, ...]:
        return tuple(bound_endpoint(listening) for listening in self.sockets)


@dataclass(frozen=True, slots=True)
class Services:
    """What serves queries, made once the store, prober and records are open."""

    service: QueryService
    metrics: NotaryMetrics
    api: ApiHandler
    log_pages: LogPages | None
    websocket: WebSocketService | None
    admin: AdminServer
    watchdog: Watchdog
    parking: Parking
    #: Every listener; the admin one last (a graceful stop keeps it).
    listeners: tuple[Listener, ...]


def build_services(
    c: Components, storage: Storage, prober: Prober,
    scheduler: RescanScheduler | None, records: Records,
) -> Services:
    """The query service, its handlers and listeners, and the metrics
    reading them, in dependency order: the counters the metrics read are
    made first and given to their owners."""
    config, sockets, v2 = c.config, c.sockets, c.v2_signer is not None
    service = QueryService(
        records=records, cache=c.cache, storage=storage,
        fresh_for_s=config.answers.fresh_for_s, reprobe_after_s=config.answers.reprobe_after_s,
        query_timeout_s=config.answers.query_timeout_s, clock=c.clock,
        perspectives="perspectives" in c.signers, v2_signer=c.v2_signer,
        abuse=c.abuse, scheduler=scheduler, failure_delay_s=config.failure_delay_s,
        backends=config.verify.backends,
        # Only a notary that promises cosignatures waits for them.
        wait_witnessed=(c.cosigned.wait_witnessed
                        if c.cosigned is not None and config.log.min_cosignatures else None),
    )
    perspectives = bool(sockets["perspectives"])
    # The listeners whose connections are counted, in the order they are exported.
    counts = {
        role: ConnectionCounts() for role, served in (
            ("api", True), ("plain_api", bool(sockets["plain_api"])),
            ("perspectives", perspectives), ("admin", True),
        ) if served
    }
    api_rejected: Counter[tuple[str, int]] = Counter()
    perspectives_rejected: Counter[tuple[str, int]] = Counter()
    websocket_counts = WebSocketCounts(c.watch_hub) if v2 else None
    log_pages = None
    if c.log is not None:
        log_pages = LogPages(
            c.log, c.cosigned, abuse=c.abuse, clock=c.clock,
            send_timeout_s=config.http.send_timeout_s,
        )
    watchdog = Watchdog()
    parking = Parking(watchdog)
    metrics = NotaryMetrics(
        service=service, cache=c.cache, stored=c.stored, storage=storage, prober=prober,
        records=records, relay=c.relay if sockets["relay"] else None, scheduler=scheduler,
        dane=records.dane, log=c.log, log_pages=log_pages,
        witnessing=_WitnessingSource(c.cosigned, c.log_witnesses) if c.cosigned else None,
        witness=c.witness, websocket=websocket_counts, parking=parking,
        abuse=c.abuse, signers=c.signers, listeners=counts,
        rejections=(api_rejected, perspectives_rejected) if perspectives else (api_rejected,),
        timings=c.timings,
    )
    figures = LiveFigures(metrics.node_totals, min_interval_s=MIN_SAMPLE_INTERVAL_S)
    web = WebPages(
        service, _profile(c), figures=figures, live=v2, clock=c.clock,
        fresh_for_s=config.answers.fresh_for_s,
    )
    api = ApiHandler(
        service, web=web, index_text=index_text(config), bundle_path=c.bundle_path,
        bundle_bytes=c.bundle_bytes, perspectives="perspectives" in c.signers,
        v2_key_document=c.v2_key_document, v2_max_batch=config.v2.max_batch,
        v2_max_body_bytes=config.api_body_bytes, rejected=api_rejected, log=log_pages,
        witness=c.witness,
    )
    websocket = None
    if websocket_counts is not None:
        websocket = WebSocketService(
            answer_query=service.answer_v2_bytes, limits=config.websocket,
            max_batch=config.v2.max_batch, figures=figures.current, counts=websocket_counts,
        )
    listen = partial(ConnectionHandler, watchdog=watchdog, abuse=c.abuse, parking=parking)
    admin = AdminServer(
        config.admin, config.http, metrics=metrics, storage=storage, counts=counts["admin"],
        resolvers=c.resolver_validation,
    )
    https = listen(c.tls, api, config.api_http, counts=counts["api"], websocket=websocket)
    plain_counts = counts.get("plain_api", ConnectionCounts())
    if config.server.proxy_protocol_from:
        plain: ConnectionHandler = EdgeConnectionHandler(
            api, config.api_http, edges=TrustedEdges(config.server.proxy_protocol_from),
            counts=plain_counts, watchdog=watchdog, abuse=c.abuse, parking=parking,
        )
    else:
        plain = listen(None, api, config.api_http, counts=plain_counts)
    table = [
        Listener("api", https, sockets["api"], f"notary {__version__} serving the API on {{}} "
                 f"(cache: {CACHE_IMPLEMENTATION}, request path: {HOTPATH_IMPLEMENTATION})",
                 https.make_stream),
        Listener("plain_api", plain, sockets["plain_api"],
                 "plain-HTTP API (TLS terminated in front) on {}"
                 + (" (PROXY protocol from {})".format(", ".join(config.server.proxy_protocol_from))
                    if config.server.proxy_protocol_from else ""),
                 plain.make_stream),
        Listener("relay", c.relay, sockets["relay"],
                 f"relay on {{}} (destinations: {c.relay.mode})"),
    ]
    if perspectives:
        handler = PerspectivesHandler(
            service, index_page=perspectives_index(config), rejected=perspectives_rejected
        )
        served = listen(None, handler, config.http, counts=counts["perspectives"])
        table.append(Listener(
            "perspectives", served, sockets["perspectives"],
            "Perspectives on {} (and on the API ports)", served.make_stream,
        ))
    table.append(Listener(
        "admin", admin, sockets["admin"], "admin (/metrics, /healthz, /readyz) on {}"
    ))
    return Services(
        service, metrics, api, log_pages, websocket, admin, watchdog, parking, tuple(table)
    )


def _profile(c: Components) -> NotaryProfile:
    """What the web pages say about this notary."""
    sockets, v2 = c.sockets, c.v2_signer is not None
    return notary_profile(
        c.config, bundle_bytes=c.bundle_bytes, bundle_path=c.bundle_path,
        v2_key_id=c.v2_signer.key_id if c.v2_signer is not None else None,
        v2_public_raw=c.v2_signer.public_raw if c.v2_signer is not None else None,
        relay_mode=str(c.relay.mode) if sockets["relay"] else None,
        figures_interval_s=FIGURES_INTERVAL_S if v2 else 0,
        api_ports=[bound_endpoint(s).port for s in sockets["api"]],
        perspectives_ports=[bound_endpoint(s).port for s in sockets["perspectives"]],
    )


async def serve(
    components: Components,
    *,
    reload_config: Callable[[], Config] | None = None,
    task_status: trio.TaskStatus[RunningNotary] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Open the store, the prober and the records around ``components``,
    build the services and serve them until cancelled or stopped."""
    c, config = components, components.config
    if c.resolver_validation is not None:  # refuse a resolver that does not validate
        await c.resolver_validation.check_at_start()
    async with open_storage(
        config.server.db_file,
        config.store,
        file_mode=config.node.database_file_mode,
        clock=c.clock,
        timings=c.timings,
    ) as storage:
        # The log's appender outlives the serving: cancelled after it, it
        # appends what the last answers signed before closing.
        async with trio.open_nursery() as logging_nursery:
            if c.log is not None:
                await logging_nursery.start(c.log.run)
            if c.witness is not None:
                await logging_nursery.start(c.witness.run)
            if c.log_witnesses is not None:
                await logging_nursery.start(c.log_witnesses.run)
            if c.cosigned is not None:
                await logging_nursery.start(c.cosigned.run)
            await _serve_from(c, config, storage, reload_config, task_status)
            logging_nursery.cancel_scope.cancel()


async def _serve_from(
    c: Components, config: Config, storage: Storage,
    reload_config: Callable[[], Config] | None,
    task_status: trio.TaskStatus[RunningNotary],
) -> None:
    """Serve ``c`` on ``storage`` until stopped (``serve``'s body, inside
    the log's appender)."""
    # Cancelling ``serving`` (RunningNotary.stop) ends listeners, probes and
    # connections but not the storage block around it, which then exits
    # normally and so drains the write queue.
    with trio.CancelScope() as serving:
        async with open_prober(
            config.probe,
            policy=c.policy,
            resolver=c.resolver,
            clock=c.clock,
            admit_destination=lambda address: c.abuse.admit_destination(address, c.clock()),
            timings=c.timings,
            address_memory_entries=config.limits.max_tracked,
        ) as prober:
            scheduler = make_scheduler(
                config, prober, store_observed_age(storage, c.clock) if c.shared_store else None
            )
            async with Records(
                cache=c.cache, storage=storage, stored=c.stored, signer=c.record_signer,
                prober=prober, merge_window_s=config.store.merge_window_s,
                timeline_limits=config.store.timeline_limits(),
                max_background=BACKGROUND_REFRESHES_PER_PROBE_SLOT * config.probe.max_concurrent,
                watch_hub=c.watch_hub,
                node_prober=make_node_prober(config, storage, prober, c.clock)
                if c.shared_store else None,
                dane=make_dane_checker(config, c.clock),
                fresh_for_s=config.answers.fresh_for_s,
                samples_per_address=config.probe.samples_per_address,
                clock=c.clock,
            ) as records:
                services = build_services(c, storage, prober, scheduler, records)
                await _run(
                    c, services, storage, prober, scheduler, records,
                    reload_config=reload_config, serving=serving, task_status=task_status,
                )


async def _run(
    c: Components, s: Services, storage: Storage, prober: Prober,
    scheduler: RescanScheduler | None, records: Records, *,
    reload_config: Callable[[], Config] | None, serving: trio.CancelScope,
    task_status: trio.TaskStatus[RunningNotary],
) -> None:
    """Start the background tasks and the listeners, then hand the running
    notary to ``task_status``; return when ``serving`` is cancelled."""
    for listener in s.listeners:
        if listener.sockets or listener.role == "api":
            log.info(listener.label.format(", ".join(map(str, listener.endpoints))))
    by_role = {listener.role: listener for listener in s.listeners}
    connections_done = trio.Event()
    async with trio.open_nursery() as nursery:
        # The feed's position is read before the filter's scan: a target
        # committed in between is in the scan or the feed, never in neither.
        await nursery.start(
            follow_changes, storage, records, c.config.store.feed_interval_ms / 1000
        )
        nursery.start_soon(c.stored.load, storage)
        nursery.start_soon(s.metrics.serve_folding, c.config.admin.metrics_interval_s)
        if c.resolver_validation is not None:
            nursery.start_soon(c.resolver_validation.serve)
        await nursery.start(s.watchdog.run)
        await nursery.start(s.parking.run)
        if s.websocket is not None:
            nursery.start_soon(s.websocket.serve_figures)
        # The admin listener is not among the connections a graceful stop
        # drains: it keeps answering (/readyz: 503) meanwhile.
        for listening in by_role["admin"].sockets:
            nursery.start_soon(serve_socket, listening, s.admin, nursery)
        if scheduler is not None:
            await nursery.start(scheduler.serve, records.refresh)
        reloader = Reloader(
            reload_config, prober=prober, relay=c.relay, api=s.api,
            bundle_file=c.config.server.bundle_file, witness=c.witness,
        )
        nursery.start_soon(reload_on_sighup, reloader)
        # The accept loops run in a scope of their own, so that a graceful
        # stop can end them (closing the listeners) and let the connections finish.
        servers = [(row.handler, list(row.sockets), row.make_stream)
                   for row in s.listeners if row.role != "admin"]
        running = await nursery.start(run_connections, servers, connections_done)

        async def stop_gracefully(timeout_s: float) -> None:
            s.admin.serving = False
            running.accepting.cancel()
            s.watchdog.stop()
            with trio.move_on_after(timeout_s):
                await connections_done.wait()
            if not connections_done.is_set():
                log.warning(
                    "graceful stop: %d connections cut after %gs",
                    len(running.nursery.child_tasks), timeout_s,
                )
            serving.cancel()

        s.admin.serving = True
        endpoints = {role: row.endpoints for role, row in by_role.items()}
        task_status.started(RunningNotary(
            api=endpoints["api"], plain_api=endpoints["plain_api"],
            perspectives=endpoints.get("perspectives", ()), relay=endpoints["relay"],
            relay_handler=c.relay, service=s.service, records=records, stored=c.stored,
            storage=storage, prober=prober, scheduler=scheduler, cache=c.cache,
            stop=serving.cancel, stop_gracefully=stop_gracefully, admin=endpoints["admin"],
            metrics=s.metrics, abuse=c.abuse, signers=c.signers, log=c.log,
            log_pages=s.log_pages, log_witnesses=c.log_witnesses, cosigned=c.cosigned,
            witness=c.witness,
        ))
