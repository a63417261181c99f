"""The notary's signing keys: key ids (docs/v2.md, rule S4) and the key
document of ``GET /v2/key`` (docs/v2.md, "The key document")."""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from notary.errors import ProtocolError
from notary.protocol.strictjson import loads
from notary.protocol.v2.canonical import MAX_SAFE_INTEGER, canonical_json, is_json_int

KEYS_TYPE = "notary.v2.keys"
KEY_ALGORITHM = "ed25519"
#: Largest key document a client parses, and most keys in it.
MAX_KEY_DOCUMENT_BYTES = 64 * 1024
MAX_PUBLISHED_KEYS = 16
ED25519_PUBLIC_KEY_BYTES = 32
KEY_ID_CHARS = 16

_KEY_DOCUMENT_KEYS = frozenset({"type", "keys"})
_PUBLISHED_KEY_KEYS = frozenset({"algorithm", "key_id", "public_key", "not_before", "not_after"})


def key_id_of(public_raw: bytes) -> str:
    """The key id of a raw 32-byte Ed25519 public key (rule S4): the first 16
    lower-case hex characters of its SHA-256."""
    return hashlib.sha256(public_raw).hexdigest()[:KEY_ID_CHARS]


@dataclass(frozen=True, slots=True)
class PublishedKey:
    """One signing key of the notary, valid from ``not_before`` to
    ``not_after`` (Unix seconds, inclusive)."""

    key_id: str
    public_key_raw: bytes
    not_before: int
    not_after: int

    def public_key(self) -> Ed25519PublicKey:
        return Ed25519PublicKey.from_public_bytes(self.public_key_raw)

    def is_valid_at(self, now: int) -> bool:
        return self.not_before <= now <= self.not_after


def publish_key(public_raw: bytes, *, not_before: int, not_after: int) -> PublishedKey:
    """A :class:`PublishedKey` with its key id computed (rule S4).

    Raises ``ValueError`` unless ``public_raw`` is 32 bytes and the times
    are integers with ``0 <= not_before <= not_after <= 2**53 - 1``.
    """
    if not isinstance(public_raw, bytes) or len(public_raw) != ED25519_PUBLIC_KEY_BYTES:
        raise ValueError("an Ed25519 public key is 32 bytes")
    if not (
        is_json_int(not_before)
        and is_json_int(not_after)
        and 0 <= not_before <= not_after <= MAX_SAFE_INTEGER
    ):
        raise ValueError("need integers 0 <= not_before <= not_after")
    return PublishedKey(key_id_of(public_raw), public_raw, not_before, not_after)


def key_document(keys: Sequence[PublishedKey]) -> bytes:
    """The ``GET /v2/key`` body, in canonical JSON (docs/v2.md, "The key
    document"); not signed."""
    return canonical_json(
        {
            "type": KEYS_TYPE,
            "keys": [
                {
                    "algorithm": KEY_ALGORITHM,
                    "key_id": key.key_id,
                    "public_key": base64.b64encode(key.public_key_raw).decode("ascii"),
                    "not_before": key.not_before,
                    "not_after": key.not_after,
                }
                for key in keys
            ],
        }
    )


def _bad_keys(message: str) -> ProtocolError:
    return ProtocolError(f"malformed v2 key document: {message}", status=502)


def parse_key_document(data: bytes) -> tuple[PublishedKey, ...]:
    """The keys of a ``GET /v2/key`` body, in document order.

    Error handling: ``ProtocolError`` 502 for any defect: not strict UTF-8
    JSON, too large, a missing or unknown field, another algorithm, a public
    key that is not 32 bytes of base64 or not an Ed25519 key, a key id that
    is not the key's (rule S4), a repeated key id, ``not_after <
    not_before``, more than :data:`MAX_PUBLISHED_KEYS` keys. Never another
    exception.
    """
    if not isinstance(data, bytes | bytearray) or len(data) > MAX_KEY_DOCUMENT_BYTES:
        raise _bad_keys("not bytes or too large")
    try:
        document = loads(data)
    except ValueError:
        raise _bad_keys("not strict UTF-8 JSON") from None
    if not isinstance(document, dict) or document.keys() != _KEY_DOCUMENT_KEYS:
        raise _bad_keys("must be an object with type, keys")
    if document["type"] != KEYS_TYPE:
        raise _bad_keys(f"type must be {KEYS_TYPE}")
    rows = document["keys"]
    if not isinstance(rows, list) or len(rows) > MAX_PUBLISHED_KEYS:
        raise _bad_keys(f"keys must be an array of at most {MAX_PUBLISHED_KEYS}")
    keys: list[PublishedKey] = []
    for index, row in enumerate(rows):
        key = _parse_published_key(f"keys[{index}]", row)
        if any(k.key_id == key.key_id for k in keys):
            raise _bad_keys(f"keys[{index}] repeats a key")
        keys.append(key)
    return tuple(keys)


def _parse_published_key(where: str, row: object) -> PublishedKey:
    """One entry of the key document's ``keys``; raises as
    :func:`parse_key_document`."""
    if not isinstance(row, dict) or row.keys() != _PUBLISHED_KEY_KEYS:
        raise _bad_keys(f"{where} must have {', '.join(sorted(_PUBLISHED_KEY_KEYS))}")
    if row["algorithm"] != KEY_ALGORITHM:
        raise _bad_keys(f"{where}.algorithm must be {KEY_ALGORITHM}")
    encoded = row["public_key"]
    try:
        if not isinstance(encoded, str) or len(encoded) > 64:
            raise ValueError
        raw = base64.b64decode(encoded, validate=True)
        key = publish_key(raw, not_before=row["not_before"], not_after=row["not_after"])
        key.public_key()
    except (binascii.Error, ValueError, TypeError):
        raise _bad_keys(f"{where} is not a valid Ed25519 key with its validity") from None
    if row["key_id"] != key.key_id:
        raise _bad_keys(f"{where}.key_id is not the id of its key")
    return key


def trusted_keys(keys: Iterable[PublishedKey], *, now: int) -> dict[str, Ed25519PublicKey]:
    """The ``public_keys`` argument of :func:`notary.protocol.v2.verify_answer`:
    the keys of ``keys`` valid at ``now``, by key id."""
    return {key.key_id: key.public_key() for key in keys if key.is_valid_at(now)}
