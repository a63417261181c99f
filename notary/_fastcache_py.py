"""Pure-Python twin of ``notary._fastcache``.

Behaviour, exception types and messages are identical to the compiled module;
``tests/test_cache.py`` runs every behaviour test against both. Import the
cache through ``notary.state.cache``, which picks one of the two.
"""

from __future__ import annotations

import struct
from collections.abc import Hashable
from typing import Any

from notary.state._cachecommon import (
    BLOOM_DIGEST_BYTES,
    BloomStatistics,
    CacheStatistics,
    bloom_digest,
    bloom_parameters,
    bloom_statistics,
    cache_not_picklable,
    check_bound,
    check_size,
    pack_bloom_header,
    short_digest_error,
    unpack_bloom_bytes,
)

__all__ = ["BloomFilter", "BloomStatistics", "CacheStatistics", "LRUCache", "bloom_digest"]

_MASK64 = (1 << 64) - 1
_unpack_words = struct.Struct("<QQ").unpack_from


class _Node:
    """One cache entry and its links in the recency list."""

    __slots__ = ("key", "next", "prev", "size", "value")

    def __init__(self, key: Any, value: Any, size: int) -> None:
        self.prev: _Node | None = None
        self.next: _Node | None = None
        self.key = key
        self.value = value
        self.size = size


class LRUCache:
    """Bounded LRU map: at most max_entries entries and max_bytes total of caller-declared sizes.

    ``get`` counts a hit or a miss and makes a hit the most recently used entry;
    ``peek`` and ``in`` neither count nor reorder. ``put`` inserts or replaces
    (a replacement becomes most recently used and takes the new size), then
    evicts least recently used entries until both bounds hold. An item whose
    size alone exceeds ``max_bytes`` is not stored: it removes any old value
    under its key and is counted in ``rejected``.

    Error handling: a bound that is not an integer in ``[1, sys.maxsize]`` or a
    negative size raises ``ValueError``; a non-integer bound or size raises
    ``TypeError``, as does an unhashable key.

    The layout mirrors the compiled module (see the invariants at the top of
    ``notary/_fastcache.pyx``): a dict from key to ``_Node`` plus a circular
    doubly linked list through ``_root`` (``_root.next`` is the most recently
    used); a node is linked exactly when ``node.prev`` is not None, and a node
    found in the dict but unlinked counts as absent. A plain dict is used
    rather than ``OrderedDict`` because CPython's C ``OrderedDict`` can crash
    when a key's ``__eq__`` mutates it (python/cpython#142637), and because
    this is faster on CPython 3.11 anyway.
    """

    __slots__ = (
        "__weakref__",
        "_bytes",
        "_count",
        "_evictions",
        "_hits",
        "_map",
        "_max_bytes",
        "_max_entries",
        "_misses",
        "_rejected",
        "_root",
    )

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        max_entries = check_bound("max_entries", max_entries)
        max_bytes = check_bound("max_bytes", max_bytes)
        root = _Node(None, None, 0)
        root.prev = root.next = root
        self._root = root
        self._map: dict[Hashable, _Node] = {}
        self._count = 0
        self._bytes = 0
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._hits = 0
        self._misses = 0
        self._evictions = 0
        self._rejected = 0

    def get(self, key: Hashable, default: Any = None) -> Any:
        node = self._map.get(key)
        if node is not None and node.prev is not None:
            self._hits += 1
            root = self._root
            if root.next is not node:
                prev, following = node.prev, node.next
                prev.next = following
                following.prev = prev  # type: ignore[union-attr]
                first = root.next
                node.next = first
                node.prev = root
                first.prev = node  # type: ignore[union-attr]
                root.next = node
            return node.value
        self._misses += 1
        return default

    def peek(self, key: Hashable, default: Any = None) -> Any:
        node = self._map.get(key)
        if node is not None and node.prev is not None:
            return node.value
        return default

    def put(self, key: Hashable, value: Any, size: int) -> None:
        if type(size) is not int or size < 0:
            size = check_size(size)  # converts, or raises the shared error
        if size > self._max_bytes:
            self._remove(key)
            self._rejected += 1
            return
        node = None
        existing = self._map.get(key)
        if existing is None:
            # Allocating may run the cycle collector and finalizers, which may
            # insert this key: setdefault keeps whichever node got there first.
            node = _Node(key, value, size)
            existing = self._map.setdefault(key, node)
        if existing is node:
            self._link_front(node)
        elif existing.prev is not None:
            self._bytes += size - existing.size
            existing.size = size
            self._move_to_front(existing)
            old_value, existing.value = existing.value, value
            del old_value
        else:
            existing.size = size
            self._link_front(existing)
            old_value, existing.value = existing.value, value
            del old_value
        if self._count > self._max_entries or self._bytes > self._max_bytes:
            self._evict()

    def invalidate(self, key: Hashable) -> bool:
        return self._remove(key)

    def clear(self) -> None:
        old = self._map
        root = self._root
        node = root.next
        root.prev = root.next = root
        self._count = 0
        self._bytes = 0
        self._map = {}
        while node is not root:
            following = node.next  # type: ignore[union-attr]
            node.prev = node.next = None  # type: ignore[union-attr]
            node = following
        old.clear()

    def statistics(self) -> CacheStatistics:
        return CacheStatistics(
            entries=self._count,
            bytes=self._bytes,
            max_entries=self._max_entries,
            max_bytes=self._max_bytes,
            hits=self._hits,
            misses=self._misses,
            evictions=self._evictions,
            rejected=self._rejected,
        )

    def __len__(self) -> int:
        return self._count

    def __contains__(self, key: object) -> bool:
        node = self._map.get(key)
        return node is not None and node.prev is not None

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} entries={self._count}/{self._max_entries} "
            f"bytes={self._bytes}/{self._max_bytes}>"
        )

    def __reduce__(self) -> Any:
        raise cache_not_picklable(self)

    def _link_front(self, node: _Node) -> None:
        root = self._root
        first = root.next
        node.next = first
        node.prev = root
        first.prev = node  # type: ignore[union-attr]
        root.next = node
        self._count += 1
        self._bytes += node.size

    def _move_to_front(self, node: _Node) -> None:
        root = self._root
        if root.next is node:
            return
        prev, following = node.prev, node.next
        prev.next = following  # type: ignore[union-attr]
        following.prev = prev  # type: ignore[union-attr]
        first = root.next
        node.next = first
        node.prev = root
        first.prev = node  # type: ignore[union-attr]
        root.next = node

    def _unlink(self, node: _Node) -> bool:
        prev, following = node.prev, node.next
        if prev is None:
            return False
        prev.next = following
        following.prev = prev  # type: ignore[union-attr]
        node.prev = node.next = None
        self._count -= 1
        self._bytes -= node.size
        return True

    def _evict(self) -> None:
        root = self._root
        while self._count > self._max_entries or self._bytes > self._max_bytes:
            victim = root.prev
            if victim is root:
                break
            popped = self._map.pop(victim.key, None)  # type: ignore[union-attr]
            removed = False
            if popped is not None:
                removed = self._unlink(popped)
            # If the key could not be found (its hash changed), unlink anyway.
            if self._unlink(victim):  # type: ignore[arg-type]
                removed = True
            if removed:
                self._evictions += 1

    def _remove(self, key: Hashable) -> bool:
        if not self._map:
            # dict.pop() skips hashing when the dict is empty; hash anyway so
            # an unhashable key fails the same way whatever the cache holds.
            hash(key)
            return False
        popped = self._map.pop(key, None)
        if popped is None:
            return False
        return self._unlink(popped)


def _start_and_step(digest: bytes) -> tuple[int, int]:
    """The first position and the (odd) stride of ``digest``'s bits."""
    if type(digest) is not bytes:
        digest = bytes(memoryview(digest))
    if len(digest) < BLOOM_DIGEST_BYTES:
        raise short_digest_error(len(digest))
    h, step = _unpack_words(digest)
    return h, step | 1


class BloomFilter:
    """Bloom filter over byte digests (see ``bloom_digest``). Never a false negative.

    Sized for ``expected_items`` at ``false_positive_rate``: ``m`` bits (a
    multiple of 64) and ``k`` hashes, see ``notary.state._cachecommon.bloom_parameters``.
    Bit positions come from the digest itself: ``h1`` and ``h2`` are its first
    two little-endian 64-bit words, ``h2`` forced odd, and the ``i``-th position
    is ``((h1 + i * h2) mod 2**64) mod m``.

    Error handling: a digest that is not bytes-like raises ``TypeError``, one
    shorter than 16 bytes ``ValueError``.
    """

    __slots__ = ("__weakref__", "_bits", "_hashes", "_items_added", "_nbits")

    def __init__(self, expected_items: int, false_positive_rate: float) -> None:
        nbits, hashes = bloom_parameters(expected_items, false_positive_rate)
        self._nbits = nbits
        self._hashes = hashes
        self._bits = bytearray(nbits // 8)
        self._items_added = 0

    def add(self, digest: bytes) -> None:
        h, step = _start_and_step(digest)
        nbits = self._nbits
        bits = self._bits
        for _ in range(self._hashes):
            position = h % nbits
            bits[position >> 3] |= 1 << (position & 7)
            h = (h + step) & _MASK64
        self._items_added += 1

    def __contains__(self, digest: bytes) -> bool:
        h, step = _start_and_step(digest)
        nbits = self._nbits
        bits = self._bits
        for _ in range(self._hashes):
            position = h % nbits
            if not bits[position >> 3] & (1 << (position & 7)):
                return False
            h = (h + step) & _MASK64
        return True

    def statistics(self) -> BloomStatistics:
        bits_set = int.from_bytes(self._bits, "little").bit_count()
        return bloom_statistics(self._nbits, self._hashes, self._items_added, bits_set)

    def to_bytes(self) -> bytes:
        """Serialise (format in ``notary.state._cachecommon``); ``from_bytes`` reverses it."""
        return pack_bloom_header(self._nbits, self._hashes, self._items_added) + bytes(self._bits)

    @classmethod
    def from_bytes(cls, data: bytes) -> BloomFilter:
        """Rebuild a filter from ``to_bytes()`` output of either implementation."""
        nbits, hashes, items_added, bit_array = unpack_bloom_bytes(data)
        self = cls.__new__(cls)
        self._nbits = nbits
        self._hashes = hashes
        self._items_added = items_added
        self._bits = bytearray(bit_array)
        return self

    def __repr__(self) -> str:
        return f"<{type(self).__name__} bits={self._nbits} hashes={self._hashes}>"

    def __reduce__(self) -> Any:
        return (_bloom_from_bytes, (type(self), self.to_bytes()))


def _bloom_from_bytes(cls: type[BloomFilter], data: bytes) -> BloomFilter:
    return cls.from_bytes(data)
