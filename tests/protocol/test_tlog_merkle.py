"""RFC 9162 Merkle trees: hashing, proofs, their verification, CompactRange.

Everything is compared with an independent implementation written straight
from RFC 9162 section 2.1's recursive definitions (``rfc_mth``,
``rfc_path``, ``rfc_proof`` in ``tests.support.merkle``) over a plain list
of entries, and with the published RFC 6962 test vectors
(transparency-dev/merkle, testonly/constants.go and proof/verify_test.go).
The project's functions get their hashes from ``RfcTree.perfect``, which
computes every subtree from the entries with ``rfc_mth`` and refuses
subtrees outside the tree.
"""

from __future__ import annotations

import hashlib
import itertools

import pytest

from notary.protocol.tlog import (
    EMPTY_ROOT,
    MAX_PROOF_HASHES,
    CompactRange,
    ProofError,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    node_hash,
    range_hash,
    root_hash,
    verify_consistency,
    verify_inclusion,
)
from tests.support.merkle import RfcTree, make_entries, rfc_mth, rfc_path, rfc_proof

MAX_SIZE = 70
ENTRIES = make_entries(MAX_SIZE)


@pytest.fixture(scope="module")
def trees() -> dict[int, RfcTree]:
    return {size: RfcTree(ENTRIES[:size]) for size in range(MAX_SIZE + 1)}


@pytest.fixture(scope="module")
def roots() -> dict[int, bytes]:
    return {size: rfc_mth(ENTRIES[:size]) for size in range(MAX_SIZE + 1)}


def flip(data: bytes, bit: int = 3) -> bytes:
    return bytes([data[0] ^ (1 << bit)]) + data[1:]


# --- Known answers ----------------------------------------------------------

# transparency-dev/merkle testonly/constants.go: the RFC 6962 leaves and
# the root of each tree size 0..8, and the node hashes by level.
VECTOR_ENTRIES = [
    bytes.fromhex(h)
    for h in [
        "",
        "00",
        "10",
        "2021",
        "3031",
        "40414243",
        "5051525354555657",
        "606162636465666768696a6b6c6d6e6f",
    ]
]
VECTOR_ROOTS = [
    bytes.fromhex(h)
    for h in [
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
        "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
        "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
        "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
        "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
        "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
        "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
    ]
]
VECTOR_NODES = {
    (0, 1): "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
    (0, 4): "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
    (0, 6): "b08693ec2e721597130641e8211e7eedccb4c26413963eee6c1e2ed16ffb1a5f",
    (1, 1): "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
    (1, 2): "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
    (1, 3): "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
    (2, 0): "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    (2, 1): "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
}
# proof/verify_test.go, with 0-based leaf indices.
VECTOR_INCLUSION = [
    (0, 8, ["96a296d2", "5f083f0a", "6b47aaf2"]),
    (5, 8, ["bc1a0643", "ca854ea1", "d37ee418"]),
    (2, 3, ["fac54203"]),
    (1, 5, ["6e340b9c", "5f083f0a", "bc1a0643"]),
]
VECTOR_CONSISTENCY = [
    (1, 8, ["96a296d2", "5f083f0a", "6b47aaf2"]),
    (6, 8, ["0ebc5d34", "ca854ea1", "d37ee418"]),
    (2, 5, ["5f083f0a", "bc1a0643"]),
    (6, 7, ["0ebc5d34", "b08693ec", "d37ee418"]),
]


def test_empty_root_is_sha256_of_nothing() -> None:
    assert EMPTY_ROOT.hex() == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert root_hash(0, lambda level, index: pytest.fail("no subtree in an empty tree")) == (
        EMPTY_ROOT
    )


def test_hashes_have_the_rfc_prefixes() -> None:
    assert leaf_hash(b"abc") == hashlib.sha256(b"\x00abc").digest()
    assert (
        node_hash(b"L" * 32, b"R" * 32) == hashlib.sha256(b"\x01" + b"L" * 32 + b"R" * 32).digest()
    )
    assert leaf_hash(b"") == VECTOR_ROOTS[1]


def test_roots_and_nodes_match_the_published_vectors() -> None:
    tree = RfcTree(VECTOR_ENTRIES)
    for size, expected in enumerate(VECTOR_ROOTS):
        assert root_hash(size, tree.perfect) == expected
        assert rfc_mth(VECTOR_ENTRIES[:size]) == expected
    for (level, index), expected in VECTOR_NODES.items():
        assert tree.perfect(level, index).hex() == expected


def _expand(prefixes: list[str]) -> list[bytes]:
    """The published hashes the 8-hex-digit prefixes name."""
    known = [*VECTOR_ROOTS, *(bytes.fromhex(h) for h in VECTOR_NODES.values())]
    known += [leaf_hash(entry) for entry in VECTOR_ENTRIES]
    return [next(h for h in known if h.hex().startswith(prefix)) for prefix in prefixes]


@pytest.mark.parametrize(("index", "size", "prefixes"), VECTOR_INCLUSION)
def test_inclusion_proofs_match_the_published_vectors(
    index: int, size: int, prefixes: list[str]
) -> None:
    tree = RfcTree(VECTOR_ENTRIES[:size])
    expected = _expand(prefixes)
    assert inclusion_proof(index, size, tree.perfect) == expected
    verify_inclusion(leaf_hash(VECTOR_ENTRIES[index]), index, size, expected, VECTOR_ROOTS[size])


@pytest.mark.parametrize(("old", "new", "prefixes"), VECTOR_CONSISTENCY)
def test_consistency_proofs_match_the_published_vectors(
    old: int, new: int, prefixes: list[str]
) -> None:
    tree = RfcTree(VECTOR_ENTRIES[:new])
    expected = _expand(prefixes)
    assert consistency_proof(old, new, tree.perfect) == expected
    verify_consistency(old, new, VECTOR_ROOTS[old], VECTOR_ROOTS[new], expected)


# --- Against the RFC's definitions, every size up to MAX_SIZE ---------------


def _log2_bound(size: int) -> int:
    """The O(log n) bound the brief sets for ``perfect`` calls per proof."""
    return 2 * size.bit_length() + 1


def test_root_hash_is_mth_for_every_size(
    trees: dict[int, RfcTree], roots: dict[int, bytes]
) -> None:
    for size in range(MAX_SIZE + 1):
        tree = trees[size]
        tree.calls = 0
        assert root_hash(size, tree.perfect) == roots[size]
        assert tree.calls == size.bit_count()


def test_range_hash_is_mth_of_every_aligned_range(trees: dict[int, RfcTree]) -> None:
    tree = trees[MAX_SIZE]
    checked = 0
    for start, end in itertools.combinations_with_replacement(range(MAX_SIZE + 1), 2):
        count = end - start
        aligned = count == 0 or start % (1 << (count.bit_length() - 1)) == 0
        if aligned:
            assert range_hash(start, end, tree.perfect) == rfc_mth(ENTRIES[start:end])
            checked += 1
        else:
            with pytest.raises(ValueError):
                range_hash(start, end, tree.perfect)
    assert checked > MAX_SIZE * 4


def test_range_hash_rejects_bad_ranges(trees: dict[int, RfcTree]) -> None:
    for start, end in [(-1, 3), (3, 2), (0, -1)]:
        with pytest.raises(ValueError):
            range_hash(start, end, trees[8].perfect)


def test_inclusion_proof_is_path_for_every_leaf_of_every_size(
    trees: dict[int, RfcTree], roots: dict[int, bytes]
) -> None:
    for size in range(1, MAX_SIZE + 1):
        tree = trees[size]
        for index in range(size):
            tree.calls = 0
            proof = inclusion_proof(index, size, tree.perfect)
            assert tree.calls <= _log2_bound(size)
            expected = rfc_path(index, ENTRIES[:size])
            assert proof == expected, (index, size)
            verify_inclusion(leaf_hash(ENTRIES[index]), index, size, expected, roots[size])


def test_consistency_proof_is_proof_for_every_pair_of_sizes(
    trees: dict[int, RfcTree], roots: dict[int, bytes]
) -> None:
    for new in range(1, MAX_SIZE + 1):
        tree = trees[new]
        for old in range(1, new + 1):
            tree.calls = 0
            proof = consistency_proof(old, new, tree.perfect)
            assert tree.calls <= _log2_bound(new)
            if old == new:
                assert proof == []
            else:
                expected = rfc_proof(old, ENTRIES[:new])
                assert proof == expected, (old, new)
            verify_consistency(old, new, roots[old], roots[new], proof)


def test_proofs_from_an_empty_old_tree_or_to_the_same_size_are_empty(
    trees: dict[int, RfcTree], roots: dict[int, bytes]
) -> None:
    for size in range(MAX_SIZE + 1):
        assert consistency_proof(0, size, trees[size].perfect) == []
        assert consistency_proof(size, size, trees[size].perfect) == []
        verify_consistency(0, size, EMPTY_ROOT, roots[size], [])
        verify_consistency(size, size, roots[size], roots[size], [])


@pytest.mark.parametrize(("index", "size"), [(0, 0), (3, 3), (4, 3), (-1, 3)])
def test_inclusion_proof_rejects_a_leaf_outside_the_tree(
    trees: dict[int, RfcTree], index: int, size: int
) -> None:
    with pytest.raises(ValueError):
        inclusion_proof(index, size, trees[max(size, 0)].perfect)


@pytest.mark.parametrize(("old", "new"), [(4, 3), (-1, 3), (1, -1)])
def test_consistency_proof_rejects_bad_sizes(trees: dict[int, RfcTree], old: int, new: int) -> None:
    with pytest.raises(ValueError):
        consistency_proof(old, new, trees[8].perfect)


def test_a_failing_perfect_propagates() -> None:
    class StoreDown(Exception):
        pass

    def perfect(level: int, index: int) -> bytes:
        raise StoreDown

    with pytest.raises(StoreDown):
        inclusion_proof(1, 5, perfect)
    with pytest.raises(StoreDown):
        CompactRange.from_tree(5, perfect)


# --- Verification rejects every corruption ----------------------------------

SOME_HASH = bytes.fromhex("abacaba000000000000000000000000000000000000000000060061e00123456")
VERIFY_SIZES = range(1, 41)


def _inclusion_corruptions(
    leaf: bytes, index: int, size: int, proof: list[bytes], root: bytes, roots: dict[int, bytes]
):
    """(description, arguments) of verify_inclusion calls that must fail."""
    yield "index - 1", (leaf, index - 1, size, proof, root)
    yield "index + 1", (leaf, index + 1, size, proof, root)
    yield "index ^ 2", (leaf, index ^ 2, size, proof, root)
    yield "size * 2", (leaf, index, size * 2, proof, root)
    yield "size // 2", (leaf, index, size // 2, proof, root)
    if size + 1 in roots:
        yield "size + 1 with its root", (leaf, index, size + 1, proof, roots[size + 1])
    yield "size 0", (leaf, index, 0, proof, root)
    yield "wrong leaf", (SOME_HASH, index, size, proof, root)
    yield "leaf is the entry", (ENTRIES[index].ljust(32, b"\0"), index, size, proof, root)
    yield "empty root", (leaf, index, size, proof, EMPTY_ROOT)
    yield "other root", (leaf, index, size, proof, SOME_HASH)
    yield "trailing root", (leaf, index, size, [*proof, root], root)
    yield "trailing hash", (leaf, index, size, [*proof, SOME_HASH], root)
    yield "leading root", (leaf, index, size, [root, *proof], root)
    yield "trailing garbage", (leaf, index, size, [*proof, b""], root)
    if proof:
        yield "truncated", (leaf, index, size, proof[:-1], root)
        yield "first element dropped", (leaf, index, size, proof[1:], root)
        yield "short element", (leaf, index, size, [proof[0][:31], *proof[1:]], root)
        yield "inserted element", (leaf, index, size, [proof[0], SOME_HASH, *proof[1:]], root)
    if proof != proof[::-1]:
        yield "reversed", (leaf, index, size, proof[::-1], root)
    for i in range(len(proof)):
        for bit in (0, 3, 7):
            changed = list(proof)
            changed[i] = flip(changed[i], bit)
            yield f"element {i} bit {bit} flipped", (leaf, index, size, changed, root)


def test_verify_inclusion_rejects_every_corruption(roots: dict[int, bytes]) -> None:
    checked = 0
    for size in VERIFY_SIZES:
        for index in range(size):
            leaf = leaf_hash(ENTRIES[index])
            proof = rfc_path(index, ENTRIES[:size])
            verify_inclusion(leaf, index, size, proof, roots[size])
            for description, arguments in _inclusion_corruptions(
                leaf, index, size, proof, roots[size], roots
            ):
                with pytest.raises(ProofError):
                    verify_inclusion(*arguments)
                    pytest.fail(f"{description} verified (index {index}, size {size})")
                checked += 1
    assert checked > 10_000


def test_verify_inclusion_rejects_every_other_index_and_leaf(roots: dict[int, bytes]) -> None:
    for size in range(1, 21):
        for index in range(size):
            proof = rfc_path(index, ENTRIES[:size])
            for other in range(size):
                if other == index:
                    continue
                with pytest.raises(ProofError):
                    verify_inclusion(leaf_hash(ENTRIES[index]), other, size, proof, roots[size])
                with pytest.raises(ProofError):
                    verify_inclusion(leaf_hash(ENTRIES[other]), index, size, proof, roots[size])


def test_verify_inclusion_single_leaf_tree() -> None:
    leaf = leaf_hash(b"data")
    verify_inclusion(leaf, 0, 1, [], leaf)
    for arguments in [
        (leaf, 0, 1, [], EMPTY_ROOT),
        (EMPTY_ROOT, 0, 1, [], leaf),
        (b"", 0, 1, [], b""),
        (leaf, 0, 1, [leaf], leaf),
        (leaf, 1, 1, [], leaf),
        (leaf, 0, 0, [], leaf),
    ]:
        with pytest.raises(ProofError):
            verify_inclusion(*arguments)


def _consistency_corruptions(
    old: int,
    new: int,
    old_root: bytes,
    new_root: bytes,
    proof: list[bytes],
    roots: dict[int, bytes],
):
    """(description, arguments) of verify_consistency calls that must fail.

    A size changed with the roots kept is not always caught: the proof from
    1 to 3 leaves is also a valid proof from 1 to 4 leaves whose root is the
    3-leaf root. A verifier relies on the signed (size, root) pairs; here a
    changed size gets its own tree's root."""
    yield "old - 1", (old - 1, new, old_root, new_root, proof)
    yield "old + 1", (old + 1, new, old_root, new_root, proof)
    yield "old ^ 2", (old ^ 2, new, old_root, new_root, proof)
    yield "new * 2", (old, new * 2, old_root, new_root, proof)
    yield "new // 2", (old, new // 2, old_root, new_root, proof)
    if new + 1 in roots:
        yield "new + 1 with its root", (old, new + 1, old_root, roots[new + 1], proof)
    if old + 1 < new:
        yield "old + 1 with its root", (old + 1, new, roots[old + 1], new_root, proof)
    yield "old > new", (new, old, new_root, old_root, proof)
    yield "wrong old root", (old, new, SOME_HASH, new_root, proof)
    yield "wrong new root", (old, new, old_root, SOME_HASH, proof)
    yield "swapped roots", (old, new, new_root, old_root, proof)
    yield "empty proof", (old, new, old_root, new_root, [])
    yield "trailing old root", (old, new, old_root, new_root, [*proof, old_root])
    yield "trailing new root", (old, new, old_root, new_root, [*proof, new_root])
    yield "trailing garbage", (old, new, old_root, new_root, [*proof, b""])
    yield "leading old root", (old, new, old_root, new_root, [old_root, *proof])
    yield "leading new root", (old, new, old_root, new_root, [new_root, *proof])
    yield "leading proof[0]", (old, new, old_root, new_root, [proof[0], *proof])
    yield "truncated", (old, new, old_root, new_root, proof[:-1])
    yield "first element dropped", (old, new, old_root, new_root, proof[1:])
    yield "short element", (old, new, old_root, new_root, [proof[0][:31], *proof[1:]])
    for i in range(len(proof)):
        for bit in (0, 4, 7):
            changed = list(proof)
            changed[i] = flip(changed[i], bit)
            yield f"element {i} bit {bit} flipped", (old, new, old_root, new_root, changed)


def test_verify_consistency_rejects_every_corruption(roots: dict[int, bytes]) -> None:
    checked = 0
    for new in VERIFY_SIZES:
        for old in range(1, new):
            proof = rfc_proof(old, ENTRIES[:new])
            verify_consistency(old, new, roots[old], roots[new], proof)
            for description, arguments in _consistency_corruptions(
                old, new, roots[old], roots[new], proof, roots
            ):
                with pytest.raises(ProofError):
                    verify_consistency(*arguments)
                    pytest.fail(f"{description} verified ({old} -> {new})")
                checked += 1
    assert checked > 10_000


def test_verify_consistency_edge_cases() -> None:
    root1, root2 = leaf_hash(b"1"), leaf_hash(b"2")
    verify_consistency(0, 0, EMPTY_ROOT, EMPTY_ROOT, [])
    verify_consistency(0, 5, EMPTY_ROOT, root2, [])
    verify_consistency(1, 1, root2, root2, [])
    for arguments in [
        (0, 0, root1, root2, []),  # same size, different roots
        (1, 1, root1, root2, []),
        (0, 0, root1, root1, []),  # an empty tree has the empty root
        (0, 1, root1, root2, []),
        (0, 0, EMPTY_ROOT, EMPTY_ROOT, [EMPTY_ROOT]),  # proof must be empty
        (0, 1, EMPTY_ROOT, root1, [EMPTY_ROOT]),
        (1, 1, root1, root1, [root1]),
        (1, 0, root1, root2, []),  # the past
        (2, 1, root1, root2, [root1]),
        (1, 2, root1, root2, []),  # needs a proof
        (-1, 2, root1, root2, [root1]),
        (1, 2, root1[:31], root2, [root1]),
        (1, 2, root1, "not bytes", [root1]),
        (1, 2, root1, root2, [root1] * (MAX_PROOF_HASHES + 1)),
    ]:
        with pytest.raises(ProofError):
            verify_consistency(*arguments)


# --- CompactRange -----------------------------------------------------------

RANGE_SIZE = 300


@pytest.fixture(scope="module")
def big_tree() -> RfcTree:
    return RfcTree(make_entries(RANGE_SIZE))


def _completed_by(index: int) -> list[tuple[int, int]]:
    """The perfect subtrees whose last leaf is ``index``, from level 0 up."""
    nodes = []
    level = 0
    while (index + 1) % (1 << level) == 0:
        nodes.append((level, index >> level))
        level += 1
    return nodes


def test_compact_range_appends_match_the_rfc_tree(big_tree: RfcTree) -> None:
    edge = CompactRange()
    assert edge.size == 0 and edge.root() == EMPTY_ROOT and edge.subtrees() == []
    reported: set[tuple[int, int]] = set()
    for index, entry in enumerate(big_tree.entries):
        completed = edge.append(leaf_hash(entry))
        assert [(level, i) for level, i, _ in completed] == _completed_by(index)
        for level, i, node in completed:
            assert node == big_tree.perfect(level, i)
            assert (level, i) not in reported
            reported.add((level, i))
        assert edge.size == index + 1
        assert edge.root() == rfc_mth(big_tree.entries[: index + 1])
    every_subtree = {
        (level, i) for level in range(RANGE_SIZE.bit_length()) for i in range(RANGE_SIZE >> level)
    }
    assert reported == every_subtree


def test_compact_range_from_tree_then_appends(big_tree: RfcTree) -> None:
    for size in [*range(0, 70), 127, 128, 129, 255, 256, 257]:
        big_tree.calls = 0
        edge = CompactRange.from_tree(size, big_tree.perfect)
        assert big_tree.calls == size.bit_count()
        assert edge.size == size
        assert edge.root() == rfc_mth(big_tree.entries[:size])
        fresh = CompactRange()
        for entry in big_tree.entries[:size]:
            fresh.append(leaf_hash(entry))
        assert edge.subtrees() == fresh.subtrees()
        for index in range(size, min(size + 40, RANGE_SIZE)):
            assert edge.append(leaf_hash(big_tree.entries[index])) == fresh.append(
                leaf_hash(big_tree.entries[index])
            )
            assert edge.root() == rfc_mth(big_tree.entries[: index + 1])


def test_compact_range_subtrees_are_the_right_edge(big_tree: RfcTree) -> None:
    edge = CompactRange.from_tree(0b101101, big_tree.perfect)
    assert [(level, index) for level, index, _ in edge.subtrees()] == [
        (5, 0),
        (3, 4),
        (2, 10),
        (0, 44),
    ]


def test_compact_range_rejects_a_leaf_that_is_not_a_hash() -> None:
    edge = CompactRange()
    edge.append(leaf_hash(b"a"))
    root = edge.root()
    for leaf in [b"", b"a" * 31, b"a" * 33]:
        with pytest.raises(ValueError):
            edge.append(leaf)
    assert edge.size == 1 and edge.root() == root
    with pytest.raises(ValueError):
        CompactRange.from_tree(-1, lambda level, index: b"")


def test_compact_range_matches_root_hash_over_many_leaves() -> None:
    """A larger tree, against this module's root_hash over the nodes the
    range reported (the two share no code but node_hash)."""
    edge = CompactRange()
    nodes: dict[tuple[int, int], bytes] = {}
    for index in range(5000):
        for level, i, node in edge.append(leaf_hash(b"%d" % index)):
            nodes[level, i] = node
        if index % 997 == 0 or index in (4095, 4096):
            assert edge.root() == root_hash(index + 1, lambda level, i: nodes[level, i])
