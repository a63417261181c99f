"""Store bounds: the bytes the database takes, in the worst cases the README's
"What the notary keeps" quotes (its table says what each figure counts): file
growth, ``PRAGMA page_count`` x ``page_size`` after a checkpoint, at the default
limits; per target as ``Store.record`` writes it and after ``Store.compact``.

    .venv/bin/python bench/bench_store_bounds.py
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import sqlite3
import sys
import tempfile
from pathlib import Path

import harness

from notary.config import LimitsConfig, StoreConfig
from notary.model.observations import Certificate, ProbeResult
from notary.model.targets import Target
from notary.state.store import Store

T0 = 1_700_000_000
#: Eight IPv6 addresses of the longest text form (39 characters).
ADDRESSES = [f"2001:db8:ffff:ffff:ffff:ffff:ffff:{i:04x}" for i in range(8)]


def certificate(rng: random.Random, size: int) -> Certificate:
    der = rng.randbytes(size)
    return Certificate(der, hashlib.sha1(der).digest(), hashlib.sha256(der).digest(),
                       hashlib.md5(der).digest(), hashlib.sha256(der[:64]).digest())


def longest_host(index: int) -> str:
    return (f"t{index:08d}." + ("a" * 62 + ".") * 4)[:253].rstrip(".")


def file_bytes(path: Path) -> int:
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        return pages * db.execute("PRAGMA page_size").fetchone()[0]


def per_target(path: Path, settings: StoreConfig, targets: int = 8) -> tuple[float, float]:
    """Bytes per target at its limits: as written, and after compact."""
    limits, rng = settings.timeline_limits(), random.Random(1)
    runs, spacing = limits.max_runs_per_certificate, settings.merge_window_s + 1
    with Store(path, limits=limits, merge_window_s=settings.merge_window_s) as store:
        empty = file_bytes(path)
        for index in range(targets):
            target = Target(longest_host(index), 65535)
            leaves = [certificate(rng, limits.max_certificate_bytes)
                      for _ in range(limits.max_certificates_per_target)]
            sightings = [ProbeResult(target, leaves[run // runs], (), address, T0 + run * spacing)
                         for run in range(len(leaves) * runs) for address in ADDRESSES]
            for start in range(0, len(sightings), 500):
                store.record(sightings[start:start + 500])
        written = file_bytes(path)
        store.compact(T0, 10**9)
        return (written - empty) / targets, (file_bytes(path) - empty) / targets


def per_probe(path: Path, settings: StoreConfig, probes: int = 4000) -> float:
    limits, rng = settings.timeline_limits(), random.Random(2)
    with Store(path, limits=limits) as store:
        empty = file_bytes(path)
        for start in range(0, probes, 500):
            store.record([ProbeResult(Target(longest_host(i), 65535),
                                      certificate(rng, limits.max_certificate_bytes), (),
                                      ADDRESSES[0], T0 + i) for i in range(start, start + 500)])
        return (file_bytes(path) - empty) / probes


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    harness.argument_parser(__doc__.split("\n", 1)[0]).parse_args(argv)
    command = " ".join([".venv/bin/python bench/bench_store_bounds.py", *argv])
    harness.header("Store bounds", command)
    settings, limits = StoreConfig(), LimitsConfig()
    with tempfile.TemporaryDirectory(prefix="store-bounds-", ignore_cleanup_errors=True) as name:
        written, compacted = per_target(Path(name) / "per-target.db", settings)
        probe = per_probe(Path(name) / "per-probe.db", settings)
    probes_per_day = limits.probes_per_s_per_prefix * 86400 + limits.probe_burst
    print(f"SQLite {sqlite3.sqlite_version}; {settings.timeline_limits()}")
    print()
    harness.print_table(["measure", "bytes"], [
        ["a. per target at its limits, as written", f"{written:,.0f}"],
        ["a. per target at its limits, after compact", f"{compacted:,.0f}"],
        ["b. per probe (new target, new certificate)", f"{probe:,.0f}"],
        [f"per client prefix per day ({probes_per_day:,.0f} probes x b)",
         f"{probes_per_day * probe:,.0f}"],
    ])


if __name__ == "__main__":
    main()
