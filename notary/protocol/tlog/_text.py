"""Text checks shared by signed notes and checkpoints: the characters a
note may hold, and strict standard base64."""

from __future__ import annotations

import base64
import binascii
import re

#: ASCII control characters other than newline, which no note may hold.
CONTROL_CHARACTERS = re.compile(r"[\x00-\x09\x0b-\x1f]")
_BASE64 = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?")


def is_note_text(text: str) -> bool:
    """True when ``text`` encodes to UTF-8 (no lone surrogates) and holds
    no control character other than newline."""
    if CONTROL_CHARACTERS.search(text):
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def strict_b64decode(text: str) -> bytes | None:
    """The bytes of standard, padded base64 ``text`` (RFC 4648, section 4)
    in its one canonical form, or ``None``: other characters, missing
    padding, or unused bits that are not zero."""
    if not _BASE64.fullmatch(text):
        return None
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    if base64.b64encode(raw).decode("ascii") != text:
        return None
    return raw
