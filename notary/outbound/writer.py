"""The store from Trio: reads in a worker thread, writes batched by one writer
task off the request path.

Resource handling: ``open_storage`` opens two store connections (an
``ObservationStore`` of either engine: one for reads, one for the writer),
starts the writer task in its own nursery, and on exit closes the queue,
lets the writer commit everything still queued, then closes both
connections. Nothing queued is dropped by a clean exit.

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

What is kept (docs/storage.md "What the notary keeps"): the writer keeps each
target within ``limits`` (``notary.state.observationstore``); a maintenance task, on the
writer's connection between batches, first brings rows written under looser
limits within them, then every ``ASKED_FLUSH_INTERVAL_S`` writes the
targets asked about meanwhile (``note_asked``, a bounded set: queries never
wait on the disk) and every ``PRUNE_INTERVAL_S`` removes the targets nobody
asked about for ``forget_unasked_after_s``. A failure there is logged and
tried again at the next interval; a crash loses at most one interval of
asked-about notes (a target asked about again is noted again). The same
task keeps the change feed (``notary.state.feed``) to its newest
``[store] feed_max_rows`` rows.

The change feed: each batch is written with the storage's ``origin`` (unique
per process), so a process following the feed (``notary.service.feed``) can
tell its own changes from other writers'.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import trio

from notary.config import StoreConfig
from notary.errors import StoreError
from notary.model.observations import ProbeResult, Timeline
from notary.model.targets import Target
from notary.state.claims import Claim
from notary.state.feed import FeedPage
from notary.state.observationstore import ObservationStore, PruneReport
from notary.state.store import DATABASE_FILE_MODE, Store

log = logging.getLogger(__name__)

FIRST_RETRY_DELAY_S = 0.1
MAX_RETRY_DELAY_S = 5.0
#: After a clean stop began, how long failing batches are still retried
#: before what is left is given up (see the module docstring).
SHUTDOWN_RETRY_S = 30.0
#: How often the targets asked about are written (``note_asked``)...
ASKED_FLUSH_INTERVAL_S = 60.0
#: ...and how many distinct ones are held meanwhile (about 200 bytes each);
#: a full set is written at once, and notes that find it full are dropped
#: (counted) until then.
MAX_ASKED_NOTES = 65_536
#: How often targets nobody asked about are removed (the first time one
#: ``ASKED_FLUSH_INTERVAL_S`` after the start).
PRUNE_INTERVAL_S = 3600.0
#: ``open_storage``'s section when none is given: the defaults, every
#: target kept for ever (no retention).
KEEP_EVERYTHING = StoreConfig(forget_unasked_after_s=None)  # type: ignore[arg-type]


class BatchTimings(Protocol):
    """Told each committed batch's rows and write seconds (the metrics'
    ``Timings``); must not raise."""

    def batch_written(self, rows: int, seconds: float) -> None: ...


@dataclass(frozen=True, slots=True)
class StorageStatistics:
    """``queued``: probes whose observations wait for the writer (a probe
    of several addresses is one: ``[store] queue_rows`` bounds them, each
    at most ``[probe] max_addresses`` (and an address hint) times
    ``samples_per_address`` rows); ``committed``,
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
    #: Targets asked about, not yet written; notes dropped because the set
    #: was full (cumulative); targets removed by the retention (cumulative).
    asked_queued: int = 0
    asked_dropped: int = 0
    pruned_targets: int = 0


class Storage:
    """Async face of the store; made by ``open_storage``."""

    def __init__(
        self,
        reader: ObservationStore,
        writer: ObservationStore,
        send: trio.MemorySendChannel[tuple[ProbeResult, ...]],
        *,
        connect: Callable[[], ObservationStore],
        forget_unasked_after_s: int | None = None,
        feed_max_rows: int = KEEP_EVERYTHING.feed_max_rows,
        clock: Callable[[], float] = time.time,
        timings: BatchTimings | None = None,
    ) -> None:
        self.path = reader.path
        #: Opens another connection (the scan, the claims), in a thread.
        self._connect = connect
        #: Names this process's writes in the change feed.
        self.origin = f"{os.getpid()}-{secrets.token_hex(6)}"
        self._feed_max_rows = feed_max_rows
        self._timings = timings
        self._reader = reader
        self._writer = writer
        self._send = send
        self._read_limiter = trio.CapacityLimiter(1)
        self._write_limiter = trio.CapacityLimiter(1)
        #: Probe claims' connection, opened on first use (a node's workers
        #: claim; a single process never does).
        self._claims: ObservationStore | None = None
        self._claims_limiter = trio.CapacityLimiter(1)
        #: PostgreSQL: the connection waiting for NOTIFY, opened on first use.
        self._listener: ObservationStore | None = None
        self._listen_limiter = trio.CapacityLimiter(1)
        self._committed = 0
        self._batches = 0
        self._failed_batches = 0
        self._producer_waits = 0
        self._failing = False
        #: Set when the queue is closed (a clean stop): until then failing
        #: batches are retried; after it, what is left is given up.
        self._give_up_at: float | None = None
        self._lost = 0
        self._forget_unasked_after_s = forget_unasked_after_s
        self._clock = clock
        #: Targets asked about since the last flush, by key.
        self._asked: dict[str, Target] = {}
        self._asked_full = trio.Event()
        self._asked_dropped = 0
        self._pruned_targets = 0

    async def load_timeline(self, target: Target) -> Timeline:
        """The stored timeline of ``target``; raises ``StoreError``."""
        return await trio.to_thread.run_sync(
            self._reader.load_timeline, target, limiter=self._read_limiter
        )

    async def feed_position(self) -> int:
        """The newest change's sequence number; raises ``StoreError``."""
        return await trio.to_thread.run_sync(
            self._reader.feed_position, limiter=self._read_limiter
        )

    async def read_feed(self, after: int, limit: int) -> FeedPage:
        """Up to ``limit`` changes after ``after``; raises ``StoreError``."""
        return await trio.to_thread.run_sync(
            self._reader.read_feed, after, limit, limiter=self._read_limiter
        )

    async def claim_probe(self, target: Target, now_ms: int, ttl_ms: int) -> Claim:
        """Claim ``target``'s probe for this process (``notary.state.claims``);
        the claim that stands. Raises ``StoreError``."""
        return await self._on_claims(lambda store: store.claim_probe(
            target, self.origin, now_ms, ttl_ms))

    async def read_claim(self, target: Target) -> Claim | None:
        return await self._on_claims(lambda store: store.read_claim(target))

    async def release_claim(
        self, target: Target, failure: str | None, now_ms: int, linger_ms: int
    ) -> None:
        """This process's probe of ``target`` ended (``failure``: why it failed)."""
        await self._on_claims(lambda store: store.release_claim(
            target, self.origin, failure, now_ms, linger_ms))

    async def _on_claims(self, function: Callable[[ObservationStore], Any]) -> Any:
        def run() -> Any:
            if self._claims is None:
                self._claims = self._connect()
            return function(self._claims)

        return await trio.to_thread.run_sync(run, limiter=self._claims_limiter)

    async def wait_for_changes(self, timeout_s: float) -> None:
        """Return when another commit of observations may be in the change
        feed: at once on a ``NOTIFY`` (PostgreSQL, a connection of its own
        listening in a thread), else after ``timeout_s`` (SQLite, or a
        failing database). Never raises ``StoreError``."""
        if not self._reader.notifies:
            await trio.sleep(timeout_s)
            return

        def wait() -> None:
            if self._listener is None:
                self._listener = self._connect()
            self._listener.wait_for_changes(timeout_s)

        try:
            # Abandoned on cancel: the thread ends within timeout_s, and the
            # limiter keeps the next wait off the connection until then.
            await trio.to_thread.run_sync(
                wait, limiter=self._listen_limiter, abandon_on_cancel=True
            )
        except StoreError as exc:
            log.error("change feed: listening failed, reading every %gs: %s", timeout_s, exc)
            await trio.sleep(timeout_s)

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
            with self._connect() as store:
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

    def note_asked(self, target: Target, key: str | None = None) -> None:
        """Someone asked about ``target`` (``key``: its ``Target.key``, when
        the caller has it): it is written with the next flush, so the
        retention does not remove it. Never waits, never touches the disk:
        a dictionary store; when ``MAX_ASKED_NOTES`` are pending the note is
        dropped (counted) and the flush is brought forward."""
        asked = self._asked
        if key is None:
            key = target.key
        if key in asked:
            return
        if len(asked) >= MAX_ASKED_NOTES:
            self._asked_dropped += 1
            self._asked_full.set()
            return
        asked[key] = target

    async def record(self, *results: ProbeResult) -> None:
        """Queue ``results`` (one probe's sightings: ``ProbeReport.sightings``)
        for the writer, as one item: they are committed in one batch, so the
        change feed has one change of the target for them. Waits while the
        queue is full."""
        if not results:
            return
        try:
            self._send.send_nowait(results)
        except trio.WouldBlock:
            self._producer_waits += 1
            await self._send.send(results)

    def statistics(self) -> StorageStatistics:
        return StorageStatistics(
            queued=self._send.statistics().current_buffer_used,
            committed=self._committed,
            batches=self._batches,
            failed_batches=self._failed_batches,
            producer_waits=self._producer_waits,
            failing=self._failing,
            lost=self._lost,
            asked_queued=len(self._asked),
            asked_dropped=self._asked_dropped,
            pruned_targets=self._pruned_targets,
        )

    async def _on_writer(self, function: Callable[..., Any], *args: object) -> Any:
        """Run ``function(*args)`` with the writer's connection, between
        batches."""
        return await trio.to_thread.run_sync(function, *args, limiter=self._write_limiter)

    async def _serve_maintenance(self) -> None:
        """Bring the rows within the limits, then flush the asked-about
        notes and prune, for ever (see the module docstring)."""
        try:
            await self._enforce_limits()
        except StoreError as exc:
            log.error("store: could not bring the stored targets within the limits "
                      "(tried again at the next start): %s", exc)
        next_prune = trio.current_time() + ASKED_FLUSH_INTERVAL_S
        while True:
            with trio.move_on_after(ASKED_FLUSH_INTERVAL_S):
                await self._asked_full.wait()
            await self._flush_asked()
            await self._prune_feed()
            if self._claims is not None:
                await self._delete_expired_claims()
            if self._forget_unasked_after_s is not None and trio.current_time() >= next_prune:
                next_prune = trio.current_time() + PRUNE_INTERVAL_S
                await self._prune()

    async def _enforce_limits(self) -> None:
        """``enforce_limits`` a chunk of targets at a time, so batches
        are committed in between."""
        writer = self._writer
        if await self._on_writer(writer.limits_enforced):
            return
        report = PruneReport()
        for first_id, last_id in await self._on_writer(writer.target_id_ranges):
            report += await self._on_writer(writer.enforce_limits_in, first_id, last_id)
        report += await self._on_writer(writer.record_limits)
        log.info("store: every target is now within the limits: %s", report)

    async def _flush_asked(self) -> None:
        """Write the targets asked about since the last flush; on failure,
        keep them (as many as fit) for the next one."""
        asked = self._asked
        if not asked:
            return
        self._asked = {}
        self._asked_full = trio.Event()
        keys = [(target.host, target.port) for target in asked.values()]
        try:
            await self._on_writer(self._writer.note_asked, keys, int(self._clock()))
        except StoreError as exc:
            log.error("store: could not note %d targets asked about, retrying: %s",
                      len(keys), exc)
            for key, target in asked.items():
                if len(self._asked) >= MAX_ASKED_NOTES:
                    break
                self._asked.setdefault(key, target)

    async def _prune(self) -> None:
        """Remove the targets nobody asked about for
        ``forget_unasked_after_s``, a chunk a transaction; log what went."""
        assert self._forget_unasked_after_s is not None
        asked_before = int(self._clock()) - self._forget_unasked_after_s
        report = PruneReport()
        try:
            while True:
                chunk = await self._on_writer(self._writer.prune_unasked, asked_before)
                report += chunk
                self._pruned_targets += chunk.targets
                if chunk.targets == 0:
                    break
        except StoreError as exc:
            log.error("store: removing targets nobody asked about failed, "
                      "tried again in %gs: %s", PRUNE_INTERVAL_S, exc)
        if report:
            log.info("store: removed what nobody asked about for %d days: %s",
                     self._forget_unasked_after_s // 86400, report)

    async def _prune_feed(self) -> None:
        try:
            await self._on_writer(self._writer.prune_feed, self._feed_max_rows)
        except StoreError as exc:
            log.error("store: pruning the change feed failed, tried again in %gs: %s",
                      ASKED_FLUSH_INTERVAL_S, exc)

    async def _delete_expired_claims(self) -> None:
        try:
            await self._on_writer(self._writer.delete_expired_claims, int(self._clock() * 1000))
        except StoreError as exc:
            log.error("store: deleting expired probe claims failed: %s", exc)

    def _closing(self) -> None:
        """The queue is being closed (a clean stop): start the bound on
        retries."""
        self._give_up_at = trio.current_time() + SHUTDOWN_RETRY_S

    async def _serve_writer(
        self,
        receive: trio.MemoryReceiveChannel[tuple[ProbeResult, ...]],
        batch_rows: int,
        batch_interval_s: float,
    ) -> None:
        """Commit what is queued in batches of about ``batch_rows`` rows
        (a probe's sightings are never split: a batch may pass the size by
        less than one probe's), at least every ``batch_interval_s``."""
        async with receive:
            while True:
                try:
                    first = await receive.receive()
                except trio.EndOfChannel:
                    break
                batch = [first]
                rows = len(first)
                with trio.move_on_after(batch_interval_s):
                    while rows < batch_rows:
                        # Take what is queued without a scheduler round per
                        # item; wait only when the queue is empty.
                        try:
                            item = receive.receive_nowait()
                        except trio.WouldBlock:
                            try:
                                item = await receive.receive()
                            except trio.EndOfChannel:
                                break
                        except trio.EndOfChannel:
                            break
                        batch.append(item)
                        rows += len(item)
                while rows < batch_rows:  # whatever is ready now, without waiting
                    try:
                        item = receive.receive_nowait()
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                    batch.append(item)
                    rows += len(item)
                await self._commit(batch)
        if self._lost:
            log.error(
                "store still unusable %gs after the stop began: %d observations were "
                "not committed", SHUTDOWN_RETRY_S, self._lost,
            )

    async def _commit(self, batch: list[tuple[ProbeResult, ...]]) -> None:
        """Commit ``batch`` (each item one probe's sightings) in one
        transaction, retrying as the module docstring says."""
        results = [result for item in batch for result in item]
        probes = [len(item) for item in batch]
        delay = FIRST_RETRY_DELAY_S
        while True:
            if self._lost:  # given up already: the rest of the queue goes too
                self._lost += len(results)
                return
            started = trio.current_time()
            try:
                # Shielded: a batch taken from the queue is committed even
                # while the notary shuts down.
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(
                        partial(self._writer.record, results, self.origin, probes=probes),
                        limiter=self._write_limiter,
                    )
            except StoreError as exc:
                self._failed_batches += 1
                self._failing = True
                give_up_at = self._give_up_at
                if give_up_at is not None and trio.current_time() >= give_up_at:
                    self._lost += len(results)
                    return
                log.error(
                    "store write of %d observations failed, retrying: %s", len(results), exc
                )
                if give_up_at is not None:  # never sleep past the bound
                    delay = min(delay, max(give_up_at - trio.current_time(), 0.0))
                await trio.sleep(delay)
                delay = min(delay * 2, MAX_RETRY_DELAY_S)
                continue
            self._committed += len(results)
            self._batches += 1
            self._failing = False
            if self._timings is not None:
                self._timings.batch_written(len(results), trio.current_time() - started)
            return


@asynccontextmanager
async def open_storage(
    path: Path | None,
    store: StoreConfig = KEEP_EVERYTHING,
    *,
    file_mode: int = DATABASE_FILE_MODE,
    clock: Callable[[], float] = time.time,
    timings: BatchTimings | None = None,
) -> AsyncIterator[Storage]:
    """Open the store of ``[store] backend`` (SQLite: the file ``path``;
    PostgreSQL: ``[store] dsn``, ``path`` None), created and migrated if
    needed (SQLite: its files given ``file_mode``), and run its writer and
    its maintenance (module docstring) by the ``[store]`` section ``store``
    until the block exits: its limits are what a target keeps (``TimelineLimits``), its
    ``forget_unasked_after_s`` the retention of targets nobody asked about
    (None: for ever), by ``clock`` (Unix seconds); ``timings``, if given, is
    told the rows and write seconds of each committed batch. Raises
    ``StoreError`` if it cannot be opened, ``ValueError`` for a limit out of
    range or a SQLite store without a path."""
    open_writer, connect = store_openers(path, store, file_mode)
    writer = await trio.to_thread.run_sync(open_writer)
    try:
        reader = await trio.to_thread.run_sync(connect)
    except BaseException:
        writer.close()
        raise
    send, receive = trio.open_memory_channel[tuple[ProbeResult, ...]](store.queue_rows)
    storage = Storage(
        reader, writer, send, connect=connect, forget_unasked_after_s=store.forget_unasked_after_s,
        feed_max_rows=store.feed_max_rows, clock=clock, timings=timings,
    )
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                storage._serve_writer, receive, store.batch_rows, store.batch_interval_ms / 1000
            )
            maintenance = trio.CancelScope()
            nursery.start_soon(_run_in, maintenance, storage._serve_maintenance)
            try:
                yield storage
            finally:
                maintenance.cancel()
                storage._closing()
                await send.aclose()  # the writer drains what is queued, then returns
        if not storage._lost:  # a clean stop: the last notes too (one try)
            with trio.CancelScope(shield=True):
                await storage._flush_asked()
    finally:
        reader.close()
        writer.close()
        for extra in (storage._claims, storage._listener):
            if extra is not None:
                extra.close()


def store_openers(
    path: Path | None, store: StoreConfig, file_mode: int = DATABASE_FILE_MODE
) -> tuple[Callable[[], ObservationStore], Callable[[], ObservationStore]]:
    """How to open, by ``[store] backend``, a connection that makes or
    migrates the schema (SQLite: and gives the files ``file_mode``), and
    one to a store that exists; ``path``: the SQLite file (``ValueError``
    without one)."""
    limits, merge_window_s = store.timeline_limits(), store.merge_window_s
    if store.backend == "postgresql":
        from notary.state.pgstore import PostgresStore

        return (
            lambda: PostgresStore(store.dsn, merge_window_s=merge_window_s, limits=limits),
            lambda: PostgresStore(store.dsn, create=False, merge_window_s=merge_window_s,
                                  limits=limits),
        )
    if path is None:
        raise ValueError("the SQLite store needs the path of its file")
    synchronous = store.synchronous
    return (
        lambda: Store(path, synchronous=synchronous, merge_window_s=merge_window_s,
                      limits=limits, file_mode=file_mode),
        lambda: Store(path, synchronous=synchronous, create=False,
                      merge_window_s=merge_window_s, limits=limits),
    )


async def _run_in(scope: trio.CancelScope, function: Callable[[], Any]) -> None:
    """Run ``await function()`` under ``scope`` (cancelled apart from the
    nursery it runs in)."""
    with scope:
        await function()
