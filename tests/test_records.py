"""Target records (``notary.service.records``): one refresh per target at a
time, merged once, cached, stored and published, whoever waits for it.

These are the prober's single-flight tests from before the refresh owned
the flights (``tests/test_probe.py`` keeps the probe itself)."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

from notary.config import V2Config
from notary.errors import ProbeConnectFailed, ProbeError, ProbeTimeout
from notary.model.policy import AddressPolicy
from notary.model.targets import Target
from notary.outbound.probe import Prober, open_prober
from notary.outbound.writer import open_storage
from notary.protocol import v2
from notary.service.records import Records, RecordSigner
from notary.service.stored_targets import StoredTargets
from notary.state import crypto
from notary.state.cache import LRUCache
from notary.state.feed import Change
from tests.support.observations import store_section
from tests.support.tls_targets import (
    LOCALHOST,
    closed_port,
    open_stalled_target,
    open_tls_target,
    static_resolver,
    with_probe_section,
)

NAME_A = "www.example.test"
NAME_B = "mail.example.test"
NOW = 1_700_000_000.75


@functools.cache
def convergence_key():  # one RSA key for the module: making one is slow
    return crypto.generate_rsa_key()


@asynccontextmanager
async def records_and_prober(
    tmp_path: Path, signer: RecordSigner | None = None, **prober_settings: object
) -> AsyncIterator[tuple[Records, Prober]]:
    """Records over a real store in ``tmp_path`` and a prober allowed to
    reach loopback only, knowing NAME_A and NAME_B (``signer``: the
    records', by default one of Convergence answers only)."""
    settings: dict = {
        "policy": AddressPolicy.from_cidrs(["127.0.0.0/8"]),
        "timeout_s": 10.0,
        "max_concurrent": 8,
        "resolver": static_resolver({NAME_A: [LOCALHOST], NAME_B: [LOCALHOST]}),
        "clock": lambda: NOW,
    }
    settings.update(prober_settings)
    signer = signer or RecordSigner(
        crypto.ConvergenceSigner(convergence_key()), None, None, V2Config(), lambda: NOW
    )
    async with (
        open_storage(tmp_path / "notary.db", store_section(batch_interval_ms=1)) as storage,
        open_prober(**with_probe_section(settings)) as prober,
        Records(
            cache=LRUCache(100, 10_000_000), storage=storage,
            stored=StoredTargets(1000, 0.01), signer=signer, prober=prober,
            merge_window_s=3600, timeline_limits=None, max_background=4,
        ) as records,
    ):
        yield records, prober


async def test_concurrent_refreshes_share_one_probe(tmp_path: Path) -> None:
    records_seen = []

    async def ask(records, target):
        records_seen.append(await records.refresh(target))

    async with open_tls_target([NAME_A]) as server:
        server.pause()
        async with records_and_prober(tmp_path) as (records, p):
            async with trio.open_nursery() as nursery:
                for _ in range(20):
                    nursery.start_soon(ask, records, server.target(NAME_A))
                await server.wait_accepted(1)
                await trio.testing.wait_all_tasks_blocked()
                stats = p.statistics()
                assert (stats.started, records.statistics().coalesced, stats.in_flight) == (
                    1, 19, 1
                )
                server.resume()
            stats = p.statistics()
            assert records.statistics().coalesced == 19
    assert server.accepted == 1
    assert len(records_seen) == 20
    assert all(record is records_seen[0] for record in records_seen)
    assert records_seen[0].last_probe.leaf.der == server.leaf_der(NAME_A)
    assert (stats.started, stats.succeeded, stats.in_flight) == (1, 1, 0)


async def test_a_cancelled_waiter_does_not_cancel_the_refresh(tmp_path: Path) -> None:
    results = []

    async def impatient(records, target, task_status=trio.TASK_STATUS_IGNORED):
        with trio.CancelScope() as scope:
            task_status.started(scope)
            await records.refresh(target)
        results.append("impatient was not cancelled" if not scope.cancelled_caught else None)

    async def patient(records, target):
        results.append(await records.refresh(target))

    async with open_tls_target([NAME_A]) as server:
        server.pause()
        async with records_and_prober(tmp_path) as (records, p), trio.open_nursery() as nursery:
            scope = await nursery.start(impatient, records, server.target(NAME_A))
            nursery.start_soon(patient, records, server.target(NAME_A))
            await server.wait_accepted(1)
            scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert p.statistics().in_flight == 1
            server.resume()
    assert results[0] is None
    assert results[1].last_probe.leaf.der == server.leaf_der(NAME_A)
    assert server.accepted == 1


async def test_every_waiter_gets_its_own_copy_of_the_error(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    errors = []

    async def ask(records, target):
        try:
            await records.refresh(target)
        except ProbeTimeout as exc:
            errors.append(exc)

    async with (
        open_stalled_target() as stalled,
        records_and_prober(tmp_path, timeout_s=3.0) as (records, p),
    ):
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(ask, records, stalled.target(NAME_A))
        stats = p.statistics()
        coalesced = records.statistics().coalesced
    assert len(errors) == 3
    assert len({id(e) for e in errors}) == 3
    assert {e.message for e in errors} == {"target did not answer in time"}
    assert {e.status for e in errors} == {503}
    assert (stats.started, coalesced, stats.failures) == (1, 2, {"timeout": 1})
    assert stalled.accepted == 1


async def test_a_refresh_merges_once_before_its_waiters_wake(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    returned = []

    async def ask(records, target):
        record = await records.refresh(target)
        # the cache holds the merged record by the time any waiter wakes
        returned.append(records._cache.peek(target.key) is record)

    async with (
        open_tls_target([NAME_A, NAME_B]) as server,
        records_and_prober(tmp_path) as (records, _p),
    ):
        storage = records._storage
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(ask, records, server.target(NAME_A))
        assert returned == [True, True, True]
        with trio.fail_after(5):
            while not storage.statistics().committed:  # noqa: ASYNC110 (a counter)
                await trio.sleep(0.01)
        await trio.sleep(0.05)  # a second queued result would be committed by now
        assert storage.statistics().committed == 1  # merged and queued once

        async def broken(result):
            raise RuntimeError("merge bug")

        # A failing merge is logged; the waiter still gets the record.
        monkeypatch.setattr(storage, "record", broken)
        record = await records.refresh(server.target(NAME_B))
        assert record.last_probe.leaf.der == server.leaf_der(NAME_B)
        assert record.timeline.newest.certificate.der == server.leaf_der(NAME_B)
    assert "merge bug" in caplog.text


async def test_an_abandoned_refresh_is_still_merged(tmp_path: Path) -> None:
    async with (
        open_tls_target([NAME_A]) as server,
        records_and_prober(tmp_path) as (records, p),
    ):
        target = server.target(NAME_A)
        server.pause()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(records.refresh, target)
            await server.wait_accepted(1)
            nursery.cancel_scope.cancel()  # the only waiter gives up
        assert p.statistics().in_flight == 1
        server.resume()
        with trio.fail_after(5):
            while records._cache.peek(target.key) is None:  # noqa: ASYNC110
                await trio.sleep(0.01)


async def test_a_failed_refresh_merges_nothing(tmp_path: Path) -> None:
    async with records_and_prober(tmp_path) as (records, _p):
        target = Target(NAME_A, closed_port())
        with pytest.raises(ProbeConnectFailed):
            await records.refresh(target)
        assert records._cache.peek(target.key) is None
        assert records._storage.statistics().queued == 0
        assert records._storage.statistics().committed == 0


async def test_refreshes_keep_probing_for_callers_that_gave_up(tmp_path: Path) -> None:
    names = [f"host{i}.example.test" for i in range(5)]
    resolver = static_resolver({name: [LOCALHOST] for name in names})
    async with (
        open_stalled_target() as stalled,
        records_and_prober(tmp_path, resolver=resolver, max_concurrent=2, timeout_s=60.0) as (
            records, p,
        ),
    ):
        async with trio.open_nursery() as nursery:
            for name in names:
                nursery.start_soon(records.refresh, stalled.target(name))
            await stalled.wait_accepted(2)
            await trio.testing.wait_all_tasks_blocked()
            stats = p.statistics()
            assert (stats.started, stats.in_flight, stats.queued) == (5, 2, 3)
            await trio.sleep(0.05)
            assert stalled.accepted == 2
            nursery.cancel_scope.cancel()  # the callers give up, the probes go on
        assert p.statistics().in_flight == 2
    assert stalled.accepted == 2


async def test_a_refresh_after_close_is_an_error(tmp_path: Path) -> None:
    async with records_and_prober(tmp_path) as (records, p):
        pass
    with pytest.raises(RuntimeError):
        await records.refresh(Target(NAME_A, 443))
    assert p.statistics().started == 0


async def test_closing_the_records_fails_their_waiters(tmp_path: Path) -> None:
    errors = []

    async def ask(records, target):
        try:
            await records.refresh(target)
        except ProbeError as exc:
            errors.append(exc)

    # The waiter runs outside the records: it outlives their nursery.
    async with (
        open_stalled_target() as stalled,
        trio.open_nursery() as nursery,
        records_and_prober(tmp_path, timeout_s=60.0) as (records, _p),
    ):
        nursery.start_soon(ask, records, stalled.target(NAME_A))
        await stalled.wait_accepted(1)
    assert len(errors) == 1
    assert type(errors[0]) is ProbeError
    assert errors[0].status == 503


async def test_background_refreshes_are_bounded(tmp_path: Path) -> None:
    names = [f"host{i}.example.test" for i in range(6)]
    resolver = static_resolver({name: [LOCALHOST] for name in names})
    async with (
        open_stalled_target() as stalled,
        records_and_prober(tmp_path, resolver=resolver, timeout_s=60.0) as (records, _p),
    ):
        started = [records.refresh_soon(stalled.target(name)) for name in names]
        assert started == [True] * 4 + [False] * 2  # max_background = 4
        assert records.refresh_soon(stalled.target(names[0]))  # joins: always room
        assert records.statistics().running == 4


async def test_a_refresh_says_whether_the_certificate_changed(tmp_path: Path) -> None:
    async with open_tls_target([NAME_A]) as server, records_and_prober(tmp_path) as (records, _):
        target = server.target(NAME_A)
        seen = [await records.refresh(target), await records.refresh(target)]
        server.replace_certificate(NAME_A)
        seen += [await records.refresh(target), await records.refresh(target)]
    assert [record.last_probe_changed for record in seen] == [False, False, True, False]
    assert seen[2].last_probe.leaf.sha256 != seen[1].last_probe.leaf.sha256


async def test_records_refresh_nothing_before_they_are_entered(tmp_path: Path) -> None:
    async with records_and_prober(tmp_path) as (records, p):
        unopened = Records(
            cache=LRUCache(10, 10_000), storage=records._storage, stored=StoredTargets(10, 0.01),
            signer=records._signer, prober=p, merge_window_s=3600, timeline_limits=None,
            max_background=1,
        )
        with pytest.raises(RuntimeError, match="before it was entered"):
            await unopened.refresh(Target(NAME_A, 443))
    assert p.statistics().started == 0


class ListLog:
    """A statement log that keeps the entries it is given."""

    origin = "notary.test/v2/log"

    def __init__(self) -> None:
        self.entries: list[bytes] = []

    def promise(self, signed_at: int) -> dict[str, object]:
        return v2.log_promise(self.origin, signed_at=signed_at, max_merge_delay_s=60)

    def submit(self, signed: v2.SignedStatement) -> None:
        self.entries.append(signed.entry)


async def test_another_workers_change_keeps_the_statement_for_the_record_loaded_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A change another worker committed drops the cached record; with a
    log, its statement is kept aside (bounded) and served by the record
    loaded again while it stands, rather than a new one logged per worker
    and change."""
    from notary.service import records as records_module

    monkeypatch.setattr(records_module, "MAX_CARRIED_STATEMENTS", 1)
    log = ListLog()
    signer = RecordSigner(
        crypto.ConvergenceSigner(convergence_key()), None,
        crypto.Ed25519Signer(crypto.generate_ed25519_key()), V2Config(), lambda: NOW, log=log,
    )
    async with (
        open_tls_target([NAME_A, NAME_B]) as server,
        records_and_prober(tmp_path, signer) as (records, _p),
    ):
        a, b = server.target(NAME_A), server.target(NAME_B)
        record_a, record_b = await records.refresh(a), await records.refresh(b)
        statement = record_a.v2_statement
        assert statement is not None and record_b.v2_statement is not None
        assert len(log.entries) == 2
        storage = records._storage
        with trio.fail_after(5):
            while storage.statistics().committed < 2:  # noqa: ASYNC110 (a counter)
                await trio.sleep(0.01)
        for target, record in ((b, record_b), (a, record_a)):
            assert record.last_probe is not None
            await records.apply_change(Change(1, target, record.last_probe.leaf.sha256, False, "worker 2"))
            assert records._cache.peek(target.key) is None
        assert records.statistics().carried == 1  # the bound: b's was dropped for a's
        loaded = await records.lookup(a)
        assert loaded is not None and loaded is not record_a
        assert loaded.v2_statement is statement and loaded.stands(int(NOW))
        assert records.statistics().carried == 0
        assert len(log.entries) == 2
        reloaded_b = await records.lookup(b)
        assert reloaded_b is not None and reloaded_b.v2_statement is not None
        assert len(log.entries) == 3  # nothing kept for b: its first statement again
