"""The Trio edge of the store: reads in a thread, one batched writer task
(notary.outbound.writer)."""

from __future__ import annotations

import itertools
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import trio
import trio.testing

from notary.errors import StoreError
from notary.model.observations import ProbeResult, TimelineLimits
from notary.model.targets import Target
from notary.outbound import writer as storage_module
from notary.outbound.writer import open_storage
from notary.state.store import SCHEMA_VERSION, Store
from tests.support.observations import probe_result, store_section

T0 = 1_700_000_000
#: No test waits longer than this on a thread it blocked on purpose.
THREAD_WAIT_S = 10.0


def results(n: int, *, hosts: int = 10) -> list[ProbeResult]:
    return [
        probe_result(f"h{i % hosts}.example.test", cert=f"c{i % 3}.example.test",
                     address=f"192.0.2.{i % 250}", at=T0 + i)
        for i in range(n)
    ]


def count_rows(path: Path) -> tuple[int, int, int]:
    """(targets, certificates, observations) read with a separate connection."""
    db = sqlite3.connect(path)
    try:
        return tuple(  # type: ignore[return-value]
            db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            for table in ("targets", "certificates", "observations")
        )
    finally:
        db.close()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "notary.db"


async def test_everything_queued_is_committed_on_exit(db_path: Path) -> None:
    batch = results(300)
    async with open_storage(db_path, store_section(batch_interval_ms=10_000)) as storage:
        for result in batch:
            await storage.record(result)
        # Nothing has had to be written yet: the block's exit must drain it.
    assert count_rows(db_path) == (10, 3, 30)
    stats = storage.statistics()
    assert stats.committed == 300
    assert stats.queued == 0
    assert stats.failed_batches == 0


async def test_queued_records_are_committed_in_batches(db_path: Path) -> None:
    n = 200
    async with open_storage(db_path, store_section(batch_rows=50, batch_interval_ms=50)) as storage:
        for result in results(n):
            await storage.record(result)
    stats = storage.statistics()
    assert stats.committed == n
    assert 1 <= stats.batches < n
    assert stats.batches >= n // 50
    assert count_rows(db_path)[2] == 30


async def test_batch_rows_bounds_a_batch(db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sizes: list[int] = []
    real = Store.record

    def spy(
        self: Store, batch: Sequence[ProbeResult], origin: str = "",
        probes: Sequence[int] | None = None,
    ) -> None:
        sizes.append(len(batch))
        real(self, batch, origin, probes)

    monkeypatch.setattr(Store, "record", spy)
    settings = store_section(batch_rows=7, batch_interval_ms=10_000)
    async with open_storage(db_path, settings) as storage:
        for result in results(50):
            await storage.record(result)
    assert sum(sizes) == 50
    assert max(sizes) <= 7
    assert storage.statistics().batches == len(sizes)


async def test_a_lone_record_is_flushed_after_the_interval(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    committed = trio.Event()
    real = Store.record

    def record(
        self: Store, batch: Sequence[ProbeResult], origin: str = "",
        probes: Sequence[int] | None = None,
    ) -> None:
        real(self, batch, origin, probes)
        trio.from_thread.run_sync(committed.set)

    monkeypatch.setattr(Store, "record", record)
    async with open_storage(db_path, store_section(batch_interval_ms=20)) as storage:
        await storage.record(probe_result(at=T0))
        with trio.fail_after(THREAD_WAIT_S):
            await committed.wait()
        # Committed while the block still runs: readable now.
        timeline = await storage.load_timeline(Target("www.example.test", 443))
        assert timeline.newest.last_seen == T0
    assert count_rows(db_path) == (1, 1, 1)


async def test_load_timeline_of_an_unknown_target(db_path: Path) -> None:
    async with open_storage(db_path) as storage:
        timeline = await storage.load_timeline(Target("unknown.example.test", 443))
    assert timeline.observations == ()


async def test_producers_wait_when_the_queue_is_full(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    entered = trio.Event()
    real = Store.record

    def slow_record(
        self: Store, batch: Sequence[ProbeResult], origin: str = "",
        probes: Sequence[int] | None = None,
    ) -> None:
        trio.from_thread.run_sync(entered.set)
        assert release.wait(THREAD_WAIT_S), "the test never released the writer"
        real(self, batch, origin, probes)

    monkeypatch.setattr(Store, "record", slow_record)
    batch = results(6)
    sent = 0

    async def produce(storage: storage_module.Storage) -> None:
        nonlocal sent
        for result in batch:
            await storage.record(result)
            sent += 1

    with trio.fail_after(THREAD_WAIT_S):
        settings = store_section(queue_rows=2, batch_rows=1, batch_interval_ms=1)
        async with open_storage(db_path, settings) as storage, trio.open_nursery() as nursery:
            nursery.start_soon(produce, storage)
            # The writer takes one result and blocks in the thread; two more
            # fill the queue; the producer must then wait.
            await entered.wait()
            await trio.testing.wait_all_tasks_blocked()
            stats = storage.statistics()
            release.set()  # before asserting, so a failure does not block the thread
            assert sent == 3
            assert stats.queued == 2
            # One wait, or two if the producer filled the queue before the
            # writer took its first result.
            assert stats.producer_waits in (1, 2)
            assert stats.committed == 0
    stats = storage.statistics()
    assert sent == 6
    assert stats.committed == 6
    assert stats.producer_waits >= 1
    assert count_rows(db_path)[2] == 6


async def test_a_failing_batch_is_retried_until_committed(
    db_path: Path, monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    real = Store.record
    failures = 0
    attempts: list[int] = []

    def flaky_record(
        self: Store, batch: Sequence[ProbeResult], origin: str = "",
        probes: Sequence[int] | None = None,
    ) -> None:
        nonlocal failures
        attempts.append(len(batch))
        if failures < 2:
            failures += 1
            raise StoreError("database is locked")
        real(self, batch, origin, probes)

    monkeypatch.setattr(Store, "record", flaky_record)
    batch = results(20)
    started = trio.current_time()
    async with open_storage(db_path, store_section(batch_rows=100, batch_interval_ms=5)) as storage:
        for result in batch:
            await storage.record(result)
    stats = storage.statistics()
    assert stats.failed_batches == 2
    assert stats.committed == 20
    assert stats.batches == 1
    assert attempts == [20, 20, 20]  # the same batch, kept and retried
    # Back-off: 0.1 s then 0.2 s between the attempts.
    assert trio.current_time() - started >= storage_module.FIRST_RETRY_DELAY_S * 3
    assert count_rows(db_path)[2] == 20


async def test_retry_delay_is_bounded(
    db_path: Path, monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    real = Store.record
    calls: list[float] = []

    def failing_record(
        self: Store, batch: Sequence[ProbeResult], origin: str = "",
        probes: Sequence[int] | None = None,
    ) -> None:
        calls.append(trio.from_thread.run_sync(trio.current_time))
        if len(calls) <= 8:
            raise StoreError("disk full")
        real(self, batch, origin, probes)

    monkeypatch.setattr(Store, "record", failing_record)
    async with open_storage(db_path) as storage:
        await storage.record(probe_result())
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    assert max(gaps) <= storage_module.MAX_RETRY_DELAY_S + 0.5
    assert gaps[-1] >= storage_module.MAX_RETRY_DELAY_S
    assert storage.statistics().failed_batches == 8
    assert count_rows(db_path)[2] == 1


async def test_records_queued_during_a_failure_are_committed(
    db_path: Path, monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    real = Store.record
    failures = 0

    def flaky_record(
        self: Store, batch: Sequence[ProbeResult], origin: str = "",
        probes: Sequence[int] | None = None,
    ) -> None:
        nonlocal failures
        if failures < 3:
            failures += 1
            raise StoreError("database is locked")
        real(self, batch, origin, probes)

    monkeypatch.setattr(Store, "record", flaky_record)
    async with open_storage(db_path, store_section(batch_rows=5, batch_interval_ms=1)) as storage:
        for result in results(40):
            await storage.record(result)
            await trio.sleep(0.01)
    stats = storage.statistics()
    assert stats.committed == 40
    assert stats.failed_batches == 3
    assert count_rows(db_path)[2] == 30


async def test_open_storage_creates_and_migrates(db_path: Path) -> None:
    async with open_storage(db_path):
        pass
    db = sqlite3.connect(db_path)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        db.close()


async def test_open_storage_on_a_corrupt_file_raises_store_error(db_path: Path) -> None:
    await trio.Path(db_path).write_bytes(b"\x13" * 8192)
    with pytest.raises(StoreError):
        async with open_storage(db_path):
            pytest.fail("opened a corrupt database")


async def test_open_storage_with_a_bad_synchronous_mode(db_path: Path) -> None:
    with pytest.raises(StoreError):
        async with open_storage(db_path, store_section(synchronous="sometimes")):
            pytest.fail("opened with a bad synchronous mode")


async def test_a_failed_reader_open_closes_the_writer(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[Store] = []
    closed: list[Store] = []
    real_init, real_close = Store.__init__, Store.close

    def init(self: Store, *args: object, **kwargs: object) -> None:
        if opened:
            raise StoreError("second connection refused")
        real_init(self, *args, **kwargs)
        opened.append(self)

    def close(self: Store) -> None:
        closed.append(self)
        real_close(self)

    monkeypatch.setattr(Store, "__init__", init)
    monkeypatch.setattr(Store, "close", close)
    with pytest.raises(StoreError, match="second connection"):
        async with open_storage(db_path):
            pytest.fail("opened with only one connection")
    assert closed == opened and len(opened) == 1


async def test_connections_are_closed_on_exit(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed: list[Store] = []
    real_close = Store.close

    def close(self: Store) -> None:
        closed.append(self)
        real_close(self)

    monkeypatch.setattr(Store, "close", close)
    async with open_storage(db_path) as storage:
        await storage.record(probe_result())
    assert len(closed) == 2
    assert storage.statistics().committed == 1


async def test_an_error_in_the_block_still_closes_the_connections(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed: list[Store] = []
    real_close = Store.close

    def close(self: Store) -> None:
        closed.append(self)
        real_close(self)

    monkeypatch.setattr(Store, "close", close)
    # The writer's nursery wraps the block's error in an ExceptionGroup.
    with pytest.RaisesGroup(RuntimeError, allow_unwrapped=True, flatten_subgroups=True):
        async with open_storage(db_path):
            raise RuntimeError("boom")
    assert len(closed) == 2


async def test_statistics_start_at_zero(db_path: Path) -> None:
    async with open_storage(db_path) as storage:
        stats = storage.statistics()
        assert (stats.queued, stats.committed, stats.batches, stats.failed_batches,
                stats.producer_waits) == (0, 0, 0, 0, 0)


# -- what is kept: limits, asked-about notes, retention, file modes (issue 17) ---------

DAY = 86400


async def until(condition: Callable[[], bool], *, step_s: float = 0.01) -> None:
    """Return once ``condition()`` holds, checking it every ``step_s`` of
    Trio time: under an autojump clock time jumps while the writer's threads
    work, so a test waits for what they did, not for a time; with ``step_s``
    0 Trio time stands still meanwhile (no timer fires: not the writer's
    batch interval, not the maintenance's). A guard of ``THREAD_WAIT_S`` of
    real time stops a test that would hang."""
    give_up_at = time.monotonic() + THREAD_WAIT_S
    while not condition():
        if time.monotonic() > give_up_at:
            pytest.fail("the condition never held")
        await trio.sleep(step_s)


def asked_at(path: Path) -> dict[str, int]:
    db = sqlite3.connect(path)
    try:
        return dict(db.execute("SELECT host, asked_at FROM targets"))
    finally:
        db.close()


async def test_the_writer_keeps_each_target_within_the_limits(db_path: Path) -> None:
    async with open_storage(db_path, store_section(max_certificates_per_target=2)) as storage:
        for i in range(5):
            await storage.record(probe_result(cert=f"c{i}.example.test", at=T0 + i))
    assert count_rows(db_path) == (1, 2, 2)


async def test_rows_kept_under_looser_limits_are_swept_at_start(db_path: Path) -> None:
    with Store(db_path) as store:
        store.record([probe_result(cert=f"c{i}.example.test", at=T0 + i) for i in range(5)])
    limits = TimelineLimits(max_certificates_per_target=2)
    def swept() -> bool:
        with Store(db_path, create=False, limits=limits) as store:
            return store.limits_enforced()

    async with open_storage(db_path, store_section(max_certificates_per_target=2)) as storage:
        await storage.record(probe_result(cert="c8.example.test", at=T0 + 8))
        await until(swept)
        assert count_rows(db_path)[2] == 2
        # Batches go on after.
        await storage.record(probe_result(cert="c9.example.test", at=T0 + 9))
    assert count_rows(db_path) == (1, 2, 2)


async def test_targets_asked_about_are_written_in_periodic_batches(
    db_path: Path, autojump_clock: trio.testing.MockClock,
) -> None:
    now = T0 + 5 * DAY
    async with open_storage(db_path, clock=lambda: now) as storage:
        await storage.record(probe_result(at=T0))
        await storage.record(probe_result("other.example.test", at=T0))
        await until(lambda: storage.statistics().committed == 2)
        assert asked_at(db_path) == {"www.example.test": T0, "other.example.test": T0}
        for _ in range(1000):  # one note per target, whatever the queries
            storage.note_asked(Target("www.example.test", 443))
        storage.note_asked(Target("never-observed.example.test", 443))
        assert storage.statistics().asked_queued == 2
        await until(lambda: asked_at(db_path)["www.example.test"] == now, step_s=1)
        assert storage.statistics().asked_queued == 0
    assert asked_at(db_path) == {"www.example.test": now, "other.example.test": T0}


async def test_a_clean_stop_writes_the_last_notes(db_path: Path) -> None:
    async with open_storage(db_path, clock=lambda: T0 + 7) as storage:
        await storage.record(probe_result(at=T0))
        storage.note_asked(Target("www.example.test", 443))
    assert asked_at(db_path) == {"www.example.test": T0 + 7}


async def test_notes_are_bounded_and_a_full_set_is_written_at_once(
    db_path: Path, monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock,
) -> None:
    monkeypatch.setattr(storage_module, "MAX_ASKED_NOTES", 2)
    async with open_storage(db_path, clock=lambda: T0 + 7) as storage:
        await storage.record(probe_result(at=T0))
        await until(lambda: storage.statistics().committed == 1)
        for name in ("www", "a", "b", "c"):
            storage.note_asked(Target(f"{name}.example.test", 443))
        stats = storage.statistics()
        assert (stats.asked_queued, stats.asked_dropped) == (2, 2)
        # Written while Trio time stands still: the full set brought the flush forward.
        await until(lambda: asked_at(db_path)["www.example.test"] == T0 + 7, step_s=0)


async def test_notes_that_fail_to_be_written_are_kept_for_the_next_flush(
    db_path: Path, monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock,
) -> None:
    real = Store.note_asked
    calls: list[int] = []

    def failing_once(self: Store, targets: list, at: int) -> int:
        calls.append(len(targets))
        if len(calls) == 1:
            raise StoreError("database is locked")
        return real(self, targets, at)

    monkeypatch.setattr(Store, "note_asked", failing_once)
    async with open_storage(db_path, clock=lambda: T0 + 7) as storage:
        await storage.record(probe_result(at=T0))
        await until(lambda: storage.statistics().committed == 1)
        storage.note_asked(Target("www.example.test", 443))
        await until(lambda: len(calls) == 2 and storage.statistics().asked_queued == 0,
                    step_s=1)
    assert calls[:2] == [1, 1]
    assert asked_at(db_path) == {"www.example.test": T0 + 7}


async def test_targets_nobody_asked_about_are_pruned_periodically(
    db_path: Path, autojump_clock: trio.testing.MockClock,
) -> None:
    now = T0 + 90 * DAY
    settings = store_section(forget_unasked_after_s=60 * DAY)
    async with open_storage(db_path, settings, clock=lambda: now) as storage:
        await storage.record(probe_result("asked.example.test", at=T0))
        await storage.record(probe_result("forgotten.example.test", at=T0))
        await until(lambda: storage.statistics().committed == 2)
        storage.note_asked(Target("asked.example.test", 443))
        await until(lambda: storage.statistics().pruned_targets > 0, step_s=1)
        assert storage.statistics().pruned_targets == 1
        timeline = await storage.load_timeline(Target("asked.example.test", 443))
        assert timeline.newest is not None
    assert list(asked_at(db_path)) == ["asked.example.test"]


async def test_without_a_retention_nothing_is_pruned(
    db_path: Path, autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_storage(db_path, clock=lambda: T0 + 900 * DAY) as storage:
        await storage.record(probe_result(at=T0))
        await until(lambda: storage.statistics().committed == 1)
        await trio.sleep(3 * storage_module.PRUNE_INTERVAL_S)
        assert storage.statistics().pruned_targets == 0
    assert count_rows(db_path) == (1, 1, 1)


async def test_start_up_creates_the_files_owner_only_and_fixes_existing_ones(
    db_path: Path,
) -> None:
    previous = os.umask(0o022)
    try:
        async with open_storage(db_path) as storage:
            await storage.record(probe_result(at=T0))
            assert stat.S_IMODE(os.stat(db_path).st_mode) == 0o600
        os.chmod(db_path, 0o644)
        async with open_storage(db_path, file_mode=0o640) as storage:
            await storage.record(probe_result(at=T0 + 1))
            for suffix in ("", "-wal", "-shm"):
                assert stat.S_IMODE(os.stat(f"{db_path}{suffix}").st_mode) == 0o640
    finally:
        os.umask(previous)
