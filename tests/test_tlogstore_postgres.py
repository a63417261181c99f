"""``notary.state.pgtlogstore``: what only the log on PostgreSQL does (a
throwaway server on loopback, ``tests.support.postgres``; skipped without
one; what both engines do is in tests/test_tlogstore.py). Connections
appending at once from threads take turns through the advisory lock, one
tree; a turn that does not come in time fails with nothing written; nodes
starting at once make the tables once; and two notaries of a fleet, each
answering v2 queries, keep one log whose checkpoint verifies."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import trio

from notary.errors import StoreError
from notary.protocol import tlog, v2
from notary.state import crypto
from notary.state.tlogstore import Appended
from tests.support.engines import naive_root, signer
from tests.support.postgres import PostgresServer


@pytest.fixture
def dsn(postgres_server: PostgresServer) -> str:
    return postgres_server.new_database()


def open_log(dsn: str):
    from notary.state.pgtlogstore import PostgresLogStore

    return PostgresLogStore(dsn)


def test_connections_appending_at_once_from_threads_make_one_tree(dsn: str) -> None:
    """Each thread its own connection (a node), many small batches at once:
    no index is used twice, every batch lands whole and contiguous, and each
    checkpoint is the naive root of the entries in their committed order."""
    threads_n, batches_n = 4, 15
    results: dict[int, list[tuple[list[bytes], Appended]]] = {n: [] for n in range(threads_n)}
    made: list[tuple[int, bytes]] = []
    made_lock = threading.Lock()
    failures: list[BaseException] = []
    start = threading.Barrier(threads_n)

    def sign(size: int, root: bytes) -> str:
        with made_lock:
            made.append((size, root))
        return f"checkpoint {size} {root.hex()}\n"

    def node(n: int) -> None:
        try:
            with open_log(dsn) as store:
                start.wait()
                for b in range(batches_n):
                    batch = [b"node %d batch %d entry %d" % (n, b, i) for i in range(1 + b % 7)]
                    results[n].append((batch, store.append(batch, sign)))
        except BaseException as exc:  # reported below, in the test's thread
            failures.append(exc)

    threads = [threading.Thread(target=node, args=(n,)) for n in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failures, failures
    with open_log(dsn) as store:
        head = store.head()
        assert head is not None
        stored = store.entries(0, head.size)
    total = sum(len(batch) for n in results for batch, _ in results[n])
    assert head.size == len(stored) == total
    used: set[int] = set()
    for n in results:
        for batch, appended in results[n]:
            indices = range(appended.first_index, appended.first_index + len(batch))
            assert used.isdisjoint(indices)
            used.update(indices)
            assert stored[indices.start:indices.stop] == batch  # whole, in order
            size = appended.head.size
            assert size == indices.stop  # the checkpoint made for this very batch
            for offset, proof in enumerate(appended.proofs):
                tlog.verify_inclusion(tlog.leaf_hash(batch[offset]), indices.start + offset,
                                      size, proof, naive_root(stored[:size]))
    assert used == set(range(total))
    assert sorted(made) == [(size, naive_root(stored[:size])) for size, _ in sorted(made)]
    assert (head.size, naive_root(stored)) in made


def test_a_batch_waiting_past_the_lock_timeout_is_a_store_error(
    dsn: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another node holding the log's lock: ``append`` gives up after
    ``LOCK_TIMEOUT_MS`` with nothing written (the appender retries)."""
    import psycopg

    from notary.state import pgtlogstore

    monkeypatch.setattr(pgtlogstore, "LOCK_TIMEOUT_MS", 300)
    with open_log(dsn) as store, psycopg.connect(dsn) as holder:
        store.append([b"first"], signer([]))
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (pgtlogstore.LOG_LOCK,))
        with pytest.raises(StoreError, match=r"postgresql://postgres@127\.0\.0\.1.*timeout"):
            store.append([b"waits"], signer([]))
        holder.rollback()  # the lock released: the retry goes through
        assert store.append([b"waits"], signer([])).first_index == 1
        assert store.entries(0, 5) == [b"first", b"waits"]


def test_nodes_starting_at_once_make_the_schema_once(dsn: str) -> None:
    stores, failures = [], []

    def start() -> None:
        try:
            stores.append(open_log(dsn))
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    for store in stores:
        store.close()
    assert not failures and len(stores) == 4


# -- two notaries of a fleet, one log --------------------------------------------


async def test_two_nodes_of_a_fleet_keep_one_log(
    tmp_path: Path, postgres_server: PostgresServer, dsn: str,
) -> None:
    """Two notaries (the same v2 key and log origin: one logical notary) on
    one PostgreSQL store, each answering v2 queries for its own targets:
    every statement is proven in the tree of the checkpoint it carries, and
    the log then holds both nodes' statements in one tree whose signed
    checkpoint verifies and matches what both nodes serve."""
    from tests.support.log_notaries import LOG, ORIGIN, get, logged_statement, open_checkpoint
    from tests.support.notaries import open_notary
    from tests.support.tls_targets import open_tls_target

    store = {"backend": "postgresql", "dsn": dsn, "batch_interval_ms": 10}
    v2_key = tmp_path / "v2.key"
    crypto.write_ed25519_private_key(v2_key, crypto.generate_ed25519_key())
    names = [f"site{i}.example.test" for i in range(6)]
    async with open_tls_target(names=names) as site:
        hosts = {name: [site.host] for name in names}
        sections = {"store": store, "v2": {"key_file": v2_key}, "log": LOG,
                    "answers": {"failures_at_deadline": False}}
        async with (
            open_notary(tmp_path / "a", names=hosts, **sections) as node_a,
            open_notary(tmp_path / "b", names=hosts, **sections) as node_b,
        ):
            key = node_a.running.signers["v2"].public_raw  # type: ignore[attr-defined]
            now = int(node_a.clock())
            statements: list[v2.ParsedStatement] = []
            async with trio.open_nursery() as nursery:
                async def ask(node, name: str) -> None:
                    statements.append(await logged_statement(node, (name, site.port)))

                for i, name in enumerate(names):
                    nursery.start_soon(ask, node_a if i % 2 == 0 else node_b, name)
            for statement in statements:  # each proven to a checkpoint it carries
                assert v2.verify_logged(statement, key, now=now).checkpoint is not None
            served = {(await get(node, "/v2/log/checkpoint")) for node in (node_a, node_b)}
    with open_log(dsn) as log:
        head = log.head()
        assert head is not None
        entries = log.entries(0, head.size)
    origin, size, root = open_checkpoint(head.checkpoint, key)
    assert (origin, size) == (ORIGIN, len(entries)) and root == naive_root(entries)
    assert {s.entry_bytes for s in statements} <= set(entries)
    for status, note in served:  # each node's checkpoint is of this one tree
        assert status == 200
        _, served_size, served_root = open_checkpoint(note.decode(), key)
        assert served_size <= size and served_root == naive_root(entries[:served_size])


def test_a_fleet_may_keep_the_log(tmp_path: Path) -> None:
    """``[log] enabled`` with the PostgreSQL store is a valid configuration
    (needs no server: nothing connects at load)."""
    from notary.config import load_config
    from tests.support.config_files import server_file

    config = load_config(server_file(tmp_path, rest=(
        '[store]\nbackend = "postgresql"\ndsn = "host=db dbname=notary"\n'
        f'[v2]\nkey_file = "{tmp_path / "v2.key"}"\n'
        '[log]\nenabled = true\norigin = "notary.example.org/v2/log"\n'
    )))
    assert config.log.enabled and config.store.backend == "postgresql"
