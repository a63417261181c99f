"""The fingerprint cache: ``LRUCache``, ``BloomFilter`` and ``bloom_digest``.

Two implementations behave identically: the compiled ``notary._fastcache``
(Cython) and its pure-Python twin ``notary._fastcache_py``. This module picks
one at import time by the rules of ``notary.extensions`` (``NOTARY_NO_EXTENSIONS``,
``NOTARY_REQUIRE_EXTENSION``).
``IMPLEMENTATION`` says which one was chosen: ``"compiled"`` or ``"pure"``.
"""

from __future__ import annotations

from notary.extensions import load
from notary.state._cachecommon import BloomStatistics, CacheStatistics

__all__ = [
    "IMPLEMENTATION",
    "BloomFilter",
    "BloomStatistics",
    "CacheStatistics",
    "LRUCache",
    "bloom_digest",
]

_module, IMPLEMENTATION = load("notary._fastcache")
BloomFilter = _module.BloomFilter
LRUCache = _module.LRUCache
bloom_digest = _module.bloom_digest
