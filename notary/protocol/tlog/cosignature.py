"""Witness cosignatures (C2SP tlog-cosignature, the Ed25519
``cosignature/v1`` type) and the body of a witness's ``add-checkpoint``
request (C2SP tlog-witness).

A cosignature is one more signature line on a checkpoint's signed note::

    — <witness name> base64(key id || u64 timestamp || Ed25519 signature)

The key id is the first 4 bytes of SHA-256(name || "\\n" || 0x04 || public
key); the timestamp, 8 bytes big-endian, is when the witness signed (POSIX
seconds, below 2**63); the signature covers ``"cosignature/v1\\n"``,
``"time <T>\\n"`` and the whole checkpoint text (extension lines included,
no signature line). It states that, at that time, this checkpoint was the
largest consistent tree head the witness had seen for the log.

A witness's public key travels as a verifier key (vkey) of type 0x04:
``<name>+<hex key id>+base64(0x04 || public key)``.

Because a cosignature is an ordinary signature line, a note carrying the
log's signature and cosignatures opens with
:func:`~notary.protocol.tlog.note.open_note`, given
:func:`cosignature_verifiers` for the witnesses (their lines are verified,
the log's ignored) or the log's verifiers (cosignatures ignored).

Sans-IO: time is a parameter and signing a callable (``sign(message) ->
64-byte signature``); this module holds no key.

Error handling: a malformed key, cosignature or note is
:class:`~notary.protocol.tlog.errors.NoteError`; a malformed add-checkpoint
body is :class:`AddCheckpointError` (the witness answers it 400). A
caller's out-of-range argument (a timestamp of 2**63) is a plain
``ValueError``.

References: c2sp.org/tlog-cosignature, c2sp.org/tlog-witness,
c2sp.org/signed-note (verifier keys).
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from notary.protocol.tlog._text import is_note_text, strict_b64decode
from notary.protocol.tlog.errors import NoteError, TlogError
from notary.protocol.tlog.merkle import HASH_SIZE
from notary.protocol.tlog.note import (
    ED25519_PUBLIC_KEY_BYTES,
    ED25519_SIGNATURE_BYTES,
    KEY_ID_BYTES,
    MAX_NOTE_BYTES,
    Verify,
    is_valid_key_name,
    parse_vkey,
)

__all__ = [
    "COSIGNATURE_TYPE",
    "COSIGNATURE_V1_BYTES",
    "MAX_ADD_CHECKPOINT_BYTES",
    "MAX_ADD_CHECKPOINT_PROOF",
    "MAX_COSIGNATURE_TIMESTAMP",
    "AddCheckpoint",
    "AddCheckpointError",
    "Cosignature",
    "cosign",
    "cosignature_key_id",
    "cosignature_verifier",
    "cosignature_verifiers",
    "cosigned_message",
    "cosigner_key",
    "format_add_checkpoint",
    "parse_add_checkpoint",
    "parse_cosignature_line",
    "parse_cosigner_key",
]

#: The signature type byte of Ed25519 ``cosignature/v1`` keys.
COSIGNATURE_TYPE = 0x04
TIMESTAMP_BYTES = 8
#: A cosignature's bytes after its key id: timestamp and signature.
COSIGNATURE_V1_BYTES = TIMESTAMP_BYTES + ED25519_SIGNATURE_BYTES
#: Largest timestamp a cosignature may carry (the spec: at most 2**63 - 1).
MAX_COSIGNATURE_TIMESTAMP = (1 << 63) - 1
#: Most consistency-proof lines in an add-checkpoint body (the spec's 63).
MAX_ADD_CHECKPOINT_PROOF = 63
#: Largest add-checkpoint body :func:`parse_add_checkpoint` reads: the old
#: size line, a full proof, and a checkpoint note of up to 16 KiB (three
#: lines and a handful of signatures need well under 2 KiB).
MAX_ADD_CHECKPOINT_BYTES = 24 + MAX_ADD_CHECKPOINT_PROOF * 45 + 1 + 16 * 1024

_HEADER = b"cosignature/v1\n"
_SIGNATURE_PREFIX = "\N{EM DASH} "
_LOWER_HEX = frozenset("0123456789abcdef")
_DECIMAL = re.compile(r"0|[1-9][0-9]{0,18}")


class AddCheckpointError(TlogError):
    """An add-checkpoint request body breaks C2SP tlog-witness's format."""


def _check_public_key(public_raw: bytes) -> None:
    if not isinstance(public_raw, bytes) or len(public_raw) != ED25519_PUBLIC_KEY_BYTES:
        raise NoteError(f"an Ed25519 public key is {ED25519_PUBLIC_KEY_BYTES} bytes")


def cosignature_key_id(name: str, public_raw: bytes) -> bytes:
    """The 4-byte key id of a ``cosignature/v1`` key: SHA-256(name || "\\n"
    || 0x04 || public key)[:4]. Raises :class:`NoteError` for an invalid
    name or a key that is not 32 bytes."""
    if not is_valid_key_name(name):
        raise NoteError("invalid key name")
    _check_public_key(public_raw)
    material = name.encode("utf-8") + b"\n" + bytes([COSIGNATURE_TYPE]) + public_raw
    return hashlib.sha256(material).digest()[:KEY_ID_BYTES]


def cosigner_key(name: str, public_raw: bytes) -> str:
    """The verifier key (vkey) of a witness: ``<name>+<hex key
    id>+base64(0x04 || public key)``. Raises as :func:`cosignature_key_id`."""
    key_id = cosignature_key_id(name, public_raw)
    material = base64.b64encode(bytes([COSIGNATURE_TYPE]) + public_raw).decode("ascii")
    return f"{name}+{key_id.hex()}+{material}"


def parse_cosigner_key(text: str) -> tuple[str, bytes, bytes]:
    """``(name, key id, raw public key)`` of a witness's vkey.

    Strict: raises :class:`NoteError` for an invalid name, a key id that is
    not 8 lower-case hex digits or not the key's, base64 that is not
    canonical, a type other than 0x04 (an Ed25519 signed-note key, type
    0x01, is refused rather than converted: it names a log, not a
    witness), or a key that is not 32 bytes.
    """
    return parse_vkey(
        text, what="witness key", key_type=COSIGNATURE_TYPE,
        type_name="an Ed25519 cosignature/v1 key (type 0x04)", key_id_of=cosignature_key_id,
    )


def _check_timestamp(timestamp: int) -> None:
    if (
        not isinstance(timestamp, int)
        or isinstance(timestamp, bool)
        or not 0 <= timestamp <= MAX_COSIGNATURE_TIMESTAMP
    ):
        raise ValueError("a cosignature's timestamp is an integer from 0 to 2**63 - 1")


def cosigned_message(text: str | bytes, timestamp: int) -> bytes:
    """What a ``cosignature/v1`` signs: ``cosignature/v1``, ``time <T>``
    and the checkpoint's note text (each line ending in a newline).
    ``ValueError`` for a timestamp out of range."""
    _check_timestamp(timestamp)
    body = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    return _HEADER + b"time %d\n" % timestamp + body


@dataclass(frozen=True, slots=True)
class Cosignature:
    """One cosignature line, parsed: the witness's key ``name`` and
    ``key_id``, its ``timestamp`` and its 64-byte ``signature``."""

    name: str
    key_id: bytes
    timestamp: int
    signature: bytes

    def line(self) -> str:
        """The signature line, ending in a newline."""
        raw = self.key_id + self.timestamp.to_bytes(TIMESTAMP_BYTES, "big") + self.signature
        return f"{_SIGNATURE_PREFIX}{self.name} {base64.b64encode(raw).decode('ascii')}\n"


def cosign(
    text: str, name: str, sign: Callable[[bytes], bytes], public_raw: bytes, timestamp: int
) -> str:
    """The cosignature line (ending in a newline) of a witness named
    ``name`` with key ``public_raw`` on the checkpoint note text ``text``,
    signed by ``sign`` at ``timestamp``.

    Raises :class:`NoteError` if ``text`` is not a note text (ends in a
    newline, UTF-8, no control character) or ``sign`` does not return 64
    bytes; ``ValueError`` for a timestamp out of range. Whatever ``sign``
    raises propagates.
    """
    if not isinstance(text, str) or not text.endswith("\n") or not is_note_text(text):
        raise NoteError("a cosigned text is note text ending in a newline")
    key_id = cosignature_key_id(name, public_raw)
    signature = sign(cosigned_message(text, timestamp))
    if not isinstance(signature, bytes) or len(signature) != ED25519_SIGNATURE_BYTES:
        raise NoteError(f"an Ed25519 signature is {ED25519_SIGNATURE_BYTES} bytes")
    return Cosignature(name, key_id, timestamp, signature).line()


def parse_cosignature_line(line: str) -> Cosignature:
    """The parts of one ``cosignature/v1`` signature line (with or without
    its final newline), unverified. Raises :class:`NoteError` unless it is
    ``— <name> base64(4 + 8 + 64 bytes)`` with a timestamp below 2**63."""
    if not isinstance(line, str):
        raise NoteError("a signature line is a string")
    if line.endswith("\n"):
        line = line[:-1]
    if not line.startswith(_SIGNATURE_PREFIX):
        raise NoteError("signature line does not start with an em dash and a space")
    name, space, encoded = line[len(_SIGNATURE_PREFIX):].partition(" ")
    if not space or not is_valid_key_name(name):
        raise NoteError("signature line has an invalid key name")
    raw = strict_b64decode(encoded)
    if raw is None or len(raw) != KEY_ID_BYTES + COSIGNATURE_V1_BYTES:
        raise NoteError("signature line is not a cosignature/v1")
    timestamp = int.from_bytes(raw[KEY_ID_BYTES:KEY_ID_BYTES + TIMESTAMP_BYTES], "big")
    if timestamp > MAX_COSIGNATURE_TIMESTAMP:
        raise NoteError("cosignature timestamp is not below 2**63")
    return Cosignature(name, raw[:KEY_ID_BYTES], timestamp, raw[KEY_ID_BYTES + TIMESTAMP_BYTES:])


def cosignature_verifier(public_raw: bytes, *, not_after: int | None = None) -> Verify:
    """A ``verify(message, signature) -> bool`` for one witness key, for
    :func:`~notary.protocol.tlog.note.open_note`: ``message`` is the note
    text, ``signature`` the bytes after the key id (timestamp and
    signature). ``not_after``: refuse timestamps later than this (the
    spec lets a verifier refuse cosignatures from the future). Raises
    :class:`NoteError` if ``public_raw`` is not an Ed25519 public key."""
    _check_public_key(public_raw)
    try:
        public_key = Ed25519PublicKey.from_public_bytes(public_raw)
    except ValueError:
        raise NoteError("not an Ed25519 public key") from None

    def verify(message: bytes, signature: bytes) -> bool:
        if len(signature) != COSIGNATURE_V1_BYTES:
            return False
        timestamp = int.from_bytes(signature[:TIMESTAMP_BYTES], "big")
        if timestamp > MAX_COSIGNATURE_TIMESTAMP:
            return False
        if not_after is not None and timestamp > not_after:
            return False
        try:
            public_key.verify(
                signature[TIMESTAMP_BYTES:], cosigned_message(message, timestamp)
            )
        except InvalidSignature:
            return False
        return True

    return verify


def cosignature_verifiers(
    vkeys: Iterable[str], *, not_after: int | None = None
) -> dict[tuple[str, bytes], Verify]:
    """The ``verifiers`` argument of ``open_note`` for witness vkeys
    (:func:`parse_cosigner_key`). Raises :class:`NoteError` for a malformed
    key or two keys with the same name and key id."""
    verifiers: dict[tuple[str, bytes], Verify] = {}
    for vkey in vkeys:
        name, key_id, public_raw = parse_cosigner_key(vkey)
        if (name, key_id) in verifiers:
            raise NoteError("two witness keys share a name and key id")
        verifiers[name, key_id] = cosignature_verifier(public_raw, not_after=not_after)
    return verifiers


# -- the add-checkpoint request body (c2sp.org/tlog-witness) --------------------


@dataclass(frozen=True, slots=True)
class AddCheckpoint:
    """An add-checkpoint request: the size the submitter believes the
    witness holds (``old_size``), a consistency proof from it to the
    checkpoint, and the checkpoint's signed note (unverified text)."""

    old_size: int
    proof: tuple[bytes, ...]
    note: str


def format_add_checkpoint(old_size: int, proof: Sequence[bytes], note: str) -> bytes:
    """The body of an add-checkpoint request: ``old <size>``, one base64
    hash a line, an empty line, then the signed note. ``ValueError`` for a
    negative size, more than 63 hashes, a hash that is not 32 bytes or a
    note that does not end in a newline."""
    if isinstance(old_size, bool) or not isinstance(old_size, int) or not 0 <= old_size < 1 << 63:
        raise ValueError("old size must be an integer from 0 to 2**63 - 1")
    if len(proof) > MAX_ADD_CHECKPOINT_PROOF:
        raise ValueError(f"at most {MAX_ADD_CHECKPOINT_PROOF} proof hashes")
    if any(not isinstance(node, bytes) or len(node) != HASH_SIZE for node in proof):
        raise ValueError(f"proof hashes are {HASH_SIZE} bytes")
    if not isinstance(note, str) or not note.endswith("\n"):
        raise ValueError("a signed note ends in a newline")
    lines = [f"old {old_size}", *(base64.b64encode(node).decode("ascii") for node in proof), ""]
    return ("\n".join(lines) + "\n" + note).encode("utf-8")


def parse_add_checkpoint(body: bytes) -> AddCheckpoint:
    """The request in an add-checkpoint ``body``, strictly.

    Raises :class:`AddCheckpointError` if the body is larger than
    :data:`MAX_ADD_CHECKPOINT_BYTES` or not UTF-8; its first line is not
    ``old <size>`` (decimal, no leading zero, below 2**63); more than 63
    lines follow before the empty line, or one is not canonical base64 of a
    32-byte hash; no empty line ends the proof; or nothing follows it. The
    note is returned as text, neither parsed nor verified (``open_note``).
    """
    if not isinstance(body, bytes | bytearray) or len(body) > MAX_ADD_CHECKPOINT_BYTES:
        raise AddCheckpointError(f"body is larger than {MAX_ADD_CHECKPOINT_BYTES} bytes")
    try:
        text = bytes(body).decode("utf-8")
    except UnicodeDecodeError:
        raise AddCheckpointError("body is not UTF-8") from None
    head, blank, note = text.partition("\n\n")
    if not blank:
        raise AddCheckpointError("no empty line before the checkpoint")
    lines = head.split("\n")
    size_line, proof_lines = lines[0], lines[1:]
    if not size_line.startswith("old "):
        raise AddCheckpointError("first line is not 'old <size>'")
    size_text = size_line[4:]
    if not _DECIMAL.fullmatch(size_text) or int(size_text) >= 1 << 63:
        raise AddCheckpointError("old size is not a decimal number below 2**63")
    if len(proof_lines) > MAX_ADD_CHECKPOINT_PROOF:
        raise AddCheckpointError(f"more than {MAX_ADD_CHECKPOINT_PROOF} proof lines")
    proof = []
    for line in proof_lines:
        node = strict_b64decode(line)
        if node is None or len(node) != HASH_SIZE:
            raise AddCheckpointError("a proof line is not base64 of a 32-byte hash")
        proof.append(node)
    if not note:
        raise AddCheckpointError("no checkpoint after the empty line")
    if len(note.encode("utf-8")) > MAX_NOTE_BYTES:  # pragma: no cover - bounded above
        raise AddCheckpointError("checkpoint is too large")
    return AddCheckpoint(int(size_text), tuple(proof), note)
