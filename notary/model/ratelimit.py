"""Rate limits and per-client counts: token buckets keyed by address
prefixes, and the connection counts of clients and their prefixes.

Pure and sans-IO: no Trio, no sockets, no clock (time is the ``now``
parameter, in seconds, of any clock that does not go back; one that does is
tolerated, see rule 4).

Rules this module keeps:

1. **Token buckets** (:class:`TokenBuckets`): a key is admitted ``cost``
   (default 1) when its bucket holds that many tokens; a bucket holds at most
   ``burst`` tokens and gains ``rate_per_s`` per second. Implemented as GCRA
   (the generic cell rate algorithm): one float per key, the time at which
   its bucket will be full again, so one admission is a dict lookup and a few
   float operations. In any window of ``t`` seconds a key is admitted at most
   ``burst + rate_per_s * t`` (test ``test_ratelimit.py``).
2. **A refusal says when**: :meth:`TokenBuckets.take` returns 0.0 when it
   admits, else the seconds until the same request would be admitted (for
   ``Retry-After``); a refusal charges nothing. :meth:`TokenBuckets.refund`
   gives back what an admission charged.
3. **Bounded**: a table holds at most ``max_entries`` keys. A full bucket is
   the same as no bucket, so when a new key finds the table full every full
   bucket is dropped; if that does not free a quarter of the table, the
   oldest keys (in first-admission order) are dropped until it does.
   Dropping a key can only admit *more* (it gets a full bucket): under a
   flood of more than ``max_entries`` distinct keys active at once the limit
   loosens for the keys dropped, it never refuses anyone more. Each sweep
   costs O(``max_entries``) and frees at least a quarter of them, so
   admissions cost O(1) amortised.
4. **A clock that goes back** (wall-clock steps) leaves buckets that seem to
   be full only in the future; a bucket more than ``burst`` tokens in debt
   (full again more than two bursts' worth of seconds ahead: impossible
   otherwise) is treated as full. A table made with ``max_debt`` lets
   :meth:`TokenBuckets.charge` put a bucket that many tokens more in debt
   (what is charged beyond is forgiven), and takes only a bucket deeper
   than that for a clock that went back.
5. **Client keys**: a client is limited by the prefix of its address: the /24
   of an IPv4 address, the /56 of an IPv6 address (what one subscriber
   usually gets); an IPv4-mapped IPv6 address (``::ffff:a.b.c.d``, from a
   dual-stack listener) is its IPv4 address. Keys are the packed prefix
   bytes (3 or 7 bytes), made once per connection.
6. **Connection counts** (:class:`ClientConnections`): open connections per
   client address and per client prefix, each refused beyond its maximum.
   An entry lives while its count is above zero, so the tables hold at most
   as many entries as there are open connections.
7. **Bytes held for slow readers** (:class:`BytesInFlight`): the bytes of
   responses handed to connections and not yet sent, per client prefix and
   in all (one process). A response is held only when its client's bytes
   stay within ``max_bytes_per_client`` and the total within ``max_bytes``,
   or when the client (for the total: the process) holds nothing yet, so any
   one response can be served: what is held never exceeds a bound by more
   than one response. One bytes object held by several responses (a shared,
   immutable answer) is counted once in the total, once per response in its
   clients' counts. Refused: :class:`RateLimited` (429, the client) or
   :class:`Overloaded` (503, the process), both with ``Retry-After``. An
   entry lives while it holds bytes.

Memory: an entry of a :class:`TokenBuckets` keyed by prefix bytes takes about
:data:`BYTES_PER_BUCKET` bytes (the key object, a float, and the dict's slot
and index at its worst load), a little more for longer keys (target names).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from itertools import islice

from notary.errors import ConfigError, ProtocolError

__all__ = [
    "BYTES_PER_BUCKET",
    "IPV4_CLIENT_PREFIX_BITS",
    "IPV4_DESTINATION_PREFIX_BITS",
    "IPV6_CLIENT_PREFIX_BITS",
    "IPV6_DESTINATION_PREFIX_BITS",
    "BytesInFlight",
    "BytesInFlightStatistics",
    "ClientConnections",
    "Exemptions",
    "Overloaded",
    "RateLimited",
    "TokenBuckets",
    "client_prefix",
    "destination_prefix",
    "packed_address",
    "retry_after_s",
]

#: Client prefixes limited together (rule 5).
IPV4_CLIENT_PREFIX_BITS = 24
IPV6_CLIENT_PREFIX_BITS = 56
#: Bytes per entry at most: ``sys.getsizeof`` of a 7-byte key (40) and of a
#: float (24), plus the dict's slot (24) and index at its lowest load; measured
#: 95-120 (test ``test_memory_per_entry_is_as_documented``). A target name
#: key adds its length (they are shared with the target objects mostly).
BYTES_PER_BUCKET = 160
#: A sweep that leaves more than this share of ``max_entries`` evicts the
#: oldest keys down to it (rule 3).
SWEEP_KEEP_SHARE = 0.75
#: Float dust: a wait shorter than this is no wait (rule 1 must not refuse
#: what exact arithmetic admits). A table keeps its times relative to the
#: first it was given: Unix times themselves have a float step of 2.4e-7 s,
#: and a burst's worth of sums at that step refused the burst's last token.
WAIT_EPSILON_S = 1e-9


class RateLimited(ProtocolError):
    """A client asked more than its rate allows: 429, with ``retry_after_s``
    (whole seconds, at least 1) for the ``Retry-After`` header."""

    status = 429

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message, status=429)
        self.retry_after_s = retry_after_s


class Overloaded(ProtocolError):
    """The process holds as much as it may for slow readers (rule 7): 503,
    with ``retry_after_s`` for the ``Retry-After`` header."""

    status = 503

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message, status=503)
        self.retry_after_s = retry_after_s


def retry_after_s(wait_s: float) -> int:
    """``Retry-After`` for a wait of ``wait_s``: whole seconds, rounded up,
    at least 1."""
    whole = int(wait_s)
    return max(1, whole + (whole < wait_s))


class TokenBuckets:
    """Token buckets per key (rules 1-4), ``rate_per_s`` tokens per second,
    at most ``burst`` in a bucket, at most ``max_entries`` keys.

    Error handling: ``ValueError`` for a rate, burst or size that is not
    positive. ``take`` never raises.
    """

    __slots__ = ("_burst", "_due", "_horizon_s", "_interval_s", "_max_entries", "_origin",
                 "_window_s", "evicted", "refused", "sweeps")

    def __init__(
        self, rate_per_s: float, burst: float, *, max_entries: int, max_debt: float = 0.0
    ) -> None:
        if not rate_per_s > 0 or not burst >= 1 or max_entries < 1 or max_debt < 0:
            raise ValueError("rate_per_s must be > 0, burst >= 1, max_entries >= 1, "
                             "max_debt >= 0")
        #: Seconds per token, and the seconds a full burst is worth.
        self._interval_s = 1.0 / rate_per_s
        self._burst = float(burst)
        self._window_s = burst / rate_per_s
        #: How far ahead a bucket may be full again (rule 4): two bursts'
        #: worth of seconds, and ``max_debt`` tokens' more.
        self._horizon_s = 2 * self._window_s + max_debt / rate_per_s
        self._max_entries = max_entries
        #: key -> when its bucket is full again (GCRA's "theoretical arrival
        #: time"), in seconds after ``_origin`` (see ``WAIT_EPSILON_S``); a
        #: key absent or in the past has a full bucket.
        self._due: dict[Hashable, float] = {}
        self._origin: float | None = None
        #: Refusals, sweeps, and non-full buckets dropped by a sweep (rule 3).
        self.refused = 0
        self.sweeps = 0
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._due)

    @property
    def max_entries(self) -> int:
        return self._max_entries

    def take(self, key: Hashable, now: float, cost: float = 1.0) -> float:
        """Admit ``cost`` tokens for ``key`` at ``now`` and return 0.0, or
        return the seconds to wait (> 0) and charge nothing. A ``cost``
        above ``burst`` is charged as ``burst`` (admitted on a full bucket
        only)."""
        return self._take(key, self._local(now), cost)

    def _local(self, now: float) -> float:
        """``now`` as the table keeps times: seconds after its first ``now``."""
        origin = self._origin
        if origin is None:
            origin = self._origin = now
        return now - origin

    def _take(self, key: Hashable, now: float, cost: float) -> float:
        due = self._due.get(key)
        if due is None:
            if len(self._due) >= self._max_entries:
                self._sweep(now)
            due = now
        elif due < now:
            due = now
        if cost == 1.0:
            end = due + self._interval_s
        else:
            end = due + self._interval_s * (cost if cost < self._burst else self._burst)
        wait = end - now - self._window_s
        if wait > WAIT_EPSILON_S:
            return self._refuse(key, due, now, cost, wait)
        self._due[key] = end
        return 0.0

    def _refuse(self, key: Hashable, due: float, now: float, cost: float, wait: float) -> float:
        if due - now > self._horizon_s:  # rule 4: the clock went back
            del self._due[key]
            return self._take(key, now, cost)
        self.refused += 1
        return wait

    def refund(self, key: Hashable, cost: float = 1.0) -> None:
        """Give back ``cost`` tokens ``take`` admitted for ``key`` (what was
        charged turned out to cost nothing); never more than a full bucket."""
        due = self._due.get(key)
        if due is not None:
            self._due[key] = due - self._interval_s * (cost if cost < self._burst else self._burst)

    def charge(self, key: Hashable, now: float, cost: float) -> None:
        """Charge ``cost`` tokens (any amount) for ``key`` at ``now`` into
        debt if need be, never deeper than ``max_debt`` tokens (rule 4):
        what something already done cost, paid for by later admissions."""
        now = self._local(now)
        due = self._due.get(key)
        if due is None:
            if len(self._due) >= self._max_entries:
                self._sweep(now)
            due = now
        elif due < now or due - now > self._horizon_s:  # full, or rule 4
            due = now
        self._due[key] = min(due + self._interval_s * cost, now + self._horizon_s)

    def wait_s(self, key: Hashable, now: float, cost: float = 1.0) -> float:
        """What ``take`` would return now, charging nothing either way."""
        now = self._local(now)
        due = self._due.get(key, now)
        start = due if now < due <= now + self._horizon_s else now  # full, or rule 4
        end = start + self._interval_s * (cost if cost < self._burst else self._burst)
        wait = end - now - self._window_s
        return wait if wait > WAIT_EPSILON_S else 0.0

    def _sweep(self, now: float) -> None:
        """Rule 3: drop full buckets, then the oldest down to the share kept."""
        self.sweeps += 1
        due = self._due
        for key in [key for key, at in due.items() if at <= now]:
            del due[key]
        keep = int(self._max_entries * SWEEP_KEEP_SHARE)
        excess = len(due) - keep
        if excess > 0:
            for key in list(islice(due, excess)):
                del due[key]
            self.evicted += excess


def packed_address(address: str) -> bytes | None:
    """The packed bytes of the IP address ``address`` (4 for IPv4, 16 for
    IPv6; an IPv4-mapped IPv6 address gives its 4 IPv4 bytes); None when it
    is not an IP address (a Unix socket, a scoped address is kept unscoped)."""
    try:
        if ":" not in address:
            return socket.inet_pton(socket.AF_INET, address)
        packed = socket.inet_pton(socket.AF_INET6, address.partition("%")[0])
    except (OSError, ValueError, TypeError):
        return None
    if packed[:12] == b"\0" * 10 + b"\xff\xff":
        return packed[12:]
    return packed


#: Prefix lengths of the politeness limits on the targets' side (a probed
#: network: one /24 or /48 is usually one operator's).
IPV4_DESTINATION_PREFIX_BITS = 24
IPV6_DESTINATION_PREFIX_BITS = 48


def destination_prefix(host_or_address: str) -> str:
    """The politeness key of a probe destination: ``"192.0.2.0/24"`` for an
    IPv4 address, ``"2001:db8:1::/48"`` for an IPv6 one, else the host name
    itself."""
    try:
        address = ipaddress.ip_address(host_or_address)
    except ValueError:
        return host_or_address
    bits = IPV4_DESTINATION_PREFIX_BITS if address.version == 4 else IPV6_DESTINATION_PREFIX_BITS
    return str(ipaddress.ip_network(f"{address}/{bits}", strict=False))


def client_prefix(packed: bytes) -> bytes:
    """The rate-limit key of a client at ``packed`` (rule 5): its /24
    (IPv4) or /56 (IPv6) as bytes."""
    if len(packed) == 4:
        return packed[: IPV4_CLIENT_PREFIX_BITS // 8]
    return packed[: IPV6_CLIENT_PREFIX_BITS // 8]


class Exemptions:
    """Client networks no per-client limit applies to (the operator's own
    machine, a TLS terminator in front of the notary)."""

    __slots__ = ("_ranges",)

    def __init__(self, networks: Iterable[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> None:
        # (packed length, first, last) as integers: checked on every
        # accepted connection, so without building ipaddress objects.
        self._ranges = tuple(
            (len(net.network_address.packed), int(net.network_address),
             int(net.broadcast_address))
            for net in networks
        )

    @classmethod
    def from_cidrs(cls, cidrs: Iterable[str]) -> Exemptions:
        """Error handling: ``ConfigError`` naming the first bad CIDR."""
        if isinstance(cidrs, str):
            raise ConfigError("exempt networks must be a list of CIDRs, not one string")
        networks = []
        for cidr in cidrs:
            try:
                networks.append(ipaddress.ip_network(str(cidr).strip(), strict=True))
            except ValueError as exc:
                raise ConfigError(f"invalid CIDR {cidr!r}: {exc}") from None
        return cls(networks)

    def __contains__(self, packed: object) -> bool:
        """Whether the packed address ``packed`` is in an exempt network."""
        if not isinstance(packed, bytes):
            return False
        size = len(packed)
        if size != 4 and size != 16:
            return False
        value = int.from_bytes(packed)
        for length, first, last in self._ranges:
            if length == size and first <= value <= last:
                return True
        return False


class ClientConnections:
    """Open connections per client address and per client prefix (rule 6).

    ``open`` admits a connection (counting it) or refuses it (counting
    nothing); every admitted connection must be ``close``\\ d exactly once.
    """

    __slots__ = ("_by_address", "_by_prefix", "_max_per_address", "_max_per_prefix",
                 "refused_address", "refused_prefix")

    def __init__(self, *, max_per_address: int, max_per_prefix: int) -> None:
        self._max_per_address = max_per_address
        self._max_per_prefix = max_per_prefix
        self._by_address: dict[bytes, int] = {}
        self._by_prefix: dict[bytes, int] = {}
        #: Connections refused by each bound.
        self.refused_address = 0
        self.refused_prefix = 0

    def open(self, packed: bytes) -> bool:
        """Count a connection from the client at ``packed``; False (nothing
        counted) when its address or its prefix is at its maximum."""
        prefix = client_prefix(packed)
        at_address = self._by_address.get(packed, 0)
        if at_address >= self._max_per_address:
            self.refused_address += 1
            return False
        at_prefix = self._by_prefix.get(prefix, 0)
        if at_prefix >= self._max_per_prefix:
            self.refused_prefix += 1
            return False
        self._by_address[packed] = at_address + 1
        self._by_prefix[prefix] = at_prefix + 1
        return True

    def close(self, packed: bytes) -> None:
        """A connection ``open`` admitted has ended."""
        for table, key in ((self._by_address, packed), (self._by_prefix, client_prefix(packed))):
            count = table.get(key, 0) - 1
            if count > 0:
                table[key] = count
            else:
                table.pop(key, None)

    def open_from(self, packed: bytes) -> tuple[int, int]:
        """Connections open from ``packed``'s address and from its prefix."""
        return self._by_address.get(packed, 0), self._by_prefix.get(client_prefix(packed), 0)

    def __len__(self) -> int:
        """Entries held (addresses and prefixes with open connections)."""
        return len(self._by_address) + len(self._by_prefix)


@dataclass(frozen=True, slots=True)
class BytesInFlightStatistics:
    """A snapshot of :class:`BytesInFlight`: bytes held in all (each object
    once), responses held, client prefixes holding some, responses refused
    for their client and for the process."""

    held_bytes: int
    held_responses: int
    clients: int
    refused_client: int
    refused_process: int


class BytesInFlight:
    """Bytes of responses held until sent (rule 7), at most ``max_bytes`` in
    all and ``max_bytes_per_client`` per client prefix (beyond one response
    each); refusals say ``Retry-After: retry_after_s``.

    :meth:`hold` counts a response and returns its release, which whoever
    sends the response calls once it is sent or its connection ended.
    :meth:`check` refuses a response of a given size before it is made.
    Neither awaits: a check and the hold that follows an await may see
    different counts (the hold decides).

    Error handling: ``ValueError`` for bounds that are not positive;
    :class:`RateLimited` and :class:`Overloaded` as rule 7 says."""

    __slots__ = ("_by_client", "_held", "_max_bytes", "_max_per_client", "_objects",
                 "_responses", "_retry_after_s", "refused_client", "refused_process")

    def __init__(self, *, max_bytes: int, max_bytes_per_client: int, retry_after_s: int) -> None:
        if max_bytes < 1 or max_bytes_per_client < 1 or retry_after_s < 1:
            raise ValueError("bounds and retry_after_s must be positive")
        self._max_bytes = max_bytes
        self._max_per_client = max_bytes_per_client
        self._retry_after_s = retry_after_s
        #: id of a held bytes object -> [the object, responses holding it];
        #: the reference keeps the id from being reused while it is here.
        self._objects: dict[int, list] = {}
        self._by_client: dict[bytes, int] = {}
        self._held = 0
        self._responses = 0
        self.refused_client = 0
        self.refused_process = 0

    @property
    def held_bytes(self) -> int:
        return self._held

    def held_by(self, client: bytes) -> int:
        """Bytes held for ``client`` (each response counted)."""
        return self._by_client.get(client, 0)

    def check(self, client: bytes | None, size: int, data: bytes | None = None) -> None:
        """Raise as :meth:`hold` would for a response of ``size`` bytes
        (``data``: the object, when it exists: held already, it adds nothing
        to the total) for ``client`` (None: no per-client bound)."""
        if client is not None:
            mine = self._by_client.get(client, 0)
            if mine and mine + size > self._max_per_client:
                self.refused_client += 1
                raise RateLimited(
                    "too many log bytes waiting for this client; retry later",
                    retry_after_s=self._retry_after_s,
                )
        held = self._held
        if held and (data is None or id(data) not in self._objects) and held + size > self._max_bytes:
            self.refused_process += 1
            raise Overloaded(
                "the notary holds as much as it may for slow readers; retry later",
                retry_after_s=self._retry_after_s,
            )

    def hold(self, client: bytes | None, data: bytes) -> Callable[[], None]:
        """Count ``data``, a response for ``client``, as held, and return
        the function that releases it (calls after the first do nothing).
        Raises as :meth:`check` says, counting nothing."""
        size = len(data)
        self.check(client, size, data)
        shared = self._objects.get(id(data))
        if shared is None:
            self._objects[id(data)] = [data, 1]
            self._held += size
        else:
            shared[1] += 1
        if client is not None:
            self._by_client[client] = self._by_client.get(client, 0) + size
        self._responses += 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            self._responses -= 1
            entry = self._objects[id(data)]
            entry[1] -= 1
            if not entry[1]:
                del self._objects[id(data)]
                self._held -= size
            if client is not None:
                left = self._by_client[client] - size
                if left:
                    self._by_client[client] = left
                else:
                    del self._by_client[client]

        return release

    def statistics(self) -> BytesInFlightStatistics:
        return BytesInFlightStatistics(
            self._held, self._responses, len(self._by_client), self.refused_client,
            self.refused_process,
        )
