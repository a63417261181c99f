"""One node, several workers, one notary: what one worker learns reaches the
others through the store's change feed (loopback only; the node runs as
an operator runs it, ``notary serve`` in a subprocess)."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import trio

from notary.model.targets import Target
from notary.protocol.convergence import format_fingerprint
from notary.state import crypto
from tests.support.nodes import get, plain_port, run_node
from tests.support.notaries import LOCALHOST, legacy_query, open_notary
from tests.support.sites import open_site
from tests.support.tls_targets import open_tls_target
from tests.support.watching import watching

WORKERS = 4
CHANGES = 6
#: How long a watcher may wait for an event after the query whose probe saw
#: the change: the writer's batch interval (50 ms) and the feed's interval
#: (100 ms) with room for a loaded machine; bench/ measures the real delay.
EVENT_WITHIN_S = 5.0


async def test_a_watcher_sees_every_change_whichever_worker_probed_it(tmp_path: Path) -> None:
    v2_key = tmp_path / "v2.key"
    crypto.write_ed25519_private_key(v2_key, crypto.generate_ed25519_key())
    v2_key.chmod(0o644)
    config = (
        f'[v2]\nkey_file = "{v2_key}"\n'
        # Every query after a second probes: each lands on whichever worker
        # the kernel gives the connection.
        '[answers]\nfresh_for_s = 1\n'
        '[limits]\nprobes_per_minute_per_target = 0\n'  # no spacing of one target's probes
    )
    async with (
        open_tls_target(names=[]) as site,
        run_node(tmp_path / "node", workers=WORKERS, more_config=config) as node,
    ):
        plain = await plain_port(node, WORKERS)
        api = int((await node.wait_for(r"serving the API on 127\.0\.0\.1:(\d+)")).group(1))
        target = Target(LOCALHOST, site.port)
        path = f"/target/{LOCALHOST}+{site.port}"
        assert await get(plain, path) == ("answered", 200)  # the first certificate
        certificate = (tmp_path / "node" / "notary.crt").read_bytes().decode()
        served = []
        def origins() -> set[str]:
            with sqlite3.connect(tmp_path / "node" / "notary.db") as db:
                return {row[0] for row in db.execute(
                    "SELECT origin FROM changes WHERE changed = 1")}

        async with watching(api, certificate, target) as watcher:
            # The workers share the listening socket: which one accepts a
            # connection is the kernel's (and the workers' wake-up) choice,
            # so a few more changes are made until two workers probed some.
            while len(served) < CHANGES or (len(origins()) < 2 and len(served) < 3 * CHANGES):
                served.append(site.replace_certificate())
                await trio.sleep(2.1)  # past fresh_for_s (whole seconds): the next query probes
                assert await get(plain, path) == ("answered", 200)
                await watcher.next_event(EVENT_WITHIN_S)
            await trio.sleep(0.5)  # no late duplicate
        events = watcher.events
    assert len(events) == len(served)
    for event, der in zip(events, served, strict=True):
        assert hashlib.sha256(der).digest() in {o.sha256 for o in event.observations}
    assert len(origins()) >= 2  # the changes were probed by several workers



async def test_a_new_target_asked_of_the_node_at_once_is_probed_once(tmp_path: Path) -> None:
    """Many clients ask about one target the node never saw; their
    connections land on several workers; one of them probes (a claim in the
    store), the others answer from its observation."""
    async with (
        open_tls_target(names=[]) as site,
        run_node(tmp_path / "node", workers=WORKERS) as node,
    ):
        plain = await plain_port(node, WORKERS)
        site.pause()
        answers: list[tuple[str, int]] = []

        async def ask() -> None:
            answers.append(await get(plain, f"/target/{LOCALHOST}+{site.port}"))

        async with trio.open_nursery() as nursery:
            for _ in range(4 * WORKERS):
                nursery.start_soon(ask)
            await site.wait_accepted(1)
            await trio.sleep(1.0)  # every connection has reached a worker
            site.resume()
    assert answers == [("answered", 200)] * (4 * WORKERS)
    assert site.accepted == 1


async def test_a_clients_query_rate_over_two_workers_stays_near_the_configured_rate(
    tmp_path: Path,
) -> None:
    """Each worker enforces its share of the per-client rates: a client
    spraying connections over the node gets about the configured rate, not
    one per worker."""
    rate, burst = 5.0, 5
    config = (
        f'[limits]\nexempt_clients = []\nqueries_per_s_per_prefix = {rate}\n'
        f'query_burst = {burst}\n'
    )
    async with (
        open_tls_target(names=[]) as site,
        run_node(tmp_path / "node", workers=2, more_config=config) as node,
    ):
        plain = await plain_port(node, 2)
        path = f"/target/{LOCALHOST}+{site.port}"
        statuses: list[int] = []
        started = trio.current_time()
        while trio.current_time() - started < 3.0:
            async with trio.open_nursery() as nursery:
                for _ in range(8):
                    nursery.start_soon(lambda: _count(plain, path, statuses))
        elapsed = trio.current_time() - started
    assert statuses.count(429) > 0
    assert statuses.count(200) <= 1.5 * (rate * elapsed + burst)
    assert set(statuses) <= {200, 429}


async def _count(port: int, path: str, statuses: list[int]) -> None:
    outcome, status = await get(port, path)
    assert outcome == "answered"
    statuses.append(status)


async def test_two_workers_probe_a_split_site_once_and_each_answers_every_certificate(
    tmp_path: Path,
) -> None:
    """Issue 31, in a node (two workers in this process, one SQLite store):
    both refresh a site served at three addresses at once; one probes every
    address (the claim), the other reads its report back from the store;
    then each worker vouches for every certificate without a probe."""
    db = tmp_path / "shared.db"
    addresses = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
    async with open_site(addresses) as site:
        names = {site.name: list(addresses)}
        target, path = site.target(), f"{site.name}+{site.port}"
        async with (
            open_notary(tmp_path / "a", names=names, server={"db_file": db},
                        shared_store=True) as first,
            open_notary(tmp_path / "b", names=names, server={"db_file": db},
                        shared_store=True) as second,
        ):
            refreshed = []

            async def refresh(notary) -> None:
                refreshed.append(await notary.running.records.refresh(target))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(refresh, first)
                nursery.start_soon(refresh, second)
            assert site.accepted == 3  # one probe: each address once
            for record in refreshed:
                assert record.last_report is not None
                assert {leaf.der for leaf in record.last_report.leaves} == site.leaves()
            for notary in (first, second):
                for der in site.leaves():
                    fp = format_fingerprint(hashlib.sha1(der).digest())
                    assert (await legacy_query(notary.port, path, fp)).status == 200
            assert site.accepted == 3
    with sqlite3.connect(db) as connection:  # one change in the feed for the probe
        rows = connection.execute("SELECT host, changed FROM changes").fetchall()
    assert rows == [(site.name, 0)]
