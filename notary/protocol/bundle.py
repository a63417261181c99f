"""The ``.notary`` bundle, version 1 (PROTOCOLS.md 1.6).

A bundle publishes a logical notary: its name (the clients' identity key), the
HTTPS address of the bundle itself, an optional region, and every physical
host with the certificate clients pin.

Two optional extensions, which the 2011 readers ignore (they read only the
members they know): each host's ``v2_key``, and the notary's transparency
``log`` (:class:`BundleLog`, docs/security.md "The client's trusted notaries"):

    "log": {"origin": "notary.example.org/v2/log",
            "key": "notary.example.org/v2/log+1a2b3c4d+AQ...",
            "witnesses": ["notary2.example.org/witness+5e6f7a8b+BA..."],
            "min_witnesses": 1}

``origin`` names the log (its checkpoints' first line and key name),
``key`` is the C2SP signed-note verifier key (type 0x01) its checkpoints
are signed with, named ``origin`` (it is the notary's v2 key: a host's
``v2_key``, when given, must be it), and ``witnesses`` (optional, at most
:data:`MAX_BUNDLE_WITNESSES`) the cosigner vkeys (type 0x04) of the
witnesses the operator asks to cosign its checkpoints, of which
``min_witnesses`` (optional, 0 when absent) cosign the checkpoint of every
answer: the operator's promise, which clients hold it to (docs/log.md
"Witnesses"). A bundle without ``log`` is written byte for byte as before.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from notary.errors import BadTarget, UsageError
from notary.model.targets import normalise_host
from notary.protocol import tlog
from notary.protocol.convergence import format_fingerprint

BUNDLE_VERSION = 1
MAX_BUNDLE_BYTES = 1024 * 1024
MAX_HOSTS = 64
MAX_NAME_CHARS = 200
#: Witnesses a bundle's ``log`` lists, at most.
MAX_BUNDLE_WITNESSES = 32
CONTENT_TYPE = b"application/octet-stream"
#: File name suffix of bundle files.
BUNDLE_SUFFIX = ".notary"
_REGION_RE = re.compile(r"[A-Z]{2}")


class BundleError(UsageError):
    """A bundle is malformed or fails validation."""


@dataclass(frozen=True, slots=True)
class BundleHost:
    """One physical host of a notary."""

    host: str
    ssl_port: int
    http_port: int
    certificate_pem: str
    #: Optional (an extension legacy clients ignore): the host's v2 API
    #: Ed25519 public key, base64 of its 32 raw bytes; when present, v2
    #: clients trust only this key for the host.
    v2_key: str | None = None

    @property
    def v2_key_raw(self) -> bytes | None:
        return base64.b64decode(self.v2_key) if self.v2_key is not None else None

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.certificate_pem.encode("ascii"))

    @property
    def sha1_pin(self) -> str:
        """The SHA-1 fingerprint of the host's certificate, as clients pin it."""
        der = self.certificate.public_bytes(serialization.Encoding.DER)
        return format_fingerprint(hashlib.sha1(der).digest())


@dataclass(frozen=True, slots=True)
class BundleLog:
    """The notary's transparency log, as its bundle pins it (an extension
    legacy clients ignore; see the module docstring): its ``origin``, the
    verifier ``key`` (vkey, type 0x01, named ``origin``) that signs its
    checkpoints, the cosigner vkeys of the ``witnesses`` it asks, and how
    many of them promise to cosign (``min_witnesses``)."""

    origin: str
    key: str
    witnesses: tuple[str, ...] = ()
    min_witnesses: int = 0

    @property
    def public_raw(self) -> bytes:
        """The raw Ed25519 public key of :attr:`key`."""
        return tlog.parse_verifier_key(self.key)[2]

    @staticmethod
    def of(
        origin: str, public_raw: bytes, witnesses: tuple[str, ...] = (), *, min_witnesses: int = 0
    ) -> BundleLog:
        """The member for log ``origin`` signed by ``public_raw`` (the
        notary's v2 key). ``BundleError`` for an origin that cannot be a
        key name."""
        try:
            key = tlog.verifier_key(origin, public_raw)
        except tlog.NoteError as exc:
            raise BundleError(f"log origin {origin!r}: {exc}") from None
        return BundleLog(origin, key, tuple(witnesses), min_witnesses)


@dataclass(frozen=True, slots=True)
class Bundle:
    name: str
    bundle_location: str
    hosts: tuple[BundleHost, ...]
    region: str | None = None
    version: int = BUNDLE_VERSION
    #: Optional (an extension legacy clients ignore): the notary's log.
    log: BundleLog | None = None

    def to_json(self) -> bytes:
        """The file's bytes, keys in the order the original tool wrote them."""
        document: dict[str, object] = {
            "version": self.version,
            "hosts": [_host_document(h) for h in self.hosts],
            "name": self.name,
            "bundle_location": self.bundle_location,
        }
        if self.region is not None:
            document["region"] = self.region
        if self.log is not None:
            log: dict[str, object] = {"origin": self.log.origin, "key": self.log.key}
            if self.log.witnesses:
                log["witnesses"] = list(self.log.witnesses)
            if self.log.min_witnesses:
                log["min_witnesses"] = self.log.min_witnesses
            document["log"] = log
        return json.dumps(document).encode("utf-8")


def _host_document(host: BundleHost) -> dict[str, object]:
    document: dict[str, object] = {
        "host": host.host,
        "http_port": host.http_port,
        "ssl_port": host.ssl_port,
        "certificate": host.certificate_pem,
    }
    if host.v2_key is not None:
        document["v2_key"] = host.v2_key
    return document


def make_bundle(
    *, name: str, location: str, hosts: list[BundleHost], region: str | None = None,
    log: BundleLog | None = None,
) -> Bundle:
    """Build and validate a bundle; ``BundleError`` names the first problem."""
    bundle = Bundle(
        name=name, bundle_location=location, hosts=tuple(hosts), region=region, log=log
    )
    validate(bundle)
    return bundle


def validate(bundle: Bundle) -> None:
    """Raise ``BundleError`` unless ``bundle`` is a valid version-1 bundle."""
    # ``type() is int``: JSON ``true`` and ``1.0`` compare equal to 1 but are
    # not the integer 1 the format requires (and would be written back as is).
    if type(bundle.version) is not int or bundle.version != BUNDLE_VERSION:
        raise BundleError(f"unsupported bundle version {bundle.version!r} (expected 1)")
    if not isinstance(bundle.name, str) or not bundle.name.strip():
        raise BundleError("bundle name must be a non-empty string")
    if len(bundle.name) > MAX_NAME_CHARS:
        raise BundleError(f"bundle name longer than {MAX_NAME_CHARS} characters")
    _validate_location(bundle.bundle_location)
    if bundle.region is not None and not (
        isinstance(bundle.region, str) and _REGION_RE.fullmatch(bundle.region)
    ):
        raise BundleError("region must be a two-letter upper-case ISO country code")
    if not bundle.hosts:
        raise BundleError("a bundle needs at least one host")
    if len(bundle.hosts) > MAX_HOSTS:
        raise BundleError(f"a bundle has at most {MAX_HOSTS} hosts")
    for host in bundle.hosts:
        _validate_host(host)
    if bundle.log is not None:
        _validate_log(bundle.log, bundle.hosts)


def _validate_log(log: BundleLog, hosts: tuple[BundleHost, ...]) -> None:
    """The ``log`` member: an origin, its verifier key (type 0x01, named
    the origin, the hosts' v2 key when they carry one), distinct witness
    cosigner keys (type 0x04)."""
    if not isinstance(log, BundleLog):
        raise BundleError("log must be an object")
    if not isinstance(log.origin, str) or not tlog.is_valid_key_name(log.origin):
        raise BundleError("log origin must be a key name (no space, '+' or control character)")
    if len(log.origin) > MAX_NAME_CHARS:
        raise BundleError(f"log origin longer than {MAX_NAME_CHARS} characters")
    try:
        name, _key_id, public_raw = tlog.parse_verifier_key(log.key)
    except tlog.NoteError as exc:
        raise BundleError(f"log key must be the log's verifier key (vkey): {exc}") from None
    if name != log.origin:
        raise BundleError("log key must be named after the log's origin")
    v2_keys = {host.v2_key_raw for host in hosts if host.v2_key is not None}
    if v2_keys and v2_keys != {public_raw}:
        raise BundleError("log key must be the hosts' v2_key (the v2 key signs the log)")
    if not isinstance(log.witnesses, tuple) or len(log.witnesses) > MAX_BUNDLE_WITNESSES:
        raise BundleError(f"log witnesses must be a list of at most {MAX_BUNDLE_WITNESSES} keys")
    for witness in log.witnesses:
        try:
            tlog.parse_cosigner_key(witness)
        except tlog.NoteError as exc:
            raise BundleError(f"log witness {str(witness)[:80]!r}: {exc}") from None
    if len(set(log.witnesses)) != len(log.witnesses):
        raise BundleError("log witnesses must not repeat a key")
    if (
        not isinstance(log.min_witnesses, int) or isinstance(log.min_witnesses, bool)
        or not 0 <= log.min_witnesses <= len(log.witnesses)
    ):
        raise BundleError("log min_witnesses must be a whole number from 0 to its witnesses")


def _validate_location(location: object) -> None:
    if not isinstance(location, str):
        raise BundleError("bundle_location must be a string")
    try:
        parts = urlsplit(location)
        parts.port  # noqa: B018 - urlsplit checks the port only when asked
    except ValueError:
        raise BundleError("bundle_location must be an https:// URL") from None
    if parts.scheme != "https" or not parts.hostname:
        raise BundleError("bundle_location must be an https:// URL")
    if not parts.path.endswith(".notary"):
        raise BundleError("bundle_location must end with .notary")


def _validate_host(host: BundleHost) -> None:
    if not isinstance(host.host, str):
        raise BundleError("host must be a string")
    try:
        normalise_host(host.host)
    except BadTarget as exc:
        raise BundleError(f"bad host {host.host!r}: {exc}") from None
    for field_name in ("ssl_port", "http_port"):
        port = getattr(host, field_name)
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise BundleError(f"{field_name} of {host.host} must be a port number 1-65535")
    if not isinstance(host.certificate_pem, str):
        raise BundleError(f"certificate of {host.host} must be PEM text")
    try:
        host.certificate  # noqa: B018 - parse to validate
    except ValueError as exc:
        raise BundleError(f"certificate of {host.host} is not a readable PEM ({exc})") from None
    if host.v2_key is not None:
        raw = None
        if isinstance(host.v2_key, str):
            with contextlib.suppress(binascii.Error, ValueError):
                raw = base64.b64decode(host.v2_key, validate=True)
        if raw is None or len(raw) != 32:
            raise BundleError(f"v2_key of {host.host} must be base64 of a 32-byte Ed25519 key")


def parse_bundle(data: bytes) -> Bundle:
    """Parse and validate a bundle file; ``BundleError`` on any problem."""
    if len(data) > MAX_BUNDLE_BYTES:
        raise BundleError("bundle file is larger than 1 MiB")
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BundleError(f"bundle is not JSON ({exc})") from None
    except RecursionError:
        raise BundleError("bundle is not JSON (nested too deeply)") from None
    if not isinstance(document, dict):
        raise BundleError("bundle must be a JSON object")
    raw_hosts = document.get("hosts")
    if not isinstance(raw_hosts, list):
        raise BundleError("bundle needs a list of hosts")
    hosts = []
    for raw in raw_hosts:
        if not isinstance(raw, dict):
            raise BundleError("each host must be an object")
        try:
            hosts.append(
                BundleHost(
                    host=raw["host"],
                    ssl_port=raw["ssl_port"],
                    http_port=raw["http_port"],
                    certificate_pem=raw["certificate"],
                    v2_key=raw.get("v2_key"),
                )
            )
        except KeyError as exc:
            raise BundleError(f"host entry is missing {exc.args[0]!r}") from None
    for key in ("version", "name", "bundle_location"):
        if key not in document:
            raise BundleError(f"bundle is missing {key!r}")
    bundle = Bundle(
        name=document["name"],
        bundle_location=document["bundle_location"],
        hosts=tuple(hosts),
        region=document.get("region"),
        version=document["version"],
        log=_parse_log(document["log"]) if document.get("log") is not None else None,
    )
    validate(bundle)
    return bundle


def _parse_log(raw: object) -> BundleLog:
    """The ``log`` member as a :class:`BundleLog` (validated with the rest)."""
    if not isinstance(raw, dict):
        raise BundleError("log must be an object")
    for key in ("origin", "key"):
        if key not in raw:
            raise BundleError(f"log is missing {key!r}")
    witnesses = raw.get("witnesses", [])
    if not isinstance(witnesses, list):
        raise BundleError(f"log witnesses must be a list of at most {MAX_BUNDLE_WITNESSES} keys")
    return BundleLog(raw["origin"], raw["key"], tuple(witnesses), raw.get("min_witnesses", 0))


def parse_host_spec(spec: str, certificate_pem: str) -> BundleHost:
    """``HOST:SSL_PORT:HTTP_PORT`` (IPv6 hosts in brackets) plus PEM text."""
    match = re.fullmatch(r"(\[[^\]]+\]|[^:\[\]]+):(\d{1,5}):(\d{1,5})", spec)
    if not match:
        raise BundleError(f"host {spec!r} must be HOST:SSL_PORT:HTTP_PORT")
    host = match.group(1).strip("[]")
    return BundleHost(host, int(match.group(2)), int(match.group(3)), certificate_pem)
