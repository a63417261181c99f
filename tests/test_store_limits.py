"""What a target keeps (issue 17, item 10): ``TimelineLimits`` applied alike by
``Timeline.merged`` (the cache) and ``Store.record`` (the database), the
retention of targets nobody asked about, the sweep after the limits change,
and ``Store.compact``."""

from __future__ import annotations

import hashlib
import random
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from notary.model.observations import (
    Certificate,
    Observation,
    ProbeResult,
    Timeline,
    TimelineLimits,
)
from notary.model.targets import Target
from notary.protocol import convergence, perspectives, v2
from notary.state.store import PruneReport, Store
from notary.web.certificates import details_of
from tests.support.engines import Engine
from tests.support.observations import certificate

T0 = 1_700_000_000
WINDOW = 30
DAY = 86400
WWW = Target("www.example.test", 443)


def synthetic_certificate(index: int, size: int = 300) -> Certificate:
    """A certificate-shaped value of ``size`` bytes (the store does not parse
    the DER)."""
    der = random.Random(index).randbytes(size)
    return Certificate(der, hashlib.sha1(der).digest(), hashlib.sha256(der).digest(),
                       hashlib.md5(der).digest(), hashlib.sha256(der[:50]).digest())


def sighting(cert: Certificate, at: int, target: Target = WWW,
             address: str = "192.0.2.1") -> ProbeResult:
    return ProbeResult(target, cert, (cert.der,), address, at)


def model(batches: Iterable[Sequence[ProbeResult]], limits: TimelineLimits | None,
          window: int = WINDOW) -> dict[Target, Timeline]:
    """What the cache holds: ``Timeline.merged`` one result after the other."""
    timelines: dict[Target, Timeline] = {}
    for batch in batches:
        for result in batch:
            timeline = timelines.get(result.target, Timeline(result.target))
            timelines[result.target] = timeline.merged(result, window, limits)
    return timelines


def table_counts(path: Path) -> dict[str, int]:
    db = sqlite3.connect(path)
    try:
        return {table: db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                for table in ("targets", "certificates", "observations", "runs")}
    finally:
        db.close()


def stored_der_bytes(path: Path) -> int:
    db = sqlite3.connect(path)
    try:
        return db.execute("SELECT coalesce(sum(length(der)), 0) FROM certificates").fetchone()[0]
    finally:
        db.close()


# -- Timeline.bounded (pure) ----------------------------------------------------------


def test_bounded_keeps_the_newest_observations_by_last_seen() -> None:
    certs = [synthetic_certificate(i) for i in range(5)]
    timeline = Timeline(WWW)
    for i, cert in enumerate(certs):
        timeline = timeline.merged(sighting(cert, T0 + i * 10))
    # The oldest by last_seen is the first certificate: seen again, it is the newest.
    timeline = timeline.merged(sighting(certs[0], T0 + 100))
    bounded = timeline.bounded(TimelineLimits(max_certificates_per_target=3))
    assert [o.certificate for o in bounded.observations] == [certs[0], certs[4], certs[3]]
    assert bounded.observations == timeline.observations[:3]


def test_bounded_keeps_the_newest_runs_and_moves_first_seen() -> None:
    cert = synthetic_certificate(1)
    timeline = Timeline(WWW)
    for at in (0, 100, 200, 300):  # four runs: 100 s apart, window 30 s
        timeline = timeline.merged(sighting(cert, T0 + at), WINDOW)
    (observation,) = timeline.bounded(TimelineLimits(max_runs_per_certificate=2)).observations
    assert observation.runs == ((T0 + 200, T0 + 200), (T0 + 300, T0 + 300))
    assert (observation.first_seen, observation.last_seen) == (T0 + 200, T0 + 300)


def test_bounded_drops_a_large_der_and_keeps_every_hash() -> None:
    big = synthetic_certificate(1, size=90_000)
    timeline = Timeline(WWW).merged(sighting(big, T0), limits=TimelineLimits())
    (observation,) = timeline.observations
    assert observation.certificate == replace(big, der=b"")
    small = certificate()
    assert Timeline(WWW).merged(sighting(small, T0), limits=TimelineLimits()).observations[
        0].certificate == small


def test_bounded_is_the_identity_within_the_limits() -> None:
    timeline = Timeline(WWW).merged(sighting(certificate(), T0))
    assert timeline.bounded(TimelineLimits()) is timeline


@pytest.mark.parametrize("field, value", [
    ("max_certificate_bytes", -1), ("max_certificates_per_target", 0),
    ("max_runs_per_certificate", 0),
])
def test_limits_out_of_range_are_refused(field: str, value: int) -> None:
    with pytest.raises(ValueError, match=field):
        TimelineLimits(**{field: value})


# -- a DER-less certificate in every protocol -----------------------------------------


def test_every_protocol_answers_a_certificate_kept_without_its_der() -> None:
    """The answers signed for a timeline whose certificate lost its DER are
    byte for byte those of the same timeline with it: no protocol needs it."""
    full = Timeline(WWW).merged(sighting(certificate(), T0))
    (observation,) = full.observations
    hashes_only = Timeline(WWW, (
        replace(observation, certificate=replace(observation.certificate, der=b"")),))
    assert hashes_only.observations[0].certificate.der == b""
    for timeline in (full, hashes_only):
        assert convergence.entries_of(timeline)[0].sha1 == observation.certificate.sha1
    assert convergence.signed_payload(convergence.entries_of(hashes_only)) == (
        convergence.signed_payload(convergence.entries_of(full)))
    service = perspectives.service_id(WWW)
    assert perspectives.signed_blob(service, perspectives.keys_of(hashes_only)) == (
        perspectives.signed_blob(service, perspectives.keys_of(full)))
    assert perspectives.reply_xml(perspectives.keys_of(hashes_only), "c2ln") == (
        perspectives.reply_xml(perspectives.keys_of(full), "c2ln"))
    made = {name: v2.statement(timeline, key_id="0" * 16, signed_at=T0, valid_for_s=DAY)
            for name, timeline in (("full", full), ("hashes", hashes_only))}
    assert v2.statement_bytes(made["hashes"]) == v2.statement_bytes(made["full"])
    assert v2.verdict_of(hashes_only, observation.certificate.sha256, None,
                         now=T0, fresh_for_s=DAY) == v2.VERDICT_MATCH
    # The web page shows what it can: the hashes.
    details = details_of(hashes_only.observations[0].certificate)
    assert details.sha256 == details_of(observation.certificate).sha256


# -- the store keeps what the cache keeps ------------------------------------------------

SMALL = TimelineLimits(max_certificate_bytes=400, max_certificates_per_target=2,
                       max_runs_per_certificate=2)
_TARGETS = [WWW, Target("b.example.test", 443)]
_CERTS = [synthetic_certificate(i, size=300 if i % 2 else 500) for i in range(4)]
_ADDRESSES = [f"192.0.2.{i}" for i in range(1, 4)]

results_strategy = st.builds(
    sighting, st.sampled_from(_CERTS), st.integers(0, 400).map(lambda dt: T0 + dt),
    st.sampled_from(_TARGETS), st.sampled_from(_ADDRESSES),
)


_STEPS = st.lists(st.tuples(st.lists(results_strategy, min_size=1, max_size=8),
                            st.sampled_from(["keep", "reopen", "clear memo"])),
                  min_size=1, max_size=8)
_LIMITS = st.sampled_from([SMALL, replace(SMALL, max_runs_per_certificate=1),
                           replace(SMALL, max_certificates_per_target=1)])
#: Examples per engine (PostgreSQL's round trips make each slower).
_EXAMPLES = {"sqlite": 200, "postgresql": 60}


def test_batches_within_limits_match_the_in_memory_merge(engine: Engine) -> None:
    """Any batches (certificates dropped and seen again, runs dropped, late
    sightings, a sighting of a dropped certificate in the same batch) leave
    in the store, on either engine, exactly the timelines the cache builds
    with the same limits, and no certificate row that no target keeps."""

    @settings(max_examples=_EXAMPLES[engine.name], deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(_STEPS, _LIMITS)
    def check(steps: list, limits: TimelineLimits) -> None:
        engine.reset()
        check_batches_match_the_model(
            lambda: engine.observations(merge_window_s=WINDOW, limits=limits), steps, limits
        )

    check()


def check_batches_match_the_model(open_store, steps: list, limits: TimelineLimits) -> None:
    """Record each step's batch with a store from ``open_store`` (opened
    again after a "reopen" step; its id memos cleared after "clear memo"),
    then compare every target's stored timeline, and the certificate and
    observation counts, with the in-memory model."""
    store = open_store()
    try:
        for batch, between in steps:
            store.record(batch)
            if between == "reopen":
                store.close()
                store = open_store()
            elif between == "clear memo" and isinstance(store, Store):  # SQLite's id memos
                store._target_ids.clear()
                store._certificate_ids.clear()
        expected = model([batch for batch, _ in steps], limits)
        for target, timeline in expected.items():
            assert store.load_timeline(target) == timeline
        kept = {o.certificate.sha256 for t in expected.values() for o in t.observations}
        assert store.statistics().certificates == len(kept)
        assert store.statistics().observations == sum(
            len(t.observations) for t in expected.values())
    finally:
        store.close()


def test_twenty_large_certificates_leave_bounded_rows(tmp_path: Path) -> None:
    """The issue's case: a target someone controls serves a new ~90 KB
    certificate at each probe. The store keeps the newest 64 and no DER."""
    path = tmp_path / "n.db"
    limits = TimelineLimits()
    with Store(path, limits=limits) as store:
        for i in range(100):
            store.record([sighting(synthetic_certificate(i, size=90_000), T0 + i)])
        timeline = store.load_timeline(WWW)
    assert len(timeline.observations) == limits.max_certificates_per_target
    assert timeline.newest is not None and timeline.newest.last_seen == T0 + 99
    assert stored_der_bytes(path) == 0
    assert table_counts(path)["certificates"] == limits.max_certificates_per_target


def test_without_limits_everything_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "n.db"
    with Store(path) as store:
        for i in range(5):
            store.record([sighting(synthetic_certificate(i, size=20_000), T0 + i)])
    assert table_counts(path)["observations"] == 5
    assert stored_der_bytes(path) == 5 * 20_000


def test_a_certificate_another_target_keeps_is_not_deleted(tmp_path: Path) -> None:
    shared, other = synthetic_certificate(1), synthetic_certificate(2)
    b = Target("b.example.test", 443)
    limits = TimelineLimits(max_certificates_per_target=1)
    with Store(tmp_path / "n.db", limits=limits) as store:
        store.record([sighting(shared, T0), sighting(shared, T0, target=b)])
        store.record([sighting(other, T0 + 1)])  # www drops the shared certificate
        assert store.load_timeline(b).observations[0].certificate == shared
        assert [o.certificate for o in store.load_timeline(WWW).observations] == [other]
        store.record([sighting(shared, T0 + 2, target=b)])  # its id is still valid
        assert store.load_timeline(b).observations[0].last_seen == T0 + 2
    assert table_counts(tmp_path / "n.db")["certificates"] == 2


def test_a_deletion_by_another_connection_invalidates_memoised_ids(tmp_path: Path) -> None:
    """Ids are reused once rows are deleted: a writer that memoised the id
    of a certificate another connection deleted must not write with it."""
    path = tmp_path / "n.db"
    limits = TimelineLimits(max_certificates_per_target=1)
    old, new, newest = (synthetic_certificate(i) for i in range(3))
    b = Target("b.example.test", 443)
    with Store(path, limits=limits) as first, Store(path, limits=limits) as second:
        first.record([sighting(old, T0, target=b)])  # first memoises old's id
        second.record([sighting(old, T0), sighting(new, T0 + 1)])
        second.record([sighting(new, T0 + 2, target=b)])  # b drops old: its row goes
        assert table_counts(path)["certificates"] == 1
        second.record([sighting(newest, T0 + 3)])  # may take the freed id
        first.record([sighting(old, T0 + 4, target=Target("c.example.test", 443))])
        (observation,) = first.load_timeline(Target("c.example.test", 443)).observations
        assert observation.certificate == old
        assert first.load_timeline(WWW).observations[0].certificate == newest


# -- a change of limits --------------------------------------------------------------------


def test_rows_written_under_looser_limits_are_swept_as_the_cache_bounds_them(
    engine: Engine,
) -> None:
    batches = [[sighting(_CERTS[i % 4], T0 + t) for i, t in enumerate(range(0, 600, 50))],
               [sighting(synthetic_certificate(9, size=1000), T0 + 700)]]
    with engine.observations(merge_window_s=WINDOW) as store:  # no limits
        for batch in batches:
            store.record(batch)
    unbounded = model(batches, None)[WWW]
    with engine.observations(merge_window_s=WINDOW, limits=SMALL) as store:
        assert not store.limits_enforced()
        report = store.enforce_limits()
        assert report.observations == len(unbounded.observations) - 2
        kept = unbounded.bounded(SMALL).observations
        assert report.ders_dropped == sum(o.certificate.der == b"" for o in kept) == 1
        assert store.limits_enforced()
        assert store.enforce_limits() == PruneReport()
        assert store.load_timeline(WWW) == unbounded.bounded(SMALL)
    assert engine.table_counts("certificates") == {"certificates": 2}
    with engine.observations(limits=replace(SMALL, max_certificates_per_target=5)) as store:
        assert store.limits_enforced()  # looser limits: nothing to sweep
    with engine.observations(limits=replace(SMALL, max_runs_per_certificate=1)) as store:
        assert not store.limits_enforced()


def test_one_run_left_after_the_sweep_keeps_no_runs_row(engine: Engine) -> None:
    cert = synthetic_certificate(1)
    with engine.observations(merge_window_s=WINDOW) as store:
        store.record([sighting(cert, T0 + t) for t in (0, 100, 200)])
    limits = replace(SMALL, max_runs_per_certificate=1)
    with engine.observations(merge_window_s=WINDOW, limits=limits) as store:
        assert store.enforce_limits().runs == 2  # the last one keeps no row
        (observation,) = store.load_timeline(WWW).observations
        assert observation.runs == ((T0 + 200, T0 + 200),)
        assert observation.first_seen == T0 + 200
    assert engine.table_counts("runs") == {"runs": 0}


# -- retention of targets nobody asked about ----------------------------------------------


def test_targets_nobody_asked_about_are_pruned_with_their_rows(engine: Engine) -> None:
    a, b, c = (Target(f"{n}.example.test", 443) for n in "abc")
    shared = synthetic_certificate(1)
    with engine.observations(merge_window_s=WINDOW) as store:
        store.record([sighting(shared, T0, target=a), sighting(shared, T0, target=b),
                      sighting(synthetic_certificate(2), T0, target=c)])
        store.record([sighting(shared, T0 + 100, target=a)])  # a second run: runs rows
        assert store.note_asked([("b.example.test", 443)], T0 + 50 * DAY) == 1
        assert store.note_asked([("nowhere.example.test", 443)], T0 + 50 * DAY) == 0
        # At T0 + 90 days, with a retention of 60 days: a and c go, b stays.
        report = store.prune(T0 + 90 * DAY, 60 * DAY)
        assert report == PruneReport(targets=2, observations=2, runs=2, certificates=1)
        assert store.load_timeline(a) == Timeline(a)
        assert store.load_timeline(b).observations[0].certificate == shared
        assert store.prune(T0 + 90 * DAY, 60 * DAY) == PruneReport()
        # A target seen again is a new row, asked about when observed.
        store.record([sighting(shared, T0 + 91 * DAY, target=a)])
        assert store.prune(T0 + 91 * DAY, 60 * DAY) == PruneReport()
    assert engine.table_counts("targets", "certificates", "observations", "runs") == {
        "targets": 2, "certificates": 1, "observations": 2, "runs": 0}


def test_asked_at_never_moves_back(engine: Engine) -> None:
    with engine.observations() as store:
        store.record([sighting(synthetic_certificate(1), T0)])
        assert store.note_asked([("www.example.test", 443)], T0 + 10) == 1
        assert store.note_asked([("www.example.test", 443)], T0 + 5) == 0
        assert store.prune(T0 + 8 + 10, 10) == PruneReport()


def test_pruning_goes_a_chunk_at_a_time(engine: Engine) -> None:
    with engine.observations() as store:
        store.record([sighting(synthetic_certificate(i), T0, target=Target(f"h{i}.test", 443))
                      for i in range(7)])
        assert store.prune_unasked(T0 + 1, max_targets=3).targets == 3
        assert store.prune_unasked(T0 + 1, max_targets=3).targets == 3
        assert store.prune_unasked(T0 + 1, max_targets=3).targets == 1
        with pytest.raises(ValueError, match="max_targets"):
            store.prune_unasked(T0 + 1, max_targets=0)


def test_existing_targets_count_as_asked_at_the_upgrade(tmp_path: Path) -> None:
    """Migration 4 gives every stored target asked_at = the time it ran, so
    the upgrade forgets nothing."""
    from tests.support.migrations import DOWNGRADE_TO_3

    path = tmp_path / "n.db"
    with Store(path) as store:
        store.record([sighting(synthetic_certificate(1), T0)])
    db = sqlite3.connect(path)
    db.executescript(DOWNGRADE_TO_3 + "PRAGMA user_version = 3;")
    db.close()
    with Store(path) as store:
        db = sqlite3.connect(path)
        (asked_at,) = db.execute("SELECT asked_at FROM targets").fetchone()
        db.close()
        assert asked_at > T0
        assert store.prune(asked_at + DAY, 2 * DAY) == PruneReport()


# -- compaction -------------------------------------------------------------------------


def test_compact_applies_limits_and_retention_then_shrinks_the_file(tmp_path: Path) -> None:
    path = tmp_path / "n.db"
    with Store(path) as store:
        for i in range(40):
            store.record([sighting(synthetic_certificate(i, size=20_000), T0 + i,
                                   target=Target(f"h{i % 4}.test", 443))])
    size_before = path.stat().st_size
    limits = TimelineLimits(max_certificate_bytes=8192, max_certificates_per_target=3)
    with Store(path, limits=limits) as store:
        store.note_asked([("h0.test", 443)], T0 + 100 * DAY)
        report = store.compact(T0 + 100 * DAY, 30 * DAY)
        assert report.targets == 3
        assert report.observations == 40 - 3
        assert report.certificates == 40 - 3
        assert report.ders_dropped == 3
        assert store.limits_enforced()
    assert table_counts(path) == {"targets": 1, "certificates": 3, "observations": 3, "runs": 0}
    assert path.stat().st_size < size_before / 10
    assert str(report).startswith("3 targets, 37 observations")


def test_observation_for_runs_helper_is_sorted() -> None:
    """``Timeline.bounded`` takes the newest runs even from unsorted runs."""
    observation = Observation(synthetic_certificate(1), T0, T0 + 300,
                              runs=((T0 + 200, T0 + 300), (T0, T0), (T0 + 100, T0 + 100)))
    (kept,) = Timeline(WWW, (observation,)).bounded(
        TimelineLimits(max_runs_per_certificate=2)).observations
    assert kept.runs == ((T0 + 100, T0 + 100), (T0 + 200, T0 + 300))
