"""The Trio edge of the store: reads in a thread, one batched writer task
(notary.server.storage)."""

from __future__ import annotations

import itertools
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
import trio
import trio.testing

from notary.errors import StoreError
from notary.observations import ProbeResult
from notary.protocol.targets import Target
from notary.server import storage as storage_module
from notary.server.storage import open_storage
from notary.store import SCHEMA_VERSION, Store
from tests.support.observations import probe_result

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
    async with open_storage(db_path, batch_interval_ms=10_000) as storage:
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
    async with open_storage(db_path, batch_rows=50, batch_interval_ms=50) as storage:
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

    def spy(self: Store, batch: Sequence[ProbeResult]) -> None:
        sizes.append(len(batch))
        real(self, batch)

    monkeypatch.setattr(Store, "record", spy)
    async with open_storage(db_path, batch_rows=7, batch_interval_ms=10_000) as storage:
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

    def record(self: Store, batch: Sequence[ProbeResult]) -> None:
        real(self, batch)
        trio.from_thread.run_sync(committed.set)

    monkeypatch.setattr(Store, "record", record)
    async with open_storage(db_path, batch_interval_ms=20) as storage:
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

    def slow_record(self: Store, batch: Sequence[ProbeResult]) -> None:
        trio.from_thread.run_sync(entered.set)
        assert release.wait(THREAD_WAIT_S), "the test never released the writer"
        real(self, batch)

    monkeypatch.setattr(Store, "record", slow_record)
    batch = results(6)
    sent = 0

    async def produce(storage: storage_module.Storage) -> None:
        nonlocal sent
        for result in batch:
            await storage.record(result)
            sent += 1

    with trio.fail_after(THREAD_WAIT_S):
        async with open_storage(
            db_path, queue_rows=2, batch_rows=1, batch_interval_ms=1
        ) as storage, trio.open_nursery() as nursery:
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

    def flaky_record(self: Store, batch: Sequence[ProbeResult]) -> None:
        nonlocal failures
        attempts.append(len(batch))
        if failures < 2:
            failures += 1
            raise StoreError("database is locked")
        real(self, batch)

    monkeypatch.setattr(Store, "record", flaky_record)
    batch = results(20)
    started = trio.current_time()
    async with open_storage(db_path, batch_rows=100, batch_interval_ms=5) as storage:
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

    def failing_record(self: Store, batch: Sequence[ProbeResult]) -> None:
        calls.append(trio.from_thread.run_sync(trio.current_time))
        if len(calls) <= 8:
            raise StoreError("disk full")
        real(self, batch)

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

    def flaky_record(self: Store, batch: Sequence[ProbeResult]) -> None:
        nonlocal failures
        if failures < 3:
            failures += 1
            raise StoreError("database is locked")
        real(self, batch)

    monkeypatch.setattr(Store, "record", flaky_record)
    async with open_storage(db_path, batch_rows=5, batch_interval_ms=1) as storage:
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
        async with open_storage(db_path, synchronous="sometimes"):
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
