"""Targets: the ``host:port`` services a notary is asked about.

A ``Target`` is always normalised, so two spellings of one service share one
cache entry, one store row and one probe.

Pure and sans-IO: nothing here resolves a name or opens a socket. Whether the
notary may *connect* to a target's addresses is a separate question, answered
by :mod:`notary.model.policy` after resolution; this module only decides whether a
target is well-formed and what its canonical spelling is.

Normalisation rules for hosts (:func:`normalise_host`):

1. Input longer than :data:`MAX_HOST_INPUT_CHARS` is refused before any other
   work.
2. ``[...]`` is an IPv6 literal; its canonical form is the compressed text
   without brackets (``[0:0::1]`` -> ``::1``). A bare IPv6 literal (any host
   containing ``:``) is accepted too, as no host name contains ``:``, so it
   is unambiguous in a ``host`` field and in ``host+port``. Zone ids
   (``fe80::1%eth0``) are refused: they name an interface of the *client's*
   machine. An IPv4-mapped address (``[::ffff:192.0.2.1]``) is the same
   endpoint as its IPv4 address and normalises to it (``192.0.2.1``); this
   also keeps keys stable across Python versions, which print mapped
   addresses differently.
3. Otherwise the host is mapped with UTS #46 (case folding, width folding,
   ideographic full stops to ``.``; IDNA 2008, non-transitional), and every
   non-ASCII label is converted to its A-label (``bücher`` ->
   ``xn--bcher-kva``). ASCII input is only lower-cased.
4. One trailing dot is removed (``example.com.`` -> ``example.com``); a second
   one leaves an empty label, which is refused.
5. Labels must be LDH: 1 to :data:`MAX_LABEL_CHARS` characters out of
   ``a-z``, ``0-9`` and ``-``, not starting or ending with ``-``; the whole
   name at most :data:`MAX_HOST_CHARS`. Underscores are refused: names such
   as ``_dmarc`` label DNS records, not TLS services. Labels starting with
   ``xn--`` must be valid IDNA 2008 A-labels.
6. If the last label looks like a number to a URL parser (all decimal digits,
   or ``0x`` and hex digits), the whole host must be an IPv4 address in
   dotted-quad form: four decimal parts 0-255 without leading zeros.
   ``127.1``, ``0x7f.0.0.1``, ``2130706433`` and ``010.0.0.1`` are refused
   because other software reads them as different addresses (octal, hex,
   shortened forms), so the notary would observe a host the client did not
   mean.

A *target* must moreover be a public DNS name or an IP literal
(:func:`public_name_refusal`): :func:`make_target` and
:func:`parse_convergence_target` refuse special-use and private names
(``localhost``, ``.local``, ``.onion``, single labels, ...) with ``"not a
public DNS name"``, before anything could resolve them, so every protocol
that reads a target with them inherits the rule. :func:`normalise_host`
alone does not apply it: it also spells the hosts of notaries (bundles,
notary lists, relay destinations) and of opt-outs, which the callers judge.

Every error is :class:`~notary.errors.BadTarget` with a short message that
never echoes the input, so it is safe as an HTTP 400 body.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

import idna

from notary.errors import BadTarget

__all__ = [
    "MAX_HOST_CHARS",
    "MAX_HOST_INPUT_CHARS",
    "MAX_LABEL_CHARS",
    "MAX_PORT",
    "MAX_PORT_DIGITS",
    "MAX_TARGET_SEGMENT_CHARS",
    "NON_PUBLIC_SUFFIXES",
    "NOT_PUBLIC_NAME",
    "Target",
    "check_public_name",
    "format_convergence_target",
    "make_target",
    "normalise_host",
    "parse_convergence_target",
    "parse_port",
    "public_name_refusal",
]

#: Longest host text looked at, in characters, before normalisation. UTS #46
#: drops some characters (soft hyphens, joiners), so the raw text may be
#: longer than the name it spells; anything longer is refused outright.
MAX_HOST_INPUT_CHARS = 1024
#: Longest normalised host name, in characters, without the trailing dot
#: (RFC 1035: 255 octets on the wire).
MAX_HOST_CHARS = 253
#: Longest label, in characters (RFC 1035).
MAX_LABEL_CHARS = 63
#: Ports are 1..MAX_PORT; port 0 cannot be connected to.
MAX_PORT = 65535
#: Most digits a port may be written with (leading zeros allowed within it).
MAX_PORT_DIGITS = 5
#: Longest Convergence ``host+port`` segment looked at.
MAX_TARGET_SEGMENT_CHARS = MAX_HOST_INPUT_CHARS + 1 + MAX_PORT_DIGITS

#: The separator between host and port in a Convergence path segment.
CONVERGENCE_SEPARATOR = "+"

#: Names that are not public DNS names: a host equal to one of these or
#: under it is refused as a target (:func:`public_name_refusal`).
NON_PUBLIC_SUFFIXES: tuple[str, ...] = (
    "localhost",  # RFC 6761 6.3: the loopback host, answered locally
    "local",  # RFC 6762: multicast DNS, the local link
    "onion",  # RFC 7686: Tor onion services, never looked up in the DNS
    "invalid",  # RFC 6761 6.4: guaranteed not to exist
    "internal",  # ICANN Board, July 2024 (SSAC SAC113): private use
    "home.arpa",  # RFC 8375: home networks
    "alt",  # RFC 9476: names outside the DNS
)
#: The :class:`~notary.errors.BadTarget` message for such a name.
NOT_PUBLIC_NAME = "not a public DNS name"
#: The refusal reason of a name without a dot.
SINGLE_LABEL = "single-label"

_LDH_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?")
_NUMERIC_LABEL = re.compile(r"[0-9]+|0x[0-9a-f]*")
_DECIMAL = re.compile(r"[0-9]+")
_DOTTED_QUAD_PART = re.compile(r"0|[1-9][0-9]{0,2}")
_ACE_PREFIX = "xn--"


@dataclass(frozen=True, slots=True)
class Target:
    """A normalised service: ``host`` is a lower-case A-label name without a
    trailing dot, or an IP literal in its compressed form (IPv6 without
    brackets); ``port`` is 1..65535."""

    host: str
    port: int
    #: The canonical text used as cache and store key: ``host:port``, with
    #: IPv6 literals in brackets. Made once (every query uses it).
    key: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        host, port = self.host, self.port
        object.__setattr__(self, "key", f"[{host}]:{port}" if ":" in host else f"{host}:{port}")

    @property
    def is_ip_literal(self) -> bool:
        return _is_ip_literal(self.host)

    def __str__(self) -> str:
        return self.key


def normalise_host(text: str) -> str:
    """The canonical spelling of the host ``text`` (see the module docstring).

    Returns a lower-case A-label name without trailing dot, a dotted-quad
    IPv4 address, or a compressed IPv6 address without brackets.

    Error handling: raises :class:`~notary.errors.BadTarget` with a short,
    client-safe message for anything else, whatever the input (wrong type,
    NUL bytes, lone surrogates, huge strings); never another exception.
    """
    if not isinstance(text, str):
        raise BadTarget("host must be text")
    if len(text) > MAX_HOST_INPUT_CHARS:
        raise BadTarget("host too long")
    if not text:
        raise BadTarget("empty host")
    if text.startswith("["):
        if not text.endswith("]"):
            raise BadTarget("unclosed bracket in host")
        return _normalise_ipv6(text[1:-1])
    if ":" in text:
        return _normalise_ipv6(text)
    name = text.lower() if text.isascii() else _to_ascii(text)
    return _normalise_ascii_host(name)


def public_name_refusal(host: str) -> str | None:
    """Why the normalised host ``host`` is not a public DNS name, or None if
    it is one (or is an IP literal: the address policy judges those).

    The reason is the entry of :data:`NON_PUBLIC_SUFFIXES` that ``host`` is
    or is under, or ``"single-label"`` for a name without a dot:

    - ``localhost`` and ``*.localhost`` (RFC 6761 section 6.3), ``*.invalid``
      (RFC 6761 section 6.4);
    - ``*.local``: multicast DNS on the notary's own link (RFC 6762);
    - ``*.onion``: Tor onion services, which RFC 7686 section 2 says must
      not be looked up in the DNS (a lookup leaks the name);
    - ``*.internal``: private use, reserved by the ICANN Board in July 2024
      (SSAC advisory SAC113);
    - ``*.home.arpa``: home networks (RFC 8375);
    - ``*.alt``: names of non-DNS name spaces (RFC 9476);
    - single-label names (``intranet``): a stub resolver completes them with
      its search domains, i.e. the operator's own zones.

    ``.test`` and ``.example`` (RFC 6761 sections 6.2 and 6.5) are ordinary
    names here: resolvers look them up like any other.

    Pure: ``host`` is expected as :func:`normalise_host` returns it
    (lower case, A-labels, no trailing dot). Never raises.
    """
    if not isinstance(host, str) or _is_ip_literal(host):
        return None
    for suffix in NON_PUBLIC_SUFFIXES:
        if host == suffix or host.endswith("." + suffix):
            return suffix
    if "." not in host:
        return SINGLE_LABEL
    return None


def check_public_name(host: str) -> None:
    """Return if the normalised ``host`` may be a target (see
    :func:`public_name_refusal`).

    Error handling: raises :class:`~notary.errors.BadTarget` with the
    message :data:`NOT_PUBLIC_NAME` otherwise.
    """
    if public_name_refusal(host) is not None:
        raise BadTarget(NOT_PUBLIC_NAME)


def parse_port(text: str) -> int:
    """The port written as ``text``: 1 to :data:`MAX_PORT_DIGITS` ASCII decimal
    digits (leading zeros allowed), value 1..65535.

    Error handling: raises :class:`~notary.errors.BadTarget` for anything
    else: empty text, a sign, whitespace, non-ASCII digits, 0, > 65535, too
    many digits, a non-string.
    """
    if not isinstance(text, str):
        raise BadTarget("port must be text")
    if not text:
        raise BadTarget("missing port")
    if len(text) > MAX_PORT_DIGITS or not text.isascii() or not _DECIMAL.fullmatch(text):
        raise BadTarget("port must be a number from 1 to 65535")
    port = int(text)
    if not 1 <= port <= MAX_PORT:
        raise BadTarget("port must be a number from 1 to 65535")
    return port


def make_target(host: str, port: int | str) -> Target:
    """A normalised :class:`Target` from a host and a port (an int, or text
    as :func:`parse_port` accepts).

    Error handling: raises :class:`~notary.errors.BadTarget` if the host does
    not normalise, is not a public DNS name (:func:`check_public_name`), or
    the port is not 1..65535 (``bool`` is not a port).
    """
    if isinstance(port, str):
        port_number = parse_port(port)
    elif isinstance(port, int) and not isinstance(port, bool):
        if not 1 <= port <= MAX_PORT:
            raise BadTarget("port must be a number from 1 to 65535")
        port_number = port
    else:
        raise BadTarget("port must be a number from 1 to 65535")
    host = normalise_host(host)
    check_public_name(host)
    return Target(host, port_number)


def parse_convergence_target(segment: str) -> Target:
    """The target named by a Convergence path segment ``host+port``
    (PROTOCOLS.md 1.2), already percent-decoded by the caller.

    There must be exactly one ``+``; IPv6 literals are written ``[::1]+443``
    (bare ``::1+443`` is accepted too, as it is unambiguous).

    Error handling: raises :class:`~notary.errors.BadTarget`: ``"missing
    port"`` when there is no ``+`` or nothing after it, ``"missing host"``
    when nothing is before it, ``"more than one '+' in target"``, and the
    errors of :func:`normalise_host`, :func:`check_public_name` and
    :func:`parse_port`.
    """
    if not isinstance(segment, str):
        raise BadTarget("target must be text")
    if len(segment) > MAX_TARGET_SEGMENT_CHARS:
        raise BadTarget("target too long")
    count = segment.count(CONVERGENCE_SEPARATOR)
    if count == 0:
        raise BadTarget("missing port (expected host+port)")
    if count > 1:
        raise BadTarget("more than one '+' in target")
    host, port = segment.split(CONVERGENCE_SEPARATOR)
    if not host:
        raise BadTarget("missing host")
    if not port:
        raise BadTarget("missing port (expected host+port)")
    normal = normalise_host(host)
    check_public_name(normal)
    return Target(normal, parse_port(port))


def format_convergence_target(target: Target) -> str:
    """The Convergence path segment for ``target``: ``host+port``, IPv6
    literals in brackets (``[::1]+443``). Not percent-encoded: a normalised
    host needs no encoding except ``:`` and brackets, which the caller may
    quote. The inverse of :func:`parse_convergence_target` for normalised
    targets."""
    host = f"[{target.host}]" if ":" in target.host else target.host
    return f"{host}{CONVERGENCE_SEPARATOR}{target.port}"


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _normalise_ipv6(text: str) -> str:
    """Compressed text of the IPv6 literal ``text`` (no brackets)."""
    if "%" in text:
        raise BadTarget("IPv6 zone ids are not allowed")
    # ipaddress only accepts ASCII hex digits, colons and dots; the isascii
    # test keeps odd Unicode out of its error paths.
    if not text.isascii():
        raise BadTarget("invalid IPv6 address")
    try:
        address = ipaddress.IPv6Address(text)
    except ValueError:
        raise BadTarget("invalid IPv6 address") from None
    mapped = address.ipv4_mapped
    if mapped is not None:
        return str(mapped)
    return address.compressed


def _to_ascii(text: str) -> str:
    """``text`` mapped with UTS #46 and with every non-ASCII label turned into
    its A-label; ASCII labels are left for :func:`_normalise_ascii_host`, so
    they follow the same rules whether or not a neighbour is non-ASCII."""
    try:
        # std3_rules refuses ASCII that is not LDH or ".", including what a
        # mapping produces (e.g. FULLWIDTH LOW LINE -> "_").
        mapped = idna.uts46_remap(text, std3_rules=True, transitional=False)
    except (idna.IDNAError, UnicodeError, ValueError):
        raise BadTarget("invalid character in host name") from None
    if mapped.isascii():
        return mapped
    labels = mapped.split(".")
    for index, label in enumerate(labels):
        if label.isascii():
            continue
        try:
            labels[index] = idna.alabel(label).decode("ascii")
        except (idna.IDNAError, UnicodeError, ValueError):
            raise BadTarget("invalid internationalised label in host name") from None
    return ".".join(labels)


def _normalise_ascii_host(name: str) -> str:
    """Validate the lower-case ASCII ``name`` (rules 4 to 6) and return it
    without its trailing dot, or as a canonical IPv4 address."""
    if name.endswith("."):
        name = name[:-1]
    if not name:
        raise BadTarget("empty host")
    labels = name.split(".")
    if _NUMERIC_LABEL.fullmatch(labels[-1]):
        return _normalise_ipv4(labels)
    if len(name) > MAX_HOST_CHARS:
        raise BadTarget("host name too long")
    for label in labels:
        _check_label(label)
    return name


def _check_label(label: str) -> None:
    if not label:
        raise BadTarget("empty label in host name")
    if len(label) > MAX_LABEL_CHARS:
        raise BadTarget("label too long in host name")
    if not _LDH_LABEL.fullmatch(label):
        if label.startswith("-") or label.endswith("-"):
            raise BadTarget("label starts or ends with a hyphen")
        raise BadTarget("invalid character in host name")
    if label.startswith(_ACE_PREFIX):
        try:
            idna.ulabel(label)
        except (idna.IDNAError, UnicodeError, ValueError):
            raise BadTarget("invalid internationalised label in host name") from None


def _normalise_ipv4(parts: list[str]) -> str:
    """Canonical dotted quad from the labels of a numeric-looking host."""
    if len(parts) != 4 or not all(_DOTTED_QUAD_PART.fullmatch(part) for part in parts):
        raise BadTarget("invalid IPv4 address (dotted quad required)")
    values = [int(part) for part in parts]
    if any(value > 255 for value in values):
        raise BadTarget("invalid IPv4 address (dotted quad required)")
    return ".".join(str(value) for value in values)
