"""Cache micro-benchmark: LRU and Bloom filter, compiled vs pure-Python twin.

    .venv/bin/python bench/bench_cache.py            # full run (about three minutes)
    .venv/bin/python bench/bench_cache.py --quick    # smoke run (seconds)

What each table measures and how it is timed: ``bench/README.md``.
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
from functools import partial
from types import ModuleType
from typing import Any

# Importing harness also puts the project root on sys.path.
from harness.options import argument_parser, repetitions
from harness.project import ROOT
from harness.report import format_rate, format_ratio, header, print_table
from harness.runs import best_seconds, rate

from notary.state._cachecommon import CacheStatistics

#: Bloom filter goal of the issue: compiled membership checks >= 10x the twin.
BLOOM_GOAL_RATIO = 10.0
#: The module of each implementation measured, by its name in the tables.
MODULES = {"compiled": "notary._fastcache", "twin": "notary._fastcache_py"}


class OrderedDictLRU:
    """The textbook LRU on ``collections.OrderedDict``, with ``LRUCache``'s bounds, ``get``/``put``
    semantics and counters, without its robustness against keys whose ``__eq__``/``__hash__``
    misbehave."""

    __slots__ = ("_bytes", "_evictions", "_hits", "_map", "_max_bytes", "_max_entries",
                 "_misses", "_rejected")

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self._map: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._max_entries, self._max_bytes = max_entries, max_bytes
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

    def statistics(self) -> CacheStatistics:
        return CacheStatistics(len(self._map), self._bytes, self._max_entries, self._max_bytes,
                               self._hits, self._misses, self._evictions, self._rejected)


def check_same_semantics(factories: dict[str, Callable[[int, int], Any]]) -> None:
    """Drive every LRU with one random operation sequence; exit if one differs from the compiled."""
    rng = random.Random(7)
    ops = [(rng.random() < 0.6, rng.randrange(300), rng.choice((1, 10, 100, 2_000)))
           for _ in range(30_000)]
    traces = {}
    for name, factory in factories.items():
        cache = factory(100, 5_000)
        results = [cache.get(key) if is_get else cache.put(key, (key, size), size)
                   for is_get, key, size in ops]  # a put's result is None
        traces[name] = (results, cache.statistics())
    for name, trace in traces.items():
        if trace != traces["compiled"]:
            sys.exit(f"bench_cache: {name} behaves unlike the compiled cache; fix the baseline")


def time_calls(call: Callable[[Any], object], args: Sequence[Any]) -> float:
    """Seconds of ``call(arg)`` over ``args``; every timed loop calls bound methods from locals."""
    start = time.perf_counter()
    for arg in args:
        call(arg)
    return time.perf_counter() - start


def time_puts(put: Callable[..., None], keys: Sequence[str], value: object, size: int) -> float:
    start = time.perf_counter()
    for key in keys:
        put(key, value, size)
    return time.perf_counter() - start


def time_mixed(get: Callable[[str], object], put: Callable[..., None],
               ops: Sequence[tuple[str, bool]], value: object, size: int) -> float:
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


def time_digest_checks(digest: Callable[[bytes], bytes], bloom: Any, items: Sequence[bytes]
                       ) -> float:
    start = time.perf_counter()
    for item in items:
        digest(item) in bloom  # noqa: B015
    return time.perf_counter() - start


def best_rates(passes: dict[str, tuple[int, Callable[[], float]]], repeat: int) -> dict[str, float]:
    """Operations per second of each pass (operations, timed loop), best of ``repeat``, in order."""
    return {key: rate(count, best_seconds(run, repeat))
            for key, (count, run) in passes.items()}


def print_rates(title: str, labels: dict[str, str], rates: dict[str, dict[str, float]]) -> None:
    """Print a table: a row per label, ``rates[implementation][key]`` per second, pair ratios."""
    names = list(rates)
    pairs = list(itertools.combinations(names, 2))
    print(f"{title}\n")
    print_table(
        ["operation", *names, *(f"{a} / {b}" for a, b in pairs)],
        [[label, *(format_rate(rates[name][key]) for name in names),
          *(format_ratio(rates[a][key] / rates[b][key]) for a, b in pairs)]
         for key, label in labels.items()],
    )


def target_key(i: int) -> str:
    return f"host{i}.example.test:443"


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
    # Zipf(1.0) keys: P(rank r) proportional to 1 / r, popularity independent of the key's name.
    by_popularity = list(range(universe_size))
    rng.shuffle(by_popularity)
    zipf = itertools.accumulate(1.0 / rank for rank in range(1, universe_size + 1))
    mixed_ops = [(target_key(i), rng.random() < 0.10)
                 for i in rng.choices(by_popularity, cum_weights=list(zipf), k=n_ops)]

    rates: dict[str, dict[str, float]] = {}
    hit_rates: dict[str, float] = {}
    for name, factory in impls.items():
        cache = factory(capacity, max_bytes)
        for key in resident:
            cache.put(key, value, size)
        rates[name] = best_rates({  # put_new last: it evicts the resident keys
            "get_hit": (n_ops, partial(time_calls, cache.get, hit_keys)),
            "get_miss": (n_ops, partial(time_calls, cache.get, miss_keys)),
            "put_replace": (n_ops, partial(time_puts, cache.put, hit_keys, value, size)),
            "put_new": (len(fresh), partial(time_puts, cache.put, fresh, value, size)),
        }, repeat)
        del cache
        gc.collect()
        cache = factory(capacity, max_bytes)
        mixed = partial(time_mixed, cache.get, cache.put, mixed_ops, value, size)
        mixed()  # warm up to the steady state
        before = cache.statistics()
        rates[name]["mixed"] = rate(n_ops, best_seconds(mixed, repeat))
        after = cache.statistics()
        hits, misses = after.hits - before.hits, after.misses - before.misses
        hit_rates[name] = hits / (hits + misses) if hits + misses else 0.0
        del cache, mixed
        gc.collect()
    loop_rate = best_rates({"loop": (n_ops, partial(time_empty_loop, hit_keys))}, repeat)["loop"]

    print_rates(f"## LRU cache: operations per second (capacity {capacity:,} entries, "
                f"{n_ops:,} operations per pass, best of {repeat})", {
                    "get_hit": "get, hit (random resident key)",
                    "get_miss": "get, miss",
                    "put_new": "put, new key (evicts the LRU one)",
                    "put_replace": "put, replace a resident key",
                    "mixed": f"mixed 90% get / 10% put, Zipf(1.0) over {universe_size:,} keys",
                }, rates)
    print("Mixed-workload get hit rate at steady state: "
          + ", ".join(f"{name} {rate:.1%}" for name, rate in hit_rates.items()))
    print(f"Reference: the empty `for` loop over the same keys runs at "
          f"{format_rate(loop_rate)} ({1e9 / loop_rate:.0f} ns per iteration, "
          f"included in every figure above).\n")


def bench_bloom(modules: dict[str, ModuleType], quick: bool, repeat: int) -> float:
    """Print the Bloom filter table; return the lower compiled / twin ratio of membership checks."""
    expected = 50_000 if quick else 1_000_000
    n_ops = 20_000 if quick else 300_000
    fpr = 0.01
    digest = modules["compiled"].bloom_digest
    digests = [digest(target_key(i).encode()) for i in range(expected)]
    rng = random.Random(2)
    # Fresh digests and keys, allocated in the order they are used (as a caller
    # computes the digest right before the check); picking stored objects at
    # random would time cache misses on their headers, not the filter.
    present = [digest(target_key(rng.randrange(expected)).encode()) for _ in range(n_ops)]
    absent = [digest(f"absent{i}.example.test:443".encode()) for i in range(n_ops)]
    lookup_keys = [target_key(rng.randrange(expected)).encode() for _ in range(n_ops)]
    extra = [digest(f"extra{i}.example.test:443".encode()) for i in range(n_ops)]

    rates: dict[str, dict[str, float]] = {}
    false_positives: dict[str, float] = {}
    for name, module in modules.items():
        bloom = module.BloomFilter(expected, fpr)
        for d in digests:
            bloom.add(d)
        stats = bloom.statistics()
        false_positives[name] = sum(d in bloom for d in absent) / len(absent)
        rates[name] = best_rates({  # adds go to a new, empty filter each pass
            "add": (n_ops, lambda m=module: time_calls(m.BloomFilter(expected, fpr).add, extra)),
            "present": (n_ops, partial(time_contains, bloom, present)),
            "absent": (n_ops, partial(time_contains, bloom, absent)),
            "digest": (n_ops, partial(time_digest_checks, module.bloom_digest, bloom, lookup_keys)),
        }, repeat)
        del bloom
        gc.collect()

    print_rates(f"## Bloom filter: operations per second ({expected:,} items at {fpr:.0%} "
                f"false positives: {stats.bits:,} bits = {stats.bits / 8 / 2**20:.2f} MiB, "
                f"{stats.hashes} hashes; {n_ops:,} operations per pass, best of {repeat})", {
                    "present": "`digest in bloom`, digest present",
                    "absent": "`digest in bloom`, digest absent",
                    "add": "`bloom.add(digest)`",
                    "digest": "`bloom_digest(key) in bloom` (hashing included)",
                }, rates)
    print("Measured false-positive rate on absent digests: "
          + ", ".join(f"{name} {rate:.3%}" for name, rate in false_positives.items()) + "\n")
    return min(rates["compiled"][key] / rates["twin"][key] for key in ("present", "absent"))


def memory_child(impl: str, targets: int, method: str) -> None:
    """Runs in a subprocess: print a JSON line with bytes per target."""
    module = MODULES.get(impl)  # None: the OrderedDict baseline
    factory = importlib.import_module(module).LRUCache if module else OrderedDictLRU
    keys: list[Any] = [None] * targets
    values: list[Any] = [None] * targets

    def measure() -> int:
        if method == "tracemalloc":
            return tracemalloc.get_traced_memory()[0]
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    gc.collect()
    if method == "tracemalloc":
        tracemalloc.start()
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
    assert cache.statistics().entries == targets
    print(json.dumps({"data": (data_done - start) / targets,
                      "cache": (cache_done - empty_cache) / targets}))


def bench_memory(quick: bool) -> None:
    targets = 20_000 if quick else 1_000_000
    impls = ("compiled", "twin", "OrderedDict")
    results: dict[tuple[str, str], dict[str, float]] = {}
    for impl, method in itertools.product(impls, ("tracemalloc", "rss")):
        command = [sys.executable, __file__, "--memory-child", impl, str(targets), method]
        out = subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT)
        results[impl, method] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"## Memory per cached target ({targets:,} targets, one subprocess per "
          f"implementation and method)\n")
    print("Each target: a key `str` (`host123456.example.test:443`) and a value "
          "`(body, (first_seen, last_seen))` with a distinct 300-byte `bytes` body; "
          "the declared size is a fresh `int` per put.\n")
    data = results["compiled", "tracemalloc"]["data"]
    print_table(
        ["implementation", "cache overhead, tracemalloc", "cache overhead, RSS delta",
         "overhead / data"],
        [[impl, f"{results[impl, 'tracemalloc']['cache']:.0f} B/target",
          f"{results[impl, 'rss']['cache']:.0f} B/target",
          f"{results[impl, 'tracemalloc']['cache'] / data:.0%}"]
         for impl in impls],
    )
    print(f"The data itself (key + value objects, held outside the cache): "
          f"{data:.0f} B/target by tracemalloc, "
          f"{results['compiled', 'rss']['data']:.0f} B/target by RSS delta. "
          f"The Bloom filter adds 1.2 B/target at 1% false positives (9.59 bits/item).\n")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--memory-child"]:
        memory_child(argv[1], int(argv[2]), argv[3])
        return
    parser = argument_parser(__doc__.split("\n", 1)[0])
    parser.add_argument("--skip-memory", action="store_true",
                        help="leave out the memory measurement (the slowest part)")
    args = parser.parse_args(argv)
    repeat = repetitions(args, full=3)
    try:
        compiled = importlib.import_module(MODULES["compiled"])
    except ImportError as exc:
        sys.exit(f"bench_cache: the compiled cache {MODULES['compiled']} does not import ({exc}).\n"
                 f"Build it first: cd {ROOT} && .venv/bin/python setup.py build_ext --inplace")
    modules = {"compiled": compiled, "twin": importlib.import_module(MODULES["twin"])}
    impls = {name: module.LRUCache for name, module in modules.items()}
    impls["OrderedDict"] = OrderedDictLRU
    header("Cache micro-benchmark",
           " ".join([".venv/bin/python bench/bench_cache.py", *argv]))
    print(f"compiled module: {os.path.relpath(compiled.__file__, ROOT)}")
    check_same_semantics(impls)
    print("Semantics check: compiled, twin and OrderedDict baseline return the same "
          "results and counters on 30,000 random operations.\n")
    bench_lru(impls, args.quick, repeat)
    membership = bench_bloom(modules, args.quick, repeat)
    if not args.skip_memory:
        bench_memory(args.quick)
    verdict = "met" if membership >= BLOOM_GOAL_RATIO else "NOT met"
    print(f"Goal: compiled bloom membership checks >= {BLOOM_GOAL_RATIO:.0f}x the twin: "
          f"{format_ratio(membership)} (the lower of present/absent): {verdict}.")


if __name__ == "__main__":
    main()
