"""The prober: which certificates does ``host:port`` present, from here?

An I/O edge (Trio + pyOpenSSL). One probe resolves the target (names only;
A and AAAA: the resolver returns every address), checks every resolved
address against the :class:`~notary.model.policy.AddressPolicy`, and runs
the client side of a TLS handshake with each allowed address (at most
``max_addresses``, in the resolver's order; an IP literal is one address),
all at once, far enough to receive the server's certificates. What it saw
is one :class:`~notary.model.observations.ProbeReport`: every handshake's
result, every address probed, the failures of the others (docs/sites.md, "Sites
that serve several certificates").

Rules this module keeps:

1. The address checked by the policy is the address connected to: names
   are resolved once, each address is checked, and connections go to the
   checked IP literals (:func:`notary.outbound.dialer.connect`; dialer
   rules 1, 2 and 4).
2. Bounded: each connection holds one of the ``max_concurrent`` slots
   while it connects and handshakes, and takes a token of its address's
   prefix budget (``admit_destination``) before it connects: the budgets
   count each connection, not each probe. A probe, its queueing for slots
   included, ends within ``timeout_s``, whatever one address does (a
   stalled address is given up at the deadline; what the others showed is
   the report). At most ``max_handshake_bytes`` are accepted per handshake.
3. No application data is ever sent to a target (see "TLS" below).
4. Sampling: with ``samples_per_address`` above 1 (the target was seen
   serving more than one certificate lately: ``notary.service.records``
   decides), each address is handshaken with again until it made that
   many handshakes or made one showing a certificate this probe had seen
   already (at any address).
5. A client's address hint (``extra_addresses``) is probed only when the
   policy allows it and the notary's own resolution of the name returned
   it within ``address_memory_s`` (:mod:`notary.model.addresses`);
   otherwise it is ignored without any connection (a debug log line, and
   ``ProbeStatistics.hints``).

TLS
---
SNI is sent for names, not for IP literals; TLS 1.0 to 1.3 are offered and
the version negotiated is recorded (:attr:`ProbeResult.tls_version
<notary.model.observations.ProbeResult.tls_version>`); the cipher list is OpenSSL's
``DEFAULT`` at security level 0 (which OpenSSL 3 needs for TLS 1.0 and 1.1)
because we observe, we do not trust: an old protocol, a weak key or a SHA-1
signature is something to record, not a reason to see nothing. Offering old
versions costs no safety here, since a probe never sends application data
and trusts nothing it receives. Nothing is verified. (The notary's own
listeners keep TLS 1.2+ unless ``[server] legacy_tls``: that is another
context, in ``notary.server.app``.)

The handshake runs over memory BIOs (``SSL.Connection(ctx, None)``), pumped
over a Trio stream. **The probe aborts inside the certificate verification
callback**: with ``VERIFY_PEER`` and no trust store, OpenSSL calls the callback
as soon as it has parsed the server's Certificate message; the callback copies
``get_peer_cert_chain()`` (leaf first, as DER) and returns false. OpenSSL then
stops the handshake and queues a fatal alert, which is sent best-effort before
the TCP connection is closed. This was tried against TLS 1.2 and TLS 1.3
servers and is reliable on both: in TLS 1.3 the client never sends its
Finished, in TLS 1.2 it never sends its key exchange, so no application data
(not even keys to protect any) can be sent. It also saves the TLS 1.2 client
flight and the round trip a complete handshake would need. The cost is one
"bad certificate"/"unknown CA" alert in the target's logs, and the probe does
not see proof that the server holds the private key (CertificateVerify) --
irrelevant for a notary, which records what is presented: presenting someone
else's certificate without its key harms no client that verifies it.

Resource handling
-----------------
:func:`open_prober` makes a prober that owns no task: each probe runs in its
caller's task, with a nursery of its own for its addresses
(``notary.service.records`` runs one per target at a time, in a nursery of
its own). Every TCP stream is closed (``trio.aclose_forcefully``) on every
path, the deadline's included. The address memory is a bounded table
(``AddressMemory``).

Error handling
--------------
A probe that saw at least one certificate is a report, whatever the other
addresses did (their failures are in it). Otherwise it raises the most
telling of the :class:`~notary.errors.ProbeError` subclasses its addresses
met, with a short message that is safe to send to a client: ``ProbeRefused``
(the name, or every resolved address, refused by the policy: nothing was
connected), ``ProbeResolveFailed``, then by precedence ``ProbeThrottled``
(an address's prefix budget was spent: the probe did not look everywhere),
``ProbeTimeout``, ``ProbeHandshakeFailed``, ``ProbeConnectFailed``.
``OSError``, Trio and OpenSSL exceptions never escape. An unexpected
exception inside a probe (a bug) is logged with its traceback and is that
address's plain ``ProbeError``, so one strange target cannot take the
prober down.
"""

from __future__ import annotations

import logging
import time
import types
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio
from cryptography.hazmat.primitives.serialization import Encoding
from OpenSSL import SSL

from notary.config import ProbeConfig
from notary.errors import (
    ProbeConnectFailed,
    ProbeError,
    ProbeHandshakeFailed,
    ProbeThrottled,
    ProbeTimeout,
)
from notary.model.addresses import AddressMemory, canonical_address
from notary.model.observations import Certificate, ProbeReport, ProbeResult
from notary.model.policy import AddressPolicy
from notary.model.targets import Target
from notary.outbound.dialer import (
    Resolver,
    allowed_addresses,
    connect,
    resolve,
    system_resolver,
)

__all__ = [
    "DEFAULT_ADDRESS_MEMORY_ENTRIES",
    "DEFAULT_MAX_HANDSHAKE_BYTES",
    "ProbeStatistics",
    "Prober",
    "Resolver",
    "open_prober",
    "system_resolver",
]

logger = logging.getLogger(__name__)


#: Default bound on the bytes accepted from a target before its certificates
#: are in (the whole server flight up to and including the Certificate
#: message). OpenSSL itself also refuses a Certificate message over 100 KiB.
DEFAULT_MAX_HANDSHAKE_BYTES = ProbeConfig().max_handshake_bytes
#: Bytes asked of the stream per receive during the handshake.
RECEIVE_CHUNK_BYTES = 16 * 1024
#: Bytes taken from OpenSSL's outgoing memory BIO per read.
BIO_CHUNK_BYTES = 16 * 1024
#: Time allowed to send the closing alert once the certificates are in.
FAREWELL_TIMEOUT_S = 0.5

#: Addresses the address memory holds in all unless told (``[limits]
#: max_tracked`` in the server).
DEFAULT_ADDRESS_MEMORY_ENTRIES = 16384
#: The failures a probe that saw no certificate raises, the most telling
#: first (see "Error handling"); any other is last.
_FAILURE_PRECEDENCE = (ProbeThrottled, ProbeTimeout, ProbeHandshakeFailed, ProbeConnectFailed)

#: First byte of a TLS record: change_cipher_spec, alert, handshake, data.
_TLS_CONTENT_TYPES = frozenset({0x14, 0x15, 0x16, 0x17})


@dataclass(frozen=True, slots=True)
class ProbeStatistics:
    """A snapshot of a :class:`Prober`'s counters.

    ``started``: probes started; ``succeeded``: probes that saw a certificate
    (at one address at least); ``in_flight``: connections holding one of
    the ``max_concurrent`` slots right now; ``failures``: failed probes by
    :attr:`ProbeError.reason <notary.errors.ProbeError.reason>`; ``queued``:
    connections waiting for a slot; ``tls_versions``: handshakes that showed
    a certificate, by the TLS version negotiated (``"TLSv1"`` ...
    ``"TLSv1.3"``); ``connections``: connections made (each address, each
    sample); ``handshakes``: handshakes that showed a certificate;
    ``address_failures``: addresses of probes that showed no certificate,
    by reason (in successful probes too); ``hints``: clients' address hints
    by outcome (``added`` to the probe, ``present``: among the addresses
    probed already, ``ignored``: rule 5 refused it); ``remembered``:
    addresses in the address memory.
    """

    started: int
    succeeded: int
    in_flight: int
    failures: Mapping[str, int]
    queued: int = 0
    tls_versions: Mapping[str, int] = field(default_factory=lambda: types.MappingProxyType({}))
    connections: int = 0
    handshakes: int = 0
    address_failures: Mapping[str, int] = field(
        default_factory=lambda: types.MappingProxyType({})
    )
    hints: Mapping[str, int] = field(default_factory=lambda: types.MappingProxyType({}))
    remembered: int = 0


@dataclass(slots=True)
class _Capture:
    """Filled in by the verify callback of one handshake."""

    chain: tuple[bytes, ...] | None = None
    unparseable: bool = False
    tls_version: str | None = None


def _capture_chain(
    connection: SSL.Connection, _certificate: Any, _errno: int, _depth: int, _ok: int
) -> bool:
    """Verify callback: copy the chain the server sent and the TLS version
    of its ServerHello, then abort the handshake (return false) whatever the
    verification result."""
    capture = connection.get_app_data()
    if isinstance(capture, _Capture) and capture.chain is None and not capture.unparseable:
        capture.tls_version = connection.get_protocol_version_name()
        try:
            chain = connection.get_peer_cert_chain(as_cryptography=True) or []
            capture.chain = tuple(cert.public_bytes(Encoding.DER) for cert in chain) or None
        except Exception:  # a certificate cryptography cannot read
            capture.unparseable = True
    return False


def _client_context() -> SSL.Context:
    """The probes' context (see "TLS" in the module docstring)."""
    context = SSL.Context(SSL.TLS_CLIENT_METHOD)
    context.set_min_proto_version(SSL.TLS1_VERSION)
    context.set_max_proto_version(SSL.TLS1_3_VERSION)
    context.set_cipher_list(b"DEFAULT:@SECLEVEL=0")
    context.set_verify(SSL.VERIFY_PEER, _capture_chain)
    return context


class ProbeTimings(Protocol):
    """Told how long each probe took (the metrics' ``Timings``); must not raise."""

    def probe_done(self, seconds: float, reason: str | None) -> None: ...


@dataclass(slots=True)
class _Address:
    """One address of a probe and what its handshakes showed."""

    address: str
    #: ``(leaf, chain, tls_version)`` of each handshake that showed one.
    seen: list[tuple[Certificate, tuple[bytes, ...], str | None]] = field(default_factory=list)
    error: ProbeError | None = None
    #: Waiting for a slot (the deadline then says "too many probes").
    queued: bool = False


#: Outcomes of a client's address hint (``ProbeStatistics.hints``).
HINT_OUTCOMES = ("added", "present", "ignored")


class Prober:
    """Probes targets for their TLS certificates; see the module docstring.

    Create it with :func:`open_prober`; each :meth:`probe` runs in its
    caller's task.
    """

    def __init__(
        self,
        *,
        policy: AddressPolicy,
        timeout_s: float,
        max_concurrent: int,
        resolver: Resolver,
        clock: Callable[[], float],
        max_handshake_bytes: int,
        admit_destination: Callable[[str], None] | None = None,
        timings: ProbeTimings | None = None,
        max_addresses: int = 8,
        address_memory: AddressMemory | None = None,
    ) -> None:
        self._admit_destination = admit_destination
        self._timings = timings
        #: Which addresses may be connected to; replaced on reload (SIGHUP).
        self.policy = policy
        self._timeout_s = timeout_s
        self._limiter = trio.CapacityLimiter(max_concurrent)
        self._resolver = resolver
        self._clock = clock
        self._max_handshake_bytes = max_handshake_bytes
        self._max_addresses = max_addresses
        #: What the notary's own resolutions returned (rule 5).
        if address_memory is None:
            address_memory = AddressMemory(
                memory_s=ProbeConfig().address_memory_s,
                max_entries=DEFAULT_ADDRESS_MEMORY_ENTRIES,
            )
        self.address_memory = address_memory
        self._context = _client_context()
        self._started = 0
        self._succeeded = 0
        self._connections = 0
        self._handshakes = 0
        self._failures: Counter[str] = Counter()
        self._address_failures: Counter[str] = Counter()
        self._tls_versions: Counter[str] = Counter()
        self._hints: Counter[str] = Counter()

    async def probe(
        self, target: Target, *, samples_per_address: int = 1,
        extra_addresses: Sequence[str] = (),
    ) -> ProbeReport:
        """Observe the certificates ``target`` presents now, at each of its
        addresses, in the caller's task (single-flight and background probes
        are ``notary.service.records``'s). ``samples_per_address``: rule 4
        (values below 1 count as 1); ``extra_addresses``: clients' address
        hints (rule 5).

        Error handling: raises a :class:`~notary.errors.ProbeError` subclass
        when the probe saw no certificate (see "Error handling"; an
        unexpected exception, a bug, is logged with its traceback and raised
        as a plain ``ProbeError``)."""
        self._started += 1
        started = trio.current_time()
        try:
            report = await self._probe_addresses(
                target, max(1, samples_per_address), extra_addresses
            )
        except ProbeError as exc:
            logger.debug("probe of %s failed: %s", target, exc.message)
            self._failed(exc, started)
            raise
        except Exception:
            logger.exception("probe of %s failed unexpectedly", target)
            error = ProbeError("probe failed")
            self._failed(error, started)
            raise error from None
        self._succeeded += 1
        if self._timings is not None:
            self._timings.probe_done(trio.current_time() - started, None)
        return report

    def _failed(self, error: ProbeError, started: float) -> None:
        self._failures[error.reason] += 1
        if self._timings is not None:
            self._timings.probe_done(trio.current_time() - started, error.reason)

    def statistics(self) -> ProbeStatistics:
        limiter = self._limiter.statistics()
        return ProbeStatistics(
            started=self._started,
            succeeded=self._succeeded,
            in_flight=limiter.borrowed_tokens,
            failures=types.MappingProxyType(dict(self._failures)),
            queued=limiter.tasks_waiting,
            tls_versions=types.MappingProxyType(dict(self._tls_versions)),
            connections=self._connections,
            handshakes=self._handshakes,
            address_failures=types.MappingProxyType(dict(self._address_failures)),
            hints=types.MappingProxyType({o: self._hints[o] for o in HINT_OUTCOMES}),
            remembered=len(self.address_memory),
        )

    async def _probe_addresses(
        self, target: Target, samples: int, extra_addresses: Sequence[str]
    ) -> ProbeReport:
        """Resolve, then handshake with every address under the deadline;
        the report, or the most telling failure."""
        slots: list[_Address] = []
        seen: set[bytes] = set()
        with trio.move_on_after(self._timeout_s):
            addresses = await self._addresses(target, extra_addresses)
            slots = [_Address(address) for address in addresses]
            async with trio.open_nursery() as nursery:
                for slot in slots:
                    nursery.start_soon(self._observe, target, slot, samples, seen)
        if not slots:  # the deadline came during the name lookup
            raise ProbeTimeout("target did not answer in time")
        observed_at = int(self._clock())
        results: list[ProbeResult] = []
        failures: list[tuple[str, str]] = []
        for slot in slots:
            if slot.seen:
                results += (
                    ProbeResult(target, leaf, chain, slot.address, observed_at, version)
                    for leaf, chain, version in slot.seen
                )
                continue
            if slot.error is None:  # still at it when the deadline came
                slot.error = ProbeTimeout(
                    "too many probes in progress" if slot.queued
                    else "target did not answer in time"
                )
            failures.append((slot.address, slot.error.reason))
            self._address_failures[slot.error.reason] += 1
        if not results:
            raise _most_telling([slot.error for slot in slots if slot.error is not None])
        if failures:
            logger.debug(
                "probe of %s: %d of %d addresses showed no certificate (%s)", target,
                len(failures), len(slots), ", ".join(reason for _, reason in failures),
            )
        return ProbeReport(
            target, tuple(results), tuple(slot.address for slot in slots), tuple(failures),
            observed_at,
        )

    async def _addresses(self, target: Target, extra_addresses: Sequence[str]) -> list[str]:
        """The addresses to probe: the policy-allowed ones of the name's
        resolution, at most ``max_addresses`` (all of them remembered, rule
        5), then the address hints rule 5 takes.

        Error handling: ``ProbeRefused`` for a name the policy refuses
        (before it is resolved) or when it allows no resolved address;
        ``ProbeResolveFailed``."""
        self.policy.check_name(target.host)
        candidates = await resolve(target.host, target.port, self._resolver)
        allowed = allowed_addresses(self.policy, candidates, what=target.host, limit=None)
        now = self._clock()
        if not target.is_ip_literal:
            self.address_memory.remember(target.host, allowed, now)
        addresses = allowed[: self._max_addresses]
        for hint in extra_addresses:
            outcome, why = self._take_hint(target, hint, addresses, now)
            self._hints[outcome] += 1
            if outcome == "ignored":
                logger.debug("address hint %s for %s ignored: %s", hint, target, why)
        return addresses

    def _take_hint(
        self, target: Target, hint: str, addresses: list[str], now: float
    ) -> tuple[str, str]:
        """Rule 5 for ``hint``: its outcome (``HINT_OUTCOMES``; added to
        ``addresses`` when taken) and, when ignored, why."""
        address = canonical_address(str(hint))
        if address is None:
            return "ignored", "not an IP address"
        if address in addresses:
            return "present", ""
        reason = self.policy.refusal(address)
        if reason is not None:
            return "ignored", f"refused by policy: {reason}"
        if target.is_ip_literal or not self.address_memory.knows(target.host, address, now):
            return "ignored", "not an address the notary's resolution of the name returned lately"
        addresses.append(address)
        return "added", ""

    async def _observe(
        self, target: Target, slot: _Address, samples: int, seen: set[bytes]
    ) -> None:
        """Handshake with ``slot``'s address (rule 4: again, up to
        ``samples`` times, while each shows a certificate ``seen`` lacked),
        noting what each showed on ``slot``; never raises but for
        cancellation."""
        for _ in range(samples):
            capture = _Capture()
            try:
                try:
                    await self._handshake_once(target, slot, capture)
                finally:  # a certificate in hand counts, whatever came after
                    fresh = self._take(slot, capture, seen)
            except ProbeError as exc:
                if not slot.seen:
                    slot.error = exc
                return
            except Exception:
                logger.exception("probe of %s at an address failed unexpectedly", target)
                if not slot.seen:
                    slot.error = ProbeError("probe failed")
                return
            if fresh is None:
                if not slot.seen:
                    slot.error = ProbeHandshakeFailed("unreadable certificate")
                return
            if not fresh:
                return

    async def _handshake_once(self, target: Target, slot: _Address, capture: _Capture) -> None:
        """One connection to ``slot``'s address: a slot of the limiter and a
        token of its prefix's budget, then the handshake (rule 2)."""
        slot.queued = True
        async with self._limiter:
            slot.queued = False
            if self._admit_destination is not None:
                self._admit_destination(slot.address)
            stream = await connect(slot.address, target.port)
            self._connections += 1
            try:
                await self._handshake(stream, target, capture)
            finally:
                await trio.aclose_forcefully(stream)

    def _take(self, slot: _Address, capture: _Capture, seen: set[bytes]) -> bool | None:
        """Note what ``capture`` holds on ``slot``: None when it holds no
        readable certificate, else whether its leaf is new to this probe.
        Never raises (it runs while a cancellation may be on its way)."""
        if capture.chain is None or capture.unparseable:
            return None
        try:
            leaf = Certificate.from_der(capture.chain[0])
        except ValueError:
            return None
        slot.seen.append((leaf, capture.chain, capture.tls_version))
        self._handshakes += 1
        if capture.tls_version is not None:
            self._tls_versions[capture.tls_version] += 1
        fresh = leaf.sha256 not in seen
        seen.add(leaf.sha256)
        return fresh

    async def _handshake(
        self, stream: trio.SocketStream, target: Target, capture: _Capture
    ) -> None:
        """Run the TLS client until the verify callback captured the chain,
        then send what OpenSSL queued (its alert) best-effort and return."""
        connection = SSL.Connection(self._context, None)
        connection.set_app_data(capture)
        connection.set_connect_state()
        if not target.is_ip_literal:
            connection.set_tlsext_host_name(target.host.encode("ascii"))
        received = 0
        first_byte: int | None = None
        while True:
            failure: SSL.Error | None = None
            try:
                connection.do_handshake()
            except SSL.WantReadError:
                pass
            except SSL.Error as exc:
                failure = exc
            else:  # cannot happen with the aborting callback; be safe anyway
                failure = SSL.Error("handshake completed without a certificate")
            outgoing = _drain(connection)
            if capture.chain is not None or capture.unparseable:
                await _send_farewell(stream, outgoing)
                return
            if failure is not None:
                logger.debug("TLS handshake with %s failed: %r", target, failure)
                await _send_farewell(stream, outgoing)
                raise ProbeHandshakeFailed(_describe(failure))
            if outgoing:
                await _send(stream, outgoing)
            budget = self._max_handshake_bytes - received
            data = await _receive(stream, min(RECEIVE_CHUNK_BYTES, budget + 1))
            if first_byte is None:
                first_byte = data[0]
                if first_byte not in _TLS_CONTENT_TYPES:
                    raise ProbeHandshakeFailed("target does not speak TLS")
            received += len(data)
            if received > self._max_handshake_bytes:
                raise ProbeHandshakeFailed("certificate chain too large")
            try:
                connection.bio_write(data)
            except SSL.Error:
                raise ProbeHandshakeFailed("TLS handshake failed") from None


def _describe(failure: SSL.Error) -> str:
    """A client-safe message for an OpenSSL failure (details go to the log)."""
    if "excessive message size" in str(failure):
        return "certificate chain too large"
    return "TLS handshake failed"


def _drain(connection: SSL.Connection) -> bytes:
    """Everything OpenSSL queued for the peer."""
    chunks = []
    while True:
        try:
            chunks.append(connection.bio_read(BIO_CHUNK_BYTES))
        except SSL.WantReadError:
            return b"".join(chunks)


async def _send(stream: trio.SocketStream, data: bytes) -> None:
    try:
        await stream.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        raise ProbeHandshakeFailed("connection reset during TLS handshake") from None


async def _receive(stream: trio.SocketStream, max_bytes: int) -> bytes:
    try:
        data = await stream.receive_some(max_bytes)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        raise ProbeHandshakeFailed("connection reset during TLS handshake") from None
    if not data:
        raise ProbeHandshakeFailed("connection closed during TLS handshake")
    return data


async def _send_farewell(stream: trio.SocketStream, data: bytes) -> None:
    """Send the alert OpenSSL queued, if the peer still listens; never fails."""
    if not data:
        return
    with trio.move_on_after(FAREWELL_TIMEOUT_S):
        with suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.send_all(data)


def _most_telling(errors: Sequence[ProbeError]) -> ProbeError:
    """The failure a probe that saw nothing raises ("Error handling")."""
    for kind in _FAILURE_PRECEDENCE:
        found = [error for error in errors if isinstance(error, kind)]
        if found:
            if kind is ProbeTimeout:  # an address that answered too slowly says more
                slow = [e for e in found if e.message != "too many probes in progress"]
                return (slow or found)[0]
            return found[0]
    return errors[0] if errors else ProbeConnectFailed("could not connect")


@asynccontextmanager
async def open_prober(
    probe: ProbeConfig,
    *,
    policy: AddressPolicy,
    resolver: Resolver = system_resolver,
    clock: Callable[[], float] = time.time,
    admit_destination: Callable[[str], None] | None = None,
    timings: ProbeTimings | None = None,
    address_memory_entries: int = DEFAULT_ADDRESS_MEMORY_ENTRIES,
) -> AsyncIterator[Prober]:
    """Open a :class:`Prober` by the ``[probe]`` section ``probe``:
    ``timeout_s`` bounds each probe, queueing for slots included;
    ``max_concurrent`` bounds the connections to targets at once;
    ``max_handshake_bytes`` bounds what a target may send before its
    certificates are in; ``max_addresses`` the addresses of a name probed;
    ``address_memory_s`` how long a resolved address stays a hint the
    prober takes (rule 5), in a table of ``address_memory_entries``
    addresses at most. ``policy`` decides which addresses may be connected
    to; ``resolver`` turns names into addresses (inject a fake in tests);
    ``clock`` gives the Unix time stamped on results.

    ``admit_destination``, if given, is called with the address of every
    connection (on-demand or scheduled probes, each address, each sample)
    about to be made, once the name resolved and the policy allowed it; a
    ``ProbeError`` it raises (``ProbeThrottled``: the politeness limit of
    that address's prefix) is that address's failure, and nothing is
    connected there.

    ``timings``, if given, is told each probe's seconds (queueing for a slot
    included) and failure reason (None: a success) when it ends; probes
    cancelled at shutdown are not reported.

    Resource handling: the prober owns no task; each probe runs in its
    caller's task and holds its connections only while it runs.

    Error handling: ``ValueError`` for a non-positive limit.
    """
    if not probe.timeout_s > 0:
        raise ValueError("timeout_s must be positive")
    if probe.max_concurrent < 1:
        raise ValueError("max_concurrent must be at least 1")
    if probe.max_handshake_bytes < 1:
        raise ValueError("max_handshake_bytes must be positive")
    if probe.max_addresses < 1:
        raise ValueError("max_addresses must be at least 1")
    memory = AddressMemory(
        memory_s=probe.address_memory_s, max_entries=address_memory_entries
    )
    yield Prober(
        policy=policy,
        timeout_s=probe.timeout_s,
        max_concurrent=probe.max_concurrent,
        resolver=resolver,
        clock=clock,
        max_handshake_bytes=probe.max_handshake_bytes,
        admit_destination=admit_destination,
        timings=timings,
        max_addresses=probe.max_addresses,
        address_memory=memory,
    )
