"""Canonical JSON: the bytes every v2 signature covers (docs/v2.md, rules
C1-C7)."""

from __future__ import annotations

import json

#: Largest integer magnitude in canonical JSON (rule C1): exact in every JSON
#: implementation, including JavaScript's.
MAX_SAFE_INTEGER = 2**53 - 1
#: Deepest nesting of arrays and objects :func:`canonical_json` encodes; the
#: notary's documents are four levels deep.
MAX_CANONICAL_DEPTH = 16


def canonical_json(value: object) -> bytes:
    """``value`` in canonical JSON (docs/v2.md, rules C1-C7).

    Raises ``TypeError`` for a value of another type (float, bytes, set, a
    non-string key, ...) and ``ValueError`` for an integer out of range, a
    non-ASCII key, a lone surrogate or nesting deeper than
    :data:`MAX_CANONICAL_DEPTH`.
    """
    _check_canonical(value, 0)
    text = json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("strings must be Unicode scalar values (no lone surrogates)") from None


def _check_canonical(value: object, depth: int) -> None:
    """Raise unless ``value`` is in the value subset of rule C1."""
    if value is None or isinstance(value, bool | str):
        return
    if isinstance(value, int):
        if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            raise ValueError("integer out of the range +-(2**53 - 1)")
        return
    if isinstance(value, dict | list | tuple):
        if depth >= MAX_CANONICAL_DEPTH:
            raise ValueError("nesting too deep")
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise TypeError("object keys must be strings")
                if not key.isascii():
                    raise ValueError("object keys must be ASCII")
                _check_canonical(item, depth + 1)
        else:
            for item in value:
                _check_canonical(item, depth + 1)
        return
    raise TypeError(f"{type(value).__name__} has no canonical JSON form")


def is_json_int(value: object) -> bool:
    """True for an ``int`` that is not a ``bool``: a JSON integer once parsed."""
    return isinstance(value, int) and not isinstance(value, bool)
