"""The notary's transparency log over HTTP, under ``/v2/log/`` (README,
"The notary's log"): the C2SP tlog-tiles layout, so any tiles client can
fetch and verify it, plus one proof endpoint for clients that keep a
checkpoint.

* ``GET /v2/log/checkpoint``: the newest signed checkpoint (C2SP
  tlog-checkpoint in a signed note), ``text/plain``, with the witnesses'
  cosignature lines collected for it so far (``[log] witnesses``,
  ``notary.outbound.witnessing``); 404 before the first entry.
* ``GET /v2/log/tile/<L>/<N>[.p/<W>]``: a hash tile; ``GET
  /v2/log/tile/entries/<N>[.p/<W>]``: an entry bundle (each entry the
  statement's answer-document entry as signed, ``{"signature":...,
  "statement":...}``). A tile the tree does not have (yet) is a 404; a
  partial tile is served for any width the tree has reached (the first
  ``W`` hashes, which never change); full tiles never change and are
  cacheable for ever.
* ``GET /v2/log/proof/consistency?old=M&new=N``: RFC 9162's consistency
  proof between two sizes of the tree, one base64 hash per line; 400 for
  bad sizes (only ASCII decimal digits without sign, space or leading zero
  are sizes: ``_SIZE_RE``), 404 beyond the tree. Tile paths take ASCII
  digits only as well (``tlog.parse_tile_path``: canonical paths, ``[0-9]``).

Reads go through ``LogAppender``'s reader (a worker thread). Every error is
a ``ProtocolError`` with its status; nothing else escapes.
"""

from __future__ import annotations

import base64
import re

from notary.errors import ProtocolError, StoreError
from notary.outbound.logappender import LogAppender
from notary.outbound.witnessing import LogWitnesses
from notary.protocol import tlog
from notary.service.query import Answer

__all__ = ["LOG_PREFIX", "LogPages"]

LOG_PREFIX = b"/v2/log/"
TEXT = b"text/plain; charset=utf-8"
OCTETS = b"application/octet-stream"
IMMUTABLE = ((b"Cache-Control", b"public, max-age=31536000, immutable"),)
FRESH = ((b"Cache-Control", b"no-cache"),)
#: A query string of the proof endpoint, at most.
MAX_QUERY_BYTES = 64
#: A tree size as the proof endpoint takes it: ASCII decimal digits, no sign,
#: space or leading zero (but "0" itself), at most 19 (below 2**63). Nothing
#: is percent-decoded: ``%31`` and ``%D9%A1`` (an Arabic-Indic one) are not
#: sizes, and neither is what ``str.isdigit`` or ``int`` would accept besides.
_SIZE_RE = re.compile(rb"0|[1-9][0-9]{0,18}")


class LogPages:
    """Answers ``GET /v2/log/...`` from the log ``appender`` keeps."""

    def __init__(self, appender: LogAppender, witnesses: LogWitnesses | None = None) -> None:
        self._log = appender
        self._witnesses = witnesses

    async def answer(self, method: bytes, path: bytes, query: bytes) -> Answer:
        if method != b"GET":
            raise ProtocolError("method not allowed", status=405)
        rest = path[len(LOG_PREFIX):].decode("ascii", "replace")
        try:
            if rest == "checkpoint":
                return await self._checkpoint()
            if rest == "proof/consistency":
                return await self._consistency(query)
            if rest.startswith("tile/"):
                return await self._tile(rest)
        except StoreError:
            raise ProtocolError("the log cannot be read now", status=503) from None
        raise ProtocolError("not found", status=404)

    async def _checkpoint(self) -> Answer:
        head = await self._log.read_head()
        if head is None:
            raise ProtocolError("the log is empty", status=404)
        note = head.checkpoint
        if self._witnesses is not None:
            note = self._witnesses.cosigned(note)
        return Answer(200, note.encode("utf-8"), TEXT, FRESH)

    async def _tile(self, path: str) -> Answer:
        try:
            level, index, width = tlog.parse_tile_path(path)
        except tlog.TileError:
            raise ProtocolError("not found", status=404) from None
        head = await self._log.read_head()
        size = head.size if head is not None else 0
        headers = IMMUTABLE if width == tlog.TILE_WIDTH else FRESH
        if level is None:
            first = index * tlog.TILE_WIDTH
            if first + width > size:
                raise ProtocolError("not found", status=404)
            entries = await self._log.read_entries(first, first + width)
            return Answer(200, tlog.encode_entry_bundle(entries), OCTETS, headers)
        full, partial = tlog.tile_count(size, level)
        if index > full or (index == full and width > partial):
            raise ProtocolError("not found", status=404)
        hashes = await self._log.read_tile(level, index)
        if hashes is None or len(hashes) < width * tlog.HASH_SIZE:
            raise ProtocolError("not found", status=404)
        return Answer(200, hashes[: width * tlog.HASH_SIZE], OCTETS, headers)

    async def _consistency(self, query: bytes) -> Answer:
        if len(query) > MAX_QUERY_BYTES:
            raise ProtocolError("query too long", status=414)
        sizes = _sizes(query)
        if sizes is None:
            raise ProtocolError("expected ?old=M&new=N (sizes)", status=400)
        old_size, new_size = sizes
        if old_size > new_size:
            raise ProtocolError("old must not exceed new", status=400)
        head = await self._log.read_head()
        if head is None or new_size > head.size:
            raise ProtocolError("the log is not that large", status=404)
        proof = await self._log.read_consistency_proof(old_size, new_size)
        body = b"".join(base64.b64encode(node) + b"\n" for node in proof)
        return Answer(200, body, TEXT, IMMUTABLE)


def _sizes(query: bytes) -> tuple[int, int] | None:
    """``(old, new)`` of the query string ``old=M&new=N`` (either order, each
    once, nothing else; sizes as ``_SIZE_RE``), None for anything else."""
    fields: dict[bytes, int] = {}
    for part in query.split(b"&"):
        name, equals, value = part.partition(b"=")
        if not equals or name not in (b"old", b"new") or name in fields:
            return None
        if _SIZE_RE.fullmatch(value) is None:
            return None
        fields[name] = int(value)
    if len(fields) != 2:
        return None
    return fields[b"old"], fields[b"new"]
