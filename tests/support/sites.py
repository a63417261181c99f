"""Sites that serve several certificates at once (issue 31): one name served
on several loopback addresses, each with certificates of its own.

:func:`open_site` runs a TLS server on each given loopback address
(``127.0.0.2``, ``127.0.0.3``, ..., ``::1``), all on one port, for one name.
Each address serves its own certificate for that name (or, with
``distinct=False``, all serve one), an address listed in ``alternating``
serves two certificates in turn, one per connection, and an address listed
in ``stalled`` accepts connections and never answers. :meth:`Site.resolver`
maps the name to every address (a :class:`~tests.support.tls_targets.StaticResolver`),
so nothing resolves a name and nothing connects beyond loopback. The site
counts the connections each address accepted.

Usage::

    async with open_site(addresses=("127.0.0.2", "127.0.0.3", "::1"),
                         alternating=("127.0.0.3",)) as site:
        async with open_prober(..., resolver=site.resolver()) as prober:
            report = await prober.probe(site.target(), samples_per_address=4)
        assert {leaf.der for leaf in report.leaves} == site.leaves()

Resource handling: the servers run in the block's nursery and are cancelled
(every connection closed) when it exits. A test that needs an address not
bound by anyone (connection refused) lists it in the resolver's mapping
only (``site.resolver(extra=[...])``).
"""

from __future__ import annotations

import errno
import socket
import ssl
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import trio
import trustme

from notary.model.policy import AddressPolicy
from notary.model.targets import Target
from tests.support.tls_targets import StaticResolver, static_resolver

__all__ = ["DEFAULT_ADDRESSES", "SITE_NAME", "Site", "SiteAddress", "loopback_policy", "open_site"]

#: The name the site's certificates are for.
SITE_NAME = "www.split.test"
#: Three IPv4 loopback addresses besides 127.0.0.1.
DEFAULT_ADDRESSES = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
#: No test connection lives longer than this.
CONNECTION_TIMEOUT_S = 30.0
_RECEIVE_BYTES = 64 * 1024
#: Tries at finding one port free on every address.
_BIND_TRIES = 20


def loopback_policy() -> AddressPolicy:
    """An address policy allowing IPv4 and IPv6 loopback only."""
    return AddressPolicy.from_cidrs(["127.0.0.0/8", "::1/128"])


def has_ipv6_loopback() -> bool:
    """Whether ``::1`` can be bound here."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


@dataclass(slots=True)
class SiteAddress:
    """One address of a :class:`Site`: the certificates it serves in turn
    (one per connection; DER chains, leaf first), the connections it
    accepted, whether it stalls (``stalled`` may be set while the site
    runs: it holds from the next connection on)."""

    address: str
    chains: list[tuple[bytes, ...]]
    contexts: list[ssl.SSLContext]
    stalled: bool = False
    accepted: int = 0
    #: Handshakes started (connections given a certificate to serve).
    served: int = 0
    _waiters: list[tuple[int, trio.Event]] = field(default_factory=list)

    @property
    def leaf_ders(self) -> tuple[bytes, ...]:
        return tuple(chain[0] for chain in self.chains)

    def _accept(self) -> None:
        self.accepted += 1
        for goal, event in self._waiters:
            if self.accepted >= goal:
                event.set()

    async def wait_accepted(self, count: int) -> None:
        if self.accepted >= count:
            await trio.lowlevel.checkpoint()
            return
        event = trio.Event()
        self._waiters.append((count, event))
        await event.wait()


class Site:
    """A running site made by :func:`open_site`: ``name``, ``port`` (one for
    every address), ``addresses`` in order, each a :class:`SiteAddress`."""

    def __init__(self, name: str, ca: trustme.CA) -> None:
        self.name = name
        self.port = 0
        self.ca = ca
        self._at: dict[str, SiteAddress] = {}
        self._waiters: list[tuple[int, trio.Event]] = []

    @property
    def addresses(self) -> tuple[str, ...]:
        return tuple(self._at)

    def at(self, address: str) -> SiteAddress:
        return self._at[address]

    def target(self) -> Target:
        return Target(self.name, self.port)

    def resolver(self, *, extra: Sequence[str] = (), first: Sequence[str] = ()) -> StaticResolver:
        """A resolver answering the site's name with ``first``, then every
        address of the site, then ``extra`` (addresses nobody listens on,
        or forbidden ones)."""
        return static_resolver({self.name: [*first, *self.addresses, *extra]})

    def leaf_der(self, address: str, index: int = 0) -> bytes:
        """The ``index``-th certificate ``address`` serves in turn."""
        return self._at[address].chains[index][0]

    def leaves(self) -> set[bytes]:
        """Every leaf certificate the site serves now (DER)."""
        return {der for at in self._at.values() if not at.stalled for der in at.leaf_ders}

    @property
    def accepted(self) -> int:
        """Connections accepted, over every address."""
        return sum(at.accepted for at in self._at.values())

    async def wait_accepted(self, count: int) -> None:
        """Wait until the addresses accepted ``count`` connections in all."""
        if self.accepted >= count:
            await trio.lowlevel.checkpoint()
            return
        event = trio.Event()
        self._waiters.append((count, event))
        await event.wait()

    def replace_certificate(self, address: str, index: int = 0) -> bytes:
        """Serve a new certificate at ``address`` in place of its
        ``index``-th one from now on; returns the new leaf DER."""
        at = self._at[address]
        chain, context = self._issue()
        at.chains[index] = chain
        at.contexts[index] = context
        return chain[0]

    def _issue(self) -> tuple[tuple[bytes, ...], ssl.SSLContext]:
        leaf = self.ca.issue_cert(self.name)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        leaf.configure_cert(context)
        chain = tuple(
            ssl.PEM_cert_to_DER_cert(pem.bytes().decode("ascii")) for pem in leaf.cert_chain_pems
        )
        return chain, context

    async def _handle(self, at: SiteAddress, stream: trio.SocketStream) -> None:
        at._accept()
        total = self.accepted
        for goal, event in self._waiters:
            if total >= goal:
                event.set()
        async with stream:
            with trio.move_on_after(CONNECTION_TIMEOUT_S):
                if at.stalled:
                    await trio.sleep_forever()
                context = at.contexts[at.served % len(at.contexts)]
                at.served += 1
                tls = trio.SSLStream(stream, context, server_side=True)
                try:
                    await tls.do_handshake()
                    while await tls.receive_some(_RECEIVE_BYTES):
                        pass
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass


def _listen_all(
    addresses: Sequence[str], port: int = 0
) -> tuple[int, list[trio.SocketListener]]:
    """Listening sockets on every address, on one port (``port``, or one
    free on every address)."""
    wanted = port
    for _ in range(_BIND_TRIES if wanted == 0 else 1):
        sockets: list[socket.socket] = []
        try:
            port = wanted
            for address in addresses:
                family = socket.AF_INET6 if ":" in address else socket.AF_INET
                sock = socket.socket(family, socket.SOCK_STREAM)
                sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((address, port))
                port = sock.getsockname()[1]
                sock.listen(128)
        except OSError as exc:
            for sock in sockets:
                sock.close()
            if exc.errno != errno.EADDRINUSE or wanted:
                raise
            continue
        return port, [trio.SocketListener(trio.socket.from_stdlib_socket(s)) for s in sockets]
    raise OSError(errno.EADDRINUSE, "no port free on every address")


@asynccontextmanager
async def open_site(
    addresses: Iterable[str] = DEFAULT_ADDRESSES,
    *,
    name: str = SITE_NAME,
    alternating: Iterable[str] = (),
    stalled: Iterable[str] = (),
    distinct: bool = True,
    port: int = 0,
    intermediate: bool = False,
) -> AsyncIterator[Site]:
    """Serve ``name`` on each of ``addresses`` (loopback literals), one
    port for all (``port``, e.g. that of another server on another
    address; 0: one free on every address): each address its own
    certificate (``distinct``; else one for all), two in turn per
    connection at the ``alternating`` ones, none at the ``stalled`` ones
    (they accept and never answer). ``intermediate``: the certificates
    are issued by an intermediate CA every address sends after its leaf
    (``Site.ca``; a DANE-TA record can name it), else by a root sent by
    none."""
    listed = list(dict.fromkeys(addresses))
    alternate, stall = set(alternating), set(stalled)
    root = trustme.CA()
    site = Site(name, root.create_child_ca() if intermediate else root)
    shared = site._issue() if not distinct else None
    for address in listed:
        made = [shared or site._issue()]
        if address in alternate:
            made.append(site._issue())
        site._at[address] = SiteAddress(
            address, [chain for chain, _ in made], [context for _, context in made],
            stalled=address in stall,
        )
    site.port, listeners = _listen_all(listed, port)
    async with trio.open_nursery() as nursery:
        for address, listener in zip(listed, listeners, strict=True):
            at = site._at[address]

            async def handle(stream: trio.SocketStream, at: SiteAddress = at) -> None:
                await site._handle(at, stream)

            nursery.start_soon(trio.serve_listeners, handle, [listener])
        try:
            yield site
        finally:
            nursery.cancel_scope.cancel()
