"""``Store.record`` on batches: the set-based writer (ids from ``INSERT ...
RETURNING``, one read per batch, the one-sighting fast path, runs rows only
for pairs with several runs) against the in-memory merge of
``notary.model.observations``."""

from __future__ import annotations

import hashlib
import itertools
import random
import sqlite3
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import notary.state.store
from notary.errors import StoreError
from notary.model.observations import Certificate, ProbeResult, Timeline
from notary.model.targets import Target
from notary.state.store import MIGRATIONS, SCHEMA_VERSION, Store, _padded_rows
from tests.support.observations import certificate, probe_result

T0 = 1_700_000_000
WINDOW = 30


def model(batches: Iterable[Sequence[ProbeResult]], window: int = WINDOW) -> dict[Target, Timeline]:
    """The timelines ``Timeline.merged`` gives, one result after the other."""
    timelines: dict[Target, Timeline] = {}
    for batch in batches:
        for result in batch:
            timeline = timelines.get(result.target, Timeline(result.target))
            timelines[result.target] = timeline.merged(result, window)
    return timelines


def assert_matches_model(store: Store, batches: Sequence[Sequence[ProbeResult]],
                         window: int = WINDOW) -> None:
    expected = model(batches, window)
    for target, timeline in expected.items():
        assert store.load_timeline(target) == timeline
    stats = store.statistics()
    assert stats.targets == len(expected)
    assert stats.observations == sum(len(t.observations) for t in expected.values())
    assert stats.certificates == len({r.leaf.sha256 for b in batches for r in b})


def runs_rows(path: Path) -> dict[tuple[int, int], list[tuple[int, int]]]:
    db = sqlite3.connect(path)
    try:
        rows = db.execute("SELECT target_id, certificate_id, start, end FROM runs"
                          " ORDER BY start").fetchall()
    finally:
        db.close()
    runs: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for t, c, start, end in rows:
        runs.setdefault((t, c), []).append((start, end))
    return runs


def assert_runs_rows_consistent(path: Path, window: int = WINDOW) -> None:
    """Runs rows, where a pair has them, span its observation exactly, more
    than the window apart."""
    db = sqlite3.connect(path)
    try:
        spans = {(t, c): (first, last) for t, c, first, last in db.execute(
            "SELECT target_id, certificate_id, first_seen, last_seen FROM observations")}
    finally:
        db.close()
    for pair, runs in runs_rows(path).items():
        assert (runs[0][0], max(end for _, end in runs)) == spans[pair]
        for (_, end), (start, _) in itertools.pairwise(runs):
            assert start - end > window


def synthetic_certificate(index: int) -> Certificate:
    """A certificate-shaped value (the store does not parse the DER)."""
    der = random.Random(index).randbytes(300)
    return Certificate(der, hashlib.sha1(der).digest(), hashlib.sha256(der).digest(),
                       hashlib.md5(der).digest(), hashlib.sha256(der[:50]).digest())


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "notary.db"


# -- random batches against the model ------------------------------------------------

_TARGETS = [("a.example.test", 443), ("a.example.test", 8443), ("b.example.test", 443)]
_CERTS = ["c1.example.test", "c2.example.test", "c3.example.test"]
_ADDRESSES = [f"192.0.2.{i}" for i in range(1, 11)]  # more than MAX_ADDRESSES

results_strategy = st.builds(
    lambda target, cert, address, dt: probe_result(
        target[0], target[1], cert=cert, address=address, at=T0 + dt),
    st.sampled_from(_TARGETS),
    st.sampled_from(_CERTS),
    st.sampled_from(_ADDRESSES),
    st.integers(0, 400),
)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.tuples(st.lists(results_strategy, min_size=1, max_size=12),
                       st.sampled_from(["keep", "reopen", "clear memo"])),
             min_size=1, max_size=8),
)
def test_batches_match_the_in_memory_merge(tmp_path: Path, steps: list) -> None:
    """Any batches (several sightings of a pair, runs that start, extend,
    bridge and merge, known and new targets and certificates, the memo lost
    between batches) give the timelines of the in-memory merge."""
    batches = [batch for batch, _ in steps]
    with tempfile.TemporaryDirectory(dir=tmp_path) as name:
        path = Path(name) / "n.db"
        store = Store(path, merge_window_s=WINDOW)
        try:
            for batch, between in steps:
                store.record(batch)
                if between == "reopen":
                    store.close()
                    store = Store(path, merge_window_s=WINDOW)
                elif between == "clear memo":
                    store._target_ids.clear()
                    store._certificate_ids.clear()
            assert_matches_model(store, batches)
        finally:
            store.close()
        assert_runs_rows_consistent(path)


# -- ids of targets and certificates ------------------------------------------------------


def test_a_batch_mixing_new_and_known_targets_and_certificates(db_path: Path) -> None:
    first = [probe_result("a.example.test", cert="a.example.test", at=T0)]
    batch = [
        probe_result("a.example.test", cert="a.example.test", at=T0 + 5),  # known pair
        probe_result("a.example.test", cert="b.example.test", at=T0 + 6),  # new cert
        probe_result("b.example.test", cert="a.example.test", at=T0 + 7),  # new target
        probe_result("c.example.test", at=T0 + 8),  # both new
        probe_result("c.example.test", at=T0 + 9, address="192.0.2.9"),  # again
        probe_result("c.example.test", 8443, cert="b.example.test", at=T0 + 10),
    ]
    with Store(db_path, merge_window_s=WINDOW) as store:
        store.record(first)
        known_target = store._target_ids[("a.example.test", 443)]
        known_cert = store._certificate_ids[certificate("a.example.test").sha256]
        store.record(batch)
        assert_matches_model(store, [first, batch])
        # Known rows keep their ids; new ones are remembered after commit.
        assert store._target_ids[("a.example.test", 443)] == known_target
        assert store._certificate_ids[certificate("a.example.test").sha256] == known_cert
        assert len(store._target_ids) == 4 and len(store._certificate_ids) == 3
    db = sqlite3.connect(db_path)
    try:
        ids = {(host, port): row_id
               for host, port, row_id in db.execute("SELECT host, port, id FROM targets")}
        certs = dict(db.execute("SELECT sha256, id FROM certificates"))
    finally:
        db.close()
    with Store(db_path) as store:
        store.record(batch)  # from an empty memo: every id comes from the table
        assert store._target_ids == ids
        assert store._certificate_ids == certs
        assert store.statistics().targets == 4


def test_rows_inserted_by_another_connection_are_found(db_path: Path) -> None:
    """A target and a certificate this store has not seen, inserted by another
    connection meanwhile: the INSERT skips them, their ids come from the
    table (no duplicate rows, one observation per pair)."""
    with Store(db_path, merge_window_s=WINDOW) as a, Store(db_path, merge_window_s=WINDOW) as b:
        a.record([probe_result("a.example.test", at=T0)])
        b.record([probe_result("b.example.test", cert="shared.example.test", at=T0)])
        assert ("b.example.test", 443) not in a._target_ids
        batch = [
            probe_result("b.example.test", cert="shared.example.test", at=T0 + 1),
            probe_result("a.example.test", cert="shared.example.test", at=T0 + 2),
            probe_result("c.example.test", at=T0 + 3),
        ]
        a.record(batch)
        assert a._target_ids[("b.example.test", 443)] == b._target_ids[("b.example.test", 443)]
        sha = certificate("shared.example.test").sha256
        assert a._certificate_ids[sha] == b._certificate_ids[sha]
        stats = a.statistics()
        assert (stats.targets, stats.certificates, stats.observations) == (3, 3, 4)
        [observation] = a.load_timeline(Target("b.example.test", 443)).observations
        assert (observation.first_seen, observation.last_seen) == (T0, T0 + 1)
        assert observation.runs == ((T0, T0 + 1),)


def test_a_small_memo_is_cleared_and_refilled(db_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(notary.state.store, "ID_MEMO_ENTRIES", 3)
    batches = [[probe_result(f"h{(i + j) % 5}.example.test", at=T0 + 10 * i + j)
                for j in range(3)] for i in range(6)]
    with Store(db_path, merge_window_s=WINDOW) as store:
        for batch in batches:
            store.record(batch)
            assert len(store._target_ids) <= 3
        assert_matches_model(store, batches)


@pytest.mark.parametrize("table", ["targets", "certificates", "observations", "runs"])
def test_a_rolled_back_batch_leaves_no_memo_entries(db_path: Path, table: str) -> None:
    """Whichever statement fails (the last ones after ids were learnt from
    ``INSERT ... RETURNING``), nothing is left: no rows, no memo entries."""
    batch = [
        probe_result("a.example.test", at=T0),
        probe_result("a.example.test", at=T0 + 10 * WINDOW),  # a second run: runs rows
        probe_result("b.example.test", at=T0),
    ]
    with Store(db_path, merge_window_s=WINDOW) as store:
        store._db.execute(
            f"CREATE TEMP TRIGGER failing BEFORE INSERT ON main.{table}"
            " BEGIN SELECT RAISE(ABORT, 'disk I/O error'); END"
        )
        with pytest.raises(StoreError, match="disk I/O error"):
            store.record(batch)
        assert not store._target_ids and not store._certificate_ids
        stats = store.statistics()
        assert (stats.targets, stats.certificates, stats.observations) == (0, 0, 0)
        assert runs_rows(db_path) == {}
        store._db.execute("DROP TRIGGER failing")
        store.record(batch)
        assert_matches_model(store, [batch])
        assert len(store._target_ids) == 2


# -- runs --------------------------------------------------------------------------------


def test_a_pair_with_one_run_has_no_runs_rows(db_path: Path) -> None:
    batches = [[probe_result(at=T0)], [probe_result(at=T0 + WINDOW)],
               [probe_result(at=T0 - 5), probe_result(at=T0 + 2 * WINDOW)]]
    with Store(db_path, merge_window_s=WINDOW) as store:
        for batch in batches:
            store.record(batch)
        assert_matches_model(store, batches)
        [observation] = store.load_timeline(probe_result().target).observations
        assert observation.runs == ((T0 - 5, T0 + 2 * WINDOW),)
    assert runs_rows(db_path) == {}


def test_a_second_run_writes_every_run_and_rows_stay(db_path: Path) -> None:
    www = probe_result().target
    with Store(db_path, merge_window_s=WINDOW) as store:
        store.record([probe_result(at=T0), probe_result(at=T0 + 10)])
        assert runs_rows(db_path) == {}
        store.record([probe_result(at=T0 + 100)])  # a second run starts
        assert list(runs_rows(db_path).values()) == [[(T0, T0 + 10), (T0 + 100, T0 + 100)]]
        store.record([probe_result(at=T0 + 40), probe_result(at=T0 + 70)])  # bridges them
        assert list(runs_rows(db_path).values()) == [[(T0, T0 + 100)]]
        store.record([probe_result(at=T0 + 120)])  # extends the one run (it has a row)
        assert list(runs_rows(db_path).values()) == [[(T0, T0 + 120)]]
        store.record([probe_result(at=T0 - 200)])  # a single new run, before
        assert list(runs_rows(db_path).values()) == [[(T0 - 200, T0 - 200), (T0, T0 + 120)]]
        [observation] = store.load_timeline(www).observations
        assert observation.runs == ((T0 - 200, T0 - 200), (T0, T0 + 120))


@pytest.mark.parametrize("seen", [-45, -31, -30, -5, 0, 3, 10, 35, 40, 41, 70, 100, 131, 200])
@pytest.mark.parametrize("stored", [
    [(0, 0)],  # no rows (one run)
    [(0, 10), (100, 100)],  # rows, the sighting near one run, or none
    [(0, 10), (41, 41), (72, 100)],  # rows, the sighting possibly near two
])
def test_one_sighting_near_stored_runs(tmp_path: Path, stored: list, seen: int) -> None:
    """The one-sighting fast path against ``add_sighting``: a run extended at
    either end, a sighting inside a run, a run of its own, runs merged."""
    setup = [[probe_result(at=T0 + s) for s in {start, end}] for start, end in stored]
    batch = [probe_result(at=T0 + seen, address="192.0.2.7")]
    with Store(tmp_path / "n.db", merge_window_s=WINDOW) as store:
        for setup_batch in setup:
            store.record(setup_batch)
        assert store.load_timeline(batch[0].target).observations[0].runs == tuple(
            (T0 + a, T0 + b) for a, b in stored)
        store.record(batch)
        assert_matches_model(store, [*setup, batch])
    assert_runs_rows_consistent(tmp_path / "n.db")


def test_one_pair_with_many_sightings_spanning_runs(db_path: Path) -> None:
    setup = [[probe_result(at=T0 + t) for t in (0, 100, 200, 300)]]
    times = [350, 5, 160, 130, 101, 240, 270, -100, 299, 205, 1000, 60]
    batch = [probe_result(at=T0 + t, address=f"192.0.2.{i % 10}") for i, t in enumerate(times)]
    batch += [probe_result(cert="other.example.test", at=T0 + t) for t in (0, 500, 1000)]
    with Store(db_path, merge_window_s=WINDOW) as store:
        store.record(setup[0])
        store.record(batch)
        assert_matches_model(store, [*setup, batch])
    assert_runs_rows_consistent(db_path)


def test_a_wider_window_merges_the_stored_runs_near_a_sighting(db_path: Path) -> None:
    """Runs stored under a narrower window, closer than the current one: a
    sighting merges the runs within the window of it (``add_sighting`` on
    them), not the others (only runs near the batch's sightings are read)."""
    batches = [[probe_result(at=T0), probe_result(at=T0 + 20), probe_result(at=T0 + 40)]]
    with Store(db_path, merge_window_s=10) as store:
        store.record(batches[0])
    batches.append([probe_result(at=T0 + 45)])
    with Store(db_path, merge_window_s=WINDOW) as store:
        store.record(batches[1])
        [observation] = store.load_timeline(probe_result().target).observations
    assert observation.runs == ((T0, T0), (T0 + 20, T0 + 45))
    assert (observation.first_seen, observation.last_seen) == (T0, T0 + 45)


# -- statement sizes ----------------------------------------------------------------------


def test_padded_rows_are_powers_of_two() -> None:
    for count in range(1, 1100):
        padded = _padded_rows(count)
        assert padded & (padded - 1) == 0
        assert count <= padded < 2 * count


def test_a_batch_larger_than_one_statement(db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunked ``VALUES`` lists: every id, read and write across chunks."""
    monkeypatch.setattr(notary.state.store, "ROWS_PER_STATEMENT", 4)
    certs = [synthetic_certificate(i) for i in range(11)]
    targets = [Target(f"h{i}.example.test", 443) for i in range(11)]

    def result(i: int, at: int, address: str = "192.0.2.1") -> ProbeResult:
        return ProbeResult(targets[i], certs[i], (certs[i].der,), address, at)

    batches = [[result(i, T0 + i) for i in range(7)],
               [result(i, T0 + 100 + i, "192.0.2.2") for i in range(11)] + [result(3, T0 + 500)]]
    with Store(db_path, merge_window_s=WINDOW) as store:
        for batch in batches:
            store.record(batch)
        assert_matches_model(store, batches)
        store._target_ids.clear()
        store._certificate_ids.clear()
        batches.append([result(i, T0 + 200 + i) for i in range(11)])
        store.record(batches[-1])
        assert_matches_model(store, batches)


def test_a_batch_of_1100_new_and_known_pairs(db_path: Path) -> None:
    certs = [synthetic_certificate(i) for i in range(600)]
    results = [ProbeResult(Target(f"h{i % 600}.example.test", 443), certs[i % 600],
                           (certs[i % 600].der,), f"192.0.2.{i // 600}", T0 + i)
               for i in range(1100)]
    with Store(db_path, merge_window_s=WINDOW) as store:
        store.record(results[:300])
        store.record(results)
        assert_matches_model(store, [results[:300], results])


# -- schema 3 ------------------------------------------------------------------------------


def test_migration_to_3_keeps_only_rows_of_pairs_with_several_runs(db_path: Path) -> None:
    db = sqlite3.connect(db_path)
    for migration in MIGRATIONS[:2]:
        db.executescript(migration)
    db.executescript(f"""
        PRAGMA user_version = 2;
        INSERT INTO targets VALUES (1, 'a.example.test', 443), (2, 'b.example.test', 443);
        INSERT INTO certificates VALUES
            (1, X'{certificate("a.example.test").sha256.hex()}', X'{certificate("a.example.test").sha1.hex()}',
             X'{certificate("a.example.test").md5.hex()}', X'{certificate("a.example.test").spki_sha256.hex()}',
             X'{certificate("a.example.test").der.hex()}');
        INSERT INTO observations VALUES (1, 1, {T0}, {T0 + 50}, '192.0.2.1'),
                                        (2, 1, {T0}, {T0 + 500}, '192.0.2.2');
        INSERT INTO runs VALUES (1, 1, {T0}, {T0 + 50}),
                                (2, 1, {T0}, {T0 + 10}), (2, 1, {T0 + 400}, {T0 + 500});
    """)
    db.close()
    with Store(db_path, create=False, merge_window_s=WINDOW) as store:
        assert store.schema_version() == SCHEMA_VERSION >= 3
        a = store.load_timeline(Target("a.example.test", 443)).observations[0]
        b = store.load_timeline(Target("b.example.test", 443)).observations[0]
        assert a.runs == ((T0, T0 + 50),)
        assert b.runs == ((T0, T0 + 10), (T0 + 400, T0 + 500))
        assert runs_rows(db_path) == {(2, 1): [(T0, T0 + 10), (T0 + 400, T0 + 500)]}
        # Recording goes on from there as from a schema-3 database.
        store.record([ProbeResult(Target("a.example.test", 443), certificate("a.example.test"),
                                  (), "192.0.2.3", T0 + 70),
                      ProbeResult(Target("b.example.test", 443), certificate("a.example.test"),
                                  (), "192.0.2.3", T0 + 30)])
        a = store.load_timeline(Target("a.example.test", 443)).observations[0]
        b = store.load_timeline(Target("b.example.test", 443)).observations[0]
        assert a.runs == ((T0, T0 + 70),)
        assert b.runs == ((T0, T0 + 30), (T0 + 400, T0 + 500))


def test_a_negative_window_is_refused_before_writing(db_path: Path) -> None:
    with Store(db_path, merge_window_s=-1) as store:
        with pytest.raises(ValueError, match="negative"):
            store.record([probe_result()])
        assert store.statistics().targets == 0
        assert not store._target_ids
        store.record([])  # nothing to record: no check needed


def test_an_sqlite_without_returning_is_refused(db_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite3, "sqlite_version_info", (3, 34, 1))
    with pytest.raises(StoreError, match=r"too old: the store needs 3\.35\.0"):
        Store(db_path)
    assert not db_path.exists()
