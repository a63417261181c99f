"""The v2 API served end to end for issue 31's protocol side: statements
carry the signed consistency (docs/v2.md, S8), an entry's ``address`` and
``spki_sha256`` are accepted (R4), a key alone matches (V6). Loopback only;
a site at one address (several addresses are the prober's part)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from notary.model.consistency import ConsistencyKind
from notary.model.observations import subject_public_key_info
from notary.protocol import v2
from tests.support.http_client import post_json
from tests.support.notaries import open_v2_notary
from tests.support.tls_targets import open_tls_target
from tests.support.v2_queries import public_keys

SITE = "www.example.test"


async def ask(notary, entries: list[dict], nonce: str = "n") -> list[v2.VerifiedResult]:
    request = {"targets": entries, "nonce": nonce}
    status, body = await post_json(notary.port, "/v2/query", request)
    assert status == 200, body[:200]
    queries = v2.parse_query_request(
        json.dumps(request).encode(), max_batch=100, max_body_bytes=1 << 20
    ).targets
    return v2.verify_answer(
        v2.parse_answer_document(body), await public_keys(notary), nonce=nonce,
        now=int(notary.clock()), queries=queries,
    )


async def test_statements_carry_the_consistency_and_addresses_are_accepted(
    tmp_path: Path,
) -> None:
    async with open_tls_target(names=[SITE]) as site:
        async with open_v2_notary(tmp_path, {SITE: [site.host]}) as notary:
            der = site.leaf_der(SITE)
            (result,) = await ask(notary, [{
                "host": SITE, "port": site.port, "sha256": hashlib.sha256(der).hexdigest(),
                "address": site.host,
            }])
            status, body = await post_json(notary.port, "/v2/query", {"targets": [
                {"host": SITE, "port": site.port, "address": "not an address"},
            ]})
    assert result.verdict == v2.VERDICT_MATCH and result.matched_by is None
    assert result.consistency is not None
    assert result.consistency.kind is ConsistencyKind.STABLE
    assert result.consistency.addresses == (site.host,)
    assert result.consistency.current == (hashlib.sha256(der).digest(),)
    assert status == 400
    assert b"targets[0].address: must be an IPv4 or IPv6 address" in body
    assert b"not an address" not in body  # never echoed


async def test_a_key_alone_matches_and_says_so(tmp_path: Path) -> None:
    async with open_tls_target(names=[SITE]) as site:
        async with open_v2_notary(tmp_path, {SITE: [site.host]}) as notary:
            der = site.leaf_der(SITE)
            spki = hashlib.sha256(subject_public_key_info(der)).hexdigest()
            match, mismatch = await ask(notary, [
                {"host": SITE, "port": site.port, "spki_sha256": spki},
                {"host": SITE, "port": site.port, "spki_sha256": "01" * 32},
            ])
    assert (match.verdict, match.matched_by) == (v2.VERDICT_MATCH, v2.MATCHED_BY_SPKI)
    assert (mismatch.verdict, mismatch.matched_by) == (v2.VERDICT_MISMATCH, None)
