"""A notary's transparency log read as a client reads it, for tests: the
``[log]`` section a v2 notary runs with (``LOG``, its origin ``ORIGIN``); a
checkpoint opened with C2SP signed-note and tlog-checkpoint written here from
the specifications, not the project's functions (``open_checkpoint``); and
what the notary serves over TLS (``query``, ``get``, ``logged_statement``),
each failing the test on a wrong answer or after its deadline."""

from __future__ import annotations

import base64
import hashlib

import trio
from cryptography.hazmat.primitives.asymmetric import ed25519

from notary.protocol import v2
from tests.support import http_client
from tests.support.notaries import NotaryUnderTest

ORIGIN = "notary.test/v2/log"
LOG = {"enabled": True, "origin": ORIGIN, "checkpoint_interval_s": 0.1, "max_merge_delay_s": 30}


def open_checkpoint(note: str, public_raw: bytes) -> tuple[str, int, bytes]:
    """C2SP signed-note and tlog-checkpoint: (origin, size, root) of a note
    signed by ``public_raw`` under the key name ORIGIN."""
    text, _, signatures = note.partition("\n\n")
    text += "\n"
    key_id = hashlib.sha256(ORIGIN.encode() + b"\n\x01" + public_raw).digest()[:4]
    verified = False
    for line in signatures.splitlines():
        dash, name, blob = line.split(" ")
        assert dash == "\u2014"
        raw = base64.b64decode(blob)
        if name == ORIGIN and raw[:4] == key_id:
            ed25519.Ed25519PublicKey.from_public_bytes(public_raw).verify(raw[4:], text.encode())
            verified = True
    assert verified
    origin, size, root = text.splitlines()[:3]
    return origin, int(size), base64.b64decode(root)


async def query(notary: NotaryUnderTest, *targets: tuple[str, int]) -> bytes:
    """The v2 answer for ``targets`` (each (host, port)), which must be a 200."""
    document = {"targets": [{"host": h, "port": p} for h, p in targets]}
    status, body = await http_client.post_json(notary.port, "/v2/query", document)
    assert status == 200, body
    return body


async def get(notary: NotaryUnderTest, path: str) -> tuple[int, bytes]:
    answer = await http_client.get(notary.port, path)
    return answer.status, answer.body


async def logged_statement(notary: NotaryUnderTest, *target: tuple[str, int]) -> v2.ParsedStatement:
    """The statement of ``target`` once the log has sequenced it."""
    with trio.fail_after(10):
        while True:
            (statement,) = v2.parse_answer_document(await query(notary, *target)).statements
            if statement.inclusion is not None:
                return statement
            await trio.sleep(0.05)
