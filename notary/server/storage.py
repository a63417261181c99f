"""The store from Trio: reads in a worker thread, writes batched by one writer
task off the request path.

Resource handling: ``open_storage`` opens two ``Store`` connections (one for
reads, one for the writer), starts the writer task in its own nursery, and on
exit closes the queue, lets the writer commit everything still queued, then
closes both connections. Nothing queued is dropped by a clean exit.

Error handling: a batch that fails (``StoreError``: disk full, database
locked past the busy timeout) is kept and retried with back-off, up to
``MAX_RETRY_DELAY_S`` apart, for as long as the notary runs; meanwhile
producers wait once the queue is full (never a silent drop) and the failure is
logged and counted. Once the block of ``open_storage`` exits (a clean stop),
the writer keeps retrying for at most ``SHUTDOWN_RETRY_S``: a store that
stays unusable (a damaged file, a full disk) must not hold the process for
ever; what is then left uncommitted is counted (``lost``) and logged in one
line. A crash or power loss loses what was still queued: at most
``batch_interval_ms`` of observations under normal load (queries are answered
from memory meanwhile), plus, with ``synchronous=NORMAL``, the last committed
transactions on power loss (never corruption: WAL).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import trio

from notary.errors import StoreError
from notary.observations import DEFAULT_MERGE_WINDOW_S, ProbeResult, Timeline
from notary.protocol.targets import Target
from notary.store import Store

log = logging.getLogger(__name__)

FIRST_RETRY_DELAY_S = 0.1
MAX_RETRY_DELAY_S = 5.0
#: After a clean stop began, how long failing batches are still retried
#: before what is left is given up (see the module docstring).
SHUTDOWN_RETRY_S = 30.0


@dataclass(frozen=True, slots=True)
class StorageStatistics:
    """``queued``: observations waiting for the writer; ``committed``,
    ``batches``, ``failed_batches`` (attempts that raised), ``producer_waits``
    (``record`` calls that found the queue full): cumulative; ``failing``: the
    batch in hand failed its last attempt and waits to be retried; ``lost``:
    observations given up at shutdown because the store stayed unusable for
    ``SHUTDOWN_RETRY_S``."""

    queued: int
    committed: int
    batches: int
    failed_batches: int
    producer_waits: int
    failing: bool = False
    lost: int = 0


class Storage:
    """Async face of the store; made by ``open_storage``."""

    def __init__(
        self,
        reader: Store,
        writer: Store,
        send: trio.MemorySendChannel[ProbeResult],
    ) -> None:
        self.path = reader.path
        self._reader = reader
        self._writer = writer
        self._send = send
        self._read_limiter = trio.CapacityLimiter(1)
        self._write_limiter = trio.CapacityLimiter(1)
        self._committed = 0
        self._batches = 0
        self._failed_batches = 0
        self._producer_waits = 0
        self._failing = False
        #: Set when the queue is closed (a clean stop): until then failing
        #: batches are retried; after it, what is left is given up.
        self._give_up_at: float | None = None
        self._lost = 0
        #: Called after each committed batch with its rows and the seconds
        #: its successful write took (metrics); must not raise.
        self.on_batch: Callable[[int, float], None] | None = None

    async def load_timeline(self, target: Target) -> Timeline:
        """The stored timeline of ``target``; raises ``StoreError``."""
        return await trio.to_thread.run_sync(
            self._reader.load_timeline, target, limiter=self._read_limiter
        )

    async def scan_target_keys(self, consume: Callable[[list[str]], None]) -> int:
        """Call ``consume`` with the keys of every stored target, a chunk at a
        time, in a worker thread with its own connection (reads and writes go
        on meanwhile); return how many keys there were.

        Error handling: ``StoreError``. Cancellation stops the scan at the
        next chunk (the thread is abandoned and ends there on its own).
        """
        stop = threading.Event()

        def scan() -> int:
            count = 0
            with Store(self.path, create=False) as store:
                for keys in store.iter_target_keys():
                    if stop.is_set():
                        break
                    consume(keys)
                    count += len(keys)
            return count

        try:
            return await trio.to_thread.run_sync(scan, abandon_on_cancel=True)
        finally:
            stop.set()

    async def record(self, result: ProbeResult) -> None:
        """Queue ``result`` for the writer; waits while the queue is full."""
        try:
            self._send.send_nowait(result)
        except trio.WouldBlock:
            self._producer_waits += 1
            await self._send.send(result)

    def statistics(self) -> StorageStatistics:
        return StorageStatistics(
            queued=self._send.statistics().current_buffer_used,
            committed=self._committed,
            batches=self._batches,
            failed_batches=self._failed_batches,
            producer_waits=self._producer_waits,
            failing=self._failing,
            lost=self._lost,
        )

    def _closing(self) -> None:
        """The queue is being closed (a clean stop): start the bound on
        retries."""
        self._give_up_at = trio.current_time() + SHUTDOWN_RETRY_S

    async def _serve_writer(
        self,
        receive: trio.MemoryReceiveChannel[ProbeResult],
        batch_rows: int,
        batch_interval_s: float,
    ) -> None:
        async with receive:
            while True:
                try:
                    first = await receive.receive()
                except trio.EndOfChannel:
                    break
                batch = [first]
                with trio.move_on_after(batch_interval_s):
                    while len(batch) < batch_rows:
                        # Take what is queued without a scheduler round per
                        # item; wait only when the queue is empty.
                        try:
                            batch.append(receive.receive_nowait())
                            continue
                        except trio.WouldBlock:
                            pass
                        except trio.EndOfChannel:
                            break
                        try:
                            batch.append(await receive.receive())
                        except trio.EndOfChannel:
                            break
                while len(batch) < batch_rows:  # whatever is ready now, without waiting
                    try:
                        batch.append(receive.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                await self._commit(batch)
        if self._lost:
            log.error(
                "store still unusable %gs after the stop began: %d observations were "
                "not committed", SHUTDOWN_RETRY_S, self._lost,
            )

    async def _commit(self, batch: list[ProbeResult]) -> None:
        delay = FIRST_RETRY_DELAY_S
        while True:
            if self._lost:  # given up already: the rest of the queue goes too
                self._lost += len(batch)
                return
            started = trio.current_time()
            try:
                # Shielded: a batch taken from the queue is committed even
                # while the notary shuts down.
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(
                        self._writer.record, batch, limiter=self._write_limiter
                    )
            except StoreError as exc:
                self._failed_batches += 1
                self._failing = True
                give_up_at = self._give_up_at
                if give_up_at is not None and trio.current_time() >= give_up_at:
                    self._lost += len(batch)
                    return
                log.error("store write of %d observations failed, retrying: %s", len(batch), exc)
                if give_up_at is not None:  # never sleep past the bound
                    delay = min(delay, max(give_up_at - trio.current_time(), 0.0))
                await trio.sleep(delay)
                delay = min(delay * 2, MAX_RETRY_DELAY_S)
                continue
            self._committed += len(batch)
            self._batches += 1
            self._failing = False
            if self.on_batch is not None:
                self.on_batch(len(batch), trio.current_time() - started)
            return


@asynccontextmanager
async def open_storage(
    path: Path,
    *,
    batch_rows: int = 500,
    batch_interval_ms: int = 50,
    queue_rows: int = 10_000,
    synchronous: str = "NORMAL",
    merge_window_s: int = DEFAULT_MERGE_WINDOW_S,
) -> AsyncIterator[Storage]:
    """Open the database at ``path`` (created and migrated if needed) and run
    its writer until the block exits. Raises ``StoreError`` if it cannot be
    opened."""
    writer = await trio.to_thread.run_sync(
        lambda: Store(path, synchronous=synchronous, merge_window_s=merge_window_s)
    )
    try:
        reader = await trio.to_thread.run_sync(lambda: Store(path, synchronous=synchronous))
    except BaseException:
        writer.close()
        raise
    send, receive = trio.open_memory_channel[ProbeResult](queue_rows)
    storage = Storage(reader, writer, send)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                storage._serve_writer, receive, batch_rows, batch_interval_ms / 1000
            )
            try:
                yield storage
            finally:
                storage._closing()
                await send.aclose()  # the writer drains what is queued, then returns
    finally:
        reader.close()
        writer.close()
