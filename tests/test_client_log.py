"""`notary check --v2` and the notaries' logs (issue 22): the statement's
inclusion is verified, each notary's last checkpoint is kept, a later one
must be proven consistent with it, and a notary whose log forks or shrinks
between two checks is reported with both signed checkpoints kept."""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import replace
from pathlib import Path

import trio

from notary.client import check as client
from notary.client.checkpoints import CheckpointBook, notary_log_key
from notary.model.targets import Target
from notary.protocol import tlog, v2
from notary.protocol.bundle import Bundle, BundleHost, make_bundle
from notary.protocol.voting import Verdict
from notary.state import crypto
from tests.support.notaries import NotaryUnderTest, open_v2_notary, send_raw
from tests.support.tls_targets import open_tls_target, static_resolver

SITE, OTHER = "www.example.test", "other.example.test"
ORIGIN = "notary.test/v2/log"
LOG = {"enabled": True, "origin": ORIGIN, "checkpoint_interval_s": 0.1, "max_merge_delay_s": 30}


def bundle_of(notary: NotaryUnderTest, key_path: Path) -> Bundle:
    host = notary.running.api[0].host
    pem = crypto.certificate_pem(notary.certificate).decode("ascii")
    raw = crypto.ed25519_public_raw(crypto.load_ed25519_private_key(key_path))
    return make_bundle(
        name="Logging notary", location=f"https://{host}/n.notary",
        hosts=[replace(BundleHost(host, notary.port, 80, pem),
                       v2_key=base64.b64encode(raw).decode())],
    )


async def ask(site, bundle: Bundle, book: CheckpointBook, name: str = SITE) -> client.NotaryAnswer:
    report = await client.check(
        Target(name, site.port), [bundle], resolver=static_resolver({name: [site.host]}),
        relay=None, timeout_s=10.0, use_v2=True, checkpoints=book, quorum=1,
    )
    (answer,) = report.answers
    return answer


async def sequenced(notary: NotaryUnderTest, name: str, port: int) -> None:
    """Wait until the notary's statement of ``name`` is in its log."""
    body = json.dumps({"targets": [{"host": name, "port": port}]}).encode()
    with trio.fail_after(10):
        while True:
            answer = await send_raw(notary.port, (
                f"POST /v2/query HTTP/1.0\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode() + body)
            if b'"inclusion"' in answer.body:
                return
            await trio.sleep(0.05)


def forged_checkpoint(key_path: Path, size: int, root: bytes) -> str:
    """A checkpoint signed with the notary's own key (what a forking notary
    shows some clients)."""
    key = crypto.load_ed25519_private_key(key_path)
    text = tlog.format_checkpoint(tlog.Checkpoint(ORIGIN, size, root))
    return tlog.sign_note(text, ORIGIN, key.sign, crypto.ed25519_public_raw(key))


async def test_inclusion_then_consistency_across_checks(tmp_path: Path) -> None:
    book = CheckpointBook(tmp_path / "checkpoints")
    async with open_tls_target(names=[SITE, OTHER]) as site, open_v2_notary(
        tmp_path, {SITE: [site.host], OTHER: [site.host]}, log=LOG
    ) as notary:
        bundle = bundle_of(notary, tmp_path / "v2.key")
        raw = crypto.ed25519_public_raw(crypto.load_ed25519_private_key(tmp_path / "v2.key"))
        first = await ask(site, bundle, book)
        assert first.verdict is Verdict.SUCCESS
        assert "promised by" in first.detail  # signed just now, not yet sequenced
        assert book.last(ORIGIN, raw) is None
        await sequenced(notary, SITE, site.port)
        second = await ask(site, bundle, book)
        assert second.verdict is Verdict.SUCCESS and "logged at" in second.detail, second.detail
        stored = book.last(ORIGIN, raw)
        assert stored is not None
        # The log grows (another target's statement); the next check proves
        # the new checkpoint consistent with the one kept, and keeps it.
        await ask(site, bundle, book, OTHER)
        await sequenced(notary, OTHER, site.port)
        third = await ask(site, bundle, book, OTHER)
        assert third.verdict is Verdict.SUCCESS
        assert f"consistent with size {stored.checkpoint.size} seen before" in third.detail
        newer = book.last(ORIGIN, raw)
        assert newer is not None and newer.checkpoint.size > stored.checkpoint.size


async def test_a_forked_log_is_reported_with_both_checkpoints(tmp_path: Path) -> None:
    book = CheckpointBook(tmp_path / "checkpoints")
    key_path = tmp_path / "v2.key"
    async with open_tls_target(names=[SITE]) as site, open_v2_notary(
        tmp_path, {SITE: [site.host]}, log=LOG
    ) as notary:
        bundle = bundle_of(notary, key_path)
        raw = crypto.ed25519_public_raw(crypto.load_ed25519_private_key(key_path))
        await ask(site, bundle, book)
        await sequenced(notary, SITE, site.port)
        # What this client saw before: the notary's signature over another
        # history of the same size (a fork).
        status_ok = await ask(site, bundle, book)
        assert status_ok.verdict is Verdict.SUCCESS
        stored = book.last(ORIGIN, raw)
        assert stored is not None
        fork = forged_checkpoint(key_path, stored.checkpoint.size, hashlib.sha256(b"fork").digest())
        book.remember(ORIGIN, raw, fork)
        answer = await ask(site, bundle, book)
        assert answer.verdict is Verdict.FAILURE
        assert "equivocating" in answer.detail
        (evidence,) = (tmp_path / "checkpoints").glob("*.equivocation-*")
        kept = {p.name: p.read_text() for p in evidence.iterdir()}
        assert fork in kept.values() and len(kept) == 2
        for note in kept.values():  # both are the notary's own signatures
            v2.verify_checkpoint(note, ORIGIN, raw)


async def test_a_truncated_log_is_reported(tmp_path: Path) -> None:
    book = CheckpointBook(tmp_path / "checkpoints")
    key_path = tmp_path / "v2.key"
    async with open_tls_target(names=[SITE]) as site, open_v2_notary(
        tmp_path, {SITE: [site.host]}, log=LOG
    ) as notary:
        bundle = bundle_of(notary, key_path)
        raw = crypto.ed25519_public_raw(crypto.load_ed25519_private_key(key_path))
        await ask(site, bundle, book)
        await sequenced(notary, SITE, site.port)
        # The notary once signed a larger log than it now has.
        book.remember(ORIGIN, raw, forged_checkpoint(key_path, 1000, bytes(32)))
        answer = await ask(site, bundle, book)
        assert answer.verdict is Verdict.FAILURE
        assert "truncated" in answer.detail
        assert list((tmp_path / "checkpoints").glob("*.equivocation-*"))


async def test_a_reordered_log_is_reported(tmp_path: Path) -> None:
    """The notary signs, over the same entries in another order, a
    checkpoint this client then sees: no consistency proof reconciles it."""
    book = CheckpointBook(tmp_path / "checkpoints")
    key_path = tmp_path / "v2.key"
    async with open_tls_target(names=[SITE, OTHER]) as site, open_v2_notary(
        tmp_path, {SITE: [site.host], OTHER: [site.host]}, log=LOG
    ) as notary:
        bundle = bundle_of(notary, key_path)
        raw = crypto.ed25519_public_raw(crypto.load_ed25519_private_key(key_path))
        for name in (SITE, OTHER):
            await ask(site, bundle, book, name)
            await sequenced(notary, name, site.port)
        answer = await send_raw(notary.port, b"GET /v2/log/checkpoint HTTP/1.0\r\n\r\n")
        size = v2.verify_checkpoint(answer.body.decode(), ORIGIN, raw).size
        assert size >= 2
        bundle_path = tlog.entries_path(0, size)
        entries = tlog.decode_entry_bundle(
            (await send_raw(notary.port, f"GET /v2/log/{bundle_path} HTTP/1.0\r\n\r\n".encode())).body
        )
        reordered = [entries[1], entries[0], *entries[2:]]
        tree = tlog.CompactRange()
        for entry in reordered:
            tree.append(tlog.leaf_hash(entry))
        book.remember(ORIGIN, raw, forged_checkpoint(key_path, size, tree.root()))
        verdict = await ask(site, bundle, book)
    # The answer's checkpoint (its statement's, size 1) and the reordered
    # one: no proof reconciles them, which only the entries tell from a
    # faulty proof (issue 30, item 7): the row accuses nobody of equivocation.
    assert verdict.verdict is Verdict.FAILURE
    assert "its consistency proof from size 1 to" in verdict.detail
    assert "does not verify: a faulty answer or a forked log" in verdict.detail
    assert "equivocating" not in verdict.detail


def test_the_book_keeps_one_file_per_log_and_key(tmp_path: Path) -> None:
    book = CheckpointBook(tmp_path)
    key = crypto.generate_ed25519_key()
    raw = crypto.ed25519_public_raw(key)
    note = tlog.sign_note(tlog.format_checkpoint(tlog.Checkpoint(ORIGIN, 3, bytes(32))),
                          ORIGIN, key.sign, raw)
    assert book.last(ORIGIN, raw) is None
    book.remember(ORIGIN, raw, note)
    stored = book.last(ORIGIN, raw)
    assert stored is not None and stored.checkpoint.size == 3 and stored.note == note
    other = crypto.ed25519_public_raw(crypto.generate_ed25519_key())
    assert book.last(ORIGIN, other) is None  # another key: another log
    # A damaged file is the user's to see, not silently trusted afresh.
    (tmp_path / f"{notary_log_key(ORIGIN, raw)}.checkpoint").write_text("junk")
    try:
        book.last(ORIGIN, raw)
    except client.UsageError as exc:
        assert "damaged" in str(exc)
    else:
        raise AssertionError("a damaged checkpoint was accepted")


def test_evidence_is_never_written_through_a_planted_symlink(tmp_path: Path) -> None:
    """The evidence folder's name is predictable (the time): a symlink
    planted at it is not followed, a folder of its own is made instead."""
    import time

    book = CheckpointBook(tmp_path / "checkpoints")
    key = crypto.generate_ed25519_key()
    raw = crypto.ed25519_public_raw(key)
    older, newer = (
        tlog.sign_note(tlog.format_checkpoint(tlog.Checkpoint(ORIGIN, size, bytes(32))),
                       ORIGIN, key.sign, raw)
        for size in (3, 4)
    )
    victim = tmp_path / "victim"
    victim.mkdir()
    (tmp_path / "checkpoints").mkdir()
    stem = notary_log_key(ORIGIN, raw)
    now = int(time.time())
    for moment in range(now - 1, now + 10):
        (tmp_path / "checkpoints" / f"{stem}.equivocation-{moment}").symlink_to(victim)
    folder = book.keep_evidence(ORIGIN, raw, older, newer)
    assert list(victim.iterdir()) == []
    assert folder.is_dir() and not folder.is_symlink()
    assert sorted(p.read_text() for p in folder.iterdir()) == sorted([older, newer])


# -- the memory keeps only what was verified, bounded in bytes (issue 30, item 10) ------


async def logged_answer(notary: NotaryUnderTest, name: str, port: int) -> v2.ParsedAnswer:
    body = json.dumps({"targets": [{"host": name, "port": port}]}).encode()
    answer = await send_raw(notary.port, (
        f"POST /v2/query HTTP/1.0\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body)
    return v2.parse_answer_document(answer.body)


def with_checkpoint(parsed: v2.ParsedAnswer, note: str) -> v2.ParsedAnswer:
    """``parsed`` with its statement's inclusion checkpoint replaced."""
    (statement,) = parsed.statements
    assert statement.inclusion is not None
    inclusion = replace(statement.inclusion, checkpoint=note)
    return replace(parsed, statements=(replace(statement, inclusion=inclusion),))


async def test_only_the_verified_checkpoint_is_kept(tmp_path: Path) -> None:
    """A notary adds to its checkpoint a signature line by a key nobody
    knows, of 4-byte characters (ignored, as signed notes require): what
    the client keeps is the checkpoint and the notary's own signature, and
    every later check reads it back."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from notary.client.logcheck import check_log

    book = CheckpointBook(tmp_path / "checkpoints")
    key_path = tmp_path / "v2.key"
    async with open_tls_target(names=[SITE]) as site, open_v2_notary(
        tmp_path, {SITE: [site.host]}, log=LOG
    ) as notary:
        bundle = bundle_of(notary, key_path)
        raw = crypto.ed25519_public_raw(crypto.load_ed25519_private_key(key_path))
        await sequenced(notary, SITE, site.port)
        parsed = await logged_answer(notary, SITE, site.port)
        (statement,) = parsed.statements
        assert statement.inclusion is not None
        note = statement.inclusion.checkpoint
        stranger = "\U0001f600" * 4100  # 4,100 characters, 16,400 bytes
        padded = note + f"\N{EM DASH} {stranger} {base64.b64encode(bytes(70)).decode()}\n"
        keys = {statement.key_id: Ed25519PublicKey.from_public_bytes(raw)}
        words = await check_log(
            bundle, None, static_resolver({}), with_checkpoint(parsed, padded), keys, book
        )
        assert words is not None and words.startswith("logged at")
        (stored,) = (tmp_path / "checkpoints").glob("*.checkpoint")
        assert stored.read_text() == note and stranger not in stored.read_text()
        kept = book.last(ORIGIN, raw)
        assert kept is not None and kept.note == note
        answer = await ask(site, bundle, book)
    assert answer.verdict is Verdict.SUCCESS, answer.detail
    assert "consistent with size" in answer.detail


async def test_an_unreadable_memory_is_that_notarys_row_with_a_clear_reason(
    tmp_path: Path,
) -> None:
    book = CheckpointBook(tmp_path / "checkpoints")
    key_path = tmp_path / "v2.key"
    async with open_tls_target(names=[SITE]) as site, open_v2_notary(
        tmp_path, {SITE: [site.host]}, log=LOG
    ) as notary:
        bundle = bundle_of(notary, key_path)
        await sequenced(notary, SITE, site.port)
        assert (await ask(site, bundle, book)).verdict is Verdict.SUCCESS
        (stored,) = (tmp_path / "checkpoints").glob("*.checkpoint")
        stored.write_bytes(b"\xf0\x9f\x98\x80" * 5000)  # 20 kB
        too_large = await ask(site, bundle, book)
        stored.write_bytes(b"\xff not a checkpoint\n")
        damaged = await ask(site, bundle, book)
        stored.unlink()
        stored.mkdir()
        unreadable = await ask(site, bundle, book)
    for answer in (too_large, damaged, unreadable):
        assert answer.verdict is Verdict.CONNECTIVITY_FAILURE
        assert answer.detail.startswith("log: the checkpoint this client kept of its log is "
                                        "unreadable ("), answer.detail
        assert "unexpected" not in answer.detail and "remove" in answer.detail
    assert "larger than 8192 bytes" in too_large.detail


def test_an_inclusion_checkpoint_is_bounded_in_bytes() -> None:
    """The parser's bound is in bytes, as the memory's is: 2,100 characters
    of 4 bytes are refused."""
    from notary.protocol.v2 import parsing

    note = "o\n1\n" + base64.b64encode(bytes(32)).decode() + "\n\n\N{EM DASH} " + (
        "\U0001f600" * 2100) + " AAAAAAAA\n"
    assert len(note) < v2.MAX_CHECKPOINT_BYTES < len(note.encode())
    try:
        parsing._parse_inclusion("answer", {"checkpoint": note, "index": 0, "proof": []})
    except client.PeerError as exc:
        assert "longer than 8192 bytes" in str(exc)
    else:
        raise AssertionError("a checkpoint of more than 8192 bytes was accepted")


# -- the bundle pins the log (issue 30, item 11) ------------------------------------------


def pinning(bundle: Bundle, origin: str, public_raw: bytes, *, v2_key: bool = True) -> Bundle:
    """``bundle`` with a log member for ``origin`` signed by ``public_raw``
    (and its hosts' v2 keys dropped unless ``v2_key``)."""
    from notary.protocol.bundle import BundleLog

    hosts = bundle.hosts if v2_key else tuple(replace(h, v2_key=None) for h in bundle.hosts)
    return make_bundle(
        name=bundle.name, location=bundle.bundle_location, hosts=list(hosts),
        log=BundleLog.of(origin, public_raw),
    )


async def test_check_holds_the_notary_to_the_log_its_bundle_pins(tmp_path: Path) -> None:
    """A statement promising another log than the bundle pins (the same key
    signing both), a checkpoint signed by another key than the bundle's
    log key, a statement promising no log at all: each is that notary's
    failure. A bundle without the member keeps to the statement's own
    promise, and the row says so."""
    key_path = tmp_path / "v2.key"
    async with open_tls_target(names=[SITE]) as site, open_v2_notary(
        tmp_path, {SITE: [site.host]}, log=LOG
    ) as notary:
        bundle = bundle_of(notary, key_path)
        raw = crypto.ed25519_public_raw(crypto.load_ed25519_private_key(key_path))
        await sequenced(notary, SITE, site.port)
        unpinned = await ask(site, bundle, CheckpointBook(tmp_path / "a"))
        pinned = await ask(site, pinning(bundle, ORIGIN, raw), CheckpointBook(tmp_path / "b"))
        elsewhere = await ask(
            site, pinning(bundle, "elsewhere.test/v2/log", raw), CheckpointBook(tmp_path / "c")
        )
        stranger = crypto.ed25519_public_raw(crypto.generate_ed25519_key())
        other_key = await ask(
            site, pinning(bundle, ORIGIN, stranger, v2_key=False), CheckpointBook(tmp_path / "d")
        )
    (tmp_path / "nolog").mkdir()
    async with open_tls_target(names=[SITE]) as site, open_v2_notary(
        tmp_path / "nolog", {SITE: [site.host]}
    ) as notary:
        bundle = bundle_of(notary, tmp_path / "nolog" / "v2.key")
        raw = crypto.ed25519_public_raw(
            crypto.load_ed25519_private_key(tmp_path / "nolog" / "v2.key"))
        unlogged = await ask(site, pinning(bundle, ORIGIN, raw), CheckpointBook(tmp_path / "e"))
    assert unpinned.verdict is Verdict.SUCCESS
    assert "logged at" in unpinned.detail and "(its bundle pins no log)" in unpinned.detail
    assert pinned.verdict is Verdict.SUCCESS, pinned.detail
    assert "logged at" in pinned.detail and "pins no log" not in pinned.detail
    assert elsewhere.verdict is Verdict.FAILURE
    assert elsewhere.detail == (
        f"log: the statement promises log '{ORIGIN}'; its bundle pins 'elsewhere.test/v2/log'"
    )
    assert other_key.verdict is Verdict.FAILURE
    assert "not signed by a known key with the key its bundle pins" in other_key.detail
    assert unlogged.verdict is Verdict.FAILURE
    assert unlogged.detail == f"log: the statement promises no log; its bundle pins '{ORIGIN}'"
