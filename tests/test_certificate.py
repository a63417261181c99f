"""``notary.model.observations.Certificate.from_der`` and the SubjectPublicKeyInfo
walk it hashes: every key algorithm, known to ``cryptography`` or not, and
hostile DER that must end in ``ValueError``, never another exception."""

from __future__ import annotations

import datetime
import hashlib

import pytest
from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa
from cryptography.x509.oid import NameOID

from notary.model.observations import Certificate, subject_public_key_info
from tests.support.odd_certificates import ODD_KEYS, odd_certificate

VERSION_3 = bytes.fromhex("a003020102")  # [0] EXPLICIT INTEGER 2
KEYS = {
    "rsa-2048": lambda: rsa.generate_private_key(65537, 2048),
    "ec-p256": lambda: ec.generate_private_key(ec.SECP256R1()),
    "ec-p384": lambda: ec.generate_private_key(ec.SECP384R1()),
    "ed25519": ed25519.Ed25519PrivateKey.generate,
    "ed448": ed448.Ed448PrivateKey.generate,
    "dsa-2048": lambda: dsa.generate_private_key(2048),
}


def certificate_der(key) -> bytes:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "www.example.test")])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(7)
        .not_valid_before(datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC))
        .not_valid_after(datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC))
    )
    edwards = isinstance(key, ed25519.Ed25519PrivateKey | ed448.Ed448PrivateKey)
    certificate = builder.sign(key, None if edwards else hashes.SHA256())
    return certificate.public_bytes(serialization.Encoding.DER)


def as_version_1(der: bytes) -> bytes:
    """``der`` without TBSCertificate's version element (a v1 certificate;
    the signature no longer matches, which nothing here checks)."""
    tbs = x509.load_der_x509_certificate(der).tbs_certificate_bytes
    rest = der[der.index(tbs) + len(tbs) :]  # signature algorithm and signature
    fields = _content(tbs)
    assert fields.startswith(VERSION_3)
    return _sequence(_sequence(fields[len(VERSION_3) :]) + rest)


def _content(element: bytes) -> bytes:
    first = element[1]
    return element[2:] if first < 0x80 else element[2 + (first & 0x7F) :]


def _sequence(content: bytes) -> bytes:
    n = len(content)
    size = (n.bit_length() + 7) // 8
    length = bytes([n]) if n < 0x80 else bytes([0x80 | size]) + n.to_bytes(size, "big")
    return b"\x30" + length + content


@pytest.mark.parametrize("kind", KEYS)
def test_the_spki_hash_is_that_of_the_key_as_cryptography_encodes_it(kind: str) -> None:
    key = KEYS[kind]()
    der = certificate_der(key)
    spki = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    certificate = Certificate.from_der(der)
    assert subject_public_key_info(der) == spki
    assert certificate.spki_sha256 == hashlib.sha256(spki).digest()
    assert certificate.sha256 == hashlib.sha256(der).digest()


def test_a_version_1_certificate_has_no_version_element_to_skip() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    der = as_version_1(certificate_der(key))
    assert x509.load_der_x509_certificate(der).version is x509.Version.v1
    spki = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    assert Certificate.from_der(der).spki_sha256 == hashlib.sha256(spki).digest()


@pytest.mark.parametrize("kind", ODD_KEYS)
def test_a_key_cryptography_cannot_load_is_hashed_from_the_der(kind: str) -> None:
    odd = odd_certificate(kind)
    with pytest.raises(UnsupportedAlgorithm):
        x509.load_der_x509_certificate(odd.der).public_key()
    certificate = Certificate.from_der(odd.der)
    assert certificate.der == odd.der
    assert certificate.sha1 == hashlib.sha1(odd.der).digest()
    assert certificate.md5 == hashlib.md5(odd.der).digest()
    assert certificate.spki_sha256 == hashlib.sha256(odd.spki_der).digest()


@pytest.mark.parametrize(
    "der", [b"", b"\x30", b"not a certificate", b"\x30\x03\x02\x01\x01"],
    ids=["empty", "a-tag", "text", "a-sequence"],
)
def test_what_is_not_a_certificate_is_a_value_error(der: bytes) -> None:
    with pytest.raises(ValueError):
        Certificate.from_der(der)


def test_every_truncation_is_a_value_error() -> None:
    der = odd_certificate("sm2").der
    for cut in range(len(der)):
        with pytest.raises(ValueError):
            Certificate.from_der(der[:cut])
        with pytest.raises(ValueError):
            subject_public_key_info(der[:cut])


@pytest.mark.parametrize(
    ("der", "message"),
    [
        (b"\x30\x80\x30\x00\x00\x00", "bad DER length"),  # indefinite (BER)
        (b"\x30\x85\x00\x00\x00\x00\x01\x00", "bad DER length"),  # a 5-byte length
        (b"\x30\x84\xff\xff\xff\xff\x30\x00", "truncated"),  # 4 GiB announced
        (b"\x30\x81", "bad DER length"),  # the length's byte missing
        (b"\x1f\x81\x00\x00", "multi-byte DER tag"),
        (b"\x31\x02\x30\x00", "no outer SEQUENCE"),
        (b"\x30\x02\x02\x00", "no TBSCertificate"),
        (b"\x30\x04\x30\x02\x02\x00", "truncated"),  # five fields missing
        (b"\x30\x0e\x30\x0c" + b"\x02\x00" * 5 + b"\x02\x00", "no SubjectPublicKeyInfo"),
        (b"\x30\x0c\x30\x0a" + b"\x02\x00" * 5, "truncated"),
    ],
)
def test_hostile_der_is_a_value_error_with_a_reason(der: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        subject_public_key_info(der)


def test_the_walk_stops_at_the_spki_of_a_minimal_shape() -> None:
    tbs = b"\x02\x00" * 5 + b"\x30\x03\x05\x01\x00" + b"\x02\x00"
    der = _sequence(_sequence(tbs))
    assert subject_public_key_info(der) == b"\x30\x03\x05\x01\x00"
