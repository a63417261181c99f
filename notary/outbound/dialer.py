"""Outgoing TCP connections under the address policy: the one way the notary
connects anywhere (the prober to targets, the relay to other notaries).

An I/O edge (Trio). Rules this module keeps:

1. The address checked by the policy is the address connected to. Names are
   resolved once, by the injected resolver; ``trio.open_tcp_stream`` and
   friends never see a name, so no second DNS answer can sneak past the policy.
   IPv4-mapped IPv6 answers (``::ffff:a.b.c.d``) are checked and connected to
   as the IPv4 address they carry.
2. A name the policy refuses as such (an operator's opt-out,
   :meth:`AddressPolicy.name_refusal`) is refused before it is resolved.
   Names are resolved as absolute names (:func:`absolute_name`): the system
   resolver never completes them with its search domains. Special-use and
   single-label names never get here as targets: the target parsers refuse
   them (:func:`notary.model.targets.public_name_refusal`).
3. At most ``MAX_ADDRESSES_PER_DIAL`` allowed addresses are tried, in the
   resolver's order, staggered happy-eyeballs style; the first to connect
   wins and the other attempts are cancelled or closed.
4. A caller that connects to each address itself (the prober, which
   handshakes with every address of a name) gets the checked addresses
   from :func:`allowed_addresses` and connects to each with
   :func:`connect`, which takes an IP literal only: rule 1 holds.

Resource handling: :func:`dial` returns an open stream the caller owns; on
every failure path the sockets it opened are closed. Timeouts are the
caller's (wrap the call in ``trio.fail_after``).

Error handling: every failure is a :class:`~notary.errors.ProbeError`
subclass with a short message safe to show a client: ``ProbeResolveFailed``,
``ProbeRefused`` (no resolved address is allowed), ``ProbeConnectFailed``.
``OSError`` never escapes.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Sequence
from functools import partial

import trio

from notary.errors import ProbeConnectFailed, ProbeError, ProbeRefused, ProbeResolveFailed
from notary.model.policy import AddressPolicy

__all__ = [
    "CONNECT_STAGGER_S",
    "MAX_ADDRESSES_PER_DIAL",
    "Resolver",
    "absolute_name",
    "allowed_addresses",
    "connect",
    "connect_first",
    "dial",
    "dial_first",
    "resolve",
    "system_resolver",
]

logger = logging.getLogger(__name__)

#: ``(host, port) -> IP address strings``, ``host`` a normalised name
#: (no trailing dot) to be resolved as an absolute name. Raises
#: ``ProbeResolveFailed`` (or ``OSError``, mapped to it) when the name does
#: not resolve.
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]

#: At most this many resolved (and allowed) addresses are tried per dial.
MAX_ADDRESSES_PER_DIAL = 8
#: Happy-eyeballs-style stagger: when an attempt has neither connected nor
#: failed after this long, the next address is tried in parallel (RFC 8305's
#: recommended 250 ms, also Trio's default).
CONNECT_STAGGER_S = 0.25


def absolute_name(host: str) -> str:
    """``host`` spelt for the system resolver as an absolute name: with a
    trailing dot, so that no search domain of the machine's resolver
    configuration is tried with it (a stub resolver tries
    ``name.<search domain>`` before ``name`` when ``name`` has fewer dots
    than ``ndots``, and after it when ``name`` does not resolve).

    Left as they are: IP literals, names already ending in a dot, and
    ``localhost`` and names under it (RFC 6761 section 6.3: answered by the
    machine itself, e.g. from ``/etc/hosts``, which lists them without the
    dot; the client may name a notary so, targets never are).
    """
    if not host or host.endswith(".") or _is_ip_literal(host):
        return host
    if host == "localhost" or host.endswith(".localhost"):
        return host
    return host + "."


async def system_resolver(host: str, port: int) -> list[str]:
    """Resolve ``host`` with the system resolver (``getaddrinfo``, TCP), as
    an absolute name (:func:`absolute_name`).

    Returns the IP address strings in the resolver's order, without
    duplicates.

    Error handling: ``socket.gaierror`` (and any other ``OSError`` or IDNA
    ``UnicodeError``) becomes :class:`~notary.errors.ProbeResolveFailed`; an
    empty answer too.
    """
    try:
        infos = await trio.socket.getaddrinfo(
            absolute_name(host), port, type=socket.SOCK_STREAM
        )
    except (OSError, UnicodeError):
        raise ProbeResolveFailed("name did not resolve") from None
    addresses: list[str] = []
    for _family, _type, _proto, _canonname, sockaddr in infos:
        address = str(sockaddr[0])
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise ProbeResolveFailed("name has no addresses")
    return addresses


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


async def resolve(host: str, port: int, resolver: Resolver) -> Sequence[str]:
    """The candidate addresses of ``host``: itself if it is an IP literal,
    else the resolver's answer.

    Error handling: ``ProbeResolveFailed`` for a failed or empty answer.
    """
    if _is_ip_literal(host):
        return (host,)
    try:
        answer = await resolver(host, port)
    except ProbeError:
        raise
    except (OSError, UnicodeError):
        raise ProbeResolveFailed("name did not resolve") from None
    if not answer:
        raise ProbeResolveFailed("name has no addresses")
    return answer


def allowed_addresses(
    policy: AddressPolicy, candidates: Sequence[str], *, what: str = "host",
    limit: int | None = MAX_ADDRESSES_PER_DIAL,
) -> list[str]:
    """The candidates ``policy`` allows, canonical (an IPv4-mapped IPv6
    address as its IPv4 address), deduplicated, in order, at most ``limit``
    (None: all of them).

    Error handling: ``ProbeRefused`` naming the first refusal's reason when
    none is allowed (``what`` names the host in the debug log only).
    """
    allowed: list[str] = []
    refusals: list[str] = []
    for text in candidates:
        try:
            ip = ipaddress.ip_address(text)
        except ValueError:
            refusals.append("invalid")
            continue
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        reason = policy.refusal(ip)
        if reason is not None:
            refusals.append(reason)
        elif str(ip) not in allowed:
            allowed.append(str(ip))
    if not allowed:
        logger.debug("connection to %s refused by policy: %s", what, ", ".join(refusals))
        word = refusals[0] if refusals else "no address"
        raise ProbeRefused(f"address refused by policy: {word}")
    return allowed if limit is None else allowed[:limit]


async def dial(
    host: str, port: int, *, policy: AddressPolicy, resolver: Resolver,
    admit: Callable[[str], None] | None = None,
) -> tuple[trio.SocketStream, str]:
    """Resolve ``host`` (unless ``policy`` refuses the name), keep the
    addresses ``policy`` allows, connect to the first that answers; return
    the stream and the address connected to.

    ``admit``, if given, is called with the first allowed address after the
    policy check and before any connection: it may raise a ``ProbeError``
    (e.g. a politeness limit keyed by that address) and then nothing is
    connected."""
    policy.check_name(host)
    addresses = allowed_addresses(policy, await resolve(host, port, resolver), what=host)
    if admit is not None:
        admit(addresses[0])
    return await connect_first(addresses, port)


#: One connection attempt: a stream, or a ``ProbeError``.
Attempt = Callable[[], Awaitable[trio.SocketStream]]


async def _race(attempts: Sequence[Attempt], *, stagger_s: float) -> tuple[trio.SocketStream, int]:
    """Run ``attempts``, starting each ``stagger_s`` after the previous one
    (at once when the previous one failed); the first to succeed wins, the
    others are cancelled (or closed, if they connected too late). Returns the
    stream and the winner's index.

    Error handling: ``_AllFailed`` with every attempt's ``ProbeError``.
    """
    if len(attempts) == 1:  # no race to run: no nursery, nothing to cancel
        try:
            return await attempts[0](), 0
        except ProbeError as exc:
            raise _AllFailed([exc]) from None
    winners: list[tuple[trio.SocketStream, int]] = []
    failures: list[ProbeError] = []

    async def run(index: int, failed: trio.Event, nursery: trio.Nursery) -> None:
        try:
            stream = await attempts[index]()
        except ProbeError as exc:
            failures.append(exc)
            failed.set()
            return
        if winners:  # lost the race
            stream.socket.close()
            return
        winners.append((stream, index))
        nursery.cancel_scope.cancel()

    try:
        async with trio.open_nursery() as nursery:
            for index in range(len(attempts)):
                failed = trio.Event()
                nursery.start_soon(run, index, failed, nursery)
                if stagger_s > 0:
                    with trio.move_on_after(stagger_s):
                        await failed.wait()
    except BaseException:
        for stream, _ in winners:
            stream.socket.close()
        raise
    if not winners:
        raise _AllFailed(failures)
    return winners[0]


class _AllFailed(Exception):
    def __init__(self, failures: list[ProbeError]) -> None:
        super().__init__(failures)
        self.failures = failures


async def dial_first(
    destinations: Sequence[tuple[str, int]], *, policy: AddressPolicy, resolver: Resolver
) -> tuple[trio.SocketStream, int]:
    """:func:`dial` every ``(host, port)`` in parallel; the first to connect
    wins, the others are cancelled (or closed, if they connected too late).
    Returns the stream and the winner's index in ``destinations``.

    Error handling: ``ProbeRefused`` when the policy refused every
    destination; else ``ProbeConnectFailed`` when none connected (the
    reasons are in the debug log). The deadline is the caller's.
    """

    def attempt(host: str, port: int) -> Attempt:
        async def connect() -> trio.SocketStream:
            try:
                stream, _address = await dial(host, port, policy=policy, resolver=resolver)
            except ProbeError as exc:
                logger.debug("cannot connect to %s port %d: %s", host, port, exc)
                raise
            return stream

        return connect

    try:
        return await _race([attempt(h, p) for h, p in destinations], stagger_s=0)
    except _AllFailed as failed:
        if failed.failures and all(isinstance(f, ProbeRefused) for f in failed.failures):
            raise ProbeRefused("address refused by policy") from None
        raise ProbeConnectFailed("could not connect") from None


async def connect(address: str, port: int) -> trio.SocketStream:
    """A TCP connection to the IP literal ``address`` (never a name: rule
    4), which the caller checked against the policy. The caller owns the
    stream; nothing is left open on failure.

    Error handling: an ``OSError`` becomes ``ProbeConnectFailed``."""
    return await _open_stream(address, port)


async def _open_stream(address: str, port: int) -> trio.SocketStream:
    """A TCP connection to the IP literal ``address`` (never a name); an
    ``OSError`` becomes ``ProbeConnectFailed``."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = trio.socket.socket(family, socket.SOCK_STREAM)
    try:
        await sock.connect((address, port))
    except OSError as exc:
        sock.close()
        logger.debug("connect to port %d of an address failed: %s", port, exc.strerror)
        raise ProbeConnectFailed("could not connect") from None
    except BaseException:
        sock.close()
        raise
    return trio.SocketStream(sock)


async def connect_first(addresses: Sequence[str], port: int) -> tuple[trio.SocketStream, str]:
    """Connect to ``addresses`` (IP literals) in order, staggered by
    ``CONNECT_STAGGER_S`` (the next attempt starts early when one fails); the
    first to connect wins and the others are cancelled or closed.

    Error handling: ``ProbeConnectFailed`` when no address connects.
    """
    attempts = [partial(_open_stream, address, port) for address in addresses]
    try:
        stream, index = await _race(attempts, stagger_s=CONNECT_STAGGER_S)
    except _AllFailed:
        raise ProbeConnectFailed("could not connect") from None
    return stream, addresses[index]
