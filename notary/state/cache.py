"""The fingerprint cache: ``LRUCache``, ``BloomFilter`` and ``bloom_digest``.

Two implementations behave identically: the compiled ``notary.state._fastcache``
(Cython) and its pure-Python twin ``notary.state._fastcache_py``. This module picks
one at import time, the way aio-libs frozenlist and yarl do:

* ``NOTARY_NO_EXTENSIONS`` set (non-empty, not ``"0"``): the pure twin.
* otherwise the compiled module, falling back to the twin when it cannot be
  imported (not built, built for another Python) ...
* ... unless ``NOTARY_REQUIRE_EXTENSION`` is set (non-empty, not ``"0"``): then
  a failed import raises ``ImportError``. ``make test-compiled`` sets it so a
  silently failed build cannot pass the test suite.

Setting both variables is a contradiction and raises ``ImportError``.
``IMPLEMENTATION`` says which one was chosen: ``"compiled"`` or ``"pure"``.
"""

from __future__ import annotations

import os
from typing import Literal

from notary.state._cachecommon import BloomStatistics, CacheStatistics

__all__ = [
    "IMPLEMENTATION",
    "BloomFilter",
    "BloomStatistics",
    "CacheStatistics",
    "LRUCache",
    "bloom_digest",
]

NO_EXTENSIONS_ENV = "NOTARY_NO_EXTENSIONS"
REQUIRE_EXTENSION_ENV = "NOTARY_REQUIRE_EXTENSION"


def _flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


IMPLEMENTATION: Literal["compiled", "pure"]

if _flag(NO_EXTENSIONS_ENV):
    if _flag(REQUIRE_EXTENSION_ENV):
        raise ImportError(
            f"{NO_EXTENSIONS_ENV} and {REQUIRE_EXTENSION_ENV} are both set: "
            "the compiled cache cannot be both forbidden and required; unset one"
        )
    from notary.state._fastcache_py import BloomFilter, LRUCache, bloom_digest

    IMPLEMENTATION = "pure"
else:
    try:
        from notary.state._fastcache import BloomFilter, LRUCache, bloom_digest
    except ImportError as exc:
        if _flag(REQUIRE_EXTENSION_ENV):
            raise ImportError(
                f"compiled cache required but notary.state._fastcache failed to import: {exc} "
                f"(build it with `python setup.py build_ext --inplace`, or unset "
                f"{REQUIRE_EXTENSION_ENV})"
            ) from exc
        from notary.state._fastcache_py import BloomFilter, LRUCache, bloom_digest

        IMPLEMENTATION = "pure"
    else:
        IMPLEMENTATION = "compiled"
