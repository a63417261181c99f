"""Cache micro-benchmark: LRU and Bloom filter, compiled vs pure-Python twin.

Three tables, every ratio measured in the same run: LRU operations per
second (compiled, twin, an ``OrderedDict`` baseline), Bloom filter operations
per second, memory per cached target. How each is timed: ``bench/README.md``.

    .venv/bin/python bench/bench_cache.py            # full run (about three minutes)
    .venv/bin/python bench/bench_cache.py --quick    # smoke run (seconds)
"""

from __future__ import annotations

import gc
import importlib
import itertools
import json
import os
import random
import subprocess
import sys
import time
import tracemalloc
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from types import ModuleType
from typing import Any

import harness

#: Bloom filter goal of the issue: compiled membership checks >= 10x the twin.
BLOOM_GOAL_RATIO = 10.0


# ---------------------------------------------------------------------------
# The OrderedDict baseline
# ---------------------------------------------------------------------------


class OrderedDictLRU:
    """The textbook LRU on ``collections.OrderedDict``, bounded like ``LRUCache``.

    Same ``get``/``put`` semantics as ``notary.state._fastcache.LRUCache`` (hits,
    misses, evictions and rejected items counted the same way), without the
    robustness of ours against keys whose ``__eq__``/``__hash__`` misbehave.
    """

    __slots__ = ("_bytes", "_evictions", "_hits", "_map", "_max_bytes", "_max_entries",
                 "_misses", "_rejected")

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self._map: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._bytes = 0
        self._hits = self._misses = self._evictions = self._rejected = 0

    def get(self, key: Hashable, default: Any = None) -> Any:
        item = self._map.get(key)
        if item is None:
            self._misses += 1
            return default
        self._map.move_to_end(key)
        self._hits += 1
        return item[0]

    def put(self, key: Hashable, value: Any, size: int) -> None:
        entries = self._map
        if size > self._max_bytes:
            old = entries.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._rejected += 1
            return
        old = entries.get(key)
        entries[key] = (value, size)
        if old is not None:
            self._bytes -= old[1]
            entries.move_to_end(key)
        self._bytes += size
        while len(entries) > self._max_entries or self._bytes > self._max_bytes:
            _, (_, evicted_size) = entries.popitem(last=False)
            self._bytes -= evicted_size
            self._evictions += 1

    def counters(self) -> tuple[int, int, int, int, int, int]:
        return (len(self._map), self._bytes, self._hits, self._misses, self._evictions,
                self._rejected)

    def __len__(self) -> int:
        return len(self._map)


def counters(cache: Any) -> tuple[int, int, int, int, int, int]:
    if isinstance(cache, OrderedDictLRU):
        return cache.counters()
    s = cache.statistics()
    return (s.entries, s.bytes, s.hits, s.misses, s.evictions, s.rejected)


def check_same_semantics(factories: dict[str, Callable[[int, int], Any]]) -> None:
    """Drive every LRU with one random operation sequence; exit if any result differs."""
    rng = random.Random(7)
    ops = [(rng.random() < 0.6, rng.randrange(300), rng.choice((1, 10, 100, 2_000)))
           for _ in range(30_000)]
    traces = {}
    for name, factory in factories.items():
        cache = factory(100, 5_000)
        trace = []
        for is_get, key, size in ops:
            if is_get:
                trace.append(cache.get(key))
            else:
                cache.put(key, (key, size), size)
        traces[name] = (trace, counters(cache))
    reference = next(iter(traces.values()))
    for name, trace in traces.items():
        if trace != reference:
            sys.exit(f"bench_cache: {name} does not behave like the others; fix the baseline")


# ---------------------------------------------------------------------------
# Timed loops (one shape for every implementation)
# ---------------------------------------------------------------------------


def time_gets(cache: Any, keys: Sequence[str]) -> float:
    get = cache.get
    start = time.perf_counter()
    for key in keys:
        get(key)
    return time.perf_counter() - start


def time_puts(cache: Any, keys: Sequence[str], value: object, size: int) -> float:
    put = cache.put
    start = time.perf_counter()
    for key in keys:
        put(key, value, size)
    return time.perf_counter() - start


def time_mixed(cache: Any, ops: Sequence[tuple[str, bool]], value: object, size: int) -> float:
    get = cache.get
    put = cache.put
    start = time.perf_counter()
    for key, is_put in ops:
        if is_put:
            put(key, value, size)
        else:
            get(key)
    return time.perf_counter() - start


def time_empty_loop(keys: Sequence[str]) -> float:
    start = time.perf_counter()
    for _key in keys:
        pass
    return time.perf_counter() - start


def time_contains(bloom: Any, digests: Sequence[bytes]) -> float:
    start = time.perf_counter()
    for digest in digests:
        digest in bloom  # noqa: B015 - the membership test is what is timed
    return time.perf_counter() - start


def time_adds(bloom: Any, digests: Sequence[bytes]) -> float:
    add = bloom.add
    start = time.perf_counter()
    for digest in digests:
        add(digest)
    return time.perf_counter() - start


def time_digest_and_check(bloom: Any, items: Sequence[bytes], digest: Callable[[bytes], bytes]
                          ) -> float:
    start = time.perf_counter()
    for item in items:
        digest(item) in bloom  # noqa: B015
    return time.perf_counter() - start


def zipf_indices(size: int, count: int, exponent: float, rng: random.Random) -> list[int]:
    """``count`` draws from ``range(size)`` with P(rank r) proportional to 1 / r**exponent."""
    cumulative = list(itertools.accumulate(1.0 / (rank ** exponent) for rank in range(1, size + 1)))
    ranked = list(range(size))
    rng.shuffle(ranked)  # popularity independent of the key's name
    return rng.choices(ranked, cum_weights=cumulative, k=count)


def target_key(i: int) -> str:
    return f"host{i}.example.test:443"


# ---------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------


def bench_lru(impls: dict[str, Callable[[int, int], Any]], quick: bool, repeat: int) -> None:
    capacity = 10_000 if quick else 100_000  # 100k: [cache] max_entries default
    n_ops = 30_000 if quick else 1_000_000
    universe_size = 100_000 if quick else 1_000_000
    max_bytes = 256 * 1024 * 1024  # [cache] max_bytes default
    size = 2_048  # body + certificate + overhead of a typical record: count bound binds
    value = (b"x" * 300, (1_700_000_000, 1_700_000_000))
    rng = random.Random(1)

    resident = [target_key(i) for i in range(capacity)]
    # Keys are fresh objects, equal to (not the same as) the stored ones and
    # allocated in the order they are used, as when each request builds its key.
    hit_keys = [target_key(rng.randrange(capacity)) for _ in range(n_ops)]
    miss_keys = [f"absent{i}.example.test:443" for i in range(n_ops)]
    # At least two capacities of distinct new keys, so every put of a repeated
    # pass inserts (and evicts) again.
    fresh = [f"new{i}.example.test:443" for i in range(max(n_ops, 2 * capacity))]
    mixed_ops = [(target_key(i), rng.random() < 0.10)
                 for i in zipf_indices(universe_size, n_ops, 1.0, rng)]

    workloads = [
        ("get, hit (random resident key)", "get_hit"),
        ("get, miss", "get_miss"),
        ("put, new key (evicts the LRU one)", "put_new"),
        ("put, replace a resident key", "put_replace"),
        (f"mixed 90% get / 10% put, Zipf(1.0) over {universe_size:,} keys", "mixed"),
    ]
    rates: dict[tuple[str, str], float] = {}
    hit_rates: dict[str, float] = {}
    for name, factory in impls.items():
        cache = factory(capacity, max_bytes)
        for key in resident:
            cache.put(key, value, size)
        rates[name, "get_hit"] = harness.rate(
            n_ops, harness.best_seconds(lambda c=cache: time_gets(c, hit_keys), repeat))
        rates[name, "get_miss"] = harness.rate(
            n_ops, harness.best_seconds(lambda c=cache: time_gets(c, miss_keys), repeat))
        rates[name, "put_replace"] = harness.rate(
            n_ops, harness.best_seconds(lambda c=cache: time_puts(c, hit_keys, value, size), repeat))
        rates[name, "put_new"] = harness.rate(
            len(fresh), harness.best_seconds(lambda c=cache: time_puts(c, fresh, value, size), repeat))
        del cache
        gc.collect()
        cache = factory(capacity, max_bytes)
        time_mixed(cache, mixed_ops, value, size)  # warm up to the steady state
        before = counters(cache)
        rates[name, "mixed"] = harness.rate(
            n_ops, harness.best_seconds(lambda c=cache: time_mixed(c, mixed_ops, value, size),
                                       repeat))
        after = counters(cache)
        hits, misses = after[2] - before[2], after[3] - before[3]
        hit_rates[name] = hits / (hits + misses) if hits + misses else 0.0
        del cache
        gc.collect()
    loop_rate = harness.rate(n_ops, harness.best_seconds(lambda: time_empty_loop(hit_keys), repeat))

    names = list(impls)
    compiled, twin, baseline = names
    print(f"## LRU cache: operations per second (capacity {capacity:,} entries, "
          f"{n_ops:,} operations per pass, best of {repeat})")
    print()
    harness.print_table(
        ["operation", *names, f"{compiled} / {twin}", f"{compiled} / {baseline}",
         f"{twin} / {baseline}"],
        [
            [label,
             *(harness.format_rate(rates[name, key]) for name in names),
             harness.format_ratio(rates[compiled, key] / rates[twin, key]),
             harness.format_ratio(rates[compiled, key] / rates[baseline, key]),
             harness.format_ratio(rates[twin, key] / rates[baseline, key])]
            for label, key in workloads
        ],
    )
    print("Mixed-workload get hit rate at steady state: "
          + ", ".join(f"{name} {hit_rates[name]:.1%}" for name in names))
    print(f"Reference: the empty `for` loop over the same keys runs at "
          f"{harness.format_rate(loop_rate)} ({1e9 / loop_rate:.0f} ns per iteration, "
          f"included in every figure above).")
    print()


def bench_bloom(fast: ModuleType, twin: ModuleType, quick: bool, repeat: int
                ) -> dict[str, float]:
    expected = 50_000 if quick else 1_000_000
    n_ops = 20_000 if quick else 300_000
    fpr = 0.01
    items = [target_key(i).encode() for i in range(expected)]
    digest = fast.bloom_digest
    digests = [digest(item) for item in items]
    rng = random.Random(2)
    # Fresh digests and keys, allocated in the order they are used (as a caller
    # computes the digest right before the check); picking stored objects at
    # random would time cache misses on their headers, not the filter.
    present = [digest(target_key(rng.randrange(expected)).encode()) for _ in range(n_ops)]
    absent = [digest(f"absent{i}.example.test:443".encode()) for i in range(n_ops)]
    lookup_items = [target_key(rng.randrange(expected)).encode() for _ in range(n_ops)]
    extra = [digest(f"extra{i}.example.test:443".encode()) for i in range(n_ops)]

    rates: dict[tuple[str, str], float] = {}
    false_positives: dict[str, float] = {}
    bits = hashes = 0
    for name, module in (("compiled", fast), ("twin", twin)):
        bloom = module.BloomFilter(expected, fpr)
        for d in digests:
            bloom.add(d)
        stats = bloom.statistics()
        bits, hashes = stats.bits, stats.hashes
        false_positives[name] = sum(d in bloom for d in absent) / len(absent)

        def adds(module: ModuleType = module) -> float:
            fresh_filter = module.BloomFilter(expected, fpr)
            return time_adds(fresh_filter, extra)

        rates[name, "add"] = harness.rate(n_ops, harness.best_seconds(adds, repeat))
        rates[name, "present"] = harness.rate(
            n_ops, harness.best_seconds(lambda b=bloom: time_contains(b, present), repeat))
        rates[name, "absent"] = harness.rate(
            n_ops, harness.best_seconds(lambda b=bloom: time_contains(b, absent), repeat))
        rates[name, "digest"] = harness.rate(
            n_ops, harness.best_seconds(
                lambda b=bloom, m=module: time_digest_and_check(b, lookup_items, m.bloom_digest),
                repeat))
        del bloom
        gc.collect()

    rows = [
        ("`digest in bloom`, digest present", "present"),
        ("`digest in bloom`, digest absent", "absent"),
        ("`bloom.add(digest)`", "add"),
        ("`bloom_digest(key) in bloom` (hashing included)", "digest"),
    ]
    print(f"## Bloom filter: operations per second ({expected:,} items at {fpr:.0%} "
          f"false positives: {bits:,} bits = {bits / 8 / 2**20:.2f} MiB, {hashes} hashes; "
          f"{n_ops:,} operations per pass, best of {repeat})")
    print()
    harness.print_table(
        ["operation", "compiled", "twin", "compiled / twin"],
        [[label, harness.format_rate(rates["compiled", key]), harness.format_rate(rates["twin", key]),
          harness.format_ratio(rates["compiled", key] / rates["twin", key])]
         for label, key in rows],
    )
    print("Measured false-positive rate on absent digests: "
          + ", ".join(f"{name} {rate:.3%}" for name, rate in false_positives.items()))
    print()
    return {key: rates["compiled", key] / rates["twin", key] for _, key in rows}


# ---------------------------------------------------------------------------
# Memory per cached target (each implementation in its own subprocess)
# ---------------------------------------------------------------------------


def _resident_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def memory_child(impl: str, targets: int, method: str) -> None:
    """Runs in a subprocess: print a JSON line with bytes per target."""
    if impl == "compiled":
        factory: Callable[[int, int], Any] = importlib.import_module("notary.state._fastcache").LRUCache
    elif impl == "twin":
        factory = importlib.import_module("notary.state._fastcache_py").LRUCache
    else:
        factory = OrderedDictLRU
    keys: list[Any] = [None] * targets
    values: list[Any] = [None] * targets
    gc.collect()
    if method == "tracemalloc":
        tracemalloc.start()

        def measure() -> int:
            return tracemalloc.get_traced_memory()[0]
    else:
        measure = _resident_bytes
    start = measure()
    for i in range(targets):
        keys[i] = target_key(i)
        body = b"%09d," % i * 30  # 300 bytes, distinct per target
        seen = 1_700_000_000 + i
        values[i] = (body, (seen, seen))
    gc.collect()
    data_done = measure()
    cache = factory(targets, 2**62)
    empty_cache = measure()
    put = cache.put
    for key, value in zip(keys, values, strict=True):
        put(key, value, len(value[0]) + 512)  # a fresh int per put, as record.size is
    gc.collect()
    cache_done = measure()
    assert len(cache) == targets
    print(json.dumps({
        "data": (data_done - start) / targets,
        "cache": (cache_done - empty_cache) / targets,
    }))


def bench_memory(quick: bool) -> None:
    targets = 20_000 if quick else 1_000_000
    results: dict[tuple[str, str], dict[str, float]] = {}
    for impl in ("compiled", "twin", "OrderedDict"):
        for method in ("tracemalloc", "rss"):
            out = subprocess.run(
                [sys.executable, __file__, "--memory-child", impl, str(targets), method],
                check=True, capture_output=True, text=True, cwd=harness.ROOT,
            ).stdout
            results[impl, method] = json.loads(out.strip().splitlines()[-1])
    print(f"## Memory per cached target ({targets:,} targets, one subprocess per "
          f"implementation and method)")
    print()
    print("Each target: a key `str` (`host123456.example.test:443`) and a value "
          "`(body, (first_seen, last_seen))` with a distinct 300-byte `bytes` body; "
          "the declared size is a fresh `int` per put.")
    print()
    data = results["compiled", "tracemalloc"]["data"]
    harness.print_table(
        ["implementation", "cache overhead, tracemalloc", "cache overhead, RSS delta",
         "overhead / data"],
        [[impl, f"{results[impl, 'tracemalloc']['cache']:.0f} B/target",
          f"{results[impl, 'rss']['cache']:.0f} B/target",
          f"{results[impl, 'tracemalloc']['cache'] / data:.0%}"]
         for impl in ("compiled", "twin", "OrderedDict")],
    )
    print(f"The data itself (key + value objects, held outside the cache): "
          f"{data:.0f} B/target by tracemalloc, "
          f"{results['compiled', 'rss']['data']:.0f} B/target by RSS delta. "
          f"The Bloom filter adds 1.2 B/target at 1% false positives (9.59 bits/item).")
    print()


# ---------------------------------------------------------------------------


def import_compiled() -> ModuleType:
    try:
        return importlib.import_module("notary.state._fastcache")
    except ImportError as exc:
        sys.exit(
            f"bench_cache: the compiled cache notary.state._fastcache does not import ({exc}).\n"
            f"Build it first: cd {harness.ROOT} && .venv/bin/python setup.py build_ext --inplace"
        )


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--memory-child"]:
        memory_child(argv[1], int(argv[2]), argv[3])
        return
    parser = harness.argument_parser(__doc__.split("\n", 1)[0])
    parser.add_argument("--skip-memory", action="store_true",
                        help="leave out the memory measurement (the slowest part)")
    args = parser.parse_args(argv)
    repeat = harness.repetitions(args, full=3)
    fast = import_compiled()
    twin = importlib.import_module("notary.state._fastcache_py")
    impls: dict[str, Callable[[int, int], Any]] = {
        "compiled": fast.LRUCache, "twin": twin.LRUCache, "OrderedDict": OrderedDictLRU,
    }
    harness.header("Cache micro-benchmark",
                  " ".join([".venv/bin/python bench/bench_cache.py", *argv]))
    print(f"compiled module: {os.path.relpath(fast.__file__, harness.ROOT)}")
    check_same_semantics(impls)
    print("Semantics check: compiled, twin and OrderedDict baseline return the same "
          "results and counters on 30,000 random operations.")
    print()
    bench_lru(impls, args.quick, repeat)
    ratios = bench_bloom(fast, twin, args.quick, repeat)
    if not args.skip_memory:
        bench_memory(args.quick)
    membership = min(ratios["present"], ratios["absent"])
    verdict = "met" if membership >= BLOOM_GOAL_RATIO else "NOT met"
    print(f"Goal: compiled bloom membership checks >= {BLOOM_GOAL_RATIO:.0f}x the twin: "
          f"{harness.format_ratio(membership)} (the lower of present/absent): {verdict}.")


if __name__ == "__main__":
    main()
