"""The Perspectives protocol in tests: a notary serving it on a plain-HTTP
port of its own (``open_perspectives_notary``), and a verifier of its signed
replies written from PROTOCOLS.md 2.3 with xml.etree, struct and
cryptography, not the notary's parser (``independent_verify``, ``md5_fp``)."""

from __future__ import annotations

import base64
import hashlib
import struct
import xml.etree.ElementTree as ElementTree
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding

from notary.config import Endpoint
from notary.state import crypto
from tests.support.notaries import NotaryUnderTest, open_notary


@asynccontextmanager
async def open_perspectives_notary(
    tmp_path: Path, names: dict[str, list[str]]
) -> AsyncIterator[tuple[NotaryUnderTest, object]]:
    key_path = tmp_path / "perspectives.key"
    key = crypto.generate_perspectives_key()
    crypto.write_new_file(key_path, crypto.private_key_pem(key), mode=0o600)
    section = {"key_file": key_path, "listen": (Endpoint("127.0.0.1", 0),)}
    async with open_notary(tmp_path / "n", names=names, perspectives=section) as notary:
        yield notary, key.public_key()


def independent_verify(xml: bytes, service: str, public_key) -> list[tuple[str, list[tuple[int, int]]]]:
    """PROTOCOLS.md 2.3 from scratch: returns the keys (fp, timespans) if the
    signature verifies, raises otherwise."""
    root = ElementTree.fromstring(xml)
    assert root.tag == "notary_reply"
    assert (root.get("version"), root.get("sig_type")) == ("1", "rsa-md5")
    keys = []
    for key in root.findall("key"):
        assert key.get("type") == "ssl"
        spans = [(int(t.get("start")), int(t.get("end"))) for t in key.findall("timestamp")]
        keys.append((key.get("fp"), spans))
    blob = service.encode() + b"\0"
    for fp, spans in reversed(keys):
        blob += struct.pack(">HHB", len(spans), 16, 3) + bytes.fromhex(fp.replace(":", ""))
        for start, end in spans:
            blob += struct.pack(">II", start, end)
    public_key.verify(base64.b64decode(root.get("sig")), blob, padding.PKCS1v15(), hashes.MD5())
    return keys


def md5_fp(der: bytes) -> str:
    return ":".join(f"{b:02x}" for b in hashlib.md5(der).digest())
