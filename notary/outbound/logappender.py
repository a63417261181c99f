"""The transparency log from Trio: statements queued as they are signed,
sequenced in batches by a task of the notary's, off the request path.

``LogAppender.submit`` is called when a v2 statement is signed (it carries
the log promise, rule S7); at least every ``[log] checkpoint_interval_s``
the appender's task appends what is queued (``notary.state.tlogstore``, in
a worker thread, one write transaction per batch with its signed
checkpoint) and hands each statement its inclusion proof through its
``LogSlot``, from where the answers serve it.

Resource handling: ``run`` opens the log's own database connection, keeps
it for its lifetime and closes it when cancelled; whoever starts ``run``
(``serve_notary``) owns the task. On a clean stop the task appends what is
still queued (up to ``STOP_FLUSH_S``) before closing.

Error handling and bounds: the queue holds at most ``[log] max_pending``
statements; ``submit`` beyond that raises ``LogBacklogged`` (a 503: the
statement is not served, so no promise is made that cannot be kept), and
so does a statement whose entry is longer than a log entry may be
(``tlog.MAX_ENTRY_BYTES``, 65,535 bytes: a tile bundle's length field),
which would otherwise fail its whole batch, and the appender with it. A
batch that fails (``StoreError``: the disk, a lock held past the busy
timeout) is kept and retried with back-off, logged and counted; a
``LogCorrupted`` store stops appending for good (logged, counted: the
statements then wait and v2 answers turn 503 once the queue is full).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import trio

from notary.errors import ConfigError, ProtocolError, StoreError
from notary.protocol import tlog, v2
from notary.state.crypto import Ed25519Signer
from notary.state.logcosignatures import StoredCosignature, Turn
from notary.state.tlogstore import MAX_BATCH, LogCorrupted, LogEngine, LogHead, LogStore

__all__ = ["LogAppender", "LogBacklogged", "LogStatistics"]

log = logging.getLogger(__name__)

FIRST_RETRY_DELAY_S = 0.1
MAX_RETRY_DELAY_S = 5.0
#: On a clean stop, how long what is still queued may take to be appended.
STOP_FLUSH_S = 10.0


class LogBacklogged(ProtocolError):
    """The log's queue is full: the query is answered 503 until it drains."""

    status = 503


@dataclass(slots=True)
class LogStatistics:
    """What the metrics read (``notary_log_*``): statements appended by
    this worker and the bytes of their entries, its batches and failed
    batches, the log's size as it last knew it, statements waiting now,
    statements refused as too large to log."""

    appended: int = 0
    appended_bytes: int = 0
    batches: int = 0
    failed_batches: int = 0
    size: int = 0
    pending: int = 0
    refused_too_large: int = 0


class LogAppender:
    """See the module docstring. ``path``: where the log is, what
    ``open_store`` opens (``LogStore``: the SQLite database file;
    ``PostgresLogStore``: the store's DSN); ``signer``: the v2 key, which
    signs the checkpoints; ``on_sequenced``: told of each batch sequenced
    (its first index and its statements, whose slots hold their inclusion:
    ``cosigned.AwaitingWitnesses.add``; None: nobody)."""

    def __init__(
        self, path: Path | str, *, origin: str, signer: Ed25519Signer, interval_s: float,
        max_merge_delay_s: int, max_pending: int,
        open_store: Callable[[Any], LogEngine] = LogStore,
        on_sequenced: Callable[[int, Sequence[v2.SignedStatement]], None] | None = None,
    ) -> None:
        self.origin = origin
        self.max_merge_delay_s = max_merge_delay_s
        self._path = path
        self._signer = signer
        self._interval_s = interval_s
        self._max_pending = max_pending
        self._open_store = open_store
        self._queue: deque[v2.SignedStatement] = deque()
        self._counts = LogStatistics()
        #: The newest checkpoint this appender made or read (None: none yet).
        self.head: LogHead | None = None
        self._broken = False
        self._reader: LogEngine | None = None
        self._reader_limiter = trio.CapacityLimiter(1)
        self._on_sequenced = on_sequenced
        self._appended = trio.Event()

    @property
    def pending(self) -> int:
        return len(self._queue)

    def statistics(self) -> LogStatistics:
        """A snapshot of the counts."""
        return replace(self._counts, pending=len(self._queue))

    def promise(self, signed_at: int) -> dict[str, object]:
        """The ``log`` member of a statement signed at ``signed_at``."""
        return v2.log_promise(
            self.origin, signed_at=signed_at, max_merge_delay_s=self.max_merge_delay_s
        )

    def submit(self, signed: v2.SignedStatement) -> None:
        """Queue a statement just signed with a promise. Raises
        ``LogBacklogged`` when ``max_pending`` are queued already, or when
        its entry is longer than the log takes (then it is not served)."""
        if len(signed.entry) > tlog.MAX_ENTRY_BYTES:
            self._counts.refused_too_large += 1  # counted, not logged: it recurs per query
            raise LogBacklogged("this statement is too large for the notary's log")
        if len(self._queue) >= self._max_pending:
            raise LogBacklogged("the notary's log is catching up: try again shortly")
        self._queue.append(signed)

    def sign_checkpoint(self, size: int, root: bytes) -> str:
        """The signed note of the tree of ``size`` leaves and ``root``."""
        text = tlog.format_checkpoint(tlog.Checkpoint(self.origin, size, root))
        return tlog.sign_note(text, self.origin, self._signer.sign_raw, self._signer.public_raw)

    # -- reads (the /v2/log/ pages), on a connection of their own -------------

    async def _on_reader(self, method: str, *args: object) -> Any:
        if self._reader is None:
            raise StoreError("the log is not open")
        reader = self._reader
        return await trio.to_thread.run_sync(
            partial(getattr(reader, method), *args), limiter=self._reader_limiter
        )

    async def read_head(self) -> LogHead | None:
        return await self._on_reader("head")

    async def read_tile(self, level: int, index: int) -> bytes | None:
        return await self._on_reader("tile", level, index)

    async def read_entries(self, start: int, end: int) -> list[bytes]:
        return await self._on_reader("entries", start, end)

    async def read_consistency_proof(self, old_size: int, new_size: int) -> list[bytes]:
        return await self._on_reader(
            "consistency_proof", old_size, new_size
        )

    async def read_inclusion_proofs(self, indices: Sequence[int], size: int) -> list[list[bytes]]:
        return await self._on_reader("inclusion_proofs", list(indices), size)

    async def read_cosignatures(self) -> list[StoredCosignature]:
        return await self._on_reader("cosignatures")

    async def add_cosignature(self, cosignature: StoredCosignature) -> None:
        await self._on_reader("add_cosignature", cosignature)

    async def take_witness_turn(
        self, witness: str, holder: str, now_ms: int, until_ms: int
    ) -> Turn | None:
        return await self._on_reader("take_witness_turn", witness, holder, now_ms, until_ms)

    async def record_witness_size(self, witness: str, holder: str, size: int) -> None:
        await self._on_reader("record_witness_size", witness, holder, size)

    async def wait_appended(self) -> None:
        """Return once this appender sequenced its next batch."""
        await self._appended.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Append what is queued every ``interval_s`` until cancelled; then
        what is left, for up to ``STOP_FLUSH_S``. Opens the log's two
        connections (appending, reading) and closes them when it returns."""
        store = await trio.to_thread.run_sync(self._open_store, self._path)
        try:
            self._reader = await trio.to_thread.run_sync(self._open_store, self._path)
        except BaseException:
            store.close()
            raise
        try:
            self.head = await trio.to_thread.run_sync(store.head)
            if self.head is not None:
                self._check_identity(self.head)
                self._counts.size = self.head.size
            task_status.started()
            try:
                while True:
                    await trio.sleep(self._interval_s)
                    await self._append_queued(store)
            finally:
                with trio.move_on_after(STOP_FLUSH_S) as scope:
                    scope.shield = True
                    await self._append_queued(store, retry=False)
                if self._queue:
                    log.error("log: %d statements left unappended at stop", len(self._queue))
        finally:
            store.close()
            reader, self._reader = self._reader, None
            if reader is not None:
                with trio.CancelScope(shield=True):
                    async with self._reader_limiter:  # no read in flight on it
                        reader.close()

    def _check_identity(self, head: LogHead) -> None:
        """The stored log must be this notary's: its newest checkpoint names
        ``origin`` and is signed by the v2 key. Otherwise ``ConfigError``: a
        node configured with another key or origin would sign checkpoints
        of one log under two identities (and a new key needs a new log)."""
        try:
            v2.verify_checkpoint(head.checkpoint, self.origin, self._signer.public_raw)
        except v2.VerificationError as exc:
            raise ConfigError(
                f"the log in the store is not this notary's ([log] origin {self.origin!r} "
                f"and the v2 key): {exc.args[0] if exc.args else exc}; every node of a "
                "notary needs the same key and origin, and a new key a new log"
            ) from None

    async def _append_queued(self, store: LogEngine, *, retry: bool = True) -> None:
        delay = FIRST_RETRY_DELAY_S
        while self._queue and not self._broken:
            batch = [self._queue[i] for i in range(min(MAX_BATCH, len(self._queue)))]
            try:
                appended = await trio.to_thread.run_sync(
                    store.append, [signed.entry for signed in batch], self.sign_checkpoint
                )
            except LogCorrupted as exc:
                self._broken = True
                self._counts.failed_batches += 1
                log.critical("log: %s; appending stopped", exc)
                return
            except StoreError as exc:
                self._counts.failed_batches += 1
                log.error("log: batch of %d not appended (%s); retrying in %gs",
                          len(batch), exc, delay)
                if not retry:
                    return
                await trio.sleep(delay)
                delay = min(2 * delay, MAX_RETRY_DELAY_S)
                continue
            delay = FIRST_RETRY_DELAY_S
            for _ in batch:
                self._queue.popleft()
            checkpoint = appended.head.checkpoint
            for offset, signed in enumerate(batch):
                assert signed.log is not None
                signed.log.item = v2.inclusion_item(
                    signed.entry, index=appended.first_index + offset,
                    proof=appended.proofs[offset], checkpoint=checkpoint,
                )
            self.head = appended.head
            if self._on_sequenced is not None:
                self._on_sequenced(appended.first_index, batch)
            self._appended.set()
            self._appended = trio.Event()
            statistics = self._counts
            statistics.appended += len(batch)
            statistics.appended_bytes += sum(len(signed.entry) for signed in batch)
            statistics.batches += 1
            statistics.size = appended.head.size
