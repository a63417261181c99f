"""Tiles and entry bundles of a tiled transparency log (C2SP tlog-tiles):
their paths, their contents, and a reader that serves any perfect subtree
hash of a tree from its tiles.

A tile at level ``L`` and index ``N`` holds up to 256 consecutive hashes of
the tree at height ``8 * L``: those of the perfect subtrees ``N * 256``,
``N * 256 + 1``, ... A tile with fewer than 256 (the right edge of a tree)
is *partial*, and its path ends in ``.p/<width>``. Entry bundle ``N`` holds
the entries whose leaf hashes are level 0 tile ``N``.

Error handling: a caller's out-of-range level, index or width is
``ValueError``; a path that is not canonical, a tile of the wrong length, or
a malformed entry bundle is :class:`TileError`.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable, Sequence

from notary.protocol.tlog.errors import TileError
from notary.protocol.tlog.merkle import HASH_SIZE, PerfectHash, node_hash

TILE_HEIGHT = 8
TILE_WIDTH = 1 << TILE_HEIGHT
#: Highest tile level a path may name (C2SP tlog-tiles).
MAX_TILE_LEVEL = 63
#: Highest tile index of a tree of fewer than 2**63 leaves (a level 0 tile
#: or an entry bundle); paths naming a higher one are rejected.
MAX_TILE_INDEX = (1 << (63 - TILE_HEIGHT)) - 1
#: Longest entry an entry bundle can hold: its length is a uint16.
MAX_ENTRY_BYTES = 0xFFFF
#: Longest path :func:`parse_tile_path` looks at; canonical paths of indices
#: up to :data:`MAX_TILE_INDEX` are shorter.
MAX_TILE_PATH_CHARS = 64
#: Tiles a :class:`TileHashReader` keeps unless told otherwise: enough for
#: a root and a few proofs of one tree.
DEFAULT_CACHED_TILES = 64

_INDEX_GROUP = 1000
_TILE_PATH_RE = re.compile(
    r"tile/(?P<level>entries|0|[1-9][0-9]?)/"
    r"(?P<index>(?:x[0-9]{3}/){0,5}[0-9]{3})"
    r"(?:\.p/(?P<width>[1-9][0-9]{0,2}))?"
)

ReadTile = Callable[[int, int, int], bytes]
"""``read_tile(level, index, width)``: the bytes of that tile, ``width``
hashes of 32 bytes."""


def _check_tile(level: int | None, index: int, width: int) -> None:
    if level is not None and not (isinstance(level, int) and 0 <= level <= MAX_TILE_LEVEL):
        raise ValueError(f"tile level must be 0 to {MAX_TILE_LEVEL}")
    if not (isinstance(index, int) and 0 <= index <= MAX_TILE_INDEX):
        raise ValueError("tile index out of range")
    if not (isinstance(width, int) and 1 <= width <= TILE_WIDTH):
        raise ValueError(f"tile width must be 1 to {TILE_WIDTH}")


def _index_path(index: int) -> str:
    """``index`` as 3-digit path elements, all but the last prefixed "x"."""
    groups = [f"{index % _INDEX_GROUP:03d}"]
    index //= _INDEX_GROUP
    while index:
        groups.append(f"x{index % _INDEX_GROUP:03d}")
        index //= _INDEX_GROUP
    return "/".join(reversed(groups))


def _width_suffix(width: int) -> str:
    return "" if width == TILE_WIDTH else f".p/{width}"


def tile_path(level: int, index: int, width: int) -> str:
    """The path of a tile, e.g. ``tile/0/x001/x234/067.p/8`` (no prefix, no
    leading slash). Raises ``ValueError`` for a level outside 0-63, a
    negative or too large index, or a width outside 1-256."""
    _check_tile(level, index, width)
    return f"tile/{level}/{_index_path(index)}{_width_suffix(width)}"


def entries_path(index: int, width: int) -> str:
    """The path of an entry bundle, e.g. ``tile/entries/x001/x234/067``.
    Raises ``ValueError`` as :func:`tile_path`."""
    _check_tile(None, index, width)
    return f"tile/entries/{_index_path(index)}{_width_suffix(width)}"


def parse_tile_path(path: str) -> tuple[int | None, int, int]:
    """``(level, index, width)`` of a canonical tile path, with ``None`` as
    the level of an entry bundle; the inverse of :func:`tile_path` and
    :func:`entries_path`.

    Raises :class:`TileError` for anything they would not have written:
    leading zeros, an ``x`` group of zeros in front, a level above 63, a
    ``.p/`` width of 0 or above 255, an index above
    :data:`MAX_TILE_INDEX`, a prefix, a trailing slash, more than
    :data:`MAX_TILE_PATH_CHARS` characters.
    """
    if not isinstance(path, str) or len(path) > MAX_TILE_PATH_CHARS:
        raise TileError("malformed tile path")
    match = _TILE_PATH_RE.fullmatch(path)
    if match is None:
        raise TileError("malformed tile path")
    level_text, index_text, width_text = match.group("level", "index", "width")
    level = None if level_text == "entries" else int(level_text)
    index = int(index_text.replace("x", "").replace("/", ""))
    width = TILE_WIDTH if width_text is None else int(width_text)
    if level is not None and level > MAX_TILE_LEVEL:
        raise TileError("tile level out of range")
    if width >= TILE_WIDTH and width_text is not None:
        raise TileError("partial tile width out of range")
    if index > MAX_TILE_INDEX:
        raise TileError("tile index out of range")
    canonical = entries_path(index, width) if level is None else tile_path(level, index, width)
    if canonical != path:
        raise TileError("tile path is not canonical")
    return level, index, width


def tile_count(size: int, level: int) -> tuple[int, int]:
    """``(full tiles, width of the partial tile or 0)`` at tile ``level``
    of a tree of ``size`` leaves: the tiles a log serves for that tree."""
    if not isinstance(size, int) or size < 0:
        raise ValueError("tree size must be a non-negative integer")
    if not (isinstance(level, int) and 0 <= level <= MAX_TILE_LEVEL):
        raise ValueError(f"tile level must be 0 to {MAX_TILE_LEVEL}")
    hashes = size >> (TILE_HEIGHT * level)
    return hashes >> TILE_HEIGHT, hashes & (TILE_WIDTH - 1)


def tiles_to_publish(old_size: int, new_size: int) -> list[tuple[int, int, int]]:
    """The tiles ``(level, index, width)`` whose content a log publishes
    when it grows from ``old_size`` leaves to ``new_size``, lowest level
    first: every tile that is new or wider. The entry bundles to publish are
    those of the level 0 tiles, same index and width."""
    if not (isinstance(old_size, int) and isinstance(new_size, int) and 0 <= old_size <= new_size):
        raise ValueError("need tree sizes 0 <= old_size <= new_size")
    tiles = []
    level = 0
    while new_size >> (TILE_HEIGHT * level):
        old_hashes = old_size >> (TILE_HEIGHT * level)
        new_hashes = new_size >> (TILE_HEIGHT * level)
        if old_hashes != new_hashes:
            for index in range(old_hashes >> TILE_HEIGHT, new_hashes >> TILE_HEIGHT):
                tiles.append((level, index, TILE_WIDTH))
            partial = new_hashes & (TILE_WIDTH - 1)
            if partial:
                tiles.append((level, new_hashes >> TILE_HEIGHT, partial))
        level += 1
    return tiles


def tile_hashes(level: int, index: int, width: int, perfect: PerfectHash) -> bytes:
    """The content of tile ``level``/``index`` of width ``width``: the hashes
    of the perfect subtrees of height ``8 * level`` numbered ``index * 256``
    to ``index * 256 + width - 1``, concatenated. Raises ``ValueError`` as
    :func:`tile_path`."""
    _check_tile(level, index, width)
    height = TILE_HEIGHT * level
    first = index << TILE_HEIGHT
    return b"".join([perfect(height, first + i) for i in range(width)])


class _Tile:
    """One tile read by a :class:`TileHashReader`, with the subtree hashes
    computed from it so far."""

    __slots__ = ("data", "nodes")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.nodes: dict[tuple[int, int], bytes] = {}

    def subtree(self, height: int, index: int) -> bytes:
        """The hash of the perfect subtree ``index`` of ``height`` above the
        tile's own hashes (height 0: one of them)."""
        if height == 0:
            return self.data[index * HASH_SIZE : (index + 1) * HASH_SIZE]
        key = (height, index)
        node = self.nodes.get(key)
        if node is None:
            left = self.subtree(height - 1, 2 * index)
            right = self.subtree(height - 1, 2 * index + 1)
            node = self.nodes[key] = node_hash(left, right)
        return node


class TileHashReader:
    """Any perfect subtree hash of the tree of ``size`` leaves, read from its
    tiles: ``reader.perfect`` is the ``perfect`` argument of the functions
    of :mod:`notary.protocol.tlog.merkle`.

    A subtree of height ``l`` is hashed up from ``2 ** (l % 8)`` consecutive
    hashes of the tile at level ``l // 8`` that holds them, the tile of the
    width a tree of ``size`` leaves has there, read with
    ``read_tile(level, index, width)``.

    Resource handling: the reader keeps the last ``max_cached_tiles`` tiles
    it read, with the hashes computed from them. It owns nothing else and
    does no I/O itself; ``read_tile`` does.

    Error handling: a tile of the wrong length is :class:`TileError`;
    whatever ``read_tile`` raises propagates; a subtree outside the tree is
    ``ValueError``.

    The hashes are only as good as the tiles. A client must check what it
    derives against a root it trusts, e.g. a verified checkpoint's:
    ``root_hash(size, reader.perfect)`` must equal it, and proofs computed
    from the reader must pass :func:`verify_inclusion` or
    :func:`verify_consistency` against it.
    """

    __slots__ = ("_max_cached_tiles", "_read_tile", "_size", "_tiles", "tiles_read")

    def __init__(
        self, size: int, read_tile: ReadTile, *, max_cached_tiles: int = DEFAULT_CACHED_TILES
    ) -> None:
        if not isinstance(size, int) or size < 0:
            raise ValueError("tree size must be a non-negative integer")
        if max_cached_tiles < 1:
            raise ValueError("the reader must keep at least one tile")
        self._size = size
        self._read_tile = read_tile
        self._max_cached_tiles = max_cached_tiles
        self._tiles: OrderedDict[tuple[int, int], _Tile] = OrderedDict()
        #: Calls of ``read_tile`` so far (cache misses).
        self.tiles_read = 0

    @property
    def size(self) -> int:
        return self._size

    def perfect(self, level: int, index: int) -> bytes:
        """The hash of the perfect subtree of height ``level`` covering the
        leaves ``[index << level, (index + 1) << level)``. Raises
        ``ValueError`` unless those leaves are in the tree."""
        if not (isinstance(level, int) and isinstance(index, int) and level >= 0 and index >= 0):
            raise ValueError("subtree level and index must be non-negative integers")
        if (index + 1) << level > self._size:
            raise ValueError("subtree is not in the tree")
        tile_level, height = divmod(level, TILE_HEIGHT)
        tile_index, offset = divmod(index << height, TILE_WIDTH)
        return self._tile(tile_level, tile_index).subtree(height, offset >> height)

    def _tile(self, level: int, index: int) -> _Tile:
        key = (level, index)
        tile = self._tiles.get(key)
        if tile is not None:
            self._tiles.move_to_end(key)
            return tile
        hashes_at_level = self._size >> (TILE_HEIGHT * level)
        width = min(TILE_WIDTH, hashes_at_level - (index << TILE_HEIGHT))
        data = self._read_tile(level, index, width)
        self.tiles_read += 1
        if not isinstance(data, bytes | bytearray | memoryview) or len(data) != width * HASH_SIZE:
            raise TileError(f"tile {level}/{index} is not {width} hashes long")
        tile = self._tiles[key] = _Tile(bytes(data))
        if len(self._tiles) > self._max_cached_tiles:
            self._tiles.popitem(last=False)
        return tile


def encode_entry_bundle(entries: Sequence[bytes]) -> bytes:
    """An entry bundle: each entry as a big-endian uint16 length and its
    bytes. Raises ``ValueError`` for an entry longer than
    :data:`MAX_ENTRY_BYTES`, or a bundle of no entries or more than 256."""
    if not 1 <= len(entries) <= TILE_WIDTH:
        raise ValueError(f"an entry bundle holds 1 to {TILE_WIDTH} entries")
    parts = []
    for entry in entries:
        if len(entry) > MAX_ENTRY_BYTES:
            raise ValueError(f"an entry is at most {MAX_ENTRY_BYTES} bytes")
        parts.append(len(entry).to_bytes(2, "big"))
        parts.append(bytes(entry))
    return b"".join(parts)


def decode_entry_bundle(data: bytes, *, width: int | None = None) -> list[bytes]:
    """The entries of an entry bundle, in order; with ``width``, exactly
    that many.

    Raises :class:`TileError` for a truncated length or entry, bytes after
    the 256th entry, no entries, or a count other than ``width``.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TileError("an entry bundle is bytes")
    data = bytes(data)
    entries: list[bytes] = []
    position, end = 0, len(data)
    while position < end:
        if len(entries) == TILE_WIDTH:
            raise TileError(f"entry bundle has more than {TILE_WIDTH} entries")
        if end - position < 2:
            raise TileError("entry bundle ends inside a length")
        length = int.from_bytes(data[position : position + 2], "big")
        position += 2
        if end - position < length:
            raise TileError("entry bundle ends inside an entry")
        entries.append(data[position : position + length])
        position += length
    if not entries:
        raise TileError("entry bundle is empty")
    if width is not None and len(entries) != width:
        raise TileError(f"entry bundle has {len(entries)} entries, not {width}")
    return entries
