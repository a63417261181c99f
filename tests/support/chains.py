"""Certificate chains as a TLS server sends them, and the TLSA records that
vouch for them, for the DANE tests, computed independently of the notary's
code: a PEM certificate in DER (``der_of``), a trustme leaf's chain in DER,
leaf first, without the root (``chain_of``), a certificate's
SubjectPublicKeyInfo in DER as ``cryptography`` encodes it (``spki``), a
TLSA record of any usage, selector and matching type for a certificate
(``record``) and a DANE-EE record's presentation (``ee_record``: 3 1 1).
``HOST`` is the name the DANE unit tests issue their certificates for."""

from __future__ import annotations

import hashlib
import ssl

import trustme
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from notary.model.dane import Tlsa

HOST = "www.example.test"


def der_of(pem: bytes) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pem.decode("ascii"))


def chain_of(leaf: trustme.LeafCert) -> list[bytes]:
    """What the server sends: the leaf, then the intermediates (no root)."""
    return [der_of(blob.bytes()) for blob in leaf.cert_chain_pems]


def spki(der: bytes) -> bytes:
    return x509.load_der_x509_certificate(der).public_key().public_bytes(
        Encoding.DER, PublicFormat.SubjectPublicKeyInfo
    )


def record(usage: int, selector: int, matching_type: int, der: bytes) -> Tlsa:
    selected = der if selector == 0 else spki(der)
    data = {0: selected, 1: hashlib.sha256(selected).digest(),
            2: hashlib.sha512(selected).digest()}[matching_type]
    return Tlsa(usage, selector, matching_type, data)


def ee_record(der: bytes) -> str:
    return f"3 1 1 {hashlib.sha256(spki(der)).hexdigest()}"
