"""The admin listener: ``/metrics``, ``/healthz``, ``/readyz`` on loopback
(port 0), routing errors, and readiness when the writer fails or lags."""

from __future__ import annotations

import pytest
import trio

from notary.config import Endpoint
from notary.errors import StoreError
from notary.outbound.writer import StorageStatistics
from notary.server.admin import readiness_problems
from tests.support.http_client import http_get
from tests.support.metrics import value
from tests.support.notaries import admin_port, legacy_query, open_notary
from tests.support.polling import wait_for
from tests.support.tls_targets import open_tls_target

NAME = "www.example.test"
OTHER = "other.example.test"
THIRD = "third.example.test"
LOOPBACK_0 = (Endpoint("127.0.0.1", 0),)


async def test_health_and_readiness_of_a_running_notary(tmp_path):
    async with open_notary(tmp_path) as notary:
        status, _, body = await http_get(admin_port(notary), "/healthz")
        assert (status, body) == (200, b"ok\n")
        status, _, body = await http_get(admin_port(notary), "/readyz")
        assert (status, body) == (200, b"ready\n")
        status, _, body = await http_get(admin_port(notary), "/metrics?name=x")
        assert status == 200
        assert value(body.decode(), "notary_bloom_loaded") in (0, 1)


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/", 404),
        ("GET", "/metricsx", 404),
        ("GET", "/target/example.com+443", 404),
        ("POST", "/metrics", 405),
        ("PUT", "/readyz", 405),
        ("DELETE", "/healthz", 405),
        ("POST", "/nothing", 404),
    ],
)
async def test_other_paths_and_methods(tmp_path, method, path, status):
    async with open_notary(tmp_path) as notary:
        got, head, _ = await http_get(admin_port(notary), path, method)
        assert got == status
        if status == 405:
            assert b"\r\nAllow: GET\r\n" in head + b"\r\n"


async def test_keep_alive_serves_several_requests(tmp_path):
    async with open_notary(tmp_path) as notary:
        with trio.fail_after(20):
            stream = await trio.open_tcp_stream("127.0.0.1", admin_port(notary))
            async with stream:
                await stream.send_all(
                    b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n"
                    b"GET /readyz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
                )
                data = b""
                while chunk := await stream.receive_some(65536):
                    data += chunk
    assert data.count(b"HTTP/1.1 200 OK") == 2
    assert data.endswith(b"ready\n")


async def test_admin_listener_can_be_turned_off(tmp_path):
    async with open_notary(tmp_path, admin={"listen": ()}) as notary:
        assert notary.running.admin == ()
        assert notary.running.metrics is not None


async def test_readiness_fails_while_the_writer_fails_and_lags(tmp_path, monkeypatch):
    failing = True

    async with open_tls_target(names=[NAME, OTHER, THIRD]) as site:
        names = {name: [site.host] for name in (NAME, OTHER, THIRD)}
        admin = {"listen": LOOPBACK_0, "max_writer_lag_rows": 1}
        async with open_notary(tmp_path, names=names, admin=admin) as notary:
            port = admin_port(notary)
            writer = notary.running.storage._writer
            record = writer.record

            def record_or_fail(batch, origin="", probes=None):
                if failing:
                    raise StoreError("disk full (test)")
                return record(batch, origin, probes)

            monkeypatch.setattr(writer, "record", record_or_fail)

            async def readiness() -> tuple[int, bytes]:
                status, _, body = await http_get(port, "/readyz")
                return status, body

            async def ready() -> bool:
                return (await readiness())[0] == 200

            async def not_ready() -> bool:
                return not await ready()

            async def all_committed() -> bool:
                return notary.running.storage.statistics().committed == 3

            assert (await legacy_query(notary.port, f"{NAME}+{site.port}", None)).status == 200
            await wait_for(not_ready)
            assert b"store not writable" in (await readiness())[1]
            # Liveness is not readiness.
            assert (await http_get(port, "/healthz"))[0] == 200
            # The failing batch is in the writer's hands; the next ones queue.
            for name in (OTHER, THIRD):
                assert (await legacy_query(notary.port, f"{name}+{site.port}", None)).status == 200
            status, body = await readiness()
            assert status == 503
            assert b"writer lagging: 2 observations queued, more than 1" in body
            _, _, metrics = await http_get(port, "/metrics")
            assert value(metrics.decode(), "notary_writer_failing") == 1
            assert value(metrics.decode(), "notary_writer_failed_batches_total") >= 1
            assert value(metrics.decode(), "notary_writer_queue_rows") == 2
            failing = False
            await wait_for(ready)
            await wait_for(all_committed)


def stats(**changes) -> StorageStatistics:
    fields = {"queued": 0, "committed": 0, "batches": 0, "failed_batches": 0,
              "producer_waits": 0, "failing": False, **changes}
    return StorageStatistics(**fields)


def test_readiness_rules() -> None:
    assert readiness_problems(serving=True, writer=stats(), max_writer_lag_rows=10) == []
    assert readiness_problems(
        serving=True, writer=stats(queued=10), max_writer_lag_rows=10
    ) == []
    problems = readiness_problems(
        serving=False, writer=stats(queued=11, failing=True), max_writer_lag_rows=10
    )
    assert len(problems) == 3
    assert problems[0].startswith("listeners not serving")
    assert "not writable" in problems[1]
    assert "11 observations queued" in problems[2]


async def test_a_failed_render_is_500_and_the_notary_keeps_serving(tmp_path, monkeypatch):
    async with open_notary(tmp_path) as notary:
        def broken() -> bytes:
            raise OSError("metric files gone")

        monkeypatch.setattr(notary.running.metrics, "exposition", broken)
        assert (await http_get(admin_port(notary), "/metrics"))[0] == 500
        assert (await http_get(admin_port(notary), "/healthz"))[0] == 200
