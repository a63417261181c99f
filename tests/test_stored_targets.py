"""The stored-targets bloom filter (notary.service.stored_targets) and its use on
the query path: a target never seen costs no database read."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio

from notary.errors import StoreError
from notary.model.targets import Target
from notary.outbound.writer import Storage, open_storage
from notary.server.app import store_observed_age
from notary.service import stored_targets as stored_module
from notary.service.stored_targets import StoredTargets
from notary.state.store import Store
from tests.support.notaries import legacy_query, open_notary
from tests.support.observations import probe_result
from tests.support.tls_targets import open_tls_target


def stored_hosts(path: Path, hosts: list[str]) -> None:
    with Store(path) as store:
        store.record([probe_result(host) for host in hosts])


def test_store_streams_target_keys_in_chunks(tmp_path: Path) -> None:
    path = tmp_path / "n.db"
    hosts = [f"h{i}.example.test" for i in range(25)]
    with Store(path) as store:
        store.record([probe_result(h) for h in hosts] + [probe_result("::1", 8443)])
        chunks = list(store.iter_target_keys(chunk_rows=10))
    assert [len(c) for c in chunks] == [10, 10, 6]
    keys = {k for chunk in chunks for k in chunk}
    assert keys == {Target(h, 443).key for h in hosts} | {"[::1]:8443"}


async def test_unloaded_filter_answers_maybe_then_loads_everything(tmp_path: Path) -> None:
    path = tmp_path / "n.db"
    hosts = [f"s{i}.example.test" for i in range(200)]
    stored_hosts(path, hosts)
    stored = StoredTargets(1000, 0.001)
    assert stored.may_contain("never.example.test:443")  # not loaded: read the store
    stored.add("during.example.test:443")  # a probe during the load
    async with open_storage(path) as storage:
        await stored.load(storage)
    statistics = stored.statistics()
    assert statistics.loaded and statistics.keys_loaded == 200
    for host in hosts:
        assert stored.may_contain(Target(host, 443).key)  # no false negative
    assert stored.may_contain("during.example.test:443")
    unknown = [f"u{i}.example.test:443" for i in range(2000)]
    skipped = sum(not stored.may_contain(key) for key in unknown)
    assert skipped >= 1900  # at 0.1% a handful of false positives at most
    assert stored.statistics().skipped_reads == skipped
    stored.add("late.example.test:443")
    assert stored.may_contain("late.example.test:443")


async def test_a_failed_load_leaves_every_lookup_reading_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(self: Storage, consume: object) -> int:
        raise StoreError("database n.db: disk I/O error")

    monkeypatch.setattr(Storage, "scan_target_keys", broken)
    stored = StoredTargets(1000, 0.01)
    async with open_storage(tmp_path / "n.db") as storage:
        await stored.load(storage)
    assert not stored.statistics().loaded
    assert stored.may_contain("anything.example.test:443")
    assert "disk I/O error" in caplog.text


async def test_progress_is_logged_for_large_stores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(stored_module, "PROGRESS_EVERY_KEYS", 10)
    path = tmp_path / "n.db"
    stored_hosts(path, [f"s{i}.example.test" for i in range(25)])
    stored = StoredTargets(10, 0.01)  # fewer than stored: a warning too
    async with open_storage(path) as storage:
        await stored.load(storage)
    assert "25 loaded from the store in" in caplog.text
    assert "exceed [cache] bloom_expected_items" in caplog.text


def test_bad_parameters_fail_at_construction() -> None:
    with pytest.raises(ValueError, match="false_positive_rate"):
        StoredTargets(1000, 1.5)
    with pytest.raises(ValueError, match="expected_items"):
        StoredTargets(0, 0.01)


async def test_query_for_a_never_seen_target_reads_no_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[Target] = []
    original = Storage.load_timeline

    async def counting(self: Storage, target: Target) -> object:
        reads.append(target)
        return await original(self, target)

    monkeypatch.setattr(Storage, "load_timeline", counting)
    async with open_tls_target(names=["new.example.test", "old.example.test"]) as site:
        names = {"new.example.test": [site.host], "old.example.test": [site.host]}
        # A previous run stored old.example.test.
        (tmp_path / "n").mkdir()
        with Store(tmp_path / "n" / "notary.db") as store:
            store.record([probe_result("old.example.test", site.port)])
        async with open_notary(tmp_path / "n", names=names) as notary:
            stored = notary.running.stored
            with trio.fail_after(10):
                while not stored.statistics().loaded:  # noqa: ASYNC110 (background load, no event)
                    await trio.sleep(0.01)
            new = await legacy_query(notary.port, f"new.example.test+{site.port}", None)
            assert new.status == 200
            # The probe's hook merged the result without a read either.
            assert reads == []
            assert stored.statistics().skipped_reads == 2  # the query and the hook
            old = await legacy_query(notary.port, f"old.example.test+{site.port}", None)
            assert old.status == 200
            assert reads == [Target("old.example.test", site.port)]


async def test_workers_sharing_a_store_answer_from_each_others_observations(
    tmp_path: Path,
) -> None:
    """Two workers of a node share the database, each with its filter: the
    change feed tells each of the targets the other stored, so a target one
    of them probed is answered by the other from the store, not probed
    again."""
    db = tmp_path / "shared.db"
    site_name = "shared.example.test"
    async with open_tls_target(names=[site_name]) as site:
        names = {site_name: [site.host]}
        path = f"{site_name}+{site.port}"
        key = Target(site_name, site.port).key

        def handshakes() -> int:
            return site.handshakes_completed + site.handshakes_failed

        async with (
            open_notary(tmp_path / "a", names=names, server={"db_file": db},
                        shared_store=True) as first,
            open_notary(tmp_path / "b", names=names, server={"db_file": db},
                        shared_store=True) as second,
        ):
            with trio.fail_after(10):
                while not second.running.stored.statistics().loaded:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            assert not second.running.stored.may_contain(key)
            assert (await legacy_query(first.port, path, None)).status == 200
            assert handshakes() == 1
            with trio.fail_after(10):  # committed, then read from the feed
                while not second.running.stored.may_contain(key):  # noqa: ASYNC110
                    await trio.sleep(0.01)
            answer = await legacy_query(second.port, path, None)
            assert answer.status == 200
            assert handshakes() == 1  # answered from the first worker's observation


async def test_a_workers_scheduler_reads_the_age_of_the_newest_observation(
    tmp_path: Path,
) -> None:
    """What a worker's rescan scheduler asks the shared store before a
    rescan (its rule 11): seconds since the newest observation, or None."""
    path = tmp_path / "n.db"
    with Store(path) as store:
        store.record([probe_result("seen.example.test", at=1_700_000_000),
                      probe_result("seen.example.test", cert="other.example.test",
                                   at=1_700_000_040)])
    async with open_storage(path) as storage:
        observed_age = store_observed_age(storage, lambda: 1_700_000_100.0)
        assert await observed_age(Target("seen.example.test", 443)) == 60.0
        assert await observed_age(Target("never.example.test", 443)) is None
    unfiltered = StoredTargets(1000, 0.001)
    unfiltered.switch_off()
    unfiltered.add("a.example.test:443")
    assert unfiltered.settled.is_set() and unfiltered.may_contain("b.example.test:443")
    assert not unfiltered.statistics().loaded


async def test_a_filter_switched_off_after_or_during_its_load_is_not_used(
    tmp_path: Path,
) -> None:
    """Rule 4: a process that fell behind the change feed may lack keys;
    its filter goes, whether it had loaded or was still loading."""
    path = tmp_path / "n.db"
    stored_hosts(path, ["a.example.test"])
    loaded, loading = StoredTargets(1000, 0.001), StoredTargets(1000, 0.001)
    async with open_storage(path) as storage:
        await loaded.load(storage)
        assert not loaded.may_contain("b.example.test:443")
        loaded.switch_off()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(loading.load, storage)
            loading.switch_off()  # before the scan ends
    for stored in (loaded, loading):
        assert stored.may_contain("b.example.test:443")  # read the store
        assert not stored.statistics().loaded
