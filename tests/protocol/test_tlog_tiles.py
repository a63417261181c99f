"""Tiles (C2SP tlog-tiles): paths, counts, contents, TileHashReader, and
entry bundles.

The path examples are the spec's and golang.org/x/mod/sumdb/tlog's (with
the height element, which C2SP fixes at 8, dropped). The reader is checked
over tiles built by ``tile_hashes`` for trees around tile boundaries, the
small ones against the RFC 9162 implementation of test_tlog_merkle, the
large ones against a dict of every node a CompactRange reported, whose root
is checked against that implementation first.
"""

from __future__ import annotations

import random

import pytest

from notary.protocol.tlog import (
    EMPTY_ROOT,
    MAX_TILE_INDEX,
    TILE_WIDTH,
    CompactRange,
    ProofError,
    TileError,
    TileHashReader,
    consistency_proof,
    decode_entry_bundle,
    encode_entry_bundle,
    entries_path,
    inclusion_proof,
    leaf_hash,
    parse_tile_path,
    root_hash,
    tile_count,
    tile_hashes,
    tile_path,
    tiles_to_publish,
    verify_consistency,
    verify_inclusion,
)
from tests.support.merkle import RfcTree, make_entries, rfc_mth

# --- Paths ------------------------------------------------------------------

PATHS = [
    # C2SP tlog-tiles: index 1234067 is x001/x234/067.
    ("tile/0/x001/x234/067", (0, 1234067, 256)),
    ("tile/0/x001/x234/067.p/8", (0, 1234067, 8)),
    ("tile/entries/x001/x234/067", (None, 1234067, 256)),
    ("tile/entries/x001/x234/067.p/8", (None, 1234067, 8)),
    # sumdb/tlog tile_test.go and tlog_test.go, without the height.
    ("tile/0/001", (0, 1, 256)),
    ("tile/0/001.p/5", (0, 1, 5)),
    ("tile/5/x123/x456/078", (5, 123456078, 256)),
    ("tile/5/x123/x456/078.p/2", (5, 123456078, 2)),
    ("tile/0/x003/x057/500", (0, 3057500, 256)),
    ("tile/entries/x003/x057/500", (None, 3057500, 256)),
    # Edges.
    ("tile/0/000", (0, 0, 256)),
    ("tile/0/000.p/1", (0, 0, 1)),
    ("tile/0/999.p/255", (0, 999, 255)),
    ("tile/0/x001/000", (0, 1000, 256)),
    ("tile/63/000.p/1", (63, 0, 1)),
    ("tile/10/x001/x000/x000/000", (10, 10**9, 256)),
    ("tile/0/x036/x028/x797/x018/x963/967", (0, MAX_TILE_INDEX, 256)),
]

BAD_PATHS = [
    "tile/5/123/456/078",  # groups before the last need an x
    "tile/-1/123/456/078",
    "tile/data/x003/x057/500",  # sumdb's level name, not C2SP's
    "tile/00/000",  # leading zero in the level
    "tile/01/000",
    "tile/64/000",  # level above 63
    "tile/99/000",
    "tile/100/000",
    "tile/0/00",  # index groups are 3 digits
    "tile/0/0000",
    "tile/0/1",
    "tile/0/x000/001",  # a leading group of zeros
    "tile/0/x000/x001/001",
    "tile/0/x1000/000",
    "tile/0/X001/000",
    "tile/0/001/x000",
    "tile/0/x001",
    "tile/0/001.p/0",  # width 0
    "tile/0/001.p/256",  # a full tile has no .p
    "tile/0/001.p/01",  # leading zero in the width
    "tile/0/001.p/999",
    "tile/0/001.p/",
    "tile/0/001.p/5/",
    "tile/0/001.p",
    "tile/0/001.q/5",
    "tile/entries/001.p/256",
    "tile/entries/001.p/0",
    "tile/0/x036/x028/x797/x018/x963/968",  # index 2**55: past any tree < 2**63
    "tile/0/x001/x002/x003/x004/x005/x006/007",
    "/tile/0/000",
    "tile/0/000/",
    "tile//000",
    "tile/0//000",
    "tile/0/000\n",
    " tile/0/000",
    "tile/0/000 ",
    "tile/+1/000",
    "tile/0/+12",
    "tile/0/1_2",
    "tile/0/\u0661\u0662\u0663",  # Arabic-Indic digits
    "tile/\u0660/000",
    "tile/0/\uff10\uff10\uff10",  # full-width digits
    "tile/0/000.p/\u0665",
    "tiles/0/000",
    "TILE/0/000",
    "tile/entries",
    "tile/0",
    "tile",
    "",
    "tile/0/" + "x001/" * 20 + "000",
    "tile/0/000" + "\0",
]


@pytest.mark.parametrize(("path", "parsed"), PATHS)
def test_tile_paths_known_answers(path: str, parsed: tuple[int | None, int, int]) -> None:
    assert parse_tile_path(path) == parsed
    level, index, width = parsed
    made = entries_path(index, width) if level is None else tile_path(level, index, width)
    assert made == path


@pytest.mark.parametrize("path", BAD_PATHS)
def test_parse_tile_path_rejects_what_tile_path_would_not_write(path: str) -> None:
    with pytest.raises(TileError):
        parse_tile_path(path)


def test_tile_paths_round_trip() -> None:
    rng = random.Random(8)
    indices = [0, 1, 999, 1000, 1001, 999_999, 10**6, MAX_TILE_INDEX]
    indices += [rng.randrange(MAX_TILE_INDEX) for _ in range(200)]
    for index in indices:
        for width in (1, 2, 100, 255, 256):
            for level in (None, 0, 1, 7, 63):
                path = (
                    entries_path(index, width) if level is None else tile_path(level, index, width)
                )
                assert parse_tile_path(path) == (level, index, width)


@pytest.mark.parametrize(
    ("level", "index", "width"),
    [(-1, 0, 1), (64, 0, 1), (0, -1, 1), (0, MAX_TILE_INDEX + 1, 1), (0, 0, 0), (0, 0, 257)],
)
def test_tile_path_rejects_out_of_range_arguments(level: int, index: int, width: int) -> None:
    with pytest.raises(ValueError):
        tile_path(level, index, width)


# --- Counts -----------------------------------------------------------------


def test_tile_count_spec_example() -> None:
    # "a tree of size 70,000 will be represented by 273 full level 0 tiles,
    # one partial level 0 tile of width 112, one full level 1 tile, one
    # partial level 1 tile of width 17, and one partial level 2 tile of width 1"
    assert [tile_count(70_000, level) for level in range(4)] == [
        (273, 112),
        (1, 17),
        (0, 1),
        (0, 0),
    ]
    # "a tree of size 256 will be represented by a full level 0 tile and a
    # partial level 1 tile of width 1"
    assert [tile_count(256, level) for level in range(3)] == [(1, 0), (0, 1), (0, 0)]
    assert tile_count(0, 0) == (0, 0)
    assert tile_count(2**63 - 1, 7) == (0, 127)


def tiles_of(size: int) -> set[tuple[int, int, int]]:
    """Every tile (level, index, width) a log serves for a tree of ``size``."""
    tiles = set()
    for level in range(8):
        full, partial = tile_count(size, level)
        tiles |= {(level, index, TILE_WIDTH) for index in range(full)}
        if partial:
            tiles.add((level, full, partial))
    return tiles


def test_tiles_to_publish_are_the_new_tree_tiles_the_old_tree_lacks() -> None:
    rng = random.Random(5)
    pairs = [(0, 0), (0, 1), (255, 256), (255, 257), (256, 256), (1, 70_000), (65_535, 65_537)]
    pairs += [tuple(sorted(rng.randrange(300_000) for _ in range(2))) for _ in range(200)]
    for old, new in pairs:
        published = tiles_to_publish(old, new)
        assert len(published) == len(set(published))
        assert set(published) == tiles_of(new) - tiles_of(old), (old, new)
        assert [level for level, _, _ in published] == sorted(level for level, _, _ in published)
    assert tiles_to_publish(255, 257) == [(0, 0, 256), (0, 1, 1), (1, 0, 1)]
    with pytest.raises(ValueError):
        tiles_to_publish(2, 1)


# --- Tile contents and the reader -------------------------------------------


def test_tile_hashes_are_the_subtree_hashes_of_the_row() -> None:
    tree = RfcTree(make_entries(70))
    data = tile_hashes(0, 0, 70, tree.perfect)
    assert data == b"".join(leaf_hash(entry) for entry in tree.entries)
    big = RfcTree(make_entries(2 * 256 + 3))
    assert tile_hashes(1, 0, 2, big.perfect) == rfc_mth(big.entries[:256]) + rfc_mth(
        big.entries[256:512]
    )
    with pytest.raises(ValueError):
        tile_hashes(0, 0, 0, tree.perfect)


class TileStore:
    """The tiles of the trees of several sizes over the same leaves, built
    with tile_hashes from ``perfect``; counts reads."""

    def __init__(self, perfect, sizes) -> None:
        self.tiles: dict[tuple[int, int, int], bytes] = {}
        for size in sizes:
            for tile in tiles_of(size):
                if tile not in self.tiles:
                    self.tiles[tile] = tile_hashes(*tile, perfect)
        self.reads: list[tuple[int, int, int]] = []

    def read_tile(self, level: int, index: int, width: int) -> bytes:
        self.reads.append((level, index, width))
        return self.tiles[level, index, width]


def _sample_indices(count: int, rng: random.Random) -> list[int]:
    picks = {0, count - 1, count // 2, *(rng.randrange(count) for _ in range(6))}
    picks |= {i for i in (255, 256, 257, 65_535, 65_536) if i < count}
    return sorted(picks)


def _check_reader(size: int, perfect, store: TileStore, root: bytes) -> None:
    """The reader over ``store`` agrees with ``perfect`` on subtrees, the
    root and proofs of the tree of ``size`` leaves, reading only tiles a log
    serves for that tree."""
    rng = random.Random(size)
    reader = TileHashReader(size, store.read_tile)
    assert root_hash(size, reader.perfect) == root
    for level in range(size.bit_length()):
        for index in _sample_indices(size >> level, rng):
            assert reader.perfect(level, index) == perfect(level, index), (size, level, index)
    for index in _sample_indices(size, rng):
        proof = inclusion_proof(index, size, reader.perfect)
        assert proof == inclusion_proof(index, size, perfect)
        verify_inclusion(perfect(0, index), index, size, proof, root)
    for old in _sample_indices(size, rng):
        proof = consistency_proof(old, size, reader.perfect)
        assert proof == consistency_proof(old, size, perfect)
        verify_consistency(old, size, root_hash(old, perfect), root, proof)
    assert set(store.reads) <= tiles_of(size)


SMALL_SIZES = [*range(1, 71), 255, 256, 257, 511, 512, 513]


def test_reader_agrees_with_the_rfc_tree_for_small_sizes() -> None:
    tree = RfcTree(make_entries(max(SMALL_SIZES)))
    store = TileStore(tree.perfect, SMALL_SIZES)
    for size in SMALL_SIZES:
        store.reads.clear()
        _check_reader(size, tree.perfect, store, rfc_mth(tree.entries[:size]))


BIG_SIZES = [65_535, 65_536, 65_537]


@pytest.fixture(scope="module")
def big_nodes() -> dict[tuple[int, int], bytes]:
    """Every perfect subtree of a tree of 65,537 synthetic leaves, as a
    CompactRange reports them, checked against the RFC MTH."""
    entries = make_entries(max(BIG_SIZES))
    nodes: dict[tuple[int, int], bytes] = {}
    edge = CompactRange()
    for entry in entries:
        for level, index, node in edge.append(leaf_hash(entry)):
            nodes[level, index] = node
    assert edge.root() == rfc_mth(entries)
    assert nodes[16, 0] == rfc_mth(entries[:65_536])
    return nodes


def test_reader_agrees_around_the_level_2_boundary(big_nodes) -> None:
    def perfect(level: int, index: int) -> bytes:
        return big_nodes[level, index]

    store = TileStore(perfect, BIG_SIZES)
    for size in BIG_SIZES:
        store.reads.clear()
        _check_reader(size, perfect, store, root_hash(size, perfect))


def test_reader_reads_each_tile_once_and_keeps_a_bounded_cache(big_nodes) -> None:
    def perfect(level: int, index: int) -> bytes:
        return big_nodes[level, index]

    store = TileStore(perfect, [65_537])
    reader = TileHashReader(65_537, store.read_tile)
    root = root_hash(65_537, reader.perfect)
    first_reads = reader.tiles_read
    # The root's subtrees: level 16 from level 2 tile 0, and leaf 65,536.
    assert first_reads == len(store.reads) == 2
    assert root_hash(65_537, reader.perfect) == root
    assert reader.tiles_read == first_reads
    small = TileHashReader(65_537, store.read_tile, max_cached_tiles=1)
    small.perfect(0, 0)
    small.perfect(0, 300)
    small.perfect(0, 1)
    assert small.tiles_read == 3
    # The least recently used tile goes first.
    two = TileHashReader(65_537, store.read_tile, max_cached_tiles=2)
    for index in (0, 256, 1, 512, 2):  # tiles 0, 1, 0 (hit), 2 (evicts 1), 0 (hit)
        two.perfect(0, index)
    assert two.tiles_read == 3


def test_reader_rejects_tiles_of_the_wrong_length() -> None:
    tree = RfcTree(make_entries(300))
    store = TileStore(tree.perfect, [300])
    for wrong in [b"", b"\0" * 31, store.tiles[0, 1, 44][:-1], store.tiles[0, 1, 44] + b"\0"]:
        reader = TileHashReader(300, lambda level, index, width, wrong=wrong: wrong)
        with pytest.raises(TileError):
            reader.perfect(0, 299)
    reader = TileHashReader(300, lambda level, index, width: "text")
    with pytest.raises(TileError):
        reader.perfect(0, 299)


def test_reader_hashes_are_only_as_good_as_the_tiles() -> None:
    tree = RfcTree(make_entries(300))
    store = TileStore(tree.perfect, [300])
    root = rfc_mth(tree.entries)
    store.tiles[0, 1, 44] = b"\xff" + store.tiles[0, 1, 44][1:]
    reader = TileHashReader(300, store.read_tile)
    assert root_hash(300, reader.perfect) != root
    proof = inclusion_proof(3, 300, reader.perfect)
    with pytest.raises(ProofError, match="root"):
        verify_inclusion(leaf_hash(tree.entries[3]), 3, 300, proof, root)


def test_reader_refuses_subtrees_outside_the_tree_and_propagates_read_errors() -> None:
    reader = TileHashReader(300, lambda level, index, width: pytest.fail("no read expected"))
    for level, index in [(0, 300), (1, 150), (8, 1), (9, 0), (-1, 0), (0, -1)]:
        with pytest.raises(ValueError):
            reader.perfect(level, index)
    empty = TileHashReader(0, lambda level, index, width: pytest.fail("no read expected"))
    assert root_hash(0, empty.perfect) == EMPTY_ROOT

    class Unavailable(Exception):
        pass

    def read_tile(level: int, index: int, width: int) -> bytes:
        raise Unavailable

    with pytest.raises(Unavailable):
        TileHashReader(300, read_tile).perfect(0, 0)


# --- Entry bundles ----------------------------------------------------------


def test_entry_bundle_encoding_known_answer() -> None:
    bundle = encode_entry_bundle([b"", b"a", b"\x01" * 300])
    assert bundle == b"\x00\x00" + b"\x00\x01a" + b"\x01\x2c" + b"\x01" * 300
    assert decode_entry_bundle(bundle) == [b"", b"a", b"\x01" * 300]
    assert decode_entry_bundle(bundle, width=3) == [b"", b"a", b"\x01" * 300]


def test_entry_bundle_round_trips_and_hashes_to_its_level_0_tile() -> None:
    rng = random.Random(1)
    entries = [rng.randbytes(rng.choice([0, 1, 50, 1000])) for _ in range(256)]
    entries[7] = b"\xff" * 65_535
    bundle = encode_entry_bundle(entries)
    decoded = decode_entry_bundle(bundle, width=256)
    assert decoded == entries
    tree = RfcTree(entries)
    assert b"".join(leaf_hash(entry) for entry in decoded) == tile_hashes(0, 0, 256, tree.perfect)


def test_entry_bundle_encoding_rejects_what_cannot_be_decoded() -> None:
    for entries in [[b"x" * 65_536], [], [b""] * 257]:
        with pytest.raises(ValueError):
            encode_entry_bundle(entries)


@pytest.mark.parametrize(
    "data",
    [
        b"",  # no entries
        b"\x00",  # half a length
        b"\x00\x02a",  # entry cut short
        b"\x00\x01a\x00",  # trailing byte
        b"\x00\x01a\x00\x05abc",
        b"\xff\xff" + b"x" * 65_534,
        b"\x00\x00" * 257,  # more than 256 entries
    ],
)
def test_entry_bundle_decoding_rejects_malformed_bundles(data: bytes) -> None:
    with pytest.raises(TileError):
        decode_entry_bundle(data)


def test_entry_bundle_decoding_checks_the_width() -> None:
    bundle = encode_entry_bundle([b"a", b"b"])
    with pytest.raises(TileError):
        decode_entry_bundle(bundle, width=3)
    with pytest.raises(TileError):
        decode_entry_bundle(bundle, width=1)
    assert decode_entry_bundle(b"\x00\x00" * 256, width=256) == [b""] * 256
