"""Parsing ``POST /v2/query`` request bodies (docs/v2.md, rules R1-R6)."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from notary.errors import BadTarget, ProtocolError
from notary.model.targets import Target, make_target
from notary.protocol.strictjson import DuplicateKey, loads
from notary.protocol.v2.canonical import is_json_int
from notary.protocol.v2.constants import LOWER_HEX_RE, SHA1_BYTES, SHA256_BYTES

#: Longest nonce (rule R5).
MAX_NONCE_CHARS = 128
#: Longest ``address`` read (rule R4): the longest text of an IPv6 address,
#: ``ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255``.
MAX_ADDRESS_CHARS = 45

_REQUEST_KEYS = frozenset({"targets", "nonce"})
_TARGET_KEYS = frozenset({"host", "port", "sha256", "sha1", "spki_sha256", "address"})
_NONCE_RE = re.compile(r"[\x20-\x7e]+")


@dataclass(frozen=True, slots=True)
class TargetQuery:
    """One entry of a request: a target, the hashes the client saw (None
    when not submitted: the certificate's SHA-256 and SHA-1, its key's
    ``spki_sha256``) and the ``address`` the client's own connection to the
    site reached (normalised IP text, rule R4; None when not sent), which
    the notary may add to its probe (docs/v2.md, R4)."""

    target: Target
    sha256: bytes | None = None
    sha1: bytes | None = None
    spki_sha256: bytes | None = None
    address: str | None = None

    @property
    def submitted(self) -> bool:
        """Whether any hash was submitted (V1-V3, V6)."""
        return self.sha256 is not None or self.sha1 is not None or self.spki_sha256 is not None

    @property
    def key_only(self) -> bool:
        """Whether ``spki_sha256`` is the only hash submitted (rule V6)."""
        return self.spki_sha256 is not None and self.sha256 is None and self.sha1 is None


@dataclass(frozen=True, slots=True)
class QueryRequest:
    """A parsed ``POST /v2/query`` body: targets in request order."""

    targets: tuple[TargetQuery, ...]
    nonce: str | None = None


def parse_query_request(body: bytes, *, max_batch: int, max_body_bytes: int) -> QueryRequest:
    """The request in ``body`` (docs/v2.md, rules R1-R6).

    Error handling: ``ProtocolError`` 413 for a body longer than
    ``max_body_bytes`` or more than ``max_batch`` targets; ``ProtocolError``
    400 for anything else malformed; ``BadTarget`` (400) for a host or port
    that does not normalise. Messages name the field and never echo input.
    """
    if len(body) > max_body_bytes:
        raise ProtocolError("body: too large", status=413)
    try:
        document = loads(body)
    except DuplicateKey:
        raise ProtocolError("body: repeated key in an object") from None
    except ValueError:
        raise ProtocolError("body: not UTF-8 JSON") from None
    if not isinstance(document, dict):
        raise ProtocolError("body: must be a JSON object")
    if not document.keys() <= _REQUEST_KEYS:
        raise ProtocolError("body: unknown field (expected targets, nonce)")
    nonce = document.get("nonce")
    if nonce is not None and not (
        isinstance(nonce, str) and len(nonce) <= MAX_NONCE_CHARS and _NONCE_RE.fullmatch(nonce)
    ):
        raise ProtocolError(
            f"nonce: must be 1-{MAX_NONCE_CHARS} printable ASCII characters or null"
        )
    if "targets" not in document:
        raise ProtocolError("targets: missing")
    entries = document["targets"]
    if not isinstance(entries, list) or not entries:
        raise ProtocolError("targets: must be a non-empty array")
    if len(entries) > max_batch:
        raise ProtocolError(f"targets: more than {max_batch} targets", status=413)
    return QueryRequest(
        tuple(_parse_target_query(index, entry) for index, entry in enumerate(entries)), nonce
    )


def _parse_target_query(index: int, entry: object) -> TargetQuery:
    """Entry ``index`` of ``targets`` (rule R4); raises as
    :func:`parse_query_request`."""
    where = f"targets[{index}]"
    if not isinstance(entry, dict):
        raise ProtocolError(f"{where}: must be an object")
    if not entry.keys() <= _TARGET_KEYS:
        raise ProtocolError(
            f"{where}: unknown field (expected host, port, sha256, sha1, spki_sha256, address)"
        )
    if "host" not in entry:
        raise BadTarget(f"{where}.host: missing")
    host = entry["host"]
    if not isinstance(host, str):
        raise BadTarget(f"{where}.host: must be a string")
    if "port" not in entry:
        raise BadTarget(f"{where}.port: missing")
    port = entry["port"]
    if not is_json_int(port) or not 1 <= port <= 65535:
        raise BadTarget(f"{where}.port: must be an integer 1-65535")
    try:
        target = make_target(host, port)
    except BadTarget as exc:
        raise BadTarget(f"{where}.host: {exc.message}") from None
    sha256 = _parse_digest(entry.get("sha256"), SHA256_BYTES, f"{where}.sha256")
    sha1 = _parse_digest(entry.get("sha1"), SHA1_BYTES, f"{where}.sha1")
    spki_sha256 = _parse_digest(entry.get("spki_sha256"), SHA256_BYTES, f"{where}.spki_sha256")
    address = _parse_address(entry.get("address"), f"{where}.address")
    return TargetQuery(target, sha256, sha1, spki_sha256, address)


def _parse_digest(value: object, size: int, where: str) -> bytes | None:
    """``size`` bytes written as hex (either case), plain or as
    colon-separated pairs; None for a missing or null field. Raises
    ``ProtocolError`` 400 otherwise."""
    if value is None:
        return None
    if isinstance(value, str) and len(value) in (2 * size, 3 * size - 1):
        text = value.lower()
        if len(text) == 3 * size - 1:
            pairs = text.split(":")
            text = "".join(pairs) if all(len(pair) == 2 for pair in pairs) else ""
        if len(text) == 2 * size and LOWER_HEX_RE.fullmatch(text):
            return bytes.fromhex(text)
    raise ProtocolError(f"{where}: must be {2 * size} hex digits or null")


def _parse_address(value: object, where: str) -> str | None:
    """An IPv4 or IPv6 address as the dialer writes addresses: dotted quad,
    or compressed lower-case IPv6 (an IPv4-mapped one as its IPv4 address);
    None for a missing or null field. No brackets, zone id or port; IPv4
    written with leading zeros is refused (it is octal to some parsers).
    Raises ``ProtocolError`` 400 otherwise, without echoing the input."""
    if value is None:
        return None
    # ipaddress reads ASCII only; the checks keep odd text out of it.
    if isinstance(value, str) and 0 < len(value) <= MAX_ADDRESS_CHARS and value.isascii() and (
        "%" not in value
    ):
        try:
            address = ipaddress.ip_address(value)
        except ValueError:
            pass
        else:
            if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
                return str(address.ipv4_mapped)
            return str(address)
    raise ProtocolError(f"{where}: must be an IPv4 or IPv6 address (no brackets or port) or null")
