"""The notary as a witness (C2SP tlog-witness): ``POST
/v2/witness/add-checkpoint`` on a real notary on loopback, fed checkpoints
of a log made here (its own key, RFC 9162 trees from notary.protocol.tlog),
checked with the spec's statuses, and across a restart."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from notary.config import load_config
from notary.errors import ConfigError
from notary.protocol import tlog
from tests.support.notaries import NotaryUnderTest, RawResponse, open_v2_notary, send_raw
from tests.support.postgres import PostgresServer

ORIGIN = "log.test/witnessed"
WITNESS_NAME = "witness.test/w1"
LOG_KEY = Ed25519PrivateKey.generate()
LOG_PUBLIC = LOG_KEY.public_key().public_bytes_raw()
LOG_VKEY = tlog.verifier_key(ORIGIN, LOG_PUBLIC)
WITNESS = {"enabled": True, "name": WITNESS_NAME, "logs": (LOG_VKEY,)}
LEAVES = [tlog.leaf_hash(b"entry %d" % i) for i in range(40)]
FORKED = [*LEAVES[:5], tlog.leaf_hash(b"another entry"), *LEAVES[6:]]


def mth(leaves: list[bytes], start: int, end: int) -> bytes:
    if end - start == 1:
        return leaves[start]
    k = 1
    while k * 2 < end - start:
        k *= 2
    return tlog.node_hash(mth(leaves, start, start + k), mth(leaves, start + k, end))


def perfect(leaves: list[bytes]) -> tlog.PerfectHash:
    return lambda level, index: mth(leaves, index << level, (index + 1) << level)


def note(size: int, leaves: list[bytes] = LEAVES, origin: str = ORIGIN,
         key: Ed25519PrivateKey = LOG_KEY) -> str:
    root = tlog.root_hash(size, perfect(leaves))
    text = tlog.format_checkpoint(tlog.Checkpoint(origin, size, root))
    return tlog.sign_note(text, origin, key.sign, key.public_key().public_bytes_raw())


def body(old: int, size: int, leaves: list[bytes] = LEAVES, **kwargs: object) -> bytes:
    proof = tlog.consistency_proof(old, size, perfect(leaves))
    return tlog.format_add_checkpoint(old, proof, note(size, leaves, **kwargs))  # type: ignore[arg-type]


async def add(notary: NotaryUnderTest, payload: bytes, method: str = "POST") -> RawResponse:
    return await send_raw(notary.port, (
        f"{method} /v2/witness/add-checkpoint HTTP/1.0\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload)


def witness_vkey(notary: NotaryUnderTest) -> str:
    signer = notary.running.signers["v2"]
    return tlog.cosigner_key(WITNESS_NAME, signer.public_raw)  # type: ignore[attr-defined]


def assert_cosigned(notary: NotaryUnderTest, answer: RawResponse, size: int,
                    leaves: list[bytes] = LEAVES) -> None:
    assert answer.status == 200, answer.body
    cosigned = note(size, leaves) + answer.body.decode()
    text, names = tlog.open_note(cosigned, tlog.cosignature_verifiers([witness_vkey(notary)]))
    assert names == [WITNESS_NAME] and tlog.parse_checkpoint(text).size == size
    line = tlog.parse_cosignature_line(answer.body.decode())
    assert abs(line.timestamp - notary.clock()) < 60


async def test_a_witness_cosigns_a_consistent_sequence_and_refuses_the_rest(
    tmp_path: Path,
) -> None:
    async with open_v2_notary(tmp_path, {}, witness=WITNESS) as notary:
        # A first request with old 0 (nothing held): cosigned.
        assert_cosigned(notary, await add(notary, body(0, 3)), 3)
        for old, size in ((3, 7), (7, 7), (7, 16), (16, 33)):
            assert_cosigned(notary, await add(notary, body(old, size)), size)
        # A stale old size: 409 with the size held, as text/x.tlog.size.
        stale = await add(notary, body(16, 35))
        assert (stale.status, stale.body) == (409, b"33\n")
        assert stale.headers[b"content-type"] == b"text/x.tlog.size"
        assert (await add(notary, body(0, 35))).body == b"33\n"
        # A fork: the same size with another root, signed by the log's key.
        fork = await add(notary, tlog.format_add_checkpoint(33, [], note(33, FORKED)))
        assert fork.status == 422
        # A larger tree that does not extend the held one: its proof fails.
        forked = await add(notary, body(33, 36, FORKED))
        assert forked.status == 422
        bad_proof = tlog.format_add_checkpoint(33, [b"\0" * 32] * 3, note(36))
        assert (await add(notary, bad_proof)).status == 422
        # Unknown log: the spec's 404; a checkpoint the log's key did not sign: 403.
        assert (await add(notary, body(0, 3, origin="other.test/log"))).status == 404
        stranger = Ed25519PrivateKey.generate()
        assert (await add(notary, body(33, 36, key=stranger))).status == 403
        assert (await add(notary, b"old 33\n\nnot a note\n")).status == 400
        assert (await add(notary, tlog.format_add_checkpoint(34, [], note(33)))).status == 400
        assert (await add(notary, b"", method="GET")).status == 405
        assert (await add(notary, b"x" * (tlog.MAX_ADD_CHECKPOINT_BYTES + 1))).status == 413
        # Nothing refused moved the witness: the log goes on from 33.
        assert_cosigned(notary, await add(notary, body(33, 40)), 40)


async def test_a_restarted_witness_still_refuses_a_fork(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    async with open_v2_notary(tmp_path / "a", {}, witness=WITNESS) as notary:
        assert_cosigned(notary, await add(notary, body(0, 10)), 10)
        database = notary.config.server.db_file
    assert database is not None
    moved = tmp_path / "b" / database.relative_to(tmp_path / "a")
    moved.parent.mkdir(parents=True)
    shutil.copy(database, moved)
    async with open_v2_notary(tmp_path / "b", {}, witness=WITNESS) as notary:
        assert (await add(notary, body(0, 12, FORKED))).body == b"10\n"
        assert (await add(notary, body(10, 12, FORKED))).status == 422
        assert (await add(notary, tlog.format_add_checkpoint(10, [], note(10, FORKED)))).status == 422
        assert_cosigned(notary, await add(notary, body(10, 12)), 12)


async def test_a_witness_on_postgresql_answers_503_while_the_database_is_away(
    tmp_path: Path, postgres_server: PostgresServer,
) -> None:
    """The fleet's witness (its store on PostgreSQL, run in a worker thread):
    while the server is stopped a request is a 503, answered within the
    connect timeout; once it is back the witness goes on from what it held,
    and a restart of the server is not seen at all."""
    from notary.state.connection import CONNECT_TIMEOUT_S

    store = {"backend": "postgresql", "dsn": postgres_server.new_database()}
    async with open_v2_notary(tmp_path, {}, witness=WITNESS, store=store) as notary:
        assert_cosigned(notary, await add(notary, body(0, 3)), 3)
        await trio.to_thread.run_sync(postgres_server.stop)
        try:
            with trio.fail_after(CONNECT_TIMEOUT_S):
                for _ in range(2):
                    assert (await add(notary, body(3, 7))).status == 503
        finally:
            await trio.to_thread.run_sync(postgres_server.start)
        assert_cosigned(notary, await add(notary, body(3, 7)), 7)
        assert (await add(notary, body(3, 9))).body == b"7\n"
        await trio.to_thread.run_sync(postgres_server.restart)  # not even one 503
        assert_cosigned(notary, await add(notary, body(7, 9)), 9)


def test_witness_config_is_checked(tmp_path: Path) -> None:
    base = {"server": {"key_file": tmp_path / "k", "cert_file": tmp_path / "c",
                       "db_file": tmp_path / "d"}, "v2": {"key_file": tmp_path / "v"}}
    config = load_config(None, {**base, "witness": WITNESS})
    assert config.witness.logs == (LOG_VKEY,)
    for bad, message in (
        ({"name": "has space"}, "name"),
        ({"logs": ()}, "logs"),
        ({"logs": ("nope",)}, "logs"),
        ({"logs": (tlog.cosigner_key("w", LOG_PUBLIC),)}, "logs"),  # a witness key, not a log's
    ):
        with pytest.raises(ConfigError, match=message):
            load_config(None, {**base, "witness": {**WITNESS, **bad}})
    with pytest.raises(ConfigError, match="v2"):
        load_config(None, {"server": base["server"], "witness": WITNESS})
