"""The notary's transparency log served end to end (issue 22): v2 statements
carry the log's promise, then their inclusion proof; the log is served as
C2SP tiles under /v2/log/, and what the tiles hold is checked with an
implementation of RFC 9162 and of C2SP signed-note written from the
specifications, not the project's functions (``tests.support.merkle``,
``tests.support.log_notaries``)."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
from pathlib import Path

import pytest
import trio
from cryptography.hazmat.primitives.asymmetric import ed25519

from notary.protocol import tlog, v2
from tests.support.log_notaries import LOG, ORIGIN, get, logged_statement, open_checkpoint, query
from tests.support.merkle import rfc_leaf, rfc_mth, rfc_path
from tests.support.metrics import value
from tests.support.notaries import NotaryUnderTest, open_v2_notary, send_raw
from tests.support.tls_targets import open_tls_target

SITE, OTHER = "www.example.test", "other.example.test"


# -- helpers --------------------------------------------------------------------


def public_raw(notary: NotaryUnderTest) -> bytes:
    signer = notary.running.signers["v2"]
    return signer.public_raw  # type: ignore[attr-defined, no-any-return]


async def all_entries(notary: NotaryUnderTest, size: int) -> list[bytes]:
    entries: list[bytes] = []
    for index in range(0, size, 256):
        width = min(256, size - index)
        path = tlog.entries_path(index // 256, width)
        status, body = await get(notary, f"/v2/log/{path}")
        assert status == 200
        data = body
        while data:  # C2SP tlog-tiles: a big-endian uint16 length, then the entry
            length = int.from_bytes(data[:2], "big")
            entries.append(data[2:2 + length])
            data = data[2 + length:]
    return entries


# -- tests ----------------------------------------------------------------------


async def test_statements_are_promised_then_proven_in_the_served_log(tmp_path: Path) -> None:
    async with open_tls_target(names=[SITE, OTHER]) as site:
        names = {SITE: [site.host], OTHER: [site.host]}
        async with open_v2_notary(tmp_path, names, log=LOG) as notary:
            key = public_raw(notary)
            now = int(notary.clock())
            # First answer: signed now, promised, not yet in the log.
            (first,) = v2.parse_answer_document(await query(notary, (SITE, site.port))).statements
            assert first.log == v2.ParsedLogPromise(ORIGIN, first.signed_at + 30)
            assert first.inclusion is None
            assert v2.verify_logged(first, key, now=now) == v2.LoggedStatement(None, None, None)
            # Its promise, once merge_by passed without a proof, is broken.
            with pytest.raises(v2.VerificationError, match="promise is broken"):
                v2.verify_logged(first, key, now=first.signed_at + 31)

            statement = await logged_statement(notary, (SITE, site.port))
            assert statement.signature == first.signature  # the same statement, now proven
            logged = v2.verify_logged(statement, key, now=now)
            assert logged is not None and logged.checkpoint is not None
            assert statement.inclusion is not None

            # The served checkpoint, read with the specifications alone.
            other = await logged_statement(notary, (OTHER, site.port))
            status, note = await get(notary, "/v2/log/checkpoint")
            assert status == 200
            origin, size, root = open_checkpoint(note.decode(), key)
            assert origin == ORIGIN and size >= 2
            # Every entry, from the entry bundles; the root recomputed.
            entries = await all_entries(notary, size)
            assert len(entries) == size
            leaves = [rfc_leaf(entry) for entry in entries]
            assert rfc_mth(entries) == root
            assert statement.entry_bytes in entries and other.entry_bytes in entries
            # The answer's proof is RFC 9162's PATH in the tree of its checkpoint.
            inclusion = statement.inclusion
            _, proven_size, proven_root = open_checkpoint(inclusion.checkpoint, key)
            assert entries[inclusion.index] == statement.entry_bytes
            assert list(inclusion.proof) == rfc_path(inclusion.index, entries[:proven_size])
            assert rfc_mth(entries[:proven_size]) == proven_root
            # Each entry is a statement the notary signed.
            for entry in entries:
                parsed = v2.parse_statement_entry(0, json.loads(entry))
                assert parsed.entry_bytes == entry
                ed25519.Ed25519PublicKey.from_public_bytes(key).verify(
                    base64.b64decode(parsed.signature), parsed.signed_bytes
                )
            # The level-0 tile holds the leaf hashes.
            status, tile = await get(notary, f"/v2/log/{tlog.tile_path(0, 0, size)}")
            assert status == 200 and tile == b"".join(leaves)
            # A consistency proof from the first proven size to now verifies.
            status, body = await get(
                notary, f"/v2/log/proof/consistency?old={proven_size}&new={size}"
            )
            assert status == 200
            proof = [base64.b64decode(line) for line in body.split()]
            tlog.verify_consistency(proven_size, size, proven_root, root, proof)
            # The log's figures on the admin listener.
            metrics = notary.running.metrics
            assert metrics is not None
            text = (await metrics.render()).decode()
            assert value(text, "notary_log_appended_total") == size
            assert value(text, "notary_log_size") == size
            assert value(text, "notary_log_batches_total") >= 1
            assert value(text, "notary_log_failed_batches_total") == 0
            assert value(text, "notary_log_pending") == 0


async def test_a_tampered_inclusion_or_checkpoint_is_caught(tmp_path: Path) -> None:
    async with open_tls_target(names=[SITE]) as site, open_v2_notary(
        tmp_path, {SITE: [site.host]}, log=LOG
    ) as notary:
        key = public_raw(notary)
        now = int(notary.clock())
        body = await query(notary, (SITE, site.port))
        statement = await logged_statement(notary, (SITE, site.port))
        assert statement.inclusion is not None
        inclusion = statement.inclusion
        # A bad proof (another index), a checkpoint signed by another key,
        # and a checkpoint of another log each fail.
        wrong_index = v2.ParsedInclusion(inclusion.checkpoint, inclusion.index + 1, inclusion.proof)
        stranger = ed25519.Ed25519PrivateKey.generate()
        stranger_raw = stranger.public_key().public_bytes_raw()
        text = inclusion.checkpoint.partition("\n\n")[0] + "\n"
        forged = tlog.sign_note(text, ORIGIN, stranger.sign, stranger_raw)
        elsewhere = tlog.sign_note(
            text.replace(ORIGIN, "elsewhere.test/log", 1), ORIGIN, stranger.sign, stranger_raw
        )
        for bad, message in (
            (wrong_index, "inclusion proof fails"),
            (v2.ParsedInclusion(forged, inclusion.index, inclusion.proof), "bad checkpoint"),
        ):
            with pytest.raises(v2.VerificationError, match=message):
                v2.verify_logged(_with(statement, bad), key, now=now)
        with pytest.raises(v2.VerificationError, match="another log"):
            v2.verify_logged(
                _with(statement, v2.ParsedInclusion(elsewhere, inclusion.index, inclusion.proof)),
                stranger_raw, now=now,
            )
        # The first answer's bytes, altered on the wire: the entry's proof
        # no longer covers the statement.
        assert b'"inclusion"' not in body


async def test_a_store_holding_another_notarys_log_refuses_to_start(tmp_path: Path) -> None:
    """A node given another v2 key (or origin) than the log in its store was
    made with must not sign checkpoints of that log: it refuses to start."""
    (tmp_path / "a").mkdir()
    async with open_tls_target(names=[SITE]) as site:
        async with open_v2_notary(tmp_path / "a", {SITE: [site.host]}, log=LOG) as notary:
            await logged_statement(notary, (SITE, site.port))
            database = notary.config.server.db_file
        assert database is not None
        moved = tmp_path / "b" / database.relative_to(tmp_path / "a")
        moved.parent.mkdir(parents=True)
        shutil.copy(database, moved)  # the same store, a new key
        with pytest.raises(BaseException) as refused:
            async with open_v2_notary(tmp_path / "b", {SITE: [site.host]}, log=LOG):
                pass
        assert "not this notary's" in repr(refused.value)


def _with(statement: v2.ParsedStatement, inclusion: v2.ParsedInclusion) -> v2.ParsedStatement:
    from dataclasses import replace

    return replace(statement, inclusion=inclusion)


async def test_bad_log_requests_get_clear_errors(tmp_path: Path) -> None:
    async with open_tls_target(names=[SITE]) as site, open_v2_notary(
        tmp_path, {SITE: [site.host]}, log=LOG
    ) as notary:
        assert (await get(notary, "/v2/log/checkpoint"))[0] == 404  # nothing logged yet
        await logged_statement(notary, (SITE, site.port))
        for path, status in (
            ("/v2/log/tile/0/000", 404),  # a full tile the tree does not have
            ("/v2/log/tile/0/0000.p/1", 404),  # not canonical
            ("/v2/log/tile/0/000.p/0", 404),
            ("/v2/log/tile/0/000.p/200", 404),  # wider than the tree
            ("/v2/log/tile/entries/001.p/1", 404),
            ("/v2/log/tile/99/000.p/1", 404),
            ("/v2/log/nothing", 404),
            ("/v2/log/proof/consistency?old=2&new=1", 400),
            ("/v2/log/proof/consistency?old=a&new=1", 400),
            ("/v2/log/proof/consistency?old=1", 400),
            ("/v2/log/proof/consistency?old=1&new=99999", 404),
            ("/v2/log/proof/consistency?" + "old=1&" * 40, 414),
        ):
            got, body = await get(notary, path)
            assert got == status, (path, got, body)
            assert body.endswith(b"\n") and b"Traceback" not in body
        answer = await send_raw(notary.port, b"POST /v2/log/checkpoint HTTP/1.0\r\n\r\n")
        assert answer.status == 405
        assert (await get(notary, "/v2/log/tile/0/000.p/1"))[0] == 200


#: Query strings of the proof endpoint that are not two sizes (issue 30 item
#: 19): only ASCII decimal digits without sign, space or leading zero are.
NOT_SIZES = (
    "old=%D9%A1&new=1",  # an Arabic-Indic one, percent-encoded
    "old=0&new=%D9%A1",
    "old=%EF%BC%91&new=1",  # a fullwidth one
    "old=%C2%B9&new=1",  # a superscript one
    "old=%31&new=1",  # an ASCII one, percent-encoded
    "old=01&new=1", "old=00&new=1", "old=+1&new=1", "old=-0&new=1", "old=%2B1&new=1",
    "old=%201&new=1", "old=1%20&new=1", "old=1.0&new=1", "old=0x1&new=1", "old=1_0&new=10",
    "old=&new=1", "old=0&new=1&", "old=0&new=1&x=", "old=0&old=0&new=1", "old=0&new=1&new=1",
    "old=0;new=1", "Old=0&new=1", "old=0&new", "old",
)


async def test_sizes_and_tile_indexes_are_ascii_digits_only(tmp_path: Path) -> None:
    async with open_tls_target(names=[SITE]) as site, open_v2_notary(
        tmp_path, {SITE: [site.host]}, log=LOG
    ) as notary:
        await logged_statement(notary, (SITE, site.port))
        for query in ("old=0&new=1", "new=1&old=0", "old=1&new=1"):
            assert (await get(notary, f"/v2/log/proof/consistency?{query}"))[0] == 200, query
        for query in NOT_SIZES:
            status, body = await get(notary, f"/v2/log/proof/consistency?{query}")
            assert status == 400, (query, status, body)
        assert (await get(notary, "/v2/log/tile/0/000.p/1"))[0] == 200
        assert (await get(notary, "/v2/log/tile/entries/000.p/1"))[0] == 200
        for path in (
            "tile/0/%D9%A0%D9%A0%D9%A0.p/1", "tile/%D9%A0/000.p/1",
            "tile/entries/000.p/%D9%A1", "tile/0/000.p/%EF%BC%91", "tile/0/000.p/%31",
            "tile/0/000.p/01", "tile/0/000.p/+1",
        ):
            status, body = await get(notary, f"/v2/log/{path}")
            assert status == 404, (path, status, body)
        # Raw UTF-8 digits in the path: refused by the parser or not found.
        for raw in ("tile/0/\u0660\u0660\u0660.p/1", "tile/entries/000.p/\u0661"):
            answer = await send_raw(
                notary.port, b"GET /v2/log/" + raw.encode() + b" HTTP/1.0\r\n\r\n"
            )
            assert answer.status in (400, 404), (raw, answer.status)


@pytest.mark.parametrize("path", [
    "tile/0/\u0661\u0662\u0663", "tile/\u0660/000", "tile/entries/000.p/\u0661",
    "tile/0/x\u0661\u0661\u0661/000", "tile/0/\uff10\uff10\uff10", "tile/0/\u00b9\u00b2\u00b3",
])
def test_tile_paths_take_ascii_digits_only(path: str) -> None:
    with pytest.raises(tlog.TileError):
        tlog.parse_tile_path(path)


def test_a_full_log_queue_refuses_new_statements_with_503(tmp_path: Path) -> None:
    from notary.outbound.logappender import LogAppender, LogBacklogged
    from notary.state import crypto

    signer = crypto.Ed25519Signer(crypto.generate_ed25519_key())
    appender = LogAppender(
        tmp_path / "db", origin=ORIGIN, signer=signer, interval_s=1.0,
        max_merge_delay_s=30, max_pending=2,
    )
    assert appender.promise(1000) == {"origin": ORIGIN, "merge_by": 1030}

    def signed(n: int) -> v2.SignedStatement:
        made = {"type": v2.STATEMENT_TYPE, "target": f"h{n}.test:443", "signed_at": 1000,
                "valid_until": 2000, "log": appender.promise(1000)}
        return v2.sign_statement(made, signer.sign)

    appender.submit(signed(1))
    appender.submit(signed(2))
    with pytest.raises(LogBacklogged) as refused:
        appender.submit(signed(3))
    assert refused.value.status == 503 and "log" in refused.value.message
    assert appender.pending == 2


async def test_a_statement_too_large_to_log_is_refused_and_the_log_goes_on(
    tmp_path: Path,
) -> None:
    """A statement whose entry is longer than a log entry may be (a tile
    bundle's 16-bit length: with DANE evidence of many large TLSA records)
    is refused when submitted (503, not served, nothing promised), rather
    than failing its batch and ending the appender."""
    from notary.outbound.logappender import LogAppender, LogBacklogged
    from notary.state import crypto

    signer = crypto.Ed25519Signer(crypto.generate_ed25519_key())
    appender = LogAppender(
        tmp_path / "db", origin=ORIGIN, signer=signer, interval_s=0.05,
        max_merge_delay_s=30, max_pending=10,
    )

    def signed(pad: int) -> v2.SignedStatement:
        made = {"type": v2.STATEMENT_TYPE, "target": "h.example.test:443", "pad": "x" * pad,
                "signed_at": 1000, "valid_until": 2000, "log": appender.promise(1000)}
        return v2.sign_statement(made, signer.sign)

    async with trio.open_nursery() as nursery:
        await nursery.start(appender.run)
        largest = signed(0xFFFF - len(signed(0).entry))
        assert len(largest.entry) == tlog.MAX_ENTRY_BYTES
        with pytest.raises(LogBacklogged) as refused:
            appender.submit(signed(0x10000 - len(signed(0).entry)))
        assert refused.value.status == 503 and "too large" in refused.value.message
        appender.submit(largest)
        with trio.fail_after(10):
            while appender.statistics().appended < 1:  # noqa: ASYNC110 (a counter)
                await trio.sleep(0.02)
        stats = appender.statistics()
        assert (stats.refused_too_large, stats.failed_batches, stats.pending) == (1, 0, 0)
        assert await appender.read_entries(0, 1) == [largest.entry]
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(("note", "origin", "key"), [
    ("not a note", ORIGIN, bytes(32)),
    ("x\n\n\u2014 a b\n", "bad origin", bytes(32)),  # a name no key can have
    ("x\n\n\u2014 a b\n", ORIGIN, bytes(31)),  # not an Ed25519 key
])
def test_a_bad_checkpoint_is_a_verification_error(note: str, origin: str, key: bytes) -> None:
    with pytest.raises(v2.VerificationError, match="bad checkpoint"):
        v2.verify_checkpoint(note, origin, key)


# -- what /v2/log/ costs and holds (issue 30, item 6) ------------------------------------


def padded_statement(notary: NotaryUnderTest, n: int, pad: int) -> v2.SignedStatement:
    """A statement signed with the notary's v2 key and its log's promise,
    ``pad`` bytes larger than an empty one (entries of a chosen size)."""
    log = notary.running.log
    assert log is not None
    signer = notary.running.signers["v2"]
    now = int(notary.clock())
    made = {"type": v2.STATEMENT_TYPE, "target": f"h{n}.example.test:443", "observations": [],
            "pad": "x" * pad, "signed_at": now, "valid_until": now + 86400,
            "key_id": signer.key_id, "log": log.promise(now)}  # type: ignore[attr-defined]
    return v2.sign_statement(made, signer.sign)  # type: ignore[attr-defined]


async def fill_log(notary: NotaryUnderTest, count: int, pad: int = 0) -> None:
    """Append ``count`` statements (of ``pad`` bytes more each) to the
    notary's log, and wait until they are sequenced."""
    log = notary.running.log
    assert log is not None
    for n in range(count):
        log.submit(padded_statement(notary, n, pad))
    with trio.fail_after(20):
        while log.head is None or log.head.size < count:  # noqa: ASYNC110 (a counter)
            await trio.sleep(0.05)


def bundle_entries(data: bytes) -> list[bytes]:
    entries = []
    while data:
        length = int.from_bytes(data[:2], "big")
        entries.append(data[2:2 + length])
        data = data[2 + length:]
    return entries


async def test_full_tiles_are_shared_and_cost_no_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_v2_notary(tmp_path, {}, log=LOG) as notary:
        await fill_log(notary, 300)
        pages, log = notary.running.log_pages, notary.running.log
        assert pages is not None and log is not None
        reads: list[str] = []
        for method in ("read_entries", "read_tile", "read_head"):
            real = getattr(log, method)

            async def counted(*args: object, _real=real, _name=method) -> object:
                reads.append(_name)
                return await _real(*args)

            monkeypatch.setattr(log, method, counted)
        # Over HTTP: the bundle's bytes, twice the same; the second read nothing.
        first = await send_raw(notary.port, b"GET /v2/log/tile/entries/000 HTTP/1.0\r\n\r\n")
        assert first.status == 200 and len(bundle_entries(first.body)) == 256
        assert first.headers[b"cache-control"] == b"public, max-age=31536000, immutable"
        assert reads == ["read_head", "read_entries"]
        again = await send_raw(notary.port, b"GET /v2/log/tile/entries/000 HTTP/1.0\r\n\r\n")
        assert again.body == first.body and reads == ["read_head", "read_entries"]
        # Concurrent and repeated requests hold one bytes object (per keep-alive).
        answers = [
            await pages.answer(b"GET", b"/v2/log/tile/entries/000", b"", keep_alive=False)
            for _ in range(3)
        ] + [await pages.answer(b"GET", b"/v2/log/tile/0/000", b"", keep_alive=True)
             for _ in range(2)]
        assert answers[0].prepared is answers[1].prepared is answers[2].prepared
        assert answers[3].prepared is answers[4].prepared
        assert answers[0].prepared is not None and answers[0].prepared.endswith(first.body)
        stats = pages.statistics()
        assert stats.in_flight.held_responses == 5
        assert stats.in_flight.held_bytes == len(answers[0].prepared) + len(answers[3].prepared)
        for answer in answers:
            assert answer.release is not None
            answer.release()
            answer.release()  # once only
        assert pages.statistics().in_flight.held_bytes == 0
        assert pages.statistics().in_flight.held_responses == 0
        # A partial tile is made per request, never shared.
        partial = [await pages.answer(b"GET", b"/v2/log/tile/entries/001.p/44", b"")
                   for _ in range(2)]
        assert partial[0].prepared == partial[1].prepared
        assert partial[0].prepared is not partial[1].prepared
        for answer in partial:
            assert answer.release is not None
            answer.release()
        assert pages.statistics().shared_entries == 2  # the full bundle and the full tile


async def test_responses_held_for_slow_readers_stay_within_the_bounds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Answers nobody has read yet (the connection loop releases them when
    sent): per client prefix and per process, within the bounds but for one
    response; a shared response counted once in the process's."""
    from notary.model.ratelimit import Overloaded, RateLimited
    from notary.server import logapi

    monkeypatch.setattr(logapi, "MAX_BYTES_IN_FLIGHT", 600_000)
    monkeypatch.setattr(logapi, "MAX_BYTES_IN_FLIGHT_PER_CLIENT", 250_000)
    async with open_v2_notary(tmp_path, {}, log=LOG) as notary:
        await fill_log(notary, 300, pad=400)  # ~0.6 kB entries: a full bundle ~150 kB
        pages = notary.running.log_pages
        assert pages is not None
        held = []

        async def ask(path: bytes, client: bytes | None) -> int:
            try:
                answer = await pages.answer(b"GET", path, b"", client=client)
            except (RateLimited, Overloaded) as refused:
                assert refused.retry_after_s == 10  # [http] send_timeout_s
                return refused.status
            held.append(answer)
            return answer.status

        # One client: partial bundles, each ~26 kB..., up to its bound.
        statuses = [await ask(b"/v2/log/tile/entries/001.p/44", b"\x0a\x00\x01")
                    for _ in range(20)]
        assert statuses.count(200) >= 1 and statuses[-1] == 429
        assert pages.in_flight.held_by(b"\x0a\x00\x01") <= 250_000
        # Many clients, each its first response: the process's bound.
        statuses = [await ask(b"/v2/log/tile/entries/001.p/44", bytes([10, 1, n]))
                    for n in range(60)]
        assert 503 in statuses
        one = len(held[0].prepared or b"")
        assert pages.in_flight.held_bytes <= 600_000 + one
        refused_before = pages.statistics().in_flight.refused_process
        # The shared full bundle: once in the process's count, however many hold it
        # (here it does not fit beside the rest: 503, before it is made).
        assert await ask(b"/v2/log/tile/entries/000", bytes([10, 2, 0])) == 503
        for answer in held:
            assert answer.release is not None
            answer.release()
        held.clear()
        assert pages.in_flight.held_bytes == 0
        statuses = [await ask(b"/v2/log/tile/entries/000", bytes([10, 2, n])) for n in range(200)]
        assert statuses == [200] * 200
        shared = held[0].prepared
        assert shared is not None and all(answer.prepared is shared for answer in held)
        assert pages.in_flight.held_bytes == len(shared)
        stats = pages.statistics().in_flight
        assert stats.held_responses == 200 and stats.clients == 200
        assert stats.refused_process > refused_before and stats.refused_client >= 1
        # An exempt client (None) has no per-client bound, only the process's.
        assert await ask(b"/v2/log/tile/entries/000", None) == 200
        for answer in held:
            assert answer.release is not None
            answer.release()
        assert pages.statistics().in_flight == type(stats)(0, 0, 0, stats.refused_client,
                                                         stats.refused_process)


async def open_slow_reader(port: int, request: bytes) -> tuple[trio.SSLStream, bytes]:
    """A TLS connection with a small receive buffer that sends ``request``
    and reads the first bytes of the answer only, then stops reading."""
    sock = trio.socket.socket()
    sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, 4096)
    await sock.connect(("127.0.0.1", port))
    from tests.support.notaries import client_context

    stream = trio.SSLStream(
        trio.SocketStream(sock), client_context(), server_hostname=None, https_compatible=True
    )
    await stream.send_all(request)
    return stream, await stream.receive_some(64)


async def test_connections_that_never_read_hold_one_shared_response(
    tmp_path: Path
) -> None:
    """Slow readers over real connections: the bytes held are counted (the
    shared bundle once) until the connections end, then released."""
    async with open_v2_notary(tmp_path, {}, log=LOG) as notary:
        # A full bundle of ~5 MB: more than a socket's send buffer grows to
        # (tcp_wmem's default maximum is 4 MiB), so every send waits.
        await fill_log(notary, 256, pad=20_000)
        pages = notary.running.log_pages
        assert pages is not None
        readers = []
        try:
            with trio.fail_after(30):
                for _ in range(24):
                    readers.append(await open_slow_reader(
                        notary.port, b"GET /v2/log/tile/entries/000 HTTP/1.1\r\nHost: n\r\n\r\n"
                    ))
                assert all(first.startswith(b"HTTP/1.1 200 ") for _, first in readers)
                while pages.in_flight.statistics().held_responses < 20:  # noqa: ASYNC110
                    await trio.sleep(0.05)  # most are stuck in their send
            stats = pages.statistics()
            assert stats.shared_entries == 1
            # One object, however many connections hold it.
            assert stats.in_flight.held_bytes == stats.shared_bytes
            assert stats.in_flight.held_bytes > 5_000_000
        finally:
            for stream, _ in readers:
                stream.transport_stream.socket.close()  # type: ignore[attr-defined]
        with trio.fail_after(30):
            while pages.in_flight.statistics().held_responses:  # noqa: ASYNC110 (a counter)
                await trio.sleep(0.05)
        assert pages.in_flight.held_bytes == 0
        # The node still answers.
        assert (await get(notary, "/v2/log/checkpoint"))[0] == 200


async def test_log_pages_cost_a_query_token_each(tmp_path: Path) -> None:
    limits = {"exempt_clients": (), "queries_per_s_per_prefix": 0.01, "query_burst": 3}
    async with open_v2_notary(
        tmp_path, {}, log=LOG, limits=limits, v2={"max_batch": 3}
    ) as notary:
        await fill_log(notary, 2)
        for path in ("checkpoint", "tile/0/000.p/2", "proof/consistency?old=1&new=2"):
            assert (await get(notary, f"/v2/log/{path}"))[0] == 200
        answer = await send_raw(notary.port, b"GET /v2/log/checkpoint HTTP/1.0\r\n\r\n")
        assert answer.status == 429 and 90 <= int(answer.headers[b"retry-after"]) <= 100
        # Errors cost their token too (nothing is read for them).
        assert (await get(notary, "/v2/log/nothing"))[0] == 429
        abuse = notary.running.abuse
        assert abuse is not None and abuse.statistics().queries_refused == 2


# -- how much the log grows per target and per client (issue 30, item 5) -------------------


async def ask(
    notary: NotaryUnderTest, target: tuple[str, int], sha256: bytes | None = None,
) -> tuple[str, v2.ParsedStatement | None]:
    """One v2 query: the verdict and the statement it came with."""
    entry: dict[str, object] = {"host": target[0], "port": target[1]}
    if sha256 is not None:
        entry["sha256"] = sha256.hex()
    body = json.dumps({"targets": [entry]}).encode()
    answer = await send_raw(notary.port, (
        f"POST /v2/query HTTP/1.0\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body)
    assert answer.status == 200, answer.body
    parsed = v2.parse_answer_document(answer.body)
    (result,) = parsed.results
    statement = next(
        (s for s in parsed.statements if s.signature == result.statement_signature), None
    )
    return result.verdict, statement


async def logged_entries_of(notary: NotaryUnderTest, target: str) -> list[dict]:
    """The statements of ``target`` in the notary's log, once it has
    sequenced every statement signed so far."""
    log = notary.running.log
    assert log is not None
    with trio.fail_after(10):
        while log.pending:  # noqa: ASYNC110 (a counter)
            await trio.sleep(0.05)
        while log.statistics().appended < notary.running.records.statistics().statements_signed:  # noqa: ASYNC110
            await trio.sleep(0.05)
    size = log.head.size if log.head is not None else 0
    statements = [json.loads(entry)["statement"] for entry in await all_entries(notary, size)]
    return [s for s in statements if s["target"] == target]


def sha256_of(der: bytes) -> bytes:
    return hashlib.sha256(der).digest()


async def test_a_target_with_a_new_certificate_at_each_probe_is_logged_within_its_budget(
    tmp_path: Path,
) -> None:
    """A target that serves a new certificate at every handshake, probed
    again and again: its statement is signed (so logged) for the first
    probe and as its budget allows, not per probe; over budget the
    statement signed last is served and a match it does not back is
    ``unknown``; a renewal is signed over budget."""
    log = {**LOG, "statements_per_target_per_hour": 0.01}  # one token, then one per 100 h
    async with open_tls_target(names=[SITE]) as site, open_v2_notary(
        tmp_path, {SITE: [site.host]}, log=log
    ) as notary:
        target = (SITE, site.port)
        key = f"{SITE}:{site.port}"
        verdicts = []
        for _ in range(8):
            leaf = site.replace_certificate(SITE)
            notary.clock.advance(16)  # past the target's probe spacing
            verdict, statement = await ask(notary, target, sha256_of(leaf))
            assert statement is not None
            verdicts.append((verdict, sha256_of(leaf) in {o.sha256 for o in statement.observations}))
        assert site.accepted >= 8  # probed each time
        # The first statement, one change within the budget, then the one
        # signed last: its certificates are not the new one (unknown, never
        # a mismatch the notary knows is wrong).
        assert verdicts == [("match", True), ("match", True)] + [("unknown", False)] * 6
        assert len(await logged_entries_of(notary, key)) == 2
        records = notary.running.records.statistics()
        assert records.deferred_target == 6
        # The renewal is signed over budget, for what the notary knows now.
        last = sha256_of(site.leaf_der(SITE))
        notary.clock.advance(86400 - 3600)  # the statement kept was signed 96 s ago
        verdict, statement = await ask(notary, target, last)
        assert verdict == "match" and statement is not None
        assert statement.observations[0].sha256 == last
        assert len(await logged_entries_of(notary, key)) == 3
        # Metrics: the bytes appended, the changes deferred.
        metrics = notary.running.metrics
        assert metrics is not None
        text = (await metrics.render()).decode()
        entries = await logged_entries_of(notary, key)
        assert value(text, "notary_log_appended_bytes_total") >= sum(
            len(json.dumps(e)) for e in entries
        )
        assert value(text, "notary_log_statements_deferred_total", budget="target") == 6


async def test_a_stable_target_probed_often_is_logged_once_per_lag(tmp_path: Path) -> None:
    """Probes of a target that serves the same certificate only move its
    last sighting: the statement stands (the same verdicts a new one would
    give) until the sighting it leaves out is a quarter of fresh_for_s
    old; a match is never turned into anything else."""
    async with open_tls_target(names=[SITE]) as site, open_v2_notary(
        tmp_path, {SITE: [site.host]}, log=LOG
    ) as notary:
        target = (SITE, site.port)
        key = f"{SITE}:{site.port}"
        good = sha256_of(site.leaf_der(SITE))
        first = None
        for _ in range(10):
            notary.clock.advance(16)
            # An unknown hash makes the notary probe (invariant 9) ...
            verdict, statement = await ask(notary, target, hashlib.sha256(b"other").digest())
            assert verdict == "mismatch" and statement is not None
            first = first or statement
            assert statement.signature == first.signature  # ... and sign nothing new
            assert (await ask(notary, target, good))[0] == "match"
        assert site.accepted >= 10
        assert len(await logged_entries_of(notary, key)) == 1
        # A quarter of a day later (fresh_for_s 86400) a probe signs again.
        notary.clock.advance(86400 // 4)
        verdict, statement = await ask(notary, target, hashlib.sha256(b"other").digest())
        assert verdict == "mismatch" and statement is not None
        assert statement.signature != first.signature
        assert (await ask(notary, target, good))[0] == "match"
        assert len(await logged_entries_of(notary, key)) == 2


async def test_a_client_over_its_log_budget_gets_429_for_probes_and_hits_still_answer(
    tmp_path: Path,
) -> None:
    names = {n: ["127.0.0.1"] for n in ("a.example.test", "b.example.test", "c.example.test")}
    limits = {"exempt_clients": (), "log_bytes_per_s_per_prefix": 1.0, "log_burst_bytes": 300}
    async with open_tls_target(names=list(names)) as site, open_v2_notary(
        tmp_path, names, log=LOG, limits=limits
    ) as notary:
        a, b, c = ((name, site.port) for name in names)
        # A Convergence query probes c: no statement signed (nothing charged).
        assert (await get(notary, f"/target/c.example.test+{site.port}"))[0] == 200
        # A v2 query probes a and signs its first statement: ~700 bytes charged.
        verdict, statement = await ask(notary, a, sha256_of(site.leaf_der("a.example.test")))
        assert verdict == "match" and statement is not None
        # In debt: a query that would start a probe gets 429 with Retry-After ...
        refused = await send_raw(
            notary.port, f"GET /target/b.example.test+{site.port} HTTP/1.0\r\n\r\n".encode()
        )
        assert refused.status == 429 and int(refused.headers[b"retry-after"]) >= 300
        assert b"log" in refused.body
        # ... while what is cached still answers, with the statement kept.
        assert (await get(notary, f"/target/a.example.test+{site.port}"))[0] == 200
        again = await ask(notary, a, sha256_of(site.leaf_der("a.example.test")))
        assert again[0] == "match" and again[1] is not None
        assert again[1].signature == statement.signature
        # No new statement is signed for it: c (observed, never signed) is
        # answered without one, b (never observed) unprobed.
        assert await ask(notary, c, sha256_of(site.leaf_der("c.example.test"))) == (
            "unknown", None
        )
        assert await ask(notary, b) == ("unknown", None)
        # Another prefix has its own budget.
        abuse = notary.running.abuse
        assert abuse is not None and abuse.log_wait_s(b"\x7f\x00\x01", notary.clock()) == 0
        stats = abuse.statistics()
        assert stats.probes_refused_log >= 2 and "log_bytes" in stats.tracked
        metrics = notary.running.metrics
        assert metrics is not None
        text = (await metrics.render()).decode()
        assert value(text, "notary_limits_probes_refused_total", limit="log") >= 2
        assert value(text, "notary_log_statements_refused_total") == 1
        # Time pays the debt back.
        notary.clock.advance(2000)
        assert (await get(notary, f"/target/b.example.test+{site.port}"))[0] == 200
