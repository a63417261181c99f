"""``notary.server.metrics``: folding plain counters into Prometheus metrics,
against a running notary (loopback, port 0) and against stand-ins; the
multiprocess mode across real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from notary.config import Endpoint, LimitsConfig
from notary.model.ratelimit import RateLimited
from notary.outbound.probe import ProbeStatistics
from notary.protocol.convergence import format_fingerprint
from notary.server import metrics as metrics_module
from notary.server.metrics import NotaryMetrics
from notary.server.websocket import WebSocketLimits
from notary.service.abuse import AbuseControls, ProbeThrottled
from notary.service.records import RecordsStatistics
from notary.state import crypto
from notary.state._cachecommon import CacheStatistics
from tests.support.http_client import http_get
from tests.support.metrics import ROOT, metrics_of, samples, stand_ins, value
from tests.support.notaries import (
    LOCALHOST,
    client_context,
    legacy_query,
    open_notary,
    send_raw,
)
from tests.support.polling import wait_for
from tests.support.tls_targets import open_tls_target
from tests.support.websocket import Server, ask, open_client

NAME = "www.example.test"


async def scrape(notary) -> str:
    status, head, body = await http_get(notary.running.admin[0].port, "/metrics")
    assert status == 200
    assert b"Content-Type: text/plain; version=0.0.4" in head
    return body.decode()


# -- a running notary ---------------------------------------------------------------


async def test_query_counters_move_and_the_fast_path_is_counted(tmp_path, monkeypatch):
    # Without per-target probe spacing an unknown fingerprint is answered
    # from the cache for reprobe_after_s (60 s); with it, only within the
    # probe's own second, and a loaded machine crosses that second (flaky).
    limits = {"probes_per_minute_per_target": 0}
    async with open_tls_target(names=[NAME]) as site:
        async with open_notary(tmp_path, names={NAME: [site.host]}, limits=limits) as notary:
            service = notary.running.service
            at_once = []
            answer_at_once = service.answer_at_once

            def spy(*args):
                response = answer_at_once(*args)
                at_once.append(response is not None)
                return response

            monkeypatch.setattr(service, "answer_at_once", spy)
            before = await scrape(notary)
            labels = {"protocol": "convergence", "status": "200"}
            assert value(before, "notary_queries_total", **labels) == 0
            assert ("notary_queries_total", (("protocol", "convergence"), ("status", "409"))) in (
                samples(before)
            )  # pre-bound

            first = await legacy_query(notary.port, f"{NAME}+{site.port}", None)
            fp = format_fingerprint(bytes(20))
            second = await legacy_query(notary.port, f"{NAME}+{site.port}", None)
            third = await legacy_query(notary.port, f"{NAME}+{site.port}", fp)
            bad = await legacy_query(notary.port, f"{NAME}+0", None)
            assert (first.status, second.status, third.status, bad.status) == (200, 200, 409, 400)
            # The first was a cache miss (probed); the next two came from the
            # cache on the fast path, which answered and counted them.
            assert at_once == [False, True, True]
            assert service.answered["convergence"] == {200: 2, 409: 1}

            after = await scrape(notary)
            assert value(after, "notary_queries_total", **labels) == 2
            assert value(after, "notary_queries_total", protocol="convergence", status="409") == 1
            assert value(after, "notary_queries_total", protocol="convergence", status="400") == 1
            assert value(after, "notary_cache_hits_total") >= 2
            assert value(after, "notary_cache_misses_total") >= 1
            assert value(after, "notary_cache_entries") == 1
            assert value(after, "notary_probes_total", outcome="success") == 1
            assert value(after, "notary_probe_duration_seconds_count", result="success") == 1
            assert value(after, "notary_signatures_total", kind="convergence") >= 1
            assert value(after, "notary_http_connections", listener="admin") == 1  # this one
            assert value(after, "notary_workers") == 1
            assert value(after, "notary_uptime_seconds") > 0
            # A scrape again moves nothing but what happened in between.
            again = await scrape(notary)
            assert value(again, "notary_queries_total", **labels) == 2

            # A keep-alive connection parked between requests: its next hit is
            # answered there (notary.server.parking), and counted.
            tcp = await trio.open_tcp_stream(LOCALHOST, notary.port)
            stream = trio.SSLStream(
                tcp, client_context(), server_hostname=None, https_compatible=True
            )
            async with stream:
                await stream.do_handshake()

                async def parked() -> bool:
                    return value(await scrape(notary), "notary_http_parked_connections") == 1

                await wait_for(parked)
                await stream.send_all(
                    f"GET /target/{NAME}+{site.port} HTTP/1.1\r\nHost: n\r\n"
                    "Connection: close\r\n\r\n".encode()
                )
                answer = b""
                while chunk := await stream.receive_some(65536):
                    answer += chunk
            assert answer.startswith(b"HTTP/1.1 200 ")
            last = await scrape(notary)
            parked_answers = value(last, "notary_http_parked_answers_total")
            assert parked_answers == value(again, "notary_http_parked_answers_total") + 1
            assert value(last, "notary_http_parked_connections") == 0
            assert value(last, "notary_queries_total", **labels) == 3


async def test_v2_perspectives_and_websocket_are_counted_apart(tmp_path):
    v2_key = tmp_path / "v2.key"
    crypto.write_ed25519_private_key(v2_key, crypto.generate_ed25519_key())
    perspectives_key = tmp_path / "perspectives.key"
    crypto.write_new_file(
        perspectives_key, crypto.private_key_pem(crypto.generate_perspectives_key(1024)),
        mode=0o600,
    )
    perspectives = {"key_file": perspectives_key, "listen": (Endpoint(LOCALHOST, 0),)}
    async with open_tls_target(names=[NAME]) as site:
        async with open_notary(
            tmp_path / "n", names={NAME: [site.host]}, v2={"key_file": v2_key},
            perspectives=perspectives,
        ) as notary:
            body = json.dumps({"targets": [{"host": NAME, "port": site.port}]}).encode()
            post = (
                f"POST /v2/query HTTP/1.0\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode()
            assert (await send_raw(notary.port, post + body)).status == 200
            bad = post.replace(str(len(body)).encode(), b"2") + b"{}"
            assert (await send_raw(notary.port, bad)).status == 400
            port = notary.running.perspectives[0].port
            assert (await http_get(port, f"/?host={NAME}&port={site.port}"))[0] == 200
            assert (await http_get(port, "/?host=&port=1"))[0] == 400
            text = await scrape(notary)
    assert value(text, "notary_queries_total", protocol="v2", status="200") == 1
    assert value(text, "notary_queries_total", protocol="v2", status="400") == 1
    assert value(text, "notary_queries_total", protocol="perspectives", status="200") == 1
    assert value(text, "notary_queries_total", protocol="perspectives", status="400") == 1
    assert ("notary_queries_total", (("protocol", "websocket"), ("status", "200"))) in (
        samples(text)
    )
    assert value(text, "notary_signatures_total", kind="v2") >= 2  # statement and answer
    assert value(text, "notary_signatures_total", kind="perspectives") >= 1
    assert value(text, "notary_websocket_connections") == 0
    assert value(text, "notary_http_connections", listener="perspectives") == 0


async def test_websocket_statistics_count_connections_watches_and_rejections():
    server = Server(WebSocketLimits())
    async with open_client(server) as ws:
        await ask(ws, {"type": "watch", "id": 1, "host": "a.example.test", "port": 443})
        refused = await ask(ws, {"type": "query", "id": 2, "targets": "no"})
        assert refused["type"] == "error"
        await ask(ws, {"type": "nonsense"})
        stats = server.service.statistics()
        assert (stats.connections, stats.watches) == (1, 1)
        assert stats.rejected_queries == {400: 1}


async def test_writer_metrics_follow_committed_batches(tmp_path):
    async with open_tls_target(names=[NAME]) as site:
        async with open_notary(tmp_path, names={NAME: [site.host]}) as notary:
            await legacy_query(notary.port, f"{NAME}+{site.port}", None)
            storage = notary.running.storage

            async def committed() -> bool:
                return storage.statistics().committed >= 1

            await wait_for(committed)
            text = await scrape(notary)
            assert value(text, "notary_writer_committed_rows_total") == 1
            assert value(text, "notary_writer_batches_total") == 1
            assert value(text, "notary_writer_batch_rows_count") == 1
            assert value(text, "notary_writer_batch_rows_sum") == 1
            assert value(text, "notary_writer_flush_seconds_count") == 1
            assert value(text, "notary_writer_failing") == 0
            assert value(text, "notary_writer_queue_rows") == 0


async def test_periodic_folding(tmp_path, autojump_clock):
    """Between scrapes, the counters are folded every metrics_interval_s."""
    async with open_notary(tmp_path, admin={"listen": (), "metrics_interval_s": 5.0}) as notary:
        assert notary.running.admin == ()
        metrics = notary.running.metrics
        notary.running.service.answered["convergence"][200] = 3
        await trio.sleep(6)
        text = metrics.exposition().decode()
        assert value(text, "notary_queries_total", protocol="convergence", status="200") == 3


# -- stand-ins -----------------------------------------------------------------------


def test_counters_advance_by_the_delta_and_gauges_are_set() -> None:
    parts = stand_ins()
    rejected: Counter[tuple[str, int]] = Counter()
    metrics = metrics_of(parts, (rejected,))
    parts.service.answered["convergence"][200] = 5
    rejected["convergence", 400] = 2
    parts.cache_stats = CacheStatistics(3, 300, 10, 1000, 7, 1, 0, 0)
    parts.probe_stats = ProbeStatistics(4, 2, 1, {"timeout": 1, "dns": 1}, queued=2)
    parts.records_stats = RecordsStatistics(4, 1, 1)
    parts.listener.open_connections = 4
    parts.signer.signatures_made = 9
    metrics.fold()
    metrics.fold()  # folding twice counts nothing twice
    text = metrics.exposition().decode()
    assert value(text, "notary_queries_total", protocol="convergence", status="200") == 5
    assert value(text, "notary_queries_total", protocol="convergence", status="400") == 2
    assert value(text, "notary_cache_hits_total") == 7
    assert value(text, "notary_cache_entries") == 3
    assert value(text, "notary_cache_size_bytes") == 300
    assert value(text, "notary_probes_total", outcome="success") == 2
    assert value(text, "notary_probes_total", outcome="timeout") == 1
    assert value(text, "notary_probes_total", outcome="connect") == 0  # pre-bound
    assert value(text, "notary_probes_in_flight") == 1
    assert value(text, "notary_probes_coalesced_total") == 1
    assert value(text, "notary_probes_queued") == 2
    assert value(text, "notary_http_connections", listener="api") == 4
    assert value(text, "notary_signatures_total", kind="convergence") == 9
    parts.service.answered["convergence"][200] += 1
    parts.cache_stats = CacheStatistics(1, 100, 10, 1000, 8, 1, 2, 0)
    parts.listener.open_connections = 0
    metrics.fold()
    text = metrics.exposition().decode()
    assert value(text, "notary_queries_total", protocol="convergence", status="200") == 6
    assert value(text, "notary_cache_evictions_total") == 2
    assert value(text, "notary_cache_entries") == 1
    assert value(text, "notary_http_connections", listener="api") == 0


def test_abuse_controls_refusals_are_counted() -> None:
    parts = stand_ins()
    controls = AbuseControls(LimitsConfig(
        query_burst=1, probe_burst=1, probes_per_minute_per_target=1,
        max_connections_per_address=1, max_connections_per_prefix=2,
    ))
    metrics = NotaryMetrics(
        service=parts.service, cache=parts.cache, stored=parts.stored, storage=parts.storage,
        prober=parts.prober, records=parts.records, abuse=controls,
    )
    metrics.fold()
    text = metrics.exposition().decode()
    assert value(text, "notary_limits_queries_refused_total") == 0
    assert value(text, "notary_limits_probes_refused_total", limit="target") == 0  # pre-bound
    client, other = b"\xc0\x00\x02", b"\xc6\x33\x64"
    controls.admit_query(client, 0.0)
    for _ in range(3):
        with pytest.raises(RateLimited):
            controls.admit_query(client, 0.0)
    controls.admit_probe(client, "a:443", 0.0)
    with pytest.raises(RateLimited):
        controls.admit_probe(client, "b:443", 0.0)
    with pytest.raises(ProbeThrottled):
        controls.admit_probe(other, "a:443", 0.0)
    assert controls.connections.open(client + b"\x01")
    assert not controls.connections.open(client + b"\x01")  # the address is at its cap
    metrics.fold()
    metrics.fold()  # nothing counted twice
    text = metrics.exposition().decode()
    assert value(text, "notary_limits_queries_refused_total") == 3
    assert value(text, "notary_limits_probes_refused_total", limit="client") == 1
    assert value(text, "notary_limits_probes_refused_total", limit="target") == 1
    assert value(text, "notary_limits_probes_refused_total", limit="destination") == 0
    assert value(text, "notary_limits_connections_refused_total", scope="address") == 1
    assert value(text, "notary_limits_tracked_entries", table="queries") == 1
    assert value(text, "notary_limits_tracked_entries", table="target_probes") == 1


def test_histograms_are_observed_through_the_timings() -> None:
    parts = stand_ins()
    metrics = metrics_of(parts)
    parts.timings.probe_done(0.3, None)
    parts.timings.probe_done(10.0, "timeout")
    parts.timings.batch_written(120, 0.004)
    text = metrics.exposition().decode()
    assert value(text, "notary_probe_duration_seconds_count", result="success") == 1
    assert value(text, "notary_probe_duration_seconds_bucket", result="success", le="0.5") == 1
    assert value(text, "notary_probe_duration_seconds_count", result="failure") == 1
    assert value(text, "notary_writer_batch_rows_sum") == 120
    assert value(text, "notary_writer_flush_seconds_bucket", le="0.005") == 1


def test_several_notaries_in_one_process_do_not_collide() -> None:
    one, two = stand_ins(), stand_ins()
    first, second = metrics_of(one), metrics_of(two)
    one.service.answered["convergence"][200] = 1
    two.service.answered["convergence"][200] = 2
    first.fold()
    second.fold()
    assert value(first.exposition().decode(), "notary_queries_total",
                 protocol="convergence", status="200") == 1
    assert value(second.exposition().decode(), "notary_queries_total",
                 protocol="convergence", status="200") == 2


def test_every_metric_has_help_and_the_notary_prefix() -> None:
    text = metrics_of(stand_ins()).exposition().decode()
    families = list(text_string_to_metric_families(text))
    assert len(families) > 30
    for family in families:
        assert family.name.startswith("notary_"), family.name
        assert family.documentation, family.name


def test_the_metrics_table_is_consistent() -> None:
    """Each row of METRICS: a unique name, a live gauge mode for gauges only
    (a dead worker's gauges leave the aggregate), buckets for histograms only."""
    names = [spec.name for spec in metrics_module.METRICS]
    assert len(names) == len(set(names))
    for spec in metrics_module.METRICS:
        assert spec.name.startswith("notary_") and spec.help, spec.name
        assert spec.mode.startswith("live") == (spec.kind == "gauge"), spec.name
        assert bool(spec.buckets) == (spec.kind == "histogram"), spec.name
        assert (spec.read is None) == (spec.source == "timings"), spec.name
        assert not spec.prebound or len(spec.labels) == 1, spec.name


# -- the multiprocess mode -----------------------------------------------------------


def test_workers_are_aggregated_in_the_multiprocess_mode(tmp_path) -> None:
    environment = {k: v for k, v in os.environ.items() if k != metrics_module.MULTIPROC_DIR_ENV}
    result = subprocess.run(
        [sys.executable, "-c",
         f"from tests.support.metrics import supervise; supervise({str(tmp_path / 'm')!r})"],
        cwd=ROOT, env=environment, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    renders = json.loads(result.stdout.strip().splitlines()[-1])
    both, one_left = renders["both"], renders["one_left"]
    queries = {"protocol": "convergence", "status": "200"}
    # Counters and histograms: summed over every worker, dead ones included.
    assert value(both, "notary_queries_total", **queries) == 7
    assert value(one_left, "notary_queries_total", **queries) == 7
    assert value(both, "notary_probe_duration_seconds_count", result="success") == 2
    # Live gauges: summed over the workers not declared dead.
    assert value(both, "notary_http_connections", listener="api") == 7
    assert value(one_left, "notary_http_connections", listener="api") == 5
    assert value(both, "notary_workers") == 2
    assert value(one_left, "notary_workers") == 1
    assert value(one_left, "notary_cache_max_entries") == 10
    # No per-process label leaks into the aggregate.
    assert all("pid" not in dict(labels) for _, labels in samples(both))
