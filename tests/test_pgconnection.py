"""``notary.state.connection``'s PostgreSQL side: every PostgreSQL store
(the observations with their change feed and probe claims, the log's rows,
the witness's checkpoints: ``tests.support.engines.POSTGRES_STORES``) on
its one connection layer, on a throwaway server on loopback
(``tests.support.postgres``; skipped without one). A restart of the
server, and the window while it is stopped, as each store's caller sees
them: a ``StoreError`` while it is away (at once, never a hang), and
working calls once it is back."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from notary.errors import StoreError
from tests.support.engines import PostgresStoreKind
from tests.support.postgres import PostgresServer

T0 = 1_700_000_000


def test_every_store_works_again_after_the_server_restarted(
    postgres_store: PostgresStoreKind, postgres_server: PostgresServer,
) -> None:
    """The server ended the session of the idle connection: the next call
    finds it dropped before it sends anything, connects again and works
    (the caller sees nothing of the restart)."""
    store = postgres_store.open(postgres_server.new_database())
    try:
        postgres_store.call(store, 1)
        for i in range(1, 4):
            postgres_server.restart()
            postgres_store.call(store, 2 * i)
            postgres_store.call(store, 2 * i + 1)
    finally:
        store.close()


def test_while_the_server_is_stopped_every_call_is_a_quick_store_error(
    postgres_store: PostgresStoreKind, postgres_server: PostgresServer,
) -> None:
    store = postgres_store.open(postgres_server.new_database())
    try:
        postgres_store.call(store, 1)
        postgres_server.stop()
        try:
            for i in range(2, 5):
                started = time.monotonic()
                with pytest.raises(StoreError, match=r"postgresql://postgres@127\.0\.0\.1"):
                    postgres_store.call(store, i)
                assert time.monotonic() - started < 2  # refused at once: no wait
        finally:
            postgres_server.start()
        postgres_store.call(store, 5)
    finally:
        store.close()


def test_a_server_that_never_answers_is_a_store_error_within_the_connect_timeout(
    postgres_store: PostgresStoreKind, postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In the server's place a listener that accepts (the kernel completes
    the handshake) and never answers: the call gives up after
    ``CONNECT_TIMEOUT_S``, never hangs."""
    from notary.state import connection

    monkeypatch.setattr(connection, "CONNECT_TIMEOUT_S", 2)  # libpq's least
    store = postgres_store.open(postgres_server.new_database())
    try:
        postgres_store.call(store, 1)
        postgres_server.stop()
        try:
            with socket.create_server(("127.0.0.1", postgres_server.port)):
                started = time.monotonic()
                with pytest.raises(StoreError, match="timeout"):
                    postgres_store.call(store, 2)
                assert 1.5 < time.monotonic() - started < 4
        finally:
            postgres_server.start()
        postgres_store.call(store, 3)
    finally:
        store.close()


def test_a_listener_hears_commits_again_after_the_server_restarted(
    postgres_server: PostgresServer,
) -> None:
    """``PostgresStore.wait_for_changes``: its connection LISTENs again when
    it is made again, and hears the next commit of another connection, also
    one notified before it waits."""
    from notary.state.pgstore import PostgresStore
    from tests.support.observations import probe_result

    dsn = postgres_server.new_database()
    with PostgresStore(dsn) as listener, PostgresStore(dsn) as writer:
        for at in (T0, T0 + 1):
            assert not listener.wait_for_changes(0.01)  # LISTENing from here on
            writer.record([probe_result(at=at)])
            time.sleep(0.2)  # the NOTIFY on the listener's socket before it waits:
            started = time.monotonic()  # the check for a dropped connection keeps it
            assert listener.wait_for_changes(10)
            assert time.monotonic() - started < 5  # woken by the commit
            if at == T0:
                postgres_server.restart()


def test_the_stores_import_without_psycopg() -> None:
    """A SQLite-only install has no psycopg: importing the PostgreSQL stores
    (and everything that names them) must not need it."""
    code = (
        "import sys; sys.modules['psycopg'] = None\n"  # any import of it fails
        "import notary.state.connection, notary.state.pgstore, notary.state.pgtlogstore\n"
        "import notary.state.witnessstore, notary.server.app, notary.cli\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# -- passwords never in messages (issue 30 item 18) -----------------------------------

#: Each DSN below has this password, or one split into these two pieces.
SECRETS = ("s3cret", "xyzzy")
#: DSNs libpq cannot read (its parse errors quote them), or reads otherwise
#: than written (an unencoded '@' or '/' spills the password into the host
#: or the port: a lookup of it, an error naming it). None is connected to.
MALFORMED = {
    "keyword-missing-equals": "host=127.0.0.1 password=s3cret-xyzzy dbname",
    "keyword-password-with-a-space": "host=127.0.0.1 port=1 password=s3cret xyzzy",
    "keyword-unterminated-quote": "host=127.0.0.1 password='s3cret-xyzzy dbname=notary",
    "url-bad-host": "postgresql://notary:s3cret-xyzzy@[bad",
    "url-bad-query": "postgresql://notary:s3cret-xyzzy@127.0.0.1:1/notary?bogus=1",
    "url-bad-percent": "postgresql://notary:s3cret%zz-xyzzy@127.0.0.1:1/notary",
    "url-percent-encoded": "postgres://notary:s3cret%2Dxyzzy@[bad",
    "url-at-in-password": "postgresql://notary:s3cret@xyzzy@127.0.0.1:1/notary",
    "url-slash-in-password": "postgresql://notary:s3cret/xyzzy@127.0.0.1:1/notary",
}
#: DSNs libpq reads, to a closed port (refused at once).
WELL_FORMED = {
    "keyword": "host=127.0.0.1 port=1 user=notary password=s3cret-xyzzy dbname=notary",
    "keyword-quoted": "host=127.0.0.1 port=1 user=notary password='s3cret xyzzy' dbname=notary",
    "url": "postgresql://notary:s3cret-xyzzy@127.0.0.1:1/notary",
    "url-percent-encoded": "postgresql://notary:s3cret%2Dxyzzy@127.0.0.1:1/notary",
    "url-password-parameter": "postgresql://notary@127.0.0.1:1/notary?password=s3cret-xyzzy",
}
INVALID = "not a valid libpq connection string or URL"


def assert_no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text


@pytest.mark.parametrize("dsn", [*MALFORMED.values(), *WELL_FORMED.values()],
                         ids=[*(f"malformed-{k}" for k in MALFORMED), *WELL_FORMED])
def test_the_database_is_named_without_its_password(dsn: str) -> None:
    pytest.importorskip("psycopg")
    from notary.state.dsn import describe_dsn

    described = describe_dsn(dsn)
    assert_no_secret(described)
    if dsn in WELL_FORMED.values():
        assert described == "postgresql://notary@127.0.0.1:1/notary"


@pytest.mark.parametrize("dsn", MALFORMED.values(), ids=MALFORMED.keys())
def test_every_store_refuses_a_malformed_dsn_without_quoting_it(
    postgres_store: PostgresStoreKind, dsn: str,
) -> None:
    pytest.importorskip("psycopg")
    with pytest.raises(StoreError, match=INVALID) as refused:
        postgres_store.open(dsn)
    assert_no_secret(str(refused.value))


@pytest.mark.parametrize("dsn", WELL_FORMED.values(), ids=WELL_FORMED.keys())
def test_every_store_names_a_database_it_cannot_reach_without_its_password(
    postgres_store: PostgresStoreKind, dsn: str,
) -> None:
    pytest.importorskip("psycopg")
    with pytest.raises(StoreError, match=r"postgresql://notary@127\.0\.0\.1:1/notary: ") as failed:
        postgres_store.open(dsn)
    assert_no_secret(str(failed.value))


def test_every_store_refused_its_password_does_not_quote_it(
    postgres_store: PostgresStoreKind, postgres_server: PostgresServer,
) -> None:
    dsn = postgres_server.password_role("notary_pw", "right-password")
    with pytest.raises(StoreError, match="password authentication failed") as refused:
        postgres_store.open(f"{dsn} password=s3cret-xyzzy")
    assert_no_secret(str(refused.value))
    assert "postgresql://notary_pw@127.0.0.1:" in str(refused.value)
    # A password that is also the user's name: said nowhere, the user's name neither.
    with pytest.raises(StoreError, match="password authentication failed") as refused:
        postgres_store.open(f"{dsn} password=notary_pw")
    assert "notary_pw" not in str(refused.value) and "postgresql://***@" in str(refused.value)
    postgres_store.open(f"{dsn} password=right-password").close()


@pytest.mark.parametrize("dsn", MALFORMED.values(), ids=MALFORMED.keys())
def test_the_configuration_refuses_a_malformed_dsn_without_quoting_it(dsn: str) -> None:
    pytest.importorskip("psycopg")
    from notary.config import load_config
    from notary.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        load_config(None, {"server": {"key_file": "k", "cert_file": "c"},
                           "store": {"backend": "postgresql", "dsn": dsn}})
    assert str(refused.value) == f"[store] dsn is {INVALID}" or str(refused.value).startswith(
        f"[store] dsn is {INVALID} ("
    )
    assert_no_secret(str(refused.value))


@pytest.mark.parametrize("command", ["serve", "db-init"])
@pytest.mark.parametrize("name", [
    "keyword-password-with-a-space", "keyword-unterminated-quote", "url-bad-host",
    "url-percent-encoded", "url-at-in-password",
])
def test_notary_refuses_a_malformed_dsn_on_one_line_without_its_password(
    tmp_path: Path, command: str, name: str,
) -> None:
    """``notary serve`` and ``notary db init``, as an operator runs them:
    exit status 2 and one line on stderr, the password nowhere."""
    pytest.importorskip("psycopg")
    dsn = MALFORMED[name]
    from tests.support.notaries import make_notary_files

    key, cert, _ = make_notary_files(tmp_path)
    config = tmp_path / "notary.toml"
    config.write_text(
        f'[server]\nkey_file = "{key}"\ncert_file = "{cert}"\n'
        'api = ["127.0.0.1:0"]\n[relay]\nlisten = []\n[admin]\nlisten = []\n'
        '[node]\nworkers = 1\n'
        f'[store]\nbackend = "postgresql"\ndsn = """{dsn}"""\n'
    )
    argv = ["serve"] if command == "serve" else ["db", "init"]
    ran = subprocess.run(
        [sys.executable, "-m", "notary", *argv, "--config", str(config)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    assert ran.returncode == 2
    assert ran.stderr == f"notary: error: [store] dsn is {INVALID}\n" or (
        ran.stderr.startswith(f"notary: error: [store] dsn is {INVALID} (")
        and ran.stderr.count("\n") == 1
    )
    assert_no_secret(ran.stdout + ran.stderr)
