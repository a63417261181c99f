"""Each store engine in turn, for the tests that hold both engines to one
behaviour (engine parity), and every PostgreSQL store in turn, for the
tests of what they share (the connection layer: a restart, a stopped or
stalled server).

``engine`` (a fixture, every test module may use it: ``tests/conftest.py``)
is an ``Engine``, SQLite then PostgreSQL (the throwaway server of
``tests.support.postgres``; that case skips without one). It opens any of
the stores (the observations, the log's rows, the witness's checkpoints)
on one database of the test's own, as a node's stores share one: SQLite a
file in the test's directory, PostgreSQL a new database. Opening again
reaches the same rows; ``reset`` empties them; ``rows`` reads them with a
connection of the test's own (what the store wrote, not what it says).

``postgres_store`` (a fixture) is a ``PostgresStoreKind`` of
``POSTGRES_STORES``: how to open one kind of PostgreSQL store, and a call
of it that writes and reads back.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.merkle import rfc_mth as naive_root
from tests.support.postgres import PostgresServer

__all__ = [
    "ENGINES", "POSTGRES_STORES", "Engine", "PostgresStoreKind", "engine", "naive_root",
    "postgres_store", "signer",
]

ENGINES = ("sqlite", "postgresql")
#: The tables of the observation store (``reset`` empties them).
_OBSERVATION_TABLES = ("runs", "observations", "certificates", "targets", "changes",
                       "probe_claims")
T0 = 1_700_000_000


@dataclass(frozen=True)
class Engine:
    """One engine, and where the test's database is: ``location``, the
    SQLite file or the PostgreSQL dsn."""

    name: str
    location: str

    @property
    def postgresql(self) -> bool:
        return self.name == "postgresql"

    def observations(self, **options: Any) -> Any:
        """The observation store (``Store``'s options as keywords; those
        of SQLite's files only are dropped on PostgreSQL)."""
        if not self.postgresql:
            from notary.state.store import Store

            return Store(Path(self.location), **options)
        from notary.state.pgstore import PostgresStore

        options.pop("synchronous", None)
        options.pop("file_mode", None)
        return PostgresStore(self.location, **options)

    def log(self) -> Any:
        """The log's rows (``LogEngine``)."""
        if not self.postgresql:
            from notary.state.tlogstore import LogStore

            return LogStore(Path(self.location))
        from notary.state.pgtlogstore import PostgresLogStore

        return PostgresLogStore(self.location)

    def witness(self) -> Any:
        """The witness's checkpoints (``WitnessEngine``)."""
        if not self.postgresql:
            from notary.state.witnessstore import WitnessStore

            return WitnessStore(self.location)
        from notary.state.witnessstore import PostgresWitnessStore

        return PostgresWitnessStore(self.location)

    def rows(self, sql: str) -> list[tuple]:
        """The rows of ``sql`` (no parameters), on a connection of its own."""
        if not self.postgresql:
            import sqlite3

            with contextlib.closing(sqlite3.connect(self.location)) as db:
                return db.execute(sql).fetchall()
        import psycopg

        with psycopg.connect(self.location, autocommit=True) as db:
            return [tuple(bytes(v) if isinstance(v, memoryview) else v for v in row)
                    for row in db.execute(sql).fetchall()]

    def table_counts(self, *tables: str) -> dict[str, int]:
        return {table: self.rows(f"SELECT count(*) FROM {table}")[0][0] for table in tables}

    def reset(self) -> None:
        """No observation rows left (every store of it closed: SQLite's
        file goes)."""
        if not self.postgresql:
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.location + suffix)
            return
        import psycopg

        with psycopg.connect(self.location, autocommit=True) as db:
            if db.execute("SELECT to_regclass('targets')").fetchone()[0] is not None:
                db.execute(f"TRUNCATE {', '.join(_OBSERVATION_TABLES)}")


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Engine:
    if request.param == "sqlite":
        return Engine("sqlite", str(tmp_path / "notary.db"))
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return Engine("postgresql", server.new_database())


# -- the log ---------------------------------------------------------------------------


def signer(made: list[tuple[int, bytes]]) -> Callable[[int, bytes], str]:
    """A checkpoint signer that notes each (size, root) it signs in ``made``."""
    def sign(size: int, root: bytes) -> str:
        made.append((size, root))
        return f"checkpoint {size} {root.hex()}\n"
    return sign


# -- every PostgreSQL store ------------------------------------------------------------


@dataclass(frozen=True)
class PostgresStoreKind:
    """How to open one kind of PostgreSQL store (``open(dsn)``), and one
    call of it that writes and reads: ``call(store, i)`` for i = 1, 2, ...
    (each moves the store on, and checks it read back what it wrote)."""

    open: Callable[[str], Any]
    call: Callable[[Any, int], None]


def _open_observations(dsn: str) -> Any:
    from notary.state.pgstore import PostgresStore

    return PostgresStore(dsn)


def _observe(store: Any, i: int) -> None:
    from notary.model.targets import Target
    from tests.support.observations import probe_result

    store.record([probe_result(at=T0 + i)], "writer")
    (observation,) = store.load_timeline(Target("www.example.test", 443)).observations
    assert observation.last_seen == T0 + i


def _follow_the_feed(store: Any, i: int) -> None:
    """The change feed: a commit, then its row read back; pruning."""
    from tests.support.observations import probe_result

    before = store.feed_position()
    store.record([probe_result(f"feed{i}.example.test", at=T0 + i)], f"writer {i}")
    page = store.read_feed(before, 10)
    assert [change.origin for change in page.changes] == [f"writer {i}"]
    assert store.feed_position() == page.last_seq
    store.prune_feed(1)


def _claim(store: Any, i: int) -> None:
    """A probe claim: taken, read, released, and expired ones deleted."""
    from notary.model.targets import Target

    target = Target(f"claim{i}.example.test", 443)
    now_ms = (T0 + i) * 1000
    assert store.claim_probe(target, "a", now_ms, 5_000).holder == "a"
    assert store.claim_probe(target, "b", now_ms, 5_000).holder == "a"
    store.release_claim(target, "a", "refused", now_ms, 10)
    claim = store.read_claim(target)
    assert claim is not None and claim.failure == "refused"
    assert store.delete_expired_claims(now_ms + 10) >= 1


def _open_log(dsn: str) -> Any:
    from notary.state.pgtlogstore import PostgresLogStore

    return PostgresLogStore(dsn)


def _append(store: Any, i: int) -> None:
    appended = store.append([b"entry %d" % i], lambda size, root: f"checkpoint {size}\n")
    head = store.head()
    assert head is not None and head.size == appended.head.size
    assert store.entries(head.size - 1, head.size) == [b"entry %d" % i]


def _open_witness(dsn: str) -> Any:
    from notary.state.witnessstore import PostgresWitnessStore

    return PostgresWitnessStore(dsn)


def _cosign(store: Any, i: int) -> None:
    from notary.protocol.tlog import HeldCheckpoint

    held = store.held("log")
    assert store.swap("log", held, HeldCheckpoint(i, bytes([i]) * 32, f"note {i}\n"))
    assert store.held("log").size == i


#: Every PostgreSQL store by name (the observation store three times: its
#: observations, its change feed, its probe claims).
POSTGRES_STORES = {
    "observations": PostgresStoreKind(_open_observations, _observe),
    "feed": PostgresStoreKind(_open_observations, _follow_the_feed),
    "claims": PostgresStoreKind(_open_observations, _claim),
    "log": PostgresStoreKind(_open_log, _append),
    "witness": PostgresStoreKind(_open_witness, _cosign),
}


@pytest.fixture(params=sorted(POSTGRES_STORES))
def postgres_store(request: pytest.FixtureRequest) -> PostgresStoreKind:
    return POSTGRES_STORES[request.param]
