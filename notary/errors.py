"""The project's own error types.

Errors are split the way h11 splits them:

* ``PeerError`` subclasses: the remote side (an HTTP client, a probed target)
  misbehaved or could not be reached. They carry the HTTP status the notary
  answers with and a short message that is safe to send to a client.
* ``ConfigError`` / ``UsageError``: the operator or caller misused the program;
  the CLI prints the message on one line and exits with status 2.

Trio, ``ssl`` and OpenSSL exceptions are mapped to these at the I/O edge, so
inner layers never see them.
"""

from __future__ import annotations


class NotaryError(Exception):
    """Base class of every error this package raises on purpose."""


class UsageError(NotaryError):
    """A command was called wrongly (bad flag, missing file, ...): exit 2."""


class ConfigError(UsageError):
    """The configuration file or flags are invalid."""


class StoreError(NotaryError):
    """The observation store cannot be read or written."""


class PeerError(NotaryError):
    """The peer misbehaved; ``status`` is the HTTP status to answer with."""

    status: int = 400

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class ProtocolError(PeerError):
    """A request broke the protocol (malformed line, target, body, ...)."""


class BadTarget(ProtocolError):
    """A target (``host+port``) could not be parsed or normalised: 400."""


class ProbeError(PeerError):
    """A probe of a target could not observe a certificate: 503 by default.

    ``reason`` is a short machine-readable class used in statistics and logs:
    ``refused`` (policy), ``dns``, ``connect``, ``handshake``, ``timeout``.
    """

    status = 503
    reason = "error"


class ProbeRefused(ProbeError):
    """The target policy forbids probing this address or port."""

    reason = "refused"


class ProbeResolveFailed(ProbeError):
    """The target name did not resolve."""

    reason = "dns"


class ProbeResolverFailed(ProbeResolveFailed):
    """The validating resolvers DANE trusts could not give the name's
    addresses: validation failed (``dnssec`` is ``"bogus"``: a SERVFAIL) or
    none answered in time or all refused (``"resolver-failure"``). The
    values are ``notary.model.dane.DnssecStatus``'s. (``dnssec`` has a
    default so that ``copy.copy``, which makes each waiter's copy, can
    make one from the message alone.)"""

    def __init__(self, message: str, dnssec: str = "resolver-failure") -> None:
        super().__init__(message)
        self.dnssec = dnssec


class ProbeConnectFailed(ProbeError):
    """No resolved address accepted a TCP connection."""

    reason = "connect"


class ProbeHandshakeFailed(ProbeError):
    """The TLS handshake failed before a certificate was received."""

    reason = "handshake"


class ProbeTimeout(ProbeError):
    """The probe did not finish within its deadline."""

    reason = "timeout"


class ProbeThrottled(ProbeError):
    """The target, or the address prefix it resolved to, was probed as often
    as the limits allow (``[limits]``): no connection was made, and the
    query is answered as if its probe had failed (503)."""

    reason = "throttled"
