"""A witness's view, for monitors: ``GET /v2/witness/view/<sha256 of the
origin>`` (notary/server/witness.py) on a real notary on loopback: the
checkpoint held with the log's signature lines only and a fresh
cosignature that verifies with the witness's key; 404, 400, 405; a query
token per request (429); and, on the ``Witness`` itself with a counting
store and Trio's mock clock standing still, one store read and one
signature per log per ``VIEW_CACHE_S``."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from notary.errors import ProtocolError
from notary.protocol import tlog, v2
from notary.server import witness as witness_module
from notary.server.witness import VIEW_CACHE_S, Witness
from notary.state.crypto import Ed25519Signer
from tests.support.made_log import MadeLog
from tests.support.notaries import NotaryUnderTest, RawResponse, open_v2_notary, send_raw

WITNESS_NAME = "witness.test/view"
LOG, QUIET = MadeLog("log.test/viewed"), MadeLog("quiet.test/log")
WITNESS = {"enabled": True, "name": WITNESS_NAME, "logs": (LOG.vkey, QUIET.vkey)}


def view_path(origin: str) -> str:
    return "/v2/witness/view/" + hashlib.sha256(origin.encode()).hexdigest()


async def add(notary: NotaryUnderTest, payload: bytes) -> RawResponse:
    return await send_raw(notary.port, (
        f"POST /v2/witness/add-checkpoint HTTP/1.0\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload)


async def get(notary: NotaryUnderTest, path: str, method: str = "GET") -> RawResponse:
    return await send_raw(notary.port, f"{method} {path} HTTP/1.0\r\n\r\n".encode())


def witness_vkey(notary: NotaryUnderTest) -> str:
    signer = notary.running.signers["v2"]
    return tlog.cosigner_key(WITNESS_NAME, signer.public_raw)  # type: ignore[attr-defined]


async def test_the_view_is_the_checkpoint_held_cosigned_now(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_v2_notary(tmp_path, {}, witness=WITNESS) as notary:
        # Submitted with another signer's line too (a stranger, a witness
        # before this one): the view keeps only the log's.
        stranger = Ed25519PrivateKey.generate()
        signed = LOG.note(5)
        text = signed[: signed.rfind("\n\n") + 1]
        foreign = tlog.sign_note(
            text, "stranger.test", stranger.sign, stranger.public_key().public_bytes_raw()
        )
        note = signed + foreign[foreign.rfind("\n\n") + 2:]
        assert (await add(notary, LOG.add_checkpoint(0, 5, note))).status == 200
        answer = await get(notary, view_path(LOG.origin))
        assert answer.status == 200, answer.body
        assert answer.headers[b"content-type"] == b"text/plain; charset=utf-8"
        served = answer.body.decode()
        assert served.startswith(signed) and "stranger.test" not in served
        lines = served[len(signed):].splitlines()
        assert len(lines) == 1
        # The log's signature and the witness's cosignature verify.
        opened, names = tlog.open_note(served, tlog.ed25519_verifiers([LOG.vkey]))
        assert names == [LOG.origin] and tlog.parse_checkpoint(opened).size == 5
        _, names = tlog.open_note(served, tlog.cosignature_verifiers([witness_vkey(notary)]))
        assert names == [WITNESS_NAME]
        assert abs(tlog.parse_cosignature_line(lines[0]).timestamp - notary.clock()) < 60
        # What a client asking its notaries for their views accepts
        # (notary.client.witnesses).
        assert v2.verify_checkpoint(served, LOG.origin, LOG.public).size == 5
        policy = tlog.WitnessPolicy((witness_vkey(notary),), 1)
        assert policy.judge(served, now=int(notary.clock())).cosigned == (WITNESS_NAME,)
        # A newer checkpoint is the view once the cached one is stale
        # (here at once: no time to wait for).
        monkeypatch.setattr(witness_module, "VIEW_CACHE_S", 0.0)
        assert (await add(notary, LOG.add_checkpoint(5, 9))).status == 200
        newer = (await get(notary, view_path(LOG.origin))).body.decode()
        assert newer.startswith(LOG.note(9)) and len(newer.splitlines()) == 6
        # A log not witnessed, one with nothing held: 404.
        assert (await get(notary, view_path("other.test/log"))).status == 404
        assert (await get(notary, view_path(QUIET.origin))).status == 404
        # Malformed hashes: 400; another method: 405, allowing GET.
        good = view_path(LOG.origin)
        for bad in (good.upper().replace("/V2/WITNESS/VIEW/", "/v2/witness/view/"),
                    good[:-1], good + "0", good[:-1] + "g", "/v2/witness/view/",
                    good + "/checkpoint"):
            assert (await get(notary, bad)).status == 400, bad
        refused = await get(notary, good, method="POST")
        assert refused.status == 405 and refused.headers[b"allow"] == b"GET"


async def test_each_view_costs_a_query_token(tmp_path: Path) -> None:
    limits = {"exempt_clients": (), "queries_per_s_per_prefix": 0.01, "query_burst": 3}
    async with open_v2_notary(
        tmp_path, {}, witness=WITNESS, limits=limits, v2={"max_batch": 3}
    ) as notary:
        # Refusals cost their token too (nothing is read for them).
        assert (await get(notary, view_path(LOG.origin))).status == 404
        assert (await get(notary, "/v2/witness/view/nothex")).status == 400
        assert (await get(notary, view_path(QUIET.origin), method="PUT")).status == 405
        answer = await get(notary, view_path(LOG.origin))
        assert answer.status == 429 and 90 <= int(answer.headers[b"retry-after"]) <= 100


class CountingStore:
    """A witness store holding ``note`` for ``LOG``, counting reads."""

    def __init__(self, note: str, size: int) -> None:
        self.held_checkpoint = tlog.HeldCheckpoint(size, b"\0" * 32, note)
        self.reads = 0

    def held(self, origin: str) -> tlog.HeldCheckpoint | None:
        self.reads += 1
        return self.held_checkpoint if origin == LOG.origin else None

    def swap(self, *args: Any) -> bool:
        raise AssertionError("views never write")

    def close(self) -> None:
        pass


async def test_a_view_is_made_once_per_log_per_second(mock_clock: trio.testing.MockClock) -> None:
    store = CountingStore(LOG.note(7), 7)
    signer = Ed25519Signer(Ed25519PrivateKey.generate())
    witness = Witness(
        ":memory:", name=WITNESS_NAME, logs=(LOG.vkey, QUIET.vkey), signer=signer,
        clock=lambda: 1_700_000_000.0, open_store=lambda path: store,
    )
    path = view_path(LOG.origin).encode()
    async with trio.open_nursery() as nursery:
        await nursery.start(witness.run)
        first = await witness.answer(b"GET", path, b"")
        made = signer.signatures_made
        # Many at once, within the second: the same bytes, no read, no signature.
        answers = []

        async def ask() -> None:
            answers.append(await witness.answer(b"GET", path, b""))

        async with trio.open_nursery() as asking:
            for _ in range(20):
                asking.start_soon(ask)
        assert {a.body for a in answers} == {first.body}
        assert (store.reads, signer.signatures_made) == (1, made)
        # A second later: made again (one read, one signature), once for
        # all the requests waiting for it.
        mock_clock.jump(VIEW_CACHE_S)
        answers.clear()
        async with trio.open_nursery() as asking:
            for _ in range(20):
                asking.start_soon(ask)
        assert len(answers) == 20 and (store.reads, signer.signatures_made) == (2, made + 1)
        # Nothing held is cached as well (a flood for a quiet log: one read).
        quiet = view_path(QUIET.origin).encode()
        for _ in range(3):
            with pytest.raises(ProtocolError) as refused:
                await witness.answer(b"GET", quiet, b"")
            assert refused.value.status == 404
        assert store.reads == 3
        # A reload drops the views cached (the logs may have changed).
        assert await trio.to_thread.run_sync(witness.reload)
        await witness.answer(b"GET", path, b"")
        assert store.reads == 4 and witness.views == 42 and witness.views_made == 4
        nursery.cancel_scope.cancel()
