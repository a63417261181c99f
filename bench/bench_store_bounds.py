"""Store bounds: the bytes the database takes, in the worst cases the README's
"What the notary keeps" quotes.

    .venv/bin/python bench/bench_store_bounds.py

Not a speed benchmark: a measurement of file growth (``PRAGMA page_count`` x
``page_size`` after a checkpoint) with the default ``TimelineLimits``:

a. **per target at its limits**: targets with the longest host name (253
   characters), each with ``max_certificates_per_target`` certificates of
   ``max_certificate_bytes`` of (random) DER, each with
   ``max_runs_per_certificate`` runs and 8 IPv6 addresses of 39 characters;
   as written by ``Store.record``, and after ``Store.compact`` (VACUUM).
b. **per probe**: the most one on-demand probe adds, a new target (253
   characters) with a new certificate of ``max_certificate_bytes``.

The per-client-prefix figure is b times the probes a prefix may cause in a
day (``[limits] probes_per_s_per_prefix`` x 86,400 + ``probe_burst``).
"""

from __future__ import annotations

import hashlib
import random
import shutil
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
    db = sqlite3.connect(path)
    try:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        return pages * db.execute("PRAGMA page_size").fetchone()[0]
    finally:
        db.close()


def per_target(directory: Path, settings: StoreConfig, targets: int = 8) -> tuple[float, float]:
    limits = settings.timeline_limits()
    window = settings.merge_window_s
    rng = random.Random(1)
    path = directory / "per-target.db"
    with Store(path, limits=limits, merge_window_s=window) as store:
        empty = file_bytes(path)
        for index in range(targets):
            target = Target(longest_host(index), 65535)
            sightings = []
            for c in range(limits.max_certificates_per_target):
                leaf = certificate(rng, limits.max_certificate_bytes)
                for run in range(limits.max_runs_per_certificate):
                    at = T0 + (c * limits.max_runs_per_certificate + run) * (window + 1)
                    sightings += [ProbeResult(target, leaf, (), a, at) for a in ADDRESSES]
            for start in range(0, len(sightings), 500):
                store.record(sightings[start:start + 500])
        written = file_bytes(path)
        store.compact(T0, 10**9)
        compacted = file_bytes(path)
    return (written - empty) / targets, (compacted - empty) / targets


def per_probe(directory: Path, settings: StoreConfig, probes: int = 4000) -> float:
    limits = settings.timeline_limits()
    rng = random.Random(2)
    path = directory / "per-probe.db"
    with Store(path, limits=limits) as store:
        empty = file_bytes(path)
        for start in range(0, probes, 500):
            store.record([
                ProbeResult(Target(longest_host(i), 65535),
                            certificate(rng, limits.max_certificate_bytes), (), ADDRESSES[0],
                            T0 + i)
                for i in range(start, start + 500)
            ])
        return (file_bytes(path) - empty) / probes


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    harness.argument_parser(__doc__.split("\n", 1)[0]).parse_args(argv)
    harness.header("Store bounds", " ".join([".venv/bin/python bench/bench_store_bounds.py", *argv]))
    settings, limits = StoreConfig(), LimitsConfig()
    directory = Path(tempfile.mkdtemp(prefix="store-bounds-"))
    try:
        written, compacted = per_target(directory, settings)
        probe = per_probe(directory, settings)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
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
