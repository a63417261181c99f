"""Prometheus metrics of a notary, and the multiprocess plumbing for
``notary serve --workers N``.

Counting stays off the query path. The components keep plain Python counters
(their ``statistics()``, ``QueryService.answered``, the handlers'
``rejected``) and :meth:`NotaryMetrics.fold` copies them into
prometheus-client metrics: a counter advances by the delta since the previous
fold, a gauge is set. Folding runs every ``[admin] metrics_interval_s``
(:meth:`NotaryMetrics.serve_folding`) and once more before each scrape, so a
scrape of a single process is exact, but for the scheduler's figures: they
cost time linear in its targets (tens of ms at 100k) and are folded at most
every ``SCHEDULER_FOLD_INTERVAL_S``. Histograms (probe duration, writer batch size
and flush duration) are observed where they happen, through the
``Prober.on_probe_done`` and ``Storage.on_batch`` hooks: once per probe or
batch, never per query.

Two modes, chosen by the environment variable ``PROMETHEUS_MULTIPROC_DIR``
(read by ``serve_notary`` through :func:`multiprocess_dir`):

* **Unset: one process.** Each notary has its own ``CollectorRegistry`` (not
  prometheus-client's global one), so several notaries in one process (tests)
  do not collide; ``/metrics`` renders it.
* **Set: workers.** The supervisor calls :func:`prepare_multiprocess_dir`
  before it starts workers and :func:`worker_exited` for each worker that
  ends. Each worker writes its values to its own files in that directory
  (``<type>_<pid>.db``, prometheus-client's multiprocess mode) and
  ``/metrics``, whichever worker takes the connection, renders the aggregate
  of every file with ``MultiProcessCollector``:

  - counters and histograms are summed over every worker since the directory
    was prepared, the dead ones included, so node totals never go back when
    a worker is restarted;
  - every gauge has a ``live*`` mode, so a dead worker's gauges vanish once
    :func:`worker_exited` ran: ``livesum`` for what adds up across workers
    (open connections, probes in flight and queued, writer queue rows, cache
    entries and bytes: each worker has its own cache and writer, live
    workers); ``livemax`` where a sum would be wrong: the scheduler's target
    figures (each worker schedules the targets asked of it, which overlap:
    the largest worker's), bloom fill, the writer-failing flag, uptime,
    build info; ``livemin`` for the start time (the oldest live worker) and
    "bloom loaded" (workers have no filter: 0).

Limits of the multiprocess mode: the values of the workers other than the one
answering are as old as their last fold (at most ``metrics_interval_s``);
one notary per process (two in one process would write the same file
entries); ``/readyz`` answers for the worker that took the connection. In
either mode there are no ``process_*`` series (CPU, memory): the standard
collector sees one process only; take them from the host or the cgroup.

``notary_cache_hits_total`` and ``notary_cache_misses_total`` count the LRU's
lookups, not queries: a query the fast path cannot answer looks up again, and
so does the probe's result hook (a new target's query: three misses). Query
rates are ``notary_queries_total``; probes, ``notary_probes_total``.

Label values seen only at run time (a probe failure reason, an HTTP status,
a relay refusal reason outside the known sets) appear when first counted; the
known ones are pre-bound and start at 0.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import trio
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest, values
from prometheus_client import Counter as PrometheusCounter
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from notary import __version__
from notary.outbound.probe import Prober
from notary.outbound.writer import Storage
from notary.server.relay import RelayHandler
from notary.server.websocket import WebSocketService
from notary.service.abuse import AbuseControls
from notary.service.query import QueryService
from notary.service.scheduler import RescanScheduler
from notary.service.stored_targets import KnownTargets
from notary.state.cache import IMPLEMENTATION as CACHE_IMPLEMENTATION
from notary.state.cache import LRUCache

__all__ = [
    "CONTENT_TYPE",
    "MULTIPROC_DIR_ENV",
    "NotaryMetrics",
    "multiprocess_dir",
    "multiprocess_exposition",
    "prepare_multiprocess_dir",
    "worker_exited",
]

MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: The Prometheus text format ``generate_latest`` writes.
CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
#: The scheduler's statistics are folded at most this often.
SCHEDULER_FOLD_INTERVAL_S = 10.0

PROBE_DURATION_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0)
FLUSH_DURATION_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
BATCH_ROWS_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
#: ``ProbeError.reason`` values (``notary.errors``), pre-bound.
PROBE_FAILURE_REASONS = ("refused", "dns", "connect", "handshake", "timeout", "error")
#: The TLS versions a probe may negotiate, as OpenSSL names them (pre-bound).
PROBE_TLS_VERSIONS = ("TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3")
#: ``RelayStatistics.refused`` reasons, pre-bound.
RELAY_REFUSAL_REASONS = (
    "busy", "malformed", "timeout", "forbidden", "untrusted", "policy", "unreachable", "off",
)
#: Statuses pre-bound per protocol (others appear when first counted).
COMMON_STATUSES = {
    "convergence": (200, 409, 503),
    "perspectives": (200, 404),
    "v2": (200,),
    "websocket": (200,),
}


class ConnectionCounts(Protocol):
    """A listener's connection handler, as ``app.ConnectionHandler``."""

    open_connections: int
    refused_connections: int


class Signer(Protocol):
    signatures_made: int


def multiprocess_dir() -> Path | None:
    """The directory of the workers' metric files (``PROMETHEUS_MULTIPROC_DIR``),
    None in the one-process mode."""
    value = os.environ.get(MULTIPROC_DIR_ENV)
    return Path(value) if value else None


def prepare_multiprocess_dir(path: Path) -> None:
    """For the supervisor, before it starts any worker: create ``path``
    (mode 0700) or empty it of a previous run's files, and set
    ``PROMETHEUS_MULTIPROC_DIR`` to it in this process's environment, so every
    worker started afterwards (forked or spawned) writes its metrics there.

    Error handling: ``OSError`` when the directory cannot be made or emptied.
    """
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    for stale in path.glob("*.db"):
        stale.unlink()
    os.environ[MULTIPROC_DIR_ENV] = str(path)
    _use_multiprocess_values()


def worker_exited(pid: int, path: Path | None = None) -> None:
    """For the supervisor, once worker ``pid`` has ended (any cause, before a
    replacement is counted on): its live gauges leave the aggregate; its
    counters and histograms stay in the totals. ``path``: the directory
    (default: ``PROMETHEUS_MULTIPROC_DIR``). Never raises for a worker that
    left no files."""
    directory = path if path is not None else multiprocess_dir()
    if directory is not None:
        mark_process_dead(pid, str(directory))


def multiprocess_exposition(path: Path) -> bytes:
    """The text exposition of every worker's metrics in ``path``."""
    return generate_latest(_multiprocess_registry(path))


def _multiprocess_registry(path: Path) -> CollectorRegistry:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(path))
    return registry


def _use_multiprocess_values() -> None:
    # prometheus-client chooses where values live when it is first imported;
    # a process that imported it before the variable was set would keep them
    # in memory (and so would the workers it forks). Choose again.
    if not getattr(values.ValueClass, "_multiprocess", False):
        values.ValueClass = values.MultiProcessValue()


class NotaryMetrics:
    """The metrics of one notary (one worker); see the module docstring.

    ``signers``: the notary's signers by kind (``convergence``,
    ``perspectives``, ``v2``); the protocols pre-bound in
    ``notary_queries_total`` follow from them. ``relay``, ``scheduler`` and
    ``websocket``: None when not served (their metrics are then absent).
    Listeners and handlers' rejection counters are added with
    :meth:`watch_listener` and :meth:`watch_rejections`.

    Resource handling: borrows every component it reads and owns nothing but
    its prometheus-client metrics. The constructor installs its histogram
    hooks as ``prober.on_probe_done`` and ``storage.on_batch``. In the
    multiprocess mode the values live in files of ``multiprocess_path``,
    which the supervisor owns.

    Error handling: nothing here raises once constructed (``fold`` only reads
    counters); ``ValueError`` from the constructor in the multiprocess mode
    when ``PROMETHEUS_MULTIPROC_DIR`` is not a directory.
    """

    def __init__(
        self,
        *,
        service: QueryService,
        cache: LRUCache,
        known: KnownTargets,
        storage: Storage,
        prober: Prober,
        relay: RelayHandler | None = None,
        scheduler: RescanScheduler | None = None,
        websocket: WebSocketService | None = None,
        signers: Mapping[str, Signer] | None = None,
        abuse: AbuseControls | None = None,
    ) -> None:
        self._service = service
        self._cache = cache
        self._known = known
        self._storage = storage
        self._prober = prober
        self._relay = relay
        self._scheduler = scheduler
        self._websocket = websocket
        self._abuse = abuse
        self._signers = dict(signers or {})
        self._listeners: dict[str, ConnectionCounts] = {}
        self._rejections: list[Counter[tuple[str, int]]] = []
        #: The workers' metric files (the multiprocess mode), or None.
        self.multiprocess_path = multiprocess_dir()
        registry: CollectorRegistry | None
        if self.multiprocess_path is None:
            registry = self._exposition = CollectorRegistry()
        else:
            _use_multiprocess_values()
            registry = None  # the values go to files; the collector reads them all
            self._exposition = _multiprocess_registry(self.multiprocess_path)
        self._render_limiter = trio.CapacityLimiter(1)
        #: counter and label values -> (its child, the total already folded in)
        self._folded: dict[tuple[PrometheusCounter, tuple[str, ...]], list] = {}
        self._scheduler_folded_at = -float("inf")
        self._started_monotonic = time.monotonic()

        def counter(name: str, text: str, labels: tuple[str, ...] = ()) -> PrometheusCounter:
            return PrometheusCounter(name, text, labels, registry=registry)

        def gauge(name: str, text: str, mode: str, labels: tuple[str, ...] = ()) -> Gauge:
            return Gauge(name, text, labels, registry=registry, multiprocess_mode=mode)  # type: ignore[arg-type]

        # -- queries
        self._queries = counter(
            "notary_queries", "Queries answered, by protocol and HTTP status "
            "(requests refused as malformed included).", ("protocol", "status"),
        )
        served = {"convergence"} | ({"perspectives", "v2"} & set(self._signers))
        if websocket is not None:
            served.add("websocket")
        for protocol in sorted(served):
            for status in COMMON_STATUSES[protocol]:
                self._bind(self._queries, (protocol, str(status)))
        # -- cache and bloom filter
        self._cache_hits = counter(
            "notary_cache_hits", "Cache lookups that found the target (a query that is "
            "not answered at once looks up again).",
        )
        self._cache_misses = counter(
            "notary_cache_misses", "Cache lookups that missed (lookups, not queries: a new "
            "target's query looks up three times).",
        )
        self._cache_evictions = counter(
            "notary_cache_evictions", "Cache entries dropped to stay within the bounds."
        )
        self._cache_rejected = counter(
            "notary_cache_rejected", "Records too large for the cache, not stored."
        )
        self._cache_entries = gauge("notary_cache_entries", "Records in the cache.", "livesum")
        self._cache_bytes = gauge(
            "notary_cache_size_bytes", "Estimated bytes of the cached records.", "livesum"
        )
        self._cache_max_entries = gauge(
            "notary_cache_max_entries", "Bound on records in the cache.", "livesum"
        )
        self._cache_max_bytes = gauge(
            "notary_cache_max_bytes", "Bound on bytes of the cache.", "livesum"
        )
        self._bloom_negatives = counter(
            "notary_bloom_negatives", "Cache misses the known-targets filter answered "
            "'never seen' without a store read.",
        )
        self._bloom_loaded = gauge(
            "notary_bloom_loaded", "1 when the known-targets filter is loaded from the "
            "store and in use (always 0 under workers: they share the store and read it "
            "on every cache miss).", "livemin",
        )
        self._bloom_fill = gauge(
            "notary_bloom_fill_ratio", "Share of the known-targets filter's bits set.", "livemax"
        )
        self._bloom_false_positives = gauge(
            "notary_bloom_false_positive_ratio", "Estimated false-positive rate of the "
            "known-targets filter now.", "livemax",
        )
        # -- probes
        self._probes = counter(
            "notary_probes", "Probes ended, by outcome: success or the failure reason.",
            ("outcome",),
        )
        for outcome in ("success", *PROBE_FAILURE_REASONS):
            self._bind(self._probes, (outcome,))
        self._probe_tls_versions = counter(
            "notary_probe_tls_versions", "Successful probes, by the TLS version the target "
            "negotiated.", ("version",),
        )
        for version in PROBE_TLS_VERSIONS:
            self._bind(self._probe_tls_versions, (version,))
        self._probes_coalesced = counter(
            "notary_probes_coalesced", "Probe requests that joined a probe already running "
            "for their target.",
        )
        self._probes_in_flight = gauge(
            "notary_probes_in_flight", "Probes holding a connection slot.", "livesum"
        )
        self._probes_queued = gauge(
            "notary_probes_queued", "Probes waiting for a connection slot.", "livesum"
        )
        probe_seconds = Histogram(
            "notary_probe_duration_seconds", "Time from a probe's start (queueing for a slot "
            "included) to its result.", ("result",), registry=registry,
            buckets=PROBE_DURATION_BUCKETS_S,
        )
        self._probe_succeeded_seconds = probe_seconds.labels("success")
        self._probe_failed_seconds = probe_seconds.labels("failure")
        prober.on_probe_done = self._observe_probe
        # -- writer
        self._writer_queue = gauge(
            "notary_writer_queue_rows", "Observations waiting for the store writer.", "livesum"
        )
        self._writer_failing = gauge(
            "notary_writer_failing", "1 while the writer's batch in hand has failed and "
            "waits to be retried.", "livemax",
        )
        self._writer_committed = counter(
            "notary_writer_committed_rows", "Observations committed to the store."
        )
        self._writer_batches = counter("notary_writer_batches", "Batches committed.")
        self._writer_failed = counter(
            "notary_writer_failed_batches", "Batch writes that failed (each is retried)."
        )
        self._writer_waits = counter(
            "notary_writer_producer_waits", "Observations that waited for room in the full "
            "writer queue.",
        )
        self._batch_rows = Histogram(
            "notary_writer_batch_rows", "Observations per committed batch.",
            registry=registry, buckets=BATCH_ROWS_BUCKETS,
        )
        self._flush_seconds = Histogram(
            "notary_writer_flush_seconds", "Time of a batch's successful write transaction.",
            registry=registry, buckets=FLUSH_DURATION_BUCKETS_S,
        )
        storage.on_batch = self._observe_batch
        # -- signatures
        self._signatures = counter(
            "notary_signatures", "Signatures made, by kind of key.", ("kind",)
        )
        for kind in self._signers:
            self._bind(self._signatures, (kind,))
        # -- connections
        self._http_connections = gauge(
            "notary_http_connections", "Open HTTP connections, by listener.", "livesum",
            ("listener",),
        )
        self._http_refused = counter(
            "notary_http_refused_connections", "Connections closed at once because the "
            "listener had as many as allowed, by listener.", ("listener",),
        )
        # -- relay
        if relay is not None:
            self._relay_connections = gauge(
                "notary_relay_connections", "Open relay connections, in any phase.", "livesum"
            )
            self._relay_tunnels = gauge(
                "notary_relay_tunnels_open", "Established relay tunnels.", "livesum"
            )
            self._relay_opened = counter("notary_relay_tunnels_opened", "Relay tunnels opened.")
            self._relay_refused = counter(
                "notary_relay_refused", "Relay requests refused, by reason.", ("reason",)
            )
            for reason in RELAY_REFUSAL_REASONS:
                self._bind(self._relay_refused, (reason,))
            self._relay_bytes = counter(
                "notary_relay_bytes", "Bytes relayed, by direction.", ("direction",)
            )
            for direction in ("to_destination", "to_client"):
                self._bind(self._relay_bytes, (direction,))
        # -- WebSocket
        if websocket is not None:
            self._ws_connections = gauge(
                "notary_websocket_connections", "Open v2 WebSocket connections.", "livesum"
            )
            self._ws_watches = gauge(
                "notary_websocket_watches", "Targets watched, over all WebSocket connections.",
                "livesum",
            )
            self._ws_events = counter(
                "notary_websocket_events_published", "Certificate changes pushed to watchers.",
            )
        # -- abuse controls ([limits])
        if abuse is not None:
            self._abuse_connections_refused = counter(
                "notary_limits_connections_refused", "Connections refused (HTTP and relay) "
                "because their client address or prefix had too many open, by scope.",
                ("scope",),
            )
            for scope in ("address", "prefix"):
                self._bind(self._abuse_connections_refused, (scope,))
            self._abuse_queries_refused = counter(
                "notary_limits_queries_refused", "Queries refused with 429: the client "
                "prefix over queries_per_s_per_prefix.",
            )
            self._abuse_probes_refused = counter(
                "notary_limits_probes_refused", "On-demand probes refused, by the limit that "
                "refused them (client: 429; target, destination: answered as a failed probe).",
                ("limit",),
            )
            for limit in ("client", "target", "destination"):
                self._bind(self._abuse_probes_refused, (limit,))
            self._abuse_tracked = gauge(
                "notary_limits_tracked_entries", "Entries in each rate table (each at most "
                "[limits] max_tracked per worker).", "livesum", ("table",),
            )
        # -- scheduler
        if scheduler is not None:
            self._scheduler_targets = gauge(
                "notary_scheduler_targets", "Targets the rescan scheduler keeps fresh.",
                "livemax",
            )
            self._scheduler_due = gauge(
                "notary_scheduler_due_targets", "Known targets due for a rescan and not started.",
                "livemax",
            )
            self._scheduler_overdue = gauge(
                "notary_scheduler_overdue_targets", "Known targets last observed longer ago "
                "than [rescan] max_staleness_s.", "livemax",
            )
            self._scheduler_in_flight = gauge(
                "notary_scheduler_probes_in_flight", "Rescan probes running.", "livesum"
            )
            self._scheduler_started = counter(
                "notary_scheduler_probes_started", "Rescan probes started."
            )
            self._scheduler_failures = counter(
                "notary_scheduler_probe_failures", "Rescan probes failed, by reason.",
                ("reason",),
            )
            self._scheduler_held_back = counter(
                "notary_scheduler_held_back", "Checks at which a due rescan waited for "
                "on-demand probes.",
            )
            self._scheduler_deferred = counter(
                "notary_scheduler_deferred", "Rescan starts put off by the per-prefix limit."
            )
            self._scheduler_forgotten = counter(
                "notary_scheduler_forgotten_targets", "Targets forgotten (idle or evicted)."
            )
            self._scheduler_shared_skips = counter(
                "notary_scheduler_shared_skips", "Rescans not made: another worker had "
                "observed the target within its interval (workers only).",
            )
        # -- process
        start_time = gauge(
            "notary_start_time_seconds", "Unix time the (oldest live) worker started.",
            "livemin",
        )
        start_time.set(time.time())
        self._uptime = gauge(
            "notary_uptime_seconds", "Seconds since the (oldest live) worker started.",
            "livemax",
        )
        gauge("notary_workers", "Live worker processes serving the node.", "livesum").set(1)
        gauge(
            "notary_build_info", "The notary's version and cache implementation (always 1).",
            "livemax", ("version", "cache"),
        ).labels(__version__, CACHE_IMPLEMENTATION).set(1)

    # ------------------------------------------------------------------ hooks

    def watch_listener(self, kind: str, connections: ConnectionCounts) -> None:
        """Export ``connections``' open and refused counts as listener ``kind``
        (``api``, ``plain_api``, ``perspectives``, ``admin``)."""
        self._listeners[kind] = connections
        self._http_connections.labels(kind)
        self._bind(self._http_refused, (kind,))

    def watch_rejections(self, rejected: Counter[tuple[str, int]]) -> None:
        """Add a handler's refused queries ((protocol, status) -> count) to
        ``notary_queries_total``."""
        self._rejections.append(rejected)

    def _observe_probe(self, seconds: float, reason: str | None) -> None:
        if reason is None:
            self._probe_succeeded_seconds.observe(seconds)
        else:
            self._probe_failed_seconds.observe(seconds)

    def _observe_batch(self, rows: int, seconds: float) -> None:
        self._batch_rows.observe(rows)
        self._flush_seconds.observe(seconds)

    # ---------------------------------------------------------------- folding

    def _bind(self, metric: PrometheusCounter, labels: tuple[str, ...]) -> list:
        folded = self._folded.get((metric, labels))
        if folded is None:
            child = metric.labels(*labels) if labels else metric
            folded = self._folded[metric, labels] = [child, 0]
        return folded

    def _advance(self, metric: PrometheusCounter, total: float, *labels: str) -> None:
        """Bring ``metric{labels}`` to the cumulative ``total``."""
        folded = self._bind(metric, labels)
        if total > folded[1]:
            folded[0].inc(total - folded[1])
        folded[1] = total

    def fold(self) -> None:
        """Copy every component's counters into the metrics (see the module
        docstring). Synchronous, in the Trio thread: it reads state the
        event loop mutates."""
        self._fold_queries()
        self._fold_cache()
        self._fold_probes()
        self._fold_writer()
        for kind, signer in self._signers.items():
            self._advance(self._signatures, signer.signatures_made, kind)
        for kind, connections in self._listeners.items():
            self._http_connections.labels(kind).set(connections.open_connections)
            self._advance(self._http_refused, connections.refused_connections, kind)
        if self._relay is not None:
            self._fold_relay(self._relay)
        if self._abuse is not None:
            self._fold_abuse(self._abuse)
        if self._websocket is not None:
            ws = self._websocket.statistics()
            self._ws_connections.set(ws.connections)
            self._ws_watches.set(ws.watches)
            self._advance(self._ws_events, ws.events_published)
        now = time.monotonic()
        if self._scheduler is not None and (
            now - self._scheduler_folded_at >= SCHEDULER_FOLD_INTERVAL_S
        ):
            self._scheduler_folded_at = now
            self._fold_scheduler(self._scheduler)
        self._uptime.set(now - self._started_monotonic)

    def _fold_queries(self) -> None:
        totals: Counter[tuple[str, int]] = Counter()
        for protocol, by_status in self._service.answered.items():
            for status, count in by_status.items():
                totals[protocol, status] += count
        for rejected in self._rejections:
            totals.update(rejected)
        if self._websocket is not None:
            for status, count in self._websocket.statistics().rejected_queries.items():
                totals["websocket", status] += count
        for (protocol, status), count in totals.items():
            self._advance(self._queries, count, protocol, str(status))

    def _fold_cache(self) -> None:
        cache = self._cache.statistics()
        self._advance(self._cache_hits, cache.hits)
        self._advance(self._cache_misses, cache.misses)
        self._advance(self._cache_evictions, cache.evictions)
        self._advance(self._cache_rejected, cache.rejected)
        self._cache_entries.set(cache.entries)
        self._cache_bytes.set(cache.bytes)
        self._cache_max_entries.set(cache.max_entries)
        self._cache_max_bytes.set(cache.max_bytes)
        known = self._known.statistics()
        self._advance(self._bloom_negatives, known.skipped_reads)
        self._bloom_loaded.set(1 if known.loaded else 0)
        if known.bloom is not None:
            self._bloom_fill.set(known.bloom.bits_set / known.bloom.bits)
            self._bloom_false_positives.set(known.bloom.estimated_false_positive_rate)

    def _fold_probes(self) -> None:
        probes = self._prober.statistics()
        self._advance(self._probes, probes.succeeded, "success")
        for reason, count in probes.failures.items():
            self._advance(self._probes, count, reason)
        for version, count in probes.tls_versions.items():
            self._advance(self._probe_tls_versions, count, version)
        self._advance(self._probes_coalesced, probes.coalesced)
        self._probes_in_flight.set(probes.in_flight)
        self._probes_queued.set(probes.queued)

    def _fold_writer(self) -> None:
        writer = self._storage.statistics()
        self._writer_queue.set(writer.queued)
        self._writer_failing.set(1 if writer.failing else 0)
        self._advance(self._writer_committed, writer.committed)
        self._advance(self._writer_batches, writer.batches)
        self._advance(self._writer_failed, writer.failed_batches)
        self._advance(self._writer_waits, writer.producer_waits)

    def _fold_relay(self, relay: RelayHandler) -> None:
        stats = relay.statistics()
        self._relay_connections.set(stats.connections)
        self._relay_tunnels.set(stats.tunnels)
        self._advance(self._relay_opened, stats.tunnels_opened)
        for reason, count in stats.refused.items():
            self._advance(self._relay_refused, count, reason)
        self._advance(self._relay_bytes, stats.bytes_to_destinations, "to_destination")
        self._advance(self._relay_bytes, stats.bytes_to_clients, "to_client")

    def _fold_abuse(self, abuse: AbuseControls) -> None:
        stats = abuse.statistics()
        self._advance(self._abuse_connections_refused, stats.connections_refused_address, "address")
        self._advance(self._abuse_connections_refused, stats.connections_refused_prefix, "prefix")
        self._advance(self._abuse_queries_refused, stats.queries_refused)
        self._advance(self._abuse_probes_refused, stats.probes_refused_client, "client")
        self._advance(self._abuse_probes_refused, stats.probes_refused_target, "target")
        self._advance(
            self._abuse_probes_refused, stats.probes_refused_destination, "destination"
        )
        for table, entries in stats.tracked.items():
            self._abuse_tracked.labels(table).set(entries)

    def _fold_scheduler(self, scheduler: RescanScheduler) -> None:
        stats = scheduler.statistics()
        self._scheduler_targets.set(stats.targets_known)
        self._scheduler_due.set(stats.due_now)
        self._scheduler_overdue.set(stats.overdue)
        self._scheduler_in_flight.set(stats.in_flight)
        self._advance(self._scheduler_started, stats.probes_started)
        for reason, count in stats.failures.items():
            self._advance(self._scheduler_failures, count, reason)
        self._advance(self._scheduler_held_back, stats.held_back)
        self._advance(self._scheduler_deferred, stats.deferred_by_prefix)
        self._advance(self._scheduler_forgotten, stats.forgotten)
        self._advance(self._scheduler_shared_skips, stats.shared_skips)

    async def serve_folding(
        self, interval_s: float, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Fold every ``interval_s`` until cancelled."""
        task_status.started()
        while True:
            self.fold()
            await trio.sleep(interval_s)

    # -------------------------------------------------------------- rendering

    def exposition(self) -> bytes:
        """The text exposition of what was last folded (this notary's, or
        every worker's in the multiprocess mode). Thread-safe."""
        return generate_latest(self._exposition)

    async def render(self) -> bytes:
        """Fold, then the exposition, made in a worker thread (reading the
        workers' files takes a while); one render at a time."""
        self.fold()
        return await trio.to_thread.run_sync(self.exposition, limiter=self._render_limiter)

    async def node_totals(self) -> dict[str, float]:
        """The node's totals behind the web page's live figures
        (``notary.service.figures``): queries answered, cache hits and misses,
        probes ended (every outcome), scheduler targets (absent when
        rescanning is off) and uptime. Folds first; in the multiprocess mode
        the sums are over every worker's files, read in a worker thread (one
        read at a time, as for ``render``)."""
        self.fold()
        wanted = {
            "notary_queries_total": "queries",
            "notary_cache_hits_total": "cache_hits",
            "notary_cache_misses_total": "cache_misses",
            "notary_probes_total": "probes",
            "notary_scheduler_targets": "targets_known",
            "notary_uptime_seconds": "uptime_s",
        }

        def read() -> dict[str, float]:
            totals: dict[str, float] = {}
            for metric in self._exposition.collect():
                for sample in metric.samples:
                    key = wanted.get(sample.name)
                    if key is not None:
                        totals[key] = totals.get(key, 0.0) + sample.value
            return totals

        if self.multiprocess_path is None:
            return read()
        return await trio.to_thread.run_sync(read, limiter=self._render_limiter)
