"""Socket-level faults of PostgreSQL, the last of the notary's outbound
clients (``tests.support.faults``, issue 30 item 3): a fake server on
loopback standing in for it (reset on accept, mid-handshake or mid-answer,
a half-close, a server that never reads or never answers), and a proxy in
front of the throwaway real one (``tests.support.postgres``) that drips
its answers, stalls or resets its connections at any moment.

* Opening each PostgreSQL store (observations, log, witness) against each
  fault fails with ``StoreError`` within the connect timeout.
* A call on an open store whose server stalls fails with ``StoreError``
  within the call timeout; every store works again once the server
  answers.
* A notary whose PostgreSQL stalls keeps answering cache hits and
  ``/healthz``, answers a miss within its query deadline, recovers when
  the server answers again, and stops within its bounds when it never
  does.

Real time: the stores run in worker threads, and psycopg's waits are the
machine's, so the timeouts are lowered for the module (psycopg's connect
timeout cannot go under 2 s). Left out: a server that drops packets
without a reset (a partition; loopback cannot lose packets without
changing the machine's firewall) and the fleet's feed and claims
connections alone (they share the stores' connection code tested here).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from notary.errors import StoreError
from notary.outbound import writer
from notary.state import connection, crypto
from tests.support.engines import POSTGRES_STORES, PostgresStoreKind
from tests.support.faults import ProxyMode, ServerFault, open_faulty_proxy, open_faulty_server
from tests.support.http_client import http_get
from tests.support.notaries import legacy_query, load_each_key_once, open_notary
from tests.support.postgres import PostgresServer
from tests.support.tls_targets import LOCALHOST, open_tls_target

SITE, OTHER = "www.example.test", "other.example.test"
#: psycopg's least connect timeout.
CONNECT_TIMEOUT_S = 2
#: The stores' bound on one call, for this module.
CALL_TIMEOUT_S = 1.0
#: What no open or call may take here, whatever the fault: an upper bound
#: (so that a hang fails the test instead of holding it), not a timing.
HANG_S = 15.0
_RSA_KEY = crypto.generate_rsa_key()


@pytest.fixture(autouse=True)
def short_timeouts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stores' timeouts, lowered; and one RSA key for every notary."""
    monkeypatch.setattr(connection, "CONNECT_TIMEOUT_S", CONNECT_TIMEOUT_S)
    monkeypatch.setattr(connection, "MAX_CALL_S", CALL_TIMEOUT_S)
    monkeypatch.setattr(crypto, "generate_rsa_key", lambda *args, **kwargs: _RSA_KEY)
    load_each_key_once(monkeypatch)


def dsn(port: int, database: str = "postgres") -> str:
    return f"host={LOCALHOST} port={port} user=postgres dbname={database} sslmode=disable"


def database_of(server: PostgresServer) -> str:
    return server.new_database().rpartition("dbname=")[2]


def startup_answer(request: bytes) -> bytes | None:
    """What a server answers first: to libpq's StartupMessage (its length
    first), an authentication request it will never see answered."""
    if len(request) < 4 or len(request) < int.from_bytes(request[:4], "big"):
        return None
    return b"R\x00\x00\x00\x08\x00\x00\x00\x03"  # AuthenticationCleartextPassword


async def in_thread(function: Callable[[], Any]) -> Any:
    """``function()`` in a worker thread, abandoned (the test failing) if it
    hangs past ``HANG_S``."""
    with trio.fail_after(HANG_S):
        return await trio.to_thread.run_sync(function, abandon_on_cancel=True)


async def open_each_store(port: int, database: str) -> dict[str, BaseException | None]:
    """Open every store on ``port`` at once: what each raised."""
    raised: dict[str, BaseException | None] = {}

    async def open_one(name: str) -> None:
        try:
            store = await in_thread(partial(POSTGRES_STORES[name].open, dsn(port, database)))
        except StoreError as exc:
            raised[name] = exc
        else:
            raised[name] = None
            store.close()

    async with trio.open_nursery() as nursery:
        for name in POSTGRES_STORES:
            nursery.start_soon(open_one, name)
    return raised


#: The faults a fake server does (DRIP needs the real server's answers: the
#: proxy drips them).
OPEN_FAULTS = [fault for fault in ServerFault if not fault.value.startswith("answer-")]


@pytest.mark.parametrize("fault", OPEN_FAULTS, ids=lambda fault: fault.value)
async def test_opening_a_store_on_a_faulty_server_fails(
    fault: ServerFault, request: pytest.FixtureRequest,
) -> None:
    if fault is ServerFault.DRIP:  # the real server's answers, dripped
        postgres_server: PostgresServer = request.getfixturevalue("postgres_server")
        database = database_of(postgres_server)
        async with open_faulty_proxy((LOCALHOST, postgres_server.port)) as proxy:
            proxy.mode = ProxyMode.DRIP
            proxy.drip_interval_s = 0.1  # real seconds: ~40 s for a session's start
            raised = await open_each_store(proxy.port, database)
    else:
        async with open_faulty_server(fault, startup_answer) as server:
            raised = await open_each_store(server.port, "postgres")
    assert {name: type(exc) for name, exc in raised.items()} == dict.fromkeys(
        POSTGRES_STORES, StoreError
    )


async def test_a_call_on_a_stalled_server_fails_in_time(
    postgres_store: PostgresStoreKind, postgres_server: PostgresServer,
) -> None:
    """Every store fails a call the stalled server holds, and works again
    on the next call once the server answers (the connection made again)."""
    database = database_of(postgres_server)
    async with open_faulty_proxy((LOCALHOST, postgres_server.port)) as proxy:
        store = await in_thread(partial(postgres_store.open, dsn(proxy.port, database)))
        try:
            await in_thread(partial(postgres_store.call, store, 1))
            proxy.mode = ProxyMode.STALL
            try:
                with pytest.raises(StoreError):
                    await in_thread(partial(postgres_store.call, store, 2))
            finally:
                proxy.mode = ProxyMode.PASS  # a call still waiting gets its answer
            await in_thread(partial(postgres_store.call, store, 3))
        finally:
            store.close()


# -- a notary on a stalling PostgreSQL -------------------------------------------------


@pytest.mark.parametrize("recovers", [True, False], ids=["stalls-then-answers", "stalls-for-good"])
async def test_a_notary_whose_postgresql_stalls_keeps_answering(
    tmp_path: Path, recovers: bool, postgres_server: PostgresServer,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(writer, "SHUTDOWN_RETRY_S", 2.0)
    caplog.set_level(logging.WARNING)
    database = database_of(postgres_server)
    stuck = False
    async with open_faulty_proxy((LOCALHOST, postgres_server.port)) as proxy, open_tls_target(
        names=[SITE, OTHER]
    ) as site:
        names = {SITE: [site.host], OTHER: [site.host]}
        async with trio.open_nursery() as guard:

            async def unstick() -> None:
                # A stop that never ends would hold this test for ever: past
                # HANG_S the connections are reset, and the test fails.
                nonlocal stuck
                await trio.sleep(HANG_S)
                stuck = True
                proxy.mode = ProxyMode.RESET

            async with open_notary(
                tmp_path, names=names,
                store={"backend": "postgresql", "dsn": dsn(proxy.port, database),
                       "batch_interval_ms": 10},
                answers={"query_timeout_s": 1.0, "failures_at_deadline": False},
                rescan={"enabled": False},
            ) as notary:
                await notary.running.stored.settled.wait()
                assert (await legacy_query(notary.port, f"{SITE}+{site.port}", None)).status == 200
                proxy.mode = ProxyMode.STALL
                # Cache hits and liveness need no database.
                for _ in range(3):
                    hit = await legacy_query(notary.port, f"{SITE}+{site.port}", None)
                    assert hit.status == 200
                admin = notary.running.admin[0].port
                assert (await http_get(admin, "/healthz"))[0] == 200
                # A miss reads the store first: answered at its deadline.
                with trio.fail_after(HANG_S):
                    miss = await legacy_query(notary.port, f"{OTHER}+{site.port}", None)
                assert miss.status == 503
                if recovers:
                    proxy.mode = ProxyMode.PASS
                    with trio.fail_after(HANG_S):
                        while (await legacy_query(  # noqa: ASYNC110 (an answer, no event)
                            notary.port, f"{OTHER}+{site.port}", None
                        )).status != 200:
                            await trio.sleep(0.2)
                guard.start_soon(unstick)
            guard.cancel_scope.cancel()
    assert not stuck, "the notary's stop waited on its stalled PostgreSQL"
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []
