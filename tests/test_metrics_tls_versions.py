"""``notary_probe_tls_versions_total``: successful probes by the TLS version
negotiated (folded from ``Prober.statistics().tls_versions``), against
stand-ins and through a running notary probing a TLS 1.0-only site."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from notary.model.targets import Target
from notary.outbound.probe import ProbeStatistics
from tests.support.metrics import metrics_of, samples, stand_ins, value
from tests.support.notaries import open_notary
from tests.support.tls_targets import open_tls_target


def test_probes_are_counted_by_tls_version() -> None:
    parts = stand_ins()
    metrics = metrics_of(parts)
    parts.probe_stats = ProbeStatistics(3, 3, 0, {}, tls_versions={"TLSv1": 1, "TLSv1.3": 2})
    metrics.fold()
    metrics.fold()  # nothing counted twice
    text = metrics.exposition().decode()
    assert value(text, "notary_probe_tls_versions_total", version="TLSv1") == 1
    assert value(text, "notary_probe_tls_versions_total", version="TLSv1.3") == 2
    assert ("notary_probe_tls_versions_total", (("version", "TLSv1.1"),)) in samples(text)
    parts.probe_stats = ProbeStatistics(4, 4, 0, {}, tls_versions={"TLSv1": 2, "TLSv1.3": 2})
    metrics.fold()
    text = metrics.exposition().decode()
    assert value(text, "notary_probe_tls_versions_total", version="TLSv1") == 2


async def test_a_tls10_site_probed_by_the_notary_is_counted(tmp_path: Path) -> None:
    if not ssl.HAS_TLSv1:
        pytest.skip("this OpenSSL has no TLS 1.0")
    version = ssl.TLSVersion.TLSv1
    async with (
        open_tls_target(minimum_version=version, maximum_version=version) as site,
        open_notary(tmp_path) as notary,
    ):
        result = (await notary.running.prober.probe(Target(site.host, site.port))).primary
        assert result.tls_version == "TLSv1"
        metrics = notary.running.metrics
        assert metrics is not None
        text = (await metrics.render()).decode()
    assert value(text, "notary_probe_tls_versions_total", version="TLSv1") == 1
    assert value(text, "notary_probes_total", outcome="success") == 1
