"""`notary log verify` and `notary log watch` (issue 22, the monitor):
against real notaries with a log, honest and then tampered with in their
SQLite file (entries, tiles, the signed head, a forked history signed by
the same key), and against a hostile log server on loopback."""

from __future__ import annotations

import base64
import itertools
import json
import sqlite3
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import pytest
import trio
import trustme

from notary.client import logmonitor
from notary.client.logfetch import MAX_RETRIES, LogFetcher, LogUnreachable
from notary.errors import UsageError
from notary.protocol import tlog, v2
from notary.protocol.bundle import Bundle, BundleHost, make_bundle
from notary.protocol.v2.logaudit import LogReplay, check_log_entry, public_key_of
from notary.state import crypto
from notary.state.tlogstore import LogStore
from tests.support.cli_runs import run_cli
from tests.support.log_notaries import query
from tests.support.notaries import NotaryUnderTest, open_v2_notary, send_raw
from tests.support.tls_targets import open_tls_target

ORIGIN = "notary.test/v2/log"
LOG = {"enabled": True, "origin": ORIGIN, "checkpoint_interval_s": 0.1, "max_merge_delay_s": 30}
DOMAIN = "example.test"
#: The sites whose statements get logged: the domain, two of its
#: subdomains, and two names that are not under it.
IN_DOMAIN = ("example.test", "www.example.test")
OUTSIDE = ("other.test", "notexample.test")
LATER = "api.example.test"
LOOPBACK = "127.0.0.1"


# -- helpers --------------------------------------------------------------------


def public_raw(notary: NotaryUnderTest) -> bytes:
    return notary.running.signers["v2"].public_raw  # type: ignore[attr-defined, no-any-return]


def log_bundle(notary: NotaryUnderTest, *, with_key: bool = True) -> Bundle:
    """A bundle of ``notary`` pinning its TLS certificate and its v2 key."""
    pem = crypto.certificate_pem(notary.certificate).decode("ascii")
    key = base64.b64encode(public_raw(notary)).decode("ascii") if with_key else None
    return make_bundle(
        name="Log notary", location="https://127.0.0.1/log.notary",
        hosts=[BundleHost(LOOPBACK, notary.port, 80, pem, key)],
    )


def write_bundle(path: Path, bundle: Bundle) -> Path:
    path.write_bytes(bundle.to_json())
    return path


async def log_size(notary: NotaryUnderTest) -> int:
    answer = await send_raw(notary.port, b"GET /v2/log/checkpoint HTTP/1.0\r\n\r\n")
    if answer.status == 404:
        return 0
    return int(answer.body.decode().split("\n")[1])


async def wait_for_size(notary: NotaryUnderTest, size: int) -> None:
    with trio.fail_after(10):
        while await log_size(notary) < size:  # noqa: ASYNC110 (the notary's log, no event)
            await trio.sleep(0.05)


@asynccontextmanager
async def open_logged_world(tmp_path: Path) -> AsyncIterator[tuple[object, NotaryUnderTest]]:
    """A TLS site with every name above, and a notary keeping a log that
    holds one statement for each name of IN_DOMAIN and OUTSIDE."""
    names = [*IN_DOMAIN, *OUTSIDE, LATER]
    async with open_tls_target(names=names) as site:
        async with open_v2_notary(
            tmp_path, {name: [site.host] for name in names}, log=LOG, serve_bundle=True
        ) as notary:
            for name in (*IN_DOMAIN, *OUTSIDE):
                await query(notary, (name, site.port))
            await wait_for_size(notary, len(IN_DOMAIN) + len(OUTSIDE))
            yield site, notary


def database(tmp_path: Path) -> sqlite3.Connection:
    return sqlite3.connect(str(tmp_path / "n" / "notary.db"), isolation_level=None, timeout=10)


def entry_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line[:1].isdigit()]


def evidence_files(directory: Path) -> list[Path]:
    return list(directory.glob("state.equivocation-*"))


def fork_log(tmp_path: Path, reorder: Callable[[list[bytes]], list[bytes]]) -> None:
    """Rewrite the notary's log as another history (``reorder`` of its
    entries), every checkpoint signed by the notary's own v2 key."""
    signer = crypto.Ed25519Signer(crypto.load_ed25519_private_key(tmp_path / "v2.key"))

    def sign(size: int, root: bytes) -> str:
        text = tlog.format_checkpoint(tlog.Checkpoint(ORIGIN, size, root))
        return tlog.sign_note(text, ORIGIN, signer.sign_raw, signer.public_raw)

    db = database(tmp_path)
    entries = [bytes(row[0]) for row in db.execute("SELECT entry FROM log_entries ORDER BY idx")]
    db.execute("BEGIN IMMEDIATE")
    for table in ("log_entries", "log_tiles", "log_head"):
        db.execute(f"DELETE FROM {table}")
    db.execute("COMMIT")
    db.close()
    with LogStore(tmp_path / "n" / "notary.db") as store:
        store.append(reorder(entries), sign)


# -- verify: an honest log, then tampered ones ------------------------------------------


async def test_verify_passes_on_an_honest_log(tmp_path: Path, capsys) -> None:
    async with open_logged_world(tmp_path) as (_site, notary):
        bundle = log_bundle(notary)
        report = await logmonitor.verify_log(bundle, timeout_s=10)
        assert report.consistent and report.problems == ()
        assert report.origin == ORIGIN and report.size == 4
        assert report.entries_checked == 4 and report.tiles_checked == 1
        assert report.computed_root == report.root
        async with LogFetcher(bundle, timeout_s=10) as fetcher:  # one keep-alive connection
            for path in ("checkpoint", "tile/0/000.p/4", "tile/entries/000.p/4", "checkpoint"):
                assert (await fetcher.get(path, max_bytes=1 << 20)).status == 200
            assert (fetcher.requests, fetcher.connections) == (4, 1)
        path = write_bundle(tmp_path / "log.notary", bundle)
        status, out, err = await run_cli(capsys, "log", "verify", str(path))
    assert status == 0, err
    assert "size:    4" in out and f"log:     {ORIGIN}" in out
    assert "checked: 4 entries, 1 hash tiles" in out
    assert "consistent" in out and "problem" not in out


async def test_verify_catches_tampered_entries(tmp_path: Path, capsys) -> None:
    async with open_logged_world(tmp_path) as (_site, notary):
        db = database(tmp_path)
        (entry,) = db.execute("SELECT entry FROM log_entries WHERE idx = 1").fetchone()
        document = json.loads(entry)
        document["statement"]["signed_at"] += 1  # well formed, no longer as signed
        forged = v2.canonical_json(document)
        db.execute("UPDATE log_entries SET entry = ? WHERE idx = 1", (forged,))
        db.execute("UPDATE log_entries SET entry = ? WHERE idx = 2", (b"{not json",))
        db.close()
        path = write_bundle(tmp_path / "log.notary", log_bundle(notary))
        status, out, _err = await run_cli(capsys, "log", "verify", str(path))
    assert status == 1
    problems = [line for line in out.splitlines() if line.startswith("problem: ")]
    assert "problem: bad signature at index 1: the statement's signature does not verify" in out
    assert "problem: malformed entry at index 2: not strict UTF-8 JSON" in out
    # The tiles the notary serves are those of its real entries.
    assert "problem: tile mismatch at index 1: hash tile tile/0/000.p/4 differs" in out
    assert any(line.startswith("problem: root mismatch: the entries hash to") for line in problems)
    assert "INCONSISTENT: 4 problems" in out


async def test_verify_catches_a_tampered_tile(tmp_path: Path, capsys) -> None:
    async with open_logged_world(tmp_path) as (_site, notary):
        db = database(tmp_path)
        (hashes,) = db.execute(
            "SELECT hashes FROM log_tiles WHERE level = 0 AND idx = 0"
        ).fetchone()
        tampered = hashes[:64] + bytes([hashes[64] ^ 1]) + hashes[65:]
        db.execute("UPDATE log_tiles SET hashes = ? WHERE level = 0 AND idx = 0", (tampered,))
        db.close()
        path = write_bundle(tmp_path / "log.notary", log_bundle(notary))
        status, out, _err = await run_cli(capsys, "log", "verify", str(path))
    assert status == 1
    assert "problem: tile mismatch at index 2: hash tile tile/0/000.p/4 differs" in out
    assert "root mismatch" not in out  # the entries are the signed ones
    assert "INCONSISTENT: 1 problems" in out


async def test_verify_catches_a_bad_checkpoint_signature(tmp_path: Path, capsys) -> None:
    async with open_logged_world(tmp_path) as (_site, notary):
        db = database(tmp_path)
        (note,) = db.execute("SELECT checkpoint FROM log_head").fetchone()
        origin, size, _root, *rest = note.split("\n")
        other_root = base64.b64encode(b"\x07" * 32).decode()
        db.execute("UPDATE log_head SET checkpoint = ?",
                   ("\n".join([origin, size, other_root, *rest]),))
        db.close()
        path = write_bundle(tmp_path / "log.notary", log_bundle(notary))
        status, out, _err = await run_cli(capsys, "log", "verify", str(path))
        # Another key in the bundle: the notary's own checkpoint is not signed by it.
        db = database(tmp_path)
        db.execute("UPDATE log_head SET checkpoint = ?", (note,))
        db.close()
        stranger = base64.b64encode(crypto.ed25519_public_raw(crypto.generate_ed25519_key()))
        bundle = log_bundle(notary)
        host = bundle.hosts[0]
        other = make_bundle(name=bundle.name, location=bundle.bundle_location, hosts=[BundleHost(
            host.host, host.ssl_port, host.http_port, host.certificate_pem, stranger.decode()
        )])
        report = await logmonitor.verify_log(other, timeout_s=10)
    assert status == 1
    assert "problem: bad checkpoint signature: bad checkpoint: invalid signature" in out
    assert "checked:" not in out
    assert not report.consistent and report.problems[0].kind == "bad checkpoint signature"
    assert "not signed by a known key" in report.problems[0].detail


async def test_a_bundle_without_v2_key_is_a_usage_error(tmp_path: Path, capsys) -> None:
    async with open_logged_world(tmp_path) as (_site, notary):
        path = write_bundle(tmp_path / "old.notary", log_bundle(notary, with_key=False))
        status, _out, err = await run_cli(capsys, "log", "verify", str(path))
        watch_status, _out, watch_err = await run_cli(
            capsys, "log", "watch", str(path), "--domain", DOMAIN, "--once",
            "--state", str(tmp_path / "state.json"),
        )
    assert status == 2 and watch_status == 2
    assert "has no v2_key" in err and "has no v2_key" in watch_err
    assert not (tmp_path / "state.json").exists()


# -- watch ---------------------------------------------------------------------------


async def test_watch_prints_the_domain_and_its_subdomains_and_keeps_state(
    tmp_path: Path, capsys
) -> None:
    state = tmp_path / "state" / "log.json"
    async with open_logged_world(tmp_path) as (site, notary):
        path = str(write_bundle(tmp_path / "log.notary", log_bundle(notary)))
        watch = ("log", "watch", path, "--domain", "Example.TEST", "--once", "--state", str(state))
        status, out, err = await run_cli(capsys, *watch)
        assert status == 0, err
        first = entry_lines(out)
        hosts = [line.split()[1].rsplit(":", 1)[0] for line in first]
        assert sorted(hosts) == sorted(IN_DOMAIN)  # not other.test, not notexample.test
        for line in first:
            index, _target, sha256, signed_at = line.split(" ", 3)
            assert 0 <= int(index) < 4
            assert sha256.startswith("sha256=") and len(sha256) == 7 + 64
            assert signed_at.startswith("signed_at=")
        assert f"# {ORIGIN}: 0 -> 4 entries, 4 new entries verified, 2 for example.test" in out
        kept = json.loads(state.read_text())
        assert kept["checkpoint"].split("\n")[1] == "4"
        # Nothing new: nothing printed, the state stays.
        status, out, _err = await run_cli(capsys, *watch)
        assert status == 0 and entry_lines(out) == []
        assert f"# {ORIGIN}: 4 entries, 0 new entries verified" in out
        # One more statement for a subdomain: only it, checked from size 4
        # by a consistency proof.
        await query(notary, (LATER, site.port))
        await wait_for_size(notary, 5)
        status, out, _err = await run_cli(capsys, *watch)
    assert status == 0
    (line,) = entry_lines(out)
    assert line.startswith(f"4 {LATER}:{site.port} sha256=")
    assert f"# {ORIGIN}: 4 -> 5 entries, 1 new entries verified, 1 for example.test" in out
    assert json.loads(state.read_text())["checkpoint"].split("\n")[1] == "5"


async def test_watch_detects_a_fork_of_the_same_size(tmp_path: Path, capsys) -> None:
    state = tmp_path / "state.json"
    async with open_logged_world(tmp_path) as (_site, notary):
        path = str(write_bundle(tmp_path / "log.notary", log_bundle(notary)))
        watch = ("log", "watch", path, "--domain", DOMAIN, "--once", "--state", str(state))
        assert (await run_cli(capsys, *watch))[0] == 0
        kept = state.read_text()
        fork_log(tmp_path, lambda entries: entries[::-1])
        status, out, _err = await run_cli(capsys, *watch)
    assert status == 3
    assert "EQUIVOCATION: two different trees of 4 entries" in out
    assert state.read_text() == kept  # the state keeps the checkpoint seen first
    new_file, old_file = sorted(evidence_files(tmp_path))
    old_note, new_note = old_file.read_text(), new_file.read_text()
    assert old_note == json.loads(kept)["checkpoint"] and old_note != new_note
    assert old_note in out and new_note in out
    for note in (old_note, new_note):  # both signed by the notary's key
        v2.verify_checkpoint(note, ORIGIN, public_raw(notary))


async def test_watch_detects_a_fork_that_grew(tmp_path: Path, capsys) -> None:
    state = tmp_path / "state.json"
    async with open_logged_world(tmp_path) as (_site, notary):
        path = str(write_bundle(tmp_path / "log.notary", log_bundle(notary)))
        watch = ("log", "watch", path, "--domain", DOMAIN, "--once", "--state", str(state))
        assert (await run_cli(capsys, *watch))[0] == 0
        # Another history of 5 entries: the first four swapped around, one more.
        fork_log(tmp_path, lambda entries: [entries[1], entries[0], *entries[2:], entries[0]])
        status, out, _err = await run_cli(capsys, *watch)
        assert await log_size(notary) == 5
    assert status == 3
    assert "EQUIVOCATION: no consistency from 4 to 5 entries" in out
    evidence = sorted(p.name.rsplit(".", 1)[-1] for p in evidence_files(tmp_path))
    assert evidence == ["checkpoint", "checkpoint", "consistency-proof"]


async def test_watch_reports_a_log_whose_new_entries_are_not_signed(tmp_path: Path, capsys) -> None:
    state = tmp_path / "state.json"
    async with open_logged_world(tmp_path) as (site, notary):
        path = str(write_bundle(tmp_path / "log.notary", log_bundle(notary)))
        watch = ("log", "watch", path, "--domain", DOMAIN, "--once", "--state", str(state))
        assert (await run_cli(capsys, *watch))[0] == 0
        kept = state.read_text()
        await query(notary, (LATER, site.port))
        await wait_for_size(notary, 5)
        db = database(tmp_path)
        document = json.loads(db.execute("SELECT entry FROM log_entries WHERE idx = 4").fetchone()[0])
        document["statement"]["valid_until"] += 1
        db.execute("UPDATE log_entries SET entry = ? WHERE idx = 4", (v2.canonical_json(document),))
        db.close()
        status, out, _err = await run_cli(capsys, *watch)
    assert status == 1
    assert "problem: bad signature at index 4" in out and "problem: root mismatch" in out
    assert state.read_text() == kept


async def test_watch_state_of_another_key_is_a_usage_error(tmp_path: Path, capsys) -> None:
    state = tmp_path / "state.json"
    async with open_logged_world(tmp_path) as (_site, notary):
        path = str(write_bundle(tmp_path / "log.notary", log_bundle(notary)))
        watch = ("log", "watch", path, "--domain", DOMAIN, "--once", "--state", str(state))
        assert (await run_cli(capsys, *watch))[0] == 0
        kept = json.loads(state.read_text())
        kept["v2_key"] = base64.b64encode(b"\x01" * 32).decode()
        state.write_text(json.dumps(kept))
        status, _out, err = await run_cli(capsys, *watch)
        state.write_text("{")
        damaged, _out, damaged_err = await run_cli(capsys, *watch)
    assert status == 2 and "another v2 key" in err
    assert damaged == 2 and "is damaged" in damaged_err


def test_default_state_path_is_one_file_per_notary(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    pem = crypto.certificate_pem(crypto.make_self_signed_certificate(
        crypto.generate_rsa_key(), LOOPBACK)).decode()

    def named(name: str) -> Bundle:
        return make_bundle(name=name, location="https://127.0.0.1/x.notary",
                           hosts=[BundleHost(LOOPBACK, 443, 80, pem)])

    first, second = (logmonitor.default_state_path(named(n)) for n in ("Lab one", "Lab-one"))
    assert first.parent == tmp_path / "notary" / "logs"
    assert first.name.startswith("lab-one-") and first != second
    assert logmonitor.matches_domain("a.b.example.test", "example.test")
    assert not logmonitor.matches_domain("badexample.test", "example.test")
    with pytest.raises(UsageError):
        logmonitor.bundle_v2_key(named("No key"))


# -- the sans-IO checks ------------------------------------------------------------------


def test_replay_recomputes_roots_and_tiles_of_any_size() -> None:
    entries = [f"entry {i}".encode() for i in range(600)]
    for size in (1, 255, 256, 257, 600):
        replay = LogReplay(size, expect_tiles=True)
        tiles = [tile for entry in entries[:size] for tile in replay.add(entry)]
        leaves = [tlog.leaf_hash(e) for e in entries[:size]]
        assert replay.root() == tlog.root_hash(size, partial(_subtree, leaves))
        widths = [(t.level, t.index, t.width) for t in tiles]
        assert sorted(widths) == sorted(tlog.tiles_to_publish(0, size))
        level0 = b"".join(t.hashes for t in tiles if t.level == 0)
        assert level0 == b"".join(leaves)
    with pytest.raises(ValueError, match="all its leaves"):
        replay.add(b"one too many")


def _subtree(leaves: list[bytes], level: int, index: int) -> bytes:
    return _mth(leaves[index << level:(index + 1) << level])


def _mth(leaves: list[bytes]) -> bytes:
    if len(leaves) == 1:
        return leaves[0]
    half = len(leaves) // 2
    return tlog.node_hash(_mth(leaves[:half]), _mth(leaves[half:]))


def test_check_log_entry_rejects_what_the_notary_did_not_sign() -> None:
    key = crypto.generate_ed25519_key()
    signer = crypto.Ed25519Signer(key)
    raw = signer.public_raw
    public_key, key_id = public_key_of(raw)
    body = {
        "type": v2.STATEMENT_TYPE, "target": "example.test:443", "observations": [],
        "signed_at": 100, "valid_until": 200, "key_id": key_id,
        "log": {"origin": ORIGIN, "merge_by": 130},
    }
    signed = v2.sign_statement(body, signer.sign)
    check = partial(check_log_entry, origin=ORIGIN, public_key=public_key, key_id=key_id)
    assert check(signed.entry).target.host == "example.test"
    with pytest.raises(ValueError, match="promises log"):
        check_log_entry(signed.entry, origin="another/log", public_key=public_key, key_id=key_id)
    spaced = signed.entry.replace(b'{"signature":', b'{ "signature":')
    with pytest.raises(ValueError, match="canonical") as caught:
        check(spaced)
    assert caught.value.kind == "malformed entry"  # type: ignore[attr-defined]
    unpromised = v2.sign_statement({k: v for k, v in body.items() if k != "log"}, signer.sign)
    with pytest.raises(ValueError, match="promises no log"):
        check(unpromised.entry)


# -- a hostile log server -------------------------------------------------------------------


HANG = b"hang"


@asynccontextmanager
async def open_fake_log(
    routes: dict[str, bytes] | Callable[[str], bytes | None],
) -> AsyncIterator[Bundle]:
    """A TLS server on 127.0.0.1 answering ``GET /v2/log/<path>`` (the
    query string included) with the raw bytes ``routes`` gives, a dict or
    a function of the path (``HANG``: never answers; None or not in the
    dict: 404); the bundle pinning it."""
    ca = trustme.CA()
    leaf = ca.issue_cert(LOOPBACK)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    leaf.configure_cert(context)

    async def serve(tcp: trio.SocketStream) -> None:
        stream = trio.SSLStream(tcp, context, server_side=True)
        try:
            await stream.do_handshake()
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return
                request += chunk
            path = request.split(b" ")[1].decode().removeprefix("/v2/log/")
            answer = routes(path) if callable(routes) else routes.get(path)
            if answer is HANG:
                await trio.sleep_forever()
            if answer is None:
                answer = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
            await stream.send_all(answer)
        except trio.BrokenResourceError:
            pass
        finally:
            await trio.aclose_forcefully(stream)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, serve, 0, host=LOOPBACK))
        port = listeners[0].socket.getsockname()[1]
        key = base64.b64encode(crypto.ed25519_public_raw(FAKE_KEY)).decode()
        yield make_bundle(
            name="Hostile log", location="https://127.0.0.1/hostile.notary",
            hosts=[BundleHost(LOOPBACK, port, 80, leaf.cert_chain_pems[0].bytes().decode(), key)],
        )
        nursery.cancel_scope.cancel()


FAKE_KEY = crypto.generate_ed25519_key()


def ok(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (
        len(body), body)


def fake_checkpoint(size: int, root: bytes = b"\x01" * 32) -> bytes:
    signer = crypto.Ed25519Signer(FAKE_KEY)
    text = tlog.format_checkpoint(tlog.Checkpoint(ORIGIN, size, root))
    return tlog.sign_note(text, ORIGIN, signer.sign_raw, signer.public_raw).encode()


@pytest.mark.parametrize(("routes", "expected"), [
    ({"checkpoint": ok(b"x" * (tlog.MAX_NOTE_BYTES + 1))}, "larger than"),
    ({"checkpoint": b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\nshort"}, "truncated"),
    ({"checkpoint": b"\x16\x03\x01 not http at all\r\n\r\n"}, "malformed response"),
    ({"checkpoint": HANG}, "no answer to /v2/log/checkpoint within 0.5 s"),
    ({"checkpoint": b"HTTP/1.1 200 OK\r\n" + b"X-Pad: yyyy\r\n" * 5000},
     "head to /v2/log/checkpoint is too large"),
    ({}, "serves no checkpoint"),
    ({"checkpoint": b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n"}, "HTTP 500"),
])
async def test_a_hostile_server_is_a_clear_error(routes, expected) -> None:
    async with open_fake_log(routes) as bundle:
        with pytest.raises(LogUnreachable, match=expected):
            await logmonitor.verify_log(bundle, timeout_s=0.5)


BUSY = b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 30\r\nContent-Length: 0\r\n\r\n"


async def test_a_busy_notary_is_asked_again_after_its_retry_after(autojump_clock) -> None:
    """Each ``/v2/log/`` request costs a query token (issue 30, item 6): a
    limited client reading a whole log gets 429s with ``Retry-After``, which
    the fetcher waits out instead of calling the log unreachable."""
    asked: list[float] = []

    def route(path: str) -> bytes | None:
        asked.append(trio.current_time())
        return BUSY if len(asked) <= 2 else ok(b"body")

    async with open_fake_log(route) as bundle, LogFetcher(bundle, timeout_s=5) as fetcher:
        response = await fetcher.get("checkpoint", max_bytes=100)
    assert (response.status, response.body) == (200, b"body")
    assert [later - earlier >= 30 for earlier, later in itertools.pairwise(asked)] == [True] * 2


async def test_a_notary_busy_for_ever_is_answered_busy(autojump_clock) -> None:
    answered: list[str] = []

    def route(path: str) -> bytes:
        answered.append(path)
        return BUSY

    async with open_fake_log(route) as bundle, LogFetcher(bundle, timeout_s=5) as fetcher:
        response = await fetcher.get("checkpoint", max_bytes=100)
    assert response.status == 429
    assert len(answered) == MAX_RETRIES + 1


async def test_interim_answers_are_skipped_on_a_kept_alive_connection() -> None:
    """A 100 Continue before each answer: each request gets its own answer
    (the interim one ended the first, and the second got the first's)."""
    def route(path: str) -> bytes:
        body = path.encode()
        return b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (
            len(body), body)

    async with open_fake_log(route) as bundle, LogFetcher(bundle, timeout_s=5) as fetcher:
        assert (await fetcher.get("checkpoint", max_bytes=100)).body == b"checkpoint"


async def test_a_lying_size_and_malformed_bundles_are_problems() -> None:
    async with open_fake_log({"checkpoint": ok(fake_checkpoint(300))}) as bundle:
        report = await logmonitor.verify_log(bundle, timeout_s=5)
    assert [p.line() for p in report.problems] == [
        "missing at index 0: tile/entries/000 is not served (HTTP 404), yet the checkpoint "
        "covers 300 entries"
    ]
    routes = {"checkpoint": ok(fake_checkpoint(3)), "tile/entries/000.p/3": ok(b"\x00\x05ab")}
    async with open_fake_log(routes) as bundle:
        report = await logmonitor.verify_log(bundle, timeout_s=5)
        entries = tlog.encode_entry_bundle([b"{}", b"[]", b'"x"'])
        routes["tile/entries/000.p/3"] = ok(entries)
        second = await logmonitor.verify_log(bundle, timeout_s=5)
        routes["tile/entries/000.p/3"] = ok(b"\xff\xff" + b"z" * 200_000)
        with pytest.raises(LogUnreachable, match="larger than"):
            await logmonitor.verify_log(bundle, timeout_s=5)
    assert report.problems[0].kind == "malformed entry bundle"
    assert "ends inside an entry" in report.problems[0].detail
    kinds = [(p.kind, p.index) for p in second.problems]
    assert kinds == [("malformed entry", 0), ("malformed entry", 1), ("malformed entry", 2),
                     ("missing", 0), ("root mismatch", None)]


async def test_watch_polls_until_cancelled_and_rides_out_an_unreachable_notary(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state.json"
    polls: list[logmonitor.PollResult] = []
    failures: list[str] = []
    entries: list[logmonitor.LoggedEntry] = []
    async with open_logged_world(tmp_path) as (_site, notary):
        bundle = log_bundle(notary)
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:

                def polled(result: logmonitor.PollResult) -> None:
                    polls.append(result)
                    if len(polls) == 2:
                        nursery.cancel_scope.cancel()

                nursery.start_soon(partial(
                    logmonitor.watch_log, bundle, domain=DOMAIN, state_path=state,
                    on_entry=entries.append, on_poll=polled,
                    on_unreachable=lambda exc: failures.append(str(exc)),
                    interval_s=0.05, timeout_s=5,
                ))
    assert [(p.old_size, p.new_size) for p in polls] == [(0, 4), (4, 4)]
    assert sorted(e.target.host for e in entries) == sorted(IN_DOMAIN) and failures == []
    # The notary is gone: each poll says so, and the watch goes on.
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:

            def failed(message: str) -> None:
                failures.append(message)
                if len(failures) == 2:
                    nursery.cancel_scope.cancel()

            nursery.start_soon(partial(
                logmonitor.watch_log, bundle, domain=DOMAIN, state_path=state,
                on_entry=entries.append, on_poll=polls.append,
                on_unreachable=lambda exc: failed(str(exc)), interval_s=0.05, timeout_s=5,
            ))
    assert len(polls) == 2 and "could not connect" in failures[0]


class _StoreFetcher:
    """A ``LogFetcher`` stand-in answering proof requests from a LogStore."""

    host_name = "store"

    def __init__(self, store: LogStore) -> None:
        self._store = store

    async def get(self, path: str, *, max_bytes: int):
        from notary.client.logfetch import LogResponse

        query = dict(part.split("=") for part in path.partition("?")[2].split("&"))
        proof = self._store.consistency_proof(int(query["old"]), int(query["new"]))
        return LogResponse(200, b"".join(base64.b64encode(node) + b"\n" for node in proof))


async def test_a_watch_proves_each_chunk_part_of_the_signed_tree(tmp_path: Path) -> None:
    """Entries are reported a chunk at a time, each chunk proven (by a
    consistency proof from the root of the entries read so far) to be the
    beginning of the signed tree; a chunk that is not is a problem."""
    entries = [b"entry %d" % i for i in range(700)]
    with LogStore(tmp_path / "log.db") as store:
        store.append(entries, lambda size, root: f"{size}\n")
        root = tlog.CompactRange()
        for entry in entries:
            root.append(tlog.leaf_hash(entry))
        checkpoint = tlog.Checkpoint("o", 700, root.root())
        fetcher = _StoreFetcher(store)
        honest = LogReplay(700)
        for entry in entries[:512]:
            honest.add(entry)
        def prove(replay: LogReplay):
            return logmonitor._consistency(
                fetcher, replay.next_index, 700, replay.root(), checkpoint.root
            )

        assert await prove(honest) is None
        forged = LogReplay(700)
        for entry in [b"forged", *entries[1:512]]:
            forged.add(entry)
        fault = await prove(forged)
        assert fault is not None and "does not verify" in fault.reason
    assert logmonitor.WATCH_CHUNK_ENTRIES % tlog.TILE_WIDTH == 0


# -- files: nothing planted beside the state is written through (issue 30, item 9) ---------


async def test_watch_does_not_write_through_a_planted_symlink(tmp_path: Path, capsys) -> None:
    """Someone who can write in the state's directory plants symlinks at the
    temporary names a watch once used (``.NAME.PID.tmp``): the watch writes
    its state into a file of its own, never into what the links point to."""
    import os

    shared = tmp_path / "shared"
    shared.mkdir()
    state = shared / "state.json"
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    for name in (f".state.json.{os.getpid()}.tmp", ".state.json.tmp", f".state.json.{os.getpid()}"):
        (shared / name).symlink_to(victim)
    async with open_logged_world(tmp_path) as (_site, notary):
        path = str(write_bundle(tmp_path / "log.notary", log_bundle(notary)))
        status, _out, err = await run_cli(
            capsys, "log", "watch", path, "--domain", DOMAIN, "--once", "--state", str(state)
        )
    assert status == 0, err
    assert victim.read_text() == "precious\n"
    assert not state.is_symlink() and json.loads(state.read_text())["type"] == "notary.log-monitor"
    assert (state.stat().st_mode & 0o077) == 0


# -- a log with problems is reported, not read to its claimed end (issue 30, item 8) ------


def junk_log(path: str) -> bytes | None:
    """A log claiming 2**40 entries, each entry bundle full of junk."""
    if path == "checkpoint":
        return ok(fake_checkpoint(1 << 40))
    if path.startswith("tile/entries/"):
        return ok(tlog.encode_entry_bundle([b"junk"] * tlog.TILE_WIDTH))
    return None


async def test_verify_stops_at_max_problems_and_prints_them(capsys, tmp_path: Path) -> None:
    async with open_fake_log(junk_log) as bundle:
        path = str(write_bundle(tmp_path / "junk.notary", bundle))
        with trio.fail_after(30):
            few, few_out, few_err = await run_cli(
                capsys, "log", "verify", path, "--max-problems", "3"
            )
            assert few == 1, few_err  # (before the option existed: 2, not a hang)
            status, out, err = await run_cli(capsys, "log", "verify", path, "--timeout", "5")
            bad, _out, bad_err = await run_cli(capsys, "log", "verify", path, "--max-problems", "0")
    assert status == 1, err
    assert f"size:    {1 << 40}" in out
    problems = [line for line in out.splitlines() if line.startswith("problem: ")]
    assert len(problems) == 100
    assert problems[0] == "problem: malformed entry at index 0: not strict UTF-8 JSON"
    assert "stopped after 100 problems (--max-problems)" in out
    assert "INCONSISTENT: 100 problems" in out
    assert f"claims {1 << 40} entries, more than --max-entries" in err
    assert few_out.count("problem: ") == 3 and "stopped after 3 problems" in few_out
    assert bad == 2 and "--max-problems must be between 1 and" in bad_err


async def test_watch_reports_a_log_with_problems_not_an_unreachable_one(
    capsys, tmp_path: Path
) -> None:
    state = tmp_path / "state.json"
    async with open_fake_log(junk_log) as bundle:
        path = str(write_bundle(tmp_path / "junk.notary", bundle))
        with trio.fail_after(30):
            status, out, err = await run_cli(
                capsys, "log", "watch", path, "--domain", DOMAIN, "--once",
                "--state", str(state), "--max-problems", "10",
            )
    assert status == 1, err
    assert "cannot read" not in err and "INCONSISTENT" in out
    assert out.count("problem: malformed entry at index") == 10
    assert "stopped after 10 problems" in out
    assert not state.exists()


def signed_entries(count: int, origin: str = ORIGIN) -> list[bytes]:
    """``count`` statement entries signed by FAKE_KEY, promising ``origin``."""
    signer = crypto.Ed25519Signer(FAKE_KEY)
    key_id = public_key_of(signer.public_raw)[1]
    return [
        v2.sign_statement({
            "type": v2.STATEMENT_TYPE, "target": f"site{i}.{DOMAIN}:443", "observations": [],
            "signed_at": 100 + i, "valid_until": 10**9, "key_id": key_id,
            "log": {"origin": origin, "merge_by": 130 + i},
        }, signer.sign).entry
        for i in range(count)
    ]


def fake_sign(size: int, root: bytes) -> str:
    return fake_checkpoint(size, root).decode()


class StoreLog:
    """A log served from a LogStore as the notary serves it (checkpoint,
    tiles, entry bundles, consistency proofs), with ``proofs`` to alter
    the proofs it serves."""

    def __init__(self, store: LogStore) -> None:
        self.store = store
        #: The proof served for an honest one (None: HTTP 404).
        self.proofs: Callable[[bytes], bytes | None] = lambda body: body

    def __call__(self, path: str) -> bytes | None:
        head = self.store.head()
        if head is None:
            return None
        if path == "checkpoint":
            return ok(head.checkpoint.encode())
        if path.startswith("proof/consistency?"):
            query = dict(part.split("=") for part in path.partition("?")[2].split("&"))
            proof = self.store.consistency_proof(int(query["old"]), int(query["new"]))
            served = self.proofs(b"".join(base64.b64encode(node) + b"\n" for node in proof))
            return ok(served) if served is not None else None
        level, index, width = tlog.parse_tile_path(path)
        if level is None:
            first = index * tlog.TILE_WIDTH
            if first + width > head.size:
                return None
            return ok(tlog.encode_entry_bundle(self.store.entries(first, first + width)))
        hashes = self.store.tile(level, index)
        if hashes is None or len(hashes) < width * tlog.HASH_SIZE:
            return None
        return ok(hashes[: width * tlog.HASH_SIZE])


def flip_a_bit(body: bytes) -> bytes:
    """The proof with one bit of its first hash flipped (still base64)."""
    first = bytearray(base64.b64decode(body[:44]))
    first[0] ^= 1
    return base64.b64encode(bytes(first)) + body[44:]


async def test_verify_reads_at_most_max_entries_and_proves_them_the_start(
    capsys, tmp_path: Path
) -> None:
    progress: list[tuple[int, int, int]] = []
    with LogStore(tmp_path / "fake.db") as store:
        store.append(signed_entries(600), fake_sign)
        log = StoreLog(store)
        async with open_fake_log(log) as bundle:
            path = str(write_bundle(tmp_path / "fake.notary", bundle))
            report = await logmonitor.verify_log(
                bundle, timeout_s=5, max_entries=300,
                on_progress=lambda *step: progress.append(step),
            )
            status, out, err = await run_cli(capsys, "log", "verify", path, "--max-entries", "300")
            whole, whole_out, _err = await run_cli(
                capsys, "log", "verify", path, "--max-entries", "0"
            )
            log.proofs = flip_a_bit
            faulty = await logmonitor.verify_log(bundle, timeout_s=5, max_entries=300)
            bad, _out, bad_err = await run_cli(capsys, "log", "verify", path, "--max-entries", "-1")
    assert report.consistent and not report.complete and report.entries_limit == 256
    assert report.entries_checked == 256 and report.tiles_checked == 1
    assert report.computed_root is None
    assert progress == [(0, 600, 256), (256, 600, 256)]
    assert status == 7, err
    assert "claims 600 entries, more than --max-entries: only the first 256 are read" in err
    assert "INCOMPLETE: the first 256 of 600 entries are consistent" in out
    assert whole == 0 and "checked: 600 entries" in whole_out
    assert [p.kind for p in faulty.problems] == ["faulty consistency proof"]
    assert "the first 256 entries are not proven the start" in faulty.problems[0].detail
    assert bad == 2 and "--max-entries" in bad_err


# -- a faulty proof is settled from the entries before anyone is accused (item 7) ----------


async def test_watch_settles_a_failed_proof_from_the_entries(capsys, tmp_path: Path) -> None:
    """A proof with one bit flipped between two checkpoints that are in fact
    consistent is a faulty answer (exit 6, no evidence, the old state
    kept); a tree the entries do not extend from the kept one is
    equivocation (exit 3, evidence)."""
    state = tmp_path / "state.json"
    entries = signed_entries(320)
    with LogStore(tmp_path / "fake.db") as store:
        store.append(entries[:300], fake_sign)
        log = StoreLog(store)
        async with open_fake_log(log) as bundle:
            path = str(write_bundle(tmp_path / "fake.notary", bundle))
            watch = ("log", "watch", path, "--domain", DOMAIN, "--once", "--state", str(state))
            status, out, err = await run_cli(capsys, *watch)
            assert status == 0, err
            kept = state.read_text()
            store.append(entries[300:310], fake_sign)
            log.proofs = flip_a_bit
            status, out, err = await run_cli(capsys, *watch)
            assert status == 6, (out, err)
            assert "FAULTY PROOF: faulty consistency proof: proof/consistency?old=300&new=310 " \
                   "does not verify" in out
            assert "no equivocation" in out and "EQUIVOCATION" not in out
            assert entry_lines(out) == [] and state.read_text() == kept
            log.proofs = lambda body: None  # not served at all: the same
            missing, out, _err = await run_cli(capsys, *watch)
            assert missing == 6 and "is not served (HTTP 404)" in out
            assert evidence_files(tmp_path) == []
            log.proofs = lambda body: body
            status, out, _err = await run_cli(capsys, *watch)
            assert status == 0 and len(entry_lines(out)) == 10
        # Another history of 320 entries, signed by the same key: its first
        # 310 are not the kept tree's, whatever proof comes with it.
        with LogStore(tmp_path / "fork.db") as fork:
            fork.append([entries[1], entries[0], *entries[2:]], fake_sign)
            forked = StoreLog(fork)
            forked.proofs = flip_a_bit
            async with open_fake_log(forked) as bundle:
                path = str(write_bundle(tmp_path / "fake.notary", bundle))
                watch = ("log", "watch", path, "--domain", DOMAIN, "--once", "--state", str(state))
                status, out, _err = await run_cli(capsys, *watch)
    assert status == 3
    assert "EQUIVOCATION: no consistency from 310 to 320 entries: " in out
    assert "the entries it serves from 310 on do not lead from the kept root" in out
    evidence = sorted(p.name.rsplit(".", 1)[-1] for p in evidence_files(tmp_path))
    assert evidence == ["checkpoint", "checkpoint", "consistency-proof"]


async def test_a_failed_chunk_proof_is_settled_too(capsys, tmp_path: Path, monkeypatch) -> None:
    """The proof that the entries read so far begin the signed tree fails,
    but all the entries hash to the signed root: a faulty proof, and no
    entry is reported (none was proven when it would have been)."""
    monkeypatch.setattr(logmonitor, "WATCH_CHUNK_ENTRIES", tlog.TILE_WIDTH)
    state = tmp_path / "state.json"
    with LogStore(tmp_path / "fake.db") as store:
        store.append(signed_entries(600), fake_sign)
        log = StoreLog(store)
        log.proofs = flip_a_bit
        async with open_fake_log(log) as bundle:
            path = str(write_bundle(tmp_path / "fake.notary", bundle))
            watch = ("log", "watch", path, "--domain", DOMAIN, "--once", "--state", str(state))
            status, out, err = await run_cli(capsys, *watch)
            assert status == 6, (out, err)
            assert "proof/consistency?old=256&new=600 does not verify" in out
            assert entry_lines(out) == [] and not state.exists()
            log.proofs = lambda body: body
            status, out, _err = await run_cli(capsys, *watch)
    assert status == 0 and len(entry_lines(out)) == 600


# -- the bundle pins the log: origin and key (issue 30, item 11) ----------------------------


def pinned_bundle(notary: NotaryUnderTest, origin: str = ORIGIN) -> Bundle:
    """``log_bundle`` with a log member: ``origin``, the notary's v2 key."""
    from notary.protocol.bundle import BundleLog

    bundle = log_bundle(notary)
    return make_bundle(name=bundle.name, location=bundle.bundle_location,
                       hosts=list(bundle.hosts), log=BundleLog.of(origin, public_raw(notary)))


async def test_verify_and_watch_hold_the_log_to_the_origin_the_bundle_pins(
    tmp_path: Path, capsys
) -> None:
    """A log under another origin than its bundle pins, though signed by the
    same key, is that notary's problem; a watch's state kept for another
    origin is a usage error. A bundle without the member says so."""
    state = tmp_path / "state.json"
    async with open_logged_world(tmp_path) as (_site, notary):
        right = str(write_bundle(tmp_path / "right.notary", pinned_bundle(notary)))
        wrong = str(write_bundle(tmp_path / "wrong.notary",
                                 pinned_bundle(notary, "elsewhere.test/v2/log")))
        plain = str(write_bundle(tmp_path / "plain.notary", log_bundle(notary)))
        wrong_status, wrong_out, _err = await run_cli(capsys, "log", "verify", wrong)
        status, out, err = await run_cli(capsys, "log", "verify", right)
        plain_status, plain_out, _err = await run_cli(capsys, "log", "verify", plain)
        watch = ("--domain", DOMAIN, "--once", "--state", str(state))
        watch_wrong, watch_wrong_out, _err = await run_cli(capsys, "log", "watch", wrong, *watch)
        assert not state.exists()
        watch_plain, watch_plain_out, _err = await run_cli(capsys, "log", "watch", plain, *watch)
        watch_right, watch_right_out, _err = await run_cli(capsys, "log", "watch", right, *watch)
        kept_elsewhere, _out, kept_err = await run_cli(capsys, "log", "watch", wrong, *watch)
    assert wrong_status == 1
    assert ("problem: wrong log: the checkpoint names log 'notary.test/v2/log'; the bundle pins "
            "'elsewhere.test/v2/log'") in wrong_out
    assert status == 0, err
    assert f"log:     {ORIGIN} (pinned by the bundle)" in out and "consistent" in out
    assert plain_status == 0 and "(not pinned: the bundle has no log member" in plain_out
    assert watch_wrong == 1 and "problem: wrong log" in watch_wrong_out
    assert watch_plain == 0 and "its bundle pins no log" in watch_plain_out
    assert watch_right == 0 and "pins no log" not in watch_right_out
    assert kept_elsewhere == 2
    assert f"was kept for log '{ORIGIN}', the bundle pins 'elsewhere.test/v2/log'" in kept_err


async def test_a_bundle_with_a_log_member_and_no_v2_key_is_enough(tmp_path: Path) -> None:
    """The log member's key is the v2 key: a bundle pinning the log but no
    host key can be verified with."""
    async with open_logged_world(tmp_path) as (_site, notary):
        bundle = pinned_bundle(notary)
        keyless = make_bundle(
            name=bundle.name, location=bundle.bundle_location,
            hosts=[BundleHost(h.host, h.ssl_port, h.http_port, h.certificate_pem)
                   for h in bundle.hosts],
            log=bundle.log,
        )
        report = await logmonitor.verify_log(keyless, timeout_s=10)
    assert report.consistent and report.pinned and report.entries_checked == 4


async def test_an_unsettled_proof_is_reported_even_past_max_problems(
    capsys, tmp_path: Path
) -> None:
    """A failed proof whose entries cannot all be read (here: junk, past
    --max-problems) is not settled: the log's problems, the unsettled
    proof shown among them, not equivocation."""
    state = tmp_path / "state.json"
    with LogStore(tmp_path / "fake.db") as store:
        store.append(signed_entries(10), fake_sign)
        log = StoreLog(store)
        async with open_fake_log(log) as bundle:
            path = str(write_bundle(tmp_path / "fake.notary", bundle))
            watch = ("log", "watch", path, "--domain", DOMAIN, "--once", "--state", str(state),
                     "--max-problems", "2")
            assert (await run_cli(capsys, *watch))[0] == 0
            store.append([b"junk"] * 5, fake_sign)
            log.proofs = flip_a_bit
            status, out, _err = await run_cli(capsys, *watch)
    assert status == 1
    assert out.count("problem: malformed entry") == 2
    assert ("problem: faulty consistency proof: proof/consistency?old=10&new=15 does not "
            "verify") in out and "(not settled: its entries could not all be read)" in out
    assert "EQUIVOCATION" not in out and evidence_files(tmp_path) == []
