"""Faults of the observation store, made for real rather than mocked: a
write lock held by another connection past the busy timeout, a full disk,
damaged files, and a writer killed with SIGKILL under load.

What must hold (docs/storage.md "What a crash can lose"): queries keep being
answered from memory and probes while the database cannot be used; a store
that cannot be opened is a clear one-line error; nothing committed is ever
lost, and nothing queued is dropped while the notary runs.

A full disk is simulated twice, two ways, because each shows what the other
cannot:

* ``RLIMIT_FSIZE`` in a subprocess (SIGXFSZ ignored): the *filesystem*
  refuses the write, mid-transaction, in SQLite's WAL append, as a full
  disk does (a short write, then EFBIG in place of ENOSPC). That is the
  path to trust for "no corruption, nothing committed lost"; it needs its
  own process, since the limit applies to every file the process writes.
* ``PRAGMA max_page_count`` on the running notary's writer connection:
  SQLite itself answers SQLITE_FULL ("database or disk is full", the very
  error a full disk gives) at the first page the batch needs; in-process and
  deterministic, it shows the notary's side (batches kept and retried,
  queries answered, /readyz failing, everything committed once space is
  back), and it can be lifted without a restart.

Already covered elsewhere (tests/test_storage.py, tests/test_store.py):
retries of a failing batch with a *mocked* StoreError, a corrupt file at
``Store`` open, damage after open at the ``Store`` level.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio

from notary.config import Endpoint
from notary.outbound import writer as storage_module
from notary.outbound.writer import open_storage
from notary.state import crypto
from notary.state import store as store_module
from notary.state.store import Store
from tests.support.notaries import legacy_query, open_notary, parse_response
from tests.support.observations import probe_result, store_section
from tests.support.tls_targets import LOCALHOST, open_tls_target

REPO = Path(__file__).resolve().parents[1]
SITE = "www.example.test"
OTHER = "other.example.test"
T0 = 1_700_000_000

_RSA_KEY = crypto.generate_rsa_key()


@pytest.fixture(autouse=True)
def one_rsa_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every notary of this module gets the same RSA key (nothing here
    depends on it; generating one costs a fifth of a second)."""
    monkeypatch.setattr(crypto, "generate_rsa_key", lambda *args, **kwargs: _RSA_KEY)


def rows(path: Path, sql: str) -> list[tuple]:
    db = sqlite3.connect(path)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


def integrity(path: Path) -> str:
    return rows(path, "PRAGMA integrity_check")[0][0]


@contextmanager
def write_lock(path: Path) -> Iterator[sqlite3.Connection]:
    """Another connection holding the database's write lock until the block
    exits (readers are not blocked: WAL)."""
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        other.execute("BEGIN IMMEDIATE")
        yield other
        other.execute("ROLLBACK")
    finally:
        other.close()


async def http_get(port: int, path: str) -> tuple[int, bytes]:
    with trio.fail_after(20):
        stream = await trio.open_tcp_stream(LOCALHOST, port)
        async with stream:
            await stream.send_all(f"GET {path} HTTP/1.0\r\n\r\n".encode())
            data = b""
            while chunk := await stream.receive_some(65536):
                data += chunk
    answer = parse_response(data)
    return answer.status, answer.body


async def wait_until(predicate, timeout_s: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    with trio.fail_after(timeout_s):
        while not predicate():  # noqa: ASYNC110 (counters, no event to wait on)
            await trio.sleep(0.02)


# -- a database locked by someone else -------------------------------------------------


async def test_a_locked_database_delays_writes_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Another process holds the write lock for longer than the busy
    timeout: batches fail and are retried, reads go on (WAL), queries are
    answered (probes, memory), and once the lock is gone everything queued
    is committed."""
    monkeypatch.setattr(store_module, "BUSY_TIMEOUT_MS", 100)
    async with open_tls_target(names=[SITE, OTHER]) as site:
        names = {SITE: [site.host], OTHER: [site.host]}
        async with open_notary(
            tmp_path, names=names, store={"batch_interval_ms": 5},
            rescan={"enabled": False}, admin={"listen": (Endpoint(LOCALHOST, 0),)},
        ) as notary:
            storage = notary.running.storage
            assert (await legacy_query(notary.port, f"{SITE}+{site.port}", None)).status == 200
            await wait_until(lambda: storage.statistics().committed == 1)
            db = notary.config.server.db_file
            with write_lock(db):
                answer = await legacy_query(notary.port, f"{OTHER}+{site.port}", None)
                assert answer.status == 200  # probed and answered from memory
                await wait_until(lambda: storage.statistics().failed_batches >= 2)
                assert storage.statistics().failing
                assert (await storage.load_timeline(site.target(SITE))).observations
                status, body = await http_get(notary.running.admin[0].port, "/readyz")
                assert status == 503, body
                # Answered again from memory, while the batch still waits.
                again = await legacy_query(notary.port, f"{OTHER}+{site.port}", None)
                assert again.status == 200 and again.body == answer.body
                assert rows(db, "SELECT count(*) FROM observations") == [(1,)]
            await wait_until(lambda: storage.statistics().committed == 2)
            assert not storage.statistics().failing
            status, _ = await http_get(notary.running.admin[0].port, "/readyz")
            assert status == 200
    assert rows(db, "SELECT count(*) FROM observations") == [(2,)]
    assert integrity(db) == "ok"
    failures = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert failures and all("locked" in r.getMessage() for r in failures)
    assert not any(r.exc_info for r in caplog.records)  # logged, no traceback


async def test_a_lock_held_while_the_notary_stops_is_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A clean stop commits what is queued: with the lock still held when the
    storage closes, the writer keeps retrying until it is released."""
    monkeypatch.setattr(store_module, "BUSY_TIMEOUT_MS", 50)
    db = tmp_path / "notary.db"
    Store(db).close()
    other = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")

    async def release_later() -> None:
        await trio.sleep(0.6)
        await trio.to_thread.run_sync(other.execute, "ROLLBACK")

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(release_later)
            async with open_storage(db, store_section(batch_interval_ms=1)) as storage:
                for i in range(20):
                    await storage.record(probe_result(f"h{i}.example.test", at=T0 + i))
            # The block exited: the writer drained the queue after the lock went.
    finally:
        other.close()
    assert storage.statistics().failed_batches >= 1
    assert storage.statistics().lost == 0
    assert rows(db, "SELECT count(*) FROM observations") == [(20,)]


async def test_a_store_that_stays_locked_does_not_hold_the_stop_for_ever(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by these tests: with a store that never becomes writable again,
    a clean stop waited for ever (the writer retried its batch without end).
    Now it retries for ``SHUTDOWN_RETRY_S`` after the stop began, then gives
    the rest up, counted and logged in one line."""
    monkeypatch.setattr(store_module, "BUSY_TIMEOUT_MS", 50)
    monkeypatch.setattr(storage_module, "SHUTDOWN_RETRY_S", 0.5)
    db = tmp_path / "notary.db"
    Store(db).close()
    with write_lock(db):
        started = trio.current_time()
        with trio.fail_after(10):
            settings = store_section(batch_interval_ms=1, batch_rows=5)
            async with open_storage(db, settings) as storage:
                for i in range(20):
                    await storage.record(probe_result(f"h{i}.example.test", at=T0 + i))
                await wait_until(lambda: storage.statistics().failed_batches >= 1)
        assert trio.current_time() - started < 5
    assert storage.statistics().lost == 20
    assert rows(db, "SELECT count(*) FROM observations") == [(0,)]
    [given_up] = [r.getMessage() for r in caplog.records if "not committed" in r.getMessage()]
    assert "20 observations" in given_up


# -- a full disk ---------------------------------------------------------------------

_FULL_DISK_CHILD = textwrap.dedent(
    """
    import json, resource, signal, sys
    from pathlib import Path
    from notary.errors import StoreError
    from notary.state.store import Store
    from tests.support.observations import probe_result, store_section

    path = Path(sys.argv[1])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failed write, not a killed process
    store = Store(path)
    store.record([probe_result("seed.example.test", at=1)])
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    wal = Path(f"{path}-wal")
    limit = max(path.stat().st_size, wal.stat().st_size) + 64 * 1024
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    committed, error, pending = 1, None, []
    for batch in range(400):
        pending = [probe_result(f"h{batch}-{i}.example.test", cert=f"c{i}", at=1000 + batch)
                   for i in range(20)]
        try:
            store.record(pending)
        except StoreError as exc:
            error = str(exc)
            break
        committed += len(pending)
        pending = []
    # Space again: the batch that failed is retried on the same connection.
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    store.record(pending)
    store.close()
    print(json.dumps({"committed": committed, "retried": len(pending), "error": error}))
    """
)


def test_a_full_disk_fails_the_batch_cleanly_and_loses_nothing(tmp_path: Path) -> None:
    db = tmp_path / "notary.db"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-c", _FULL_DISK_CHILD, str(db)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["error"] is not None, "the file size limit was never reached"
    assert report["committed"] > 1, "no batch fitted under the limit"
    assert "full" in report["error"] or "I/O" in report["error"], report["error"]
    assert report["retried"] == 20
    assert integrity(db) == "ok"
    expected = report["committed"] + report["retried"]
    assert rows(db, "SELECT count(*) FROM observations") == [(expected,)]


async def test_a_full_database_keeps_the_notary_answering(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The database may not grow (``max_page_count`` at its size) while
    observations come in: batches fail with "database or disk is full" and
    are kept, queries are answered, and once it may grow again every
    observation is committed."""
    async with open_tls_target(names=[SITE, OTHER]) as site:
        names = {SITE: [site.host], OTHER: [site.host]}
        async with open_notary(
            tmp_path, names=names, store={"batch_interval_ms": 5, "batch_rows": 100},
            rescan={"enabled": False},
        ) as notary:
            storage = notary.running.storage
            writer = storage._writer._db  # the writer's own connection
            [pages] = writer.execute("PRAGMA page_count").fetchone()
            writer.execute(f"PRAGMA max_page_count = {pages}")
            for i in range(300):  # more than the free room of the pages there are
                await storage.record(probe_result(f"h{i}.example.test", at=T0 + i))
            for name in (SITE, OTHER):
                answer = await legacy_query(notary.port, f"{name}+{site.port}", None)
                assert answer.status == 200
            await wait_until(lambda: storage.statistics().failed_batches >= 2)
            assert storage.statistics().failing
            writer.execute("PRAGMA max_page_count = 1073741823")  # room again
            await wait_until(lambda: storage.statistics().committed == 302)
    db = notary.config.server.db_file
    assert integrity(db) == "ok"
    assert rows(db, "SELECT count(*) FROM observations") == [(302,)]
    failures = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert failures and all("full" in message for message in failures)


# -- damaged files --------------------------------------------------------------------


def _config_file(directory: Path, db: Path) -> Path:
    key = crypto.generate_rsa_key()
    key_path, cert_path = directory / "notary.key", directory / "notary.crt"
    crypto.write_new_file(key_path, crypto.private_key_pem(key), mode=0o600)
    cert = crypto.make_self_signed_certificate(key, LOCALHOST)
    crypto.write_new_file(cert_path, crypto.certificate_pem(cert), mode=0o644)
    path = directory / "notary.toml"
    path.write_text(
        textwrap.dedent(
            f"""
            [server]
            key_file = "{key_path}"
            cert_file = "{cert_path}"
            db_file = "{db}"
            api = ["127.0.0.1:0"]
            [node]
            workers = 1
            [relay]
            listen = []
            [admin]
            listen = []
            """
        )
    )
    return path


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda data: b"\x13" * len(data), id="garbage"),
        pytest.param(lambda data: data[:100] + bytes(len(data) - 100), id="zeroed-header"),
        pytest.param(lambda data: b"SQLite format 3\x00" + b"\xff" * 84 + data[100:], id="bad-header"),
    ],
)
def test_a_damaged_file_at_start_is_a_clear_error(tmp_path: Path, damage) -> None:  # type: ignore[no-untyped-def]
    """``notary serve`` on a file that is not a readable database: exit 1 and
    one line naming the file, no traceback, nothing served."""
    db = tmp_path / "notary.db"
    with Store(db) as store:
        store.record([probe_result(f"h{i}.example.test", at=T0 + i) for i in range(50)])
    db.write_bytes(damage(db.read_bytes()))
    config = _config_file(tmp_path, db)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-m", "notary", "serve", "--config", str(config)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("notary: database ") and str(db) in last, done.stderr


async def test_a_table_damaged_at_start_is_answered_from_probes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The schema reads, so the notary starts, but the observations table is
    garbage: a Convergence query for a stored target is answered from a new
    probe (the read failure logged), a Perspectives query, which needs the
    history, gets 503, the notary keeps serving, and it stops (the new
    observations, which cannot be written, are given up and counted)."""
    monkeypatch.setattr(storage_module, "SHUTDOWN_RETRY_S", 0.5)
    key_path = tmp_path / "perspectives.key"
    crypto.write_new_file(
        key_path, crypto.private_key_pem(crypto.generate_perspectives_key()), mode=0o600
    )
    db = tmp_path / "n" / "notary.db"
    db.parent.mkdir()
    async with open_tls_target(names=[SITE]) as site:
        with Store(db) as store:
            store.record([probe_result(SITE, site.port, at=T0)])
            store.record([probe_result(f"h{i}.example.test", at=T0 + i) for i in range(300)])
        [(root,)] = rows(db, "SELECT rootpage FROM sqlite_master WHERE name = 'observations'")
        [(page_size,)] = rows(db, "PRAGMA page_size")
        rows(db, "PRAGMA wal_checkpoint(TRUNCATE)")
        with db.open("r+b") as f:
            f.seek((root - 1) * page_size)
            f.write(b"\xa5" * page_size)
        section = {"key_file": key_path, "listen": (Endpoint(LOCALHOST, 0),)}
        async with open_notary(
            tmp_path / "n", names={SITE: [site.host]}, perspectives=section,
            rescan={"enabled": False},
        ) as notary:
            answer = await legacy_query(notary.port, f"{SITE}+{site.port}", None)
            assert answer.status == 200
            status, _ = await http_get(
                notary.running.perspectives[0].port, "/?host=h7.example.test&port=443"
            )
            assert status == 503
            again = await legacy_query(notary.port, f"{SITE}+{site.port}", None)
            assert again.status == 200
    assert notary.running.storage.statistics().lost >= 1
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("store read failed" in m for m in messages), messages
    assert any("were not committed" in m for m in messages), messages


_DIE_WITHOUT_CLOSE = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from notary.state.store import Store
    from tests.support.observations import probe_result, store_section

    store = Store(Path(sys.argv[1]))
    for batch in range(10):
        store.record([probe_result(f"h{batch}-{i}.example.test", at=batch) for i in range(30)])
    os._exit(0)  # no close, no checkpoint: the WAL holds every transaction
    """
)


def test_a_torn_wal_tail_loses_no_committed_observation(tmp_path: Path) -> None:
    """A process that died while appending to the WAL leaves a partial frame
    at its end: recovery ignores it (its checksum does not match) and keeps
    every transaction committed before it."""
    db = tmp_path / "notary.db"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    subprocess.run(
        [sys.executable, "-c", _DIE_WITHOUT_CLOSE, str(db)],
        env=env, timeout=60, check=True, capture_output=True,
    )
    wal, shm = Path(f"{db}-wal"), Path(f"{db}-shm")
    assert wal.stat().st_size > 0
    with wal.open("ab") as f:  # half a frame of junk, as a torn append leaves
        f.write(os.urandom(2048))
    shm.unlink(missing_ok=True)  # nothing to trust: the WAL is recovered from scratch
    with Store(db) as store:
        assert store.statistics().observations == 300
    assert integrity(db) == "ok"


# -- SIGKILL under load ----------------------------------------------------------------

_WRITER_CHILD = textwrap.dedent(
    """
    import sys, trio
    from pathlib import Path
    from notary.outbound.writer import open_storage
    from tests.support.observations import probe_result, store_section

    path, start = Path(sys.argv[1]), int(sys.argv[2])

    class Report:
        committed = 0

        def batch_written(self, rows, seconds):
            self.committed += rows
            print(start + self.committed, flush=True)

    async def main():
        settings = store_section(batch_rows=200, batch_interval_ms=2)
        async with open_storage(path, settings, timings=Report()) as storage:
            for i in range(start, start + 10**6):
                await storage.record(probe_result(
                    f"h{i}.example.test", cert=f"c{i % 50}", address=f"192.0.2.{i % 200}",
                    at=1_700_000_000 + i,
                ))

    trio.run(main)
    """
)


def _write_until_killed(db: Path, start: int, at_least: int) -> int:
    """Run a writer child from observation ``start``, SIGKILL it once it
    reported ``at_least`` more committed; the last count it reported."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    child = subprocess.Popen(
        [sys.executable, "-c", _WRITER_CHILD, str(db), str(start)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
    )
    reported = start
    deadline = time.monotonic() + 60
    try:
        assert child.stdout is not None
        for line in child.stdout:
            reported = int(line)
            if reported >= start + at_least or time.monotonic() > deadline:
                break
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait(10)
        assert child.stdout is not None and child.stderr is not None
        child.stdout.close()
        stderr = child.stderr.read()
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL, stderr
    assert reported >= start + at_least, stderr
    return reported


def test_sigkill_during_heavy_writes_loses_no_committed_observation(tmp_path: Path) -> None:
    """Twice: a child writing as fast as the batched writer goes is killed
    with SIGKILL; on reopening, the file is intact and every observation the
    child saw committed is there (the second child starts on the file the
    first left, with its WAL)."""
    db = tmp_path / "notary.db"
    Store(db).close()
    committed = 0
    for _ in range(2):
        committed = _write_until_killed(db, committed, at_least=3000)
        assert integrity(db) == "ok"
        present = {
            int(host.split(".")[0][1:]) for (host,) in rows(db, "SELECT host FROM targets")
        }
        missing = set(range(committed)) - present
        assert not missing, sorted(missing)[:10]
        committed = max(present) + 1
    with Store(db) as store:  # and the store opens it as usual
        assert store.statistics().observations >= committed - 1
