"""Address policy: which IP addresses the notary may connect to.

The prober (and later the relay) asks this policy about every address a name
resolves to, and connects only to an address it permits (DESIGN.md, "the notary
never connects to an address its policy forbids"). This closes the original
notaries' SSRF hole (PROTOCOLS.md section 3).

Pure and sans-IO: no sockets, no name resolution, no clock.

Besides the built-in ranges, the operator may *opt out* targets (``[server]
opt_out``: names and networks whose owners asked not to be probed): an
opted-out address or name is refused whatever else allows it.

Rules, in the order :meth:`AddressPolicy.refusal` applies them:

1. Text that is not an IP address (after no trimming at all) is refused as
   ``"invalid"``; so is an IPv6 address carrying a zone id (``fe80::1%eth0``)
   as ``"scoped"``: a zone only makes sense on link-local addresses, which are
   refused anyway, and an allow list cannot name a zone.
1b. An address inside one of the operator's ``opted_out`` networks (``[server]
   opt_out``: targets whose owners asked not to be probed) is refused as
   ``"opt-out"``, whatever the allow list says; so is an IPv6 address that
   embeds (rule 3's prefixes) an opted-out IPv4 address.
2. An address inside one of the operator's ``allowed`` networks is permitted,
   even in a refused range (tests and demos allow ``127.0.0.0/8``). An
   IPv4-mapped IPv6 address (``::ffff:a.b.c.d``) is the same endpoint as its
   IPv4 address, so it is also permitted when that IPv4 address is allowed.
3. IPv6 addresses in a prefix that embeds IPv4 addresses
   (:data:`IPV4_EMBEDDING_PREFIXES`: IPv4-mapped, NAT64 well-known prefix,
   6to4, Teredo) are judged by the embedded IPv4 address(es) alone, against
   :data:`REFUSED_NETWORKS` (the allow list is not consulted for them, except
   for the mapped form as said in 2). Teredo embeds two (server and client);
   either being refused refuses the address.
4. Otherwise the most specific (longest-prefix) entry of
   :data:`REFUSED_NETWORKS` containing the address gives the reason; no entry
   means the address is permitted.

The tables are explicit on purpose: ``ipaddress``'s ``is_private`` /
``is_global`` change between Python versions. IPv6 space outside the
allocated global unicast ``2000::/3`` and the special blocks is refused as
``"reserved"``, as ``240.0.0.0/4`` is for IPv4. IPv4-compatible addresses
(``::a.b.c.d``, deprecated by RFC 4291) and the local-use NAT64 prefix
``64:ff9b:1::/48`` (RFC 8215, not globally reachable; its IPv4 layout depends
on the operator's prefix length) are refused outright, whatever they embed.

Names: :meth:`AddressPolicy.name_refusal` refuses a host name that is, or is
under, an opted-out name (``"example.org"`` covers ``www.example.org``), before
any resolution (``notary.outbound.dialer.dial`` asks it first, so an opted-out name is
never even resolved); the addresses it resolves to then meet the rules above.

Reason words (short, stable, safe to show a client and to count in
statistics): see :data:`REASONS`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

from notary.errors import BadTarget, ConfigError, ProbeRefused
from notary.model.targets import normalise_host

__all__ = [
    "IPV4_EMBEDDING_PREFIXES",
    "MAX_ADDRESS_TEXT_CHARS",
    "OPT_OUT",
    "REASONS",
    "REFUSED_NETWORKS",
    "AddressPolicy",
]

#: Longest address text worth parsing: a full IPv6 address with an embedded
#: dotted quad is 45 characters; the rest leaves room for a zone id. Longer
#: text is refused as ``"invalid"`` without being parsed.
MAX_ADDRESS_TEXT_CHARS = 100

#: Longest CIDR text accepted in configuration.
MAX_CIDR_TEXT_CHARS = 100

IPAddress = IPv4Address | IPv6Address
IPNetwork = IPv4Network | IPv6Network


def _net(text: str) -> IPNetwork:
    return ipaddress.ip_network(text, strict=True)


#: Networks the notary refuses to connect to, each with the reason word
#: reported. Lookup is longest-prefix-first, so a specific entry (``::1/128``,
#: ``2001:db8::/32``) overrides the broad one containing it (``::/96``,
#: ``2001::/23``). Sources: the IANA IPv4 and IPv6 special-purpose address
#: registries and the IPv6 address space registry.
REFUSED_NETWORKS: tuple[tuple[IPNetwork, str], ...] = (
    # --- IPv4 ---------------------------------------------------------------
    (_net("0.0.0.0/8"), "unspecified"),  # "this network", RFC 791
    (_net("10.0.0.0/8"), "private"),  # RFC 1918
    (_net("100.64.0.0/10"), "shared"),  # CGNAT shared address space, RFC 6598
    (_net("127.0.0.0/8"), "loopback"),  # RFC 1122
    (_net("169.254.0.0/16"), "link-local"),  # RFC 3927
    (_net("172.16.0.0/12"), "private"),  # RFC 1918
    (_net("192.0.0.0/24"), "ietf-protocol"),  # IETF protocol assignments, RFC 6890
    (_net("192.0.2.0/24"), "documentation"),  # TEST-NET-1, RFC 5737
    (_net("192.88.99.0/24"), "6to4-relay"),  # 6to4 relay anycast, RFC 7526
    (_net("192.168.0.0/16"), "private"),  # RFC 1918
    (_net("198.18.0.0/15"), "benchmarking"),  # RFC 2544
    (_net("198.51.100.0/24"), "documentation"),  # TEST-NET-2, RFC 5737
    (_net("203.0.113.0/24"), "documentation"),  # TEST-NET-3, RFC 5737
    (_net("224.0.0.0/4"), "multicast"),  # RFC 5771
    (_net("240.0.0.0/4"), "reserved"),  # RFC 1112
    (_net("255.255.255.255/32"), "broadcast"),  # limited broadcast, RFC 919
    # --- IPv6 ---------------------------------------------------------------
    (_net("::/128"), "unspecified"),  # RFC 4291
    (_net("::1/128"), "loopback"),  # RFC 4291
    (_net("::/96"), "deprecated"),  # IPv4-compatible, deprecated by RFC 4291
    (_net("::/8"), "reserved"),  # reserved by IETF (mapped / NAT64 handled apart)
    (_net("64:ff9b:1::/48"), "private"),  # local-use NAT64, RFC 8215
    (_net("100::/64"), "discard"),  # discard-only, RFC 6666
    (_net("100::/8"), "reserved"),
    (_net("200::/7"), "reserved"),
    (_net("400::/6"), "reserved"),
    (_net("800::/5"), "reserved"),
    (_net("1000::/4"), "reserved"),
    (_net("2001::/23"), "ietf-protocol"),  # IETF protocol assignments, RFC 2928
    (_net("2001:2::/48"), "benchmarking"),  # RFC 5180
    (_net("2001:10::/28"), "reserved"),  # ORCHID (deprecated), RFC 4843
    (_net("2001:20::/28"), "reserved"),  # ORCHIDv2 identifiers, not routable, RFC 7343
    (_net("2001:db8::/32"), "documentation"),  # RFC 3849
    (_net("3fff::/20"), "documentation"),  # RFC 9637
    (_net("4000::/2"), "reserved"),  # 4000::/3 and 6000::/3 (includes SRv6 5f00::/16)
    (_net("8000::/2"), "reserved"),  # 8000::/3 and a000::/3
    (_net("c000::/3"), "reserved"),
    (_net("e000::/4"), "reserved"),
    (_net("f000::/5"), "reserved"),
    (_net("f800::/6"), "reserved"),
    (_net("fc00::/7"), "private"),  # unique local, RFC 4193
    (_net("fe00::/9"), "reserved"),
    (_net("fe80::/10"), "link-local"),  # RFC 4291
    (_net("fec0::/10"), "site-local"),  # deprecated by RFC 3879
    (_net("ff00::/8"), "multicast"),  # RFC 4291
)


def _mapped(address: IPv6Address) -> tuple[IPv4Address, ...]:
    mapped = address.ipv4_mapped
    return (mapped,) if mapped is not None else ()


def _low_32_bits(address: IPv6Address) -> tuple[IPv4Address, ...]:
    return (IPv4Address(int(address) & 0xFFFF_FFFF),)


def _sixtofour(address: IPv6Address) -> tuple[IPv4Address, ...]:
    embedded = address.sixtofour
    return (embedded,) if embedded is not None else ()


def _teredo(address: IPv6Address) -> tuple[IPv4Address, ...]:
    pair = address.teredo
    return pair if pair is not None else ()


#: IPv6 prefixes whose addresses embed IPv4 addresses, with how to extract
#: them. An address in one of these is judged by what it embeds (rule 3).
IPV4_EMBEDDING_PREFIXES: tuple[
    tuple[IPv6Network, str, Callable[[IPv6Address], tuple[IPv4Address, ...]]], ...
] = (
    (IPv6Network("::ffff:0:0/96"), "ipv4-mapped", _mapped),  # RFC 4291
    (IPv6Network("64:ff9b::/96"), "nat64", _low_32_bits),  # RFC 6052
    (IPv6Network("2002::/16"), "6to4", _sixtofour),  # RFC 3056
    (IPv6Network("2001::/32"), "teredo", _teredo),  # RFC 4380
)

#: The reason word of an opted-out network or name (rule 1b).
OPT_OUT = "opt-out"

#: Every reason word :meth:`AddressPolicy.refusal` can return.
REASONS: frozenset[str] = frozenset(
    {reason for _, reason in REFUSED_NETWORKS} | {"invalid", "scoped", OPT_OUT}
)

# Longest prefix first, per family, so the first match is the most specific.
_REFUSED_V4: tuple[tuple[IPv4Network, str], ...] = tuple(
    sorted(
        ((n, r) for n, r in REFUSED_NETWORKS if isinstance(n, IPv4Network)),
        key=lambda entry: -entry[0].prefixlen,
    )
)
_REFUSED_V6: tuple[tuple[IPv6Network, str], ...] = tuple(
    sorted(
        ((n, r) for n, r in REFUSED_NETWORKS if isinstance(n, IPv6Network)),
        key=lambda entry: -entry[0].prefixlen,
    )
)


def _table_reason(address: IPAddress) -> str | None:
    """The reason of the most specific refused network holding ``address``."""
    if isinstance(address, IPv4Address):
        for network4, reason in _REFUSED_V4:
            if address in network4:
                return reason
        return None
    for network6, reason in _REFUSED_V6:
        if address in network6:
            return reason
    return None


def _parse_address(address: object) -> IPAddress | None:
    """``address`` as an address object, or None if it is not one."""
    if isinstance(address, IPv4Address | IPv6Address):
        return address
    if not isinstance(address, str) or len(address) > MAX_ADDRESS_TEXT_CHARS:
        return None
    try:
        return ipaddress.ip_address(address)
    except ValueError:  # includes UnicodeError
        return None


def _parse_cidr(cidr: object) -> IPNetwork:
    """One allow-list entry; raises ConfigError naming it if it is bad."""
    if not isinstance(cidr, str):
        raise ConfigError(f"invalid CIDR {cidr!r}: not a string")
    shown = cidr if len(cidr) <= MAX_CIDR_TEXT_CHARS else cidr[:MAX_CIDR_TEXT_CHARS] + "..."
    text = cidr.strip()
    if not text or len(text) > MAX_CIDR_TEXT_CHARS:
        raise ConfigError(f"invalid CIDR {shown!r}: empty or too long")
    if "%" in text:
        raise ConfigError(f"invalid CIDR {shown!r}: zone ids are not allowed")
    try:
        return ipaddress.ip_network(text, strict=True)
    except ValueError as exc:  # includes UnicodeError
        raise ConfigError(f"invalid CIDR {shown!r}: {exc}") from None


def _parse_opt_out(entry: object) -> IPNetwork | str:
    """One ``opt_out`` entry: a network (CIDR or bare address) or a host name
    (normalised as targets are); raises ConfigError naming it if it is bad."""
    if not isinstance(entry, str):
        raise ConfigError(f"invalid opt-out entry {entry!r}: not a string")
    text = entry.strip()
    if "/" in text:
        return _parse_cidr(text)
    try:
        host = normalise_host(text)
    except BadTarget as exc:
        shown = text if len(text) <= MAX_CIDR_TEXT_CHARS else text[:MAX_CIDR_TEXT_CHARS] + "..."
        raise ConfigError(f"invalid opt-out entry {shown!r}: {exc.message}") from None
    if _parse_address(host) is not None:
        return _parse_cidr(host)
    return host


@dataclass(frozen=True, slots=True)
class AddressPolicy:
    """Which IP addresses (and names) the notary may connect to.

    ``AddressPolicy()`` refuses everything in :data:`REFUSED_NETWORKS` (and
    the embedded forms, see the module docstring); ``allowed`` lists networks
    the operator permits anyway; ``opted_out`` networks and
    ``opted_out_names`` (with every name under them) are refused whatever
    ``allowed`` says.
    """

    allowed: tuple[IPv4Network | IPv6Network, ...] = ()
    opted_out: tuple[IPv4Network | IPv6Network, ...] = ()
    opted_out_names: frozenset[str] = frozenset()

    @classmethod
    def from_cidrs(cls, cidrs: Iterable[str], opt_out: Iterable[str] = ()) -> AddressPolicy:
        """A policy allowing the given networks (``"127.0.0.0/8"``, ``"::1"``)
        and refusing the ``opt_out`` entries: networks, or host names (each
        covering the names under it: ``"example.org"`` covers
        ``"www.example.org"``).

        A bare address means a single-address network. Surrounding whitespace
        is ignored.

        Error handling: raises :class:`~notary.errors.ConfigError` naming the
        first bad entry: not a string, empty, unparseable, host bits set
        (``"10.0.0.1/8"``: a likely typo), carrying a zone id, or (opt-out) a
        name that is not a valid host name.
        """
        if isinstance(cidrs, str) or isinstance(opt_out, str):
            # A lone string would iterate per character; be explicit instead.
            raise ConfigError("networks must be a list of CIDRs, not one string")
        networks: list[IPNetwork] = []
        names: set[str] = set()
        for entry in opt_out:
            parsed = _parse_opt_out(entry)
            if isinstance(parsed, str):
                names.add(parsed)
            else:
                networks.append(parsed)
        return cls(
            allowed=tuple(_parse_cidr(cidr) for cidr in cidrs),
            opted_out=tuple(networks),
            opted_out_names=frozenset(names),
        )

    def name_refusal(self, host: str) -> str | None:
        """``"opt-out"`` when the normalised host name ``host`` is an opted-out
        name or under one, else None (IP literals: None, ``refusal`` judges
        them). Never raises."""
        names = self.opted_out_names
        if not names or not isinstance(host, str) or _parse_address(host) is not None:
            return None
        name = host
        while True:
            if name in names:
                return OPT_OUT
            dot = name.find(".")
            if dot < 0:
                return None
            name = name[dot + 1:]

    def check_name(self, host: str) -> None:
        """Return if the notary may resolve and connect to the name ``host``.

        Error handling: raises :class:`~notary.errors.ProbeRefused` (``"target
        refused by policy: opt-out"``) otherwise.
        """
        reason = self.name_refusal(host)
        if reason is not None:
            raise ProbeRefused(f"target refused by policy: {reason}")

    def _is_opted_out(self, ip: IPAddress) -> bool:
        if any(ip.version == net.version and ip in net for net in self.opted_out):
            return True
        if isinstance(ip, IPv6Address):
            for prefix, _kind, extract in IPV4_EMBEDDING_PREFIXES:
                if ip in prefix:
                    return any(
                        embedded in net
                        for embedded in extract(ip)
                        for net in self.opted_out
                        if net.version == 4
                    )
        return False

    def refusal(self, address: str | IPv4Address | IPv6Address) -> str | None:
        """Why the notary must not connect to ``address``, or None if it may.

        The reason is one word of :data:`REASONS` (``"loopback"``,
        ``"private"``, ...). Never raises: anything that is not an IP address
        (text with a port, brackets, NUL bytes, a host name, another type) is
        refused as ``"invalid"``.
        """
        ip = _parse_address(address)
        if ip is None:
            return "invalid"
        if isinstance(ip, IPv6Address) and ip.scope_id is not None:
            return "scoped"
        if self.opted_out and self._is_opted_out(ip):
            return OPT_OUT
        if isinstance(ip, IPv6Address):
            if self._is_allowed(ip):
                return None
            mapped = ip.ipv4_mapped
            if mapped is not None and self._is_allowed(mapped):
                return None
            for prefix, _kind, extract in IPV4_EMBEDDING_PREFIXES:
                if ip in prefix:
                    for embedded in extract(ip):
                        reason = _table_reason(embedded)
                        if reason is not None:
                            return reason
                    return None
            return _table_reason(ip)
        if self._is_allowed(ip):
            return None
        return _table_reason(ip)

    def check(self, address: str | IPv4Address | IPv6Address) -> None:
        """Return if the notary may connect to ``address``.

        Error handling: raises :class:`~notary.errors.ProbeRefused` with the
        message ``"address refused by policy: <reason>"`` otherwise (including
        for invalid input).
        """
        reason = self.refusal(address)
        if reason is not None:
            raise ProbeRefused(f"address refused by policy: {reason}")

    def _is_allowed(self, ip: IPAddress) -> bool:
        return any(ip.version == net.version and ip in net for net in self.allowed)


#: For the client only (the user's own machine, pointed where its user
#: chooses): every address allowed. A notary never uses it.
ANY_ADDRESS = AddressPolicy.from_cidrs(["0.0.0.0/0", "::/0"])
