"""Signed notes (C2SP signed-note) with Ed25519 signatures (type 0x01):
signing, opening and verifier keys.

A signed note is a text ending in a newline, an empty line, and one or
more signature lines ``— <key name> base64(key id || signature)``. A key is
known by its name and 4-byte key id together; signatures by unknown keys
are ignored, as the spec requires, so a note may carry cosignatures of
types this module does not verify.

Signing is a callable the caller passes (``sign(message) -> signature``,
e.g. ``Ed25519PrivateKey.sign``): this module never sees a private key.

Error handling: everything wrong with a note, a verifier key or the text
to sign is :class:`NoteError`, with a short message.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Iterable, Mapping

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from notary.protocol.tlog._text import is_note_text, strict_b64decode
from notary.protocol.tlog.errors import NoteError

#: The signature type byte of Ed25519 signatures (C2SP signed-note).
ED25519_SIGNATURE_TYPE = 0x01
ED25519_PUBLIC_KEY_BYTES = 32
ED25519_SIGNATURE_BYTES = 64
KEY_ID_BYTES = 4
#: Largest note :func:`open_note` reads, in UTF-8 bytes: room for the most
#: signatures below, even post-quantum ones of nearly 5 kB.
MAX_NOTE_BYTES = 256 * 1024
#: Most signature lines :func:`open_note` reads (the spec: at least 16).
MAX_NOTE_SIGNATURES = 32
#: Longest verifier key text :func:`parse_verifier_key` reads.
MAX_VERIFIER_KEY_CHARS = 1024

_SIGNATURE_PREFIX = "\N{EM DASH} "
_LOWER_HEX = frozenset("0123456789abcdef")

Verify = Callable[[bytes, bytes], bool]
"""``verify(message, signature) -> bool``: whether ``signature`` (without
the key id) is a valid signature of ``message`` by one key."""


def _short(value: str) -> str:
    """``value`` for an error message: quoted, and cut if long."""
    return repr(value if len(value) <= 40 else value[:40] + "...")


def is_valid_key_name(name: str) -> bool:
    """A key name is not empty, encodes to UTF-8, and holds no Unicode
    space, no plus and no control character."""
    return (
        isinstance(name, str)
        and name != ""
        and "+" not in name
        and not any(c.isspace() for c in name)
        and is_note_text(name)
    )


def _check_public_key(public_raw: bytes) -> None:
    if not isinstance(public_raw, bytes) or len(public_raw) != ED25519_PUBLIC_KEY_BYTES:
        raise NoteError(f"an Ed25519 public key is {ED25519_PUBLIC_KEY_BYTES} bytes")


def ed25519_key_id(name: str, public_raw: bytes) -> bytes:
    """The 4-byte key id of an Ed25519 key: the first 4 bytes of
    SHA-256(name || "\\n" || 0x01 || public key). Raises
    :class:`NoteError` for an invalid name or a key that is not 32 bytes."""
    if not is_valid_key_name(name):
        raise NoteError("invalid key name")
    _check_public_key(public_raw)
    material = name.encode("utf-8") + b"\n" + bytes([ED25519_SIGNATURE_TYPE]) + public_raw
    return hashlib.sha256(material).digest()[:KEY_ID_BYTES]


def verifier_key(name: str, public_raw: bytes) -> str:
    """The verifier key (vkey) text of an Ed25519 key:
    ``<name>+<hex key id>+<base64(0x01 || public key)>``. Raises as
    :func:`ed25519_key_id`."""
    key_id = ed25519_key_id(name, public_raw)
    material = base64.b64encode(bytes([ED25519_SIGNATURE_TYPE]) + public_raw).decode("ascii")
    return f"{name}+{key_id.hex()}+{material}"


def parse_verifier_key(text: str) -> tuple[str, bytes, bytes]:
    """``(name, key id, raw public key)`` of an Ed25519 verifier key.

    Raises :class:`NoteError` for an invalid name, a key id that is not 8
    lower-case hex digits or not the key's, base64 that is not strict, a
    signature type other than Ed25519, or a key that is not 32 bytes.
    """
    return parse_vkey(
        text, what="verifier key", key_type=ED25519_SIGNATURE_TYPE,
        type_name="an Ed25519 key", key_id_of=ed25519_key_id,
    )


def parse_vkey(
    text: str, *, what: str, key_type: int, type_name: str,
    key_id_of: Callable[[str, bytes], bytes],
) -> tuple[str, bytes, bytes]:
    """``name+hex8+base64(type || key)`` of any signed-note key type (the
    verifier keys of logs, type 0x01; of witnesses, 0x04): (name, key id,
    raw Ed25519 public key). ``what`` and ``type_name`` word the errors;
    ``key_id_of(name, public_raw)`` is the type's key id. ``NoteError``
    for anything else."""
    if not isinstance(text, str) or len(text) > MAX_VERIFIER_KEY_CHARS:
        raise NoteError(f"malformed {what}")
    name, _, rest = text.partition("+")
    key_id_hex, _, material_b64 = rest.partition("+")
    if not is_valid_key_name(name):
        raise NoteError(f"{what} has an invalid name")
    if len(key_id_hex) != 2 * KEY_ID_BYTES or not set(key_id_hex) <= _LOWER_HEX:
        raise NoteError(f"{what} id is not 8 lower-case hex digits")
    material = strict_b64decode(material_b64)
    if not material:
        raise NoteError(f"{what} material is not base64")
    if material[0] != key_type:
        raise NoteError(f"{what} is not {type_name}")
    public_raw = material[1:]
    if len(public_raw) != ED25519_PUBLIC_KEY_BYTES:
        raise NoteError(f"{what} is not 32 bytes")
    key_id = bytes.fromhex(key_id_hex)
    if key_id != key_id_of(name, public_raw):
        raise NoteError(f"{what} id does not match its key")
    return name, key_id, public_raw


def ed25519_verifier(public_raw: bytes) -> Verify:
    """A ``verify(message, signature) -> bool`` for one Ed25519 public key,
    for :func:`open_note`. Raises :class:`NoteError` if ``public_raw`` is
    not a 32-byte Ed25519 public key."""
    _check_public_key(public_raw)
    try:
        public_key = Ed25519PublicKey.from_public_bytes(public_raw)
    except ValueError:
        raise NoteError("not an Ed25519 public key") from None

    def verify(message: bytes, signature: bytes) -> bool:
        if len(signature) != ED25519_SIGNATURE_BYTES:
            return False
        try:
            public_key.verify(signature, message)
        except InvalidSignature:
            return False
        return True

    return verify


def ed25519_verifiers(vkeys: Iterable[str]) -> dict[tuple[str, bytes], Verify]:
    """The ``verifiers`` argument of :func:`open_note` for Ed25519 verifier
    keys. Raises :class:`NoteError` for a malformed key, or two keys with
    the same name and key id."""
    verifiers: dict[tuple[str, bytes], Verify] = {}
    for vkey in vkeys:
        name, key_id, public_raw = parse_verifier_key(vkey)
        if (name, key_id) in verifiers:
            raise NoteError(f"two verifier keys named {_short(name)} share a key id")
        verifiers[name, key_id] = ed25519_verifier(public_raw)
    return verifiers


def _check_note_text(text: str) -> None:
    """The rules for the text part of a note; raises :class:`NoteError`."""
    if not text.endswith("\n"):
        raise NoteError("note text must end in a newline")
    if not text.strip("\n"):
        raise NoteError("note text is empty")
    if not is_note_text(text):
        raise NoteError("note text holds a control character or is not UTF-8")


def sign_note(text: str, name: str, sign: Callable[[bytes], bytes], public_raw: bytes) -> str:
    """The signed note of ``text`` with one Ed25519 signature by key
    ``name`` (public key ``public_raw``): ``text``, an empty line, and
    ``— name base64(key id || sign(text))``.

    Raises :class:`NoteError` if ``text`` does not end in a newline, has no
    line with content, holds a control character other than newline, or is
    not UTF-8; if the name or key is invalid; if ``sign`` does not return
    64 bytes; or if the note would be larger than :func:`open_note` reads.
    Whatever ``sign`` raises propagates.
    """
    if not isinstance(text, str):
        raise NoteError("note text must be a string")
    _check_note_text(text)
    key_id = ed25519_key_id(name, public_raw)
    signature = sign(text.encode("utf-8"))
    if not isinstance(signature, bytes) or len(signature) != ED25519_SIGNATURE_BYTES:
        raise NoteError(f"an Ed25519 signature is {ED25519_SIGNATURE_BYTES} bytes")
    encoded = base64.b64encode(key_id + signature).decode("ascii")
    note = f"{text}\n{_SIGNATURE_PREFIX}{name} {encoded}\n"
    if len(note.encode("utf-8")) > MAX_NOTE_BYTES:
        raise NoteError(f"signed note is larger than {MAX_NOTE_BYTES} bytes")
    return note


def open_note(
    note: str | bytes, verifiers: Mapping[tuple[str, bytes], Verify]
) -> tuple[str, list[str]]:
    """The text of a signed note and the names of the known keys whose
    signatures on it verified (each name once, in note order).

    ``note`` is the note's text, or its UTF-8 bytes as received.
    ``verifiers`` maps ``(key name, key id)`` to a ``verify(message,
    signature)``; see :func:`ed25519_verifiers`. Each signature by a known
    key is verified, repeated ones too; signatures by other keys are
    ignored.

    Raises :class:`NoteError` if the note is malformed (larger than
    :data:`MAX_NOTE_BYTES`, not UTF-8, a control character other than
    newline, no empty line before the signatures, an empty text, a
    signature line that is not ``— <name> <base64>`` with at least 5 bytes
    of signature, more than :data:`MAX_NOTE_SIGNATURES` of them), if a
    signature by a known key does not verify, or if no known key signed.
    Whatever a ``verify`` raises propagates.
    """
    text, verified, _known = _open_note(note, verifiers)
    return text, verified


def known_signatures_only(
    note: str | bytes, verifiers: Mapping[tuple[str, bytes], Verify]
) -> tuple[str, str]:
    """The text of a signed note, and the note reduced to what
    :func:`open_note` verifies: the text, the empty line, and the signature
    lines of known keys (each verified), in note order; the lines of other
    keys, which nothing checked, are left out. What a client keeps of a
    note it verified.

    Raises :class:`NoteError` as :func:`open_note`.
    """
    text, _verified, known = _open_note(note, verifiers)
    return text, text + "\n" + "".join(line + "\n" for line in known)


def _open_note(
    note: str | bytes, verifiers: Mapping[tuple[str, bytes], Verify]
) -> tuple[str, list[str], list[str]]:
    """:func:`open_note`'s work: the text, the names of the known keys that
    signed (each once), and the signature lines of known keys (each)."""
    if isinstance(note, bytes | bytearray):
        if len(note) > MAX_NOTE_BYTES:
            raise NoteError(f"note is larger than {MAX_NOTE_BYTES} bytes")
        try:
            note = bytes(note).decode("utf-8")
        except UnicodeDecodeError:
            raise NoteError("note is not UTF-8") from None
    elif not isinstance(note, str):
        raise NoteError("a note is a string or bytes")
    # A character is at least one byte: the cheap check first.
    if len(note) > MAX_NOTE_BYTES or len(note.encode("utf-8", "surrogatepass")) > MAX_NOTE_BYTES:
        raise NoteError(f"note is larger than {MAX_NOTE_BYTES} bytes")
    if not is_note_text(note):
        raise NoteError("note holds a control character or is not UTF-8")
    # The last empty line separates the text from the signatures; the text
    # keeps its final newline.
    split = note.rfind("\n\n")
    if split < 0:
        raise NoteError("note has no empty line before its signatures")
    text, signature_block = note[: split + 1], note[split + 2 :]
    _check_note_text(text)
    if not signature_block.endswith("\n"):
        raise NoteError("note must end in a newline")
    lines = signature_block[:-1].split("\n")
    if len(lines) > MAX_NOTE_SIGNATURES:
        raise NoteError(f"note has more than {MAX_NOTE_SIGNATURES} signatures")
    message = text.encode("utf-8")
    verified: list[str] = []
    known: list[str] = []
    for line in lines:
        name, key_id, signature = _parse_signature_line(line)
        verify = verifiers.get((name, key_id))
        if verify is None:
            continue
        if not verify(message, signature):
            raise NoteError(f"invalid signature by known key {_short(name)}")
        known.append(line)
        if name not in verified:
            verified.append(name)
    if not verified:
        raise NoteError("note is not signed by a known key")
    return text, verified, known


def _parse_signature_line(line: str) -> tuple[str, bytes, bytes]:
    """``(name, key id, signature)`` of one signature line, without its
    newline; raises :class:`NoteError`."""
    if not line.startswith(_SIGNATURE_PREFIX):
        raise NoteError("signature line does not start with an em dash and a space")
    name, space, encoded = line[len(_SIGNATURE_PREFIX) :].partition(" ")
    if not space or not is_valid_key_name(name):
        raise NoteError("signature line has an invalid key name")
    raw = strict_b64decode(encoded)
    if raw is None or len(raw) <= KEY_ID_BYTES:
        raise NoteError("signature line has no valid base64 signature")
    return name, raw[:KEY_ID_BYTES], raw[KEY_ID_BYTES:]
