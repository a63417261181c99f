"""The change feed in the store (``notary.state.feed``): a row per committed
probe of a target, in order, ``changed`` judged against the stored history,
bounded by pruning that followers can detect."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from notary.model.targets import Target
from notary.state.store import Store
from tests.support.engines import Engine
from tests.support.observations import certificate, probe_result

HOST = "www.example.test"
T0 = 1_700_000_000


@pytest.fixture
def store(engine: Engine) -> Iterator[Store]:
    """A store of each engine (``tests.support.engines``)."""
    with engine.observations() as opened:
        yield opened


def changes_after(store: Store, after: int = 0) -> list[tuple[str, bytes, bool, str]]:
    page = store.read_feed(after, 1000)
    assert not page.missed
    return [(c.target.key, c.sha256, c.changed, c.origin) for c in page.changes]


def test_every_committed_observation_is_in_the_feed_in_order(store: Store) -> None:
    assert store.feed_position() == 0
    store.record([probe_result(HOST, at=T0), probe_result("b.example.test", at=T0)], "w1")
    store.record([probe_result(HOST, at=T0 + 60)], "w2")
    page = store.read_feed(0, 1000)
    assert [c.seq for c in page.changes] == [1, 2, 3] and page.last_seq == 3
    assert store.feed_position() == 3
    assert [(c.target, c.origin) for c in page.changes] == [
        (Target(HOST, 443), "w1"), (Target("b.example.test", 443), "w1"), (Target(HOST, 443), "w2")
    ]
    assert changes_after(store, 2) == [(Target(HOST, 443).key, certificate(HOST).sha256, False, "w2")]
    assert store.read_feed(3, 1000).changes == ()


def test_a_change_is_judged_against_the_stored_history(store: Store) -> None:
    old, new = certificate(HOST), certificate("other.example.test")
    window = store.merge_window_s
    store.record([probe_result(HOST, at=T0)])  # first sighting: no change
    store.record([probe_result(HOST, at=T0 + 10)])  # same certificate
    store.record([probe_result(HOST, cert="other.example.test", at=T0 + 20)])  # a change
    store.record([probe_result(HOST, at=T0 + 5)])  # a late sighting of the old one
    store.record([probe_result(HOST, at=T0 + 30)])  # the old one again, within the window
    store.record([probe_result(HOST, cert="other.example.test", at=T0 + 40)])
    late = T0 + 41 + window  # the old one back after more than the window: a change
    store.record([probe_result(HOST, at=late)])
    assert [(sha, changed) for _, sha, changed, _ in changes_after(store)] == [
        (old.sha256, False), (old.sha256, False), (new.sha256, True), (old.sha256, False),
        (old.sha256, False), (new.sha256, False), (old.sha256, True),
    ]


def test_changes_within_one_batch_are_judged_in_observation_order(store: Store) -> None:
    store.record([probe_result(HOST, at=T0)])
    store.record([
        probe_result(HOST, at=T0 + 20),  # back to the first after the second
        probe_result(HOST, cert="other.example.test", at=T0 + 10),
    ])
    flags = [(sha, changed) for _, sha, changed, _ in changes_after(store, 1)]
    assert flags == [
        (certificate("other.example.test").sha256, True), (certificate(HOST).sha256, False)
    ]


def test_one_probe_of_several_addresses_is_one_change(store: Store) -> None:
    """A probe's results share its time: one row for the target, a change
    when one of its certificates is new, none for a split site seen again
    in another mix of its certificates."""
    a, b, c = (f"{name}.example.test" for name in ("a", "b", "c"))
    store.record([
        probe_result(HOST, cert=a, address="192.0.2.1", at=T0),
        probe_result(HOST, cert=b, address="192.0.2.2", at=T0),
    ], probes=[2])
    store.record([probe_result(HOST, cert=b, address="192.0.2.2", at=T0 + 60)])  # a only missed
    store.record([
        probe_result(HOST, cert=a, address="192.0.2.1", at=T0 + 120),
        probe_result(HOST, cert=b, address="192.0.2.2", at=T0 + 120),
        probe_result(HOST, cert=c, address="192.0.2.3", at=T0 + 120),
    ], probes=[3])
    assert [(sha, changed) for _, sha, changed, _ in changes_after(store)] == [
        (certificate(a).sha256, False), (certificate(b).sha256, False),
        (certificate(c).sha256, True),
    ]


def test_probes_of_one_second_in_one_batch_are_each_judged(store: Store) -> None:
    """Two probes of a new target in one batch, within one second, the
    second seeing a new certificate: a row each, the second a change."""
    a, b = "a.example.test", "b.example.test"
    store.record([
        probe_result(HOST, cert=a, address="192.0.2.1", at=T0),
        probe_result(HOST, cert=a, address="192.0.2.1", at=T0),
        probe_result(HOST, cert=b, address="192.0.2.1", at=T0),
        probe_result(HOST, cert=a, address="192.0.2.2", at=T0),
    ], probes=[1, 1, 2])
    assert [(sha, changed) for _, sha, changed, _ in changes_after(store)] == [
        (certificate(a).sha256, False), (certificate(a).sha256, False),
        (certificate(b).sha256, True),
    ]
    with pytest.raises(ValueError):
        store.record([probe_result(HOST, at=T0 + 1)], probes=[2])


def test_a_rolled_back_batch_leaves_no_change(store: Store) -> None:
    store.record([probe_result(HOST, at=T0)])
    with pytest.raises(ValueError):
        store.merge_window_s = -1
        store.record([probe_result(HOST, at=T0 + 1)])
    store.merge_window_s = 3600
    assert store.feed_position() == 1


def test_pruning_keeps_the_newest_rows_and_a_follower_behind_knows_it(store: Store) -> None:
    for minute in range(10):
        store.record([probe_result(HOST, at=T0 + 60 * minute)])
    assert store.prune_feed(max_rows=4) == 6
    assert store.prune_feed(max_rows=4) == 0
    behind = store.read_feed(3, 1000)
    assert behind.missed
    caught_up = store.read_feed(6, 1000)
    assert not caught_up.missed and [c.seq for c in caught_up.changes] == [7, 8, 9, 10]
    store.record([probe_result(HOST, at=T0 + 3600)])
    assert store.feed_position() == 11  # sequence numbers are never reused


def test_a_second_connection_follows_the_first_ones_commits(tmp_path: Path) -> None:
    with Store(tmp_path / "n.db") as writer, Store(tmp_path / "n.db", create=False) as reader:
        start = reader.feed_position()
        writer.record([probe_result(HOST, at=T0)], "other")
        assert [c.origin for c in reader.read_feed(start, 10).changes] == ["other"]


def test_certificates_seen_in_the_same_second_are_each_a_change_once(store: Store) -> None:
    """Times are whole seconds: a certificate already among the newest ones
    (the latest sighting's second) is no change, a new one is."""
    for cert in (HOST, HOST, "other.example.test", "other.example.test", HOST):
        store.record([probe_result(HOST, cert=cert, at=T0)])
    assert [changed for _, _, changed, _ in changes_after(store)] == [
        False, False, True, False, False
    ]
