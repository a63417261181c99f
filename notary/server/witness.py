"""The notary as a witness of other transparency logs (C2SP tlog-witness;
docs/log.md "Witnesses"): ``POST /v2/witness/add-checkpoint``.

A request brings a log's new checkpoint and a consistency proof from the
size the witness last cosigned for that log. The rules and their statuses
are ``notary.protocol.tlog.witness``'s: 400 malformed, 404 unknown log, 403
not signed by the log's key, 409 (body: the size held, ``text/x.tlog.size``)
when ``old`` is not that size, 422 when the proof does not verify (a fork).
Otherwise the checkpoint is stored as the one held for its origin, by a
compare-and-swap with the one checked against (``notary.state.witnessstore``),
and only then cosigned with the v2 key under ``[witness] name`` (C2SP
``cosignature/v1``, timestamped with the notary's clock): 200, the
cosignature line. A request that loses the swap to a concurrent one is
answered 409 with the size now held.

Bounds: a body larger than ``tlog.MAX_ADD_CHECKPOINT_BYTES`` is a 413 (the
HTTP layer bounds it first by the API's body limit); each request's store
work runs in a worker thread, one at a time per worker process.

Resource handling: ``run`` opens the witness's own database connection,
keeps it while the notary serves and closes it when cancelled; whoever
starts ``run`` (``app.serve``) owns the task. Error handling: every refusal
is a ``ProtocolError`` with its status; a store that fails is a 503.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import trio

from notary.errors import ProtocolError, StoreError
from notary.protocol import tlog
from notary.service.query import Answer
from notary.state.crypto import Ed25519Signer
from notary.state.witnessstore import WitnessEngine, WitnessStore

__all__ = ["ADD_CHECKPOINT_PATH", "WITNESS_PREFIX", "Witness", "WitnessRefused"]

log = logging.getLogger(__name__)

WITNESS_PREFIX = b"/v2/witness/"
ADD_CHECKPOINT_PATH = WITNESS_PREFIX + b"add-checkpoint"
TEXT = b"text/plain; charset=utf-8"


class WitnessRefused(ProtocolError):
    """A refusal with its status; a 409 carries the size held as its body."""

    def __init__(self, refusal: tlog.WitnessRefusal) -> None:
        super().__init__(refusal.message, status=refusal.status)
        self.held_size = refusal.held_size


class Witness:
    """See the module docstring. ``path``: what ``open_store`` opens (the
    SQLite file, or the fleet's DSN); ``logs``: the witnessed logs' vkeys;
    ``clock``: POSIX seconds, the cosignatures' timestamps."""

    def __init__(
        self, path: Path | str, *, name: str, logs: Sequence[str], signer: Ed25519Signer,
        clock: Callable[[], float], open_store: Callable[[Any], WitnessEngine] = WitnessStore,
    ) -> None:
        self.name = name
        self._path = path
        self._logs = tlog.witnessed_logs(logs)
        self._signer = signer
        self._clock = clock
        self._open_store = open_store
        self._store: WitnessEngine | None = None
        self._limiter = trio.CapacityLimiter(1)
        #: Checkpoints cosigned, and refused by status, by this worker.
        self.cosigned = 0
        self.refused: dict[int, int] = {}

    @property
    def vkey(self) -> str:
        """This witness's verifier key (type 0x04), what logs configure."""
        return tlog.cosigner_key(self.name, self._signer.public_raw)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Open the store, serve until cancelled, close it."""
        store = await trio.to_thread.run_sync(self._open_store, self._path)
        self._store = store
        try:
            task_status.started()
            await trio.sleep_forever()
        finally:
            self._store = None
            with trio.CancelScope(shield=True):
                async with self._limiter:  # no request in flight on it
                    store.close()

    async def answer(self, method: bytes, path: bytes, body: bytes) -> Answer:
        """The answer to a request under ``/v2/witness/``; raises
        ``ProtocolError`` with its status."""
        if path != ADD_CHECKPOINT_PATH:
            raise ProtocolError("not found", status=404)
        if method != b"POST":
            raise ProtocolError("method not allowed", status=405)
        if len(body) > tlog.MAX_ADD_CHECKPOINT_BYTES:
            raise ProtocolError("request too large", status=413)
        try:
            try:
                request, checkpoint = tlog.open_submission(body, self._logs)
                store = self._store
                if store is None:
                    raise ProtocolError("the witness is not open", status=503)
                await trio.to_thread.run_sync(
                    partial(self._advance, store, request, checkpoint), limiter=self._limiter
                )
            except tlog.WitnessRefusal as refusal:
                raise WitnessRefused(refusal) from None
        except ProtocolError as exc:
            self.refused[exc.status] = self.refused.get(exc.status, 0) + 1
            if isinstance(exc, WitnessRefused) and exc.held_size is not None:
                return Answer(
                    exc.status, b"%d\n" % exc.held_size, tlog.SIZE_CONTENT_TYPE.encode("ascii")
                )
            raise
        except StoreError as exc:
            log.error("witness: %s", exc)
            raise ProtocolError("the witness cannot store now", status=503) from None
        text = request.note[: request.note.rfind("\n\n") + 1]
        line = tlog.cosign(
            text, self.name, self._signer.sign_raw, self._signer.public_raw, int(self._clock())
        )
        self.cosigned += 1
        return Answer(200, line.encode("utf-8"), TEXT)

    @staticmethod
    def _advance(
        store: WitnessEngine, request: tlog.AddCheckpoint, checkpoint: tlog.Checkpoint
    ) -> None:
        """Check ``checkpoint`` against what is held for its origin and hold
        it instead (in a worker thread). Raises ``WitnessRefusal`` (409,
        422), ``StoreError``."""
        held = store.held(checkpoint.origin)
        tlog.check_consistent(request, checkpoint, held or tlog.NOTHING_HELD)
        new = tlog.HeldCheckpoint(checkpoint.size, checkpoint.root, request.note)
        if held is not None and held == new:
            return  # the same tree head again: held already, cosigned again
        if not store.swap(checkpoint.origin, held, new):
            now = store.held(checkpoint.origin)
            raise tlog.WitnessRefusal(
                409, "another request moved the witness", held_size=now.size if now else 0
            )
