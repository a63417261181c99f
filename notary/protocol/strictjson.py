"""Strict JSON for what a peer sends (sans-IO): the one loader behind the
v2 parsers (:mod:`notary.protocol.v2`) and the Convergence answer parser
(:func:`notary.protocol.convergence.parse_answer`).

Rules:

1. The input is UTF-8 (no other encoding is guessed).
2. An object repeats no key (:class:`DuplicateKey`): a signed document
   whose parse dropped a member would verify something else than was sent.
3. ``NaN``, ``Infinity`` and ``-Infinity`` are not JSON.
4. An integer literal longer than :data:`MAX_INT_LITERAL_CHARS` is not
   converted (no quadratic parsing of hostile digits): it becomes
   :data:`HUGE_INTEGER`, which no caller accepts as a value.
5. Nesting deeper than the interpreter's recursion limit (about a thousand
   levels; no document here is deeper than five) is a ``ValueError`` like
   any other defect; callers then check exact shapes, which bound the depth
   of what they accept.

Only ``ValueError`` (and its subclass :class:`DuplicateKey`) escapes.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["HUGE_INTEGER", "MAX_INT_LITERAL_CHARS", "DuplicateKey", "HugeInteger", "loads"]

#: A JSON integer literal longer than this is never a valid value here.
MAX_INT_LITERAL_CHARS = 20


class DuplicateKey(ValueError):
    """An object repeats a key (rule 2)."""


class HugeInteger:
    """Stands for an integer literal too long to be a valid value (rule 4)."""

    __slots__ = ()


HUGE_INTEGER = HugeInteger()


def _object_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise DuplicateKey("repeated key")
    return result


def _parse_int(text: str) -> int | HugeInteger:
    return int(text) if len(text) <= MAX_INT_LITERAL_CHARS else HUGE_INTEGER


def _refuse_constant(text: str) -> None:
    raise ValueError("NaN and Infinity are not JSON")


def loads(data: bytes | bytearray) -> object:
    """``data`` parsed under rules 1-5.

    Error handling: ``ValueError`` (``DuplicateKey`` for rule 2) for any
    defect, ``RecursionError`` included; never another exception.
    """
    try:
        text = bytes(data).decode("utf-8")
        return json.loads(
            text,
            object_pairs_hook=_object_without_duplicates,
            parse_int=_parse_int,
            parse_constant=_refuse_constant,
        )
    except RecursionError:
        raise ValueError("nesting too deep") from None
