"""Following the store's change feed: what any writer of the store (the
node's other workers, and this process) committed reaches this process's
cache, stored-targets filter and watchers (``Records.apply_change``).

Each process reads the feed every ``[store] feed_interval_ms``, at once
again while a read comes back full, and on PostgreSQL as soon as a commit
notifies it (``LISTEN``/``NOTIFY``), from the position it had when it
started: a change committed before is in the store it reads on a cache miss,
one committed after is in the feed. So a watcher hears of a certificate
change once, whichever worker probed it, about ``batch_interval_ms`` +
``feed_interval_ms`` after the probe (on PostgreSQL, ``batch_interval_ms``
and a round trip).

Resource handling: ``follow_changes`` runs until cancelled, in the nursery
of its caller; it borrows the storage and the records.

Error handling: a failed read (``StoreError``) is logged once, retried at the
next interval and logged again when reads work again; the position does not
move meanwhile, so nothing is skipped. Falling behind the feed's pruned end
(a worker stalled for ``feed_max_rows`` changes) empties the cache
(``Records.forget_everything``).
"""

from __future__ import annotations

import logging

import trio

from notary.errors import StoreError
from notary.outbound.writer import Storage
from notary.service.records import Records

__all__ = ["FEED_READ_ROWS", "follow_changes"]

log = logging.getLogger(__name__)

#: Most changes read at once (a read that returns this many is followed by
#: another at once).
FEED_READ_ROWS = 1000


async def follow_changes(
    storage: Storage, records: Records, interval_s: float, *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Apply the feed's changes to ``records`` for ever. Reports itself
    started once its starting position is read (``StoreError`` then ends
    the start: the store was just opened, something is badly wrong)."""
    position = await storage.feed_position()
    task_status.started()
    failing = False
    while True:
        try:
            page = await storage.read_feed(position, FEED_READ_ROWS)
        except StoreError as exc:
            if not failing:
                log.error("change feed: read failed, retrying every %gs: %s", interval_s, exc)
                failing = True
            await trio.sleep(interval_s)
            continue
        if failing:
            log.info("change feed: reading again")
            failing = False
        if page.missed:
            records.forget_everything()
            if page.last_seq is None:  # nothing left after the pruned end
                position = await storage.feed_position()
        for change in page.changes:
            await records.apply_change(change)
        if page.last_seq is not None:
            position = page.last_seq
        if len(page.changes) < FEED_READ_ROWS:
            await storage.wait_for_changes(interval_s)
