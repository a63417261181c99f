"""TLSA lookups through a validating resolver (issue 20's DANE backend).

The notary does not walk the DNSSEC chain itself: like Postfix and Exim it
trusts the AD bit of a validating resolver it reaches over a trusted path
(``[dns] resolvers``: loopback or explicitly trusted addresses). One query
of ``_PORT._tcp.HOST`` TLSA with the DO and AD bits, over dnspython's
asynchronous client on Trio, and the answer read as a
:class:`~notary.model.dane.DnssecStatus`:

- NOERROR with records and AD: SECURE (the records, their TTL);
- NXDOMAIN or NOERROR without records, with AD: SECURE_DENIAL;
- an answer or a denial without AD: INSECURE (an unsigned zone);
- SERVFAIL: BOGUS (what a validating resolver answers when validation
  fails; it cannot be told apart from the zone's servers failing);
- no answer within ``timeout_s``, REFUSED, a malformed answer:
  RESOLVER_FAILURE;
- an IP-literal target: INSECURE, and no query is sent. An address is no
  DNS name: it has no zone DNSSEC could sign, hence no TLSA records
  (RFC 6698 section 3 puts them under the service's domain name), and
  asking for ``_443._tcp.127.0.0.21.`` would only send the literal to the
  DNS.

Every exchange (``exchange``) sends one query and waits, until its
deadline, for the datagram that answers it: one from the resolver's address
and port, with the query's id and question, that parses. Anything else
arriving on the socket (from another address or port, with another id, or
not DNS at all) is ignored, so a stray or forged datagram cannot turn an
answer into a failure; only the deadline ends the wait.

``check_validation`` asks a resolver for a name it should validate and
reads the AD bit of its answer: a resolver that answers without it does not
validate, and would make every signed site look unsigned.

Resource handling: one UDP exchange per lookup (TCP when truncated), its
socket closed before returning. Error handling: never raises for what the
network does; every failure is a status.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import Enum

import dns.asyncbackend
import dns.asyncquery
import dns.exception
import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype
import trio

from notary.errors import ProbeResolveFailed, ProbeResolverFailed
from notary.model.dane import DnssecStatus, Tlsa, TlsaLookup
from notary.model.targets import Target
from notary.outbound.dialer import absolute_name

__all__ = [
    "LITERAL_TTL_S", "Validation", "ValidationCheck", "check_validation", "exchange",
    "lookup_tlsa", "resolver_through", "tlsa_name",
]

#: How long the verdict on an IP literal holds (it cannot change): the
#: largest TTL DNS allows (RFC 2181 section 8), so ``[verify]
#: dane_reuse_max_s`` alone bounds it.
LITERAL_TTL_S = 2**31 - 1


def tlsa_name(target: Target) -> str:
    """``_PORT._tcp.HOST.``, the owner of the target's TLSA records."""
    return f"_{target.port}._tcp.{target.host.rstrip('.')}."


async def lookup_tlsa(
    target: Target, resolver: tuple[str, int], timeout_s: float
) -> TlsaLookup:
    """The TLSA records of ``target`` as the validating ``resolver``
    (address, port) vouches for them, within ``timeout_s``; an IP literal
    has none and is INSECURE without a query (see the module docstring)."""
    checked_at = int(time.time())
    if target.is_ip_literal:
        return TlsaLookup(DnssecStatus.INSECURE, ttl=LITERAL_TTL_S, checked_at=checked_at)
    query = dns.message.make_query(tlsa_name(target), dns.rdatatype.TLSA, want_dnssec=True)
    query.flags |= dns.flags.AD
    try:
        response = await exchange(query, resolver, timeout_s)
    except (trio.TooSlowError, dns.exception.DNSException, OSError):
        return TlsaLookup(DnssecStatus.RESOLVER_FAILURE, checked_at=checked_at)
    return _read(response, checked_at)


async def exchange(
    query: dns.message.Message, resolver: tuple[str, int], timeout_s: float
) -> dns.message.Message:
    """The answer of ``resolver`` (address, port) to ``query``, within
    ``timeout_s`` (UDP, then TCP when the answer is truncated). Datagrams
    that are not the answer (another source, another id or question,
    malformed) are ignored until the deadline (dnspython's
    ``ignore_unexpected`` and ``ignore_errors``).

    Error handling: ``trio.TooSlowError`` when no answer came in time;
    ``dns.exception.DNSException`` or ``OSError`` for a malformed TCP answer
    or a socket error (any other exception dnspython lets out on what the
    resolver sent is mapped to ``DNSException``: a peer's bytes never end
    the caller's task)."""
    address, port = resolver
    try:
        with trio.fail_after(timeout_s):
            response, _ = await dns.asyncquery.udp_with_fallback(
                query, address, port=port, timeout=timeout_s, backend=_backend(),
                ignore_unexpected=True, ignore_errors=True,
            )
    except (trio.TooSlowError, dns.exception.DNSException, OSError):
        raise
    except Exception as exc:  # e.g. a parser's ValueError on a hostile TCP answer
        raise dns.exception.DNSException(f"unreadable answer: {type(exc).__name__}") from exc
    return response


def _read(response: dns.message.Message, checked_at: int) -> TlsaLookup:
    rcode = response.rcode()
    secure = bool(response.flags & dns.flags.AD)
    if rcode == dns.rcode.SERVFAIL:
        return TlsaLookup(DnssecStatus.BOGUS, checked_at=checked_at)
    if rcode not in (dns.rcode.NOERROR, dns.rcode.NXDOMAIN):
        return TlsaLookup(DnssecStatus.RESOLVER_FAILURE, checked_at=checked_at)
    answers = [rrset for rrset in response.answer if rrset.rdtype == dns.rdatatype.TLSA]
    if not answers:
        status = DnssecStatus.SECURE_DENIAL if secure else DnssecStatus.INSECURE
        return TlsaLookup(status, ttl=_negative_ttl(response), checked_at=checked_at)
    if not secure:
        ttl = min(rrset.ttl for rrset in answers)
        return TlsaLookup(DnssecStatus.INSECURE, ttl=ttl, checked_at=checked_at)
    records = tuple(
        Tlsa(rdata.usage, rdata.selector, rdata.mtype, bytes(rdata.cert))
        for rrset in answers for rdata in rrset
    )
    return TlsaLookup(DnssecStatus.SECURE, records, min(r.ttl for r in answers), checked_at)


def _negative_ttl(response: dns.message.Message) -> int:
    """How long a denial may be cached (RFC 2308 section 5: the SOA's TTL,
    at most its MINIMUM field); 0 without an SOA (a static local zone
    answers so), which the verdict's floor, ``[verify] dane_reuse_min_s``,
    raises."""
    for rrset in response.authority:
        if rrset.rdtype == dns.rdatatype.SOA:
            return min(rrset.ttl, min(rdata.minimum for rdata in rrset))
    return 0


class Validation(Enum):
    """What a resolver showed of itself when asked for a name it should
    validate (``check_validation``)."""

    VALIDATES = "validates"  # an answer with the AD bit
    DOES_NOT_VALIDATE = "does-not-validate"  # an answer (or denial) without it
    NO_ANSWER = "no-answer"  # silence, SERVFAIL, REFUSED, a malformed answer


@dataclass(frozen=True, slots=True)
class ValidationCheck:
    """One resolver's ``Validation`` (``resolver``: address, port), with
    what it did (``detail``, for the log and ``/readyz``)."""

    resolver: tuple[str, int]
    result: Validation
    detail: str

    @property
    def where(self) -> str:
        """The resolver as ``[dns] resolvers`` spells it."""
        address, port = self.resolver
        return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


async def check_validation(
    resolver: tuple[str, int], name: str, timeout_s: float
) -> ValidationCheck:
    """Whether ``resolver`` validates DNSSEC: ``name`` SOA asked with the DO
    and AD bits (``[dns] validation_check_name``, a name in a signed zone
    whose trust anchor the resolver should hold: the root by default) must
    come back with the AD bit, within ``timeout_s``. A SERVFAIL is no
    answer (it may be the resolver's upstream failing, not the resolver
    ignoring DNSSEC). Error handling: never raises for what the network
    does."""
    query = dns.message.make_query(name, dns.rdatatype.SOA, want_dnssec=True)
    query.flags |= dns.flags.AD
    try:
        response = await exchange(query, resolver, timeout_s)
    except (trio.TooSlowError, dns.exception.DNSException, OSError):
        return ValidationCheck(
            resolver, Validation.NO_ANSWER, f"no answer to {name} SOA within {timeout_s:g} s"
        )
    rcode = response.rcode()
    if rcode not in (dns.rcode.NOERROR, dns.rcode.NXDOMAIN):
        return ValidationCheck(
            resolver, Validation.NO_ANSWER, f"answered {name} SOA with {dns.rcode.to_text(rcode)}"
        )
    if not response.flags & dns.flags.AD:
        return ValidationCheck(
            resolver, Validation.DOES_NOT_VALIDATE,
            f"answered {name} SOA without the AD bit",
        )
    return ValidationCheck(resolver, Validation.VALIDATES, f"validated {name} SOA")


def _backend() -> dns.asyncbackend.Backend:
    return dns.asyncbackend.get_backend("trio")


def resolver_through(
    resolvers: Sequence[tuple[str, int]], timeout_s: float
) -> Callable[[str, int], Awaitable[list[str]]]:
    """A prober ``Resolver`` (``notary.outbound.dialer``) asking the
    validating ``resolvers`` in turn (the ones DANE trusts: DANE's TLSA and
    the addresses probed then come from the same resolver): A then AAAA of
    the absolute name, no search domains, each exchange within
    ``timeout_s``. A resolver that does not answer (silence, REFUSED, a
    malformed answer) is asked no further and the next one is tried.

    Error handling: ``ProbeResolverFailed`` when the first resolver that
    answers says SERVFAIL without an address (``dnssec="bogus"``: what a
    validating resolver answers when validation fails) or when none
    answers (``"resolver-failure"``); ``ProbeResolveFailed`` when the name
    has no address (NXDOMAIN, no data)."""

    async def resolve(host: str, port: int) -> list[str]:
        if Target(host, port).is_ip_literal:  # an address is not looked up
            return [host]
        name = absolute_name(host)
        for resolver in resolvers:
            found: list[str] = []
            said: list[str] = []
            for rdtype in (dns.rdatatype.A, dns.rdatatype.AAAA):
                query = dns.message.make_query(name, rdtype, want_dnssec=True)
                try:
                    response = await exchange(query, resolver, timeout_s)
                except (trio.TooSlowError, dns.exception.DNSException, OSError):
                    said.append("failed")
                    break  # silent: not asked again, the next resolver is
                rcode = response.rcode()
                if rcode == dns.rcode.SERVFAIL:
                    said.append("bogus")
                elif rcode in (dns.rcode.NOERROR, dns.rcode.NXDOMAIN):
                    said.append("answered")
                    found += [
                        rdata.address for rrset in response.answer if rrset.rdtype == rdtype
                        for rdata in rrset
                    ]
                else:
                    said.append("failed")  # REFUSED and the like
                    break
            if found:
                return list(dict.fromkeys(found))
            if "bogus" in said:
                raise ProbeResolverFailed(
                    f"{host}: DNSSEC validation failed", dnssec=DnssecStatus.BOGUS.value
                )
            if "failed" not in said:
                # an answer without addresses: another resolver would say the same
                raise ProbeResolveFailed(f"{host}: no address from the resolver")
        raise ProbeResolverFailed(
            f"{host}: no answer from the resolver", dnssec=DnssecStatus.RESOLVER_FAILURE.value
        )

    return resolve
