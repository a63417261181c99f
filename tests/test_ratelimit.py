"""``notary.model.ratelimit``: token buckets (property tests: never more than
``burst + rate * t`` in any window, refill, bounded size), client prefixes,
exemptions and connection counts. Pure: plain ``def`` tests, time is a number."""

from __future__ import annotations

import contextlib
import sys
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from notary.errors import ConfigError
from notary.model.ratelimit import (
    BYTES_PER_BUCKET,
    BytesInFlight,
    ClientConnections,
    Exemptions,
    Overloaded,
    RateLimited,
    TokenBuckets,
    client_prefix,
    packed_address,
    retry_after_s,
)

KEY = b"\xc0\x00\x02"

rates = st.floats(min_value=0.01, max_value=1000.0, allow_nan=False, allow_infinity=False)
bursts = st.integers(min_value=1, max_value=50)
#: Request times: sorted offsets (seconds), many at the same instant.
gaps = st.lists(
    st.one_of(st.just(0.0), st.floats(min_value=0.0, max_value=5.0, allow_nan=False)),
    min_size=1, max_size=300,
)


def admitted_times(buckets: TokenBuckets, gaps_s: list[float], cost: float = 1.0) -> list[float]:
    now, admitted = 1000.0, []
    for gap in gaps_s:
        now += gap
        if buckets.take(KEY, now, cost) == 0.0:
            admitted.append(now)
    return admitted


@settings(max_examples=300, deadline=None)
@given(rate=rates, burst=bursts, gaps_s=gaps)
def test_never_more_than_burst_plus_rate_times_t_in_any_window(
    rate: float, burst: int, gaps_s: list[float]
) -> None:
    admitted = admitted_times(TokenBuckets(rate, burst, max_entries=10), gaps_s)
    for i, start in enumerate(admitted):
        for j in range(i, len(admitted)):
            window_s = admitted[j] - start  # the closed window [start, admitted[j]]
            assert j - i + 1 <= burst + rate * window_s + 1e-6, (i, j, window_s)


@settings(max_examples=200, deadline=None)
@given(rate=rates, burst=bursts, gaps_s=gaps, cost=st.integers(min_value=1, max_value=60))
def test_costs_count_as_that_many_tokens(
    rate: float, burst: int, gaps_s: list[float], cost: int
) -> None:
    """A request of ``cost`` tokens (a v2 batch) spends that many; a cost
    above the burst is charged as the burst."""
    charged = min(cost, burst)
    admitted = admitted_times(TokenBuckets(rate, burst, max_entries=10), gaps_s, float(cost))
    for i, start in enumerate(admitted):
        for j in range(i, len(admitted)):
            assert (j - i + 1) * charged <= burst + rate * (admitted[j] - start) + 1e-6


@settings(max_examples=200, deadline=None)
@given(rate=rates, burst=bursts)
def test_a_full_bucket_admits_the_burst_then_refuses_then_refills(rate: float, burst: int) -> None:
    buckets = TokenBuckets(rate, burst, max_entries=10)
    now = 50.0
    assert all(buckets.take(KEY, now) == 0.0 for _ in range(burst))
    wait = buckets.take(KEY, now)
    assert wait == pytest.approx(1.0 / rate)  # one token's worth
    assert buckets.refused == 1
    assert buckets.take(KEY, now + wait * 0.5) > 0  # not yet
    assert buckets.take(KEY, now + wait) == 0.0  # the promised time
    # Left alone for burst / rate seconds, the bucket is full again.
    later = now + wait + burst / rate
    assert all(buckets.take(KEY, later) == 0.0 for _ in range(burst))
    assert buckets.take(KEY, later) > 0


@settings(max_examples=300, deadline=None)
@given(
    rate=rates, burst=bursts,
    now=st.floats(min_value=1.5e9, max_value=4e9, allow_nan=False),  # Unix times
    cost=st.integers(min_value=1, max_value=60),
)
def test_a_full_bucket_admits_its_burst_at_unix_times(
    rate: float, burst: int, now: float, cost: int
) -> None:
    """At Unix-time magnitudes a float's step is ~2.4e-7 s: ``now + 1/rate
    - now`` is not ``1/rate``, and a fresh bucket of one token refused its
    first probe when 60/N was not a binary fraction (issue 30, item 17:
    ``probes_per_minute_per_target = 61`` refused every other first probe)."""
    buckets = TokenBuckets(rate, burst, max_entries=10)
    charged = min(cost, burst)
    assert buckets.wait_s(KEY, now, float(cost)) == 0.0
    taken = 0
    while taken + charged <= burst:
        assert buckets.take(KEY, now, float(cost)) == 0.0
        taken += charged
    # Refilled after a full burst's time (and the float step of ``now``).
    later = now + burst / rate + 1e-6
    assert buckets.wait_s(KEY, later, float(cost)) == 0.0
    assert buckets.take(KEY, later, float(cost)) == 0.0


def test_wait_s_predicts_take_without_charging() -> None:
    buckets = TokenBuckets(2.0, 3, max_entries=10)
    assert buckets.wait_s(KEY, 0.0) == 0.0
    assert len(buckets) == 0  # a peek stores nothing
    for _ in range(3):
        assert buckets.take(KEY, 0.0) == 0.0
    assert buckets.wait_s(KEY, 0.0) == pytest.approx(0.5)
    assert buckets.wait_s(KEY, 0.0) == pytest.approx(0.5)  # still: nothing charged
    assert buckets.take(KEY, 0.5) == 0.0


def test_refund_gives_back_what_was_taken() -> None:
    buckets = TokenBuckets(1.0, 1, max_entries=10)
    assert buckets.take(KEY, 0.0) == 0.0
    assert buckets.take(KEY, 0.0) > 0
    buckets.refund(KEY)
    assert buckets.take(KEY, 0.0) == 0.0
    buckets.refund(b"never seen")  # nothing to give back: no entry made
    assert len(buckets) == 1


def test_keys_are_independent() -> None:
    buckets = TokenBuckets(1.0, 2, max_entries=10)
    assert [buckets.take(b"a", 0.0) for _ in range(3)] == [0.0, 0.0, 1.0]
    assert buckets.take(b"b", 0.0) == 0.0


def test_a_clock_that_goes_back_does_not_lock_a_key_out() -> None:
    buckets = TokenBuckets(1.0, 5, max_entries=10)
    for _ in range(5):
        buckets.take(KEY, 10_000.0)
    # The wall clock steps back an hour: the bucket seems due in an hour and
    # five seconds, more than a burst of debt, which cannot happen: a full bucket.
    assert buckets.take(KEY, 6_400.0) == 0.0
    assert buckets.wait_s(KEY, 3_000.0) == 0.0


@settings(max_examples=100, deadline=None)
@given(
    max_entries=st.integers(min_value=1, max_value=64),
    keys=st.lists(st.integers(min_value=0, max_value=500), min_size=1, max_size=400),
    step_s=st.floats(min_value=0.0, max_value=2.0, allow_nan=False),
)
def test_the_table_never_holds_more_than_max_entries(
    max_entries: int, keys: list[int], step_s: float
) -> None:
    buckets = TokenBuckets(1.0, 3, max_entries=max_entries)
    now = 0.0
    for key in keys:
        now += step_s
        buckets.take(key, now)
        assert len(buckets) <= max_entries


def test_a_sweep_drops_full_buckets_first_and_evicts_only_beyond_that() -> None:
    buckets = TokenBuckets(1.0, 2, max_entries=8)
    for key in range(8):
        buckets.take(key, 0.0)  # each due again at 1.0
    buckets.take(100, 5.0)  # every bucket full by now: all dropped, none evicted
    assert (len(buckets), buckets.sweeps, buckets.evicted) == (1, 1, 0)
    for key in range(200, 207):
        buckets.take(key, 5.0)
    assert len(buckets) == 8
    buckets.take(300, 5.0)  # every bucket in use: the oldest are forgotten
    assert buckets.evicted == 8 - int(8 * 0.75)
    assert len(buckets) == int(8 * 0.75) + 1
    # Forgetting only loosens: the evicted key 100 is admitted afresh.
    assert buckets.take(100, 5.0) == 0.0


def test_memory_per_entry_is_as_documented() -> None:
    count = 20_000
    keys = [i.to_bytes(7, "big") for i in range(count)]  # the IPv6 /56 key size
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        buckets = TokenBuckets(1.0, 10, max_entries=count)
        for key in keys:
            buckets.take(key, 1.5)
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    per_entry = (used + count * sys.getsizeof(keys[0])) / count  # keys made by the caller
    assert per_entry <= BYTES_PER_BUCKET, per_entry


def test_bad_parameters_are_refused() -> None:
    for rate, burst, size in ((0.0, 1, 1), (1.0, 0, 1), (1.0, 1, 0), (-1.0, 1, 1)):
        with pytest.raises(ValueError):
            TokenBuckets(rate, burst, max_entries=size)


@pytest.mark.parametrize(
    ("wait_s", "expected"),
    [(0.0001, 1), (0.5, 1), (1.0, 1), (1.0001, 2), (59.2, 60), (60.0, 60)],
)
def test_retry_after_is_whole_seconds_rounded_up(wait_s: float, expected: int) -> None:
    assert retry_after_s(wait_s) == expected


def test_rate_limited_is_a_429() -> None:
    exc = RateLimited("slow down", retry_after_s=3)
    assert (exc.status, exc.retry_after_s, exc.message) == (429, 3, "slow down")


# -- client keys -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "prefix"),
    [
        ("192.0.2.77", bytes([192, 0, 2])),
        ("::ffff:192.0.2.77", bytes([192, 0, 2])),  # a dual-stack listener's IPv4 client
        ("2001:db8:aa:bb01::1", bytes.fromhex("20010db800aabb")),  # the /56
        ("2001:db8:aa:bbff:1:2:3:4", bytes.fromhex("20010db800aabb")),
        ("fe80::1%eth0", bytes.fromhex("fe800000000000")),
    ],
)
def test_client_prefixes(address: str, prefix: bytes) -> None:
    packed = packed_address(address)
    assert packed is not None
    assert client_prefix(packed) == prefix


@pytest.mark.parametrize("text", ["", "?", "example.org", "1.2.3", "::g", "1.2.3.4:80", "[::1]"])
def test_what_is_not_an_address_has_no_key(text: str) -> None:
    assert packed_address(text) is None


def test_exemptions() -> None:
    exempt = Exemptions.from_cidrs(["127.0.0.0/8", "::1/128", "2001:db8::/32"])
    for address in ("127.0.0.1", "127.9.9.9", "::1", "::ffff:127.0.0.1", "2001:db8:1::5"):
        assert packed_address(address) in exempt, address
    for address in ("128.0.0.1", "::2", "2001:db9::1"):
        assert packed_address(address) not in exempt, address
    assert None not in exempt
    # The edges of each range, and a packed IPv4 address never matching an
    # IPv6 range of the same leading bytes (or the reverse).
    edges = Exemptions.from_cidrs(["192.0.2.16/28", "2001:db8::/127"])
    for address in ("192.0.2.16", "192.0.2.31", "2001:db8::", "2001:db8::1"):
        assert packed_address(address) in edges, address
    for address in ("192.0.2.15", "192.0.2.32", "2001:db8::2", "2001:db7:ffff::"):
        assert packed_address(address) not in edges, address
    assert bytes(4) not in Exemptions.from_cidrs(["::/96"])
    assert bytes(16) not in Exemptions.from_cidrs(["0.0.0.0/8"])
    assert b"\x7f\x00\x00" not in exempt  # neither 4 nor 16 bytes
    with pytest.raises(ConfigError, match=r"10\.0\.0\.1/8"):
        Exemptions.from_cidrs(["10.0.0.1/8"])
    with pytest.raises(ConfigError):
        Exemptions.from_cidrs("127.0.0.0/8")  # type: ignore[arg-type]


def test_connections_per_address_and_per_prefix() -> None:
    connections = ClientConnections(max_per_address=2, max_per_prefix=3)
    a1, a2, b1 = (packed_address(a) for a in ("192.0.2.1", "192.0.2.2", "198.51.100.1"))
    assert a1 and a2 and b1
    assert connections.open(a1) and connections.open(a1)
    assert not connections.open(a1)  # the address is at its maximum
    assert connections.open(a2)
    assert not connections.open(a2)  # the /24 is at its maximum
    assert (connections.refused_address, connections.refused_prefix) == (1, 1)
    assert connections.open(b1)  # another prefix
    assert connections.open_from(a1) == (2, 3)
    connections.close(a1)
    assert connections.open(a2)
    for address in (a1, a2, a2, b1):
        connections.close(address)
    assert len(connections) == 0  # nothing kept for clients without connections


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(min_value=0, max_value=7))))
def test_connection_counts_stay_exact_and_bounded(steps: list[tuple[bool, int]]) -> None:
    connections = ClientConnections(max_per_address=3, max_per_prefix=5)
    addresses = [bytes([10, 0, i // 4, i]) for i in range(8)]  # two /24s of four
    open_ = [0] * 8
    for opening, index in steps:
        address = addresses[index]
        if opening:
            if connections.open(address):
                open_[index] += 1
        elif open_[index]:
            connections.close(address)
            open_[index] -= 1
        assert all(count <= 3 for count in open_)
        assert sum(open_[:4]) <= 5 and sum(open_[4:]) <= 5
        assert connections.open_from(address)[0] == open_[index]
        assert len(connections) <= 2 * sum(1 for count in open_ if count) + 2


def test_bytes_in_flight_are_bounded_per_client_and_in_all() -> None:
    held = BytesInFlight(max_bytes=1200, max_bytes_per_client=300, retry_after_s=10)
    a, b = b"\x0a\x00\x01", b"\x0a\x00\x02"
    big = b"x" * 500
    release_big = held.hold(a, big)  # more than a client's bound, but its first
    with pytest.raises(RateLimited) as refused:
        held.hold(a, b"y")
    assert refused.value.retry_after_s == 10 and refused.value.status == 429
    # Two objects (bytes(150) makes a new one each time; a literal would be one).
    releases = [held.hold(b, bytes(150)), held.hold(b, bytes(150))]  # 300: the bound
    with pytest.raises(RateLimited):
        held.check(b, 1)
    shared = b"s" * 400
    # The shared object: counted once in all, once per response per client.
    more = [held.hold(bytes([10, 1, n]), shared) for n in range(5)]
    assert held.held_bytes == 500 + 300 + 400
    with pytest.raises(Overloaded) as overloaded:
        held.hold(bytes([10, 2, 0]), b"n" * 10)  # a new object past the total's bound
    assert overloaded.value.status == 503 and overloaded.value.retry_after_s == 10
    more.append(held.hold(None, shared))  # held already: adds nothing to the total
    assert held.statistics() == type(held.statistics())(1200, 9, 7, 2, 1)
    for release in [release_big, *releases, *more]:
        release()
        release()  # once only
    assert held.statistics() == type(held.statistics())(0, 0, 0, 2, 1)
    # Nothing held: any one response is admitted, whatever its size.
    held.hold(a, b"h" * 5000)()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 5), st.integers(0, 3))))
def test_bytes_in_flight_never_pass_a_bound_by_more_than_one_response(
    steps: list[tuple[bool, int, int]],
) -> None:
    held = BytesInFlight(max_bytes=1000, max_bytes_per_client=400, retry_after_s=1)
    objects = [b"a" * 300, b"b" * 200, b"c" * 100, b"d" * 50]
    clients = [bytes([10, 0, n]) for n in range(6)]
    holding: list[tuple[int, int, object]] = []
    for adding, client, which in steps:
        if adding:
            with contextlib.suppress(RateLimited, Overloaded):
                holding.append((client, which, held.hold(clients[client], objects[which])))
        elif holding:
            holding.pop(client % len(holding))[2]()  # type: ignore[operator]
        distinct = {which for _, which, _ in holding}
        assert held.held_bytes == sum(len(objects[w]) for w in distinct) <= 1000 + 300
        for n, key in enumerate(clients):
            mine = sum(len(objects[w]) for c, w, _ in holding if c == n)
            assert held.held_by(key) == mine <= 400 + 300


def test_a_charge_goes_into_debt_within_max_debt() -> None:
    buckets = TokenBuckets(100.0, 1000, max_entries=8, max_debt=5000)
    buckets.charge(KEY, 0.0, 800)  # within the burst: 200 tokens left
    assert buckets.wait_s(KEY, 0.0) == 0.0
    buckets.charge(KEY, 0.0, 3000)  # 2,800 in debt: 28 s until one token again
    assert buckets.wait_s(KEY, 0.0) == pytest.approx(28.01)
    assert buckets.take(KEY, 10.0) == pytest.approx(18.01)  # refused, not reset (rule 4)
    # At most a burst (rule 4) and max_debt more in debt: the rest is forgiven.
    buckets.charge(KEY, 0.0, 10**9)
    assert buckets.wait_s(KEY, 0.0) == pytest.approx(60.01)
    assert buckets.wait_s(KEY, 60.01) == 0.0 and buckets.take(KEY, 60.02) == 0.0
    # Without max_debt, a charge still never looks like a clock gone back.
    plain = TokenBuckets(100.0, 1000, max_entries=8)
    plain.charge(KEY, 0.0, 10**9)
    assert plain.wait_s(KEY, 0.0) == pytest.approx(10.01)
