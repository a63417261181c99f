"""Configuration: one TOML file -> frozen dataclasses, validated at start.

Durations and sizes carry their unit in their names. Command-line flags
override the file (``notary.cli`` applies them with ``dataclasses.replace``).
Every problem is a ``ConfigError`` whose message names the key.

Example (every key optional except the three files)::

    [server]
    key_file = "var/notary.key"
    cert_file = "var/notary.crt"
    db_file = "var/notary.db"
    api = ["127.0.0.1:8443", "127.0.0.1:4242"]
    allow_targets = ["127.0.0.0/8"]
    opt_out = ["example.org", "192.0.2.0/24"]
    log_level = "info"

    [limits]
    queries_per_s_per_prefix = 20

    [probe]
    timeout_s = 10.0

    [answers]
    fresh_for_s = 86400
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from notary.errors import ConfigError
from notary.model.observations import TimelineLimits
from notary.model.policy import AddressPolicy
from notary.model.ratelimit import Exemptions
from notary.protocol import tlog
from notary.protocol.bundle import BundleLog
from notary.protocol.http import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_HEADER_BYTES,
    DEFAULT_MAX_HEADERS,
)
from notary.protocol.relay import RelayMode
from notary.state._cachecommon import bloom_parameters
from notary.state.store import database_file_mode

#: Room per target in a ``/v2/query`` body: a 253-character host, a port,
#: the three hashes in colon form, an IPv6 address and the JSON around them
#: (624 bytes compact), with room for spaces.
V2_BYTES_PER_TARGET = 768


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A listening address."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_endpoint(text: str, *, what: str = "address") -> Endpoint:
    """``HOST:PORT`` or ``[V6]:PORT`` (port 0 picks a free port)."""
    match = re.fullmatch(
        r"\[([0-9A-Fa-f:.]+)\]:(\d{1,5})|([^:\[\]]+):(\d{1,5})", text.strip(), re.ASCII
    )
    if not match:
        raise ConfigError(f"{what} {text!r} must be HOST:PORT (IPv6 as [ADDR]:PORT)")
    host = match.group(1) or match.group(3)
    port = int(match.group(2) or match.group(4))
    if port > 65535:
        raise ConfigError(f"{what} {text!r}: port must be 0-65535")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if host != "localhost":
            raise ConfigError(
                f"{what} {text!r}: host must be an IP address (or localhost)"
            ) from None
    return Endpoint(host, port)


@dataclass(frozen=True, slots=True)
class ServerConfig:
    key_file: Path
    cert_file: Path
    #: The SQLite database (required unless ``[store] backend = "postgresql"``).
    db_file: Path | None = None
    #: The HTTPS query API listeners (Convergence: 443 and 4242).
    api: tuple[Endpoint, ...] = (Endpoint("0.0.0.0", 443), Endpoint("0.0.0.0", 4242))
    #: Plain-HTTP API listeners, for operators who terminate TLS in front of
    #: the notary (with the notary's own certificate: clients pin it). Off.
    plain_api: tuple[Endpoint, ...] = ()
    #: CIDRs of the TLS terminators in front (docs/edge.md): a connection
    #: to a ``plain_api`` listener from one of them must begin with a PROXY
    #: protocol header (v1 or v2) naming the client, whom the limits then
    #: see; from anywhere else, one that begins with a header is refused.
    #: Empty: off (no header is read).
    proxy_protocol_from: tuple[str, ...] = ()
    #: CIDRs exempt from the target address policy (labs, tests).
    allow_targets: tuple[str, ...] = ()
    #: Targets never probed, whatever else allows them: host names (each
    #: covering the names under it: "example.org" covers "www.example.org")
    #: and CIDRs (checked on every resolved address). A query gets 403.
    opt_out: tuple[str, ...] = ()
    #: Accept TLS 1.0 and 1.1 clients (the 2011 add-on) with their CBC
    #: ciphers; off: TLS 1.2+ with AEAD ciphers only. Logged at start.
    legacy_tls: bool = False
    #: The bundle served at ``/<name>.notary`` (optional).
    bundle_file: Path | None = None
    log_level: str = "info"
    #: ``text`` (human), ``json`` (one object per line) or ``logfmt``.
    log_format: str = "text"


@dataclass(frozen=True, slots=True)
class ProbeConfig:
    #: Deadline of one probe: resolve, then connect and handshake with every
    #: address (each connection's wait for a slot included).
    timeout_s: float = 10.0
    #: Connections to targets at once, across all probes (each address of a
    #: probe, each sample, holds one while it connects and handshakes).
    max_concurrent: int = 256
    #: Bytes a target may send before its certificates are in.
    max_handshake_bytes: int = 256 * 1024
    #: Addresses of a name a probe handshakes with (the policy-allowed
    #: ones, in the resolver's order; docs/sites.md).
    max_addresses: int = 8
    #: Handshakes with each address at most when the target was seen
    #: serving more than one certificate within [answers] fresh_for_s.
    samples_per_address: int = 4
    #: A client's address hint is probed only when the notary's own
    #: resolution of the name returned it within this window.
    address_memory_s: int = 86400

    @property
    def scheduled_timeout_s(self) -> float:
        """Deadline of a scheduled probe: a probe may queue for a slot first."""
        return self.timeout_s * 2


@dataclass(frozen=True, slots=True)
class AnswerConfig:
    #: A fingerprint observed within this window is vouched for without a probe.
    fresh_for_s: int = 86400
    #: A target probed within this window is not probed again for a query;
    #: that probe is the answer (stops probe loops driven by random fingerprints).
    reprobe_after_s: int = 60
    #: How long one query may wait for a probe before it is answered 503.
    query_timeout_s: float = 15.0
    #: A probe that fails (no name, refused, unreachable, not TLS, timed out)
    #: is answered only when a timed-out one would be (``[probe] timeout_s``
    #: after the query, at most ``query_timeout_s``), so the answer's timing
    #: does not tell a port scanner which failure it was.
    failures_at_deadline: bool = True


@dataclass(frozen=True, slots=True)
class HttpConfig:
    tls_handshake_timeout_s: float = 10.0
    #: Time to receive a whole request head (slow clients are dropped).
    header_timeout_s: float = 10.0
    #: Idle time allowed between requests on a keep-alive connection.
    keepalive_timeout_s: float = 30.0
    #: Time to send one response to a client that does not read.
    send_timeout_s: float = 10.0
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    max_headers: int = DEFAULT_MAX_HEADERS
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    #: Connections at once on the listeners of one kind (API, plain API,
    #: Perspectives); beyond it a connection is closed at once.
    max_connections: int = 10000
    #: Requests served on one keep-alive connection; the last is answered
    #: with ``Connection: close``.
    max_requests_per_connection: int = 1000
    #: After an error answer (400, 408, 413, 431, ...): most time to read
    #: and discard what the client still sends before closing, so the close
    #: does not reset the connection under the answer; the linger also ends
    #: when the client closes or sends nothing for ``linger_idle_s``.
    linger_timeout_s: float = 1.0
    linger_idle_s: float = 0.25


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    """Per-client and per-target limits (docs/security.md "Security model"): the
    node's; each of N workers enforces its share (``shared_by``). A rate of
    0 turns that limit off."""

    #: Clients no per-client limit applies to: the operator's machine, or a
    #: TLS terminator in front (every client would share its address).
    exempt_clients: tuple[str, ...] = ("127.0.0.0/8", "::1/128")
    #: Connections at once from one client address (HTTP API, plain API,
    #: Perspectives, counted together; relay connections apart); beyond:
    #: closed at once.
    max_connections_per_address: int = 64
    #: ... and from one client prefix (IPv4 /24, IPv6 /56).
    max_connections_per_prefix: int = 256
    #: Queries per second per client prefix (token bucket of ``query_burst``);
    #: beyond: 429 with Retry-After. A /v2/query or WebSocket query counts
    #: one per target.
    queries_per_s_per_prefix: float = 20.0
    query_burst: int = 100
    #: On-demand probes per second a client prefix may cause (bucket of
    #: ``probe_burst``); beyond: 429 with Retry-After.
    probes_per_s_per_prefix: float = 1.0
    probe_burst: int = 20
    #: On-demand probes of one target per minute, whoever asks and whatever
    #: fingerprints they send (one at most every 60/N seconds); a query that
    #: would exceed it is answered as if the probe had failed.
    probes_per_minute_per_target: int = 4
    #: Politeness: on-demand probes per second to one target prefix (/24 or
    #: /48; bucket of ``destination_probe_burst``); beyond: as a failed probe.
    probes_per_s_per_destination_prefix: float = 10.0
    destination_probe_burst: int = 50
    #: Bytes of log entries (docs/storage.md "What the notary keeps") the statements
    #: a client prefix's queries make the notary sign may add per second
    #: (bucket of ``log_burst_bytes``; a statement is charged when signed,
    #: into debt); a client in debt gets 429 for a query that would start a
    #: probe, and no new statement signed for it meanwhile.
    log_bytes_per_s_per_prefix: float = 1024.0
    log_burst_bytes: int = 256 * 1024
    #: Entries each rate table (client prefixes, targets, target prefixes)
    #: holds at most (about 160 bytes each; docs/security.md "Security model").
    max_tracked: int = 16384

    def shared_by(self, workers: int) -> LimitsConfig:
        """One worker's share of the node's rates and bursts when ``workers``
        processes serve (the kernel spreads connections evenly, so a client's
        rate over the node stays near the configured one). Connection caps
        stay per worker: one connection lives on one worker, and a share
        would refuse clients within the cap whenever the spread is uneven."""
        if workers <= 1:
            return self

        def burst(value: int) -> int:
            return max(1, math.ceil(value / workers))

        return replace(
            self,
            queries_per_s_per_prefix=self.queries_per_s_per_prefix / workers,
            query_burst=burst(self.query_burst),
            probes_per_s_per_prefix=self.probes_per_s_per_prefix / workers,
            probe_burst=burst(self.probe_burst),
            probes_per_minute_per_target=self.probes_per_minute_per_target / workers,  # type: ignore[arg-type]
            probes_per_s_per_destination_prefix=self.probes_per_s_per_destination_prefix / workers,
            destination_probe_burst=burst(self.destination_probe_burst),
            log_bytes_per_s_per_prefix=self.log_bytes_per_s_per_prefix / workers,
            log_burst_bytes=burst(self.log_burst_bytes),
        )


@dataclass(frozen=True, slots=True)
class CacheConfig:
    max_entries: int = 100_000
    max_bytes: int = 256 * 1024 * 1024
    #: Sizing of the bloom filter of stored targets (1M at 1%: 1.2 MB). More
    #: targets than this only raise the false-positive rate (store reads for
    #: targets never seen), never lose one.
    bloom_expected_items: int = 1_000_000
    bloom_false_positive_rate: float = 0.01


@dataclass(frozen=True, slots=True)
class StoreConfig:
    #: Flush a batch when this many observations are queued...
    batch_rows: int = 500
    #: ...or when the oldest queued one has waited this long.
    batch_interval_ms: int = 50
    #: Bound of the write queue; producers wait when it is full.
    queue_rows: int = 10_000
    #: SQLite ``PRAGMA synchronous`` (NORMAL in WAL mode loses at most the
    #: last transactions on power loss, never corrupts).
    synchronous: str = "NORMAL"
    #: Sightings of a certificate closer than this form one run of the
    #: history (Perspectives timespans); a longer gap starts a new run.
    merge_window_s: int = 48 * 3600
    #: What a target keeps (docs/storage.md "What the notary keeps"), in every
    #: protocol's answer alike: a leaf certificate larger than this is kept
    #: by its hashes only (no protocol answer needs its DER; 0: never keep
    #: the DER)...
    max_certificate_bytes: int = 8192
    #: ...its newest certificates (by last sighting; the oldest dropped)...
    max_certificates_per_target: int = 64
    #: ...and each certificate's newest runs of sightings.
    max_runs_per_certificate: int = 32
    #: A target nobody asked about this long is removed with its history
    #: (at least ``[rescan] forget_after_s``, so no rescanned target goes).
    forget_unasked_after_s: int = 90 * 86400  # None, set in code only: for ever
    #: How often each process reads the change feed (what the node's other
    #: workers committed: docs/operating.md, "Workers and the change feed")...
    feed_interval_ms: int = 100
    #: ...and how many of its newest rows the store keeps (a worker that
    #: falls further behind drops its whole cache).
    feed_max_rows: int = 100_000
    #: The engine: "sqlite" (the file ``[server] db_file``, one machine) or
    #: "postgresql" (``dsn``, shared by the nodes of a fleet: docs/fleet.md).
    backend: str = "sqlite"
    #: PostgreSQL connection string (libpq keywords or a URL, checked at
    #: load: libpq must read it as written); the password best from
    #: ``PGPASSFILE`` or the service's credentials, never here.
    dsn: str = ""

    def timeline_limits(self) -> TimelineLimits:
        """The limits of a target's timeline, for the store and the cache."""
        return TimelineLimits(
            max_certificate_bytes=self.max_certificate_bytes,
            max_certificates_per_target=self.max_certificates_per_target,
            max_runs_per_certificate=self.max_runs_per_certificate,
        )


@dataclass(frozen=True, slots=True)
class RelayConfig:
    """The bounce relay (PROTOCOLS.md 1.5): plain TCP, ``CONNECT`` only."""

    #: Relay listeners (Convergence: port 80); an empty list runs no relay.
    listen: tuple[Endpoint, ...] = (Endpoint("0.0.0.0", 80),)
    #: "bundles": only hosts of the bundles below; "public": any host whose
    #: addresses the address policy allows; "off": serve a page, relay nothing.
    destinations: str = "bundles"
    #: Trusted ``.notary`` files, or directories of them (re-read on SIGHUP).
    bundles: tuple[Path, ...] = ()
    #: CIDRs exempt from the address policy for destinations (labs, tests).
    allow_addresses: tuple[str, ...] = ()
    #: The port connected to on a destination. Clients always ask for 4242;
    #: change this only in labs that run several notaries on one machine.
    dial_port: int = 4242
    #: Time to receive the whole CONNECT head.
    head_timeout_s: float = 10.0
    #: Time to resolve and connect to the destinations (tried in parallel).
    connect_timeout_s: float = 10.0
    #: An established tunnel with no byte in either direction this long is closed.
    idle_timeout_s: float = 60.0
    #: Any tunnel is closed after this long.
    max_lifetime_s: float = 600.0
    #: Relay connections at once (any phase); beyond it: 503 and close.
    max_tunnels: int = 1000
    max_header_bytes: int = 4 * 1024
    max_headers: int = 32
    #: Hosts one CONNECT may name (request-target plus X-Convergence-Notary).
    max_destinations: int = 8
    #: Bytes read from one side before they are written to the other.
    buffer_bytes: int = 64 * 1024
    #: After a refusal: time to read and discard what the client still
    #: sends before closing (as ``[http] linger_timeout_s``).
    linger_timeout_s: float = 1.0


@dataclass(frozen=True, slots=True)
class PerspectivesConfig:
    """The Perspectives protocol (PROTOCOLS.md 2): served when ``key_file``
    is set, on ``listen`` (plain HTTP) and on the HTTPS API ports."""

    #: The Perspectives RSA key (``notary keygen --perspectives``); separate
    #: from the TLS key. None: Perspectives is not served.
    key_file: Path | None = None
    #: Plain-HTTP Perspectives listeners (historic port 8080).
    listen: tuple[Endpoint, ...] = (Endpoint("0.0.0.0", 8080),)


@dataclass(frozen=True, slots=True)
class RescanConfig:
    """The rescan scheduler: re-probes what people ask about (see
    ``notary.service.scheduler``)."""

    enabled: bool = True
    #: Global budget of scheduled probes (on-demand probes are not counted).
    probes_per_s: float = 2.0
    #: No target still asked about goes longer than this without a probe
    #: (below the 48 h after which Perspectives clients ignore a notary).
    max_staleness_s: float = 40 * 3600
    #: A target nobody asked about this long is no longer rescanned.
    forget_after_s: float = 7 * 86400
    #: Interval of a target asked about once (popular ones come sooner).
    base_interval_s: float = 24 * 3600
    #: Politeness: scheduled probes per second to one /24 (IPv4) or /48 (IPv6).
    per_prefix_per_s: float = 0.2
    #: Targets the scheduler remembers (least recently asked forgotten first).
    max_targets: int = 100_000
    #: Scheduled probes running at once.
    max_in_flight: int = 8


@dataclass(frozen=True, slots=True)
class V2Config:
    """The modern signed API (``POST /v2/query``, ``GET /v2/key``): served
    when ``key_file`` is set."""

    #: The Ed25519 signing key (``notary keygen --v2``). None: v2 is off.
    key_file: Path | None = None
    #: Targets one ``/v2/query`` may ask about (413 beyond).
    max_batch: int = 100
    #: A statement is valid this long after it is signed...
    statement_valid_for_s: int = 86400
    #: ...and is signed again when it would expire within this.
    renew_before_s: int = 3600
    #: Validity published for the key in ``/v2/key``, from the key file's date.
    key_valid_for_s: int = 365 * 86400

    @property
    def max_query_bytes(self) -> int:
        """A ``/v2/query`` body of ``max_batch`` targets with every field fits."""
        return self.max_batch * V2_BYTES_PER_TARGET + 256


@dataclass(frozen=True, slots=True)
class LogConfig:
    """The transparency log of the v2 statements (docs/log.md, "The notary's
    log"): with ``enabled`` (and v2 served) every statement the notary signs
    is appended to an append-only Merkle log kept in the store, and served
    as tiles under ``/v2/log/``."""

    enabled: bool = False
    #: The checkpoints' origin line and their signature's key name (a
    #: schema-less URL naming this notary's log, e.g. ``notary.example.org/v2/log``).
    origin: str = ""
    #: Pending statements are sequenced, and a checkpoint signed over them,
    #: at least this often.
    checkpoint_interval_s: float = 1.0
    #: What a statement promises: it is in the log within this many seconds
    #: of its ``signed_at`` (its ``log.merge_by``).
    max_merge_delay_s: int = 60
    #: Statements signed but not yet sequenced, at most (beyond: a v2 query
    #: needing a new statement is answered 503 until the log catches up).
    max_pending: int = 100_000
    #: Witnesses asked to cosign each new checkpoint (docs/log.md "Witnesses"):
    #: a list of tables ``{url = "https://host:port/v2/witness", key =
    #: "<witness vkey>", pin = "<SHA-1 of its TLS certificate, hex>"}``.
    witnesses: tuple[LogWitness, ...] = ()
    #: One exchange with a witness (connect, TLS, request, answer), at most.
    witness_timeout_s: float = 5.0
    #: A witness that failed is asked again after at most this long.
    witness_retry_s: float = 60.0
    #: Cosignatures the operator promises on the checkpoint of every answer
    #: (the bundle's ``min_witnesses``): ``/v2/log/checkpoint`` serves the
    #: newest checkpoint cosigned by this many witnesses, and a v2 answer
    #: waits up to ``witness_wait_s`` for its statements to be proven
    #: against one. 0: nothing promised, nothing waited for.
    min_cosignatures: int = 0
    #: How long a v2 answer waits for its statements' cosigned checkpoint
    #: (with ``min_cosignatures``); then it is answered as it is.
    witness_wait_s: float = 5.0
    #: A target's v2 statement is signed again (so logged) for a change of
    #: its observations at most this many times an hour, and as many at
    #: once (a token bucket per target); first statements and renewals are
    #: not counted (docs/storage.md "What the notary keeps"). 0: no such limit.
    statements_per_target_per_hour: float = 12.0

    def shared_by(self, workers: int) -> LogConfig:
        """One worker's share of ``statements_per_target_per_hour`` when
        ``workers`` processes serve (each signs its own statements)."""
        if workers <= 1 or not self.statements_per_target_per_hour:
            return self
        return replace(
            self, statements_per_target_per_hour=self.statements_per_target_per_hour / workers
        )

    def bundle_log(self, v2_public_raw: bytes) -> BundleLog | None:
        """What the notary's bundle pins of this log (its ``log`` member):
        the origin, the verifier key of the v2 key ``v2_public_raw`` under
        that name, and the witnesses' cosigner keys; None when it is off."""
        if not self.enabled:
            return None
        return BundleLog.of(
            self.origin, v2_public_raw, tuple(w.key for w in self.witnesses),
            min_witnesses=self.min_cosignatures,
        )


@dataclass(frozen=True, slots=True)
class LogWitness:
    """One entry of ``[log] witnesses``: the witness's submission prefix
    (``url``, where ``/add-checkpoint`` is posted), its cosigner ``key``
    (a C2SP vkey of type 0x04) and the SHA-1 ``pin`` of its TLS
    certificate (a witness is a notary: pinned as bundles pin notaries)."""

    url: str
    key: str
    pin: str


@dataclass(frozen=True, slots=True)
class WitnessConfig:
    """The notary as a witness of other logs (C2SP tlog-witness; docs/log.md
    "Witnesses"): with ``enabled`` (and v2 served) ``POST
    /v2/witness/add-checkpoint`` cosigns, with the v2 key, checkpoints of
    the ``logs`` it is given, and those of the ``bundles``, with a
    consistency proof from the last one it cosigned."""

    enabled: bool = False
    #: The cosignatures' key name (a schema-less URL naming this witness).
    name: str = ""
    #: The logs witnessed: their Ed25519 signed-note vkeys
    #: (``origin+keyid+base64``; the key name is the log's origin).
    logs: tuple[str, ...] = ()
    #: ``.notary`` files, or directories of them, whose logs (their ``log``
    #: member's key) are witnessed too; re-read on SIGHUP. A path or a list.
    bundles: tuple[Path, ...] = ()


@dataclass(frozen=True, slots=True)
class WebSocketConfig:
    """The v2 WebSocket (``/v2/ws`` on the API ports, with v2)."""

    max_message_bytes: int = 64 * 1024
    max_watches: int = 100
    max_connections_per_address: int = 16
    #: Messages queued for one client; a client that lets it fill is closed.
    send_queue_messages: int = 64
    ping_interval_s: float = 30.0
    ping_timeout_s: float = 10.0
    idle_timeout_s: float = 300.0


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """The process model: workers under a supervisor, and their lifecycle."""

    #: Worker processes; 0 means one per CPU the process may run on.
    workers: int = 0
    #: On SIGTERM/SIGINT: how long in-flight requests and tunnels may take
    #: to finish, and the writer to flush, before the worker is killed.
    graceful_timeout_s: float = 30.0
    #: A worker that dies is restarted after this delay, doubled for each
    #: death within a minute of its start, up to ``restart_max_delay_s``.
    restart_delay_s: float = 1.0
    restart_max_delay_s: float = 60.0
    #: A worker that sends no heartbeat for this long (its loop or its
    #: writer stuck) is killed and restarted.
    worker_timeout_s: float = 30.0
    #: Started as root: drop to this user and group once the listeners are
    #: bound ("" = stay as started). Ignored when not root.
    user: str = ""
    group: str = ""

    @property
    def database_file_mode(self) -> int:
        """The database files' mode: group-readable when ``group`` is set."""
        return database_file_mode(self.group)


@dataclass(frozen=True, slots=True)
class AdminConfig:
    """The admin listener: ``/metrics``, ``/healthz``, ``/readyz`` (plain
    HTTP; keep it on loopback or a management network)."""

    listen: tuple[Endpoint, ...] = (Endpoint("127.0.0.1", 9142),)
    #: ``/readyz`` fails while more observations than this wait for the writer.
    max_writer_lag_rows: int = 5000
    #: How often each worker folds its counters into the exported metrics.
    metrics_interval_s: float = 1.0


#: The lists of verification backends a notary may run: perspective alone
#: (the default), DANE alone, or DANE where the site publishes secure TLSA
#: records and perspective elsewhere.
_BACKEND_LISTS = (("perspective",), ("dane",), ("dane", "perspective"))


@dataclass(frozen=True, slots=True)
class VerifyConfig:
    """How the notary verifies a target (issue 20)."""

    backends: tuple[str, ...] = ("perspective",)
    #: How long a DANE verdict is reused at most (the TLSA records' TTL
    #: bounds it first): a query after that checks the records again.
    dane_reuse_max_s: int = 3600
    #: How long a DANE verdict is reused at least: a TTL below it (0, or a
    #: denial without an SOA, which has no negative TTL) counts as this.
    dane_reuse_min_s: int = 30
    #: How long a verdict on a failed lookup (bogus, resolver failure) is
    #: reused: the retry interval of queries of a site whose DNSSEC fails.
    dane_failure_reuse_s: int = 30

    @property
    def dane(self) -> bool:
        return "dane" in self.backends


@dataclass(frozen=True, slots=True)
class DnsConfig:
    """The validating resolvers DANE trusts (their AD bit). Loopback ones,
    or addresses the operator lists in ``trusted`` (a path they control):
    start-up refuses any other for DANE."""

    resolvers: tuple[Endpoint, ...] = (Endpoint("127.0.0.1", 53),)
    #: Non-loopback resolver addresses whose path is trusted (an IPsec or
    #: WireGuard link to the operator's own resolver, say).
    trusted: tuple[str, ...] = ()
    #: One lookup's deadline.
    timeout_s: float = 2.0
    #: The name asked (SOA, with the DO and AD bits) to check that each
    #: resolver validates DNSSEC: its answer must carry the AD bit. The
    #: root by default; a lab with a private trust anchor names its zone.
    validation_check_name: str = "."
    #: A resolver answering that name without the AD bit stops ``notary
    #: serve`` (and makes ``/readyz`` fail later); false: a warning only.
    require_validation: bool = True
    #: How often each worker checks again (``/readyz`` reads the result).
    validation_recheck_s: float = 60.0


@dataclass(frozen=True, slots=True)
class Config:
    server: ServerConfig
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    answers: AnswerConfig = field(default_factory=AnswerConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    relay: RelayConfig = field(default_factory=RelayConfig)
    perspectives: PerspectivesConfig = field(default_factory=PerspectivesConfig)
    rescan: RescanConfig = field(default_factory=RescanConfig)
    v2: V2Config = field(default_factory=V2Config)
    websocket: WebSocketConfig = field(default_factory=WebSocketConfig)
    log: LogConfig = field(default_factory=LogConfig)
    witness: WitnessConfig = field(default_factory=WitnessConfig)
    node: NodeConfig = field(default_factory=NodeConfig)
    admin: AdminConfig = field(default_factory=AdminConfig)
    verify: VerifyConfig = field(default_factory=VerifyConfig)
    dns: DnsConfig = field(default_factory=DnsConfig)

    @property
    def api_body_bytes(self) -> int:
        """Largest request body the API handler reads: ``[http]
        max_body_bytes``, or a full ``/v2/query`` if larger."""
        return max(self.http.max_body_bytes, self.v2.max_query_bytes)

    @property
    def api_http(self) -> HttpConfig:
        """The ``[http]`` limits of the API listeners: with v2 served, the
        body limit fits a full ``/v2/query``."""
        if self.v2.key_file is None:
            return self.http
        return dataclasses.replace(self.http, max_body_bytes=self.api_body_bytes)

    @property
    def failure_delay_s(self) -> float:
        """When a failed probe is answered (``[answers] failures_at_deadline``):
        when a timed-out one would be, the probe deadline, within the
        query's; 0: at once."""
        if not self.answers.failures_at_deadline:
            return 0.0
        return min(self.probe.timeout_s, self.answers.query_timeout_s)


_SECTIONS = {
    "server": ServerConfig,
    "probe": ProbeConfig,
    "answers": AnswerConfig,
    "http": HttpConfig,
    "limits": LimitsConfig,
    "cache": CacheConfig,
    "store": StoreConfig,
    "relay": RelayConfig,
    "perspectives": PerspectivesConfig,
    "rescan": RescanConfig,
    "v2": V2Config,
    "websocket": WebSocketConfig,
    "log": LogConfig,
    "witness": WitnessConfig,
    "node": NodeConfig,
    "admin": AdminConfig,
    "verify": VerifyConfig,
    "dns": DnsConfig,
}
_LOG_LEVELS = ("debug", "info", "warning", "error")
_LOG_FORMATS = ("text", "json", "logfmt")
_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
_RELAY_MODES = tuple(mode.value for mode in RelayMode)


def load_config(path: Path | None, overrides: dict[str, dict[str, Any]] | None = None) -> Config:
    """Read ``path`` (if given), apply ``overrides`` (section -> key -> value,
    already typed), validate, and return the config.

    Paths in the file are relative to the file's directory.
    """
    raw: dict[str, Any] = {}
    base = Path(".")
    if path is not None:
        path = Path(path)
        try:
            with path.open("rb") as f:
                raw = tomllib.load(f)
        except OSError as exc:
            raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config {path} is not valid TOML: {exc}") from None
        base = path.parent
    for name in raw:
        if name not in _SECTIONS:
            raise ConfigError(f"unknown config section [{name}]")
    sections: dict[str, Any] = {}
    for name, cls in _SECTIONS.items():
        values = raw.get(name, {})
        if not isinstance(values, dict):
            raise ConfigError(f"[{name}] must be a table")
        values = dict(values)
        if name == "server":
            for key in ("key_file", "cert_file", "db_file", "bundle_file"):
                if isinstance(values.get(key), str):
                    values[key] = base / values[key]
        if name in ("perspectives", "v2") and isinstance(values.get("key_file"), str):
            values["key_file"] = base / values["key_file"]
        if name == "witness" and isinstance(values.get("bundles"), str):
            values["bundles"] = [values["bundles"]]  # one path, as a list of one
        if name in ("relay", "witness") and isinstance(values.get("bundles"), list):
            values["bundles"] = [
                base / v if isinstance(v, str) else v for v in values["bundles"]
            ]
        values.update((overrides or {}).get(name, {}))
        sections[name] = _build(name, cls, values)
    config = Config(**sections)
    _validate(config)
    return config


def _build(section: str, cls: type, values: dict[str, Any]) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in values.items():
        if key not in fields:
            raise ConfigError(f"unknown key {key!r} in [{section}]")
        kwargs[key] = _coerce(section, key, str(fields[key].type), value)
    missing = [
        name
        for name, f in fields.items()
        if name not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"[{section}] needs {', '.join(missing)}")
    return cls(**kwargs)


def _coerce(section: str, key: str, annotation: str, value: Any) -> Any:
    where = f"[{section}] {key}"
    if annotation in ("Path", "Path | None"):
        if value is None and annotation.endswith("None"):
            return None
        if not isinstance(value, str | Path):
            raise ConfigError(f"{where} must be a file path")
        return Path(value)
    if annotation == "tuple[Endpoint, ...]":
        if isinstance(value, str) or not isinstance(value, list | tuple):
            raise ConfigError(f"{where} must be a list of HOST:PORT strings")
        return tuple(
            v if isinstance(v, Endpoint) else parse_endpoint(str(v), what=where) for v in value
        )
    if annotation == "tuple[Path, ...]":
        if isinstance(value, str) or not isinstance(value, list | tuple):
            raise ConfigError(f"{where} must be a list of paths")
        if not all(isinstance(v, str | Path) for v in value):
            raise ConfigError(f"{where} must be a list of paths")
        return tuple(Path(v) for v in value)
    if annotation == "tuple[str, ...]":
        if isinstance(value, str) or not isinstance(value, list | tuple):
            raise ConfigError(f"{where} must be a list of strings")
        return tuple(str(v) for v in value)
    if annotation == "tuple[LogWitness, ...]":
        if isinstance(value, str) or not isinstance(value, list | tuple):
            raise ConfigError(f"{where} must be a list of {{url, key, pin}} tables")
        witnesses = []
        for entry in value:
            if isinstance(entry, LogWitness):
                witnesses.append(entry)
                continue
            if not isinstance(entry, dict) or set(entry) != {"url", "key", "pin"} or not all(
                isinstance(v, str) for v in entry.values()
            ):
                raise ConfigError(f"{where}: each witness is {{url, key, pin}}, all strings")
            witnesses.append(LogWitness(**entry))
        return tuple(witnesses)
    if annotation == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false")
        return value
    if annotation == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer")
        return value
    if annotation == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where} must be a number")
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):  # nan/inf: TOML allows them, timeouts must not
            raise ConfigError(f"{where} must be a finite number")
        return number
    if annotation == "str":
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string")
        return value
    raise AssertionError(f"no coercion for {annotation}")  # a new field type needs one


#: The keys of each section that must be greater than 0.
_POSITIVE = {
    "probe": (
        "timeout_s", "max_concurrent", "max_handshake_bytes", "max_addresses",
        "samples_per_address",
    ),
    "answers": ("fresh_for_s", "query_timeout_s"),
    "http": tuple(f.name for f in dataclasses.fields(HttpConfig)),
    "limits": (
        "max_connections_per_address", "max_connections_per_prefix", "query_burst",
        "probe_burst", "destination_probe_burst", "log_burst_bytes", "max_tracked",
    ),
    "cache": ("max_entries", "max_bytes", "bloom_expected_items"),
    "store": (
        "batch_rows", "batch_interval_ms", "queue_rows", "merge_window_s",
        "max_certificates_per_target", "max_runs_per_certificate", "forget_unasked_after_s",
        "feed_interval_ms", "feed_max_rows",
    ),
    "websocket": tuple(f.name for f in dataclasses.fields(WebSocketConfig)),
    "log": (
        "checkpoint_interval_s", "max_merge_delay_s", "max_pending", "witness_timeout_s",
        "witness_retry_s", "witness_wait_s",
    ),
    "v2": ("max_batch", "statement_valid_for_s", "renew_before_s", "key_valid_for_s"),
    "rescan": tuple(
        f.name for f in dataclasses.fields(RescanConfig) if f.name != "enabled"
    ),
    "node": (
        "graceful_timeout_s", "restart_delay_s", "restart_max_delay_s", "worker_timeout_s",
    ),
    "admin": ("max_writer_lag_rows", "metrics_interval_s"),
    "dns": ("timeout_s", "validation_recheck_s"),
    "verify": ("dane_reuse_max_s", "dane_reuse_min_s", "dane_failure_reuse_s"),
    "relay": (
        "head_timeout_s", "connect_timeout_s", "idle_timeout_s", "max_lifetime_s",
        "max_tunnels", "max_header_bytes", "max_headers", "max_destinations",
        "buffer_bytes", "linger_timeout_s",
    ),
}


def _validate(config: Config) -> None:
    """Raise ``ConfigError`` naming the first key out of range."""
    for section, keys in _POSITIVE.items():
        for key in keys:
            value = getattr(getattr(config, section), key)
            if value is not None and value <= 0:  # None: off (set in code only)
                raise ConfigError(f"[{section}] {key} must be greater than 0")
    if config.answers.reprobe_after_s < 0:
        raise ConfigError("[answers] reprobe_after_s must be 0 or more")
    _validate_probe(config.probe)
    _validate_limits(config)
    _validate_server_and_node(config)
    _validate_store_cache_v2(config)
    _validate_relay(config.relay)
    _validate_verify(config)
    _validate_log(config)
    _validate_witness(config)


#: What a checkpoint origin may hold: printable ASCII without spaces or "+"
#: (the origin is also the signed-note key name, C2SP signed-note).
_ORIGIN_RE = re.compile(r"[!-*,-~]{1,200}")


#: Witnesses a log asks at most: the log's signature and theirs fit in a
#: note's ``tlog.MAX_NOTE_SIGNATURES`` (32) lines.
MAX_LOG_WITNESSES = 31


def _validate_log(config: Config) -> None:
    log = config.log
    if not log.enabled:
        return
    if config.v2.key_file is None:
        raise ConfigError("[log] enabled needs v2 ([v2] key_file): the log holds v2 statements")
    if not _ORIGIN_RE.fullmatch(log.origin):
        raise ConfigError(
            "[log] origin must name the log: 1-200 printable ASCII characters, no space or '+'"
        )
    if log.statements_per_target_per_hour < 0:
        raise ConfigError("[log] statements_per_target_per_hour must be 0 (off) or more")
    if log.max_merge_delay_s < 2 * log.checkpoint_interval_s:
        raise ConfigError(
            "[log] max_merge_delay_s must be at least twice checkpoint_interval_s"
        )
    for witness in log.witnesses:
        _validate_log_witness(witness)
    if len(log.witnesses) > MAX_LOG_WITNESSES:
        raise ConfigError(
            f"[log] witnesses: at most {MAX_LOG_WITNESSES} (a checkpoint's note holds "
            f"{MAX_LOG_WITNESSES + 1} signature lines)"
        )
    if len({w.key for w in log.witnesses}) != len(log.witnesses):
        raise ConfigError("[log] witnesses must not list a witness's key twice")
    if not 0 <= log.min_cosignatures <= len(log.witnesses):
        raise ConfigError(
            f"[log] min_cosignatures must be 0 to the number of [log] witnesses "
            f"({len(log.witnesses)})"
        )


_SHA1_PIN = re.compile(r"[0-9A-Fa-f]{2}(?::?[0-9A-Fa-f]{2}){19}")


def _validate_log_witness(witness: LogWitness) -> None:
    """A ``[log] witnesses`` entry: an https URL with a host, a type-0x04
    vkey, a 20-byte hex pin (colons allowed)."""
    from urllib.parse import urlsplit

    try:
        url = urlsplit(witness.url)
        url.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        url = None
    if url is None or url.scheme != "https" or not url.hostname or url.query or url.fragment:
        raise ConfigError(
            f"[log] witnesses: url {witness.url!r} must be https://host[:port]/prefix"
        )
    try:
        tlog.parse_cosigner_key(witness.key)
    except tlog.NoteError as exc:
        raise ConfigError(f"[log] witnesses: key {witness.key!r}: {exc}") from None
    if not _SHA1_PIN.fullmatch(witness.pin):
        raise ConfigError(
            f"[log] witnesses: pin {witness.pin!r} must be the SHA-1 of the witness's "
            "certificate in hex (colons allowed)"
        )


def _validate_witness(config: Config) -> None:
    witness = config.witness
    if not witness.enabled:
        return
    if config.v2.key_file is None:
        raise ConfigError("[witness] enabled needs v2 ([v2] key_file): it cosigns with the v2 key")
    if config.server.db_file is None and config.store.backend != "postgresql":
        raise ConfigError("[witness] enabled needs a store: it keeps what it cosigned there")
    if not _ORIGIN_RE.fullmatch(witness.name):
        raise ConfigError(
            "[witness] name must name the witness: 1-200 printable ASCII characters, "
            "no space or '+'"
        )
    if not witness.logs and not witness.bundles:
        raise ConfigError(
            "[witness] needs logs (the vkeys of the logs it witnesses) or bundles "
            "(bundles naming them)"
        )
    try:
        tlog.witnessed_logs(witness.logs)
    except tlog.NoteError as exc:
        raise ConfigError(f"[witness] logs: {exc}") from None


def _validate_verify(config: Config) -> None:
    """The backends' list is one of ``_BACKEND_LISTS``; DANE trusts only
    loopback or listed resolvers."""
    backends = config.verify.backends
    if backends not in _BACKEND_LISTS:
        choices = " or ".join(str(list(choice)).replace("'", '"') for choice in _BACKEND_LISTS)
        raise ConfigError(f"[verify] backends must be {choices}")
    if config.verify.dane_reuse_min_s > config.verify.dane_reuse_max_s:
        raise ConfigError("[verify] dane_reuse_min_s must be at most dane_reuse_max_s")
    if not config.verify.dane:
        return
    if not config.dns.resolvers:
        raise ConfigError("[dns] resolvers must name a validating resolver for DANE")
    _validate_check_name(config.dns.validation_check_name)
    for endpoint in config.dns.resolvers:
        address = ipaddress.ip_address(endpoint.host)
        if not address.is_loopback and endpoint.host not in config.dns.trusted:
            raise ConfigError(
                f"[dns] resolver {endpoint} is neither loopback nor in [dns] trusted: DANE "
                "trusts a resolver's AD bit only over a path the operator controls"
            )


def _validate_check_name(name: str) -> None:
    """``[dns] validation_check_name``: a DNS name in ASCII, taken as
    absolute (``"."``: the root)."""
    import dns.exception
    import dns.name

    try:
        if not name:
            raise dns.exception.DNSException
        dns.name.from_text(name.encode("ascii"))
    except (UnicodeEncodeError, dns.exception.DNSException):
        raise ConfigError(
            f"[dns] validation_check_name {name!r} is not a DNS name"
        ) from None


#: Upper bounds of ``[probe]`` keys: one probe's connections are at most
#: ``max_addresses`` (and a client's address hint) times ``samples_per_address``.
MAX_PROBE_ADDRESSES = 64
MAX_SAMPLES_PER_ADDRESS = 16


def _validate_probe(probe: ProbeConfig) -> None:
    if probe.max_addresses > MAX_PROBE_ADDRESSES:
        raise ConfigError(
            f"[probe] max_addresses must be at most {MAX_PROBE_ADDRESSES} "
            "(each address is a connection of every probe)"
        )
    if probe.samples_per_address > MAX_SAMPLES_PER_ADDRESS:
        raise ConfigError(
            f"[probe] samples_per_address must be at most {MAX_SAMPLES_PER_ADDRESS} "
            "(each sample is a connection)"
        )
    if probe.address_memory_s < 0:
        raise ConfigError(
            "[probe] address_memory_s must be 0 (no address hint is ever probed) or more"
        )


def _validate_limits(config: Config) -> None:
    limits = config.limits
    for key in (
        "queries_per_s_per_prefix", "probes_per_s_per_prefix", "probes_per_minute_per_target",
        "probes_per_s_per_destination_prefix", "log_bytes_per_s_per_prefix",
    ):
        if getattr(limits, key) < 0:
            raise ConfigError(f"[limits] {key} must be 0 (off) or more")
    if limits.max_connections_per_prefix < limits.max_connections_per_address:
        raise ConfigError(
            "[limits] max_connections_per_prefix must be at least max_connections_per_address"
        )
    if (
        config.v2.key_file is not None and limits.queries_per_s_per_prefix > 0
        and limits.query_burst < config.v2.max_batch
    ):
        raise ConfigError(
            "[limits] query_burst must be at least [v2] max_batch (a query counts one per target)"
        )
    try:
        Exemptions.from_cidrs(limits.exempt_clients)
    except ConfigError as exc:
        raise ConfigError(f"[limits] exempt_clients: {exc}") from None


def _validate_server_and_node(config: Config) -> None:
    if config.server.log_level.lower() not in _LOG_LEVELS:
        raise ConfigError(f"[server] log_level must be one of {', '.join(_LOG_LEVELS)}")
    if config.server.log_format not in _LOG_FORMATS:
        raise ConfigError(f"[server] log_format must be one of {', '.join(_LOG_FORMATS)}")
    if config.node.workers < 0:
        raise ConfigError("[node] workers must be 0 (one per CPU) or more")
    if config.node.restart_max_delay_s < config.node.restart_delay_s:
        raise ConfigError("[node] restart_max_delay_s must be at least restart_delay_s")
    if not config.server.api:
        raise ConfigError("[server] api needs at least one HOST:PORT")
    try:
        AddressPolicy.from_cidrs(config.server.allow_targets)
    except ConfigError as exc:
        raise ConfigError(f"[server] allow_targets: {exc}") from None
    try:
        AddressPolicy.from_cidrs((), config.server.opt_out)
    except ConfigError as exc:
        raise ConfigError(f"[server] opt_out: {exc}") from None
    try:
        AddressPolicy.from_cidrs(config.server.proxy_protocol_from)
    except ConfigError as exc:
        raise ConfigError(f"[server] proxy_protocol_from: {exc}") from None
    if config.server.proxy_protocol_from and not config.server.plain_api:
        raise ConfigError(
            "[server] proxy_protocol_from needs [server] plain_api: the PROXY header is "
            "read on the plain API listeners only"
        )


def _validate_store_cache_v2(config: Config) -> None:
    if config.store.backend not in ("sqlite", "postgresql"):
        raise ConfigError('[store] backend must be "sqlite" or "postgresql"')
    if config.store.backend == "sqlite" and config.server.db_file is None:
        raise ConfigError("[server] needs db_file")
    if config.store.backend == "postgresql" and not config.store.dsn:
        raise ConfigError('[store] backend = "postgresql" needs [store] dsn')
    if config.store.backend == "postgresql":
        _validate_dsn(config.store.dsn)
    if config.store.synchronous.upper() not in _SYNCHRONOUS:
        raise ConfigError(f"[store] synchronous must be one of {', '.join(_SYNCHRONOUS)}")
    if config.store.max_certificate_bytes < 0:
        raise ConfigError("[store] max_certificate_bytes must be 0 (never keep the DER) or more")
    forget_s = config.store.forget_unasked_after_s
    if config.rescan.enabled and forget_s is not None and forget_s < config.rescan.forget_after_s:
        raise ConfigError(
            "[store] forget_unasked_after_s must be at least [rescan] forget_after_s "
            "(a target still rescanned must not be removed)"
        )
    try:
        bloom_parameters(config.cache.bloom_expected_items, config.cache.bloom_false_positive_rate)
    except ValueError as exc:
        raise ConfigError(f"[cache] {exc}") from None
    if config.v2.renew_before_s >= config.v2.statement_valid_for_s:
        raise ConfigError("[v2] renew_before_s must be less than statement_valid_for_s")


def _validate_dsn(dsn: str) -> None:
    """libpq must read ``dsn`` as written; the message never quotes it (a
    password may be in it). Without psycopg installed nothing is checked
    here: opening the store says what is missing."""
    from notary.state.dsn import check_dsn

    try:
        check_dsn(dsn)
    except ImportError:
        return
    except ValueError as exc:
        raise ConfigError(f"[store] dsn is {exc}") from None


def _validate_relay(relay: RelayConfig) -> None:
    if relay.destinations not in _RELAY_MODES:
        raise ConfigError(f"[relay] destinations must be one of {', '.join(_RELAY_MODES)}")
    if not 1 <= relay.dial_port <= 65535:
        raise ConfigError("[relay] dial_port must be a port number 1-65535")
    try:
        AddressPolicy.from_cidrs(relay.allow_addresses)
    except ConfigError as exc:
        raise ConfigError(f"[relay] allow_addresses: {exc}") from None
