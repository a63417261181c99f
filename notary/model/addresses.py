"""What the notary's own resolutions said: the addresses each name resolved
to, and when (issue 31, item 4).

A client may tell the notary which address its own TLS connection reached
(a v2 entry's ``address``). The prober adds such a hint to its probe only
when the notary's own resolution of that name returned that address within
``[probe] address_memory_s``: nobody can make the notary probe an arbitrary
address under another site's name. This table is that memory.

Pure and sans-IO: no Trio, no clock (``now`` is a parameter, Unix seconds).

Rules this module keeps:

1. **What is remembered**: :meth:`AddressMemory.remember` takes a name and
   the addresses one resolution returned (the ones the address policy
   allowed: only those may ever be probed), at most
   ``MAX_ADDRESSES_PER_NAME`` of them in the resolver's order; the name's
   addresses from earlier resolutions still within ``memory_s`` are kept
   after them while the name holds fewer than that.
2. **What is known**: :meth:`AddressMemory.knows` is true for an address a
   resolution of that name returned at most ``memory_s`` before ``now``
   (IPv4-mapped IPv6 addresses are their IPv4 address; the spelling of an
   address does not matter).
3. **Bounded**: the table holds at most ``max_entries`` addresses in all
   (name, address pairs). A resolution that would take it beyond drops the
   names resolved longest ago first, whole. Forgetting can only refuse a
   hint the notary would have taken, never take one it would have refused.
   Each name's entry costs about ``BYTES_PER_NAME`` plus
   ``BYTES_PER_ADDRESS`` per address.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict
from collections.abc import Iterable

__all__ = [
    "BYTES_PER_ADDRESS",
    "BYTES_PER_NAME",
    "MAX_ADDRESSES_PER_NAME",
    "AddressMemory",
    "canonical_address",
]

#: Addresses remembered per name at most (rule 1): more than a probe
#: connects to (``[probe] max_addresses``, 8 by default), so that a client
#: reaching an address the probe left out can still have it probed.
MAX_ADDRESSES_PER_NAME = 32
#: Rough bytes of one name's entry (the key, its dict, the ordered dict's
#: links), and of each address in it (its text and a float).
BYTES_PER_NAME = 400
BYTES_PER_ADDRESS = 120


def canonical_address(text: str) -> str | None:
    """``text`` as the one spelling of its IP address (IPv4-mapped IPv6 as
    IPv4; IPv6 compressed, lower case); None if it is not an IP address."""
    try:
        ip = ipaddress.ip_address(text.strip())
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip)


class AddressMemory:
    """The addresses each name resolved to, and when; see the module
    docstring. Raises ``ValueError`` for a negative ``memory_s`` or a
    ``max_entries`` below 1."""

    __slots__ = ("_entries", "_names", "evicted", "max_entries", "memory_s")

    def __init__(self, *, memory_s: float, max_entries: int) -> None:
        if memory_s < 0:
            raise ValueError("memory_s must be 0 or more")
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.memory_s = memory_s
        self.max_entries = max_entries
        #: name -> {address: when a resolution last returned it}, the
        #: name resolved longest ago first.
        self._names: OrderedDict[str, dict[str, float]] = OrderedDict()
        #: Addresses held in all (rule 3).
        self._entries = 0
        #: Names dropped to stay within ``max_entries`` (cumulative).
        self.evicted = 0

    def __len__(self) -> int:
        """Addresses held, over every name."""
        return self._entries

    @property
    def names(self) -> int:
        return len(self._names)

    def remember(self, name: str, addresses: Iterable[str], now: float) -> None:
        """One resolution of ``name`` returned ``addresses`` at ``now`` (rule 1)."""
        key = name.lower()
        earlier = self._names.pop(key, None)
        kept: dict[str, float] = {}
        for text in addresses:
            address = canonical_address(text)
            if address is not None and address not in kept:
                kept[address] = now
                if len(kept) >= MAX_ADDRESSES_PER_NAME:
                    break
        if earlier is not None:
            self._entries -= len(earlier)
            oldest = now - self.memory_s
            for address, seen_at in sorted(earlier.items(), key=lambda item: -item[1]):
                if len(kept) >= MAX_ADDRESSES_PER_NAME:
                    break
                if address not in kept and seen_at >= oldest:
                    kept[address] = seen_at
        if not kept:
            return
        if len(kept) > self.max_entries:  # a table smaller than one name's entry
            kept = dict(list(kept.items())[: self.max_entries])
        while self._names and self._entries + len(kept) > self.max_entries:
            _, dropped = self._names.popitem(last=False)
            self._entries -= len(dropped)
            self.evicted += 1
        self._names[key] = kept
        self._entries += len(kept)

    def knows(self, name: str, address: str, now: float) -> bool:
        """Whether a resolution of ``name`` returned ``address`` within
        ``memory_s`` of ``now`` (rule 2)."""
        canonical = canonical_address(address)
        if canonical is None:
            return False
        seen_at = self._names.get(name.lower(), {}).get(canonical)
        return seen_at is not None and seen_at >= now - self.memory_s
