"""What a person wants to read about a certificate: subject, issuer,
validity, names, key type and hashes, parsed from its DER with
``cryptography``.

Pure. A certificate a target served may be malformed or hostile: parsing
never raises (an unreadable field is shown as such), and every text is cut
to :data:`MAX_TEXT_CHARS` so a page stays bounded; escaping is the
renderer's job (``notary.web.pages``).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa, x448, x25519

from notary.model.observations import Certificate

__all__ = [
    "MAX_NAMES",
    "MAX_TEXT_CHARS",
    "UNKNOWN_KEY_TYPE",
    "CertificateDetails",
    "colon_hex",
    "details_of",
    "key_type_of",
]

#: Longest subject, issuer or name shown, in characters.
MAX_TEXT_CHARS = 300
#: Most subject alternative names shown.
MAX_NAMES = 20
UNREADABLE = "(unreadable)"
#: The key type of a key ``cryptography`` cannot load (SM2, GOST, an unknown
#: algorithm); the certificate is recorded and shown all the same.
UNKNOWN_KEY_TYPE = "unknown"


@dataclass(frozen=True, slots=True)
class CertificateDetails:
    """The readable fields of a certificate; ``not_before``/``not_after``
    are Unix seconds (None when unreadable); ``key_type`` as
    :func:`key_type_of` names it."""

    subject: str
    issuer: str
    not_before: int | None
    not_after: int | None
    serial: str
    names: tuple[str, ...]
    sha256: str
    sha1: str
    spki_sha256: str
    key_type: str = UNREADABLE


def colon_hex(data: bytes) -> str:
    """``AB:CD:...``: how fingerprints are written for people."""
    return ":".join(f"{byte:02X}" for byte in data)


def _cut(text: str) -> str:
    return text if len(text) <= MAX_TEXT_CHARS else text[: MAX_TEXT_CHARS - 1] + "…"


def _seconds(moment: datetime.datetime) -> int:
    return int(moment.replace(tzinfo=datetime.UTC).timestamp()) if moment.tzinfo is None else (
        int(moment.timestamp())
    )


def details_of(certificate: Certificate) -> CertificateDetails:
    """The details of ``certificate``; fields that do not parse read
    ``(unreadable)``."""
    hashes = dict(
        sha256=colon_hex(certificate.sha256),
        sha1=colon_hex(certificate.sha1),
        spki_sha256=colon_hex(certificate.spki_sha256),
    )
    try:
        parsed = x509.load_der_x509_certificate(certificate.der)
    except ValueError:
        return CertificateDetails(UNREADABLE, UNREADABLE, None, None, UNREADABLE, (), **hashes)
    subject = _field(lambda: parsed.subject.rfc4514_string())
    issuer = _field(lambda: parsed.issuer.rfc4514_string())
    serial = _field(lambda: f"{parsed.serial_number:X}")
    try:
        not_before: int | None = _seconds(parsed.not_valid_before_utc)
        not_after: int | None = _seconds(parsed.not_valid_after_utc)
    except ValueError:
        not_before = not_after = None
    return CertificateDetails(
        subject, issuer, not_before, not_after, serial, _names(parsed), **hashes,
        key_type=key_type_of(parsed),
    )


def key_type_of(parsed: x509.Certificate) -> str:
    """``"RSA 2048"``, ``"EC secp256r1"``, ``"Ed25519"``, ``"DSA 2048"``...;
    ``"unknown"`` (:data:`UNKNOWN_KEY_TYPE`) for a key ``cryptography``
    cannot load. Never raises."""
    try:
        key = parsed.public_key()
    except (UnsupportedAlgorithm, ValueError):
        return UNKNOWN_KEY_TYPE
    if isinstance(key, rsa.RSAPublicKey):
        return f"RSA {key.key_size}"
    if isinstance(key, ec.EllipticCurvePublicKey):
        return f"EC {key.curve.name}"
    if isinstance(key, dsa.DSAPublicKey):
        return f"DSA {key.key_size}"
    for kind, name in (
        (ed25519.Ed25519PublicKey, "Ed25519"), (ed448.Ed448PublicKey, "Ed448"),
        (x25519.X25519PublicKey, "X25519"), (x448.X448PublicKey, "X448"),
    ):
        if isinstance(key, kind):
            return name
    return UNKNOWN_KEY_TYPE


def _field(read: object) -> str:
    try:
        return _cut(read())  # type: ignore[operator]
    except (ValueError, TypeError):
        return UNREADABLE


def _names(parsed: x509.Certificate) -> tuple[str, ...]:
    """DNS names and IP addresses of the subject alternative names."""
    try:
        extension = parsed.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except (x509.ExtensionNotFound, ValueError):
        return ()
    names: list[str] = []
    for general_name in extension.value:
        if isinstance(general_name, x509.DNSName | x509.IPAddress):
            names.append(_cut(str(general_name.value)))
        if len(names) >= MAX_NAMES:
            break
    return tuple(names)
