# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, embedsignature=True
"""Compiled fingerprint cache: an LRU map and a Bloom filter.

The pure-Python twin is ``notary._fastcache_py``; both behave identically
(same results, exception types and messages) and ``tests/test_cache.py`` runs
every behaviour test against both. Import through ``notary.state.cache``.

LRUCache layout and invariants
------------------------------
``_map`` maps each key to a ``_Node``. Linked nodes form a circular doubly
linked list through the ``_root`` sentinel embedded in the cache (``root.next``
is the most recently used, ``root.prev`` the least). The links are C pointers
in a ``_Link`` struct embedded in each node, so reordering on a hit touches no
reference counts.

1. The list owns one strong reference to every linked node (taken in
   ``_link_front``, dropped in ``_unlink``); so a pointer in the list never
   dangles, whatever happens to ``_map``.
2. A node is unlinked exactly when its ``link.prev`` is NULL; ``_unlink`` on an
   unlinked node does nothing.
3. ``_count``/``_bytes`` are the number and total size of linked nodes; only
   ``_link_front``/``_unlink`` and an in-place size change move them.
4. Python code (``__hash__``/``__eq__`` of keys, finalizers of values) can run
   only inside dict operations and reference drops, and every such point is
   placed where invariants 1-3 hold and ``_map`` agrees with the list, so a
   re-entrant call sees a consistent cache. Callers hold a strong reference to
   any node they unlink, so the unlink itself never frees it.
5. A node found in ``_map`` but unlinked (only possible when a key's hash
   changed after insertion, which defeats any dict) is treated as absent.

Because the list's references are invisible to the cycle collector, a cycle
through a cached key or value is never collected (a leak, never a crash).
"""

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItemWithError, PyDict_SetDefault
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_CheckExact
from cpython.object cimport PyObject, PyObject_Hash
from cpython.ref cimport Py_XDECREF, Py_XINCREF
from libc.stdint cimport uint8_t, uint64_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy

from notary.state._cachecommon import (
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

cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>

    static inline uint64_t notary_load_le64(const uint8_t *p) {
        return (uint64_t)p[0] | ((uint64_t)p[1] << 8) | ((uint64_t)p[2] << 16)
             | ((uint64_t)p[3] << 24) | ((uint64_t)p[4] << 32) | ((uint64_t)p[5] << 40)
             | ((uint64_t)p[6] << 48) | ((uint64_t)p[7] << 56);
    }

    /* Set bits over n bytes, n a multiple of 8. */
    static uint64_t notary_popcount(const uint8_t *p, uint64_t n) {
        uint64_t total = 0, i, w;
        for (i = 0; i < n; i += 8) {
            memcpy(&w, p + i, 8);
    #if defined(__GNUC__) || defined(__clang__)
            total += (uint64_t)__builtin_popcountll(w);
    #else
            w = w - ((w >> 1) & 0x5555555555555555ULL);
            w = (w & 0x3333333333333333ULL) + ((w >> 2) & 0x3333333333333333ULL);
            w = (w + (w >> 4)) & 0x0F0F0F0F0F0F0F0FULL;
            total += (w * 0x0101010101010101ULL) >> 56;
    #endif
        }
        return total;
    }
    """
    uint64_t notary_load_le64(const uint8_t *p) noexcept nogil
    uint64_t notary_popcount(const uint8_t *p, uint64_t n) noexcept nogil


# ---------------------------------------------------------------------------
# LRU cache
# ---------------------------------------------------------------------------

cdef struct _Link:
    _Link *prev
    _Link *next
    PyObject *owner  # the _Node this link is embedded in (borrowed)


@cython.final
@cython.no_gc
@cython.freelist(64)
cdef class _Node:
    # no_gc: nodes are owned by the cache's list (invariant 1), invisible to
    # the cycle collector anyway; not tracking them keeps put() cheap.
    cdef _Link link
    cdef object key
    cdef object value
    cdef uint64_t size


cdef inline void _move_to_front(_Link *root, _Link *link) noexcept nogil:
    if root.next == link:
        return
    link.prev.next = link.next
    link.next.prev = link.prev
    link.next = root.next
    link.prev = root
    root.next.prev = link
    root.next = link


cdef inline void _link_front(LRUCache cache, _Node node) noexcept:
    cdef _Link *link = &node.link
    cdef _Link *root = &cache._root
    Py_XINCREF(<PyObject *>node)
    link.owner = <PyObject *>node
    link.next = root.next
    link.prev = root
    root.next.prev = link
    root.next = link
    cache._count += 1
    cache._bytes += node.size


cdef inline bint _unlink(LRUCache cache, _Node node) noexcept:
    """Unlink ``node`` if linked; the caller must hold a reference to it."""
    cdef _Link *link = &node.link
    if link.prev == NULL:
        return False
    link.prev.next = link.next
    link.next.prev = link.prev
    link.prev = NULL
    link.next = NULL
    cache._count -= 1
    cache._bytes -= node.size
    Py_XDECREF(<PyObject *>node)
    return True


cdef inline _Link *_detach_all(LRUCache cache) noexcept:
    """Empty the list; return its old chain (NULL-terminated) for _release_chain."""
    cdef _Link *root = &cache._root
    cdef _Link *first = root.next
    if first == root:
        return NULL
    root.prev.next = NULL
    root.next = root
    root.prev = root
    cache._count = 0
    cache._bytes = 0
    return first


cdef inline void _release_chain(_Link *link) noexcept:
    """Drop the list's references to a detached chain (may run finalizers)."""
    cdef _Link *following
    cdef PyObject *owner
    while link != NULL:
        following = link.next
        owner = link.owner
        link.prev = NULL
        link.next = NULL
        Py_XDECREF(owner)
        link = following


@cython.no_gc_clear
cdef class LRUCache:
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
    """

    cdef dict _map
    cdef _Link _root
    cdef Py_ssize_t _count
    cdef uint64_t _bytes
    cdef Py_ssize_t _max_entries
    cdef uint64_t _max_bytes
    cdef uint64_t _hits
    cdef uint64_t _misses
    cdef uint64_t _evictions
    cdef uint64_t _rejected
    cdef object __weakref__

    def __cinit__(self, *args, **kwargs):
        self._map = {}
        self._root.prev = &self._root
        self._root.next = &self._root
        self._root.owner = NULL
        self._max_entries = 1
        self._max_bytes = 1

    def __init__(self, max_entries, max_bytes):
        cdef Py_ssize_t entries_bound = check_bound("max_entries", max_entries)
        cdef uint64_t bytes_bound = <uint64_t>check_bound("max_bytes", max_bytes)
        self._max_entries = entries_bound
        self._max_bytes = bytes_bound
        self._hits = 0
        self._misses = 0
        self._evictions = 0
        self._rejected = 0
        self._clear()

    def __dealloc__(self):
        _release_chain(_detach_all(self))

    def get(self, key, default=None):
        cdef PyObject *found = PyDict_GetItemWithError(self._map, key)
        cdef _Node node
        if found != NULL:
            node = <_Node>found
            if node.link.prev != NULL:
                self._hits += 1
                _move_to_front(&self._root, &node.link)
                return node.value
        self._misses += 1
        return default

    def peek(self, key, default=None):
        cdef PyObject *found = PyDict_GetItemWithError(self._map, key)
        if found != NULL and (<_Node>found).link.prev != NULL:
            return (<_Node>found).value
        return default

    def put(self, key, value, size):
        cdef object checked = size if PyLong_CheckExact(size) else check_size(size)
        cdef int overflow = 0
        cdef long long csize = PyLong_AsLongLongAndOverflow(checked, &overflow)
        cdef _Node node
        cdef _Node existing
        cdef object old_value
        if overflow < 0 or csize < 0:
            check_size(checked)  # raises the shared ValueError
        if overflow > 0 or <uint64_t>csize > self._max_bytes:
            self._remove(key)
            self._rejected += 1
            return
        node = _Node.__new__(_Node)
        node.key = key
        node.value = value
        node.size = <uint64_t>csize
        existing = <_Node>PyDict_SetDefault(self._map, key, node)
        if existing is node:
            _link_front(self, node)
        elif existing.link.prev != NULL:
            self._bytes = self._bytes - existing.size + node.size
            existing.size = node.size
            _move_to_front(&self._root, &existing.link)
            old_value = existing.value
            existing.value = value
        else:
            existing.size = node.size
            _link_front(self, existing)
            old_value = existing.value
            existing.value = value
        self._evict()

    cdef int _evict(self) except -1:
        cdef _Node victim
        cdef object popped
        cdef bint removed
        while self._count > self._max_entries or self._bytes > self._max_bytes:
            if self._root.prev == &self._root:
                break
            victim = <_Node>self._root.prev.owner
            popped = self._map.pop(victim.key, None)  # may run Python code
            removed = False
            if popped is not None:
                removed = _unlink(self, <_Node>popped)
            # If the key could not be found (its hash changed), unlink anyway.
            if _unlink(self, victim):
                removed = True
            if removed:
                self._evictions += 1
        return 0

    cdef bint _remove(self, key) except -1:
        cdef object popped
        if not self._map:
            # dict.pop() skips hashing when the dict is empty; hash anyway so
            # an unhashable key fails here exactly as in the twin.
            PyObject_Hash(key)
            return False
        popped = self._map.pop(key, None)  # may run Python code
        if popped is None:
            return False
        return _unlink(self, <_Node>popped)

    def invalidate(self, key):
        return self._remove(key)

    def clear(self):
        self._clear()

    cdef int _clear(self) except -1:
        cdef dict old = self._map
        cdef _Link *chain = _detach_all(self)
        self._map = {}
        _release_chain(chain)
        old.clear()  # may run finalizers: the cache is already empty and consistent
        return 0

    def statistics(self):
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

    def __len__(self):
        return self._count

    def __contains__(self, key):
        cdef PyObject *found = PyDict_GetItemWithError(self._map, key)
        return found != NULL and (<_Node>found).link.prev != NULL

    def __repr__(self):
        return (
            f"<{type(self).__name__} entries={self._count}/{self._max_entries} "
            f"bytes={self._bytes}/{self._max_bytes}>"
        )

    def __reduce__(self):
        raise cache_not_picklable(self)


# ---------------------------------------------------------------------------
# Bloom filter
# ---------------------------------------------------------------------------

cdef inline void _bloom_set(uint8_t *bits, uint64_t nbits, int hashes,
                            uint64_t h, uint64_t step) noexcept nogil:
    cdef uint64_t position
    cdef int i
    for i in range(hashes):
        position = h % nbits
        bits[position >> 3] |= <uint8_t>(1 << (position & 7))
        h += step


cdef inline bint _bloom_test(const uint8_t *bits, uint64_t nbits, int hashes,
                             uint64_t h, uint64_t step) noexcept nogil:
    cdef uint64_t position
    cdef int i
    for i in range(hashes):
        position = h % nbits
        if not (bits[position >> 3] & (1 << (position & 7))):
            return False
        h += step
    return True


cdef inline int _digest_words(object digest, uint64_t *h, uint64_t *step) except -1:
    cdef const uint8_t *p
    cdef Py_ssize_t length
    if not PyBytes_CheckExact(digest):
        digest = bytes(memoryview(digest))
    length = PyBytes_GET_SIZE(digest)
    if length < 16:
        raise short_digest_error(length)
    p = <const uint8_t *>PyBytes_AS_STRING(digest)
    h[0] = notary_load_le64(p)
    step[0] = notary_load_le64(p + 8) | 1
    return 0


cdef class BloomFilter:
    """Bloom filter over byte digests (see ``bloom_digest``). Never a false negative.

    Sized for ``expected_items`` at ``false_positive_rate``: ``m`` bits (a
    multiple of 64) and ``k`` hashes, see ``notary.state._cachecommon.bloom_parameters``.
    Bit positions come from the digest itself: ``h1`` and ``h2`` are its first
    two little-endian 64-bit words, ``h2`` forced odd, and the ``i``-th position
    is ``((h1 + i * h2) mod 2**64) mod m``.

    Error handling: a digest that is not bytes-like raises ``TypeError``, one
    shorter than 16 bytes ``ValueError``.
    """

    cdef uint8_t *_bits
    cdef uint64_t _nbits
    cdef int _hashes
    cdef uint64_t _items_added
    cdef object __weakref__

    def __cinit__(self, *args, **kwargs):
        # A valid empty 64-bit filter until __init__/from_bytes sizes it, so
        # no method ever sees a NULL array.
        self._bits = <uint8_t *>calloc(8, 1)
        if self._bits == NULL:
            raise MemoryError()
        self._nbits = 64
        self._hashes = 1
        self._items_added = 0

    def __dealloc__(self):
        free(self._bits)

    def __init__(self, expected_items, false_positive_rate):
        nbits, hashes = bloom_parameters(expected_items, false_positive_rate)
        self._allocate(nbits, hashes)

    cdef int _allocate(self, uint64_t nbits, int hashes) except -1:
        cdef uint8_t *bits = <uint8_t *>calloc(<size_t>(nbits // 8), 1)
        if bits == NULL:
            raise MemoryError()
        free(self._bits)
        self._bits = bits
        self._nbits = nbits
        self._hashes = hashes
        self._items_added = 0
        return 0

    def add(self, digest):
        cdef uint64_t h, step
        _digest_words(digest, &h, &step)
        _bloom_set(self._bits, self._nbits, self._hashes, h, step)
        self._items_added += 1

    def __contains__(self, digest):
        cdef uint64_t h, step
        _digest_words(digest, &h, &step)
        return _bloom_test(self._bits, self._nbits, self._hashes, h, step)

    def statistics(self):
        cdef uint64_t bits_set = notary_popcount(self._bits, self._nbits // 8)
        return bloom_statistics(self._nbits, self._hashes, self._items_added, bits_set)

    def to_bytes(self):
        """Serialise (format in ``notary.state._cachecommon``); ``from_bytes`` reverses it."""
        return pack_bloom_header(self._nbits, self._hashes, self._items_added) + \
            PyBytes_FromStringAndSize(<char *>self._bits, <Py_ssize_t>(self._nbits // 8))

    @classmethod
    def from_bytes(cls, data):
        """Rebuild a filter from ``to_bytes()`` output of either implementation."""
        cdef BloomFilter self
        cdef bytes payload
        nbits, hashes, items_added, payload = unpack_bloom_bytes(data)
        self = cls.__new__(cls)
        self._allocate(nbits, hashes)
        memcpy(self._bits, PyBytes_AS_STRING(payload), <size_t>(self._nbits // 8))
        self._items_added = items_added
        return self

    def __repr__(self):
        return f"<{type(self).__name__} bits={self._nbits} hashes={self._hashes}>"

    def __reduce__(self):
        return (_bloom_from_bytes, (type(self), self.to_bytes()))


def _bloom_from_bytes(cls, data):
    return cls.from_bytes(data)
