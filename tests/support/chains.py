"""Certificate chains as a TLS server sends them, for the DANE tests: a PEM
certificate in DER (``der_of``), a trustme leaf's chain in DER, leaf first,
without the root (``chain_of``), and a certificate's SubjectPublicKeyInfo
in DER as ``cryptography`` encodes it, independently of the notary's code
(``spki``)."""

from __future__ import annotations

import ssl

import trustme
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat


def der_of(pem: bytes) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pem.decode("ascii"))


def chain_of(leaf: trustme.LeafCert) -> list[bytes]:
    """What the server sends: the leaf, then the intermediates (no root)."""
    return [der_of(blob.bytes()) for blob in leaf.cert_chain_pems]


def spki(der: bytes) -> bytes:
    return x509.load_der_x509_certificate(der).public_key().public_bytes(
        Encoding.DER, PublicFormat.SubjectPublicKeyInfo
    )
