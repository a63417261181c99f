"""bench/bench_sites.py (issue 31's measurements): its command line and the
parts of it that compute rather than time: which certificates a site at the
store's bounds shows in each probe, the store's bounds held when a target
is written that way (a small SQLite store), the memory and goal verdicts.
No timing is asserted; nothing here opens a connection.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections import Counter

import pytest

from notary.model.observations import TimelineLimits
from tests.support.bench import BENCH, bench_on_path


@pytest.fixture(scope="module")
def bench_sites():
    """The script as a module (it imports ``harness`` from ``bench/``)."""
    with bench_on_path():
        yield importlib.import_module("bench_sites")


def test_help_runs_and_names_every_part():
    done = subprocess.run([sys.executable, str(BENCH / "bench_sites.py"), "--help"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    for word in ("--quick", "--part", "cost", "memory", "notary", "store", "--engines"):
        assert word in done.stdout


@pytest.mark.parametrize("argv, message", [
    (["--part", "cost,speed"], "unknown part speed"),
    (["--engines", "oracle"], "unknown engine oracle"),
    (["--rounds", "0"], "--rounds must be at least 1"),
    (["--duration", "-1"], "--duration must be positive"),
])
def test_bad_options_are_one_clear_error(bench_sites, capsys, argv, message):
    with pytest.raises(SystemExit) as exited:
        bench_sites.parse_args(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_quick_options_are_smaller(bench_sites):
    quick, full = bench_sites.parse_args(["--quick"]), bench_sites.parse_args([])
    assert quick.parts == full.parts == list(bench_sites.PARTS)
    for name in ("rounds", "connections", "memory_probes", "store_targets"):
        assert getattr(quick, name) < getattr(full, name)


@pytest.mark.parametrize("addresses, samples, certificates, runs", [
    (8, 4, 64, 32),  # the defaults: [probe] and [store]
    (3, 2, 10, 5),  # a group left part empty
    (2, 1, 1, 2),
])
def test_probe_plan_takes_every_certificate_to_its_bounds(bench_sites, addresses, samples,
                                                         certificates, runs):
    shape = bench_sites.SiteShape(addresses, samples, certificates, runs, 1)
    sightings: Counter[int] = Counter()
    where: dict[int, set[int]] = {}
    for probe in range(shape.probes):
        shown = bench_sites.probe_plan(shape, probe)
        assert len({c for c, _ in shown}) == len(shown)  # every handshake a new certificate
        per_address = Counter(a for _, a in shown)
        assert max(per_address.values()) <= samples
        assert set(per_address) <= set(range(addresses))
        for certificate, address in shown:
            sightings[certificate] += 1
            where.setdefault(certificate, set()).add(address)
    assert sightings == dict.fromkeys(range(certificates), runs)
    assert all(len(found) == min(addresses, runs) for found in where.values())


def test_the_store_keeps_a_site_written_past_its_bounds_within_them(bench_sites, tmp_path):
    limits = TimelineLimits(max_certificate_bytes=512, max_certificates_per_target=6,
                            max_runs_per_certificate=3)
    shape = bench_sites.SiteShape(4, 2, 6, 3, 11)
    engine = bench_sites.sqlite_engine(tmp_path / "store.db", limits, merge_window_s=10)
    figures = bench_sites.store_worst_case(engine, shape, targets=2, size=512, new_targets=1)
    expected = bench_sites.Held(targets=2, certificates=12, most_certificates=6, most_runs=3,
                                most_addresses=3)  # each certificate at (turn 0, 1, 2) + slot
    assert figures.held_at_bounds == expected
    assert figures.held_past == expected  # 12 new certificates replaced the first 12
    assert figures.live_at_bounds > 0 and figures.compacted > 0
    assert figures.certificates_one_probe == (4 + 1) * 2  # every address and a hint, sampled
    assert figures.most_one_probe > 10 * 512


def sample(bench_sites, probes, *, rss, traced, remembered):
    return bench_sites.MemorySample(probes, rss, 100_000, traced, remembered)


def test_memory_verdict_judges_after_the_address_memory_fills(bench_sites):
    filling = [sample(bench_sites, p, rss=50_000_000 + 1000 * p, traced=100 * p,
                      remembered=min(8 * p, 800)) for p in range(0, 100, 10)]
    steady = [sample(bench_sites, p, rss=50_100_000, traced=10_000 + (p % 20),
                     remembered=800) for p in range(100, 500, 10)]
    verdict = bench_sites.memory_verdict(filling + steady, capacity=800)
    assert verdict.filled_at == 100
    assert verdict.steady[0].probes == 200  # a quarter of the steady part left out
    assert verdict.flat


def test_memory_verdict_sees_a_leak(bench_sites):
    leaking = [sample(bench_sites, p, rss=50_000_000, traced=64 * p, remembered=800)
               for p in range(0, 500, 10)]
    verdict = bench_sites.memory_verdict(leaking, capacity=800)
    assert verdict.traced_per_probe == pytest.approx(64)
    assert not verdict.flat


def test_memory_verdict_without_a_full_memory_judges_the_second_half(bench_sites):
    samples = [sample(bench_sites, p, rss=50_000_000 + 10_000 * p, traced=0, remembered=8 * p)
               for p in range(10)]
    verdict = bench_sites.memory_verdict(samples, capacity=10_000)
    assert verdict.filled_at is None
    assert [s.probes for s in verdict.steady] == [5, 6, 7, 8, 9]
    assert verdict.flat  # RSS +0.08% over it


@pytest.mark.parametrize("direct, normalized, verdict", [
    (1.05, 1.30, "met"),
    (1.30, 1.02, "NOT met, but not the prober's"),
    (1.30, 1.25, "NOT met"),
])
def test_goal_verdict(bench_sites, direct, normalized, verdict):
    assert bench_sites.goal_verdict(direct, normalized).startswith(verdict)
    if verdict == "NOT met":
        assert bench_sites.goal_verdict(direct, normalized) == "NOT met"
