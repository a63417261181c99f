"""RFC 9162 Merkle trees written out in tests as the RFC states them, to
check the project's functions against (section 2.1's recursive definitions
over a plain list of entries: ``rfc_mth``, ``rfc_path``, ``rfc_proof``);
``RfcTree`` gives the project's functions their subtree hashes from
``rfc_mth``."""

from __future__ import annotations

import hashlib

# --- RFC 9162, section 2.1, written out as the RFC states it --------------


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _rfc_k(n: int) -> int:
    """The largest power of two smaller than n (n > 1)."""
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def rfc_leaf(entry: bytes) -> bytes:
    """MTH({d(0)}), section 2.1.1: the hash of one leaf."""
    return _sha256(b"\x00" + entry)


def rfc_mth(entries: list[bytes]) -> bytes:
    """MTH(D[n]), section 2.1.1."""
    n = len(entries)
    if n == 0:
        return _sha256(b"")
    if n == 1:
        return rfc_leaf(entries[0])
    k = _rfc_k(n)
    return _sha256(b"\x01" + rfc_mth(entries[:k]) + rfc_mth(entries[k:]))


def rfc_path(m: int, entries: list[bytes]) -> list[bytes]:
    """PATH(m, D[n]), section 2.1.3.1."""
    n = len(entries)
    if n == 1:
        return []
    k = _rfc_k(n)
    if m < k:
        return [*rfc_path(m, entries[:k]), rfc_mth(entries[k:])]
    return [*rfc_path(m - k, entries[k:]), rfc_mth(entries[:k])]


def _rfc_subproof(m: int, entries: list[bytes], b: bool) -> list[bytes]:
    """SUBPROOF(m, D[n], b), section 2.1.4.1."""
    n = len(entries)
    if m == n:
        return [] if b else [rfc_mth(entries)]
    k = _rfc_k(n)
    if m <= k:
        return [*_rfc_subproof(m, entries[:k], b), rfc_mth(entries[k:])]
    return [*_rfc_subproof(m - k, entries[k:], False), rfc_mth(entries[:k])]


def rfc_proof(m: int, entries: list[bytes]) -> list[bytes]:
    """PROOF(m, D[n]) for 0 < m < n, section 2.1.4.1."""
    return _rfc_subproof(m, entries, True)


class RfcTree:
    """A tree of ``entries`` whose perfect subtree hashes are computed with
    ``rfc_mth``; counts the ``perfect`` calls and rejects a subtree that is
    not inside the first ``size`` leaves."""

    def __init__(self, entries: list[bytes]) -> None:
        self.entries = entries
        self.size = len(entries)
        self.calls = 0
        self._memo: dict[tuple[int, int], bytes] = {}

    def perfect(self, level: int, index: int) -> bytes:
        self.calls += 1
        first, end = index << level, (index + 1) << level
        assert level >= 0 and index >= 0 and end <= self.size, (level, index, self.size)
        key = (level, index)
        if key not in self._memo:
            self._memo[key] = rfc_mth(self.entries[first:end])
        return self._memo[key]


def make_entries(count: int) -> list[bytes]:
    return [b"entry %d" % i for i in range(count)]
