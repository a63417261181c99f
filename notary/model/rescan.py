"""Rescan rules: when a tracked target is due, how it backs off after
failures, how popular it is, which one is forgotten when the table is full,
which address prefix its probes count against, and how starts are spaced.

Pure: no Trio, no clock reads; every time is a parameter, in seconds of the
scheduler's clock. The rules, by number, are in docs/rescan.md; the Trio loop
that applies them is :mod:`notary.service.scheduler`, which owns every object
made here (none is shared between schedulers).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass

from notary.model.observations import ProbeResult
from notary.model.ratelimit import destination_prefix
from notary.model.targets import Target

__all__ = [
    "CHANGE_SMOOTHING",
    "CHANGE_WEIGHT",
    "FIRST_RETRY_S",
    "GLOBAL_BURST",
    "HEAP_SLACK",
    "MIN_INTERVAL_S",
    "NEW_TARGET_DELAY_S",
    "POPULARITY_HALF_LIFE_S",
    "PREFIX_TABLE_MIN",
    "RESCHEDULE_SLACK_S",
    "STALENESS_HEADROOM",
    "THROTTLED_RETRY_S",
    "EvictionQueue",
    "RescanTimes",
    "StartSpacing",
    "TrackedTarget",
    "address_prefix",
    "decayed",
    "due_after_throttle",
    "popularity_score",
    "rescan_interval_s",
    "retry_delay_s",
]

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
#: Extra heap entries tolerated before compaction (rule 10).
HEAP_SLACK = 64
#: Prefix table size below which it is never pruned (rule 10).
PREFIX_TABLE_MIN = 1024


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


def due_after_throttle(now: float) -> float:
    """When a target whose scheduled probe the prober throttled at ``now``
    is due again (rule 9): soon, and no failure is counted."""
    return now + THROTTLED_RETRY_S


#: The politeness key of rule 8b (:func:`notary.model.ratelimit.destination_prefix`).
address_prefix = destination_prefix


@dataclass(frozen=True, slots=True)
class RescanTimes:
    """The durations one scheduler's settings give the rules (docs/rescan.md,
    notation): ``S``, ``F``, ``B`` and the shortest interval rule 3 can give
    (a lower bound that lets a query skip computing ``I``)."""

    max_staleness_s: float
    fresh_within_s: float
    base_interval_s: float
    min_interval_s: float

    @classmethod
    def from_settings(cls, *, max_staleness_s: float, base_interval_s: float) -> RescanTimes:
        """The times for ``max_staleness_s`` (``S``) and ``base_interval_s``
        (capped at ``F`` to give ``B``); the caller checks both are positive."""
        fresh_within_s = STALENESS_HEADROOM * max_staleness_s
        base = min(float(base_interval_s), fresh_within_s)
        return cls(float(max_staleness_s), fresh_within_s, base, min(MIN_INTERVAL_S, base))


class TrackedTarget:
    """What the scheduler keeps about one tracked target: its popularity and
    change ratio (rule 2), probe outcomes and due time (rules 4 to 7), and the
    prefix its probes count against (rule 8b).

    Changed only through these methods, but for ``due_at``, which the
    scheduler sets when it reschedules the target.
    """

    __slots__ = (
        "change_ratio",
        "due_at",
        "failures",
        "fingerprint",
        "key",
        "last_probe_at",
        "last_query_at",
        "last_result",
        "last_success_at",
        "popularity",
        "popularity_at",
        "prefix",
        "target",
        "tracked_since",
    )

    def __init__(self, target: Target, key: str, now: float) -> None:
        """A target first asked about at ``now`` (rule 6); ``key`` is
        ``target.key``. Its first query is counted by :meth:`note_query`."""
        self.target = target
        self.key = key
        self.prefix = address_prefix(target.host)
        self.tracked_since = now
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

    def popularity_now(self, now: float) -> float:
        """``p`` valued at ``now`` (rule 2)."""
        return decayed(self.popularity, now - self.popularity_at, POPULARITY_HALF_LIFE_S)

    def eviction_score(self) -> float:
        """The order of rule 1's eviction: lowest forgotten first."""
        return popularity_score(self.popularity, self.popularity_at)

    def interval_s(self, now: float, times: RescanTimes) -> float:
        """The healthy interval ``I(now)`` (rule 3)."""
        return rescan_interval_s(
            self.popularity_now(now), self.change_ratio, base_interval_s=times.base_interval_s
        )

    def is_overdue(self, now: float, times: RescanTimes) -> bool:
        """Whether the last successful observation (or the first query, if
        none yet) is more than ``S`` old at ``now``."""
        observed = self.last_success_at
        since = observed if observed is not None else self.tracked_since
        return now - since > times.max_staleness_s

    def note_query(self, now: float, times: RescanTimes) -> float | None:
        """Someone asked about the target at ``now``: count it (rules 1, 2)
        and return the earlier due time rule 7 gives a healthy target, or None
        if the due time stays (a query never makes it later).

        Cheap when nothing moves: ``I(now)`` is only computed when it could
        move the due time."""
        self.last_query_at = now
        self.popularity = (
            decayed(self.popularity, now - self.popularity_at, POPULARITY_HALF_LIFE_S) + 1.0
        )
        self.popularity_at = now
        last_probe_at = self.last_probe_at
        if self.failures != 0 or last_probe_at is None:
            return None
        # I(now) >= times.min_interval_s, so when even that bound leaves the
        # due time within the slack, nothing can change.
        latest = self.due_at - RESCHEDULE_SLACK_S
        if max(now, last_probe_at + times.min_interval_s) >= latest:
            return None
        sooner = max(now, last_probe_at + self.interval_s(now, times))
        return sooner if sooner < latest else None

    def note_success(self, now: float, result: ProbeResult, changed: bool) -> None:
        """A probe ended at ``now`` with ``result`` (rules 2, 4, 8b); the same
        result noted twice moves the change ratio once."""
        self.last_probe_at = now
        seen = (result.observed_at, result.leaf.sha256)
        if seen != self.last_result:
            self.last_result = seen
            self.change_ratio += CHANGE_SMOOTHING * (float(changed) - self.change_ratio)
        self.fingerprint = result.leaf.sha256
        self.failures = 0
        self.last_success_at = now
        if result.address:
            self.prefix = address_prefix(result.address)

    def note_failure(self, now: float) -> None:
        """A probe failed at ``now`` (rule 5)."""
        self.last_probe_at = now
        self.failures += 1

    def due_after_probe(self, now: float, times: RescanTimes) -> float:
        """Rules 4 and 5: when the target is due after a probe noted at ``now``."""
        if self.failures == 0:
            return now + self.interval_s(now, times)
        due = now + retry_delay_s(self.failures, max_backoff_s=times.base_interval_s)
        if self.last_success_at is not None:
            deadline = self.last_success_at + times.fresh_within_s
            if deadline > now:
                due = min(due, deadline)
        return due

    def note_observed_elsewhere(self, now: float, age_s: float, times: RescanTimes) -> float | None:
        """Rule 11: another process observed the target ``age_s`` before
        ``now``. If that is within ``I(now)``, it counts as a success then and
        the new due time is returned; else None and nothing changes."""
        if age_s < 0 or age_s >= self.interval_s(now, times):
            return None
        seen_at = now - age_s
        self.failures = 0
        self.last_probe_at = self.last_success_at = seen_at
        return max(now, seen_at + self.interval_s(now, times))


class EvictionQueue:
    """Rule 1's eviction order: tracked targets, least popular first.

    A heap of (score when pushed, tie-breaker, target) with lazy deletion (a
    target no longer tracked is skipped) and lazy re-valuation (a score only
    grows, so a target is pushed once, when it becomes tracked, and pushed
    again only when popped with a stale score). Bounded by rule 10.
    """

    __slots__ = ("_heap", "_sequence")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, TrackedTarget]] = []
        self._sequence = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, tracked: TrackedTarget, score: float, table: Mapping[str, TrackedTarget]) -> None:
        """Queue ``tracked`` (already in ``table``, the tracked targets by key)
        with its ``score``; compacts the heap beyond rule 10's bound."""
        heap = self._heap
        heapq.heappush(heap, (score, next(self._sequence), tracked))
        if len(heap) > 2 * len(table) + HEAP_SLACK:
            live = [item for item in heap if table.get(item[2].key) is item[2]]
            heapq.heapify(live)
            self._heap = live

    def pop_least_popular(self, table: Mapping[str, TrackedTarget]) -> TrackedTarget | None:
        """Remove from the queue and return the least popular target of
        ``table`` (the oldest first among equals); the caller forgets it.
        None if the queue holds no target of ``table``."""
        heap = self._heap
        while heap:
            score, _, tracked = heap[0]
            if table.get(tracked.key) is not tracked:
                heapq.heappop(heap)
                continue
            current = tracked.eviction_score()
            if current > score:  # asked about since it was pushed
                heapq.heapreplace(heap, (current, next(self._sequence), tracked))
                continue
            heapq.heappop(heap)
            return tracked
        return None


class StartSpacing:
    """Rules 8a and 8b: starts at least ``1 / probes_per_s`` apart overall
    and ``1 / per_prefix_per_s`` apart per address prefix (one token each).
    The per-prefix table is pruned by rule 10."""

    __slots__ = ("_next_start_at", "_prefix_next_start_at", "_prefix_prune_at",
                 "_prefix_spacing_s", "_start_spacing_s")

    def __init__(self, probes_per_s: float, per_prefix_per_s: float) -> None:
        self._start_spacing_s = 1.0 / probes_per_s
        self._prefix_spacing_s = 1.0 / per_prefix_per_s
        self._next_start_at = -math.inf
        self._prefix_next_start_at: dict[str, float] = {}
        self._prefix_prune_at = PREFIX_TABLE_MIN

    def __len__(self) -> int:
        """Prefixes in the table."""
        return len(self._prefix_next_start_at)

    def global_wait_s(self, now: float) -> float:
        """How long from ``now`` until the global budget allows a start
        (zero or less: it does now)."""
        return self._next_start_at - now

    def prefix_ready_at(self, prefix: str) -> float:
        """When ``prefix`` next allows a start (``-inf``: any time)."""
        return self._prefix_next_start_at.get(prefix, -math.inf)

    def record_start(self, prefix: str, now: float) -> None:
        """A probe against ``prefix`` started at ``now``: take both tokens."""
        self._next_start_at = max(self._next_start_at, now) + self._start_spacing_s
        table = self._prefix_next_start_at
        table[prefix] = max(table.get(prefix, -math.inf), now) + self._prefix_spacing_s
        if len(table) <= self._prefix_prune_at:
            return
        for waiting in [waiting for waiting, at in table.items() if at <= now]:
            del table[waiting]
        self._prefix_prune_at = max(PREFIX_TABLE_MIN, 2 * len(table))
