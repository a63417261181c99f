"""The synchronous SQLite observation store (notary.state.store)."""

from __future__ import annotations

import itertools
import multiprocessing
import multiprocessing.synchronize
import os
import random
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from notary.errors import StoreError
from notary.model.observations import MAX_ADDRESSES_PER_OBSERVATION, Timeline
from notary.model.targets import Target
from notary.state.store import MAX_ADDRESSES, MIGRATIONS, SCHEMA_VERSION, Store
from tests.support.engines import Engine
from tests.support.migrations import DOWNGRADE_TO_3
from tests.support.observations import certificate, probe_result

T0 = 1_700_000_000
WWW = Target("www.example.test", 443)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "notary.db"


@pytest.fixture
def store(engine: Engine) -> Iterator[Store]:
    """A store of each engine (``tests.support.engines``)."""
    with engine.observations() as store:
        yield store


def summary(timeline: Timeline) -> list[tuple[bytes, int, int, tuple[str, ...]]]:
    return [(o.certificate.sha256, o.first_seen, o.last_seen, o.addresses)
            for o in timeline.observations]


# -- opening, schema, migrations -------------------------------------------------


def test_fresh_database_has_the_schema_and_wal(db_path: Path) -> None:
    assert len(MIGRATIONS) == SCHEMA_VERSION  # a new version adds a migration to each engine
    with Store(db_path) as store:
        assert store.schema_version() == SCHEMA_VERSION
    db = sqlite3.connect(db_path)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"certificates", "targets", "observations"} <= tables
    finally:
        db.close()


def test_reopen_is_idempotent(db_path: Path) -> None:
    with Store(db_path) as store:
        store.record([probe_result()])
    with Store(db_path) as store:
        assert store.migrate() == 0
        assert store.schema_version() == SCHEMA_VERSION
        assert len(store.load_timeline(WWW).observations) == 1
    with Store(db_path, create=False) as store:
        assert store.migrate() == 0


def test_migrate_on_an_empty_file_runs_every_migration(db_path: Path) -> None:
    db_path.write_bytes(b"")
    with Store(db_path, create=False) as store:
        assert store.schema_version() == SCHEMA_VERSION


def _open_at_once(path: str, barrier: multiprocessing.synchronize.Barrier) -> None:
    barrier.wait()
    Store(path).close()  # raises (exit status 1) if another process's migration got in


def test_workers_opening_a_fresh_file_at_once_each_migrate_it_once(db_path: Path) -> None:
    """The workers of a node open the same new database at the same moment:
    each migration step runs once, whoever takes the write lock first; the
    others see the schema it left and open it (none exits on 'table already
    exists')."""
    context = multiprocessing.get_context("spawn")
    for _ in range(3):
        db_path.unlink(missing_ok=True)
        barrier = context.Barrier(4)
        openers = [context.Process(target=_open_at_once, args=(str(db_path), barrier))
                   for _ in range(4)]
        for opener in openers:
            opener.start()
        for opener in openers:
            opener.join(60)
        assert [opener.exitcode for opener in openers] == [0, 0, 0, 0]
        with Store(db_path) as store:
            assert store.schema_version() == SCHEMA_VERSION


def test_newer_schema_is_refused(db_path: Path) -> None:
    Store(db_path).close()
    db = sqlite3.connect(db_path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="newer"):
        Store(db_path)


def test_failed_open_leaves_no_connection_behind(db_path: Path) -> None:
    """A refused database is closed again: no -wal/-shm files stay behind."""
    Store(db_path).close()
    db = sqlite3.connect(db_path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    with pytest.raises(StoreError):
        Store(db_path)
    assert sorted(p.name for p in db_path.parent.iterdir()) == [db_path.name]


def test_missing_file_without_create(db_path: Path) -> None:
    with pytest.raises(StoreError, match="does not exist"):
        Store(db_path, create=False)
    assert not db_path.exists()


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(StoreError):
        Store(tmp_path / "no" / "such" / "dir" / "notary.db")


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(StoreError):
        Store(tmp_path)


@pytest.mark.parametrize("synchronous", ["bogus", "NORMAL; DROP TABLE targets", ""])
def test_bad_synchronous_mode(db_path: Path, synchronous: str) -> None:
    with pytest.raises(StoreError, match="synchronous"):
        Store(db_path, synchronous=synchronous)
    assert not db_path.exists()


@pytest.mark.parametrize("synchronous", ["off", "NORMAL", "Full", "EXTRA"])
def test_synchronous_modes(db_path: Path, synchronous: str) -> None:
    with Store(db_path, synchronous=synchronous) as store:
        level = store._db.execute("PRAGMA synchronous").fetchone()[0]
    assert level == {"OFF": 0, "NORMAL": 1, "FULL": 2, "EXTRA": 3}[synchronous.upper()]


@pytest.mark.parametrize("seed", range(5))
def test_corrupt_file_is_a_store_error(db_path: Path, seed: int) -> None:
    db_path.write_bytes(random.Random(seed).randbytes(4096 * (seed + 1)))
    with pytest.raises(StoreError):
        Store(db_path)
    with pytest.raises(StoreError):
        Store(db_path, create=False)


def test_text_file_is_a_store_error(db_path: Path) -> None:
    db_path.write_text("[server]\nkey_file = 'x'\n" * 100)
    with pytest.raises(StoreError, match="not a database"):
        Store(db_path)


def test_sqlite_header_with_garbage_is_a_store_error(db_path: Path) -> None:
    db_path.write_bytes(b"SQLite format 3\x00" + random.Random(1).randbytes(8000))
    with pytest.raises(StoreError):
        Store(db_path)


def test_database_damaged_after_open_gives_store_errors(db_path: Path) -> None:
    with Store(db_path) as store:
        store.record([probe_result(host=f"h{i}.example.test", cert="c") for i in range(50)])
    # Overwrite every page after the first (the header stays valid).
    size = db_path.stat().st_size
    with db_path.open("r+b") as f:
        f.seek(4096)
        f.write(random.Random(7).randbytes(size - 4096))
    try:
        store = Store(db_path)
    except StoreError:
        return  # refused at open: also fine
    operations = [
        lambda: store.load_timeline(Target("h1.example.test", 443)),
        lambda: store.record([probe_result(host="new.example.test")]),
        store.statistics,
    ]
    failures = 0
    with store:
        for operation in operations:
            try:
                operation()
            except StoreError:
                failures += 1
    assert failures  # and nothing but StoreError escaped


def test_half_migrated_database_is_a_store_error(db_path: Path) -> None:
    db = sqlite3.connect(db_path)
    db.execute("CREATE TABLE targets (x)")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="targets"):
        Store(db_path)


def test_use_after_close_is_a_store_error(db_path: Path) -> None:
    store = Store(db_path)
    store.close()
    with pytest.raises(StoreError):
        store.load_timeline(WWW)
    with pytest.raises(StoreError):
        store.record([probe_result()])
    with pytest.raises(StoreError):
        store.statistics()


# -- record and load_timeline ----------------------------------------------------


def test_unknown_target_has_an_empty_timeline(store: Store) -> None:
    timeline = store.load_timeline(WWW)
    assert timeline == Timeline(WWW, ())
    assert timeline.newest is None


def test_record_then_load_round_trips(store: Store) -> None:
    result = probe_result(address="2001:db8::1", at=T0)
    store.record([result])
    timeline = store.load_timeline(WWW)
    assert timeline.target == WWW
    [observation] = timeline.observations
    assert observation.certificate == result.leaf
    assert observation.certificate == certificate("www.example.test")
    assert (observation.first_seen, observation.last_seen) == (T0, T0)
    assert observation.addresses == ("2001:db8::1",)
    assert timeline.find_sha1(result.leaf.sha1) == observation


def test_empty_record_is_a_no_op(store: Store) -> None:
    store.record([])
    assert store.statistics().observations == 0


def test_record_matches_the_in_memory_merge(store: Store) -> None:
    results = [
        probe_result(at=T0, address="192.0.2.1"),
        probe_result(at=T0 + 10, address="192.0.2.2"),
        probe_result(cert="rotated.example.test", at=T0 + 20, address="192.0.2.1"),
        probe_result(at=T0 + 5, address="192.0.2.1"),
    ]
    expected = Timeline(WWW)
    for result in results:
        store.record([result])
        expected = expected.merged(result)
    assert store.load_timeline(WWW) == expected


def test_seeing_a_certificate_again_widens_its_observation(store: Store) -> None:
    store.record([probe_result(at=T0)])
    store.record([probe_result(at=T0 + 100)])
    store.record([probe_result(at=T0 - 50)])
    store.record([probe_result(at=T0 + 20)])
    [observation] = store.load_timeline(WWW).observations
    assert (observation.first_seen, observation.last_seen) == (T0 - 50, T0 + 100)
    assert store.statistics().observations == 1
    assert store.statistics().certificates == 1


def test_addresses_newest_first_without_duplicates(store: Store) -> None:
    for i, address in enumerate(["192.0.2.1", "192.0.2.2", "2001:db8::1", "192.0.2.1"]):
        store.record([probe_result(address=address, at=T0 + i)])
    [observation] = store.load_timeline(WWW).observations
    assert observation.addresses == ("192.0.2.1", "2001:db8::1", "192.0.2.2")


def test_addresses_are_bounded(store: Store) -> None:
    assert MAX_ADDRESSES == MAX_ADDRESSES_PER_OBSERVATION
    addresses = [f"192.0.2.{i}" for i in range(MAX_ADDRESSES + 5)]
    for i, address in enumerate(addresses):
        store.record([probe_result(address=address, at=T0 + i)])
    [observation] = store.load_timeline(WWW).observations
    assert observation.addresses == tuple(reversed(addresses))[:MAX_ADDRESSES]


def test_a_rotated_certificate_starts_a_new_observation(store: Store) -> None:
    store.record([probe_result(at=T0)])
    store.record([probe_result(cert="new.example.test", at=T0 + 100)])
    timeline = store.load_timeline(WWW)
    assert [o.certificate for o in timeline.observations] == [
        certificate("new.example.test"),
        certificate("www.example.test"),
    ]
    assert timeline.newest.last_seen == T0 + 100


def test_targets_are_kept_apart(store: Store) -> None:
    shared = "shared.example.test"
    store.record([
        probe_result("a.example.test", 443, cert=shared, at=T0),
        probe_result("a.example.test", 8443, cert=shared, at=T0 + 1),
        probe_result("b.example.test", 443, cert=shared, at=T0 + 2),
    ])
    stats = store.statistics()
    assert (stats.targets, stats.certificates, stats.observations) == (3, 1, 3)
    assert store.load_timeline(Target("a.example.test", 8443)).newest.last_seen == T0 + 1
    assert store.load_timeline(Target("b.example.test", 443)).newest.first_seen == T0 + 2
    assert store.load_timeline(Target("c.example.test", 443)).observations == ()


def test_ipv6_target(store: Store) -> None:
    target = Target("2001:db8::1", 443)
    store.record([probe_result("2001:db8::1", cert="v6.example.test", address="2001:db8::1")])
    assert len(store.load_timeline(target).observations) == 1


def test_batch_is_one_transaction(store: Store) -> None:
    if not isinstance(store, Store):
        pytest.skip("a SQLite trigger makes the batch fail")
    """A batch that fails part-way (its targets and certificates inserted,
    their ids learnt) leaves nothing behind, not even in the store's memo of
    row ids (the retry below would break on a stale id)."""
    store._db.execute(
        "CREATE TEMP TRIGGER failing BEFORE INSERT ON main.observations"
        " BEGIN SELECT RAISE(ABORT, 'disk I/O error'); END"
    )
    batch = [probe_result(at=T0), probe_result(host="b.example.test", at=T0)]
    with pytest.raises(StoreError, match="disk I/O error"):
        store.record(batch)
    stats = store.statistics()
    assert (stats.targets, stats.certificates, stats.observations) == (0, 0, 0)
    # SQLite would hand out the same row ids again, so check the memo itself.
    assert not store._target_ids and not store._certificate_ids
    store._db.execute("DROP TRIGGER failing")
    store.record(batch)  # the store is usable afterwards: no transaction left open
    assert store.statistics().observations == 2


def test_retrying_a_committed_batch_changes_nothing(store: Store) -> None:
    batch = [probe_result(at=T0, address="192.0.2.1"), probe_result(at=T0 + 5, address="192.0.2.2")]
    store.record(batch)
    before = store.load_timeline(WWW)
    store.record(batch)
    assert store.load_timeline(WWW) == before


def test_one_batch_equals_the_same_results_one_by_one(tmp_path: Path) -> None:
    results = [probe_result(at=T0 + i, address=f"192.0.2.{i % 3}") for i in range(10)]
    results += [probe_result(cert="other.example.test", at=T0 + 3)]
    with Store(tmp_path / "a.db") as a, Store(tmp_path / "b.db") as b:
        a.record(results)
        for result in results:
            b.record([result])
        assert a.load_timeline(WWW) == b.load_timeline(WWW)


def test_a_second_connection_sees_committed_rows(db_path: Path) -> None:
    with Store(db_path) as writer, Store(db_path) as reader:
        writer.record([probe_result()])
        assert len(reader.load_timeline(WWW).observations) == 1


# -- commutativity ---------------------------------------------------------------

_HOSTS = ["a.example.test", "b.example.test"]
_CERTS = ["c1.example.test", "c2.example.test", "c3.example.test"]
_ADDRESSES = ["192.0.2.1", "192.0.2.2", "2001:db8::1"]

results_strategy = st.lists(
    st.builds(
        lambda host, cert, address, dt: probe_result(host, cert=cert, address=address, at=T0 + dt),
        st.sampled_from(_HOSTS),
        st.sampled_from(_CERTS),
        st.sampled_from(_ADDRESSES),
        st.integers(0, 10_000),
    ),
    min_size=1,
    max_size=12,
)


def _timelines(path: Path, batches: list[list]) -> dict[str, set]:
    with Store(path) as store:
        for batch in batches:
            store.record(batch)
        return {
            host: {(o.certificate.sha256, o.first_seen, o.last_seen, frozenset(o.addresses))
                   for o in store.load_timeline(Target(host, 443)).observations}
            for host in _HOSTS
        }


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(results_strategy, st.randoms(use_true_random=False), st.integers(1, 4))
def test_record_order_and_batching_do_not_matter(
    tmp_path: Path, results: list, rnd: random.Random, batch_size: int
) -> None:
    """Certificates, first/last seen and the set of addresses do not depend on
    the order or batching of the results (addresses here stay under the
    bound, see the xfail below for their order)."""
    shuffled = list(results)
    rnd.shuffle(shuffled)
    batches = [shuffled[i : i + batch_size] for i in range(0, len(shuffled), batch_size)]
    with tempfile.TemporaryDirectory(dir=tmp_path) as name:
        directory = Path(name)
        assert _timelines(directory / "a.db", [results]) == _timelines(directory / "b.db", batches)


def test_every_permutation_of_a_small_batch_gives_the_same_times(tmp_path: Path) -> None:
    results = [
        probe_result(at=T0 + 30, address="192.0.2.1"),
        probe_result(at=T0, address="192.0.2.1"),
        probe_result(cert="c2.example.test", at=T0 + 10, address="192.0.2.2"),
        probe_result(at=T0 + 20, address="192.0.2.1"),
    ]
    seen = set()
    for i, permutation in enumerate(itertools.permutations(results)):
        with Store(tmp_path / f"{i}.db") as store:
            store.record(list(permutation))
            seen.add(tuple(summary(store.load_timeline(WWW))))
    assert len(seen) == 1


@pytest.mark.xfail(
    strict=True,
    reason="addresses are ordered by recording order, not by observed_at: a retried "
    "older batch (or any permutation) puts its address first, so record() is not "
    "commutative for Observation.addresses (and, past MAX_ADDRESSES, not even for the "
    "set kept); fixing it needs a per-address last-seen time in the schema",
)
def test_permutations_give_identical_timelines_including_addresses(tmp_path: Path) -> None:
    older = probe_result(at=T0, address="192.0.2.1")
    newer = probe_result(at=T0 + 100, address="192.0.2.2")
    with Store(tmp_path / "a.db") as a, Store(tmp_path / "b.db") as b:
        a.record([older, newer])
        b.record([newer])
        b.record([older])  # e.g. an older batch retried after a newer one committed
        assert a.load_timeline(WWW) == b.load_timeline(WWW)


def test_permutations_with_equal_times_give_identical_timelines(tmp_path: Path) -> None:
    one = probe_result(cert="c1.example.test", at=T0)
    two = probe_result(cert="c2.example.test", at=T0)
    with Store(tmp_path / "a.db") as a, Store(tmp_path / "b.db") as b:
        a.record([one, two])
        b.record([two, one])
        assert a.load_timeline(WWW) == b.load_timeline(WWW)


# -- statistics ------------------------------------------------------------------


def test_statistics_of_an_empty_store(store: Store, db_path: Path) -> None:
    stats = store.statistics()
    assert stats.schema_version == SCHEMA_VERSION
    assert (stats.targets, stats.certificates, stats.observations) == (0, 0, 0)
    if isinstance(store, Store):
        assert stats.file_bytes >= db_path.stat().st_size > 0
    else:
        assert stats.file_bytes > 0  # the database's size


def test_statistics_count_rows(store: Store, db_path: Path) -> None:
    store.record([
        probe_result("a.example.test", at=T0),
        probe_result("a.example.test", cert="b.example.test", at=T0 + 1),
        probe_result("b.example.test", at=T0 + 2),
        probe_result("b.example.test", at=T0 + 3),
    ])
    stats = store.statistics()
    assert (stats.targets, stats.certificates, stats.observations) == (2, 2, 3)
    if not isinstance(store, Store):
        return  # the database's size is PostgreSQL's
    wal = Path(f"{db_path}-wal")
    on_disk = db_path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
    assert stats.file_bytes == on_disk


def test_file_survives_a_crash_without_close(db_path: Path) -> None:
    """Committed rows are in the file even if the process never closes it."""
    store = Store(db_path)
    store.record([probe_result()])
    other = sqlite3.connect(db_path)
    try:
        assert other.execute("SELECT count(*) FROM observations").fetchone()[0] == 1
    finally:
        other.close()
        store.close()


def test_database_file_is_not_world_writable(db_path: Path) -> None:
    Store(db_path).close()
    assert not os.stat(db_path).st_mode & 0o002


# -- runs of sightings (the Perspectives history) -----------------------------------------

HOUR = 3600


def test_runs_split_on_gaps_longer_than_the_window(tmp_path: Path) -> None:
    with Store(tmp_path / "n.db", merge_window_s=48 * HOUR) as store:
        store.record([probe_result(at=T0 + h * HOUR) for h in (0, 47, 47 + 49, 200)])
        (observation,) = store.load_timeline(WWW).observations
    assert observation.runs == (
        (T0, T0 + 47 * HOUR), (T0 + 96 * HOUR, T0 + 96 * HOUR), (T0 + 200 * HOUR, T0 + 200 * HOUR)
    )
    assert (observation.first_seen, observation.last_seen) == (T0, T0 + 200 * HOUR)


def test_a_late_sighting_joins_runs_it_bridges(tmp_path: Path) -> None:
    with Store(tmp_path / "n.db", merge_window_s=10) as store:
        store.record([probe_result(at=T0), probe_result(at=T0 + 30)])
        assert store.load_timeline(WWW).observations[0].runs == ((T0, T0), (T0 + 30, T0 + 30))
        store.record([probe_result(at=T0 + 15)])  # 15 s from both: a run of its own
        assert len(store.load_timeline(WWW).observations[0].runs) == 3
        store.record([probe_result(at=T0 + 8), probe_result(at=T0 + 22)])
        assert store.load_timeline(WWW).observations[0].runs == ((T0, T0 + 30),)


@given(st.lists(st.integers(0, 500), min_size=1, max_size=25), st.randoms(use_true_random=False))
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_runs_do_not_depend_on_arrival_order(
    tmp_path: Path, times: list[int], rnd: random.Random
) -> None:
    """The store's runs equal the model (sorted sightings split on gaps longer
    than the window), whatever the order and batching, and equal the
    in-memory merge."""
    window = 40
    model: list[list[int]] = []
    for t in sorted(times):
        if model and t - model[-1][1] <= window:
            model[-1][1] = t
        else:
            model.append([t, t])
    shuffled = list(times)
    rnd.shuffle(shuffled)
    with tempfile.TemporaryDirectory(dir=tmp_path) as name, Store(
        Path(name) / "runs.db", merge_window_s=window
    ) as store:
        for i in range(0, len(shuffled), 3):
            store.record([probe_result(at=T0 + t) for t in shuffled[i:i + 3]])
        runs = store.load_timeline(WWW).observations[0].runs
    assert runs == tuple((T0 + a, T0 + b) for a, b in model)
    timeline = Timeline(WWW)
    for t in shuffled:
        timeline = timeline.merged(probe_result(at=T0 + t), window)
    assert timeline.observations[0].runs == runs


def test_migration_keeps_history_recorded_before_runs(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    db = sqlite3.connect(path)
    db.executescript(MIGRATIONS[0])
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    with Store(path, create=False) as store:  # migrates to the current schema
        assert store.schema_version() == SCHEMA_VERSION
    # A v1 database with rows: each observation becomes one run.
    path2 = tmp_path / "v1-rows.db"
    with Store(path2) as store:
        store.record([probe_result(at=T0), probe_result(at=T0 + 500 * HOUR)])
    db = sqlite3.connect(path2)
    db.executescript(DOWNGRADE_TO_3 + "DROP TABLE runs; PRAGMA user_version = 1;")
    db.close()
    with Store(path2, create=False) as store:
        (observation,) = store.load_timeline(WWW).observations
    assert observation.runs == ((T0, T0 + 500 * HOUR),)  # the gap was never kept


def test_targets_nobody_asked_about_are_pruned_on_either_engine(store: Store) -> None:
    a, b = Target("a.example.test", 443), Target("b.example.test", 443)
    store.record([probe_result(a.host, at=T0), probe_result(b.host, at=T0),
                  probe_result(b.host, cert="other.example.test", at=T0 + 5)])
    day = 86_400
    assert store.note_asked([(b.host, b.port)], T0 + 50 * day) == 1
    assert store.note_asked([("nowhere.example.test", 443)], T0 + 50 * day) == 0
    report = store.prune(T0 + 90 * day, 60 * day)
    assert (report.targets, report.observations) == (1, 1)
    assert store.load_timeline(a).observations == ()
    assert len(store.load_timeline(b).observations) == 2
    assert store.statistics().targets == 1
    assert store.prune(T0 + 90 * day, 60 * day).targets == 0
