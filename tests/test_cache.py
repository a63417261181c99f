"""Tests for ``notary.state.cache`` and both of its implementations.

Every behaviour test runs against the pure twin (``notary._fastcache_py``) and
the compiled module (``notary._fastcache``). The compiled parameter is skipped
when the extension is not built, except under ``NOTARY_REQUIRE_EXTENSION=1``
(``make test-compiled``), where a missing extension fails instead.
"""

from __future__ import annotations

import gc
import hashlib
import math
import os
import pickle
import subprocess
import sys
import weakref
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

import notary._fastcache_py as pure_impl
from notary.state import _cachecommon

try:
    import notary._fastcache as compiled_impl
except ImportError as exc:  # not built: the compiled parameter is skipped (or fails)
    compiled_impl = None
    COMPILED_IMPORT_ERROR: ImportError | None = exc
else:
    COMPILED_IMPORT_ERROR = None


def _flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


REQUIRE_EXTENSION = _flag("NOTARY_REQUIRE_EXTENSION")
NO_EXTENSIONS = _flag("NOTARY_NO_EXTENSIONS")
REPO_ROOT = Path(__file__).resolve().parents[1]
MISSING: Any = object()


def compiled_or_skip() -> ModuleType:
    if compiled_impl is not None:
        return compiled_impl
    reason = (
        f"notary._fastcache is not built ({COMPILED_IMPORT_ERROR}); "
        "build it with `python setup.py build_ext --inplace`"
    )
    if REQUIRE_EXTENSION:
        pytest.fail(f"NOTARY_REQUIRE_EXTENSION=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module", params=["pure", "compiled"])
def impl(request: pytest.FixtureRequest) -> ModuleType:
    if request.param == "pure":
        return pure_impl
    return compiled_or_skip()


def assert_consistent(cache: Any) -> None:
    stats = cache.statistics()
    assert len(cache) == stats.entries
    assert 0 <= stats.entries <= stats.max_entries
    assert 0 <= stats.bytes <= stats.max_bytes


# ---------------------------------------------------------------------------
# LRUCache
# ---------------------------------------------------------------------------


def test_get_makes_entry_most_recently_used(impl: ModuleType) -> None:
    cache = impl.LRUCache(max_entries=3, max_bytes=1000)
    for key in "abc":
        cache.put(key, key.upper(), 1)
    assert cache.get("a") == "A"  # a is now most recently used: b is next out
    cache.put("d", "D", 1)
    assert "b" not in cache
    assert [k for k in "abcd" if k in cache] == ["a", "c", "d"]
    cache.put("e", "E", 1)
    assert "c" not in cache
    assert cache.statistics().evictions == 2


def test_peek_and_contains_neither_reorder_nor_count(impl: ModuleType) -> None:
    cache = impl.LRUCache(max_entries=2, max_bytes=1000)
    cache.put("a", 1, 1)
    cache.put("b", 2, 1)
    assert cache.peek("a") == 1
    assert "a" in cache
    assert cache.peek("zz", "dflt") == "dflt"
    assert "zz" not in cache
    cache.put("c", 3, 1)  # a is still least recently used
    assert "a" not in cache
    stats = cache.statistics()
    assert (stats.hits, stats.misses) == (0, 0)


def test_get_counts_hits_and_misses_and_returns_default(impl: ModuleType) -> None:
    cache = impl.LRUCache(4, 100)
    value = object()
    cache.put("k", value, 3)
    assert cache.get("k") is value
    assert cache.get("nope") is None
    assert cache.get("nope", MISSING) is MISSING
    stats = cache.statistics()
    assert (stats.hits, stats.misses) == (1, 2)


def test_entry_bound(impl: ModuleType) -> None:
    cache = impl.LRUCache(max_entries=2, max_bytes=1000)
    for i in range(10):
        cache.put(i, i, 0)
        assert len(cache) == min(i + 1, 2)
    assert 8 in cache and 9 in cache
    stats = cache.statistics()
    assert (stats.entries, stats.bytes, stats.evictions) == (2, 0, 8)


def test_byte_bound(impl: ModuleType) -> None:
    cache = impl.LRUCache(max_entries=100, max_bytes=10)
    cache.put("a", "A", 4)
    cache.put("b", "B", 4)
    cache.put("c", "C", 4)  # 12 > 10: a goes
    assert "a" not in cache
    assert cache.statistics().bytes == 8
    cache.put("d", "D", 10)  # exactly max_bytes: everything else goes
    assert len(cache) == 1 and "d" in cache
    stats = cache.statistics()
    assert (stats.bytes, stats.evictions, stats.rejected) == (10, 3, 0)


def test_replacement_updates_value_size_and_recency(impl: ModuleType) -> None:
    cache = impl.LRUCache(max_entries=3, max_bytes=10)
    cache.put("a", "A1", 4)
    cache.put("b", "B", 4)
    cache.put("a", "A2", 2)  # replace: smaller, most recently used
    stats = cache.statistics()
    assert (stats.entries, stats.bytes, stats.evictions) == (2, 6, 0)
    assert cache.peek("a") == "A2"
    cache.put("c", "C", 4)  # 10: fits
    cache.put("d", "D", 1)  # 4 entries > 3: b (least recently used) goes, not a
    assert "b" not in cache and "a" in cache
    assert cache.statistics().bytes == 7


def test_replacement_growing_evicts_others_never_itself(impl: ModuleType) -> None:
    cache = impl.LRUCache(max_entries=10, max_bytes=10)
    cache.put("a", "A", 3)
    cache.put("b", "B", 3)
    cache.put("c", "C", 3)
    cache.put("a", "A-big", 9)  # a is MRU; b and c must go
    assert [k for k in "abc" if k in cache] == ["a"]
    stats = cache.statistics()
    assert (stats.entries, stats.bytes, stats.evictions) == (1, 9, 2)


def test_oversize_item_is_rejected_and_removes_old_value(impl: ModuleType) -> None:
    cache = impl.LRUCache(max_entries=10, max_bytes=10)
    cache.put("a", "A", 5)
    cache.put("b", "B", 5)
    cache.put("a", "A-huge", 11)
    assert "a" not in cache and "b" in cache
    cache.put("c", "C", 2**80)  # beyond any machine integer: still just rejected
    assert "c" not in cache
    stats = cache.statistics()
    assert (stats.entries, stats.bytes, stats.evictions, stats.rejected) == (1, 5, 0, 2)


def test_zero_size_entries_only_count_against_max_entries(impl: ModuleType) -> None:
    cache = impl.LRUCache(max_entries=3, max_bytes=1)
    for key in "abcd":
        cache.put(key, key, 0)
    assert len(cache) == 3
    assert cache.statistics().bytes == 0


def test_size_validation(impl: ModuleType) -> None:
    cache = impl.LRUCache(4, 100)
    cache.put("a", "A", 1)
    with pytest.raises(ValueError, match=r"^size must be non-negative, got -1$"):
        cache.put("a", "A2", -1)
    with pytest.raises(TypeError):
        cache.put("a", "A2", 1.5)
    assert cache.peek("a") == "A"
    cache.put("b", "B", True)  # an integer (operator.index) is fine
    assert cache.statistics().bytes == 2


@pytest.mark.parametrize(
    ("max_entries", "max_bytes", "error", "message"),
    [
        (0, 10, ValueError, r"^max_entries must be between 1 and \d+, got 0$"),
        (-5, 10, ValueError, r"^max_entries must be between 1 and \d+, got -5$"),
        (10, 0, ValueError, r"^max_bytes must be between 1 and \d+, got 0$"),
        (10, sys.maxsize + 1, ValueError, r"^max_bytes must be between 1 and \d+, got \d+$"),
        (1.5, 10, TypeError, "integer"),
        (10, "10", TypeError, "integer"),
    ],
)
def test_constructor_validation(
    impl: ModuleType, max_entries: Any, max_bytes: Any, error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        impl.LRUCache(max_entries, max_bytes)


def test_largest_bounds_are_accepted(impl: ModuleType) -> None:
    cache = impl.LRUCache(sys.maxsize, sys.maxsize)
    cache.put("a", "A", sys.maxsize)
    cache.put("b", "B", 1)  # total would be maxsize + 1: a goes
    stats = cache.statistics()
    assert (stats.entries, stats.bytes, stats.evictions) == (1, 1, 1)


def test_statistics_snapshot(impl: ModuleType) -> None:
    cache = impl.LRUCache(max_entries=2, max_bytes=10)
    cache.put("a", 1, 3)
    cache.put("b", 2, 3)
    cache.get("a")
    cache.get("a")
    cache.get("x")
    cache.put("c", 3, 3)  # evicts b
    cache.put("d", 4, 50)  # rejected
    stats = cache.statistics()
    assert stats == _cachecommon.CacheStatistics(
        entries=2, bytes=6, max_entries=2, max_bytes=10, hits=2, misses=1, evictions=1, rejected=1
    )
    assert type(stats) is impl.CacheStatistics is _cachecommon.CacheStatistics
    with pytest.raises(AttributeError):
        stats.hits = 5  # type: ignore[misc]


def test_invalidate(impl: ModuleType) -> None:
    cache = impl.LRUCache(4, 100)
    cache.put("a", "A", 7)
    cache.put("b", "B", 5)
    assert cache.invalidate("a") is True
    assert cache.invalidate("a") is False
    assert cache.invalidate("never") is False
    assert "a" not in cache
    stats = cache.statistics()
    assert (stats.entries, stats.bytes, stats.evictions) == (1, 5, 0)


def test_clear_empties_but_keeps_counters(impl: ModuleType) -> None:
    cache = impl.LRUCache(4, 100)
    for i in range(6):
        cache.put(i, i, 10)
    cache.get(5)
    cache.get(0)
    cache.clear()
    assert len(cache) == 0
    assert 5 not in cache
    stats = cache.statistics()
    assert (stats.entries, stats.bytes) == (0, 0)
    assert (stats.hits, stats.misses, stats.evictions) == (1, 1, 2)
    cache.put("again", 1, 1)  # still usable
    assert cache.get("again") == 1
    assert_consistent(cache)


def test_unhashable_key_raises_type_error(impl: ModuleType) -> None:
    cache = impl.LRUCache(4, 100)
    for call in (
        lambda: cache.get([]),
        lambda: cache.peek([]),
        lambda: cache.put([], 1, 1),
        lambda: cache.put([], 1, 1000),
        lambda: cache.invalidate([]),
        lambda: [] in cache,
    ):
        with pytest.raises(TypeError, match="unhashable"):
            call()
    assert cache.statistics() == impl.LRUCache(4, 100).statistics()


def test_cache_releases_values(impl: ModuleType) -> None:
    class Value:
        pass

    cache = impl.LRUCache(2, 100)
    refs = []
    for i in range(4):
        value = Value()
        refs.append(weakref.ref(value))
        cache.put(i, value, 1)
    del value
    assert [r() is None for r in refs] == [True, True, False, False]  # evicted ones freed
    cache.put(3, "replacement", 1)
    assert refs[3]() is None
    cache.clear()
    assert refs[2]() is None
    cache_ref = weakref.ref(cache)
    del cache
    gc.collect()
    assert cache_ref() is None


def test_cache_is_not_picklable(impl: ModuleType) -> None:
    with pytest.raises(TypeError, match="cannot pickle 'LRUCache' object"):
        pickle.dumps(impl.LRUCache(1, 1))


def test_reentrant_finalizers_leave_cache_consistent(impl: ModuleType) -> None:
    """Values whose finalizers use the cache while it evicts, replaces, clears or dies."""
    cache = impl.LRUCache(max_entries=3, max_bytes=12)
    cache_ref = weakref.ref(cache)
    failures: list[BaseException] = []
    finalized = []

    class Meddler:
        def __init__(self, tag: int) -> None:
            self.tag = tag

        def __del__(self) -> None:
            finalized.append(self.tag)
            target = cache_ref()
            if target is None:
                return
            try:
                target.put(("from-finalizer", self.tag % 5), "plain", 2)
                target.get(0)
                target.invalidate(self.tag - 2)
                assert_consistent(target)
            except BaseException as exc:  # reported below, not swallowed
                failures.append(exc)

    for i in range(50):
        cache.put(i % 7, Meddler(i), 1 + i % 5)
        assert_consistent(cache)
    cache.clear()
    assert_consistent(cache)
    cache.put("last", Meddler(99), 1)
    cache.put("last", Meddler(100), 1)
    del cache
    gc.collect()
    assert cache_ref() is None
    assert not failures, failures
    assert sorted(finalized) == [*range(50), 99, 100]


def test_reentrant_key_comparisons_leave_cache_consistent(impl: ModuleType) -> None:
    """Keys whose __eq__ mutates the cache in the middle of a dict operation."""
    cache = impl.LRUCache(max_entries=4, max_bytes=100)
    busy = False

    class Key:
        def __init__(self, n: int) -> None:
            self.n = n

        def __hash__(self) -> int:
            return 42  # every Key collides: dict lookups call __eq__

        def __eq__(self, other: object) -> bool:
            nonlocal busy
            if not busy:
                busy = True
                try:
                    cache.invalidate(Key(self.n + 1))
                    cache.put(f"s{self.n % 3}", self.n, 1)
                finally:
                    busy = False
            return isinstance(other, Key) and other.n == self.n

    for i in range(40):
        cache.put(Key(i % 6), i, 1 + i % 3)
        cache.get(Key(i % 5))
        assert_consistent(cache)
    for i in range(6):
        cache.invalidate(Key(i))
    assert_consistent(cache)


def test_key_whose_hash_changes_is_still_evicted(impl: ModuleType) -> None:
    class Mutable:
        def __init__(self) -> None:
            self.h = 1

        def __hash__(self) -> int:
            return self.h

    cache = impl.LRUCache(max_entries=2, max_bytes=100)
    broken = Mutable()
    cache.put(broken, "x", 10)
    broken.h = 2  # now no dict can find it
    assert broken not in cache
    cache.put("a", 1, 1)
    cache.put("b", 2, 1)  # evicts broken, without hanging
    assert_consistent(cache)
    assert cache.statistics().bytes == 2
    broken.h = 1  # findable again, but it was evicted
    assert broken not in cache
    assert cache.get(broken, MISSING) is MISSING
    cache.put(broken, "y", 1)
    assert cache.peek(broken) == "y"
    assert_consistent(cache)


class ModelLRU:
    """The obviously correct reference: a list of (key, value, size), LRU first."""

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.items: list[tuple[Any, Any, int]] = []
        self.hits = self.misses = self.evictions = self.rejected = 0

    def _index(self, key: Any) -> int | None:
        for i, (k, _, _) in enumerate(self.items):
            if k == key:
                return i
        return None

    def get(self, key: Any, default: Any) -> Any:
        i = self._index(key)
        if i is None:
            self.misses += 1
            return default
        self.hits += 1
        self.items.append(self.items.pop(i))
        return self.items[-1][1]

    def peek(self, key: Any, default: Any) -> Any:
        i = self._index(key)
        return default if i is None else self.items[i][1]

    def put(self, key: Any, value: Any, size: int) -> None:
        self.invalidate(key)
        if size > self.max_bytes:
            self.rejected += 1
            return
        self.items.append((key, value, size))
        while len(self.items) > self.max_entries or self.total() > self.max_bytes:
            self.items.pop(0)
            self.evictions += 1

    def invalidate(self, key: Any) -> bool:
        i = self._index(key)
        if i is None:
            return False
        del self.items[i]
        return True

    def total(self) -> int:
        return sum(size for _, _, size in self.items)

    def statistics(self) -> _cachecommon.CacheStatistics:
        return _cachecommon.CacheStatistics(
            entries=len(self.items),
            bytes=self.total(),
            max_entries=self.max_entries,
            max_bytes=self.max_bytes,
            hits=self.hits,
            misses=self.misses,
            evictions=self.evictions,
            rejected=self.rejected,
        )


STATE_KEY_SPACE = ["a", "b", "c", "d", "e", "f", 1, 2]
STATE_KEYS = st.sampled_from(STATE_KEY_SPACE)
STATE_SIZES = st.one_of(st.integers(0, 6), st.integers(0, 45))  # mostly fits, sometimes not


def lru_machine(module: ModuleType) -> type[RuleBasedStateMachine]:
    """A state machine running ``module.LRUCache`` and ``ModelLRU`` side by side.

    Recency order only shows through which entry a later put evicts, so the
    parameters favour that: more keys than ``max_entries``, sizes mostly small
    next to ``max_bytes``, gets mostly of present keys, and rare clears.
    """

    class LRUMachine(RuleBasedStateMachine):
        @initialize(max_entries=st.integers(1, 4), max_bytes=st.integers(1, 40))
        def create(self, max_entries: int, max_bytes: int) -> None:
            self.cache = module.LRUCache(max_entries, max_bytes)
            self.model = ModelLRU(max_entries, max_bytes)

        @rule(key=STATE_KEYS, value=st.integers(), size=STATE_SIZES)
        def put(self, key: Any, value: int, size: int) -> None:
            self.cache.put(key, value, size)
            self.model.put(key, value, size)

        @rule(size=st.integers(0, 3))
        def put_new_key(self, size: int) -> None:
            # A key never seen before: when the cache is full this evicts the
            # least recently used entry, which is how order becomes visible.
            self.fresh = getattr(self, "fresh", 0) + 1
            key = f"fresh-{self.fresh}"
            self.cache.put(key, self.fresh, size)
            self.model.put(key, self.fresh, size)

        @rule(data=st.data())
        def get(self, data: st.DataObject) -> None:
            present = [k for k, _, _ in self.model.items]
            keys = st.one_of(st.sampled_from(present), STATE_KEYS) if present else STATE_KEYS
            key = data.draw(keys, label="key")
            assert self.cache.get(key, MISSING) == self.model.get(key, MISSING)

        @rule(key=STATE_KEYS)
        def invalidate(self, key: Any) -> None:
            assert self.cache.invalidate(key) == self.model.invalidate(key)

        @rule(dice=st.integers(0, 9))
        def clear(self, dice: int) -> None:
            if dice == 0:  # rarely: a clear erases the order under test
                self.cache.clear()
                self.model.items.clear()

        @invariant()
        def same_state(self) -> None:
            assert self.cache.statistics() == self.model.statistics()
            assert len(self.cache) == len(self.model.items)
            for key in STATE_KEY_SPACE:
                assert (key in self.cache) == (self.model.peek(key, MISSING) is not MISSING)
                assert self.cache.peek(key, MISSING) == self.model.peek(key, MISSING)

    return LRUMachine


def test_lru_matches_model(impl: ModuleType) -> None:
    run_state_machine_as_test(
        lru_machine(impl),
        settings=settings(max_examples=100, stateful_step_count=50, deadline=None),
    )


# ---------------------------------------------------------------------------
# BloomFilter
# ---------------------------------------------------------------------------


def reference_positions(digest: bytes, bits: int, hashes: int) -> set[int]:
    """Bit positions straight from the specification."""
    h1 = int.from_bytes(digest[0:8], "little")
    h2 = int.from_bytes(digest[8:16], "little") | 1
    return {((h1 + i * h2) % 2**64) % bits for i in range(hashes)}


def set_bits(serialised: bytes) -> set[int]:
    array = serialised[_cachecommon.BLOOM_HEADER_BYTES :]
    return {i for i in range(len(array) * 8) if array[i >> 3] >> (i & 7) & 1}


@pytest.mark.parametrize(
    ("n", "p", "bits", "hashes"),
    [
        (10_000, 0.01, 95_872, 7),
        (100, 0.01, 960, 7),
        (10, 0.1, 64, 4),
        (1, 1e-12, 64, 32),  # k clamped to 32
        (1_000_000, 0.5, 1_442_752, 1),
    ],
)
def test_bloom_sizing(impl: ModuleType, n: int, p: float, bits: int, hashes: int) -> None:
    stats = impl.BloomFilter(n, p).statistics()
    assert (stats.bits, stats.hashes, stats.items_added, stats.bits_set) == (bits, hashes, 0, 0)
    assert stats.estimated_false_positive_rate == 0.0


@given(n=st.integers(1, 10**7), p=st.floats(1e-9, 0.999))
def test_bloom_sizing_formula(n: int, p: float) -> None:
    bits, hashes = _cachecommon.bloom_parameters(n, p)
    exact = math.ceil(-n * math.log(p) / math.log(2) ** 2)
    assert bits % 64 == 0
    assert exact <= bits < exact + 64 or bits == 64
    assert hashes == min(32, max(1, round(bits / n * math.log(2))))


@pytest.mark.parametrize(
    ("n", "p", "error", "message"),
    [
        (0, 0.01, ValueError, r"^expected_items must be at least 1, got 0$"),
        (10, 0.0, ValueError, r"^false_positive_rate must be strictly between 0 and 1, got 0\.0$"),
        (10, 1, ValueError, r"^false_positive_rate must be strictly between 0 and 1, got 1$"),
        (10, -0.5, ValueError, "strictly between"),
        (10, float("nan"), ValueError, "strictly between"),
        (10.0, 0.01, TypeError, "integer"),
    ],
)
def test_bloom_constructor_validation(
    impl: ModuleType, n: Any, p: Any, error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        impl.BloomFilter(n, p)


def test_bloom_sets_exactly_the_specified_bits(impl: ModuleType) -> None:
    digests = [bytes(range(16)), b"\xff" * 16, b"\x00" * 16, impl.bloom_digest(b"example.com:443")]
    for digest in digests:
        bloom = impl.BloomFilter(100, 0.01)
        bloom.add(digest)
        assert set_bits(bloom.to_bytes()) == reference_positions(digest, 960, 7)
        assert digest in bloom


def test_bloom_digest_details(impl: ModuleType) -> None:
    assert impl.bloom_digest(b"x") == hashlib.blake2b(b"x", digest_size=16).digest()
    digest = impl.bloom_digest(b"example.com:443")
    bloom = impl.BloomFilter(100, 0.01)
    bloom.add(bytearray(digest) + b"ignored tail")  # bytes-like; only 16 bytes used
    assert digest in bloom
    assert memoryview(digest) in bloom
    assert set_bits(bloom.to_bytes()) == reference_positions(digest, 960, 7)
    with pytest.raises(ValueError, match=r"^bloom digest must be at least 16 bytes, got 15$"):
        bloom.add(digest[:15])
    with pytest.raises(ValueError, match="at least 16 bytes, got 0"):
        b"" in bloom  # noqa: B015
    with pytest.raises(TypeError):
        bloom.add("0123456789abcdef0123")
    with pytest.raises(TypeError):
        12345 in bloom  # noqa: B015
    assert bloom.statistics().items_added == 1


@settings(max_examples=200, deadline=None)
@given(items=st.lists(st.binary(max_size=40), max_size=300))
def test_bloom_never_a_false_negative(impl: ModuleType, items: list[bytes]) -> None:
    bloom = impl.BloomFilter(10, 0.1)  # deliberately overfilled
    for item in items:
        bloom.add(impl.bloom_digest(item))
    for item in items:
        assert impl.bloom_digest(item) in bloom
    assert bloom.statistics().items_added == len(items)


def test_bloom_false_positive_rate_near_target(impl: ModuleType) -> None:
    target = 0.01
    bloom = impl.BloomFilter(10_000, target)
    for i in range(10_000):
        bloom.add(impl.bloom_digest(b"member:%d" % i))
    probes = 20_000
    false_positives = sum(impl.bloom_digest(b"outsider:%d" % i) in bloom for i in range(probes))
    measured = false_positives / probes
    assert target / 2 <= measured <= target * 2, measured
    estimate = bloom.statistics().estimated_false_positive_rate
    assert target / 2 <= estimate <= target * 2, estimate


def test_bloom_statistics(impl: ModuleType) -> None:
    bloom = impl.BloomFilter(1000, 0.01)
    digest = impl.bloom_digest(b"a")
    bloom.add(digest)
    bloom.add(digest)
    bloom.add(impl.bloom_digest(b"b"))
    stats = bloom.statistics()
    assert type(stats) is impl.BloomStatistics is _cachecommon.BloomStatistics
    assert stats.items_added == 3
    assert stats.bits_set == len(set_bits(bloom.to_bytes()))
    assert 7 < stats.bits_set <= 14
    assert stats.estimated_false_positive_rate == (stats.bits_set / stats.bits) ** stats.hashes


def test_bloom_serialisation_round_trip(impl: ModuleType) -> None:
    bloom = impl.BloomFilter(500, 0.02)
    digests = [impl.bloom_digest(b"%d" % i) for i in range(300)]
    for digest in digests[:150]:
        bloom.add(digest)
    data = bloom.to_bytes()
    assert data[:4] == b"NTBF"
    copy = impl.BloomFilter.from_bytes(data)
    assert type(copy) is impl.BloomFilter
    assert copy.to_bytes() == data
    assert copy.statistics() == bloom.statistics()
    assert [d in copy for d in digests] == [d in bloom for d in digests]
    assert impl.BloomFilter.from_bytes(bytearray(data)).to_bytes() == data
    copy.add(digests[200])  # the copy is independent
    assert bloom.to_bytes() == data
    unpickled = pickle.loads(pickle.dumps(bloom))
    assert type(unpickled) is impl.BloomFilter
    assert unpickled.to_bytes() == data


def _corrupt(data: bytes, offset: int, replacement: bytes) -> bytes:
    return data[:offset] + replacement + data[offset + len(replacement) :]


def test_bloom_from_bytes_rejects_garbage(impl: ModuleType) -> None:
    good = impl.BloomFilter(10, 0.1).to_bytes()
    bad = {
        "short": good[:10],
        "magic": _corrupt(good, 0, b"XXXX"),
        "version": _corrupt(good, 4, b"\x02"),
        "hashes": _corrupt(good, 5, b"\x00"),
        "reserved": _corrupt(good, 6, b"\x01"),
        "bits": _corrupt(good, 8, (65).to_bytes(8, "little")),
        "length": good + b"\x00",
    }
    for name, data in bad.items():
        with pytest.raises(ValueError, match=r"^invalid bloom filter serialisation: "):
            impl.BloomFilter.from_bytes(data)
            pytest.fail(name)
    with pytest.raises(TypeError):
        impl.BloomFilter.from_bytes("text")


# ---------------------------------------------------------------------------
# The two implementations against each other
# ---------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(1, 5000),
    p=st.floats(1e-6, 0.5),
    digests=st.lists(st.binary(min_size=16, max_size=24), max_size=200),
    probes=st.lists(st.binary(min_size=16, max_size=16), max_size=200),
)
def test_bloom_implementations_set_identical_bits(
    n: int, p: float, digests: list[bytes], probes: list[bytes]
) -> None:
    compiled = compiled_or_skip()
    fast, slow = compiled.BloomFilter(n, p), pure_impl.BloomFilter(n, p)
    for digest in digests:
        fast.add(digest)
        slow.add(digest)
    assert fast.to_bytes() == slow.to_bytes()
    assert fast.statistics() == slow.statistics()
    assert [d in fast for d in probes] == [d in slow for d in probes]
    assert compiled.BloomFilter.from_bytes(slow.to_bytes()).to_bytes() == fast.to_bytes()
    assert pure_impl.BloomFilter.from_bytes(fast.to_bytes()).to_bytes() == slow.to_bytes()


def _outcome(call: Any) -> tuple[str, Any]:
    try:
        result = call()
    except Exception as exc:  # the point is to compare any exception
        return type(exc).__name__, str(exc)
    return "ok", result


def test_implementations_raise_identical_errors() -> None:
    compiled = compiled_or_skip()

    def calls(m: ModuleType) -> list[Any]:
        cache = m.LRUCache(2, 10)
        bloom = m.BloomFilter(10, 0.1)
        return [
            lambda: m.LRUCache(0, 1),
            lambda: m.LRUCache(1, 0),
            lambda: m.LRUCache(1, sys.maxsize + 1),
            lambda: m.LRUCache("1", 1),
            lambda: m.LRUCache(1.0, 1),
            lambda: cache.put("k", 1, -3),
            lambda: cache.put("k", 1, 2.5),
            lambda: cache.put("k", 1, None),
            lambda: cache.put({}, 1, 1),
            lambda: cache.put({}, 1, 99),
            lambda: cache.get([]),
            lambda: cache.peek(set()),
            lambda: cache.invalidate([]),
            lambda: [] in cache,
            lambda: pickle.dumps(cache),
            lambda: m.BloomFilter(0, 0.1),
            lambda: m.BloomFilter(10, 1.0),
            lambda: m.BloomFilter(10, "x"),
            lambda: m.BloomFilter(10, None),
            lambda: m.BloomFilter(2**70, 1e-300),
            lambda: bloom.add(b"short"),
            lambda: bloom.add("a string, not bytes"),
            lambda: bloom.add(None),
            lambda: b"" in bloom,
            lambda: m.BloomFilter.from_bytes(b"NTBF"),
            lambda: m.BloomFilter.from_bytes(None),
            lambda: m.bloom_digest("text"),
            lambda: repr(cache),
            lambda: repr(bloom),
        ]

    assert [_outcome(c) for c in calls(compiled)] == [_outcome(c) for c in calls(pure_impl)]


def test_shared_types_are_shared() -> None:
    compiled = compiled_or_skip()
    assert compiled.CacheStatistics is pure_impl.CacheStatistics
    assert compiled.BloomStatistics is pure_impl.BloomStatistics
    assert compiled.bloom_digest is pure_impl.bloom_digest


# ---------------------------------------------------------------------------
# Selection in notary.state.cache
# ---------------------------------------------------------------------------


def run_selection(env_overrides: dict[str, str], *, block_compiled: bool = False) -> Any:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("NOTARY_NO_EXTENSIONS", "NOTARY_REQUIRE_EXTENSION")
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.update(env_overrides)
    code = "import notary.state.cache as c; print(c.IMPLEMENTATION)"
    if block_compiled:  # an import of notary._fastcache now raises ImportError
        code = "import sys; sys.modules['notary._fastcache'] = None; " + code
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_no_extensions_selects_pure() -> None:
    result = run_selection({"NOTARY_NO_EXTENSIONS": "1"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "pure"


def test_default_selects_compiled_when_built() -> None:
    result = run_selection({"NOTARY_NO_EXTENSIONS": "0"})  # "0" means unset
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ("compiled" if compiled_impl is not None else "pure")


def test_missing_extension_falls_back_to_pure() -> None:
    result = run_selection({}, block_compiled=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "pure"


def test_missing_extension_is_an_error_when_required() -> None:
    result = run_selection({"NOTARY_REQUIRE_EXTENSION": "1"}, block_compiled=True)
    assert result.returncode != 0
    assert (
        "ImportError: compiled module required but notary._fastcache failed to import"
        in result.stderr
    )


def test_contradictory_flags_are_an_error() -> None:
    result = run_selection({"NOTARY_NO_EXTENSIONS": "1", "NOTARY_REQUIRE_EXTENSION": "1"})
    assert result.returncode != 0
    assert "both set" in result.stderr


def test_selected_implementation() -> None:
    """Fails under NOTARY_REQUIRE_EXTENSION=1 when the compiled cache silently failed to build."""
    import notary.state.cache

    if REQUIRE_EXTENSION:
        assert notary.state.cache.IMPLEMENTATION == "compiled", COMPILED_IMPORT_ERROR
        expected = compiled_impl
    elif NO_EXTENSIONS:
        assert notary.state.cache.IMPLEMENTATION == "pure"
        expected = pure_impl
    else:
        expected = compiled_impl if compiled_impl is not None else pure_impl
        expected_name = "compiled" if compiled_impl is not None else "pure"
        actual = notary.state.cache.IMPLEMENTATION
        assert actual == expected_name
    assert expected is not None
    assert notary.state.cache.LRUCache is expected.LRUCache
    assert notary.state.cache.BloomFilter is expected.BloomFilter
    assert notary.state.cache.bloom_digest is expected.bloom_digest
    assert notary.state.cache.CacheStatistics is _cachecommon.CacheStatistics
    assert notary.state.cache.BloomStatistics is _cachecommon.BloomStatistics
