"""An external TLS scanner against the notary's HTTPS listener: testssl.sh
(Debian's ``testssl.sh``, installed by ``.ci/install-tools tests``; skipped
with a reason without it).

Checked, as testssl.sh judges them: no protocol below TLS 1.2 (SSLv2, SSLv3,
TLS 1.0, 1.1 not offered; TLS 1.2 offered), and no weak cipher category
(NULL, anonymous, export, LOW: DES/RC2/RC4, 3DES/IDEA) with the default
configuration; no finding of the scan rated above INFO.

Why testssl.sh and not sslyze: sslyze (PyPI) pins ``cryptography<47``, which
would downgrade the project's own cryptography in the test environment.

Slow: the scan takes 10-20 s (``-p -s`` only: protocols and cipher
categories); it runs under a 90 s bound. ``--nodns none``: no name is looked
up, the scanner talks to 127.0.0.1 only.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import trio

from tests.support.notaries import open_notary

TESTSSL = shutil.which("testssl") or shutil.which("testssl.sh")
SCAN_TIMEOUT_S = 90

pytestmark = pytest.mark.skipif(
    TESTSSL is None, reason="testssl.sh not installed (.ci/install-tools tests)"
)


async def test_the_https_listener_offers_no_old_protocol_and_no_weak_cipher(
    tmp_path: Path,
) -> None:
    assert TESTSSL is not None
    report = tmp_path / "testssl.json"
    async with open_notary(tmp_path / "notary", rescan={"enabled": False}) as notary:
        with trio.fail_after(SCAN_TIMEOUT_S):
            done = await trio.run_process(
                [
                    TESTSSL, "--quiet", "--color", "0", "--nodns", "none", "--warnings", "off",
                    "--openssl-timeout", "5", "--protocols", "--standard",
                    "--jsonfile", str(report), f"127.0.0.1:{notary.port}",
                ],
                cwd=tmp_path, capture_stdout=True, capture_stderr=True, check=False,
            )
    assert report.exists(), done.stdout.decode(errors="replace")[-2000:]
    findings = {item["id"]: item for item in json.loads(report.read_text())}

    def offered(finding_id: str) -> bool:
        finding = findings[finding_id]["finding"]
        return finding.startswith("offered")

    for old in ("SSLv2", "SSLv3", "TLS1", "TLS1_1"):
        assert not offered(old), findings[old]
    assert offered("TLS1_2"), findings["TLS1_2"]
    for weak in ("cipherlist_NULL", "cipherlist_aNULL", "cipherlist_EXPORT",
                 "cipherlist_LOW", "cipherlist_3DES_IDEA"):
        assert not offered(weak), findings[weak]
    assert offered("cipherlist_STRONG"), findings["cipherlist_STRONG"]
    judged = [
        item for key, item in findings.items()
        if key.startswith(("SSLv", "TLS1", "cipherlist_"))
    ]
    assert judged and all(item["severity"] in ("OK", "INFO") for item in judged), judged
