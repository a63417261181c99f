"""What the witnesses cosigned, as every worker serves it (docs/log.md
"Witnesses"): the log's checkpoints with their cosignature lines, and the
statements' inclusion proven against a cosigned checkpoint.

``CosignedCheckpoints.run`` reads the cosignatures kept in the store
(``notary.state.logcosignatures``, written by whichever worker holds a
witness's turn: ``notary.outbound.witnessing``) every ``interval_s``, and
at once when this worker's submitter stored one (``poke``). From them it
knows, for each checkpoint size, the lines of the configured witnesses, and
the newest checkpoint cosigned by at least ``need`` of them (``[log]
min_cosignatures``, at least 1): the *witnessed* checkpoint.

Statements: each batch this worker's appender sequences goes into an
``AwaitingWitnesses`` (given to the appender when it is made: its
``on_sequenced``); its statements wait there, in sequence order, until a
witnessed checkpoint covers their index. Then each one's inclusion is
proven again against that checkpoint (one read of the tiles per chunk of
statements) and its ``LogSlot`` gets the new entry, whose ``inclusion``
checkpoint is the note with the witnesses' lines, and is marked
``witnessed``. A client requiring cosignatures then checks the inclusion
and the cosignatures on one note. At most ``MAX_AWAITING`` statements wait:
beyond, the oldest are marked ``abandoned`` (answers keep their uncosigned
inclusion, and stop waiting for it).

Waiting answers: with ``[log] min_cosignatures``, a v2 answer whose
statements await witnesses waits (``wait_witnessed``) until they are
witnessed or ``[log] witness_wait_s`` passes; then it is answered as it
is, its inclusion not cosigned (the client's policy decides).

Resource handling: ``run`` borrows the appender's reader; whoever starts it
(``app.serve``) owns the task. Error handling: a store read that fails is
logged once and retried at the next round; statements whose proofs could
not be read wait on.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import trio

from notary.errors import StoreError
from notary.outbound.logappender import LogAppender
from notary.outbound.witnessing import LogWitnesses
from notary.protocol import v2
from notary.state.logcosignatures import StoredCosignature
from notary.state.tlogstore import LogHead

__all__ = [
    "MAX_AWAITING", "PROOF_CHUNK", "AwaitingWitnesses", "CosignedCheckpoints", "Witnessed",
    "WitnessingStatistics",
]

log = logging.getLogger(__name__)

#: Statements waiting for a witnessed checkpoint, at most, per worker.
MAX_AWAITING = 65_536
#: Inclusion proofs read per worker-thread call.
PROOF_CHUNK = 1024


@dataclass(frozen=True, slots=True)
class WitnessingStatistics:
    """What the metrics read (``notary_log_witness*``, by this worker):
    submissions made, cosignatures stored and exchanges failed (as the
    holder of a witness's turn); the witnessed checkpoint's size;
    statements proven against one, given up on, and waiting now; answers
    sent before their statements were witnessed."""

    submissions: int
    cosignatures: int
    failures: int
    witnessed_size: int
    rebased: int
    abandoned: int
    awaiting: int
    unwitnessed_answers: int


@dataclass(frozen=True, slots=True)
class Witnessed:
    """A checkpoint of ``size`` leaves with its cosignature lines
    (``note``), cosigned by ``count`` of the configured witnesses."""

    size: int
    note: str
    count: int


class AwaitingWitnesses:
    """The statements this worker sequenced that no witnessed checkpoint
    covers yet, in index order, at most ``MAX_AWAITING`` (beyond, the oldest
    are given up on: their slots marked ``abandoned``)."""

    def __init__(self) -> None:
        self._queue: deque[tuple[int, v2.SignedStatement]] = deque()
        #: Statements given up on.
        self.abandoned = 0

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, first_index: int, batch: Sequence[v2.SignedStatement]) -> None:
        """The appender sequenced ``batch`` from ``first_index``."""
        for offset, signed in enumerate(batch):
            if len(self._queue) >= MAX_AWAITING:
                _, oldest = self._queue.popleft()
                if oldest.log is not None:
                    oldest.log.abandoned = True
                self.abandoned += 1
            self._queue.append((first_index + offset, signed))

    def take_below(self, size: int, most: int) -> list[tuple[int, v2.SignedStatement]]:
        """Up to ``most`` of the oldest, those a tree of ``size`` covers."""
        taken: list[tuple[int, v2.SignedStatement]] = []
        while self._queue and self._queue[0][0] < size and len(taken) < most:
            taken.append(self._queue.popleft())
        return taken

    def put_back(self, taken: Sequence[tuple[int, v2.SignedStatement]]) -> None:
        """``taken`` wait again, first, in order."""
        self._queue.extendleft(reversed(taken))


class CosignedCheckpoints:
    """See the module docstring. ``awaiting``: the appender's
    ``on_sequenced`` queue; ``witnesses``: the configured witnesses'
    cosigner vkeys (their lines are served in this order);
    ``min_cosignatures``: ``[log] min_cosignatures``; ``wait_s``: ``[log]
    witness_wait_s``."""

    def __init__(
        self, appender: LogAppender, awaiting: AwaitingWitnesses, witnesses: Sequence[str], *,
        min_cosignatures: int, interval_s: float, wait_s: float,
    ) -> None:
        self._log = appender
        self._awaiting = awaiting
        self._order = {vkey: position for position, vkey in enumerate(witnesses)}
        self.min_cosignatures = min_cosignatures
        self._need = max(1, min_cosignatures)
        self._interval_s = interval_s
        self._wait_s = wait_s
        #: size -> (the log's note, the witnesses' lines in configuration order)
        self._by_size: dict[int, tuple[str, tuple[str, ...]]] = {}
        #: The newest checkpoint cosigned by ``need`` witnesses (None: none yet).
        self.witnessed: Witnessed | None = None
        self._poked = trio.Event()
        self._rebased = trio.Event()
        self._read_failing = False
        #: Statements proven against a witnessed checkpoint, and answers sent
        #: without waiting long enough, by this worker.
        self.rebased = 0
        self.unwitnessed_answers = 0

    def statistics(self, submitter: LogWitnesses | None = None) -> WitnessingStatistics:
        """A snapshot of the counts, with ``submitter``'s."""
        return WitnessingStatistics(
            submissions=submitter.submissions if submitter else 0,
            cosignatures=submitter.cosignatures if submitter else 0,
            failures=submitter.failures if submitter else 0,
            witnessed_size=self.witnessed.size if self.witnessed else 0,
            rebased=self.rebased, abandoned=self._awaiting.abandoned,
            awaiting=len(self._awaiting),
            unwitnessed_answers=self.unwitnessed_answers,
        )

    def poke(self) -> None:
        """Read the store again now (a cosignature was just stored)."""
        self._poked.set()

    def checkpoint_for(self, head: LogHead) -> str:
        """What ``/v2/log/checkpoint`` serves when ``head`` is the newest:
        with ``min_cosignatures``, the newest witnessed checkpoint (the head
        itself until one is); otherwise the head with the lines collected
        for it so far."""
        if self.min_cosignatures and self.witnessed is not None:
            return self.witnessed.note
        note, lines = self._by_size.get(head.size, ("", ()))
        return head.checkpoint + "".join(lines) if note == head.checkpoint else head.checkpoint

    async def wait_witnessed(self, statements: Iterable[v2.SignedStatement | None]) -> None:
        """With ``min_cosignatures``, return once every logged statement of
        ``statements`` is witnessed (or given up on), or ``wait_s`` passed."""
        if not self.min_cosignatures:
            return
        slots = [s.log for s in statements if s is not None and s.log is not None]
        if not any(slot.awaits_witnesses for slot in slots):
            return  # the usual case, a cache hit: no cancel scope to make
        with trio.move_on_after(self._wait_s):
            while any(slot.awaits_witnesses for slot in slots):
                await self._rebased.wait()
            return
        self.unwitnessed_answers += 1

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Follow the store's cosignatures until cancelled."""
        task_status.started()
        while True:
            with trio.move_on_after(self._interval_s):
                await self._poked.wait()
            self._poked = trio.Event()
            try:
                self._learn(await self._log.read_cosignatures())
                await self._rebase()
            except (StoreError, ValueError) as exc:  # ValueError: a tree shorter than cosigned
                if not self._read_failing:
                    log.warning("log: cosignatures cannot be read (%s); trying again", exc)
                self._read_failing = True
                continue
            if self._read_failing:
                log.info("log: cosignatures read again")
                self._read_failing = False

    def _learn(self, rows: Sequence[StoredCosignature]) -> None:
        """Index ``rows`` (newest first) by size, and find the witnessed one."""
        grouped: dict[int, tuple[str, list[tuple[int, str]]]] = {}
        for row in rows:
            position = self._order.get(row.witness)
            if position is None:
                continue  # a witness no longer configured
            note, lines = grouped.setdefault(row.size, (row.checkpoint, []))
            if row.checkpoint == note:
                lines.append((position, row.line))
        self._by_size = {
            size: (note, tuple(line for _, line in sorted(lines)))
            for size, (note, lines) in grouped.items()
        }
        for size in sorted(self._by_size, reverse=True):
            note, kept = self._by_size[size]
            if len(kept) >= self._need:
                if self.witnessed is None or size > self.witnessed.size:
                    self.witnessed = Witnessed(size, note + "".join(kept), len(kept))
                break

    async def _rebase(self) -> None:
        """Prove the waiting statements a witnessed checkpoint covers
        against it, a chunk at a time."""
        witnessed = self.witnessed
        if witnessed is None:
            return
        while chunk := self._awaiting.take_below(witnessed.size, PROOF_CHUNK):
            try:
                proofs = await self._log.read_inclusion_proofs(
                    [index for index, _ in chunk], witnessed.size
                )
            except BaseException:
                self._awaiting.put_back(chunk)
                raise
            for (index, signed), proof in zip(chunk, proofs, strict=True):
                slot = signed.log
                assert slot is not None
                slot.item = v2.inclusion_item(
                    signed.entry, index=index, proof=proof, checkpoint=witnessed.note
                )
                slot.witnessed = True
            self.rebased += len(chunk)
            self._rebased.set()
            self._rebased = trio.Event()
