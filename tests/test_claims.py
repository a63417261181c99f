"""Probe claims (``notary.state.claims``, ``notary.service.claims``): the
processes sharing a store probe a target once at a time. Two ``Storage``
objects on one database stand for two workers (each its own origin)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import trio

from notary.errors import ProbeHandshakeFailed
from notary.model.policy import AddressPolicy
from notary.model.targets import Target
from notary.outbound.probe import open_prober
from notary.outbound.writer import open_storage
from notary.service.claims import NodeProber
from notary.state.store import Store
from tests.support.observations import store_section
from tests.support.tls_targets import (
    LOCALHOST,
    open_garbage_target,
    open_tls_target,
    with_probe_section,
)

POLL_S = 0.02


@asynccontextmanager
async def workers(tmp_path: Path, count: int, ttl_s: float = 10.0) -> AsyncIterator[list[NodeProber]]:
    """``count`` node probers over one database, each with its storage
    (origin) and its prober."""
    async with AsyncExitStack() as stack:
        probers = []
        for _ in range(count):
            storage = await stack.enter_async_context(
                open_storage(tmp_path / "shared.db", store_section(batch_interval_ms=1))
            )
            prober = await stack.enter_async_context(open_prober(**with_probe_section({
                "policy": AddressPolicy.from_cidrs(["127.0.0.0/8"]), "timeout_s": 5.0,
                "max_concurrent": 8,
            })))
            probers.append(NodeProber(
                storage, prober, ttl_s=ttl_s, poll_interval_s=POLL_S, linger_s=1.0,
                clock=time.time,
            ))
        yield probers


async def record_when_probed(node: NodeProber, target: Target, into: list) -> None:
    """What ``Records`` does with a probe: a fresh one is written to the store."""
    probed = await node.probe(target)
    if not probed.stored:
        await node._storage.record(*probed.report.sightings)
    into.append(probed)


async def test_a_target_asked_of_every_worker_at_once_is_probed_once(tmp_path: Path) -> None:
    async with open_tls_target(names=[]) as site, workers(tmp_path, 4) as nodes:
        site.pause()
        target = Target(LOCALHOST, site.port)
        probed: list = []
        async with trio.open_nursery() as nursery:
            for node in nodes:
                nursery.start_soon(record_when_probed, node, target, probed)
            await site.wait_accepted(1)
            await trio.sleep(0.2)  # every worker has claimed or is waiting
            site.resume()
        assert site.accepted == 1
        assert sorted(p.stored for p in probed) == [False, True, True, True]
        assert {p.report.primary.leaf.sha256 for p in probed} == {hashlib.sha256(site.leaf_der()).digest()}
        assert sum(node.waited for node in nodes) == 3


async def test_the_holders_failure_is_shared_not_repeated(tmp_path: Path) -> None:
    async with open_garbage_target() as garbage, workers(tmp_path, 3) as nodes:
        target = Target(LOCALHOST, garbage.port)
        failures: list[BaseException] = []

        async def probe(node: NodeProber) -> None:
            try:
                await node.probe(target)
            except ProbeHandshakeFailed as exc:
                failures.append(exc)

        async with trio.open_nursery() as nursery:
            for node in nodes:
                nursery.start_soon(probe, node)
        assert len(failures) == 3
        assert garbage.accepted == 1


async def test_a_dead_holders_claim_expires_and_the_waiter_probes(tmp_path: Path) -> None:
    async with open_tls_target(names=[]) as site, workers(tmp_path, 1) as (node,):
        target = Target(LOCALHOST, site.port)
        with Store(tmp_path / "shared.db", create=False) as store:  # a worker that died
            store.claim_probe(target, "dead", int(time.time() * 1000), ttl_ms=300)
        started = trio.current_time()
        probed = await node.probe(target)
        assert not probed.stored and site.accepted == 1
        assert trio.current_time() - started >= 0.2  # it waited for the claim
        assert node.claims_expired == 1


def test_a_claim_stands_until_it_expires_or_its_holder_claims_again(tmp_path: Path) -> None:
    target = Target(LOCALHOST, 443)
    with Store(tmp_path / "c.db") as store:
        assert store.claim_probe(target, "a", 1000, 500).holder == "a"
        assert store.claim_probe(target, "b", 1200, 500).holder == "a"  # a's stands
        assert store.claim_probe(target, "a", 1300, 500).until_ms == 1800  # renewed
        taken = store.claim_probe(target, "b", 1800, 500)
        assert (taken.holder, taken.until_ms) == ("b", 2300)
        store.release_claim(target, "a", "timeout", 1900, 100)  # not a's any more: no effect
        assert store.read_claim(target).failure is None
        store.release_claim(target, "b", "timeout", 1900, 100)
        assert (store.read_claim(target).failure, store.read_claim(target).until_ms) == (
            "timeout", 2000
        )
        assert store.delete_expired_claims(2000) == 1
        assert store.read_claim(target) is None


async def test_workers_without_a_shared_target_do_not_wait(tmp_path: Path) -> None:
    async with (
        open_tls_target(names=[]) as one, open_tls_target(names=[]) as two,
        workers(tmp_path, 2) as nodes,
    ):
        probed = [await nodes[0].probe(Target(LOCALHOST, one.port)),
                  await nodes[1].probe(Target(LOCALHOST, two.port))]
        assert [p.stored for p in probed] == [False, False]
        assert one.accepted == two.accepted == 1
        assert sum(node.waited for node in nodes) == 0
