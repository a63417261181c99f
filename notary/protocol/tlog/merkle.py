"""Merkle Tree hashing, proofs and proof verification (RFC 9162, section
2.1), and the compact range a sequencer appends entries to.

Hashes come from the caller. Every function that reads the tree takes
``perfect``, a :data:`PerfectHash`: ``perfect(level, index)`` returns the
hash of the perfect subtree of height ``level`` over the leaves
``[index << level, (index + 1) << level)`` (level 0: the leaf hashes). The
functions here ask it only for subtrees inside the tree they were given,
O(log n) times per call, and let whatever it raises (a store error, a
:class:`~notary.protocol.tlog.errors.TileError`) propagate.

A *leaf* in this module is a leaf hash, ``leaf_hash(entry)``, 32 bytes;
an *entry* is the logged bytes.

Error handling: a caller's out-of-range sizes or indices are ``ValueError``;
a proof that fails to verify, or that is malformed, is :class:`ProofError`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

from notary.protocol.tlog.errors import ProofError

#: Bytes in a SHA-256 hash, the size of every leaf, node and root hash.
HASH_SIZE = 32
#: Longest proof a tree of fewer than 2**64 leaves can have; longer proofs
#: are rejected before any hashing.
MAX_PROOF_HASHES = 64

_sha256 = hashlib.sha256

#: The root of the empty tree: SHA-256 of nothing (RFC 9162, 2.1.1).
EMPTY_ROOT = _sha256(b"").digest()

PerfectHash = Callable[[int, int], bytes]
"""``perfect(level, index)``: the hash of the perfect subtree of height
``level`` covering leaves ``[index << level, (index + 1) << level)``."""


def leaf_hash(entry: bytes) -> bytes:
    """The hash of a leaf: SHA-256(0x00 || entry)."""
    return _sha256(b"\x00" + entry).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """The hash of an interior node: SHA-256(0x01 || left || right)."""
    return _sha256(b"\x01" + left + right).digest()


def _largest_power_of_two_below(count: int) -> int:
    """RFC 9162's ``k`` for a tree of ``count >= 2`` leaves: the largest
    power of two smaller than ``count``, where MTH splits the tree."""
    return 1 << ((count - 1).bit_length() - 1)


def _check_count(name: str, value: int) -> None:
    if not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer")


def range_hash(start: int, end: int, perfect: PerfectHash) -> bytes:
    """MTH of the leaves ``[start, end)`` taken as a tree of their own
    (:data:`EMPTY_ROOT` when empty), from one perfect subtree per set bit of
    ``end - start``.

    The range must start on a multiple of the largest power of two in
    ``end - start``, so that those subtrees are subtrees of the log's tree:
    every range a root or a proof needs does. Raises ``ValueError`` for any
    other range.
    """
    _check_count("start", start)
    _check_count("end", end)
    if start > end:
        raise ValueError("range start is after its end")
    count = end - start
    if count == 0:
        return EMPTY_ROOT
    if start & ((1 << (count.bit_length() - 1)) - 1):
        raise ValueError("range is not aligned to its largest perfect subtree")
    # Fold right to left, from the smallest subtree (the lowest set bit,
    # ending at ``end``) to the largest (the highest, starting at ``start``).
    lowest = (count & -count).bit_length() - 1
    result = perfect(lowest, (end >> lowest) - 1)
    for level in range(lowest + 1, count.bit_length()):
        if (count >> level) & 1:
            first_leaf = start + ((count >> (level + 1)) << (level + 1))
            result = node_hash(perfect(level, first_leaf >> level), result)
    return result


def root_hash(size: int, perfect: PerfectHash) -> bytes:
    """The root of the tree of the first ``size`` leaves (MTH, RFC 9162
    2.1.1): :data:`EMPTY_ROOT` for 0."""
    return range_hash(0, size, perfect)


def inclusion_proof(index: int, size: int, perfect: PerfectHash) -> list[bytes]:
    """The inclusion proof of leaf ``index`` in the tree of ``size`` leaves:
    RFC 9162's PATH(index, D[0:size]), the sibling hashes from the leaf up
    to the root. Empty for a tree of one leaf.

    Raises ``ValueError`` unless ``0 <= index < size``.
    """
    _check_count("index", index)
    _check_count("size", size)
    if index >= size:
        raise ValueError("leaf index is not in the tree")
    # PATH walks down from the root; collect the siblings top-down, then
    # reverse. Only the first left turn off the right edge has a sibling
    # that is not a perfect subtree.
    proof: list[bytes] = []
    start, count = 0, size
    while count > 1:
        split = _largest_power_of_two_below(count)
        if index < start + split:
            proof.append(range_hash(start + split, start + count, perfect))
            count = split
        else:
            level = split.bit_length() - 1
            proof.append(perfect(level, start >> level))
            start += split
            count -= split
    proof.reverse()
    return proof


def consistency_proof(old_size: int, new_size: int, perfect: PerfectHash) -> list[bytes]:
    """The consistency proof from the tree of ``old_size`` leaves to the tree
    of ``new_size``: RFC 9162's PROOF(old_size, D[0:new_size]).

    RFC 9162 defines PROOF for ``0 < old_size < new_size``. Here, as in
    RFC 9162's own PROOF(m, D[m]), an equal size has the empty proof, and so
    has an empty old tree, which every tree extends; :func:`verify_consistency`
    accepts exactly these. Raises ``ValueError`` unless
    ``0 <= old_size <= new_size``.
    """
    _check_count("old size", old_size)
    _check_count("new size", new_size)
    if old_size > new_size:
        raise ValueError("old tree is larger than the new tree")
    if old_size == 0 or old_size == new_size:
        return []
    # SUBPROOF walks down as PATH does, with ``remaining`` the old tree's
    # leaves in the current subtree; it ends on a subtree that is all old
    # tree, whose hash is in the proof unless it is the whole old tree.
    proof: list[bytes] = []
    start, count, remaining = 0, new_size, old_size
    whole_old_tree = True
    while remaining != count:
        split = _largest_power_of_two_below(count)
        if remaining <= split:
            proof.append(range_hash(start + split, start + count, perfect))
            count = split
        else:
            level = split.bit_length() - 1
            proof.append(perfect(level, start >> level))
            start += split
            count -= split
            remaining -= split
            whole_old_tree = False
    if not whole_old_tree:
        proof.append(range_hash(start, start + count, perfect))
    proof.reverse()
    return proof


def _check_hash(what: str, value: object) -> None:
    if not isinstance(value, bytes | bytearray) or len(value) != HASH_SIZE:
        raise ProofError(f"{what} is not a {HASH_SIZE}-byte hash")


def _check_proof(proof: Sequence[bytes]) -> None:
    if len(proof) > MAX_PROOF_HASHES:
        raise ProofError("proof is too long")
    for element in proof:
        _check_hash("proof element", element)


def verify_inclusion(
    leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes
) -> None:
    """Check that ``proof`` shows leaf hash ``leaf`` at ``index`` in the tree
    of ``size`` leaves whose root is ``root`` (RFC 9162, 2.1.3.2).

    Raises :class:`ProofError` if it does not: ``index >= size``, a hash
    that is not 32 bytes, a proof too short or too long for the tree, or a
    computed root other than ``root``.
    """
    _check_hash("leaf", leaf)
    _check_hash("root", root)
    if not isinstance(index, int) or not isinstance(size, int) or not 0 <= index < size:
        raise ProofError("leaf index is not in the tree")
    _check_proof(proof)
    # fn walks up the leaf's ancestors, sn up the last leaf's: where they
    # meet, the path runs along the tree's right edge.
    fn, sn = index, size - 1
    computed = bytes(leaf)
    for sibling in proof:
        if sn == 0:
            raise ProofError("proof is longer than the path to the root")
        if fn & 1 or fn == sn:
            computed = node_hash(sibling, computed)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            computed = node_hash(computed, sibling)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("proof is shorter than the path to the root")
    if computed != root:
        raise ProofError("proof does not lead to the root")


def verify_consistency(
    old_size: int, new_size: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]
) -> None:
    """Check that ``proof`` shows the tree of ``new_size`` leaves and root
    ``new_root`` extends the tree of ``old_size`` leaves and root
    ``old_root`` (RFC 9162, 2.1.4.2).

    For the cases :func:`consistency_proof` answers with an empty proof, the
    proof must be empty and: equal sizes need equal roots; an old size of 0
    needs ``old_root == EMPTY_ROOT``.

    Raises :class:`ProofError` if it does not verify: ``old_size >
    new_size``, a hash that is not 32 bytes, a proof of the wrong length, or
    a computed root other than the one given.
    """
    _check_hash("old root", old_root)
    _check_hash("new root", new_root)
    if not isinstance(old_size, int) or not isinstance(new_size, int) or old_size < 0:
        raise ProofError("tree sizes must be non-negative integers")
    if old_size > new_size:
        raise ProofError("old tree is larger than the new tree")
    _check_proof(proof)
    if old_size == new_size or old_size == 0:
        if proof:
            raise ProofError("proof must be empty for these tree sizes")
        if old_size == new_size and old_root != new_root:
            raise ProofError("trees of the same size have different roots")
        if old_size == 0 and old_root != EMPTY_ROOT:
            raise ProofError("old root is not the empty tree's")
        return
    if not proof:
        raise ProofError("proof is empty")
    path = list(proof)
    if old_size & (old_size - 1) == 0:
        # The old tree is a perfect subtree of the new one: its root is
        # the first node of the path, and the proof leaves it out.
        path.insert(0, old_root)
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    old_computed = new_computed = bytes(path[0])
    for node in path[1:]:
        if sn == 0:
            raise ProofError("proof is longer than the path to the root")
        if fn & 1 or fn == sn:
            old_computed = node_hash(node, old_computed)
            new_computed = node_hash(node, new_computed)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            new_computed = node_hash(new_computed, node)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("proof is shorter than the path to the root")
    if old_computed != old_root:
        raise ProofError("proof does not lead to the old root")
    if new_computed != new_root:
        raise ProofError("proof does not lead to the new root")


class CompactRange:
    """The right edge of a growing tree: the hashes of its largest perfect
    subtrees, one per set bit of its size, largest (leftmost) first. Enough
    to append leaves and compute the root, in O(log n) memory.

    The sequencer owns one and calls :meth:`append` for every entry, in
    order; each call returns the perfect subtrees the leaf completed, which
    are all the hashes a tile store needs. Not thread-safe.
    """

    __slots__ = ("_hashes", "_size")

    def __init__(self) -> None:
        self._size = 0
        self._hashes: list[bytes] = []

    @classmethod
    def from_tree(cls, size: int, perfect: PerfectHash) -> CompactRange:
        """The compact range of a stored tree of ``size`` leaves, from one
        ``perfect`` call per set bit of ``size``. Raises ``ValueError`` for
        a negative size."""
        _check_count("size", size)
        edge = cls()
        start = 0
        for level in range(size.bit_length() - 1, -1, -1):
            if (size >> level) & 1:
                edge._hashes.append(perfect(level, start >> level))
                start += 1 << level
        edge._size = size
        return edge

    @property
    def size(self) -> int:
        """Leaves appended so far (including those of :meth:`from_tree`)."""
        return self._size

    def subtrees(self) -> list[tuple[int, int, bytes]]:
        """The right edge as ``(level, index, hash)``, largest first."""
        result = []
        start = 0
        hashes = iter(self._hashes)
        for level in range(self._size.bit_length() - 1, -1, -1):
            if (self._size >> level) & 1:
                result.append((level, start >> level, next(hashes)))
                start += 1 << level
        return result

    def append(self, leaf: bytes) -> list[tuple[int, int, bytes]]:
        """Append leaf hash ``leaf`` (``leaf_hash(entry)``, 32 bytes) at
        index :attr:`size`, and return every perfect subtree it completes
        as ``(level, index, hash)``, from ``(0, old size, leaf)`` up.

        Raises ``ValueError`` if ``leaf`` is not 32 bytes; the range is then
        unchanged.
        """
        if len(leaf) != HASH_SIZE:
            raise ValueError(f"a leaf hash is {HASH_SIZE} bytes")
        leaf = bytes(leaf)
        hashes = self._hashes
        index = self._size
        completed = [(0, index, leaf)]
        level = 0
        node = leaf
        # Each trailing one bit of the old size is a left sibling waiting
        # for this leaf's subtree to fill up.
        while index & 1:
            node = _sha256(b"\x01" + hashes.pop() + node).digest()
            index >>= 1
            level += 1
            completed.append((level, index, node))
        hashes.append(node)
        self._size += 1
        return completed

    def root(self) -> bytes:
        """The root of the tree of :attr:`size` leaves."""
        hashes = self._hashes
        if not hashes:
            return EMPTY_ROOT
        result = hashes[-1]
        for left in reversed(hashes[:-1]):
            result = node_hash(left, result)
        return result
