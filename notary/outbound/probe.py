"""The prober: which certificate does ``host:port`` present, from here?

An I/O edge (Trio + pyOpenSSL). One probe resolves the target (names only),
checks every resolved address against the :class:`~notary.model.policy.AddressPolicy`,
connects by IP literal to an allowed address, and runs the client side of a
TLS handshake far enough to receive the server's certificates.

Rules this module keeps:

1. The address checked by the policy is the address connected to:
   connections are made by :func:`notary.outbound.dialer.dial` (see its rules).
2. Bounded: at most ``max_concurrent`` probes hold a connection at once; each
   probe, queueing for a slot included, ends within ``timeout_s``; at most
   ``max_handshake_bytes`` are accepted from a target.
3. No application data is ever sent to a target (see "TLS" below).

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
caller's task (``notary.service.records`` runs one per target at a time, in
a nursery of its own). Every TCP stream is closed (``trio.aclose_forcefully``)
on every path, and losing connection attempts are closed at once.

Error handling
--------------
Every failure of a probe is one of the :class:`~notary.errors.ProbeError`
subclasses with a short message that is safe to send to a client
(``ProbeRefused``, ``ProbeResolveFailed``, ``ProbeConnectFailed``,
``ProbeHandshakeFailed``, ``ProbeTimeout``); ``OSError``, Trio and OpenSSL
exceptions never escape. An unexpected exception inside a probe (a bug) is
logged with its traceback and delivered as a plain ``ProbeError``, so one
strange target cannot take the prober down.
"""

from __future__ import annotations

import logging
import time
import types
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio
from cryptography.hazmat.primitives.serialization import Encoding
from OpenSSL import SSL

from notary.config import ProbeConfig
from notary.errors import ProbeError, ProbeHandshakeFailed, ProbeTimeout
from notary.model.observations import Certificate, ProbeResult
from notary.model.policy import AddressPolicy
from notary.model.targets import Target
from notary.outbound.dialer import Resolver, dial, system_resolver

__all__ = [
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

#: First byte of a TLS record: change_cipher_spec, alert, handshake, data.
_TLS_CONTENT_TYPES = frozenset({0x14, 0x15, 0x16, 0x17})


@dataclass(frozen=True, slots=True)
class ProbeStatistics:
    """A snapshot of a :class:`Prober`'s counters.

    ``started``: probes started; ``succeeded``: probes that saw a certificate;
    ``in_flight``: probes
    holding one of the ``max_concurrent`` slots right now; ``failures``:
    failed probes by :attr:`ProbeError.reason <notary.errors.ProbeError.reason>`;
    ``queued``: probes started and still waiting for a slot;
    ``tls_versions``: successful probes by the TLS version negotiated
    (``"TLSv1"`` ... ``"TLSv1.3"``).
    """

    started: int
    succeeded: int
    in_flight: int
    failures: Mapping[str, int]
    queued: int = 0
    tls_versions: Mapping[str, int] = field(default_factory=lambda: types.MappingProxyType({}))


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


class Prober:
    """Probes targets for their TLS certificates; see the module docstring.

    Create it with :func:`open_prober`, which owns the nursery in which every
    probe task runs; :meth:`probe` may only be called while it is open.
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
        self._context = _client_context()
        self._started = 0
        self._succeeded = 0
        self._failures: Counter[str] = Counter()
        self._tls_versions: Counter[str] = Counter()

    async def probe(self, target: Target) -> ProbeResult:
        """Observe the certificate ``target`` presents now, in the caller's
        task (single-flight and background probes are
        ``notary.service.records``'s).

        Error handling: raises a :class:`~notary.errors.ProbeError` subclass
        when the probe saw no certificate (an unexpected exception, a bug, is
        logged with its traceback and raised as a plain ``ProbeError``)."""
        self._started += 1
        started = trio.current_time()
        try:
            result = await self._probe_once(target)
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
        if result.tls_version is not None:
            self._tls_versions[result.tls_version] += 1
        if self._timings is not None:
            self._timings.probe_done(trio.current_time() - started, None)
        return result

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
        )

    async def _probe_once(self, target: Target) -> ProbeResult:
        capture = _Capture()
        queued = True
        address = ""
        try:
            with trio.fail_after(self._timeout_s):
                async with self._limiter:
                    queued = False
                    stream, address = await dial(
                        target.host, target.port, policy=self.policy, resolver=self._resolver,
                        admit=self._admit_destination,
                    )
                    try:
                        await self._handshake(stream, target, capture)
                    finally:
                        await trio.aclose_forcefully(stream)
        except trio.TooSlowError:
            if capture.chain is None:  # else: late only in saying goodbye
                if queued:
                    raise ProbeTimeout("too many probes in progress") from None
                raise ProbeTimeout("target did not answer in time") from None
        if capture.unparseable or capture.chain is None:
            raise ProbeHandshakeFailed("unreadable certificate")
        try:
            leaf = Certificate.from_der(capture.chain[0])
        except ValueError:
            raise ProbeHandshakeFailed("unreadable certificate") from None
        return ProbeResult(
            target=target,
            leaf=leaf,
            chain=capture.chain,
            address=address,
            observed_at=int(self._clock()),
            tls_version=capture.tls_version,
        )

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


@asynccontextmanager
async def open_prober(
    probe: ProbeConfig,
    *,
    policy: AddressPolicy,
    resolver: Resolver = system_resolver,
    clock: Callable[[], float] = time.time,
    admit_destination: Callable[[str], None] | None = None,
    timings: ProbeTimings | None = None,
) -> AsyncIterator[Prober]:
    """Open a :class:`Prober` by the ``[probe]`` section ``probe``:
    ``timeout_s`` bounds each probe, queueing for a slot included;
    ``max_concurrent`` bounds the probes holding a connection at once;
    ``max_handshake_bytes`` bounds what a target may send before its
    certificates are in. ``policy`` decides which addresses may be connected
    to; ``resolver`` turns names into addresses (inject a fake in tests);
    ``clock`` gives the Unix time stamped on results.

    ``admit_destination``, if given, is called with the address every probe
    (on-demand or scheduled) is about to connect to, once the name resolved
    and the policy allowed it; a ``ProbeError`` it raises
    (``ProbeThrottled``: the politeness limit of that address's prefix) is
    the probe's failure, and nothing is connected.

    ``timings``, if given, is told each probe's seconds (queueing for a slot
    included) and failure reason (None: a success) when it ends; probes
    cancelled at shutdown are not reported.

    Resource handling: the prober owns no task; each probe runs in its
    caller's task and holds its connection only while it runs.

    Error handling: ``ValueError`` for a non-positive limit.
    """
    if not probe.timeout_s > 0:
        raise ValueError("timeout_s must be positive")
    if probe.max_concurrent < 1:
        raise ValueError("max_concurrent must be at least 1")
    if probe.max_handshake_bytes < 1:
        raise ValueError("max_handshake_bytes must be positive")
    yield Prober(
        policy=policy,
        timeout_s=probe.timeout_s,
        max_concurrent=probe.max_concurrent,
        resolver=resolver,
        clock=clock,
        max_handshake_bytes=probe.max_handshake_bytes,
        admit_destination=admit_destination,
        timings=timings,
    )
