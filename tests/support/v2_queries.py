"""Asking a notary's v2 API on loopback, for tests: its keys as a client
trusts them (``public_keys``) and one target's verdict with its statement
(``ask_v2``). Both go over TLS (``tests.support.http_client``) and fail the
test unless the notary answers 200."""

from __future__ import annotations

import hashlib
import json

from notary.protocol import v2
from tests.support.http_client import post_json
from tests.support.notaries import NotaryUnderTest, send_raw
from tests.support.tls_targets import TLSTarget


async def public_keys(notary: NotaryUnderTest) -> dict:
    answer = await send_raw(notary.port, b"GET /v2/key HTTP/1.0\r\n\r\n")
    assert answer.status == 200 and answer.headers[b"content-type"] == b"application/json"
    return v2.trusted_keys(v2.parse_key_document(answer.body), now=int(notary.clock()))


async def ask_v2(notary: NotaryUnderTest, site: TLSTarget, name: str, der: bytes) -> dict:
    """The v2 result for ``name`` and its statement, as JSON."""
    document = {"targets": [{
        "host": name, "port": site.port, "sha256": hashlib.sha256(der).hexdigest(),
    }]}
    status, body = await post_json(notary.port, "/v2/query", document)
    assert status == 200, body
    parsed = json.loads(body)
    result = parsed["answer"]["results"][0]
    statements = {entry["signature"]: entry["statement"] for entry in parsed["statements"]}
    return {"verdict": result["verdict"],
            "statement": statements.get(result.get("statement_signature"))}
