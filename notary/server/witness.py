"""The notary as a witness of other transparency logs (C2SP tlog-witness;
docs/log.md "Witnesses"): ``POST /v2/witness/add-checkpoint``, and what it
holds of each log for monitors, ``GET /v2/witness/view/<sha256 of the
origin>``.

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

The logs witnessed are ``[witness] logs`` and the logs of the bundles of
``[witness] bundles`` (``notary.server.witnessedlogs``), read at start and
again by ``reload`` (SIGHUP): the set and the views cached for it are
replaced as one (one attribute), so a reload needs no lock and drops no
connection; a request under way finishes with the set it started with.

The view: the checkpoint note held for the log whose origin hashes to the
path's 64 lowercase hex digits, reduced to its text and the log's own
signature lines (the other lines a submitter sent are left out), followed
by a cosignature line of this witness made now: 200, ``text/plain``. 400
for a malformed hash; 404 for a log not witnessed, or nothing held (or
nothing its current keys signed); 405 for a method but GET.

Bounds: a body larger than ``tlog.MAX_ADD_CHECKPOINT_BYTES`` is a 413 (the
HTTP layer bounds it first by the API's body limit); each request's store
work runs in a worker thread, one at a time per worker process. A view
request costs its client prefix one query token first (``[limits]
queries_per_s_per_prefix``: 429 and ``Retry-After`` beyond, as
``/v2/log/``); a view made (one store read, one signature; a 404 of
nothing held too) is kept ``VIEW_CACHE_S`` per log, so the views cached
are at most the logs witnessed, and concurrent requests for a view not
cached wait for one to make it. A view's body is at most the held note (a
submission's, under 16 KiB) and one line.

Resource handling: ``run`` opens the witness's own database connection,
keeps it while the notary serves and closes it when cancelled; whoever
starts ``run`` (``app.serve``) owns the task. Error handling: every refusal
is a ``ProtocolError`` with its status; a store that fails is a 503.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio

from notary.errors import ProtocolError, StoreError, UsageError
from notary.protocol import tlog
from notary.server.witnessedlogs import read_witnessed_logs
from notary.service.abuse import AbuseControls
from notary.service.query import Answer
from notary.state.crypto import Ed25519Signer
from notary.state.witnessstore import WitnessEngine, WitnessStore

__all__ = [
    "ADD_CHECKPOINT_PATH", "VIEW_CACHE_S", "VIEW_PREFIX", "WITNESS_PREFIX", "Witness",
    "WitnessRefused",
]

log = logging.getLogger(__name__)

WITNESS_PREFIX = b"/v2/witness/"
ADD_CHECKPOINT_PATH = WITNESS_PREFIX + b"add-checkpoint"
#: Followed by the SHA-256 of a log's origin, 64 lowercase hex digits.
VIEW_PREFIX = WITNESS_PREFIX + b"view/"
#: A view made is served again for this long (monotonic seconds).
VIEW_CACHE_S = 1.0
TEXT = b"text/plain; charset=utf-8"
FRESH = ((b"Cache-Control", b"no-cache"),)
_ORIGIN_HASH = re.compile(rb"[0-9a-f]{64}")


@dataclass(slots=True)
class _Witnessed:
    """The logs witnessed (origin -> ``open_note`` verifiers), the origin of
    each origin hash, and the views made for them: origin -> (made at,
    body; None: nothing held). Replaced as one on reload."""

    logs: dict[str, dict[tuple[str, bytes], tlog.Verify]]
    by_hash: dict[bytes, str] = field(init=False)
    views: dict[str, tuple[float, bytes | None]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.by_hash = {
            hashlib.sha256(origin.encode("utf-8")).hexdigest().encode("ascii"): origin
            for origin in self.logs
        }


class WitnessRefused(ProtocolError):
    """A refusal with its status; a 409 carries the size held as its body."""

    def __init__(self, refusal: tlog.WitnessRefusal) -> None:
        super().__init__(refusal.message, status=refusal.status)
        self.held_size = refusal.held_size


@dataclass(frozen=True, slots=True)
class WitnessStatistics:
    """What the metrics read (``notary_witness_*``, by this worker):
    checkpoints cosigned, requests refused by status, views served and made
    afresh, and the logs witnessed now."""

    cosigned: int
    refused: dict[int, int]
    views: int
    views_made: int
    logs: int


class Witness:
    """See the module docstring. ``path``: what ``open_store`` opens (the
    SQLite file, or the fleet's DSN); ``logs``: the witnessed logs' vkeys,
    and ``bundles`` the files and directories of bundles whose logs are
    witnessed too (read here, blocking; a path missing is a warning);
    ``clock``: POSIX seconds, the cosignatures' timestamps and the query
    budgets' clock; ``abuse``: the query budgets a view costs (None: none)."""

    def __init__(
        self, path: Path | str, *, name: str, logs: Sequence[str], signer: Ed25519Signer,
        clock: Callable[[], float], open_store: Callable[[Any], WitnessEngine] = WitnessStore,
        bundles: Sequence[Path] = (), abuse: AbuseControls | None = None,
    ) -> None:
        self.name = name
        self._path = path
        self._vkeys = tuple(logs)
        self._bundles = tuple(bundles)
        self._witnessed = _Witnessed(
            tlog.witnessed_logs(read_witnessed_logs(self._vkeys, self._bundles, strict=False))
        )
        self._signer = signer
        self._clock = clock
        self._abuse = abuse
        self._open_store = open_store
        self._store: WitnessEngine | None = None
        self._limiter = trio.CapacityLimiter(1)
        self._making_view = trio.Lock()
        #: Checkpoints cosigned, and refused by status, by this worker.
        self.cosigned = 0
        self.refused: dict[int, int] = {}
        #: Views served (200), and made afresh (each a store read).
        self.views = 0
        self.views_made = 0

    def statistics(self) -> WitnessStatistics:
        """A snapshot of the counts (the metrics' ``witness`` source)."""
        return WitnessStatistics(
            self.cosigned, dict(self.refused), self.views, self.views_made,
            len(self._witnessed.logs),
        )

    @property
    def origins(self) -> frozenset[str]:
        """The origins of the logs witnessed now."""
        return frozenset(self._witnessed.logs)

    def reload(self) -> bool:
        """Read ``[witness] bundles`` again (blocking: SIGHUP's worker
        thread) and witness ``[witness] logs`` and their logs from now on;
        a path that cannot be read keeps the logs witnessed (logged).
        Returns whether the new set is in use."""
        try:
            logs = tlog.witnessed_logs(
                read_witnessed_logs(self._vkeys, self._bundles, strict=True)
            )
        except UsageError as exc:
            log.error("witness: kept the previous logs: %s", exc)
            return False
        self._witnessed = _Witnessed(logs)
        log.info("witness: %d logs witnessed", len(logs))
        return True

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

    async def answer(
        self, method: bytes, path: bytes, body: bytes, *, client: bytes | None = None
    ) -> Answer:
        """The answer to a request under ``/v2/witness/`` of the client
        prefix ``client`` (None: unlimited); raises ``ProtocolError`` with
        its status (``RateLimited``: 429 with its ``retry_after_s``)."""
        if path.startswith(VIEW_PREFIX):
            return await self._view(method, path[len(VIEW_PREFIX):], client)
        if path != ADD_CHECKPOINT_PATH:
            raise ProtocolError("not found", status=404)
        if method != b"POST":
            raise ProtocolError("method not allowed", status=405)
        if len(body) > tlog.MAX_ADD_CHECKPOINT_BYTES:
            raise ProtocolError("request too large", status=413)
        try:
            try:
                request, checkpoint = tlog.open_submission(body, self._witnessed.logs)
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

    async def _view(self, method: bytes, origin_hash: bytes, client: bytes | None) -> Answer:
        if self._abuse is not None:
            self._abuse.admit_query(client, self._clock())
        if method != b"GET":
            raise ProtocolError("method not allowed", status=405)
        if _ORIGIN_HASH.fullmatch(origin_hash) is None:
            raise ProtocolError(
                "expected the SHA-256 of a log's origin, 64 lowercase hex digits", status=400
            )
        witnessed = self._witnessed
        origin = witnessed.by_hash.get(origin_hash)
        if origin is None:
            raise ProtocolError("not a log this witness witnesses", status=404)
        body = await self._view_of(witnessed, origin)
        if body is None:
            raise ProtocolError("this witness holds no checkpoint of that log", status=404)
        self.views += 1
        return Answer(200, body, TEXT, FRESH)

    async def _view_of(self, witnessed: _Witnessed, origin: str) -> bytes | None:
        """The view of ``origin``: cached, or made (one at a time: those
        waiting then find it cached)."""
        cached = witnessed.views.get(origin)
        if cached is not None and trio.current_time() - cached[0] < VIEW_CACHE_S:
            return cached[1]
        async with self._making_view:
            now = trio.current_time()
            cached = witnessed.views.get(origin)
            if cached is not None and now - cached[0] < VIEW_CACHE_S:
                return cached[1]
            store = self._store
            if store is None:
                raise ProtocolError("the witness is not open", status=503)
            try:
                held = await trio.to_thread.run_sync(store.held, origin, limiter=self._limiter)
            except StoreError as exc:
                log.error("witness: %s", exc)
                raise ProtocolError("the witness cannot read its store now", status=503) from None
            self.views_made += 1
            body = None
            if held is not None:
                body = self._cosigned_view(held.note, witnessed.logs[origin])
            witnessed.views[origin] = (now, body)
            return body

    def _cosigned_view(
        self, note: str, verifiers: dict[tuple[str, bytes], tlog.Verify]
    ) -> bytes | None:
        """``note`` with the log's signature lines only, cosigned now; None
        when no current key of the log signed it (the key was replaced)."""
        try:
            text, signed = tlog.known_signatures_only(note, verifiers)
        except tlog.NoteError:
            return None
        line = tlog.cosign(
            text, self.name, self._signer.sign_raw, self._signer.public_raw, int(self._clock())
        )
        return (signed + line).encode("utf-8")

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
