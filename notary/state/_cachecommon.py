"""Pieces shared by both cache implementations.

``notary._fastcache`` (compiled) and ``notary._fastcache_py`` (its pure-Python
twin) both import this module, so the statistics types, argument checks, error
messages, Bloom filter sizing and serialisation format exist exactly once and
cannot drift apart.

Bloom filter serialisation (``BloomFilter.to_bytes``), all integers little-endian::

    offset  size  field
    0       4     magic b"NTBF"
    4       1     format version (1)
    5       1     hashes (k, 1..32)
    6       2     reserved, zero
    8       8     bits (m, a positive multiple of 64)
    16      8     items_added
    24      m/8   bit array: bit j is bit (j % 8) of byte (j // 8)
"""

from __future__ import annotations

import hashlib
import math
import operator
import struct
import sys
from dataclasses import dataclass
from typing import SupportsIndex

#: Bytes of a Bloom digest consumed per lookup: two little-endian 64-bit words.
BLOOM_DIGEST_BYTES = 16
#: Hash functions per item are clamped to this range.
BLOOM_MIN_HASHES = 1
BLOOM_MAX_HASHES = 32
#: Upper bound on the bit array size, so every bit index fits in 64 bits.
BLOOM_MAX_BITS = 2**63

_BLOOM_MAGIC = b"NTBF"
_BLOOM_VERSION = 1
_BLOOM_HEADER = struct.Struct("<4sBBHQQ")
BLOOM_HEADER_BYTES = _BLOOM_HEADER.size


@dataclass(frozen=True, slots=True)
class CacheStatistics:
    """A snapshot of an ``LRUCache``.

    ``entries`` and ``bytes`` are the current totals, ``max_entries`` and
    ``max_bytes`` the bounds. The counters are cumulative since the cache was
    created (``clear()`` does not reset them): ``hits`` and ``misses`` count
    ``get()`` calls, ``evictions`` entries dropped to restore a bound, and
    ``rejected`` ``put()`` calls whose size exceeded ``max_bytes``.
    """

    entries: int
    bytes: int
    max_entries: int
    max_bytes: int
    hits: int
    misses: int
    evictions: int
    rejected: int


@dataclass(frozen=True, slots=True)
class BloomStatistics:
    """A snapshot of a ``BloomFilter``.

    ``items_added`` counts ``add()`` calls (repeats included);
    ``estimated_false_positive_rate`` is ``(bits_set / bits) ** hashes``, the
    probability that an item never added is reported present right now.
    """

    bits: int
    hashes: int
    items_added: int
    bits_set: int
    estimated_false_positive_rate: float


def bloom_digest(data: bytes) -> bytes:
    """The digest callers feed to ``BloomFilter``: 16-byte BLAKE2b of ``data``."""
    return hashlib.blake2b(data, digest_size=BLOOM_DIGEST_BYTES).digest()


def check_bound(name: str, value: SupportsIndex) -> int:
    """Validate an LRU bound: an integer in ``[1, sys.maxsize]``."""
    number = operator.index(value)
    if not 1 <= number <= sys.maxsize:
        raise ValueError(f"{name} must be between 1 and {sys.maxsize}, got {number!r}")
    return number


def check_size(size: SupportsIndex) -> int:
    """Validate a caller-declared entry size: a non-negative integer."""
    number = operator.index(size)
    if number < 0:
        raise ValueError(f"size must be non-negative, got {number!r}")
    return number


def short_digest_error(length: int) -> ValueError:
    return ValueError(f"bloom digest must be at least {BLOOM_DIGEST_BYTES} bytes, got {length}")


def bloom_parameters(expected_items: SupportsIndex, false_positive_rate: object) -> tuple[int, int]:
    """Return ``(bits, hashes)`` for ``expected_items`` at ``false_positive_rate``.

    ``bits = ceil(-n ln p / (ln 2)^2)`` rounded up to a multiple of 64;
    ``hashes = round(bits / n * ln 2)`` clamped to ``[1, 32]``.
    """
    n = operator.index(expected_items)
    if n < 1:
        raise ValueError(f"expected_items must be at least 1, got {n!r}")
    p = float(false_positive_rate)  # type: ignore[arg-type]
    if not 0.0 < p < 1.0:
        raise ValueError(
            f"false_positive_rate must be strictly between 0 and 1, got {false_positive_rate!r}"
        )
    bits = math.ceil(-n * math.log(p) / (math.log(2) ** 2))
    bits = max(64, -(-bits // 64) * 64)
    if bits > BLOOM_MAX_BITS:
        raise ValueError(
            f"a bloom filter for {n} items at false_positive_rate {p!r} needs {bits} bits, "
            f"more than the maximum {BLOOM_MAX_BITS}"
        )
    hashes = round(bits / n * math.log(2))
    hashes = min(BLOOM_MAX_HASHES, max(BLOOM_MIN_HASHES, hashes))
    return bits, hashes


def bloom_statistics(bits: int, hashes: int, items_added: int, bits_set: int) -> BloomStatistics:
    return BloomStatistics(
        bits=bits,
        hashes=hashes,
        items_added=items_added,
        bits_set=bits_set,
        estimated_false_positive_rate=(bits_set / bits) ** hashes,
    )


def pack_bloom_header(bits: int, hashes: int, items_added: int) -> bytes:
    return _BLOOM_HEADER.pack(_BLOOM_MAGIC, _BLOOM_VERSION, hashes, 0, bits, items_added)


def unpack_bloom_bytes(data: object) -> tuple[int, int, int, bytes]:
    """Parse ``BloomFilter.to_bytes()`` output into ``(bits, hashes, items_added, bit_array)``."""
    raw = data if type(data) is bytes else bytes(memoryview(data))  # type: ignore[arg-type]
    if len(raw) < BLOOM_HEADER_BYTES:
        raise ValueError(
            f"invalid bloom filter serialisation: {len(raw)} bytes, "
            f"shorter than the {BLOOM_HEADER_BYTES}-byte header"
        )
    magic, version, hashes, reserved, bits, items_added = _BLOOM_HEADER.unpack_from(raw)
    if magic != _BLOOM_MAGIC:
        raise ValueError(f"invalid bloom filter serialisation: bad magic {magic!r}")
    if version != _BLOOM_VERSION:
        raise ValueError(f"invalid bloom filter serialisation: unsupported version {version}")
    if reserved != 0:
        raise ValueError("invalid bloom filter serialisation: reserved field is not zero")
    if not BLOOM_MIN_HASHES <= hashes <= BLOOM_MAX_HASHES:
        raise ValueError(f"invalid bloom filter serialisation: {hashes} hashes")
    if bits == 0 or bits % 64 or bits > BLOOM_MAX_BITS:
        raise ValueError(f"invalid bloom filter serialisation: {bits} bits")
    expected = BLOOM_HEADER_BYTES + bits // 8
    if len(raw) != expected:
        raise ValueError(
            f"invalid bloom filter serialisation: {len(raw)} bytes, expected {expected} "
            f"for {bits} bits"
        )
    return bits, hashes, items_added, raw[BLOOM_HEADER_BYTES:]


def cache_not_picklable(obj: object) -> TypeError:
    return TypeError(f"cannot pickle {type(obj).__name__!r} object")
