"""Keys, certificates and the signatures of legacy answers.

Pure computation on top of ``cryptography``: no I/O except the small
``write_*``/``load_*`` helpers, which read or write one file each.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import datetime
import hashlib
import ipaddress
import os
import ssl
import tempfile
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, padding, rsa
from cryptography.x509.oid import NameOID

from notary.errors import UsageError

RSA_KEY_BITS = 2048
RSA_PUBLIC_EXPONENT = 65537
#: The longest validity ``keygen`` accepts: ten years, far from any
#: UTCTime/GeneralizedTime boundary (the original notary's 1915 overflow).
MAX_CERTIFICATE_DAYS = 3650
DEFAULT_CERTIFICATE_DAYS = 825
#: Certificates start one hour in the past so a peer with a slightly slow
#: clock accepts them at once.
BACKDATE = datetime.timedelta(hours=1)


def generate_rsa_key(bits: int = RSA_KEY_BITS) -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=RSA_PUBLIC_EXPONENT, key_size=bits)


def make_self_signed_certificate(
    key: rsa.RSAPrivateKey,
    name: str,
    *,
    days: int = DEFAULT_CERTIFICATE_DAYS,
    now: datetime.datetime | None = None,
) -> x509.Certificate:
    """A self-signed certificate for ``name`` (a host name or an IP literal).

    Raises ``UsageError`` for a validity outside 1..MAX_CERTIFICATE_DAYS or an
    empty name.
    """
    if not 1 <= days <= MAX_CERTIFICATE_DAYS:
        raise UsageError(f"--days must be between 1 and {MAX_CERTIFICATE_DAYS}, not {days}")
    if not name or len(name) > 253:
        raise UsageError("--name must be a host name or IP address of at most 253 characters")
    now = now or datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    try:
        alt_name: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        alt_name = x509.DNSName(name)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName([alt_name]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )


def private_key_pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def certificate_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def write_new_file(path: Path, data: bytes, *, mode: int, force: bool = False) -> None:
    """Write ``data`` to a new file created with ``mode``.

    Raises ``UsageError`` if the file exists and ``force`` is false, or if it
    cannot be written. With ``force`` an existing file is replaced atomically.
    """
    path = Path(path)
    try:
        if force:
            # mkstemp: a new file (O_EXCL, mode 0600) under an unpredictable
            # name, so nothing planted beside the target receives the data.
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.chmod(tmp, mode)
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise
        else:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
    except FileExistsError:
        raise UsageError(f"{path} exists; pass --force to overwrite it") from None
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}") from None


def _load_pem_private_key(path: Path) -> object:
    """Any unencrypted PEM private key; ``UsageError`` if unreadable or not one."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read key {path}: {exc.strerror}") from None
    try:
        return serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"{path} is not an unencrypted PEM private key ({exc})") from None
    except UnsupportedAlgorithm:
        raise UsageError(f"{path} holds a key of an unsupported algorithm") from None


def load_private_key(path: Path) -> rsa.RSAPrivateKey:
    """Load an unencrypted PEM RSA key; ``UsageError`` if unreadable or not RSA."""
    key = _load_pem_private_key(path)
    if not isinstance(key, rsa.RSAPrivateKey):
        raise UsageError(f"{path} is not an RSA key (Convergence answers are signed with RSA)")
    return key


def load_certificate(path: Path) -> x509.Certificate:
    """Load the first PEM certificate of ``path``; ``UsageError`` otherwise."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read certificate {path}: {exc.strerror}") from None
    try:
        return x509.load_pem_x509_certificate(data)
    except ValueError as exc:
        raise UsageError(f"{path} is not a PEM certificate ({exc})") from None


def check_key_matches_certificate(key: rsa.RSAPrivateKey, cert: x509.Certificate) -> None:
    """Raise ``UsageError`` unless ``cert`` carries ``key``'s public half: a
    notary must sign with the key of the certificate its clients pin."""
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    if key.public_key().public_bytes(der, public) != cert.public_key().public_bytes(der, public):
        raise UsageError("the key does not match the certificate")


def _verify_rsa(
    public_key: object, data: object, signature_b64: object, algorithm: hashes.HashAlgorithm
) -> bool:
    """PKCS1-v1_5 verification that never raises: False for anything that is
    not a key, bytes and a base64 signature of it."""
    if not isinstance(public_key, rsa.RSAPublicKey) or not isinstance(data, bytes | bytearray):
        return False
    try:
        signature = base64.b64decode(signature_b64, validate=True)  # type: ignore[arg-type]
    except (binascii.Error, ValueError, TypeError):
        return False
    try:
        public_key.verify(signature, bytes(data), padding.PKCS1v15(), algorithm)
    except InvalidSignature:
        return False
    return True


class _RsaSigner:
    """PKCS1-v1_5 RSA signatures with one hash, base64; the key is parsed
    once, and ``signatures_made`` counts (tests check "once per change")."""

    __slots__ = ("_key", "signatures_made")
    _algorithm: hashes.HashAlgorithm

    def __init__(self, key: rsa.RSAPrivateKey) -> None:
        self._key = key
        self.signatures_made = 0

    def sign(self, data: bytes) -> str:
        signature = self._key.sign(data, padding.PKCS1v15(), self._algorithm)
        self.signatures_made += 1
        return base64.b64encode(signature).decode("ascii")


class ConvergenceSigner(_RsaSigner):
    """Signs Convergence answers: RSASSA-PKCS1-v1_5 with SHA-1, base64.

    The key is parsed once, here; ``sign`` is called once per change of a
    target's list, never per request.
    """

    __slots__ = ()
    _algorithm = hashes.SHA1()


def verify_convergence_signature(public_key: object, payload: bytes, signature_b64: str) -> bool:
    """True when ``signature_b64`` is a valid PKCS1-v1_5/SHA-1 RSA signature of
    ``payload`` by ``public_key``; False on any mismatch or malformed input."""
    return _verify_rsa(public_key, payload, signature_b64, hashes.SHA1())


# -- Perspectives (PROTOCOLS.md 2.3) ---------------------------------------------

#: Size of new Perspectives keys. The original notaries used 1369-bit keys
#: (the four keys of ``tests/vectors/perspectives/http_notary_list.txt`` are
#: 1369 bits); 2048 is today's usual minimum for RSA. Clients read the key
#: from their notary list as PEM, so its size is the operator's choice.
PERSPECTIVES_KEY_BITS = 2048
#: Smallest Perspectives key ``generate_perspectives_key`` makes.
MIN_PERSPECTIVES_KEY_BITS = 1024


def generate_perspectives_key(bits: int = PERSPECTIVES_KEY_BITS) -> rsa.RSAPrivateKey:
    """A new RSA key for signing Perspectives replies: separate from the TLS
    key of the notary host (``notary keygen --perspectives``).

    Raises ``UsageError`` for fewer than :data:`MIN_PERSPECTIVES_KEY_BITS` bits.
    """
    if bits < MIN_PERSPECTIVES_KEY_BITS:
        raise UsageError(f"a Perspectives key needs at least {MIN_PERSPECTIVES_KEY_BITS} bits")
    return generate_rsa_key(bits)


def public_key_pem(key: rsa.RSAPrivateKey | rsa.RSAPublicKey) -> str:
    """The public half of ``key`` as PEM SubjectPublicKeyInfo
    (``-----BEGIN PUBLIC KEY-----``), the form of the client's notary list."""
    public = key.public_key() if isinstance(key, rsa.RSAPrivateKey) else key
    return public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode("ascii")


class PerspectivesSigner(_RsaSigner):
    """Signs Perspectives blobs: RSASSA-PKCS1-v1_5 with MD5, base64.

    The key is parsed once, here; ``sign`` is called once per change of a
    service's key histories, never per request.
    """

    __slots__ = ()
    _algorithm = hashes.MD5()


def verify_perspectives_signature(public_key: object, blob: bytes, signature_b64: str) -> bool:
    """True when ``signature_b64`` is a valid PKCS1-v1_5/MD5 RSA signature of
    ``blob`` by ``public_key``; False on any mismatch or malformed input
    (not a key, not base64, not text, wrong length)."""
    return _verify_rsa(public_key, blob, signature_b64, hashes.MD5())


def unverified_client_context() -> ssl.SSLContext:
    """A TLS 1.2+ client context that verifies nothing: for peers the caller
    authenticates itself, by a pinned certificate or a signature (notaries,
    sites judged by notaries, self-pinned bundles)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


# -- Ed25519 (the v2 API, notary.protocol.v2) -------------------------------------
# Imported here rather than at the top so this section is a pure append to the
# module (others edit the code above concurrently).



#: Length of an Ed25519 key id in hex characters (``notary.protocol.v2``, S4).
ED25519_KEY_ID_CHARS = 16


def generate_ed25519_key() -> ed25519.Ed25519PrivateKey:
    """A new Ed25519 key for signing v2 statements and answers."""
    return ed25519.Ed25519PrivateKey.generate()


def ed25519_public_raw(key: ed25519.Ed25519PrivateKey | ed25519.Ed25519PublicKey) -> bytes:
    """The raw 32-byte public key of ``key`` (the form of ``GET /v2/key``)."""
    public = key.public_key() if isinstance(key, ed25519.Ed25519PrivateKey) else key
    return public.public_bytes_raw()


def ed25519_key_id(public_raw: bytes) -> str:
    """The key id of a raw Ed25519 public key: the first 16 lower-case hex
    characters of its SHA-256. The rule is
    :func:`notary.protocol.v2.key_id_of`'s (S4); a test checks they agree."""
    return hashlib.sha256(public_raw).hexdigest()[:ED25519_KEY_ID_CHARS]


class Ed25519Signer:
    """Signs v2 statements and answers: Ed25519, base64 (standard, padded).

    The key is parsed once, here. Statements are signed once per change of a
    target's observations; answers once per request (one signature whatever
    the batch size).
    """

    __slots__ = ("_key", "key_id", "public_raw", "signatures_made")

    def __init__(self, key: ed25519.Ed25519PrivateKey) -> None:
        if not isinstance(key, ed25519.Ed25519PrivateKey):
            raise UsageError("an Ed25519 signer needs an Ed25519 private key")
        self._key = key
        self.public_raw = ed25519_public_raw(key)
        self.key_id = ed25519_key_id(self.public_raw)
        self.signatures_made = 0

    def sign(self, data: bytes) -> str:
        return base64.b64encode(self.sign_raw(data)).decode("ascii")

    def sign_raw(self, data: bytes) -> bytes:
        """The 64-byte signature itself (the log's signed notes)."""
        signature = self._key.sign(data)
        self.signatures_made += 1
        return signature


def verify_ed25519(public_key: object, data: bytes, signature_b64: str) -> bool:
    """True when ``signature_b64`` is a valid Ed25519 signature of ``data`` by
    ``public_key`` (an ``Ed25519PublicKey`` or its raw 32 bytes); False on any
    mismatch or malformed input (not a key, not base64, not 64 bytes, not
    text), never an exception."""
    if isinstance(public_key, bytes | bytearray):
        try:
            public_key = ed25519.Ed25519PublicKey.from_public_bytes(bytes(public_key))
        except ValueError:
            return False
    if not isinstance(public_key, ed25519.Ed25519PublicKey):
        return False
    if not isinstance(data, bytes | bytearray) or not isinstance(signature_b64, str | bytes):
        return False
    try:
        signature = base64.b64decode(signature_b64, validate=True)
    except (binascii.Error, ValueError, TypeError):
        return False
    if len(signature) != 64:
        return False
    try:
        public_key.verify(signature, bytes(data))
    except InvalidSignature:
        return False
    return True


def ed25519_private_key_pem(key: ed25519.Ed25519PrivateKey) -> bytes:
    """``key`` as unencrypted PKCS#8 PEM (``-----BEGIN PRIVATE KEY-----``);
    write it with :func:`write_new_file` and mode 0o600."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def ed25519_public_key_pem(key: ed25519.Ed25519PrivateKey | ed25519.Ed25519PublicKey) -> str:
    """The public half of ``key`` as PEM SubjectPublicKeyInfo."""
    public = key.public_key() if isinstance(key, ed25519.Ed25519PrivateKey) else key
    return public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode("ascii")


def write_ed25519_private_key(
    path: Path, key: ed25519.Ed25519PrivateKey, *, force: bool = False
) -> None:
    """Write ``key`` to the new file ``path`` (mode 0o600); ``UsageError`` as
    :func:`write_new_file`."""
    write_new_file(path, ed25519_private_key_pem(key), mode=0o600, force=force)


def load_ed25519_private_key(path: Path) -> ed25519.Ed25519PrivateKey:
    """Load an unencrypted PEM Ed25519 key; ``UsageError`` if unreadable, not
    PEM, encrypted, or another kind of key."""
    key = _load_pem_private_key(path)
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise UsageError(f"{path} is not an Ed25519 key (v2 answers are signed with Ed25519)")
    return key
