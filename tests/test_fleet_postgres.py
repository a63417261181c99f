"""Two notaries of a fleet on one PostgreSQL database (a throwaway server
on loopback, ``tests.support.postgres``): what one observes, the other
answers from and tells its watchers."""

from __future__ import annotations

import hashlib
from pathlib import Path

import trio

from notary.model.targets import Target
from notary.protocol.convergence import format_fingerprint
from notary.state import crypto
from tests.support.notaries import legacy_query, open_notary
from tests.support.postgres import PostgresServer
from tests.support.sites import open_site
from tests.support.tls_targets import open_tls_target
from tests.support.watching import watching

SITE = "fleet.example.test"


def fleet_store(postgres: PostgresServer, dsn: str) -> dict[str, object]:
    return {"backend": "postgresql", "dsn": dsn, "batch_interval_ms": 10}


async def test_a_target_one_node_probed_is_answered_by_the_other_from_the_store(
    tmp_path: Path, postgres_server: PostgresServer,
) -> None:
    store = fleet_store(postgres_server, postgres_server.new_database())
    async with open_tls_target(names=[SITE]) as site:
        names = {SITE: [site.host]}
        path = f"{SITE}+{site.port}"
        async with (
            open_notary(tmp_path / "a", names=names, store=store) as first,
            open_notary(tmp_path / "b", names=names, store=store) as second,
        ):
            assert (await legacy_query(first.port, path, None)).status == 200
            assert site.accepted == 1
            key = Target(SITE, site.port).key
            with trio.fail_after(10):  # committed, then read from the feed
                while not second.running.stored.may_contain(key):  # noqa: ASYNC110
                    await trio.sleep(0.01)
            assert (await legacy_query(second.port, path, None)).status == 200
            assert site.accepted == 1  # no probe on the second node


async def test_a_watcher_on_one_node_sees_a_change_the_other_probed(
    tmp_path: Path, postgres_server: PostgresServer,
) -> None:
    """At once: the commit's NOTIFY wakes the other node, long before its
    next scheduled read of the feed."""
    store = {**fleet_store(postgres_server, postgres_server.new_database()),
             "feed_interval_ms": 60_000}
    v2_key = tmp_path / "v2.key"
    crypto.write_ed25519_private_key(v2_key, crypto.generate_ed25519_key())
    async with open_tls_target(names=[SITE]) as site:
        names = {SITE: [site.host]}
        target = Target(SITE, site.port)
        async with (
            open_notary(tmp_path / "a", names=names, store=store,
                        v2={"key_file": v2_key}) as prober_node,
            open_notary(tmp_path / "b", names=names, store=store,
                        v2={"key_file": v2_key}) as watched_node,
        ):
            await prober_node.running.records.refresh(target)  # the first certificate
            pem = crypto.certificate_pem(watched_node.certificate).decode()
            async with watching(watched_node.port, pem, target) as watcher:
                new_der = site.replace_certificate(SITE)
                await prober_node.running.records.refresh(target)  # on the other node
                await watcher.next_event(5)  # not the 60 s of feed_interval_ms
                await trio.sleep(0.3)  # and only once
            events = watcher.events
    assert len(events) == 1
    assert hashlib.sha256(new_der).digest() in {o.sha256 for o in events[0].observations}


async def test_a_split_site_s_rotation_at_one_address_is_one_event_on_the_other_node(
    tmp_path: Path, postgres_server: PostgresServer,
) -> None:
    """Issue 31 in a fleet: a site serving a certificate per address, probed
    by one node; a watcher on the other node sees one event when one
    address serves a new certificate, and none for a probe seeing the same
    certificates again; the other node answers every certificate from the
    store."""
    store = fleet_store(postgres_server, postgres_server.new_database())
    v2_key = tmp_path / "v2.key"
    crypto.write_ed25519_private_key(v2_key, crypto.generate_ed25519_key())
    addresses = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
    async with open_site(addresses) as site:
        names = {site.name: list(addresses)}
        target = site.target()
        async with (
            open_notary(tmp_path / "a", names=names, store=store,
                        v2={"key_file": v2_key}) as prober_node,
            open_notary(tmp_path / "b", names=names, store=store,
                        v2={"key_file": v2_key}) as watched_node,
        ):
            await prober_node.running.records.refresh(target)
            pem = crypto.certificate_pem(watched_node.certificate).decode()
            async with watching(watched_node.port, pem, target) as watcher:
                await prober_node.running.records.refresh(target)  # the same three
                new_der = site.replace_certificate("127.0.0.3")
                await prober_node.running.records.refresh(target)
                await watcher.next_event(5)
                await prober_node.running.records.refresh(target)  # nothing new again
                await trio.sleep(0.5)
            events = watcher.events
            accepted = site.accepted
            path = f"{site.name}+{site.port}"
            for der in site.leaves():
                fp = format_fingerprint(hashlib.sha1(der).digest())
                assert (await legacy_query(watched_node.port, path, fp)).status == 200
            assert site.accepted == accepted  # answered from the store
    assert len(events) == 1
    assert {hashlib.sha256(der).digest() for der in site.leaves()} <= {
        o.sha256 for o in events[0].observations
    }
    assert hashlib.sha256(new_der).digest() in {o.sha256 for o in events[0].observations}


def test_messages_name_the_database_never_its_password() -> None:
    from notary.state.dsn import describe_dsn

    for dsn in ("postgresql://notary:s3cret@db.example.org:5433/notary",
                "host=db.example.org port=5433 dbname=notary user=notary password=s3cret"):
        assert describe_dsn(dsn) == "postgresql://notary@db.example.org:5433/notary"
    assert "s3cret" not in describe_dsn("password=s3cret host=")


async def test_while_the_database_is_away_a_node_answers_and_then_catches_up(
    tmp_path: Path, postgres_server: PostgresServer,
) -> None:
    from notary.state.pgstore import PostgresStore
    from tests.support.http_client import http_get
    from tests.support.notaries import admin_port
    from tests.support.polling import wait_for

    store = fleet_store(postgres_server, postgres_server.new_database())
    async with open_tls_target(names=[SITE, "new.example.test"]) as site:
        names = {SITE: [site.host], "new.example.test": [site.host]}
        async with open_notary(tmp_path / "a", names=names, store=store) as node:
            admin = admin_port(node)

            async def ready() -> bool:
                return (await http_get(admin, "/readyz"))[0] == 200

            async def not_ready() -> bool:
                return not await ready()

            cached = f"{SITE}+{site.port}"
            assert (await legacy_query(node.port, cached, None)).status == 200
            await wait_for(lambda: _committed(node, 1))
            await trio.to_thread.run_sync(postgres_server.stop)
            try:
                assert (await legacy_query(node.port, cached, None)).status == 200  # cache hit
                fresh = f"new.example.test+{site.port}"
                assert (await legacy_query(node.port, fresh, None)).status == 200  # probed
                await wait_for(not_ready)
                assert b"store not writable" in (await http_get(admin, "/readyz"))[2]
            finally:
                await trio.to_thread.run_sync(postgres_server.start)
            with trio.fail_after(30):  # the writer's back-off is at most 5 s
                await wait_for(ready)
                await wait_for(lambda: _committed(node, 2))
    with PostgresStore(str(store["dsn"]), create=False) as reopened:
        assert reopened.load_timeline(Target("new.example.test", site.port)).observations


async def _committed(node, rows: int) -> bool:
    return node.running.storage.statistics().committed >= rows


async def test_a_node_killed_under_write_load_leaves_a_whole_store_and_the_other_answers(
    tmp_path: Path, postgres_server: PostgresServer,
) -> None:
    """Two nodes as an operator runs them (``notary serve`` processes, each
    its own key), one database. Node A probes many targets and is killed
    with SIGKILL mid-load: every batch it committed is whole (each feed row
    has its observation), and node B answers every target A stored from the
    store (the targets are gone by then: without the store it would answer
    503)."""
    import signal

    from notary.state.pgstore import PostgresStore
    from tests.support.nodes import get, run_node, tls_targets

    dsn = postgres_server.new_database()
    config = f'[store]\nbackend = "postgresql"\ndsn = "{dsn}"\n'
    async with (
        run_node(tmp_path / "a", workers=1, more_config=config) as node_a,
        run_node(tmp_path / "b", workers=1, more_config=config) as node_b,
    ):
        plain = {}
        for name, node in (("a", node_a), ("b", node_b)):
            match = await node.wait_for(r"plain-HTTP API .* on 127\.0\.0\.1:(\d+)")
            plain[name] = int(match.group(1))
        answered: list[int] = []

        async def client(targets: list[int]) -> None:
            for target_port in targets:
                outcome = await get(plain["a"], f"/target/127.0.0.1+{target_port}")
                if outcome == ("answered", 200):
                    answered.append(target_port)

        def committed() -> int:
            with PostgresStore(dsn, create=False) as store:
                return store._db.read("SELECT count(*) FROM observations")[0][0]

        async with tls_targets(60) as ports, trio.open_nursery() as nursery:
            for start in range(4):
                nursery.start_soon(client, ports[start::4])
            # Killed mid-load: answers given and at least one batch committed
            # (on a fast machine 20 answers can come before the first flush).
            with trio.fail_after(30):
                while len(answered) < 20 or not committed():  # noqa: ASYNC110
                    await trio.sleep(0.01)
            node_a.process.send_signal(signal.SIGKILL)
        await node_a.process.wait()
        with PostgresStore(dsn, create=False) as store:
            db = store._db
            feed_rows = db.read("SELECT count(*) FROM changes")[0][0]
            without_observation = db.read(
                "SELECT count(*) FROM changes c WHERE NOT EXISTS (SELECT 1 FROM targets t "
                "JOIN observations o ON o.target_id = t.id JOIN certificates x ON "
                "x.id = o.certificate_id WHERE t.host = c.host AND t.port = c.port "
                "AND x.sha256 = c.sha256)"
            )[0][0]
            stored = {port for (port,) in db.read(
                "SELECT t.port FROM targets t WHERE EXISTS "
                "(SELECT 1 FROM observations o WHERE o.target_id = t.id)"
            )}
        assert feed_rows >= len(stored) > 0 and without_observation == 0
        for target_port in sorted(stored):  # the targets are closed now
            assert await get(plain["b"], f"/target/127.0.0.1+{target_port}") == ("answered", 200)


def test_the_db_commands_work_on_a_postgresql_store(
    tmp_path: Path, postgres_server: PostgresServer, capsys,
) -> None:
    from notary import cli
    from notary.state.pgstore import PostgresStore
    from tests.support.observations import probe_result

    dsn = postgres_server.new_database()
    config = tmp_path / "n.toml"
    config.write_text(
        '[server]\nkey_file = "k"\ncert_file = "c"\n'
        f'[store]\nbackend = "postgresql"\ndsn = "{dsn}"\n'
    )
    assert cli.main(["db", "init", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("postgresql://postgres@127.0.0.1:") and "schema version 6" in out
    with PostgresStore(dsn, create=False) as store:
        store.record([probe_result("a.example.test"), probe_result("b.example.test")])
    assert cli.main(["db", "stats", "--config", str(config)]) == 0
    stats = capsys.readouterr().out
    assert "targets:        2" in stats and "database bytes:" in stats
    assert cli.main(["db", "compact", "--config", str(config)]) == 0
    assert "database bytes:" in capsys.readouterr().out
    # --db still names a SQLite file, whatever the configuration's backend.
    assert cli.main(["db", "init", "--config", str(config), "--db", str(tmp_path / "x.db")]) == 0
    assert (tmp_path / "x.db").exists()


def test_a_store_that_cannot_be_reached_is_one_line_without_its_password(capsys) -> None:
    from notary import cli

    closed = "host=127.0.0.1 port=1 user=notary password=s3cret dbname=notary connect_timeout=2"
    status = cli.main(["db", "stats", "--config", str(_config_with(closed))])
    err = capsys.readouterr().err
    assert status == 1 and err.count("\n") == 1 and "s3cret" not in err
    assert "postgresql://notary@127.0.0.1:1/notary" in err


def _config_with(dsn: str) -> Path:
    import tempfile

    path = Path(tempfile.mkdtemp()) / "n.toml"
    path.write_text(f'[server]\nkey_file = "k"\ncert_file = "c"\n[store]\nbackend = "postgresql"\n'
                    f'dsn = "{dsn}"\n')
    return path


async def test_the_writer_commits_everything_queued_on_a_postgresql_store(
    postgres_server: PostgresServer,
) -> None:
    from notary.outbound.writer import open_storage
    from notary.state.pgstore import PostgresStore
    from tests.support.observations import probe_result, store_section

    dsn = postgres_server.new_database()
    section = store_section(backend="postgresql", dsn=dsn, batch_interval_ms=10_000)
    results = [probe_result(f"h{i % 10}.example.test", at=1_700_000_000 + i) for i in range(100)]
    async with open_storage(None, section) as storage:  # type: ignore[arg-type]
        for result in results:
            await storage.record(result)
        assert storage.statistics().committed == 0  # a batch waits for its interval...
    with PostgresStore(dsn, create=False) as store:  # ...and the clean stop commits it
        assert store.statistics().observations == 10
        assert store.feed_position() == 100
