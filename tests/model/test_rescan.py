"""Tests of notary.model.rescan: the pure rescan rules (docs/rescan.md), with
times as plain numbers (no Trio, no clock)."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from notary.model.rescan import (
    CHANGE_SMOOTHING,
    CHANGE_WEIGHT,
    FIRST_RETRY_S,
    HEAP_SLACK,
    MIN_INTERVAL_S,
    NEW_TARGET_DELAY_S,
    POPULARITY_HALF_LIFE_S,
    PREFIX_TABLE_MIN,
    RESCHEDULE_SLACK_S,
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
from tests.support.observations import probe_result

HOUR = 3600.0
#: S = 40 h, B = 24 h: F = 36 h.
TIMES = RescanTimes.from_settings(max_staleness_s=40 * HOUR, base_interval_s=24 * HOUR)


def tracked(name: str = "a", now: float = 0.0) -> TrackedTarget:
    target = Target(f"{name}.example.test", 443)
    return TrackedTarget(target, target.key, now)


def test_the_rules_import_no_trio() -> None:
    code = "import sys, notary.model.rescan; assert 'trio' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# -- rules 2, 3, 5, 8b, 9: the formulas ----------------------------------------------------


def test_address_prefix_is_slash_24_slash_48_or_the_name() -> None:
    assert address_prefix("192.0.2.77") == "192.0.2.0/24"
    assert address_prefix("2001:db8:1:2::1") == "2001:db8:1::/48"
    assert address_prefix("www.example.test") == "www.example.test"


def test_interval_shrinks_with_popularity_and_changes_within_bounds() -> None:
    base = 24 * HOUR
    nobody = rescan_interval_s(0, 0, base_interval_s=base)
    some = rescan_interval_s(10, 0, base_interval_s=base)
    many = rescan_interval_s(1000, 0, base_interval_s=base)
    changing = rescan_interval_s(10, 0.5, base_interval_s=base)
    assert nobody == base
    assert nobody > some > many >= MIN_INTERVAL_S
    assert changing < some
    # changes make it at most 1 + CHANGE_WEIGHT times sooner
    assert rescan_interval_s(0, 1.0, base_interval_s=base) == base / (1 + CHANGE_WEIGHT)
    assert rescan_interval_s(0, 7.0, base_interval_s=base) == base / (1 + CHANGE_WEIGHT)
    assert rescan_interval_s(1e12, 1.0, base_interval_s=base) == MIN_INTERVAL_S
    assert rescan_interval_s(1e12, 0, base_interval_s=60) == 60  # never above B


def test_retry_delay_doubles_and_is_capped() -> None:
    delays = [retry_delay_s(k, max_backoff_s=HOUR) for k in range(1, 8)]
    assert delays == [300, 600, 1200, 2400, HOUR, HOUR, HOUR]
    assert retry_delay_s(10_000, max_backoff_s=HOUR) == HOUR


def test_decay_halves_every_half_life_and_never_grows() -> None:
    assert decayed(8.0, POPULARITY_HALF_LIFE_S, POPULARITY_HALF_LIFE_S) == 4.0
    assert decayed(8.0, 3 * POPULARITY_HALF_LIFE_S, POPULARITY_HALF_LIFE_S) == 1.0
    assert decayed(8.0, 0.0, POPULARITY_HALF_LIFE_S) == 8.0
    assert decayed(8.0, -HOUR, POPULARITY_HALF_LIFE_S) == 8.0


def test_popularity_score_orders_like_the_decayed_counter_at_any_time() -> None:
    pairs = [(1.0, 0.0), (3.0, 0.0), (1.0, POPULARITY_HALF_LIFE_S), (5.0, 2 * HOUR)]
    by_score = sorted(pairs, key=lambda pair: popularity_score(*pair))
    for at in (3 * HOUR, 10 * HOUR, 100 * HOUR):
        by_value = sorted(pairs, key=lambda pair: decayed(pair[0], at - pair[1], POPULARITY_HALF_LIFE_S))
        assert by_value == by_score
    # one query's worth a half-life later equals two now
    assert popularity_score(1.0, POPULARITY_HALF_LIFE_S) == popularity_score(2.0, 0.0)


def test_a_throttled_target_is_due_again_soon() -> None:
    assert due_after_throttle(1000.0) == 1000.0 + THROTTLED_RETRY_S


def test_times_cap_the_base_interval_at_the_freshness_deadline() -> None:
    assert TIMES.fresh_within_s == STALENESS_HEADROOM * 40 * HOUR == 36 * HOUR
    assert TIMES.base_interval_s == 24 * HOUR
    assert TIMES.min_interval_s == MIN_INTERVAL_S
    capped = RescanTimes.from_settings(max_staleness_s=10 * HOUR, base_interval_s=24 * HOUR)
    assert capped.base_interval_s == 9 * HOUR
    short = RescanTimes.from_settings(max_staleness_s=40 * HOUR, base_interval_s=120)
    assert short.base_interval_s == short.min_interval_s == 120


# -- one tracked target: rules 1, 2, 4 to 7, 11 -------------------------------------------


def test_a_new_target_is_due_shortly_after_its_first_query_at_its_name() -> None:
    entry = tracked(now=50.0)
    assert entry.due_at == 50.0 + NEW_TARGET_DELAY_S
    assert entry.prefix == "a.example.test"
    assert entry.note_query(50.0, TIMES) is None  # never probed: rule 6 stands
    assert entry.popularity == 1.0
    literal = TrackedTarget(Target("192.0.2.9", 443), "192.0.2.9:443", 0.0)
    assert literal.prefix == "192.0.2.0/24"


def test_queries_add_one_to_a_decaying_popularity() -> None:
    entry = tracked()
    entry.note_query(0.0, TIMES)
    entry.note_query(0.0, TIMES)
    assert entry.popularity_now(POPULARITY_HALF_LIFE_S) == 1.0
    entry.note_query(POPULARITY_HALF_LIFE_S, TIMES)
    assert entry.popularity == 2.0
    assert entry.last_query_at == POPULARITY_HALF_LIFE_S


def test_a_success_makes_it_due_one_healthy_interval_later() -> None:
    entry = tracked()
    entry.note_query(0.0, TIMES)
    entry.note_success(100.0, probe_result(address="198.51.100.7"), changed=False)
    assert entry.failures == 0
    assert entry.last_success_at == entry.last_probe_at == 100.0
    assert entry.prefix == "198.51.100.0/24"  # the address that served it
    assert entry.due_after_probe(100.0, TIMES) == 100.0 + entry.interval_s(100.0, TIMES)
    assert entry.interval_s(100.0, TIMES) <= TIMES.base_interval_s


def test_the_same_result_noted_twice_moves_the_change_ratio_once() -> None:
    entry = tracked()
    result = probe_result()
    entry.note_success(0.0, result, changed=True)
    entry.note_success(1.0, result, changed=True)
    assert entry.change_ratio == CHANGE_SMOOTHING
    entry.note_success(2.0, probe_result(at=1_700_000_100), changed=True)
    assert entry.change_ratio == CHANGE_SMOOTHING + CHANGE_SMOOTHING * (1 - CHANGE_SMOOTHING)
    entry.note_success(3.0, probe_result(at=1_700_000_200), changed=False)
    assert entry.change_ratio < CHANGE_SMOOTHING * 2
    assert entry.fingerprint == result.leaf.sha256


def test_failures_back_off_but_not_past_the_freshness_deadline_while_it_is_ahead() -> None:
    entry = tracked()
    entry.note_success(0.0, probe_result(), changed=False)
    entry.note_failure(HOUR)
    assert entry.failures == 1
    assert entry.due_after_probe(HOUR, TIMES) == HOUR + FIRST_RETRY_S
    for _ in range(9):
        entry.note_failure(30 * HOUR)
    # R(10) is capped at B = 24 h, the deadline F = 36 h after the success comes first
    assert entry.due_after_probe(30 * HOUR, TIMES) == TIMES.fresh_within_s
    # once the deadline has passed, only the backoff applies
    entry.note_failure(40 * HOUR)
    assert entry.due_after_probe(40 * HOUR, TIMES) == 40 * HOUR + TIMES.base_interval_s
    # a target that never answered: the backoff alone
    never = tracked("b")
    never.note_failure(0.0)
    never.note_failure(0.0)
    assert never.due_after_probe(0.0, TIMES) == 2 * FIRST_RETRY_S


def test_a_query_makes_a_healthy_target_due_sooner_never_later() -> None:
    entry = tracked()
    entry.note_query(0.0, TIMES)
    entry.note_success(0.0, probe_result(), changed=False)
    entry.due_at = entry.due_after_probe(0.0, TIMES)
    # enough queries to shorten the interval by more than the slack
    sooner = None
    for _ in range(50):
        sooner = entry.note_query(10.0, TIMES)
        if sooner is not None:
            break
    assert sooner is not None
    assert sooner < entry.due_at - RESCHEDULE_SLACK_S
    assert sooner == max(10.0, entry.interval_s(10.0, TIMES))
    # due already at its earliest: nothing moves
    entry.due_at = MIN_INTERVAL_S
    assert entry.note_query(20.0, TIMES) is None


def test_a_query_leaves_a_failing_target_to_its_backoff() -> None:
    entry = tracked()
    entry.note_failure(0.0)
    entry.due_at = entry.due_after_probe(0.0, TIMES)
    for _ in range(1000):
        assert entry.note_query(1.0, TIMES) is None


def test_overdue_counts_from_the_last_success_or_the_first_query() -> None:
    entry = tracked(now=10.0)
    assert not entry.is_overdue(10.0 + TIMES.max_staleness_s, TIMES)
    assert entry.is_overdue(11.0 + TIMES.max_staleness_s, TIMES)
    entry.note_success(HOUR, probe_result(), changed=False)
    assert not entry.is_overdue(HOUR + TIMES.max_staleness_s, TIMES)
    assert entry.is_overdue(HOUR + TIMES.max_staleness_s + 1, TIMES)


def test_an_observation_elsewhere_within_the_interval_counts_as_a_success() -> None:
    entry = tracked()
    entry.note_query(0.0, TIMES)
    entry.note_failure(0.0)
    now = 5 * HOUR
    interval = entry.interval_s(now, TIMES)
    assert entry.note_observed_elsewhere(now, interval, TIMES) is None
    assert entry.note_observed_elsewhere(now, -1.0, TIMES) is None
    assert entry.failures == 1  # refused ones change nothing
    due = entry.note_observed_elsewhere(now, HOUR, TIMES)
    assert due == max(now, now - HOUR + interval)
    assert entry.failures == 0
    assert entry.last_probe_at == entry.last_success_at == now - HOUR


# -- rule 1: eviction order ---------------------------------------------------------------


def test_eviction_picks_the_least_popular_then_the_oldest() -> None:
    table: dict[str, TrackedTarget] = {}
    queue = EvictionQueue()
    for name, at in (("old", 0.0), ("new", HOUR), ("asked", 0.0)):
        entry = tracked(name, at)
        table[entry.key] = entry
        queue.add(entry, popularity_score(1.0, at), table)
        entry.note_query(at, TIMES)
    table["asked.example.test:443"].note_query(2 * HOUR, TIMES)  # re-valued, not evicted
    first = queue.pop_least_popular(table)
    assert first is not None and first.target.host == "old.example.test"
    del table[first.key]
    second = queue.pop_least_popular(table)
    assert second is not None and second.target.host == "new.example.test"
    del table[second.key]
    del table["asked.example.test:443"]  # forgotten elsewhere: skipped
    assert queue.pop_least_popular(table) is None


def test_eviction_queue_stays_bounded() -> None:
    table: dict[str, TrackedTarget] = {}
    queue = EvictionQueue()
    for index in range(1000):
        entry = tracked(f"t{index}", float(index))
        table.clear()  # only the newest is tracked
        table[entry.key] = entry
        queue.add(entry, popularity_score(1.0, float(index)), table)
        assert len(queue) <= 2 * len(table) + HEAP_SLACK


# -- rules 8a, 8b, 10: start spacing ------------------------------------------------------


def test_starts_are_spaced_globally_and_per_prefix() -> None:
    spacing = StartSpacing(probes_per_s=2.0, per_prefix_per_s=0.1)
    assert spacing.global_wait_s(0.0) == -math.inf
    assert spacing.prefix_ready_at("192.0.2.0/24") == -math.inf
    spacing.record_start("192.0.2.0/24", 0.0)
    assert spacing.global_wait_s(0.0) == 0.5
    assert spacing.global_wait_s(0.5) == 0.0
    assert spacing.prefix_ready_at("192.0.2.0/24") == 10.0
    assert spacing.prefix_ready_at("198.51.100.0/24") == -math.inf
    spacing.record_start("198.51.100.0/24", 0.5)
    assert spacing.global_wait_s(0.5) == 0.5  # one token: no burst
    spacing.record_start("192.0.2.0/24", 10.0)
    assert spacing.prefix_ready_at("192.0.2.0/24") == 20.0


def test_the_prefix_table_is_pruned_of_prefixes_that_need_not_wait() -> None:
    spacing = StartSpacing(probes_per_s=1000.0, per_prefix_per_s=1.0)
    for index in range(10 * PREFIX_TABLE_MIN):
        spacing.record_start(f"p{index}", index / 1000.0)
        # about 1000 prefixes wait at any time (1 s each, 1000 starts a second)
        assert len(spacing) <= max(PREFIX_TABLE_MIN, 2 * 1001) + 1


@pytest.mark.parametrize("failures", [1, 2, 5, 62, 63, 10_000])
def test_retry_delay_is_never_above_its_cap(failures: int) -> None:
    assert retry_delay_s(failures, max_backoff_s=HOUR) <= HOUR
