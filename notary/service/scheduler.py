"""The rescan scheduler: re-probes the targets people ask about, so answers
stay fresh.

The Trio loop of the rescan rules (docs/rescan.md; the pure rules are in
:mod:`notary.model.rescan`). The scheduler keeps, for every *tracked* target,
when it is next due, in a heap with lazy deletion; :meth:`RescanScheduler.serve`
pops due targets and probes them within a global budget and a per-prefix
politeness limit, giving way to on-demand probes. docs/rescan.md also shows
how the server wires it.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import types
from collections import Counter, OrderedDict, deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import trio

from notary.config import RescanConfig
from notary.errors import ProbeError, ProbeThrottled, ProbeTimeout
from notary.model.observations import ProbeResult
from notary.model.rescan import (
    CHANGE_SMOOTHING,
    CHANGE_WEIGHT,
    FIRST_RETRY_S,
    GLOBAL_BURST,
    HEAP_SLACK,
    MIN_INTERVAL_S,
    NEW_TARGET_DELAY_S,
    POPULARITY_HALF_LIFE_S,
    STALENESS_HEADROOM,
    THROTTLED_RETRY_S,
    EvictionQueue,
    RescanTimes,
    StartSpacing,
    TrackedTarget,
    address_prefix,
    decayed,
    due_after_throttle,
    popularity_score,
    rescan_interval_s,
    retry_delay_s,
)
from notary.model.targets import Target

__all__ = [
    "CHANGE_SMOOTHING",
    "CHANGE_WEIGHT",
    "DEFAULT_MAX_IN_FLIGHT",
    "DEFAULT_PROBE_TIMEOUT_S",
    "FIRST_RETRY_S",
    "MIN_INTERVAL_S",
    "NEW_TARGET_DELAY_S",
    "POPULARITY_HALF_LIFE_S",
    "STALENESS_HEADROOM",
    "THROTTLED_RETRY_S",
    "Refresh",
    "Refreshed",
    "RescanScheduler",
    "SchedulerStatistics",
    "address_prefix",
    "decayed",
    "popularity_score",
    "rescan_interval_s",
    "retry_delay_s",
]

logger = logging.getLogger(__name__)

class Refreshed(Protocol):
    """What a refresh returns that the scheduler reads: the result of the
    probe it made and whether it saw a new certificate
    (``notary.service.records.TargetRecord``)."""

    last_probe: ProbeResult | None
    last_probe_changed: bool


#: What the scheduler calls to re-probe a target (``Records.refresh`` in the
#: server): raises ``ProbeError`` when the probe saw no certificate.
Refresh = Callable[[Target], Awaitable[Refreshed]]

#: How often ``on_demand_busy`` is asked again while it says busy (rule 8d).
HOLD_BACK_POLL_S = 1.0
#: Longest the serve loop sleeps without looking at its state again.
MAX_IDLE_S = 60.0
#: Window of the ``probes_per_s`` statistic.
RATE_WINDOW_S = 60.0
#: Defaults of the optional constructor arguments.
DEFAULT_MAX_IN_FLIGHT = 8
DEFAULT_PROBE_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class SchedulerStatistics:
    """A snapshot of a :class:`RescanScheduler`.

    ``targets_known``: tracked targets, the ones being kept fresh (the name
    is kept for the metrics and live figures that show it); ``due_now``:
    tracked targets whose due time has come and whose probe has not started;
    ``overdue``: tracked targets whose last successful observation (or first
    query, if none yet) is more than ``max_staleness_s`` old; ``in_flight``:
    the scheduler's probes running; ``probes_started``: the scheduler's
    probes started since it was made; ``probes_per_s``: starts over the last
    ``RATE_WINDOW_S``, divided by it; ``failures``: the scheduler's failed
    probes by :attr:`ProbeError.reason <notary.errors.ProbeError.reason>`;
    ``held_back``: checks at which a due probe waited because
    ``on_demand_busy()`` said so (one per ``HOLD_BACK_POLL_S``);
    ``deferred_by_prefix``: starts put off by the per-prefix limit;
    ``forgotten``: targets forgotten (idle or evicted); ``shared_skips``:
    started probes not made because the store had observed the target within
    its interval (rule 11; counted in ``probes_started`` too).
    """

    targets_known: int
    due_now: int
    overdue: int
    in_flight: int
    probes_started: int
    probes_per_s: float
    failures: Mapping[str, int]
    held_back: int
    deferred_by_prefix: int
    forgotten: int
    shared_skips: int = 0


class _Entry(TrackedTarget):
    """A tracked target and the generation of its live due-heap item (an
    item with another generation is stale)."""

    __slots__ = ("generation",)

    def __init__(self, target: Target, now: float, key: str) -> None:
        super().__init__(target, key, now)
        self.generation = 0


def _check_settings(numbers: Mapping[str, float], counts: Mapping[str, int]) -> None:
    """``ValueError`` naming the first setting that is not a positive finite
    number (``numbers``) or a positive integer (``counts``)."""
    for name, value in numbers.items():
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a positive number, not {value!r}")
    for name, count in counts.items():
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ValueError(f"{name} must be a positive integer, not {count!r}")


class RescanScheduler:
    """Keeps the answers for tracked targets fresh, by the rules of
    docs/rescan.md.

    ``config``: the ``[rescan]`` section (durations in seconds, rates per
    second): ``probes_per_s`` is the global budget of scheduled probes (rule
    8a); ``max_staleness_s`` is ``S``, a target still asked about is
    re-probed within ``STALENESS_HEADROOM * S`` of its last success (rules 4,
    5); ``forget_after_s``: idle time after which a target is forgotten
    (rule 1); ``base_interval_s``: interval of a target nobody asks about any
    more, capped at ``STALENESS_HEADROOM * S`` (``B``, rule 3), also the
    backoff cap; ``per_prefix_per_s``: politeness budget per address prefix
    (rule 8b); ``max_targets``: most targets tracked at once (rule 1);
    ``max_in_flight``: most scheduled probes running at once (rule 8c).
    ``enabled`` is the caller's (no scheduler is made when it is off).

    Keywords: ``on_demand_busy``: when it returns True, scheduled probes wait
    (rule 8d); ``clock``: the time source (seconds, monotonic, any origin);
    ``probe_timeout_s``: deadline of one scheduled probe (rule 9; the
    prober has its own, usually shorter, deadline); ``observed_age``: seconds
    since the store's newest observation of a target, None if it has none
    (rule 11; None: no such store).

    :meth:`note_query` and :meth:`note_probe` are synchronous and may be
    called from any task of the Trio run, whether :meth:`serve` runs or not.

    Resource handling: :meth:`serve` owns a nursery; every probe runs as a
    task in it and is cancelled when :meth:`serve` is. The scheduler holds no
    other resource; its memory is bounded by rule 10.

    Error handling: the constructor raises ``ValueError`` for a non-positive
    or non-finite argument. Probe failures are outcomes, not errors (rule 9).
    ``serve`` raises ``RuntimeError`` if it is already running.
    """

    def __init__(
        self,
        config: RescanConfig,
        *,
        on_demand_busy: Callable[[], bool] | None = None,
        clock: Callable[[], float] = trio.current_time,
        probe_timeout_s: float = DEFAULT_PROBE_TIMEOUT_S,
        observed_age: Callable[[Target], Awaitable[float | None]] | None = None,
    ) -> None:
        _check_settings(
            {
                "probes_per_s": config.probes_per_s,
                "max_staleness_s": config.max_staleness_s,
                "forget_after_s": config.forget_after_s,
                "base_interval_s": config.base_interval_s,
                "per_prefix_per_s": config.per_prefix_per_s,
                "probe_timeout_s": probe_timeout_s,
            },
            {"max_targets": config.max_targets, "max_in_flight": config.max_in_flight},
        )
        self._times = RescanTimes.from_settings(
            max_staleness_s=config.max_staleness_s, base_interval_s=config.base_interval_s
        )
        self._forget_after_s = float(config.forget_after_s)
        self._max_targets = config.max_targets
        self._on_demand_busy = on_demand_busy
        self._clock = clock
        self._max_in_flight = config.max_in_flight
        self._probe_timeout_s = float(probe_timeout_s)
        self._observed_age = observed_age

        # Tracked targets by ``Target.key``, least recently asked about first
        # (rule 1's idle forgetting). Keyed by the key string: hashing it is
        # cheaper than hashing the dataclass, and the query path has it already.
        self._tracked: OrderedDict[str, _Entry] = OrderedDict()
        self._eviction = EvictionQueue()  # rule 1's eviction order
        # (when, tie-breaker, generation, entry); stale if the generation moved.
        self._heap: list[tuple[float, int, int, _Entry]] = []
        self._sequence = itertools.count()
        self._probing: set[str] = set()  # keys of the targets being probed
        self._spacing = StartSpacing(config.probes_per_s, config.per_prefix_per_s)  # rules 8a, 8b
        self._wake = trio.Event()
        self._serving = False

        self._recent_starts: deque[float] = deque(
            maxlen=math.ceil(config.probes_per_s * RATE_WINDOW_S) + GLOBAL_BURST + 1
        )
        self._probes_started = 0
        self._failures: Counter[str] = Counter()
        self._held_back = 0
        self._deferred_by_prefix = 0
        self._forgotten = 0
        self._shared_skips = 0

    # ----------------------------------------------------------------- notes

    def note_query(self, target: Target, key: str | None = None) -> None:
        """Someone asked about ``target`` now: count it (rule 2), track it if
        it is new (rules 1, 6), maybe make it due sooner (rule 7).

        ``key`` is ``target.key`` when the caller has it already. Called on
        every query: the common case (a tracked target already due as soon as
        rule 7 allows) is a dictionary lookup and a few float operations.
        """
        if key is None:
            key = target.key
        now = self._clock()
        tracked = self._tracked
        entry = tracked.get(key)
        if entry is None:
            while len(tracked) >= self._max_targets:
                self._evict_least_popular()
            entry = _Entry(target, now, key)
            tracked[key] = entry
            self._eviction.add(entry, popularity_score(1.0, now), tracked)
            self._push(entry, entry.due_at)
            self._poke()
        else:
            tracked.move_to_end(key)
        sooner = entry.note_query(now, self._times)
        if sooner is not None and key not in self._probing:
            self._reschedule(entry, sooner)

    def note_probe(
        self,
        target: Target,
        result: ProbeResult | None,
        failure_reason: str | None,
        changed: bool,
    ) -> None:
        """A probe of ``target`` just ended (on-demand or scheduled): restart
        its schedule from now (rules 4, 5).

        ``result`` is the observation of a successful probe, else None and
        ``failure_reason`` says why (``ProbeError.reason``; None counts as
        ``"error"``). ``changed``: the certificate differs from the one seen
        before. A target that is not tracked is ignored (rule 1); the same
        successful result noted twice counts once.
        """
        entry = self._tracked.get(target.key)
        if entry is None:
            return
        now = self._clock()
        if result is not None:
            entry.note_success(now, result, changed)
        else:
            entry.note_failure(now)
        self._reschedule(entry, entry.due_after_probe(now, self._times))

    # ------------------------------------------------------------- the loop

    async def serve(
        self, refresh: Refresh, *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Re-probe due targets with ``refresh`` until cancelled (rules 8, 9).

        Reports itself started at once. Resource handling: the probes run in
        a nursery owned by this call; cancelling it cancels them (their
        outcome is not noted). Error handling: probe failures never end the
        loop; ``RuntimeError`` if another ``serve`` of this scheduler runs.
        """
        if self._serving:
            raise RuntimeError("this RescanScheduler is already serving")
        self._serving = True
        try:
            async with trio.open_nursery() as nursery:
                task_status.started()
                while True:
                    await self._step(nursery, refresh)
        finally:
            self._serving = False

    async def _step(self, nursery: trio.Nursery, refresh: Refresh) -> None:
        """One decision of the serve loop (rules 1, 8); always reaches a
        checkpoint."""
        now = self._clock()
        self._forget_idle(now)
        idle_s = min(MAX_IDLE_S, self._next_forget_at() - now)
        if len(self._probing) >= self._max_in_flight:
            await self._wait_for_change(idle_s)
            return
        head = self._peek()
        if head is None:
            await self._wait_for_change(idle_s)
            return
        when, entry = head
        if when > now:
            await self._wait_for_change(min(idle_s, when - now))
            return
        budget_wait_s = self._spacing.global_wait_s(now)
        if budget_wait_s > 0:
            await trio.sleep(budget_wait_s)
            return
        prefix_ready_at = self._spacing.prefix_ready_at(entry.prefix)
        if prefix_ready_at > now:
            self._deferred_by_prefix += 1
            heapq.heappop(self._heap)
            self._push(entry, prefix_ready_at)
            await trio.lowlevel.checkpoint()
            return
        if self._on_demand_busy is not None and self._on_demand_busy():
            self._held_back += 1
            await trio.sleep(HOLD_BACK_POLL_S)
            return
        heapq.heappop(self._heap)
        self._start(nursery, refresh, entry, now)
        await trio.lowlevel.checkpoint()

    def _start(
        self, nursery: trio.Nursery, refresh: Refresh, entry: _Entry, now: float
    ) -> None:
        entry.generation += 1  # no heap entry is live while it is probed
        self._probing.add(entry.key)
        self._spacing.record_start(entry.prefix, now)
        self._probes_started += 1
        self._recent_starts.append(now)
        nursery.start_soon(
            self._probe_one, refresh, entry.target, name=f"rescan {entry.target.key}"
        )

    async def _observed_elsewhere(self, target: Target) -> bool:
        """Rule 11: whether the store observed ``target`` within its healthy
        interval; if so, the success is noted as of then. A failed lookup is
        logged and counts as no."""
        try:
            age = await self._observed_age(target)  # type: ignore[misc]
        except Exception:
            logger.exception("store lookup before the rescan of %s failed", target.key)
            return False
        entry = self._tracked.get(target.key)
        if age is None or entry is None:
            return False
        due_at = entry.note_observed_elsewhere(self._clock(), age, self._times)
        if due_at is None:
            return False
        self._shared_skips += 1
        self._reschedule(entry, due_at)
        return True

    async def _probe_one(self, refresh: Refresh, target: Target) -> None:
        """Refresh ``target`` under the deadline and note the outcome (rule 9).
        A refresh that a query started and this probe joined is noted by
        both: the same result noted twice counts once."""
        refreshed: Refreshed | None = None
        reason: str | None = None
        try:
            with trio.move_on_after(self._probe_timeout_s):
                if self._observed_age is not None and await self._observed_elsewhere(target):
                    return
                refreshed = await refresh(target)
            if refreshed is None or refreshed.last_probe is None:
                reason = ProbeTimeout.reason
        except ProbeError as exc:
            reason = exc.reason
        except Exception:
            logger.exception("scheduled probe of %s failed unexpectedly", target.key)
            reason = ProbeError.reason
        finally:
            self._probing.discard(target.key)
            self._poke()
        if reason is not None:
            self._failures[reason] += 1
            if reason == ProbeThrottled.reason:
                self._defer(target)
            else:
                self.note_probe(target, None, reason, False)
            return
        assert refreshed is not None
        self.note_probe(target, refreshed.last_probe, None, refreshed.last_probe_changed)

    # -------------------------------------------------------------- helpers

    def _defer(self, target: Target) -> None:
        """Rule 9: a probe the prober throttled made no connection: due again
        soon, no failure counted."""
        entry = self._tracked.get(target.key)
        if entry is not None:
            self._reschedule(entry, due_after_throttle(self._clock()))

    def _push(self, entry: _Entry, when: float) -> None:
        entry.generation += 1
        heapq.heappush(self._heap, (when, next(self._sequence), entry.generation, entry))
        if len(self._heap) > 2 * len(self._tracked) + HEAP_SLACK:  # rule 10
            self._heap = [item for item in self._heap if self._is_live(item)]
            heapq.heapify(self._heap)

    def _reschedule(self, entry: _Entry, due_at: float) -> None:
        entry.due_at = due_at
        self._push(entry, due_at)
        self._poke()

    def _is_live(self, item: tuple[float, int, int, _Entry]) -> bool:
        _when, _sequence, generation, entry = item
        return (
            entry.generation == generation
            and self._tracked.get(entry.key) is entry
            and entry.key not in self._probing
        )

    def _peek(self) -> tuple[float, _Entry] | None:
        """The earliest live heap entry, dropping stale ones (lazy deletion)."""
        while self._heap:
            item = self._heap[0]
            if self._is_live(item):
                return item[0], item[3]
            heapq.heappop(self._heap)
        return None

    def _evict_least_popular(self) -> None:
        """Forget the least popular tracked target (rule 1)."""
        victim = self._eviction.pop_least_popular(self._tracked)
        if victim is not None:
            del self._tracked[victim.key]
        else:  # unreachable while every tracked target is queued; stay bounded anyway
            self._tracked.popitem(last=False)
        self._forgotten += 1

    def _forget_idle(self, now: float) -> None:
        """Forget the targets not asked about for ``forget_after_s`` (rule 1)."""
        while self._tracked:
            entry = next(iter(self._tracked.values()))
            if entry.last_query_at + self._forget_after_s > now:
                return
            self._tracked.popitem(last=False)
            self._forgotten += 1

    def _next_forget_at(self) -> float:
        if not self._tracked:
            return math.inf
        entry = next(iter(self._tracked.values()))
        return entry.last_query_at + self._forget_after_s

    def _poke(self) -> None:
        self._wake.set()

    async def _wait_for_change(self, timeout_s: float) -> None:
        """Sleep up to ``timeout_s``, less if a note or a finished probe
        changed what is due."""
        if timeout_s > 0:
            with trio.move_on_after(timeout_s):
                await self._wake.wait()
        else:
            await trio.lowlevel.checkpoint()
        if self._wake.is_set():
            self._wake = trio.Event()

    # ----------------------------------------------------------- inspection

    def due_at(self, target: Target) -> float | None:
        """When ``target`` is next due (the scheduler's clock), or None if it
        is not tracked."""
        entry = self._tracked.get(target.key)
        return entry.due_at if entry is not None else None

    def statistics(self) -> SchedulerStatistics:
        """A snapshot; see :class:`SchedulerStatistics`. Takes time linear in
        the number of tracked targets (meant for metrics, not per query)."""
        now = self._clock()
        due_now = 0
        overdue = 0
        for entry in self._tracked.values():
            if entry.due_at <= now and entry.key not in self._probing:
                due_now += 1
            if entry.is_overdue(now, self._times):
                overdue += 1
        while self._recent_starts and self._recent_starts[0] <= now - RATE_WINDOW_S:
            self._recent_starts.popleft()
        return SchedulerStatistics(
            targets_known=len(self._tracked),
            due_now=due_now,
            overdue=overdue,
            in_flight=len(self._probing),
            probes_started=self._probes_started,
            probes_per_s=len(self._recent_starts) / RATE_WINDOW_S,
            failures=types.MappingProxyType(dict(self._failures)),
            held_back=self._held_back,
            deferred_by_prefix=self._deferred_by_prefix,
            forgotten=self._forgotten,
            shared_skips=self._shared_skips,
        )
