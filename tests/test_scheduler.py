"""Tests of notary.service.scheduler with an autojump clock and a fake probe (no sockets).
The pure rules it applies are tested in tests/model/test_rescan.py.

The fake probe records when each probe started and answers with
:func:`tests.support.observations.probe_result` objects, or raises the
``ProbeError`` its test asks for.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
import random
import statistics as stats
import time
import weakref
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from types import SimpleNamespace

import pytest
import trio
import trio.testing

from notary.config import RescanConfig
from notary.errors import ProbeConnectFailed, ProbeError, ProbeThrottled, ProbeTimeout
from notary.model import rescan
from notary.model.observations import ProbeResult
from notary.model.targets import Target
from notary.service import scheduler as scheduler_module
from notary.service.scheduler import (
    FIRST_RETRY_S,
    HOLD_BACK_POLL_S,
    NEW_TARGET_DELAY_S,
    POPULARITY_HALF_LIFE_S,
    STALENESS_HEADROOM,
    THROTTLED_RETRY_S,
    RescanScheduler,
    address_prefix,
    decayed,
    rescan_interval_s,
)
from tests.support.observations import probe_result

HOUR = 3600.0
DAY = 86400.0
#: Every target serves this certificate unless a test says otherwise (one
#: trustme certificate for all keeps the tests fast).
CERT = "www.example.test"
#: Float tolerance on start times computed by adding spacings.
EPS = 1e-6


def target(name: str) -> Target:
    return Target(f"{name}.example.test", 443)


class FakeProbe:
    """Records ``(start time, target)`` of every call; each probe takes
    ``duration_s``; raises ``failing[target]()`` if set, hangs if the target
    is in ``hanging``, else returns a ProbeResult for ``certs.get(target,
    CERT)`` from ``address_of(target)``."""

    def __init__(
        self,
        *,
        duration_s: float = 1.0,
        address_of: Callable[[Target], str] = lambda _target: "192.0.2.1",
    ) -> None:
        self.duration_s = duration_s
        self.address_of = address_of
        self.calls: list[tuple[float, Target]] = []
        self.successes: dict[Target, list[float]] = defaultdict(list)
        self.failing: dict[Target, Callable[[], BaseException]] = {}
        self.hanging: set[Target] = set()
        self.certs: dict[Target, str | Callable[[], str]] = {}

    async def __call__(self, probed: Target) -> ProbeResult:
        self.calls.append((trio.current_time(), probed))
        if probed in self.hanging:
            await trio.sleep_forever()
        await trio.sleep(self.duration_s)
        failure = self.failing.get(probed)
        if failure is not None:
            raise failure()
        cert = self.certs.get(probed, CERT)
        if callable(cert):
            cert = cert()
        self.successes[probed].append(trio.current_time())
        return probe_result(
            probed.host,
            probed.port,
            cert=cert,
            address=self.address_of(probed),
            at=int(trio.current_time()),
        )

    def starts(self, of: Target | None = None) -> list[float]:
        return [at for at, probed in self.calls if of is None or probed == of]


#: The fake refresh each scheduler made by ``make_scheduler`` serves with.
REFRESHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


#: The settings ``make_scheduler`` puts in the ``[rescan]`` section.
RESCAN_KEYS = frozenset(field.name for field in dataclasses.fields(RescanConfig))


def make_scheduler(probe: FakeProbe, **overrides) -> RescanScheduler:
    settings = {
        "probes_per_s": 10.0,
        "max_staleness_s": 40 * HOUR,
        "forget_after_s": 3 * DAY,
        "base_interval_s": 24 * HOUR,
        "per_prefix_per_s": 100.0,
        "max_targets": 10_000,
    }
    settings.update(overrides)
    rescan = {name: settings.pop(name) for name in list(settings) if name in RESCAN_KEYS}
    scheduler = RescanScheduler(RescanConfig(**rescan), **settings)

    seen: dict[Target, bytes] = {}

    async def refresh(target: Target) -> SimpleNamespace:  # as Records.refresh returns
        result = await probe(target)
        previous = seen.get(target)
        seen[target] = result.leaf.sha256
        changed = previous is not None and previous != result.leaf.sha256
        return SimpleNamespace(last_probe=result, last_probe_changed=changed)

    REFRESHES[scheduler] = refresh
    return scheduler


@asynccontextmanager
async def serving(scheduler: RescanScheduler) -> AsyncIterator[trio.Nursery]:
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.serve, REFRESHES[scheduler])
        yield nursery
        nursery.cancel_scope.cancel()


async def ask_every(
    scheduler: RescanScheduler, asked: Target, every_s: float, until: float
) -> None:
    while trio.current_time() < until:
        scheduler.note_query(asked)
        await trio.sleep(every_s)


def gaps(times: list[float]) -> list[float]:
    return [later - earlier for earlier, later in itertools.pairwise(times)]


def most_in_window(times: list[float], window_s: float) -> int:
    """Most start times in any half-open window ``[t, t + window_s)``."""
    ordered = sorted(times)
    return max(
        (bisect.bisect_left(ordered, at + window_s) - index for index, at in enumerate(ordered)),
        default=0,
    )


def assert_budget(times: list[float], probes_per_s: float, *, until: float) -> None:
    """Rule 8a with one token: starts are at least 1/rate apart, so no
    1-second window holds more than ``ceil(rate)`` starts and the whole run
    no more than ``rate * elapsed + 1``."""
    ordered = sorted(times)
    assert all(gap >= 1 / probes_per_s - EPS for gap in gaps(ordered)), min(gaps(ordered))
    assert most_in_window(ordered, 1.0 - EPS) <= math.ceil(probes_per_s)
    if ordered:
        assert len(ordered) <= probes_per_s * (until - ordered[0]) + 1


# ------------------------------------------------------------ set-up


def test_the_rules_stay_importable_from_the_scheduler() -> None:
    """The pure rules live in notary.model.rescan (tests/model/test_rescan.py);
    the scheduler module keeps their names."""
    for name in scheduler_module.__all__:
        assert hasattr(scheduler_module, name), name
    for name in ("address_prefix", "decayed", "popularity_score", "rescan_interval_s",
                 "retry_delay_s", "THROTTLED_RETRY_S", "MIN_INTERVAL_S", "CHANGE_WEIGHT"):
        assert getattr(scheduler_module, name) is getattr(rescan, name)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("probes_per_s", 0),
        ("max_staleness_s", -1),
        ("base_interval_s", math.inf),
        ("per_prefix_per_s", math.nan),
        ("max_targets", 0),
        ("max_in_flight", 1.5),
    ],
)
def test_constructor_refuses_bad_settings(name: str, value: float) -> None:
    with pytest.raises(ValueError, match=name):
        make_scheduler(FakeProbe(), **{name: value})


# ------------------------------------------------------------ behaviour


async def test_popular_target_is_reprobed_sooner_and_more_often(
    autojump_clock: trio.testing.MockClock,
) -> None:
    probe = FakeProbe()
    scheduler = make_scheduler(probe)
    popular, unpopular = target("popular"), target("unpopular")
    start = trio.current_time()
    async with serving(scheduler) as nursery:
        nursery.start_soon(ask_every, scheduler, popular, 180.0, start + 2 * DAY)
        scheduler.note_query(unpopular)
        await trio.sleep(2 * DAY)

    popular_starts = probe.starts(popular)
    unpopular_starts = probe.starts(unpopular)
    assert popular_starts[0] == pytest.approx(start + NEW_TARGET_DELAY_S, abs=1.0)
    # re-probed well before the staleness limit, every time
    assert max(gaps(popular_starts)) < 6 * HOUR < 40 * HOUR
    assert len(popular_starts) > 3 * len(unpopular_starts)
    assert len(unpopular_starts) >= 2  # still kept fresh, just less often
    assert max(gaps(unpopular_starts)) <= 24 * HOUR + 2


async def test_global_budget_holds_with_many_targets_due_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    probe = FakeProbe(duration_s=0.5, address_of=lambda t: f"10.{t.host[1:3]}.0.1")
    scheduler = make_scheduler(probe, probes_per_s=5.0, max_in_flight=8)
    targets = [target(f"t{index:02}") for index in range(100)]
    start = trio.current_time()
    async with serving(scheduler):
        for each in targets:
            scheduler.note_query(each)
        await trio.sleep(NEW_TARGET_DELAY_S - 1)
        assert scheduler.statistics().due_now == 0
        await trio.sleep(1)
        due = scheduler.statistics()
        assert due.due_now + due.probes_started == 100
        await trio.sleep(40)
        statistics = scheduler.statistics()
    end = trio.current_time()

    times = probe.starts()
    assert len(times) == 100  # all due, all probed, once
    assert {probed for _at, probed in probe.calls} == set(targets)
    assert_budget(times, 5.0, until=end)
    # the budget is used, not merely respected: one start every 0.2 s
    assert times[-1] - times[0] == pytest.approx(99 * 0.2, abs=0.01)
    assert times[0] == pytest.approx(start + NEW_TARGET_DELAY_S)
    assert statistics.probes_started == 100
    assert statistics.due_now == 0
    assert statistics.probes_per_s == pytest.approx(100 / 60)


async def test_per_prefix_limit_holds_and_does_not_block_other_prefixes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    shared = [target(f"a{index}") for index in range(10)]
    other = [target(f"b{index}") for index in range(10)]
    addresses = {t: f"192.0.2.{index + 1}" for index, t in enumerate(shared)}
    addresses |= {t: f"2001:db8:7:{index}::1" for index, t in enumerate(other)}
    probe = FakeProbe(address_of=addresses.__getitem__)
    scheduler = make_scheduler(probe, probes_per_s=5.0, per_prefix_per_s=0.1)
    async with serving(scheduler):
        for each in shared + other:
            scheduler.note_query(each)
            # an on-demand probe told the scheduler which address served it
            result = probe_result(each.host, cert=CERT, address=addresses[each])
            scheduler.note_probe(each, result, None, False)
        await trio.sleep(2 * DAY)
        statistics = scheduler.statistics()

    for group in (shared, other):  # one /24, one /48
        times = sorted(at for at, probed in probe.calls if probed in group)
        assert len(times) >= 20
        assert min(gaps(times)) >= 10.0 - EPS
    first_round_a = sorted(probe.starts(t)[0] for t in shared)
    first_round_b = sorted(probe.starts(t)[0] for t in other)
    # the prefixes take turns instead of one waiting for the other
    assert abs(first_round_a[0] - first_round_b[0]) < 1.0
    assert first_round_b[-1] - first_round_b[0] == pytest.approx(90.0, abs=1.0)
    assert first_round_a[-1] - first_round_a[0] == pytest.approx(90.0, abs=1.0)
    assert statistics.deferred_by_prefix > 0
    assert_budget(probe.starts(), 5.0, until=trio.current_time())


async def test_failures_back_off_exponentially_capped_and_success_resets(
    autojump_clock: trio.testing.MockClock,
) -> None:
    probe = FakeProbe(duration_s=1.0)
    base = 4 * HOUR
    scheduler = make_scheduler(probe, base_interval_s=base)
    flaky = target("flaky")
    probe.failing[flaky] = lambda: ProbeConnectFailed("connection refused")
    async with serving(scheduler):
        scheduler.note_query(flaky)
        await trio.sleep(16 * HOUR)
        failing_starts = probe.starts(flaky)
        failures = scheduler.statistics().failures
        del probe.failing[flaky]
        await trio.sleep(base + 60)  # the next attempt succeeds
        recovered_at = probe.successes[flaky][0]
        probe.failing[flaky] = lambda: ProbeConnectFailed("connection refused")
        await trio.sleep(base + 2 * FIRST_RETRY_S)
        after_reset = probe.starts(flaky)

    # each gap = retry delay + 1 s of probe
    delays = [gap - 1.0 for gap in gaps(failing_starts)]
    assert delays[:6] == pytest.approx([300, 600, 1200, 2400, 4800, 9600], abs=EPS)
    assert delays[6:] == pytest.approx([base] * len(delays[6:]), abs=EPS)
    assert len(delays) >= 8
    assert failures == {"connect": len(failing_starts)}
    # success resets the backoff: the first failure after it is retried after
    # FIRST_RETRY_S again, not after 4 h
    later = [at for at in after_reset if at > recovered_at]
    assert len(later) >= 2
    assert later[1] - later[0] == pytest.approx(FIRST_RETRY_S + 1.0, abs=EPS)


async def test_a_throttled_probe_is_retried_soon_and_is_no_failure(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The prober's politeness limit per destination prefix applies to
    scheduled probes too (ProbeThrottled, no connection made): the target is
    due again THROTTLED_RETRY_S later, without a failure's back-off."""
    probe = FakeProbe(duration_s=1.0)
    scheduler = make_scheduler(probe)
    busy = target("busy")
    probe.failing[busy] = lambda: ProbeThrottled("throttled")
    async with serving(scheduler):
        scheduler.note_query(busy)
        await trio.sleep(NEW_TARGET_DELAY_S + 3 * THROTTLED_RETRY_S + 10)
        starts = probe.starts(busy)
        statistics = scheduler.statistics()

    assert [gap - 1.0 for gap in gaps(starts)] == pytest.approx(
        [THROTTLED_RETRY_S] * (len(starts) - 1), abs=EPS
    )
    assert len(starts) == 4
    assert statistics.failures == {"throttled": 4}


async def test_failing_target_is_still_tried_by_its_freshness_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    probe = FakeProbe(duration_s=1.0)
    max_staleness_s = 40 * HOUR
    scheduler = make_scheduler(probe, max_staleness_s=max_staleness_s)
    dying = target("dying")
    async with serving(scheduler):
        scheduler.note_query(dying)
        await trio.sleep(NEW_TARGET_DELAY_S + 2)
        assert len(probe.successes[dying]) == 1
        probe.failing[dying] = lambda: ProbeTimeout("target did not answer in time")
        await trio.sleep(3 * DAY - HOUR)
        statistics = scheduler.statistics()

    last_success = probe.successes[dying][0]
    deadline = last_success + STALENESS_HEADROOM * max_staleness_s
    starts = probe.starts(dying)
    assert any(at == pytest.approx(deadline, abs=EPS) for at in starts)
    # before the deadline: retries back off, but none was pushed beyond it
    before = [at for at in starts if at <= deadline + EPS]
    assert max(gaps(before)) < 24 * HOUR
    # after it: plain backoff, capped at B = 24 h
    after = [at for at in starts if at >= deadline - EPS]
    assert len(after) >= 2
    assert max(gaps(after)) == pytest.approx(24 * HOUR + 1, abs=EPS)
    assert statistics.failures == {"timeout": len(starts) - 1}
    assert statistics.overdue == 1


async def test_target_not_asked_about_is_forgotten(autojump_clock: trio.testing.MockClock) -> None:
    probe = FakeProbe()
    scheduler = make_scheduler(probe, base_interval_s=HOUR, forget_after_s=3 * HOUR)
    idle, busy = target("idle"), target("busy")
    start = trio.current_time()
    async with serving(scheduler) as nursery:
        scheduler.note_query(idle)
        nursery.start_soon(ask_every, scheduler, busy, 600.0, start + DAY)
        await trio.sleep(DAY)
        statistics = scheduler.statistics()

    idle_starts = probe.starts(idle)
    assert len(idle_starts) >= 3  # probed while remembered
    assert max(idle_starts) < start + 3 * HOUR
    assert probe.starts(busy)[-1] > start + DAY - HOUR  # the other one goes on
    assert scheduler.due_at(idle) is None
    assert statistics.targets_known == 1
    assert statistics.forgotten == 1


async def test_least_popular_target_is_forgotten_when_full(
    autojump_clock: trio.testing.MockClock,
) -> None:
    probe = FakeProbe()
    scheduler = make_scheduler(probe, max_targets=3)
    first, second, third, fourth = (target(name) for name in ("one", "two", "three", "four"))
    async with serving(scheduler):
        for each in (first, second, third):
            scheduler.note_query(each)
            await trio.sleep(1)
        scheduler.note_query(first)  # now "two" is the least popular, and the oldest
        scheduler.note_query(fourth)
        await trio.sleep(HOUR)
        statistics = scheduler.statistics()

    assert {probed for _at, probed in probe.calls} == {first, third, fourth}
    assert statistics.targets_known == 3
    assert statistics.forgotten == 1


async def test_a_flood_of_new_targets_does_not_push_out_a_popular_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Rule 1 evicts by popularity, not recency: junk targets asked once
    each, newer than every query of a popular target, evict each other and
    targets asked about as little as they are, never the popular one."""
    probe = FakeProbe()
    scheduler = make_scheduler(probe, max_targets=4)
    popular, once = target("popular"), target("once")
    async with serving(scheduler):
        for _ in range(8):
            scheduler.note_query(popular)
        scheduler.note_query(once)
        await trio.sleep(HOUR)
        for index in range(50):
            scheduler.note_query(target(f"junk{index}"))
        statistics = scheduler.statistics()

    assert scheduler.due_at(popular) is not None
    assert scheduler.due_at(once) is None  # asked once, before the junk: evicted
    assert scheduler.due_at(target("junk49")) is not None
    assert statistics.targets_known == 4
    assert statistics.forgotten == 48  # 52 tracked, at most 4 kept


async def test_popularity_eviction_refreshes_a_target_asked_since_it_was_tracked(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An entry whose score in the eviction heap is stale (asked about since
    it became tracked) is re-valued, not evicted on its old score."""
    probe = FakeProbe()
    scheduler = make_scheduler(probe, max_targets=2)
    old, other = target("old"), target("other")
    async with serving(scheduler):
        scheduler.note_query(old)
        await trio.sleep(1)
        scheduler.note_query(other)
        await trio.sleep(1)
        for _ in range(4):
            scheduler.note_query(old)  # pushed as a new target with score 0
        scheduler.note_query(target("new"))

    assert scheduler.due_at(old) is not None
    assert scheduler.due_at(other) is None


async def test_on_demand_busy_holds_the_scheduler_back_until_it_clears(
    autojump_clock: trio.testing.MockClock,
) -> None:
    busy = [True]
    probe = FakeProbe()
    scheduler = make_scheduler(probe, on_demand_busy=lambda: busy[0])
    targets = [target(f"h{index}") for index in range(5)]
    async with serving(scheduler):
        for each in targets:
            scheduler.note_query(each)
        await trio.sleep(NEW_TARGET_DELAY_S + 300)
        held = scheduler.statistics()
        assert probe.calls == []
        released_at = trio.current_time()
        busy[0] = False
        await trio.sleep(10)
        resumed = scheduler.statistics()

    assert held.held_back >= 300 / HOLD_BACK_POLL_S - 1
    assert held.due_now == 5
    assert resumed.held_back == held.held_back
    assert len(probe.calls) == 5
    assert probe.starts()[0] - released_at <= HOLD_BACK_POLL_S
    assert resumed.due_now == 0


async def test_on_demand_probe_restarts_the_schedule(
    autojump_clock: trio.testing.MockClock,
) -> None:
    probe = FakeProbe()
    scheduler = make_scheduler(probe)
    asked = target("asked")
    async with serving(scheduler):
        scheduler.note_query(asked)
        await trio.sleep(30)
        now = trio.current_time()
        scheduler.note_probe(asked, probe_result(asked.host, cert=CERT), None, False)
        due = scheduler.due_at(asked)
        # the same result noted twice (query path and prober hook) counts once
        scheduler.note_probe(asked, probe_result(asked.host, cert=CERT), None, True)
        await trio.sleep(HOUR)

    assert probe.calls == []  # the +60 s first scan was not needed any more
    popularity = decayed(1.0, 30.0, POPULARITY_HALF_LIFE_S)
    assert due == pytest.approx(now + rescan_interval_s(popularity, 0.0, base_interval_s=24 * HOUR))
    assert scheduler.due_at(asked) == pytest.approx(due)


async def test_queries_make_a_newly_popular_target_due_sooner(
    autojump_clock: trio.testing.MockClock,
) -> None:
    probe = FakeProbe()
    scheduler = make_scheduler(probe)
    rising = target("rising")
    start = trio.current_time()
    async with serving(scheduler) as nursery:
        scheduler.note_query(rising)
        await trio.sleep(HOUR)
        planned = scheduler.due_at(rising)
        assert planned is not None and planned > start + 11 * HOUR
        nursery.start_soon(ask_every, scheduler, rising, 30.0, start + 3 * HOUR)
        await trio.sleep(2 * HOUR)

    starts = probe.starts(rising)
    assert len(starts) == 2
    # re-probed once popular, hours before the time planned when it was not
    assert start + HOUR < starts[1] < planned - 4 * HOUR


async def test_often_changing_certificate_is_probed_more_often(
    autojump_clock: trio.testing.MockClock,
) -> None:
    probe = FakeProbe()
    scheduler = make_scheduler(probe)
    steady, rotating = target("steady"), target("rotating")
    names = iter(["a.example.test", "b.example.test"] * 1000)
    probe.certs[rotating] = lambda: next(names)
    start = trio.current_time()
    async with serving(scheduler) as nursery:
        nursery.start_soon(ask_every, scheduler, steady, 900.0, start + 3 * DAY)
        nursery.start_soon(ask_every, scheduler, rotating, 900.0, start + 3 * DAY)
        await trio.sleep(3 * DAY)

    assert len(probe.starts(rotating)) > 1.5 * len(probe.starts(steady))


async def test_unexpected_probe_exception_is_a_logged_failure(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    probe = FakeProbe()
    scheduler = make_scheduler(probe, probe_timeout_s=30.0)
    broken, hung, fine = target("broken"), target("hung"), target("fine")
    probe.failing[broken] = lambda: RuntimeError("bug in the probe")
    probe.hanging.add(hung)
    async with serving(scheduler):
        for each in (broken, hung, fine):
            scheduler.note_query(each)
        await trio.sleep(HOUR)
        statistics = scheduler.statistics()

    assert len(probe.starts(broken)) >= 3  # retried with backoff, loop alive
    assert len(probe.starts(hung)) >= 3  # each attempt ended by probe_timeout_s
    assert len(probe.successes[fine]) == 1
    assert statistics.failures["error"] == len(probe.starts(broken))
    assert statistics.failures["timeout"] == len(probe.starts(hung))
    assert statistics.in_flight == 0
    assert "failed unexpectedly" in caplog.text
    assert ProbeError.reason == "error"


async def test_in_flight_probes_are_bounded(autojump_clock: trio.testing.MockClock) -> None:
    probe = FakeProbe(duration_s=20.0)
    scheduler = make_scheduler(probe, probes_per_s=100.0, max_in_flight=3)
    async with serving(scheduler):
        for index in range(9):
            scheduler.note_query(target(f"slow{index}"))
        await trio.sleep(NEW_TARGET_DELAY_S + 1)
        assert scheduler.statistics().in_flight == 3
        await trio.sleep(60)

    starts = probe.starts()
    assert len(starts) == 9
    assert most_in_window(starts, 20.0 - EPS) == 3


async def test_serve_refuses_to_run_twice(autojump_clock: trio.testing.MockClock) -> None:
    scheduler = make_scheduler(FakeProbe())
    async with serving(scheduler):
        with pytest.raises(RuntimeError, match="already"):
            await scheduler.serve(REFRESHES[scheduler])


# ------------------------------------------------------------ a simulated day

SIM_TARGETS = 200
SIM_QUERIES_PER_DAY = 3000
SIM_PROBES_PER_S = 0.02
SIM_PER_PREFIX_PER_S = 1 / 600  # 20 /24s of 10 targets: 0.033/s together, above the budget
SIM_MAX_STALENESS_S = 40 * HOUR
DEAD_RANKS = (7, 60, 120, 170, 199)  # never answer
FLAKY_RANKS = (3, 30, 80, 130, 180)  # down from hour 6 to hour 10
ROTATING_RANKS = (2, 40, 90, 140, 190)  # a different certificate every probe


def zipf_queries(rng: random.Random, seconds: float) -> list[tuple[float, int]]:
    """(time, rank) of queries: rank r is asked at a rate proportional to 1/r."""
    harmonic = sum(1 / rank for rank in range(1, SIM_TARGETS + 1))
    events = []
    for rank in range(1, SIM_TARGETS + 1):
        per_s = SIM_QUERIES_PER_DAY / DAY / (rank * harmonic)
        at = rng.expovariate(per_s)
        while at < seconds:
            events.append((at, rank))
            at += rng.expovariate(per_s)
    return sorted(events)


async def test_simulated_day(autojump_clock: trio.testing.MockClock) -> None:
    wall_start = time.perf_counter()
    rng = random.Random(20240601)
    ranked = {rank: Target(f"site{rank}.example.test", 443) for rank in range(1, SIM_TARGETS + 1)}
    rank_of = {each: rank for rank, each in ranked.items()}
    probe = FakeProbe(duration_s=2.0, address_of=lambda t: f"10.0.{rank_of[t] % 20}.{rank_of[t]}")
    for rank in DEAD_RANKS:
        probe.failing[ranked[rank]] = lambda: ProbeConnectFailed("connection refused")
    for rank in ROTATING_RANKS:
        names = iter(["a.example.test", "b.example.test"] * 10_000)
        probe.certs[ranked[rank]] = lambda names=names: next(names)
    scheduler = make_scheduler(
        probe,
        probes_per_s=SIM_PROBES_PER_S,
        per_prefix_per_s=SIM_PER_PREFIX_PER_S,
        max_staleness_s=SIM_MAX_STALENESS_S,
        base_interval_s=24 * HOUR,
        forget_after_s=3 * DAY,
    )
    queries = zipf_queries(rng, DAY)
    start = trio.current_time()

    def flaky_down() -> BaseException:
        return ProbeTimeout("target did not answer in time")

    async def outage() -> None:
        await trio.sleep_until(start + 6 * HOUR)
        for rank in FLAKY_RANKS:
            probe.failing[ranked[rank]] = flaky_down
        await trio.sleep_until(start + 10 * HOUR)
        for rank in FLAKY_RANKS:
            del probe.failing[ranked[rank]]

    async with serving(scheduler) as nursery:
        nursery.start_soon(outage)
        for at, rank in queries:
            await trio.sleep_until(start + at)
            scheduler.note_query(ranked[rank])
        await trio.sleep_until(start + DAY)
        statistics = scheduler.statistics()
    end = start + DAY
    wall_s = time.perf_counter() - wall_start

    asked = {rank for _at, rank in queries}
    first_asked = {}
    for at, rank in queries:
        first_asked.setdefault(rank, start + at)
    probes = {rank: len(probe.starts(ranked[rank])) for rank in asked}

    # staleness: longest time without a successful observation, from the first
    # one to the end of the day, for every target that answered at all
    staleness = {}
    for rank in asked:
        seen = probe.successes[ranked[rank]]
        if seen:
            staleness[rank] = max([*gaps(seen), end - seen[-1]])
    healthy = [r for r in staleness if r not in DEAD_RANKS + FLAKY_RANKS + ROTATING_RANKS]

    # invariants
    assert wall_s < 60
    assert set(staleness) == asked - set(DEAD_RANKS)
    assert max(staleness.values()) < SIM_MAX_STALENESS_S  # flaky ones included
    assert_budget(probe.starts(), SIM_PROBES_PER_S, until=end)
    # politeness: once a target's address is known, its starts count against
    # its /24; before, against its host name (rule 8b)
    by_prefix = defaultdict(list)
    for at, t in probe.calls:
        seen = probe.successes[t]
        known = bool(seen) and seen[0] < at
        by_prefix[address_prefix(probe.address_of(t)) if known else t.host].append(at)
    for times in by_prefix.values():
        assert min(gaps(sorted(times)), default=math.inf) >= 1 / SIM_PER_PREFIX_PER_S - EPS
    assert sum(len(times) > 1 for times in by_prefix.values()) >= 20
    # "due" never exceeds the freshness target while a target answers: every
    # healthy target got its first observation within the day's budget and
    # was then re-observed within F
    assert all(staleness[r] < STALENESS_HEADROOM * SIM_MAX_STALENESS_S for r in healthy)
    popular = [r for r in sorted(asked)[:10]]
    unpopular = [r for r in sorted(asked) if r > 100]
    popular_mean = stats.mean(probes[r] for r in popular)
    unpopular_mean = stats.mean(probes[r] for r in unpopular)
    assert popular_mean > 2 * unpopular_mean
    dead_mean = stats.mean(probes[r] for r in DEAD_RANKS if r in asked)
    assert statistics.overdue == 0
    assert statistics.targets_known == len(asked)
    assert statistics.probes_started == len(probe.calls)

    total = len(probe.calls)
    budget = SIM_PROBES_PER_S * DAY
    print()
    print(
        f"simulated day: {len(asked)} targets asked, {len(queries)} queries (Zipf), "
        f"wall time {wall_s:.2f} s"
    )
    print(
        f"  probes: {total} scheduled of a budget of {budget:.0f} "
        f"({SIM_PROBES_PER_S}/s); busiest 1 s window {most_in_window(probe.starts(), 1.0)}, "
        f"busiest hour {most_in_window(probe.starts(), HOUR)} "
        f"(budget {SIM_PROBES_PER_S * HOUR:.0f})"
    )
    print(
        f"  probes per target: top-10 ranks {popular_mean:.1f}, "
        f"ranks 101-200 {unpopular_mean:.1f}, dead targets {dead_mean:.1f}"
    )
    first_seen_delay = max(
        probe.successes[ranked[r]][0] - first_asked[r] for r in asked if r not in DEAD_RANKS
    )
    print(
        f"  first observation after first query: at most {first_seen_delay / 60:.0f} min "
        f"(new targets queue for the budget)"
    )
    print("  rank  kind      queries  probes  max staleness")
    queries_of = defaultdict(int)
    for _at, rank in queries:
        queries_of[rank] += 1
    for rank in (1, 2, 3, 5, 7, 10, 20, 50, 100, 150, 200):
        if rank not in asked:
            continue
        kind = (
            "dead"
            if rank in DEAD_RANKS
            else "flaky"
            if rank in FLAKY_RANKS
            else "rotating"
            if rank in ROTATING_RANKS
            else "healthy"
        )
        stale = f"{staleness[rank] / HOUR:5.1f} h" if rank in staleness else "    (never)"
        print(f"  {rank:4}  {kind:8}  {queries_of[rank]:7}  {probes[rank]:6}  {stale}")
    print(
        f"  max staleness: all answering {max(staleness.values()) / HOUR:.1f} h "
        f"(limit {SIM_MAX_STALENESS_S / HOUR:.0f} h), healthy top-10 "
        f"{max(staleness[r] for r in popular if r in healthy) / HOUR:.1f} h, "
        f"healthy 101-200 {max(staleness[r] for r in unpopular if r in healthy) / HOUR:.1f} h, "
        f"flaky (4 h outage) {max(staleness[r] for r in FLAKY_RANKS if r in staleness) / HOUR:.1f} h, "
        f"median {stats.median(staleness.values()) / HOUR:.1f} h"
    )
    print(
        f"  failures {dict(statistics.failures)}, deferred by prefix "
        f"{statistics.deferred_by_prefix}, overdue {statistics.overdue}"
    )


async def test_workers_sharing_a_store_probe_a_target_about_once_per_interval(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Rule 11: two schedulers (two workers), each asked about the same
    target half the time, over one store. Without ``observed_age`` each
    rescans it on its own schedule; with it, one skips what the other
    observed within the interval, and the target stays as fresh."""
    asked = target("shared")

    async def two_workers(shared: bool) -> tuple[list[float], int]:
        observed: dict[Target, float] = {}
        probes = [FakeProbe(), FakeProbe()]

        async def observed_age(probed: Target) -> float | None:
            at = observed.get(probed)
            return None if at is None else trio.current_time() - at

        def storing(probe: FakeProbe) -> Callable[[Target], Awaitable[ProbeResult]]:
            async def probe_and_store(probed: Target) -> ProbeResult:
                result = await probe(probed)
                observed[probed] = trio.current_time()
                return result

            return probe_and_store

        schedulers = [
            make_scheduler(storing(probe), observed_age=observed_age if shared else None)
            for probe in probes
        ]
        start = trio.current_time()
        async with serving(schedulers[0]) as first, serving(schedulers[1]) as second:
            first.start_soon(ask_every, schedulers[0], asked, 360.0, start + 2 * DAY)
            await trio.sleep(180.0)
            second.start_soon(ask_every, schedulers[1], asked, 360.0, start + 2 * DAY)
            await trio.sleep(2 * DAY)
        starts = sorted(at for probe in probes for at in probe.starts(asked))
        return starts, sum(s.statistics().shared_skips for s in schedulers)

    apart, no_skips = await two_workers(shared=False)
    together, skips = await two_workers(shared=True)
    assert no_skips == 0
    assert skips > 0
    assert len(together) <= 0.6 * len(apart)
    assert max(gaps(together)) < 6 * HOUR  # as fresh as one popular target alone
