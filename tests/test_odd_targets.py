"""Sites the notary must observe although they are odd, end to end through a
running notary on loopback (issue 17, items 9 and 13):

- a certificate whose public key ``cryptography`` cannot load (an SM2 curve,
  an unknown algorithm), served by the hand-written TLS 1.2 server of
  ``tests.support.tls_targets`` (OpenSSL cannot serve a key it cannot load):
  answered in Convergence and Perspectives, shown on the web page with the
  key type "unknown", no error logged;
- a site that speaks only TLS 1.0 or 1.1: answered (it was a 503), while the
  notary's own API listener still refuses a TLS 1.0 client.
"""

from __future__ import annotations

import hashlib
import json
import logging
import ssl
from pathlib import Path

import pytest
import trio

from notary.protocol.convergence import format_fingerprint
from tests.support.http_client import http_get
from tests.support.legacy_tls import local_openssl_speaks_tls10, tls10_index
from tests.support.notaries import legacy_query, send_raw
from tests.support.odd_certificates import ODD_KEYS, odd_certificate
from tests.support.perspectives import independent_verify, md5_fp, open_perspectives_notary
from tests.support.tls_targets import open_certificate_only_target, open_tls_target


def fingerprints(body: bytes) -> list[str]:
    return [row["fingerprint"] for row in json.loads(body)["fingerprintList"]]


@pytest.mark.parametrize("kind", ODD_KEYS)
async def test_a_key_cryptography_cannot_load_is_answered_and_shown_as_unknown(
    tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    odd = odd_certificate(kind)
    async with (
        open_certificate_only_target([odd.der]) as site,
        open_perspectives_notary(tmp_path, {}) as (notary, public),
    ):
        target = f"127.0.0.1+{site.port}"
        response = await legacy_query(notary.port, target, None)
        assert response.status == 200, response.body
        assert fingerprints(response.body) == [format_fingerprint(hashlib.sha1(odd.der).digest())]
        service = f"127.0.0.1:{site.port},2"
        status, _, xml = await http_get(
            notary.running.perspectives[0].port, f"/?host=127.0.0.1&port={site.port}&service_type=2"
        )
        assert status == 200
        assert [fp for fp, _ in independent_verify(xml, service, public)] == [md5_fp(odd.der)]
        page = await send_raw(notary.port, f"GET /site/{target} HTTP/1.0\r\n\r\n".encode())
        assert page.status == 200
        html = page.body.decode()
        assert "<dt>Key</dt><dd>unknown</dd>" in html
        assert hashlib.sha256(odd.der).hexdigest()[:16] in html
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


@pytest.mark.parametrize(
    "version", [ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1], ids=["tls1.0", "tls1.1"]
)
async def test_a_site_speaking_only_an_old_tls_is_answered(
    tmp_path: Path, version: ssl.TLSVersion
) -> None:
    if not local_openssl_speaks_tls10(tmp_path):
        pytest.skip("this OpenSSL cannot complete a TLS 1.0 handshake even at security level 0")
    async with (
        open_tls_target(minimum_version=version, maximum_version=version) as site,
        open_perspectives_notary(tmp_path, {}) as (notary, _public),
    ):
        response = await legacy_query(notary.port, f"127.0.0.1+{site.port}", None)
        assert response.status == 200, response.body
        leaf = site.leaf_der(None)
        assert fingerprints(response.body) == [format_fingerprint(hashlib.sha1(leaf).digest())]
        # The probe's TLS 1.0 stays the probe's: the API still refuses it.
        with pytest.raises(trio.BrokenResourceError):
            await tls10_index(notary.port)
