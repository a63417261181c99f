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
and flush duration) are observed where they happen, into :class:`Timings`,
which the prober and the writer are given when built: once per probe or
batch, never per query.

Every metric is one row of :data:`METRICS`: its name, type, help, labels,
gauge mode or buckets, and what it reads (an attribute of a component's
``statistics()`` snapshot, or a small function of it). Adding a metric is
adding a row.

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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Any, Literal, Protocol

import trio
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest, values
from prometheus_client import Counter as PrometheusCounter
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from notary import __version__
from notary.model.dane import DaneOutcome
from notary.outbound.logappender import LogAppender
from notary.outbound.probe import HINT_OUTCOMES, Prober
from notary.outbound.writer import Storage
from notary.server.logapi import LogPages
from notary.server.parking import Parking
from notary.server.relay import RelayHandler
from notary.server.websocket import WebSocketCounts
from notary.service.abuse import AbuseControls
from notary.service.dane import DaneChecker
from notary.service.query import QueryService
from notary.service.records import Records
from notary.service.scheduler import RescanScheduler
from notary.service.stored_targets import StoredTargets
from notary.state.cache import IMPLEMENTATION as CACHE_IMPLEMENTATION
from notary.state.cache import BloomStatistics, LRUCache

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
    """A listener's connection counts (``notary.server.accept.ConnectionCounts``)."""

    open_connections: int
    refused_connections: int
    tls_handshakes: int
    tls_resumed: int
    proxy_refused: int


class Signer(Protocol):
    signatures_made: int


class Timings:
    """The histograms of :data:`METRICS`, observed where durations happen:
    the prober calls :meth:`probe_done` once per probe, the store writer
    :meth:`batch_written` once per committed batch. Made before them (and
    before :class:`NotaryMetrics`, which registers the histograms in its
    exposition, in table order). Never raises."""

    def __init__(self) -> None:
        if multiprocess_dir() is not None:
            _use_multiprocess_values()
        #: The histograms by name, not registered in any registry yet.
        self.histograms: dict[str, Histogram] = {}
        for spec in METRICS:
            if spec.kind == "histogram":
                metric = self.histograms[spec.name] = spec.make_histogram(None)
                for value in spec.prebound:
                    metric.labels(value)
        probe = self.histograms["notary_probe_duration_seconds"]
        self._probe_seconds = (probe.labels("success"), probe.labels("failure"))
        self._batch_rows = self.histograms["notary_writer_batch_rows"]
        self._flush_seconds = self.histograms["notary_writer_flush_seconds"]

    def probe_done(self, seconds: float, reason: str | None) -> None:
        """A probe ended after ``seconds``; ``reason``: its failure, None: success."""
        self._probe_seconds[reason is not None].observe(seconds)

    def batch_written(self, rows: int, seconds: float) -> None:
        """A batch of ``rows`` observations was committed in ``seconds``."""
        self._batch_rows.observe(rows)
        self._flush_seconds.observe(seconds)


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


#: Where a metric's value comes from: ``read`` applied to the source's
#: snapshot (see ``NotaryMetrics._snapshot``).
Read = Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One exported metric. ``read`` maps its ``source``'s snapshot to a
    number, to a mapping of label values to numbers, or to None (unchanged);
    a counter advances to it, a gauge is set to it. Histograms have no
    ``read``: :class:`Timings` observes them. ``prebound``: label values counted
    from 0 before they happen; ``mode``: a gauge's multiprocess mode."""

    name: str
    kind: Literal["counter", "gauge", "histogram"]
    source: str
    read: Read | None
    help: str
    labels: tuple[str, ...] = ()
    mode: str = ""
    buckets: tuple[float, ...] = ()
    prebound: tuple[str, ...] = ()

    def make(self, registry: CollectorRegistry | None) -> MetricWrapperBase:
        """The prometheus-client metric, registered in ``registry``."""
        if self.kind == "counter":
            return PrometheusCounter(self.name, self.help, self.labels, registry=registry)
        if self.kind == "gauge":
            return Gauge(
                self.name, self.help, self.labels, registry=registry,
                multiprocess_mode=self.mode,  # type: ignore[arg-type]
            )
        return self.make_histogram(registry)

    def make_histogram(self, registry: CollectorRegistry | None) -> Histogram:
        """The prometheus-client histogram of a ``histogram`` spec."""
        assert self.kind == "histogram", self.name
        return Histogram(self.name, self.help, self.labels, registry=registry, buckets=self.buckets)


def _reader(read: str | Read) -> Read:
    """An attribute name read as ``attrgetter``; a function as it is."""
    return attrgetter(read) if isinstance(read, str) else read


def _counter(
    name: str, source: str, read: str | Read, text: str, labels: tuple[str, ...] = (),
    prebound: tuple[str, ...] = (),
) -> MetricSpec:
    """A row of a counter (exported as ``<name>_total``)."""
    return MetricSpec(name, "counter", source, _reader(read), text, labels, prebound=prebound)


def _gauge(
    name: str, mode: str, source: str, read: str | Read, text: str, labels: tuple[str, ...] = (),
) -> MetricSpec:
    """A row of a gauge; ``mode``: how workers' values combine."""
    return MetricSpec(name, "gauge", source, _reader(read), text, labels, mode)


def _histogram(
    name: str, buckets: tuple[float, ...], text: str, labels: tuple[str, ...] = (),
    prebound: tuple[str, ...] = (),
) -> MetricSpec:
    """A row of a histogram, observed by :class:`Timings`."""
    return MetricSpec(name, "histogram", "timings", None, text, labels, "", buckets, prebound)


def _tls_handshakes(listeners: Mapping[str, ConnectionCounts]) -> dict[str, int]:
    resumed = sum(c.tls_resumed for c in listeners.values())
    return {"true": resumed, "false": sum(c.tls_handshakes for c in listeners.values()) - resumed}


def _same(snapshot: Any) -> Any:
    return snapshot


def _bloom(read: Callable[[BloomStatistics], float]) -> Read:
    """``read`` of the stored-targets filter, None (unchanged) until it is loaded."""
    return lambda stored: None if stored.bloom is None else read(stored.bloom)


#: Every metric, in the order of the exposition. Sources: ``queries`` (the
#: query service, handlers and WebSocket), ``cache``, ``stored``, ``prober``,
#: ``storage``, ``signers``, ``listeners``, ``relay``, ``websocket``,
#: ``abuse``, ``scheduler``, ``dane``, ``log``, ``log_pages``, ``witnessing``,
#: ``witness`` (the last nine absent when not served),
#: ``uptime``, ``start`` (set once) and ``timings`` (histograms).
METRICS: tuple[MetricSpec, ...] = (
    _counter("notary_queries", "queries", _same, "Queries answered, by protocol and HTTP status "
             "(requests refused as malformed included).", ("protocol", "status")),
    _counter("notary_cache_hits", "cache", "hits", "Cache lookups that found the target (a query "
             "that is not answered at once looks up again)."),
    _counter("notary_cache_misses", "cache", "misses", "Cache lookups that missed (lookups, not "
             "queries: a new target's query looks up three times)."),
    _counter("notary_cache_evictions", "cache", "evictions",
             "Cache entries dropped to stay within the bounds."),
    _counter("notary_cache_rejected", "cache", "rejected",
             "Records too large for the cache, not stored."),
    _gauge("notary_cache_entries", "livesum", "cache", "entries", "Records in the cache."),
    _gauge("notary_cache_size_bytes", "livesum", "cache", "bytes",
           "Estimated bytes of the cached records."),
    _gauge("notary_cache_max_entries", "livesum", "cache", "max_entries",
           "Bound on records in the cache."),
    _gauge("notary_cache_max_bytes", "livesum", "cache", "max_bytes",
           "Bound on bytes of the cache."),
    _counter("notary_bloom_negatives", "stored", "skipped_reads", "Cache misses the known-targets "
             "filter answered 'never seen' without a store read."),
    _gauge("notary_bloom_loaded", "livemin", "stored", lambda stored: 1 if stored.loaded else 0,
           "1 when the known-targets filter is loaded from the store and in use (always 0 under "
           "workers: they share the store and read it on every cache miss)."),
    _gauge("notary_bloom_fill_ratio", "livemax", "stored",
           _bloom(lambda bloom: bloom.bits_set / bloom.bits),
           "Share of the known-targets filter's bits set."),
    _gauge("notary_bloom_false_positive_ratio", "livemax", "stored",
           _bloom(attrgetter("estimated_false_positive_rate")),
           "Estimated false-positive rate of the known-targets filter now."),
    _counter("notary_probes", "prober", lambda p: {"success": p.succeeded, **p.failures},
             "Probes ended, by outcome: success or the failure reason.", ("outcome",),
             ("success", *PROBE_FAILURE_REASONS)),
    _counter("notary_probe_tls_versions", "prober", "tls_versions", "Handshakes that showed a "
             "certificate, by the TLS version the target negotiated.", ("version",),
             PROBE_TLS_VERSIONS),
    _counter("notary_probe_connections", "prober", "connections", "Connections made to "
             "targets: each address of a probe, each sample."),
    _counter("notary_probe_handshakes", "prober", "handshakes",
             "Handshakes that showed a certificate."),
    _counter("notary_probe_address_failures", "prober", "address_failures", "Addresses of "
             "probes where no handshake showed a certificate, by reason (in probes that saw a "
             "certificate at another address too).", ("reason",), PROBE_FAILURE_REASONS),
    _counter("notary_probe_address_hints", "prober", "hints", "Clients' address hints (a v2 "
             "entry's address), by outcome: added to the probe, present among the addresses "
             "probed already, or ignored (not from the notary's own resolution lately, or "
             "refused by the policy).", ("outcome",), HINT_OUTCOMES),
    _gauge("notary_probe_remembered_addresses", "livesum", "prober", "remembered",
           "Addresses the prober remembers its resolutions returned (address hints)."),
    _counter("notary_dane_checks", "dane", "checked", "DANE checks made (a TLSA lookup judged "
             "beside a probe), by outcome.", ("outcome",), tuple(o.value for o in DaneOutcome)),
    _counter("notary_log_appended", "log", "appended", "Statements this worker appended to the "
             "notary's transparency log."),
    _counter("notary_log_appended_bytes", "log", "appended_bytes", "Bytes of the entries this "
             "worker appended to the log (kept for good: docs/storage.md)."),
    _counter("notary_log_statements_deferred", "records", lambda r: {
        "target": r.deferred_target, "client": r.deferred_client,
    }, "Changes of a target's v2 statement not signed (so not logged) when asked for, the "
       "statement signed before served instead, by the budget that was spent: the target's "
       "([log] statements_per_target_per_hour) or the asking client's "
       "([limits] log_bytes_per_s_per_prefix).", ("budget",), ("target", "client")),
    _counter("notary_log_statements_refused", "records", "refused_client", "First v2 statements "
             "of a target not signed for a client over its log budget (answered without one)."),
    _counter("notary_log_refused_too_large", "log", "refused_too_large", "Statements not "
             "served because their entry is longer than a log entry may be (65,535 bytes)."),
    _counter("notary_log_batches", "log", "batches",
             "Batches appended to the log (each with its signed checkpoint)."),
    _counter("notary_log_failed_batches", "log", "failed_batches",
             "Log batches that failed (retried), or found the stored log corrupted."),
    _gauge("notary_log_size", "livemax", "log", "size",
           "Entries in the log, as its newest checkpoint says."),
    _gauge("notary_log_pending", "livesum", "log", "pending",
           "Signed statements waiting to be appended to the log."),
    _counter("notary_log_pages", "log_pages", lambda p: {"shared": p.shared_hits, "made": p.made},
             "Log pages (/v2/log/) answered, by whether their response was shared (a full tile "
             "made before) or made for the request.", ("response",), ("shared", "made")),
    _gauge("notary_log_pages_shared_bytes", "livesum", "log_pages", "shared_bytes",
           "Bytes of the shared responses of full log tiles kept."),
    _gauge("notary_log_pages_held_bytes", "livesum", "log_pages", "in_flight.held_bytes",
           "Bytes of log page responses not yet sent (each shared response once)."),
    _gauge("notary_log_pages_held_responses", "livesum", "log_pages", "in_flight.held_responses",
           "Log page responses not yet sent."),
    _counter("notary_log_pages_refused", "log_pages", lambda p: {
        "client": p.in_flight.refused_client, "process": p.in_flight.refused_process,
    }, "Log page requests refused for the bytes held for slow readers, by scope (client: "
       "429; process: 503).", ("scope",), ("client", "process")),
    _counter("notary_log_witness_submissions", "witnessing", "submissions", "Checkpoints this "
             "worker submitted to the log's witnesses (as the holder of a witness's turn: one "
             "worker per witness in a notary), 409 answers and retries included."),
    _counter("notary_log_cosignatures", "witnessing", "cosignatures", "Witness cosignatures of "
             "the log's checkpoints this worker received, verified and stored."),
    _counter("notary_log_witness_failures", "witnessing", "failures", "Exchanges with the "
             "log's witnesses that failed (unreachable, a refusal, a bad cosignature)."),
    _gauge("notary_log_witnessed_size", "livemax", "witnessing", "witnessed_size", "Size of the "
           "newest checkpoint cosigned by [log] min_cosignatures (at least 1) witnesses."),
    _counter("notary_log_statements_witnessed", "witnessing", "rebased", "Statements whose "
             "inclusion was proven again against a cosigned checkpoint."),
    _counter("notary_log_statements_unwitnessed", "witnessing", "abandoned", "Statements given "
             "up on while waiting for a cosigned checkpoint (too many waiting)."),
    _gauge("notary_log_statements_awaiting_witnesses", "livesum", "witnessing", "awaiting",
           "Statements waiting for a cosigned checkpoint to cover them."),
    _counter("notary_log_answers_unwitnessed", "witnessing", "unwitnessed_answers", "v2 answers "
             "sent after [log] witness_wait_s with a statement not yet on a cosigned checkpoint."),
    _counter("notary_witness_cosigned", "witness", "cosigned", "Checkpoints of other logs this "
             "worker cosigned as their witness ([witness])."),
    _counter("notary_witness_refused", "witness", lambda w: {
        str(status): count for status, count in w.refused.items()
    }, "add-checkpoint requests this witness refused, by HTTP status (409: not from the size "
       "held; 422: not consistent with it, a fork).", ("status",),
       ("400", "403", "404", "409", "413", "422", "503")),
    _counter("notary_witness_views", "witness", "views", "Views (GET /v2/witness/view/...) "
             "served."),
    _counter("notary_witness_views_made", "witness", "views_made", "Views made afresh (a store "
             "read and a signature each; the others were cached)."),
    _gauge("notary_witness_logs", "livemax", "witness", "logs",
           "Logs this witness witnesses now ([witness] logs and bundles)."),
    _counter("notary_probes_coalesced", "records", "coalesced", "Probe requests that joined a "
             "probe already running for their target."),
    _gauge("notary_probes_in_flight", "livesum", "prober", "in_flight",
           "Probe connections holding a slot ([probe] max_concurrent)."),
    _gauge("notary_probes_queued", "livesum", "prober", "queued",
           "Probe connections waiting for a slot."),
    _histogram("notary_probe_duration_seconds", PROBE_DURATION_BUCKETS_S, "Time from a probe's "
               "start (queueing for a slot included) to its result.", ("result",),
               ("success", "failure")),
    _gauge("notary_writer_queue_rows", "livesum", "storage", "queued",
           "Observations waiting for the store writer."),
    _gauge("notary_writer_failing", "livemax", "storage", lambda w: 1 if w.failing else 0,
           "1 while the writer's batch in hand has failed and waits to be retried."),
    _counter("notary_writer_committed_rows", "storage", "committed",
             "Observations committed to the store."),
    _counter("notary_writer_batches", "storage", "batches", "Batches committed."),
    _counter("notary_writer_failed_batches", "storage", "failed_batches",
             "Batch writes that failed (each is retried)."),
    _counter("notary_writer_producer_waits", "storage", "producer_waits",
             "Observations that waited for room in the full writer queue."),
    _histogram("notary_writer_batch_rows", BATCH_ROWS_BUCKETS,
               "Observations per committed batch."),
    _histogram("notary_writer_flush_seconds", FLUSH_DURATION_BUCKETS_S,
               "Time of a batch's successful write transaction."),
    _counter("notary_signatures", "signers",
             lambda signers: {kind: s.signatures_made for kind, s in signers.items()},
             "Signatures made, by kind of key.", ("kind",)),
    _gauge("notary_http_connections", "livesum", "listeners",
           lambda listeners: {kind: c.open_connections for kind, c in listeners.items()},
           "Open HTTP connections, by listener.", ("listener",)),
    _counter("notary_http_refused_connections", "listeners",
             lambda listeners: {kind: c.refused_connections for kind, c in listeners.items()},
             "Connections closed at once because the listener had as many as allowed, "
             "by listener.", ("listener",)),
    _counter("notary_http_proxy_refused_connections", "listeners",
             lambda listeners: {
                 kind: c.proxy_refused for kind, c in listeners.items() if kind == "plain_api"
             },
             "Connections to the plain API listener closed for their PROXY protocol header "
             "(missing, bad or late from an edge of [server] proxy_protocol_from, or sent "
             "from elsewhere), by listener.", ("listener",)),
    _gauge("notary_http_parked_connections", "livesum", "parking", "parked",
           "Keep-alive connections parked between requests (notary.server.parking)."),
    _counter("notary_http_parked_answers", "parking", "served",
             "Requests answered on parked connections, without waking their tasks."),
    _counter("notary_http_parked_handbacks", "parking", "handed_back",
             "Parked connections handed back to their tasks (a miss, another "
             "request, an error, a timeout, the end)."),
    _counter("notary_tls_handshakes", "listeners", _tls_handshakes,
             "TLS handshakes completed on the API listeners, by whether they resumed a "
             "session (a ticket, or a TLS 1.2 session id).", ("resumed",), ("true", "false")),
    _gauge("notary_relay_connections", "livesum", "relay", "connections",
           "Open relay connections, in any phase."),
    _gauge("notary_relay_tunnels_open", "livesum", "relay", "tunnels",
           "Established relay tunnels."),
    _counter("notary_relay_tunnels_opened", "relay", "tunnels_opened", "Relay tunnels opened."),
    _counter("notary_relay_refused", "relay", "refused", "Relay requests refused, by reason.",
             ("reason",), RELAY_REFUSAL_REASONS),
    _counter("notary_relay_bytes", "relay", lambda r: {
        "to_destination": r.bytes_to_destinations, "to_client": r.bytes_to_clients,
    }, "Bytes relayed, by direction.", ("direction",), ("to_destination", "to_client")),
    _gauge("notary_websocket_connections", "livesum", "websocket", "connections",
           "Open v2 WebSocket connections."),
    _gauge("notary_websocket_watches", "livesum", "websocket", "watches",
           "Targets watched, over all WebSocket connections."),
    _counter("notary_websocket_events_published", "websocket", "events_published",
             "Certificate changes pushed to watchers."),
    _counter("notary_limits_connections_refused", "abuse", lambda a: {
        "address": a.connections_refused_address, "prefix": a.connections_refused_prefix,
    }, "Connections refused (HTTP and relay) because their client address or prefix had too "
       "many open, by scope.", ("scope",), ("address", "prefix")),
    _counter("notary_limits_queries_refused", "abuse", "queries_refused", "Queries refused with "
             "429: the client prefix over queries_per_s_per_prefix."),
    _counter("notary_limits_probes_refused", "abuse", lambda a: {
        "client": a.probes_refused_client, "target": a.probes_refused_target,
        "destination": a.probes_refused_destination, "log": a.probes_refused_log,
    }, "On-demand probes refused, by the limit that refused them (client, log: 429, the "
       "client's probe or log budget; target, destination: answered as a failed probe).",
       ("limit",), ("client", "target", "destination", "log")),
    _gauge("notary_limits_tracked_entries", "livesum", "abuse", "tracked", "Entries in each rate "
           "table (each at most [limits] max_tracked per worker).", ("table",)),
    _gauge("notary_scheduler_targets", "livemax", "scheduler", "targets_known",
           "Targets the rescan scheduler keeps fresh."),
    _gauge("notary_scheduler_due_targets", "livemax", "scheduler", "due_now",
           "Known targets due for a rescan and not started."),
    _gauge("notary_scheduler_overdue_targets", "livemax", "scheduler", "overdue",
           "Known targets last observed longer ago than [rescan] max_staleness_s."),
    _gauge("notary_scheduler_probes_in_flight", "livesum", "scheduler", "in_flight",
           "Rescan probes running."),
    _counter("notary_scheduler_probes_started", "scheduler", "probes_started",
             "Rescan probes started."),
    _counter("notary_scheduler_probe_failures", "scheduler", "failures",
             "Rescan probes failed, by reason.", ("reason",)),
    _counter("notary_scheduler_held_back", "scheduler", "held_back",
             "Checks at which a due rescan waited for on-demand probes."),
    _counter("notary_scheduler_deferred", "scheduler", "deferred_by_prefix",
             "Rescan starts put off by the per-prefix limit."),
    _counter("notary_scheduler_forgotten_targets", "scheduler", "forgotten",
             "Targets forgotten (idle or evicted)."),
    _counter("notary_scheduler_shared_skips", "scheduler", "shared_skips", "Rescans not made: "
             "another worker had observed the target within its interval (workers only)."),
    _gauge("notary_start_time_seconds", "livemin", "start", lambda _: time.time(),
           "Unix time the (oldest live) worker started."),
    _gauge("notary_uptime_seconds", "livemax", "uptime", _same,
           "Seconds since the (oldest live) worker started."),
    _gauge("notary_workers", "livesum", "start", lambda _: 1,
           "Live worker processes serving the node."),
    _gauge("notary_build_info", "livemax", "start",
           lambda _: {(__version__, CACHE_IMPLEMENTATION): 1},
           "The notary's version and cache implementation (always 1).", ("version", "cache")),
)


class NotaryMetrics:
    """The metrics of one notary (one worker); see the module docstring.

    ``signers``: the notary's signers by kind (``convergence``,
    ``perspectives``, ``v2``); the protocols pre-bound in
    ``notary_queries_total`` follow from them. ``relay``, ``scheduler``,
    ``websocket`` (the WebSocket service's counts) and ``abuse``: None when
    not served (their metrics are then absent). ``listeners``: each
    listener's connection counts by kind (``api``, ``plain_api``,
    ``perspectives``, ``admin``); ``rejections``: the handlers' refused
    queries ((protocol, status) -> count), added to ``notary_queries_total``;
    ``timings``: the histograms the prober and the writer observe (a
    fresh one when None).

    Resource handling: borrows every component it reads and owns nothing but
    its prometheus-client metrics. In the multiprocess mode the values live in files of ``multiprocess_path``,
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
        stored: StoredTargets,
        storage: Storage,
        prober: Prober,
        records: Records,
        relay: RelayHandler | None = None,
        scheduler: RescanScheduler | None = None,
        dane: DaneChecker | None = None,
        log: LogAppender | None = None,
        log_pages: LogPages | None = None,
        witnessing: Any = None,
        witness: Any = None,
        websocket: WebSocketCounts | None = None,
        parking: Parking | None = None,
        signers: Mapping[str, Signer] | None = None,
        abuse: AbuseControls | None = None,
        listeners: Mapping[str, ConnectionCounts] | None = None,
        rejections: Sequence[Counter[tuple[str, int]]] = (),
        timings: Timings | None = None,
    ) -> None:
        self._service = service
        self._websocket = websocket
        #: The components whose ``statistics()`` are folded, by source name.
        self._components: dict[str, Any] = {
            "cache": cache, "stored": stored, "prober": prober, "records": records,
            "storage": storage,
            "relay": relay, "websocket": websocket, "abuse": abuse, "scheduler": scheduler,
            "dane": dane, "log": log, "log_pages": log_pages, "witnessing": witnessing,
            "witness": witness, "parking": parking,
        }
        self._signers = dict(signers or {})
        self._listeners = dict(listeners or {})
        self._rejections = tuple(rejections)
        self.timings = timings if timings is not None else Timings()
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
        self._folded: dict[tuple[MetricWrapperBase, tuple[str, ...]], list] = {}
        self._scheduler_folded_at = -float("inf")
        self._started_monotonic = time.monotonic()
        self._metrics: dict[str, MetricWrapperBase] = {}
        #: source -> its metrics folded from it, in table order
        self._sources: dict[str, list[tuple[MetricSpec, MetricWrapperBase]]] = {}
        self._declare(registry)

    def _declare(self, registry: CollectorRegistry | None) -> None:
        """Make every metric of ``METRICS`` whose source is served."""
        for spec in METRICS:
            if spec.source in self._components and self._components[spec.source] is None:
                continue  # a component not served
            if spec.kind == "histogram":
                histogram = self._metrics[spec.name] = self.timings.histograms[spec.name]
                if registry is not None:
                    registry.register(histogram)
                continue
            metric = self._metrics[spec.name] = spec.make(registry)
            for value in spec.prebound:
                self._prebind(metric, (value,))
            if spec.source == "start":
                self._fold_into(((spec, metric),), None)
            elif spec.read is not None:
                self._sources.setdefault(spec.source, []).append((spec, metric))
        served = {"convergence"} | ({"perspectives", "v2"} & set(self._signers))
        if self._websocket is not None:
            served.add("websocket")
        for protocol in sorted(served):
            for status in COMMON_STATUSES[protocol]:
                self._bind(self._metrics["notary_queries"], (protocol, str(status)))
        for kind in self._signers:
            self._bind(self._metrics["notary_signatures"], (kind,))
        for kind in self._listeners:
            self._prebind(self._metrics["notary_http_connections"], (kind,))
            self._prebind(self._metrics["notary_http_refused_connections"], (kind,))

    # ---------------------------------------------------------------- folding

    def _prebind(self, metric: MetricWrapperBase, labels: tuple[str, ...]) -> None:
        """Make ``metric{labels}`` appear before anything is counted in it."""
        if isinstance(metric, PrometheusCounter):
            self._bind(metric, labels)
        else:
            metric.labels(*labels)

    def _bind(self, metric: MetricWrapperBase, labels: tuple[str, ...]) -> list:
        folded = self._folded.get((metric, labels))
        if folded is None:
            child = metric.labels(*labels) if labels else metric
            folded = self._folded[metric, labels] = [child, 0]
        return folded

    def _advance(self, metric: MetricWrapperBase, total: float, *labels: str) -> None:
        """Bring ``metric{labels}`` to the cumulative ``total``."""
        folded = self._bind(metric, labels)
        if total > folded[1]:
            folded[0].inc(total - folded[1])
        folded[1] = total

    def fold(self) -> None:
        """Copy every component's counters into the metrics (see the module
        docstring). Synchronous, in the Trio thread: it reads state the
        event loop mutates."""
        now = time.monotonic()
        for source, rows in self._sources.items():
            if source == "scheduler":
                if now - self._scheduler_folded_at < SCHEDULER_FOLD_INTERVAL_S:
                    continue
                self._scheduler_folded_at = now
            self._fold_into(rows, self._snapshot(source, now))

    def _snapshot(self, source: str, now: float) -> Any:
        """What the metrics of ``source`` read from."""
        if source == "queries":
            return self._query_totals()
        if source == "signers":
            return self._signers
        if source == "listeners":
            return self._listeners
        if source == "uptime":
            return now - self._started_monotonic
        return self._components[source].statistics()

    def _fold_into(
        self, rows: Iterable[tuple[MetricSpec, MetricWrapperBase]], snapshot: Any
    ) -> None:
        for spec, metric in rows:
            assert spec.read is not None
            value = spec.read(snapshot)
            if value is None:
                continue
            for key, number in value.items() if isinstance(value, Mapping) else [((), value)]:
                labels = key if isinstance(key, tuple) else (key,)
                if spec.kind == "counter":
                    self._advance(metric, number, *labels)
                else:
                    gauge = metric.labels(*labels) if labels else metric
                    assert isinstance(gauge, Gauge), spec.name
                    gauge.set(number)

    def _query_totals(self) -> Counter[tuple[str, str]]:
        """Queries answered and refused, by (protocol, status)."""
        totals: Counter[tuple[str, int]] = Counter()
        for protocol, by_status in self._service.answered.items():
            for status, count in by_status.items():
                totals[protocol, status] += count
        for rejected in self._rejections:
            totals.update(rejected)
        if self._websocket is not None:
            for status, count in self._websocket.statistics().rejected_queries.items():
                totals["websocket", status] += count
        return Counter({(protocol, str(status)): n for (protocol, status), n in totals.items()})

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
