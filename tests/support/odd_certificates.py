"""Certificates whose public key ``cryptography`` cannot load, for tests.

Made from a real EC P-256 certificate by rewriting one object identifier of
its SubjectPublicKeyInfo in place (same length, so every DER length stays
right). The signature no longer verifies: irrelevant, the notary records
certificates, it does not validate them.

- ``"sm2"``: an EC key on the SM2 curve (``1.2.156.10197.1.301``), as
  Chinese sites serve (``cryptography`` knows no such curve).
- ``"unknown-algorithm"``: a key algorithm nobody knows
  (``1.2.840.10045.2.99``).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

__all__ = ["ODD_KEYS", "OddCertificate", "odd_certificate"]

_P256_CURVE = bytes.fromhex("06082a8648ce3d030107")  # OID 1.2.840.10045.3.1.7
_SM2_CURVE = bytes.fromhex("06082a811ccf5501822d")  # OID 1.2.156.10197.1.301
_EC_PUBLIC_KEY = bytes.fromhex("06072a8648ce3d0201")  # OID 1.2.840.10045.2.1
_UNKNOWN_ALGORITHM = bytes.fromhex("06072a8648ce3d0263")  # OID 1.2.840.10045.2.99

#: kind -> (bytes replaced, replacement)
_REWRITES = {
    "sm2": (_P256_CURVE, _SM2_CURVE),
    "unknown-algorithm": (_EC_PUBLIC_KEY, _UNKNOWN_ALGORITHM),
}
#: Every kind :func:`odd_certificate` makes.
ODD_KEYS = tuple(_REWRITES)


@dataclass(frozen=True, slots=True)
class OddCertificate:
    """``der``: the certificate; ``spki_der``: its SubjectPublicKeyInfo as
    it stands in ``der`` (computed by the same rewrite, not by parsing)."""

    der: bytes
    spki_der: bytes


def odd_certificate(kind: str, name: str = "odd.example.test") -> OddCertificate:
    """A certificate for ``name`` with the public key of ``kind`` (see the
    module docstring)."""
    old, new = _REWRITES[kind]
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject).issuer_name(subject).public_key(key.public_key())
        .serial_number(0x5EED)
        .not_valid_before(datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC))
        .not_valid_after(datetime.datetime(2034, 1, 1, tzinfo=datetime.UTC))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    der = cert.public_bytes(serialization.Encoding.DER)
    spki = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    if der.count(old) != 1 or spki.count(old) != 1:
        raise AssertionError(f"the OID to rewrite is not once in the certificate ({kind})")
    return OddCertificate(der=der.replace(old, new), spki_der=spki.replace(old, new))
