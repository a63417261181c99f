"""Reading the notary's Prometheus metrics in tests: the samples of an
exposition (``samples``, ``value``); stand-ins for the components
``NotaryMetrics`` reads, with counters a test sets (``stand_ins``,
``metrics_of``); and the two child programs of the multiprocess test
(``run_worker``, ``supervise``), run with ``python -c`` from the repository
root (``ROOT``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families

from notary.outbound.probe import ProbeStatistics
from notary.outbound.writer import StorageStatistics
from notary.server import metrics as metrics_module
from notary.server.metrics import NotaryMetrics, Timings
from notary.service.query import QUERY_PROTOCOLS
from notary.service.records import RecordsStatistics
from notary.service.stored_targets import StoredTargetsStatistics
from notary.state._cachecommon import CacheStatistics

ROOT = Path(__file__).resolve().parents[2]


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition: (name, sorted labels) -> value."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(text: str, name: str, **labels: str) -> float:
    return samples(text).get((name, tuple(sorted(labels.items()))), 0.0)


def stand_ins(**overrides) -> SimpleNamespace:
    """Components with the counters NotaryMetrics reads, settable by tests."""
    parts = SimpleNamespace(
        cache_stats=CacheStatistics(0, 0, 10, 1000, 0, 0, 0, 0),
        stored_stats=StoredTargetsStatistics(False, 0, 0, None),
        storage_stats=StorageStatistics(0, 0, 0, 0, 0),
        probe_stats=ProbeStatistics(0, 0, 0, {}),
        records_stats=RecordsStatistics(0, 0, 0),
    )
    parts.service = SimpleNamespace(answered={name: Counter() for name in QUERY_PROTOCOLS})
    parts.cache = SimpleNamespace(statistics=lambda: parts.cache_stats)
    parts.stored = SimpleNamespace(statistics=lambda: parts.stored_stats)
    parts.storage = SimpleNamespace(statistics=lambda: parts.storage_stats)
    parts.prober = SimpleNamespace(statistics=lambda: parts.probe_stats)
    parts.timings = Timings()
    parts.records = SimpleNamespace(statistics=lambda: parts.records_stats)
    parts.signer = SimpleNamespace(signatures_made=0)
    parts.listener = SimpleNamespace(open_connections=0, refused_connections=0,
                                     tls_handshakes=0, tls_resumed=0, proxy_refused=0)
    vars(parts).update(overrides)
    return parts


def metrics_of(
    parts: SimpleNamespace, rejections: tuple[Counter[tuple[str, int]], ...] = ()
) -> NotaryMetrics:
    return NotaryMetrics(
        service=parts.service, cache=parts.cache, stored=parts.stored, storage=parts.storage,
        prober=parts.prober, records=parts.records, signers={"convergence": parts.signer},
        listeners={"api": parts.listener}, rejections=rejections, timings=parts.timings,
    )


def run_worker(queries: int, open_connections: int) -> None:
    """A worker's part (in a child process): count, fold, leave."""
    parts = stand_ins()
    metrics = metrics_of(parts)
    parts.service.answered["convergence"][200] = queries
    parts.listener.open_connections = open_connections
    parts.timings.probe_done(0.2, None)
    metrics.fold()


def supervise(directory: str) -> None:
    """A supervisor (in a child process): prepare the directory, run one
    forked and one spawned worker, render the aggregate before and after the
    forked one is declared dead; print both renders and the pids as JSON."""
    import prometheus_client  # noqa: F401  (imported before the variable is set)

    path = Path(directory)
    path.mkdir()
    (path / "stale_123.db").write_bytes(b"left over from a previous run")
    metrics_module.prepare_multiprocess_dir(path)
    assert not (path / "stale_123.db").exists()
    forked = os.fork()
    if forked == 0:
        try:
            run_worker(3, 2)
        finally:
            os._exit(0)
    os.waitpid(forked, 0)
    spawned = subprocess.run(
        [sys.executable, "-c", "from tests.support.metrics import run_worker; run_worker(4, 5)"],
        cwd=ROOT, check=True,
    )
    assert spawned.returncode == 0
    both = metrics_module.multiprocess_exposition(path).decode()
    metrics_module.worker_exited(forked)
    one_left = metrics_module.multiprocess_exposition(path).decode()
    print(json.dumps({"both": both, "one_left": one_left}))
