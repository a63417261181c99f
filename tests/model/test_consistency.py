"""Tests of notary.model.consistency: a target's current set and whether it
is served stable, rotating or split (docs/v2.md, rule S8), on timelines
built from sightings (no network), and properties on random ones."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from notary.model.consistency import (
    Consistency,
    ConsistencyKind,
    consistency_of,
    summarise,
)
from notary.model.observations import MAX_ADDRESSES_PER_OBSERVATION, Timeline
from notary.model.targets import Target
from tests.support.observations import certificate, sightings_timeline

DAY = 86400
NOW = 1_770_000_000
SITE = "www.example.test"


def sha(name: str) -> bytes:
    return certificate(name).sha256


def of(timeline: Timeline, now: int = NOW, fresh_for_s: int = DAY) -> Consistency | None:
    return consistency_of(timeline, now=now, fresh_for_s=fresh_for_s)


def test_a_target_never_observed_has_no_current_set() -> None:
    empty = Timeline(Target(SITE, 443))
    assert empty.current(NOW, DAY) == ()
    assert of(empty) is None
    with pytest.raises(ValueError, match="at least one certificate"):
        summarise([])


def test_one_certificate_at_several_addresses_is_stable() -> None:
    timeline = sightings_timeline(
        [("a", "192.0.2.2", NOW - 60), ("a", "192.0.2.1", NOW - 30), ("a", "2001:db8::1", NOW)]
    )
    assert of(timeline) == Consistency(
        ConsistencyKind.STABLE, ("192.0.2.1", "192.0.2.2", "2001:db8::1"), (sha("a"),)
    )


def test_each_address_with_its_own_certificate_is_split() -> None:
    # The site: three addresses, a certificate each; a fourth
    # address serving the third certificate too.
    timeline = sightings_timeline([
        ("a", "127.0.0.2", NOW - 3), ("b", "127.0.0.3", NOW - 2),
        ("c", "127.0.0.4", NOW - 1), ("c", "::1", NOW),
    ])
    consistency = of(timeline)
    assert consistency is not None
    assert consistency.kind is ConsistencyKind.SPLIT
    assert consistency.addresses == ("127.0.0.2", "127.0.0.3", "127.0.0.4", "::1")
    assert consistency.current == (sha("c"), sha("b"), sha("a"))  # timeline order
    assert consistency.certificates == 3


def test_one_address_alternating_certificates_is_rotating() -> None:
    timeline = sightings_timeline([
        ("a", "127.0.0.5", NOW - 3), ("b", "127.0.0.5", NOW - 2),
        ("a", "127.0.0.5", NOW - 1), ("b", "127.0.0.5", NOW),
    ])
    assert of(timeline) == Consistency(
        ConsistencyKind.ROTATING, ("127.0.0.5",), (sha("b"), sha("a"))
    )


def test_a_rotation_spread_over_addresses() -> None:
    # The old certificate at three addresses; the new one appears at one
    # of them first: that address served both, so the site is rotating...
    old = [("old", address, NOW - 2 * DAY) for address in ("192.0.2.1", "192.0.2.2", "192.0.2.3")]
    timeline = sightings_timeline(
        [*old, ("old", "192.0.2.2", NOW - 600), ("new", "192.0.2.1", NOW)]
    )
    consistency = of(timeline)
    assert consistency is not None and consistency.kind is ConsistencyKind.ROTATING
    assert consistency.current == (sha("new"), sha("old"))
    # ... and stable at the new certificate once the old one is stale.
    later = of(timeline, now=NOW + DAY)
    assert later == Consistency(ConsistencyKind.STABLE, ("192.0.2.1",), (sha("new"),))


def test_stale_certificates_are_left_out() -> None:
    timeline = sightings_timeline([
        ("gone", "192.0.2.9", NOW - DAY - 1), ("a", "192.0.2.1", NOW - 10), ("b", "192.0.2.2", NOW),
    ])
    consistency = of(timeline)
    assert consistency is not None
    assert consistency.current == (sha("b"), sha("a"))
    assert "192.0.2.9" not in consistency.addresses
    assert consistency.kind is ConsistencyKind.SPLIT
    # Exactly fresh_for_s old is still fresh (Observation.is_fresh).
    wider = of(timeline, fresh_for_s=DAY + 1)
    assert wider is not None and wider.current == (sha("b"), sha("a"), sha("gone"))


def test_the_newest_observation_is_current_even_when_stale() -> None:
    # What V1 matches: the newest, whatever its age, and the fresh ones.
    timeline = sightings_timeline(
        [("a", "192.0.2.1", NOW - 9 * DAY), ("b", "192.0.2.2", NOW - 5 * DAY)]
    )
    assert of(timeline) == Consistency(ConsistencyKind.STABLE, ("192.0.2.2",), (sha("b"),))


def test_addresses_are_sorted_by_code_point_and_kept_once() -> None:
    timeline = sightings_timeline([
        ("a", "10.0.0.2", NOW - 2), ("a", "10.0.0.10", NOW - 1), ("b", "10.0.0.3", NOW),
    ])
    consistency = of(timeline)
    assert consistency is not None
    assert consistency.addresses == ("10.0.0.10", "10.0.0.2", "10.0.0.3")


def test_only_the_addresses_an_observation_keeps_are_read() -> None:
    # A certificate remembers its 8 newest addresses; an address it no
    # longer remembers does not make the site rotating.
    sightings = [("a", f"192.0.2.{i}", NOW - 100 + i) for i in range(10)]
    timeline = sightings_timeline([*sightings, ("b", "192.0.2.0", NOW)])
    consistency = of(timeline)
    assert consistency is not None
    assert len(timeline.observations[1].addresses) == MAX_ADDRESSES_PER_OBSERVATION
    assert consistency.kind is ConsistencyKind.SPLIT
    assert len(consistency.addresses) == MAX_ADDRESSES_PER_OBSERVATION + 1


# -- properties ------------------------------------------------------------------------

CERTS = ("a", "b", "c", "d")
ADDRESSES = ("192.0.2.1", "192.0.2.2", "192.0.2.3", "2001:db8::1", "2001:db8::2")
sightings = st.lists(
    st.tuples(st.sampled_from(CERTS), st.sampled_from(ADDRESSES),
              st.integers(NOW - 3 * DAY, NOW)),
    min_size=1, max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(sightings, st.integers(0, 3 * DAY))
def test_the_consistency_is_what_its_definition_says(seen, fresh_for_s) -> None:
    timeline = sightings_timeline(seen)
    consistency = of(timeline, fresh_for_s=fresh_for_s)
    assert consistency is not None
    current = timeline.current(NOW, fresh_for_s)
    order = [o.certificate.sha256 for o in timeline.observations]
    # The current set: the newest, then the fresh ones; a prefix of the timeline.
    assert consistency.current == tuple(order[: len(current)])
    assert {o.certificate.sha256 for o in current} == {
        o.certificate.sha256 for o in timeline.observations
        if o is timeline.newest or o.last_seen >= NOW - fresh_for_s
    }
    served = {o.certificate.sha256: set(o.addresses) for o in current}
    assert consistency.addresses == tuple(sorted(set().union(*served.values())))
    shared = any(
        served[x] & served[y] for x in served for y in served if x != y
    )
    expected = (
        ConsistencyKind.STABLE if len(served) == 1
        else ConsistencyKind.ROTATING if shared else ConsistencyKind.SPLIT
    )
    assert consistency.kind is expected


@settings(max_examples=100, deadline=None)
@given(sightings, st.randoms(use_true_random=False))
def test_the_order_of_the_probes_does_not_matter(seen, random) -> None:
    shuffled = list(seen)
    random.shuffle(shuffled)
    assert of(sightings_timeline(seen)) == of(sightings_timeline(shuffled))
