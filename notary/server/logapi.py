"""The notary's transparency log over HTTP, under ``/v2/log/`` (docs/log.md): the C2SP tlog-tiles layout, so any tiles client can
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

Costs and bounds (issue 30, item 6):

* Every request under ``/v2/log/`` costs its client prefix one query token
  (``[limits] queries_per_s_per_prefix``, as a query: 429 beyond), before
  anything is read.
* Full tiles and full entry bundles never change: their complete responses
  are made once and shared (``SHARED_PAGES_MAX_ENTRIES`` and
  ``SHARED_PAGES_MAX_BYTES``, least recently used dropped first; one per
  tile and keep-alive), so concurrent and repeated requests send one bytes
  object, with no store read. Partial tiles, the checkpoint and proofs are
  small and made per request.
* Every response is held for its connection until sent
  (``notary.model.ratelimit.BytesInFlight``): at most
  ``MAX_BYTES_IN_FLIGHT_PER_CLIENT`` per client prefix (429 beyond) and
  ``MAX_BYTES_IN_FLIGHT`` per process (a shared response counted once; 503
  beyond), each with ``Retry-After`` (the send timeout, by when every
  response held now has been sent or dropped), and beyond one response
  each. A response is refused before it is made when its size is known: a
  shared one, a hash tile, a checkpoint, a proof; an entry bundle's size is
  known once its entries are read (one read at a time per process) and it
  is checked then, before its response is made. The connection loop
  releases the bytes when the response is sent or the connection ends
  (``Answer.release``).

Reads go through ``LogAppender``'s reader (a worker thread). Every error is
a ``ProtocolError`` with its status; nothing else escapes.
"""

from __future__ import annotations

import base64
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from notary.errors import ProtocolError, StoreError
from notary.model.ratelimit import BytesInFlight, BytesInFlightStatistics
from notary.outbound.cosigned import CosignedCheckpoints
from notary.outbound.logappender import LogAppender
from notary.protocol import http, tlog
from notary.service.abuse import AbuseControls
from notary.service.query import Answer
from notary.state.cache import LRUCache

__all__ = [
    "LOG_PREFIX", "MAX_BYTES_IN_FLIGHT", "MAX_BYTES_IN_FLIGHT_PER_CLIENT",
    "SHARED_PAGES_MAX_BYTES", "SHARED_PAGES_MAX_ENTRIES", "LogPages", "LogPagesStatistics",
]

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
#: The shared responses of full tiles and bundles: at most this many, and
#: bytes (a full bundle of 1 kB entries is ~260 kB; a hash tile 8 kB).
SHARED_PAGES_MAX_ENTRIES = 1024
SHARED_PAGES_MAX_BYTES = 16 * 1024 * 1024
#: Bytes of ``/v2/log/`` responses held for slow readers, per process (each
#: shared response once) and per client prefix (each response), beyond one
#: response each.
MAX_BYTES_IN_FLIGHT = 32 * 1024 * 1024
MAX_BYTES_IN_FLIGHT_PER_CLIENT = 4 * 1024 * 1024
#: What a response's head adds to its body, at most (status line, server,
#: type, length, connection, cache control).
HEAD_BYTES = 256


@dataclass(frozen=True, slots=True)
class LogPagesStatistics:
    """What the metrics read (``notary_log_pages_*``): requests answered
    from a shared response and made afresh; shared responses and their
    bytes; the bytes held for slow readers (``BytesInFlight``)."""

    shared_hits: int
    made: int
    shared_entries: int
    shared_bytes: int
    in_flight: BytesInFlightStatistics


class LogPages:
    """Answers ``GET /v2/log/...`` from the log ``appender`` keeps.
    ``abuse``: the query budgets (None: none); ``clock``: theirs (the query
    service's); ``send_timeout_s``: ``[http] send_timeout_s``, the
    ``Retry-After`` of a response refused for the bytes held."""

    def __init__(
        self, appender: LogAppender, cosigned: CosignedCheckpoints | None = None, *,
        abuse: AbuseControls | None = None, clock: Callable[[], float] = time.time,
        send_timeout_s: float = 10.0,
    ) -> None:
        self._log = appender
        self._cosigned = cosigned
        self._abuse = abuse
        self._clock = clock
        #: (level or None for entries, index, keep-alive) -> the response of a full tile
        self._shared = LRUCache(SHARED_PAGES_MAX_ENTRIES, SHARED_PAGES_MAX_BYTES)
        self.in_flight = BytesInFlight(
            max_bytes=MAX_BYTES_IN_FLIGHT, max_bytes_per_client=MAX_BYTES_IN_FLIGHT_PER_CLIENT,
            retry_after_s=max(1, math.ceil(send_timeout_s)),
        )
        self._shared_hits = 0
        self._made_afresh = 0

    def statistics(self) -> LogPagesStatistics:
        shared = self._shared.statistics()
        return LogPagesStatistics(
            self._shared_hits, self._made_afresh, shared.entries, shared.bytes,
            self.in_flight.statistics(),
        )

    async def answer(
        self, method: bytes, path: bytes, query: bytes, *, client: bytes | None = None,
        keep_alive: bool = False,
    ) -> Answer:
        """The answer to a request of the client prefix ``client`` (None:
        unlimited) whose response is to say ``keep_alive``: a 200 carries
        its response made (``Answer.prepared``) and the ``release`` of the
        bytes it holds, which the caller must call once it is sent.

        Error handling: ``ProtocolError`` with its status (``RateLimited``
        429 and ``Overloaded`` 503 with their ``retry_after_s``)."""
        if self._abuse is not None:
            self._abuse.admit_query(client, self._clock())
        if method != b"GET":
            raise ProtocolError("method not allowed", status=405)
        rest = path[len(LOG_PREFIX):].decode("ascii", "replace")
        try:
            if rest == "checkpoint":
                return await self._checkpoint(client, keep_alive)
            if rest == "proof/consistency":
                return await self._consistency(query, client, keep_alive)
            if rest.startswith("tile/"):
                return await self._tile(rest, client, keep_alive)
        except StoreError:
            raise ProtocolError("the log cannot be read now", status=503) from None
        raise ProtocolError("not found", status=404)

    def _held(self, client: bytes | None, response: bytes, content_type: bytes) -> Answer:
        """The 200 answer of ``response``, held for ``client`` until sent."""
        release = self.in_flight.hold(client, response)
        return Answer(200, b"", content_type, prepared=response, release=release)

    def _make(
        self, client: bytes | None, keep_alive: bool, body: bytes, content_type: bytes,
        headers: tuple[tuple[bytes, bytes], ...],
    ) -> Answer:
        """A 200 answer made for this request, checked before it is made."""
        self.in_flight.check(client, len(body) + HEAD_BYTES)
        self._made_afresh += 1
        response = http.response(
            200, body, content_type=content_type, keep_alive=keep_alive, extra_headers=headers
        )
        return self._held(client, response, content_type)

    async def _checkpoint(self, client: bytes | None, keep_alive: bool) -> Answer:
        head = await self._log.read_head()
        if head is None:
            raise ProtocolError("the log is empty", status=404)
        note = head.checkpoint
        if self._cosigned is not None:
            note = self._cosigned.checkpoint_for(head)
        return self._make(client, keep_alive, note.encode("utf-8"), TEXT, FRESH)

    async def _tile(self, path: str, client: bytes | None, keep_alive: bool) -> Answer:
        try:
            level, index, width = tlog.parse_tile_path(path)
        except tlog.TileError:
            raise ProtocolError("not found", status=404) from None
        full = width == tlog.TILE_WIDTH
        key = (level, index, keep_alive)
        if full:
            shared = self._shared.get(key)
            if shared is not None:  # it exists, and never changes: no read
                self._shared_hits += 1
                return self._held(client, shared, OCTETS)
        head = await self._log.read_head()
        size = head.size if head is not None else 0
        headers = IMMUTABLE if full else FRESH
        if level is None:
            first = index * tlog.TILE_WIDTH
            if first + width > size:
                raise ProtocolError("not found", status=404)
            self.in_flight.check(client, HEAD_BYTES)  # no room at all: before reading
            body = tlog.encode_entry_bundle(await self._log.read_entries(first, first + width))
        else:
            full_tiles, partial = tlog.tile_count(size, level)
            if index > full_tiles or (index == full_tiles and width > partial):
                raise ProtocolError("not found", status=404)
            self.in_flight.check(client, width * tlog.HASH_SIZE + HEAD_BYTES)
            hashes = await self._log.read_tile(level, index)
            if hashes is None or len(hashes) < width * tlog.HASH_SIZE:
                raise ProtocolError("not found", status=404)
            body = hashes[: width * tlog.HASH_SIZE]
        if not full:
            return self._make(client, keep_alive, body, OCTETS, headers)
        shared = self._shared.peek(key)  # made meanwhile by another request?
        if shared is None:
            self.in_flight.check(client, len(body) + HEAD_BYTES)
            self._made_afresh += 1
            shared = http.response(
                200, body, content_type=OCTETS, keep_alive=keep_alive, extra_headers=headers
            )
            self._shared.put(key, shared, len(shared))
        return self._held(client, shared, OCTETS)

    async def _consistency(self, query: bytes, client: bytes | None, keep_alive: bool) -> Answer:
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
        return self._make(client, keep_alive, body, TEXT, IMMUTABLE)


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
