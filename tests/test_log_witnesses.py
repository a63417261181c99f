"""The notary's log cosigned by witnesses (C2SP tlog-witness, the log's
side), end to end on loopback: notary A keeps a log, notary B witnesses it;
A's served checkpoint gains B's cosignature, verifiable with B's key; a
restarted A learns B's size from a 409; an unreachable witness never holds
appends back."""

from __future__ import annotations

import contextlib
import hashlib
import ssl
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trustme

from notary.config import load_config
from notary.errors import ConfigError
from notary.protocol import tlog, v2
from notary.state import crypto
from tests.support.log_notaries import get, logged_statement
from tests.support.notaries import NotaryUnderTest, open_v2_notary
from tests.support.tls_targets import RawTarget, closed_port, open_raw_target, open_tls_target
from tests.support.witnessed_log import (
    ORIGIN,
    OTHER,
    SITE,
    THIRD,
    WITNESS_NAME,
    open_log_notary,
)


def log_vkey(key_path: Path) -> str:
    public = crypto.ed25519_public_raw(crypto.load_ed25519_private_key(key_path))
    return tlog.verifier_key(ORIGIN, public)


def witness_entry(witness: NotaryUnderTest) -> dict[str, str]:
    public = witness.running.signers["v2"].public_raw  # type: ignore[attr-defined]
    return {
        "url": f"https://127.0.0.1:{witness.port}/v2/witness",
        "key": tlog.cosigner_key(WITNESS_NAME, public),
        "pin": witness.sha1_pin.hex(),
    }


async def cosigned_checkpoint(notary: NotaryUnderTest, vkey: str, size: int) -> str:
    """The served checkpoint once it covers ``size`` leaves and carries the
    cosignature of ``vkey``."""
    with trio.fail_after(15):
        while True:
            status, body = await get(notary, "/v2/log/checkpoint")
            note = body.decode()
            if status == 200 and note.count("\u2014") > 1:
                checkpoint = tlog.parse_checkpoint(note[: note.rfind("\n\n") + 1])
                if checkpoint.size >= size:
                    return note
            await trio.sleep(0.05)


async def test_a_log_witnessed_by_another_notary_serves_its_cosignature(tmp_path: Path) -> None:
    key_path = tmp_path / "a.v2.key"
    crypto.write_ed25519_private_key(key_path, crypto.generate_ed25519_key())
    witness_config = {"enabled": True, "name": WITNESS_NAME, "logs": (log_vkey(key_path),)}
    (tmp_path / "b").mkdir()
    db_file = tmp_path / "a.db"
    async with open_tls_target(names=[SITE, OTHER, THIRD]) as site, open_v2_notary(
        tmp_path / "b", {}, witness=witness_config
    ) as witness:
        entry = witness_entry(witness)
        async with open_log_notary(tmp_path / "a1", key_path, site.host, [entry], db_file) as a:
            await logged_statement(a, (SITE, site.port))
            note = await cosigned_checkpoint(a, entry["key"], 1)
            # B's cosignature verifies with B's key; A's signature with A's.
            text, names = tlog.open_note(note, tlog.cosignature_verifiers([entry["key"]]))
            assert names == [WITNESS_NAME]
            public = crypto.ed25519_public_raw(crypto.load_ed25519_private_key(key_path))
            assert v2.verify_checkpoint(note, ORIGIN, public).size >= 1
            first = tlog.parse_checkpoint(text).size
            # A later batch is cosigned again, from the size B holds.
            await logged_statement(a, (OTHER, site.port))
            await cosigned_checkpoint(a, entry["key"], first + 1)
        # A restarted A starts believing B holds nothing: B's 409 tells it
        # the size, and the next checkpoint is cosigned from there.
        async with open_log_notary(tmp_path / "a2", key_path, site.host, [entry], db_file) as a:
            _, body = await get(a, "/v2/log/checkpoint")
            size = tlog.parse_checkpoint(body.decode().split("\n\n")[0] + "\n").size
            await logged_statement(a, (THIRD, site.port))
            note = await cosigned_checkpoint(a, entry["key"], size + 1)
            tlog.open_note(note, tlog.cosignature_verifiers([entry["key"]]))


async def test_an_unreachable_witness_never_holds_appends_back(tmp_path: Path) -> None:
    key_path = tmp_path / "a.v2.key"
    crypto.write_ed25519_private_key(key_path, crypto.generate_ed25519_key())
    public = crypto.ed25519_public_raw(crypto.load_ed25519_private_key(key_path))
    entry = {"url": f"https://127.0.0.1:{closed_port()}/v2/witness",
             "key": tlog.cosigner_key(WITNESS_NAME, public), "pin": "00" * 20}
    async with open_tls_target(names=[SITE, OTHER, THIRD]) as site, open_log_notary(
        tmp_path / "a", key_path, site.host, [entry], tmp_path / "a.db"
    ) as a:
        await logged_statement(a, (SITE, site.port))
        status, body = await get(a, "/v2/log/checkpoint")
        assert status == 200 and body.decode().count("\u2014") == 1
        await trio.sleep(0.3)  # the witness task failed and backs off meanwhile
        await logged_statement(a, (OTHER, site.port))


@asynccontextmanager
async def open_fake_witness(answer: bytes) -> AsyncIterator[tuple[RawTarget, str]]:
    """A TLS server on loopback that reads a request's head and answers
    ``answer`` to each; yields it and its certificate's SHA-1 (the pin)."""
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    issued.configure_cert(context)
    der = ssl.PEM_cert_to_DER_cert(issued.cert_chain_pems[0].bytes().decode())

    async def handle(tcp: trio.SocketStream) -> None:
        tls = trio.SSLStream(tcp, context, server_side=True, https_compatible=True)
        data = b""
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            while b"\r\n\r\n" not in data:
                chunk = await tls.receive_some(4096)
                if not chunk:
                    return
                data += chunk
            await tls.send_all(answer)
            await tls.aclose()

    async with open_raw_target(handle) as server:
        yield server, hashlib.sha1(der).hexdigest()


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
    b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\n",
    b"HTTP/1.1 103 Early Hints\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nnope\n",
], ids=["101-upgrade", "101-bare", "100-only", "103-then-200"])
async def test_a_witness_answering_1xx_never_ends_the_notary(tmp_path: Path, answer: bytes) -> None:
    """A 101 from a witness raised httptools' HttpParserUpgrade out of the
    witnessing task and ended the notary, again after every restart (issue
    30, item 2): a third party's answer is that witness's failure only."""
    key_path = tmp_path / "a.v2.key"
    crypto.write_ed25519_private_key(key_path, crypto.generate_ed25519_key())
    public = crypto.ed25519_public_raw(crypto.load_ed25519_private_key(key_path))
    async with open_fake_witness(answer) as (witness, pin), open_tls_target(
        names=[SITE, OTHER]
    ) as site:
        entry = {"url": f"https://127.0.0.1:{witness.port}/v2/witness",
                 "key": tlog.cosigner_key(WITNESS_NAME, public), "pin": pin}
        async with open_log_notary(tmp_path / "a", key_path, site.host, [entry], tmp_path / "a.db") as a:
            await logged_statement(a, (SITE, site.port))
            with trio.fail_after(15):
                await witness.wait_accepted(2)  # asked, failed, asked again
            await logged_statement(a, (OTHER, site.port))
            status, body = await get(a, "/v2/log/checkpoint")
            assert status == 200 and body.decode().count("\u2014") == 1  # no cosignature


@asynccontextmanager
async def open_cosigning_witness(
    ahead_s: int,
) -> AsyncIterator[tuple[RawTarget, str, str]]:
    """A TLS server on loopback that cosigns every checkpoint submitted to
    it, without any check, dated ``ahead_s`` seconds after now; yields it,
    its pin and its witness vkey."""
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    issued.configure_cert(context)
    der = ssl.PEM_cert_to_DER_cert(issued.cert_chain_pems[0].bytes().decode())
    key = crypto.generate_ed25519_key()
    public = crypto.ed25519_public_raw(key)

    async def handle(tcp: trio.SocketStream) -> None:
        tls = trio.SSLStream(tcp, context, server_side=True, https_compatible=True)
        data = b""
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            while b"\r\n\r\n" not in data:
                data += await tls.receive_some(4096)
            head, _, body = data.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            while len(body) < length:
                body += await tls.receive_some(4096)
            note = tlog.parse_add_checkpoint(body).note
            line = tlog.cosign(
                note[: note.rfind("\n\n") + 1], WITNESS_NAME, key.sign, public,
                int(time.time()) + ahead_s,
            ).encode()
            await tls.send_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(line), line)
            )
            await tls.aclose()

    async with open_raw_target(handle) as server:
        yield server, hashlib.sha1(der).hexdigest(), tlog.cosigner_key(WITNESS_NAME, public)


@pytest.mark.parametrize("ahead_s", [0, 86_400])
async def test_a_cosignature_dated_in_the_future_is_refused(tmp_path: Path, ahead_s: int) -> None:
    """A cosignature dated a day ahead would make the checkpoint look freshly
    witnessed long after (issue 30, item 19); one dated now is kept."""
    key_path = tmp_path / "a.v2.key"
    crypto.write_ed25519_private_key(key_path, crypto.generate_ed25519_key())
    async with open_cosigning_witness(ahead_s) as (witness, pin, vkey), open_tls_target(
        names=[SITE]
    ) as site:
        entry = {"url": f"https://127.0.0.1:{witness.port}/v2/witness", "key": vkey, "pin": pin}
        async with open_log_notary(tmp_path / "a", key_path, site.host, [entry], tmp_path / "a.db") as a:
            await logged_statement(a, (SITE, site.port))
            if ahead_s == 0:
                note = await cosigned_checkpoint(a, vkey, 1)
                assert tlog.open_note(note, tlog.cosignature_verifiers([vkey]))[1] == [WITNESS_NAME]
                return
            with trio.fail_after(15):
                await witness.wait_accepted(2)  # cosigned, refused, asked again
            status, body = await get(a, "/v2/log/checkpoint")
            assert status == 200 and body.decode().count("\u2014") == 1


def test_the_log_witness_options_are_checked(tmp_path: Path) -> None:
    """``[log] min_cosignatures`` within the witnesses listed, each listed
    once, at most 31 of them (a note's 32 signature lines), and the bundle
    carries the promise."""
    base = {"server": {"key_file": tmp_path / "k", "cert_file": tmp_path / "c",
                       "db_file": tmp_path / "d"}, "v2": {"key_file": tmp_path / "v"}}

    def entry(i: int) -> dict[str, str]:
        public = bytes([i + 1]) * 32
        return {"url": "https://127.0.0.1:1/v2/witness",
                "key": tlog.cosigner_key(f"w{i}.test/witness", public), "pin": "00" * 20}

    def log(**options: object) -> dict[str, object]:
        return {**base, "log": {"enabled": True, "origin": ORIGIN, **options}}

    two = (entry(0), entry(1))
    config = load_config(None, log(witnesses=two, min_cosignatures=2))
    member = config.log.bundle_log(b"\x07" * 32)
    assert member is not None and member.min_witnesses == 2
    assert member.witnesses == tuple(w["key"] for w in two)
    for options, message in (
        ({"witnesses": two, "min_cosignatures": 3}, "min_cosignatures must be 0 to"),
        ({"witnesses": (), "min_cosignatures": 1}, "min_cosignatures must be 0 to"),
        ({"witnesses": two, "min_cosignatures": -1}, "min_cosignatures"),
        ({"witnesses": (entry(0), entry(0))}, "twice"),
        ({"witnesses": tuple(entry(i) for i in range(32))}, "at most 31"),
        ({"witnesses": two, "witness_wait_s": 0}, "witness_wait_s"),
    ):
        with pytest.raises(ConfigError, match=message):
            load_config(None, log(**options))
