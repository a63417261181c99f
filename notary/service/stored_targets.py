"""Which targets the store may hold: a bloom filter over target keys, so a
query for a target never seen goes straight to the prober without a
database read.

Rules this module keeps:

1. No false negatives: every key added is reported as possibly present.
   Keys are added by the query service before the observation is queued for
   the store, so "not in the filter" means "not in the store, not queued".
2. Until the filter has been loaded from the store (:meth:`StoredTargets.load`,
   run in the background at start-up), every key is reported as possibly
   present: the service reads the store as it would without a filter. Keys
   added during the load are kept aside and added when it finishes, so none
   is lost between the scan's snapshot and the switch (that list grows only
   with the targets first probed during the load).
3. Bit positions come from a BLAKE2b digest of the key (``bloom_digest``),
   computed once per lookup; the compiled filter reads them straight from the
   digest bytes.
4. Keys other writers store (the node's other workers, a fleet's other
   nodes) are added as the store's change feed brings them
   (``Records.apply_change``). A process that fell behind the feed's pruned
   end may lack some: its filter is switched off for good
   (:meth:`StoredTargets.switch_off`, also during or after a load), and
   every lookup reads the store (rule 2): one read before a probe, which
   costs far more.

Resource handling: :meth:`StoredTargets.load` borrows the storage for one scan
(its own connection, in a worker thread); it owns nothing after it returns.

Error handling: a failed load (``StoreError``) is logged and leaves the
filter unloaded, which is safe (rule 2) and only costs store reads.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import trio

from notary.errors import StoreError
from notary.outbound.writer import Storage
from notary.state._cachecommon import bloom_parameters
from notary.state.cache import BloomFilter, BloomStatistics, bloom_digest

__all__ = ["StoredTargets", "StoredTargetsStatistics"]

logger = logging.getLogger(__name__)

#: A progress line is logged every this many keys while loading.
PROGRESS_EVERY_KEYS = 1_000_000


@dataclass(frozen=True, slots=True)
class StoredTargetsStatistics:
    """``loaded``: the filter is in use; ``keys_loaded``: keys read from the
    store at start-up; ``skipped_reads``: lookups answered "never seen"
    without a store read; ``bloom``: the filter's own statistics (None until
    loaded)."""

    loaded: bool
    keys_loaded: int
    skipped_reads: int
    bloom: BloomStatistics | None


class StoredTargets:
    """A bloom filter over stored target keys; see the module docstring."""

    def __init__(self, expected_items: int, false_positive_rate: float) -> None:
        bloom_parameters(expected_items, false_positive_rate)  # ValueError now, not in load
        self._expected_items = expected_items
        self._false_positive_rate = false_positive_rate
        self._bloom: BloomFilter | None = None
        self._added_while_loading: list[bytes] = []
        self._keys_loaded = 0
        self._skipped_reads = 0
        #: Set once ``load`` has finished, loaded or failed, or once the
        #: filter is switched off (readiness waits).
        self.settled = trio.Event()
        self._off = False

    def switch_off(self) -> None:
        """Never use a filter (rule 4): every key may be in the store, none is
        kept, a load running or done is dropped."""
        self._off = True
        self._bloom = None
        self._added_while_loading = []
        self.settled.set()

    def add(self, key: str) -> None:
        """Record that ``key`` is (or is about to be) in the store."""
        if self._off:
            return
        digest = bloom_digest(key.encode("utf-8"))
        if self._bloom is None:
            self._added_while_loading.append(digest)
        else:
            self._bloom.add(digest)

    def may_contain(self, key: str) -> bool:
        """False only if ``key`` is certainly not in the store (rule 1)."""
        if self._bloom is None:
            return True
        if bloom_digest(key.encode("utf-8")) in self._bloom:
            return True
        self._skipped_reads += 1
        return False

    def statistics(self) -> StoredTargetsStatistics:
        return StoredTargetsStatistics(
            loaded=self._bloom is not None,
            keys_loaded=self._keys_loaded,
            skipped_reads=self._skipped_reads,
            bloom=self._bloom.statistics() if self._bloom is not None else None,
        )

    async def load(self, storage: Storage) -> None:
        """Fill the filter from every target key in ``storage``, then use it."""
        bloom = BloomFilter(self._expected_items, self._false_positive_rate)
        started = time.monotonic()
        loaded = 0

        def consume(keys: list[str]) -> None:  # in the scanning thread
            nonlocal loaded
            for key in keys:
                bloom.add(bloom_digest(key.encode("utf-8")))
            before, loaded = loaded, loaded + len(keys)
            if loaded // PROGRESS_EVERY_KEYS > before // PROGRESS_EVERY_KEYS:
                logger.info("known targets: %d loaded from the store so far", loaded)

        try:
            await storage.scan_target_keys(consume)
        except StoreError as exc:
            logger.error("known targets: load failed, every lookup reads the store: %s", exc)
            self.settled.set()
            return
        if self._off:  # switched off while loading (rule 4)
            self.settled.set()
            return
        for digest in self._added_while_loading:
            bloom.add(digest)
        self._added_while_loading = []
        self._bloom = bloom
        self._keys_loaded = loaded
        if loaded > self._expected_items:
            logger.warning(
                "known targets: %d targets exceed [cache] bloom_expected_items (%d): "
                "false positives (store reads for unknown targets) exceed %g; raise it",
                loaded, self._expected_items, self._false_positive_rate,
            )
        logger.info(
            "known targets: %d loaded from the store in %.1f s",
            loaded, time.monotonic() - started,
        )
        self.settled.set()
