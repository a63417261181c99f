"""The rescan scheduler: re-probes the targets people ask about, so answers
stay fresh (Perspectives clients ignore a notary whose newest observation of
a target is older than 48 h; Convergence answers want fresh data too).

An I/O edge (Trio). The scheduler keeps, for every *known* target, when it is
next due, in a heap with lazy deletion (a rescheduled target pushes a new
entry; the old one is skipped when it reaches the top). :meth:`RescanScheduler.serve`
pops due targets and probes them within a global budget and a per-prefix
politeness limit, giving way to on-demand probes.

Notation: ``S`` = ``max_staleness_s``; ``F = STALENESS_HEADROOM * S`` (the
freshness deadline, 90 % of ``S``: the last tenth absorbs waiting for the
budget and the probe itself); ``B = min(base_interval_s, F)`` (the interval of
a target nobody asks about any more); ``now`` = the scheduler's ``clock()``.
Every time is the scheduler's clock, never ``ProbeResult.observed_at``.

Rules this module keeps:

1. **Known targets.** :meth:`~RescanScheduler.note_query` makes a target
   known; nothing else does (a :meth:`~RescanScheduler.note_probe` for an
   unknown target is ignored). A target not asked about for
   ``forget_after_s`` is forgotten (checked before every start, so the
   scheduler never probes it after that); when ``max_targets`` are known, a new target
   makes the scheduler forget the least popular one (rule 2's ``p`` valued
   now, the oldest first among equals), not the one asked about least
   recently: a flood of new targets asked once each then pushes out only
   targets asked about less than they are (each query of a target is worth
   what a new target's single query is worth ``POPULARITY_HALF_LIFE_S``
   later). Forgotten targets stay in the store's history; a later query
   makes them known again, as new.
2. **Popularity** ``p`` is a decaying counter: every query adds 1, and it
   halves every ``POPULARITY_HALF_LIFE_S``. **Change ratio** ``r`` (0 to 1)
   is a moving average over successful probes of "saw a different
   certificate than the one before" (``changed``): each one moves ``r`` by
   ``CHANGE_SMOOTHING`` of the way to 1 (changed) or 0 (same). A ratio per
   probe, not a count per hour: probing a site that serves several
   certificates more often would otherwise see more changes, and be probed
   more often still.
3. **Healthy interval**, valued at time ``t``::

       I(t) = min(B, max(MIN_INTERVAL_S, B / ((1 + log2(1 + p)) * (1 + CHANGE_WEIGHT * r))))

   so a popular target, or one whose certificate changes often (at most
   ``1 + CHANGE_WEIGHT`` times sooner), is due sooner; never more often than
   every ``MIN_INTERVAL_S`` (unless ``B`` is shorter), never less often than
   every ``B``.
4. **After a success** noted at ``t``: due at ``t + I(t)``. Since
   ``I <= B <= F``, a target that keeps answering is re-probed no later than
   ``F`` after its last successful observation.
5. **After ``k >= 1`` consecutive failures**, the last noted at ``t``: the
   retry delay is ``R(k) = min(FIRST_RETRY_S * 2**(k - 1), B)`` (exponential
   backoff, capped at ``B``) and the target is due at ``t + R(k)``, but no
   later than its freshness deadline ``last success + F`` while that deadline
   is still ahead of ``t``. Once the deadline has passed (the target has been
   failing for a while, or never answered), only the backoff applies:
   hammering a dead host keeps nothing fresh. A success resets ``k`` to 0.
6. **A new target** (known, never probed) is due ``NEW_TARGET_DELAY_S`` after
   its first query: long enough for the on-demand probe the query itself
   usually causes to be noted first (which reschedules it by rule 4 or 5).
7. **A query never makes a target due later.** It may make a healthy target
   due sooner: ``max(now, last probe + I(now))`` replaces the due time when
   that is more than ``RESCHEDULE_SLACK_S`` earlier. A failing target keeps
   its backoff.
8. **Starting probes.** A due target is started earliest-due first, when
   all of these hold:

   a. The global budget allows it: starts are spaced at least
      ``1 / probes_per_s`` apart (a token bucket holding ``GLOBAL_BURST`` = 1
      token), so any window of ``w`` seconds holds at most
      ``GLOBAL_BURST + probes_per_s * w`` starts (with ``w`` closed; at most
      ``ceil(probes_per_s * w)`` for a half-open window), over the whole run
      included.
   b. The target's address prefix allows it, by the same rule with
      ``per_prefix_per_s``. The prefix is the /24 (IPv4) or /48 (IPv6) of the
      address that last served the target, else of the target itself if it is
      an IP literal, else its host name. A target whose prefix must wait is
      deferred to that prefix's next slot; it does not hold up the others.
   c. Fewer than ``max_in_flight`` of the scheduler's probes are running, and
      none of them is for this target.
   d. ``on_demand_busy()`` (if given) returns False; while it returns True,
      nothing starts and it is asked again every ``HOLD_BACK_POLL_S``.

   Only the scheduler's own probes are limited here; on-demand probes are
   not counted against the budget (the prober has its own global limit).
9. **Outcome.** Every probe the scheduler starts ends within
   ``probe_timeout_s`` and is noted with :meth:`~RescanScheduler.note_probe`
   by the scheduler itself: a result is a success (``changed`` when its leaf
   differs from the last one the scheduler saw for the target), a
   :class:`~notary.errors.ProbeError` a failure with its ``reason``, the
   deadline a ``"timeout"`` failure, any other exception a logged ``"error"``
   failure; a :class:`~notary.errors.ProbeThrottled` (the prober's
   politeness limit per destination prefix: no connection was made) is no
   failure: the target is due again ``THROTTLED_RETRY_S`` later. None of
   them stops :meth:`~RescanScheduler.serve`.
10. **Bounded.** At most ``max_targets`` targets are known; the due heap and
    the popularity heap each hold at most ``2 * known + HEAP_SLACK`` entries
    (compacted beyond that);
    the per-prefix table holds at most ``max(PREFIX_TABLE_MIN, 2 * n)``
    prefixes, ``n`` its size after the last pruning (which drops every prefix
    that no longer has to wait); the start-time window for the rate statistic holds at
    most ``probes_per_s * RATE_WINDOW_S + 2`` times.
11. **A store other schedulers probe into** (a node's workers, each
    rescanning the targets asked of it): with ``observed_age``, a started
    probe first asks how long ago the store last observed the target. When
    that is less than the target's healthy interval ``I(now)``, another
    process has observed it in the meantime: no probe is made, the
    observation counts as a success noted ``age`` ago (rule 4: due at
    ``now - age + I``), and ``shared_skips`` counts it. The schedulers then
    fall into step, and a target asked of several workers is probed about
    once per interval, not once per worker. The lookup runs under the probe
    deadline; if it fails or finds nothing, the probe is made.

Wiring (for the server)
-----------------------
::

    scheduler = RescanScheduler(
        probe=prober.probe,               # results reach the store via the prober's hook
        probes_per_s=..., max_staleness_s=..., forget_after_s=...,
        base_interval_s=..., per_prefix_per_s=..., max_targets=...,
        on_demand_busy=lambda: prober.statistics().queued > 0,
        clock=trio.current_time,
    )
    await nursery.start(scheduler.serve)
    # on every query:            scheduler.note_query(target)  # or (target, target.key)
    # after every on-demand probe: scheduler.note_probe(target, result, None, changed)
    #                          or scheduler.note_probe(target, None, exc.reason, False)
    # where changed = the result's leaf differs from the timeline's newest one

Noting the same successful result twice (same ``observed_at`` and leaf, e.g.
from the query path and from the scheduler when the prober's single flight
served both) counts it once.
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

import trio

from notary.errors import ProbeError, ProbeThrottled, ProbeTimeout
from notary.model.observations import ProbeResult
from notary.model.ratelimit import destination_prefix
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
    "ProbeFunction",
    "RescanScheduler",
    "SchedulerStatistics",
    "address_prefix",
    "decayed",
    "popularity_score",
    "rescan_interval_s",
    "retry_delay_s",
]

logger = logging.getLogger(__name__)

#: What the scheduler calls to probe a target (``Prober.probe`` in the server).
ProbeFunction = Callable[[Target], Awaitable[ProbeResult]]

#: Half-life of the popularity counter (rule 2).
POPULARITY_HALF_LIFE_S = 6 * 3600.0
#: Weight of each successful probe in the change ratio (rule 2).
CHANGE_SMOOTHING = 0.25
#: A target whose every probe sees a new certificate is due this much sooner,
#: plus one (rule 3).
CHANGE_WEIGHT = 3.0
#: Shortest healthy interval (rule 3).
MIN_INTERVAL_S = 600.0
#: First retry delay after a failure; doubles with each further failure (rule 5).
FIRST_RETRY_S = 300.0
#: A scheduled probe the prober throttled is due again this much later (rule 9).
THROTTLED_RETRY_S = 60.0
#: A new target is due this long after its first query (rule 6).
NEW_TARGET_DELAY_S = 60.0
#: Share of ``max_staleness_s`` within which the scheduler aims to re-probe (F).
STALENESS_HEADROOM = 0.9
#: A query moves a due time earlier only by more than this (rule 7).
RESCHEDULE_SLACK_S = 60.0
#: Tokens in the global bucket (rule 8a).
GLOBAL_BURST = 1
#: How often ``on_demand_busy`` is asked again while it says busy (rule 8d).
HOLD_BACK_POLL_S = 1.0
#: Longest the serve loop sleeps without looking at its state again.
MAX_IDLE_S = 60.0
#: Window of the ``probes_per_s`` statistic.
RATE_WINDOW_S = 60.0
#: Extra heap entries tolerated before compaction (rule 10).
HEAP_SLACK = 64
#: Prefix table size below which it is never pruned (rule 10).
PREFIX_TABLE_MIN = 1024
#: Defaults of the optional constructor arguments.
DEFAULT_MAX_IN_FLIGHT = 8
DEFAULT_PROBE_TIMEOUT_S = 60.0


def decayed(value: float, elapsed_s: float, half_life_s: float) -> float:
    """``value`` after ``elapsed_s`` of exponential decay (rule 2)."""
    if elapsed_s <= 0:
        return value
    return value * 2.0 ** (-elapsed_s / half_life_s)


def popularity_score(popularity: float, valued_at: float) -> float:
    """A number that orders targets by popularity (rule 2) at any common
    time ``t`` after ``valued_at``: ``p * 2**(-(t - valued_at) / H)`` has
    the same order for every ``t`` as ``log2(p) + valued_at / H``. A query
    never lowers a target's score (``decayed(p) + 1 > decayed(p)``), which
    lets rule 1's eviction keep scores in a heap and refresh them lazily."""
    return math.log2(max(popularity, 1e-300)) + valued_at / POPULARITY_HALF_LIFE_S


def rescan_interval_s(popularity: float, change_ratio: float, *, base_interval_s: float) -> float:
    """The healthy interval ``I`` of rule 3, with ``base_interval_s`` = ``B``."""
    ratio = min(max(change_ratio, 0.0), 1.0)
    factor = (1.0 + math.log2(1.0 + max(popularity, 0.0))) * (1.0 + CHANGE_WEIGHT * ratio)
    return min(base_interval_s, max(MIN_INTERVAL_S, base_interval_s / factor))


def retry_delay_s(failures: int, *, max_backoff_s: float) -> float:
    """The retry delay ``R(k)`` of rule 5 after ``failures`` >= 1 in a row."""
    exponent = min(max(failures, 1) - 1, 62)  # 2**62 * FIRST_RETRY_S exceeds any cap
    return min(FIRST_RETRY_S * 2.0**exponent, max_backoff_s)


#: The politeness key of rule 8b (:func:`notary.model.ratelimit.destination_prefix`).
address_prefix = destination_prefix


@dataclass(frozen=True, slots=True)
class SchedulerStatistics:
    """A snapshot of a :class:`RescanScheduler`.

    ``targets_known``: targets being kept fresh; ``due_now``: known targets
    whose due time has come and whose probe has not started; ``overdue``:
    known targets whose last successful observation (or first query, if none
    yet) is more than ``max_staleness_s`` old; ``in_flight``: the scheduler's
    probes running; ``probes_started``: the scheduler's probes started since
    it was made; ``probes_per_s``: starts over the last ``RATE_WINDOW_S``,
    divided by it; ``failures``: the scheduler's failed probes by
    :attr:`ProbeError.reason <notary.errors.ProbeError.reason>`;
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


class _Entry:
    """What the scheduler knows about one target."""

    __slots__ = (
        "change_ratio",
        "due_at",
        "failures",
        "fingerprint",
        "generation",
        "key",
        "known_since",
        "last_probe_at",
        "last_query_at",
        "last_result",
        "last_success_at",
        "popularity",
        "popularity_at",
        "prefix",
        "target",
    )

    def __init__(self, target: Target, now: float, key: str) -> None:
        self.target = target
        self.key = key
        self.prefix = address_prefix(target.host)
        self.known_since = now
        self.last_query_at = now
        self.popularity = 0.0
        self.popularity_at = now
        self.change_ratio = 0.0
        self.last_probe_at: float | None = None
        self.last_success_at: float | None = None
        self.failures = 0
        self.fingerprint: bytes | None = None
        self.last_result: tuple[int, bytes] | None = None
        self.due_at = now + NEW_TARGET_DELAY_S
        self.generation = 0

    def popularity_now(self, now: float) -> float:
        return decayed(self.popularity, now - self.popularity_at, POPULARITY_HALF_LIFE_S)


class RescanScheduler:
    """Keeps the answers for known targets fresh; see the module docstring
    for the rules.

    Arguments (all keyword-only; durations in seconds, rates per second):

    * ``probe``: probes a target (``Prober.probe``); returns a
      :class:`~notary.model.observations.ProbeResult` or raises a
      :class:`~notary.errors.ProbeError`.
    * ``probes_per_s``: the global budget of scheduled probes (rule 8a).
    * ``max_staleness_s``: ``S``; a target still asked about is re-probed
      within ``STALENESS_HEADROOM * S`` of its last success (rules 4, 5).
    * ``forget_after_s``: idle time after which a target is forgotten (rule 1).
    * ``base_interval_s``: interval of a target nobody asks about any more,
      capped at ``STALENESS_HEADROOM * S`` (``B``, rule 3); also the backoff cap.
    * ``per_prefix_per_s``: politeness budget per address prefix (rule 8b).
    * ``max_targets``: most targets known at once (rule 1).
    * ``on_demand_busy``: when it returns True, scheduled probes wait (rule 8d).
    * ``clock``: the time source (seconds, monotonic, any origin).
    * ``max_in_flight``: most scheduled probes running at once (rule 8c).
    * ``probe_timeout_s``: deadline of one scheduled probe (rule 9); the
      prober has its own, usually shorter, deadline.
    * ``observed_age``: seconds since the store's newest observation of a
      target, None if it has none (rule 11; None: no such store).

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
        *,
        probe: ProbeFunction,
        probes_per_s: float,
        max_staleness_s: float,
        forget_after_s: float,
        base_interval_s: float,
        per_prefix_per_s: float,
        max_targets: int,
        on_demand_busy: Callable[[], bool] | None = None,
        clock: Callable[[], float] = trio.current_time,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        probe_timeout_s: float = DEFAULT_PROBE_TIMEOUT_S,
        observed_age: Callable[[Target], Awaitable[float | None]] | None = None,
    ) -> None:
        for name, value in (
            ("probes_per_s", probes_per_s),
            ("max_staleness_s", max_staleness_s),
            ("forget_after_s", forget_after_s),
            ("base_interval_s", base_interval_s),
            ("per_prefix_per_s", per_prefix_per_s),
            ("probe_timeout_s", probe_timeout_s),
        ):
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number, not {value!r}")
        for name, count in (("max_targets", max_targets), ("max_in_flight", max_in_flight)):
            if not isinstance(count, int) or isinstance(count, bool) or count < 1:
                raise ValueError(f"{name} must be a positive integer, not {count!r}")
        self._probe = probe
        self._start_spacing_s = 1.0 / probes_per_s
        self._prefix_spacing_s = 1.0 / per_prefix_per_s
        self._max_staleness_s = float(max_staleness_s)
        self._fresh_within_s = STALENESS_HEADROOM * max_staleness_s
        self._forget_after_s = float(forget_after_s)
        self._base_interval_s = min(float(base_interval_s), self._fresh_within_s)
        # The shortest interval rule 3 can give: a lower bound that lets
        # note_query skip computing the interval when it cannot matter.
        self._min_interval_s = min(MIN_INTERVAL_S, self._base_interval_s)
        self._max_targets = max_targets
        self._on_demand_busy = on_demand_busy
        self._clock = clock
        self._max_in_flight = max_in_flight
        self._probe_timeout_s = float(probe_timeout_s)
        self._observed_age = observed_age
        self._shared_skips = 0

        # Known targets by ``Target.key``, least recently asked about first
        # (rule 1's idle forgetting). Keyed by the key string: hashing it is
        # cheaper than hashing the dataclass, and the query path has it already.
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        # (popularity score when pushed, tie-breaker, entry): rule 1's
        # eviction. A score only grows, so an entry is pushed once, when it
        # becomes known, and re-pushed only when popped with a stale score;
        # entries no longer known are skipped (lazy deletion).
        self._by_popularity: list[tuple[float, int, _Entry]] = []
        # (when, tie-breaker, generation, entry); stale if the generation moved.
        self._heap: list[tuple[float, int, int, _Entry]] = []
        self._sequence = itertools.count()
        self._probing: set[str] = set()  # keys of the targets being probed
        self._next_start_at = -math.inf  # rule 8a, one token
        self._prefix_next_start_at: dict[str, float] = {}
        self._prefix_prune_at = PREFIX_TABLE_MIN
        self._wake = trio.Event()
        self._serving = False

        self._recent_starts: deque[float] = deque(
            maxlen=math.ceil(probes_per_s * RATE_WINDOW_S) + GLOBAL_BURST + 1
        )
        self._probes_started = 0
        self._failures: Counter[str] = Counter()
        self._held_back = 0
        self._deferred_by_prefix = 0
        self._forgotten = 0

    # ----------------------------------------------------------------- notes

    def note_query(self, target: Target, key: str | None = None) -> None:
        """Someone asked about ``target`` now: count it (rule 2), make it
        known if it is new (rules 1, 6), maybe make it due sooner (rule 7).

        ``key`` is ``target.key`` when the caller has it already. Called on
        every query: the common case (a known target already due as soon as
        rule 7 allows) is a dictionary lookup and a few float operations; the
        interval of rule 3 is only computed when it could move the due time.
        """
        if key is None:
            key = target.key
        now = self._clock()
        entries = self._entries
        entry = entries.get(key)
        if entry is None:
            while len(entries) >= self._max_targets:
                self._evict_least_popular()
            entry = _Entry(target, now, key)
            entries[key] = entry
            self._push_popularity(entry, popularity_score(1.0, now))
            self._push(entry, entry.due_at)
            self._poke()
        else:
            entries.move_to_end(key)
        entry.last_query_at = now
        entry.popularity = decayed(
            entry.popularity, now - entry.popularity_at, POPULARITY_HALF_LIFE_S
        ) + 1.0
        entry.popularity_at = now
        last_probe_at = entry.last_probe_at
        if entry.failures == 0 and last_probe_at is not None:
            # Rule 7. I(now) >= self._min_interval_s, so when even that bound
            # leaves the due time within the slack, nothing can change.
            latest = entry.due_at - RESCHEDULE_SLACK_S
            if max(now, last_probe_at + self._min_interval_s) >= latest:
                return
            if key in self._probing:
                return
            sooner = max(now, last_probe_at + self._interval(entry, now))
            if sooner < latest:
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
        before. A target the scheduler does not know is ignored (rule 1); the
        same successful result noted twice counts once.
        """
        entry = self._entries.get(target.key)
        if entry is None:
            return
        now = self._clock()
        entry.last_probe_at = now
        if result is not None:
            key = (result.observed_at, result.leaf.sha256)
            if key != entry.last_result:
                entry.last_result = key
                entry.change_ratio += CHANGE_SMOOTHING * (float(changed) - entry.change_ratio)
            entry.fingerprint = result.leaf.sha256
            entry.failures = 0
            entry.last_success_at = now
            if result.address:
                entry.prefix = address_prefix(result.address)
        else:
            entry.failures += 1
        self._reschedule(entry, self._next_due(entry, now))

    # ------------------------------------------------------------- the loop

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Probe due targets until cancelled (rules 8, 9).

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
                    await self._step(nursery)
        finally:
            self._serving = False

    async def _step(self, nursery: trio.Nursery) -> None:
        """One decision of the serve loop; always reaches a checkpoint."""
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
        budget_wait_s = self._next_start_at - now
        if budget_wait_s > 0:
            await trio.sleep(budget_wait_s)
            return
        prefix_ready_at = self._prefix_next_start_at.get(entry.prefix, -math.inf)
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
        self._start(nursery, entry, now)
        await trio.lowlevel.checkpoint()

    def _start(self, nursery: trio.Nursery, entry: _Entry, now: float) -> None:
        entry.generation += 1  # no heap entry is live while it is probed
        self._probing.add(entry.key)
        self._next_start_at = max(self._next_start_at, now) + self._start_spacing_s
        prefix_at = self._prefix_next_start_at.get(entry.prefix, -math.inf)
        self._prefix_next_start_at[entry.prefix] = max(prefix_at, now) + self._prefix_spacing_s
        self._prune_prefixes(now)
        self._probes_started += 1
        self._recent_starts.append(now)
        nursery.start_soon(self._probe_one, entry.target, name=f"rescan {entry.target.key}")

    async def _observed_elsewhere(self, target: Target) -> bool:
        """Rule 11: whether the store observed ``target`` within its healthy
        interval; if so, the success is noted as of then."""
        try:
            age = await self._observed_age(target)  # type: ignore[misc]
        except Exception:
            logger.exception("store lookup before the rescan of %s failed", target.key)
            return False
        entry = self._entries.get(target.key)
        if age is None or entry is None or age < 0:
            return False
        now = self._clock()
        if age >= self._interval(entry, now):
            return False
        seen_at = now - age
        entry.failures = 0
        entry.last_probe_at = entry.last_success_at = seen_at
        self._shared_skips += 1
        self._reschedule(entry, max(now, seen_at + self._interval(entry, now)))
        return True

    async def _probe_one(self, target: Target) -> None:
        result: ProbeResult | None = None
        reason: str | None = None
        try:
            with trio.move_on_after(self._probe_timeout_s):
                if self._observed_age is not None and await self._observed_elsewhere(target):
                    return
                result = await self._probe(target)
            if result is None:
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
        assert result is not None
        entry = self._entries.get(target.key)
        changed = (
            entry is not None
            and entry.fingerprint is not None
            and entry.fingerprint != result.leaf.sha256
        )
        self.note_probe(target, result, None, changed)

    # -------------------------------------------------------------- helpers

    def _defer(self, target: Target) -> None:
        """Rule 9: a probe the prober throttled (its destination prefix's
        budget) made no connection: due again ``THROTTLED_RETRY_S`` later,
        no failure counted."""
        entry = self._entries.get(target.key)
        if entry is not None:
            self._reschedule(entry, self._clock() + THROTTLED_RETRY_S)

    def _interval(self, entry: _Entry, now: float) -> float:
        return rescan_interval_s(
            entry.popularity_now(now),
            entry.change_ratio,
            base_interval_s=self._base_interval_s,
        )

    def _next_due(self, entry: _Entry, now: float) -> float:
        """Rules 4 and 5, for a probe noted at ``now``."""
        if entry.failures == 0:
            return now + self._interval(entry, now)
        due = now + retry_delay_s(entry.failures, max_backoff_s=self._base_interval_s)
        if entry.last_success_at is not None:
            deadline = entry.last_success_at + self._fresh_within_s
            if deadline > now:
                due = min(due, deadline)
        return due

    def _push(self, entry: _Entry, when: float) -> None:
        entry.generation += 1
        heapq.heappush(self._heap, (when, next(self._sequence), entry.generation, entry))
        if len(self._heap) > 2 * len(self._entries) + HEAP_SLACK:
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
            and self._entries.get(entry.key) is entry
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

    def _push_popularity(self, entry: _Entry, score: float) -> None:
        heap = self._by_popularity
        heapq.heappush(heap, (score, next(self._sequence), entry))
        if len(heap) > 2 * len(self._entries) + HEAP_SLACK:
            live = [item for item in heap if self._entries.get(item[2].key) is item[2]]
            heapq.heapify(live)
            self._by_popularity = live

    def _evict_least_popular(self) -> None:
        """Forget the least popular known target (rule 1)."""
        heap = self._by_popularity
        entries = self._entries
        while heap:
            score, _, entry = heap[0]
            if entries.get(entry.key) is not entry:
                heapq.heappop(heap)
                continue
            current = popularity_score(entry.popularity, entry.popularity_at)
            if current > score:  # asked about since it was pushed
                heapq.heapreplace(heap, (current, next(self._sequence), entry))
                continue
            heapq.heappop(heap)
            del entries[entry.key]
            self._forgotten += 1
            return
        # Unreachable while every known entry is in the heap; stay bounded anyway.
        entries.popitem(last=False)
        self._forgotten += 1

    def _forget_idle(self, now: float) -> None:
        while self._entries:
            entry = next(iter(self._entries.values()))
            if entry.last_query_at + self._forget_after_s > now:
                return
            self._entries.popitem(last=False)
            self._forgotten += 1

    def _next_forget_at(self) -> float:
        if not self._entries:
            return math.inf
        entry = next(iter(self._entries.values()))
        return entry.last_query_at + self._forget_after_s

    def _prune_prefixes(self, now: float) -> None:
        table = self._prefix_next_start_at
        if len(table) <= self._prefix_prune_at:
            return
        for prefix in [prefix for prefix, at in table.items() if at <= now]:
            del table[prefix]
        self._prefix_prune_at = max(PREFIX_TABLE_MIN, 2 * len(table))

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
        is not known."""
        entry = self._entries.get(target.key)
        return entry.due_at if entry is not None else None

    def statistics(self) -> SchedulerStatistics:
        """A snapshot; see :class:`SchedulerStatistics`. Takes time linear in
        the number of known targets (meant for metrics, not per query)."""
        now = self._clock()
        due_now = 0
        overdue = 0
        for entry in self._entries.values():
            if entry.due_at <= now and entry.key not in self._probing:
                due_now += 1
            observed = entry.last_success_at
            since = observed if observed is not None else entry.known_since
            if now - since > self._max_staleness_s:
                overdue += 1
        while self._recent_starts and self._recent_starts[0] <= now - RATE_WINDOW_S:
            self._recent_starts.popleft()
        return SchedulerStatistics(
            targets_known=len(self._entries),
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
