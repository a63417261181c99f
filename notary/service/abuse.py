"""The notary's abuse controls, made from ``[limits]``: who a connection's
client is (for limits), how many connections it has open, and whether it may
ask a query or cause a probe now.

Pure (no Trio, no clock: ``now`` is a parameter, the query service's clock),
built on :mod:`notary.model.ratelimit`. One instance per notary process (worker):
the limits are per worker.

Rules this module keeps:

1. A client in ``exempt_clients`` (or whose address is not an IP address) has
   no per-client limit: :meth:`AbuseControls.client_address` gives None for
   it, and every caller passes None on as "unlimited".
2. **Connections**: at most ``max_connections_per_address`` from one address
   and ``max_connections_per_prefix`` from one prefix (IPv4 /24, IPv6 /56),
   HTTP listeners (API, plain API, Perspectives) counted together in
   :attr:`~AbuseControls.connections`, relay connections apart in
   :attr:`~AbuseControls.relay_connections`.
3. **Queries**: a token bucket per client prefix (``queries_per_s_per_prefix``,
   ``query_burst``); a query costs 1, a v2 query one per target.
4. **Probes**: an on-demand probe a query would *start* (not one it joins) is
   admitted when both allow it, and then charged to both: the client
   prefix's bucket (``probes_per_s_per_prefix``, ``probe_burst``; refused:
   :class:`~notary.model.ratelimit.RateLimited`, 429) and the target's spacing
   (``probes_per_minute_per_target``: one probe at most every ``60 / N``
   seconds, so at most N in any minute; refused: :class:`ProbeThrottled`,
   answered as a failed probe). A probe the address policy refuses (no
   connection made) is given back to the target
   (:meth:`AbuseControls.refund_probe`), so a refused target keeps getting
   403, never a throttled 503. A probe covers one certificate new to the
   notary: one that shows more (a site serving several, at several
   addresses: issue 31) charges the client prefix one probe more for each
   further one, after the probe, into debt
   (:meth:`AbuseControls.charge_new_certificates`, at most
   ``MAX_PROBE_DEBT`` tokens: what a target keeps), so what a client makes
   the store keep is bounded by its probe rate as before.
5. **Destinations**: every probe, on-demand or scheduled, is admitted by the
   bucket of the address prefix it is about to connect to
   (``probes_per_s_per_destination_prefix``, ``destination_probe_burst``;
   :meth:`AbuseControls.admit_destination`, which the prober calls after the
   name resolved and the address policy passed, before connecting): keyed
   by the resolved address, so five names of one address share one budget.
   Refused: :class:`ProbeThrottled`, no connection made.
6. **Log bytes**: the bytes of the log entries of the v2 statements a
   client prefix's queries make the notary sign are charged to its bucket
   (``log_bytes_per_s_per_prefix``, ``log_burst_bytes``) after they were
   signed, into debt (:meth:`AbuseControls.charge_log`; a statement is
   signed for it only while not in debt, but renewals, so the debt is one
   entry at most, and the bucket keeps up to a burst and
   ``MAX_LOG_DEBT_BYTES`` of it: ratelimit rule 4); a client in
   debt (:meth:`AbuseControls.log_wait_s`) is refused a probe as by rule 4
   (:class:`~notary.model.ratelimit.RateLimited`, 429), and the query
   service signs no new statement for it meanwhile.
7. **Bounded**: each rate table holds at most ``max_tracked`` entries
   (:class:`~notary.model.ratelimit.TokenBuckets` rule 3); the connection tables
   hold one entry per address and prefix with an open connection.
"""

from __future__ import annotations

from dataclasses import dataclass

from notary.config import LimitsConfig
from notary.errors import ProbeThrottled
from notary.model.ratelimit import (
    ClientConnections,
    Exemptions,
    RateLimited,
    TokenBuckets,
    destination_prefix,
    packed_address,
    retry_after_s,
)

__all__ = ["AbuseControls", "AbuseStatistics", "ProbeThrottled"]

#: Seconds per minute (``probes_per_minute_per_target``).
MINUTE_S = 60.0
#: How far a client's probe bucket may go into debt (rule 4): a probe adds at
#: most a target's ``[store] max_certificates_per_target`` (64 by default)
#: certificates, the first of them paid for by its admission.
MAX_PROBE_DEBT = 64.0
#: How far a client's log bucket may go into debt (rule 6): one statement's
#: entry at most (a log entry holds at most 65,535 bytes), so one charged
#: while the bucket was not empty is never forgiven.
MAX_LOG_DEBT_BYTES = 0xFFFF


@dataclass(frozen=True, slots=True)
class AbuseStatistics:
    """A snapshot: connections refused per address and per prefix (HTTP and
    relay together); queries refused; probes refused by client, target and
    destination; entries in each rate table; probes refused for the
    client's log budget."""

    connections_refused_address: int
    connections_refused_prefix: int
    queries_refused: int
    probes_refused_client: int
    probes_refused_target: int
    probes_refused_destination: int
    tracked: dict[str, int]
    probes_refused_log: int = 0


def _buckets(rate_per_s: float, burst: float, max_entries: int) -> TokenBuckets | None:
    return TokenBuckets(rate_per_s, burst, max_entries=max_entries) if rate_per_s > 0 else None


class AbuseControls:
    """The limits of ``[limits]`` (see the module docstring).

    Resource handling: owns only bounded tables.
    Error handling: ``ConfigError`` for bad ``exempt_clients`` (validated
    with the config already); the checks never raise but as documented.
    """

    def __init__(self, limits: LimitsConfig) -> None:
        self.limits = limits
        self._exempt = Exemptions.from_cidrs(limits.exempt_clients)
        self.connections = ClientConnections(
            max_per_address=limits.max_connections_per_address,
            max_per_prefix=limits.max_connections_per_prefix,
        )
        self.relay_connections = ClientConnections(
            max_per_address=limits.max_connections_per_address,
            max_per_prefix=limits.max_connections_per_prefix,
        )
        tracked = limits.max_tracked
        #: Rule 3; None when ``queries_per_s_per_prefix`` is 0.
        self.queries = _buckets(limits.queries_per_s_per_prefix, limits.query_burst, tracked)
        self.client_probes = (
            TokenBuckets(
                limits.probes_per_s_per_prefix, limits.probe_burst, max_entries=tracked,
                max_debt=MAX_PROBE_DEBT,
            ) if limits.probes_per_s_per_prefix > 0 else None
        )
        per_minute = limits.probes_per_minute_per_target
        self.target_probes = _buckets(per_minute / MINUTE_S, 1, tracked) if per_minute else None
        self.destination_probes = _buckets(
            limits.probes_per_s_per_destination_prefix, limits.destination_probe_burst, tracked
        )
        #: Rule 6; None when ``log_bytes_per_s_per_prefix`` is 0.
        self.log_bytes = (
            TokenBuckets(
                limits.log_bytes_per_s_per_prefix, limits.log_burst_bytes, max_entries=tracked,
                max_debt=MAX_LOG_DEBT_BYTES,
            ) if limits.log_bytes_per_s_per_prefix > 0 else None
        )
        self._refused_log = 0
        self._refused_target = 0
        self._refused_destination = 0
        self._refused_client = 0

    @classmethod
    def unlimited(cls) -> AbuseControls:
        """Controls that admit every query and probe (rates 0: rule off);
        what a service without limits holds instead of None."""
        return cls(LimitsConfig(
            queries_per_s_per_prefix=0, probes_per_s_per_prefix=0,
            probes_per_minute_per_target=0, probes_per_s_per_destination_prefix=0,
            log_bytes_per_s_per_prefix=0,
        ))

    @property
    def target_spacing_s(self) -> float:
        """Least time between two probes of one target (0: no such limit)."""
        per_minute = self.limits.probes_per_minute_per_target
        return MINUTE_S / per_minute if per_minute else 0.0

    def client_address(self, peer: str) -> bytes | None:
        """The packed address of the client at ``peer`` (``getpeername()[0]``)
        when limits apply to it, None when it is exempt (rule 1)."""
        packed = packed_address(peer)
        if packed is None or packed in self._exempt:
            return None
        return packed

    def admit_query(self, client: bytes | None, now: float, cost: int = 1) -> None:
        """Rule 3 for the client prefix ``client`` (None: unlimited).

        Error handling: :class:`~notary.model.ratelimit.RateLimited` when refused."""
        queries = self.queries
        if client is None or queries is None:
            return
        wait = queries.take(client, now, float(cost))
        if wait:
            raise RateLimited("too many queries; retry later", retry_after_s=retry_after_s(wait))

    def admit_probe(self, client: bytes | None, target_key: str, now: float) -> None:
        """Rule 4 for a probe of ``target_key`` that the client prefix
        ``client`` would start.

        Error handling: :class:`~notary.model.ratelimit.RateLimited` (the client's
        budget) or :class:`ProbeThrottled` (the target's), charging nothing."""
        mine = self.client_probes if client is not None else None
        if mine is not None:
            wait = mine.wait_s(client, now)
            if wait:
                self._refused_client += 1
                raise RateLimited(
                    "too many probes asked for; retry later", retry_after_s=retry_after_s(wait)
                )
        wait = self.log_wait_s(client, now)
        if wait:
            self._refused_log += 1
            raise RateLimited(
                "too many log entries caused; retry later", retry_after_s=retry_after_s(wait)
            )
        targets = self.target_probes
        if targets is not None and targets.wait_s(target_key, now):
            self._refused_target += 1
            raise ProbeThrottled("could not observe the target's certificate")
        if targets is not None:
            targets.take(target_key, now)
        if mine is not None:
            mine.take(client, now)

    def charge_new_certificates(self, client: bytes | None, now: float, count: int) -> None:
        """Rule 4: the probe ``client`` (None: unlimited) was admitted for
        showed ``count`` certificates new to the notary: charge it one probe
        for each but the first, into debt if need be."""
        buckets = self.client_probes
        if client is not None and buckets is not None and count > 1:
            buckets.charge(client, now, float(count - 1))

    def log_wait_s(self, client: bytes | None, now: float) -> float:
        """Rule 6: 0.0 when the client prefix ``client`` (None: unlimited)
        may cause a log entry now, else the seconds until it may."""
        buckets = self.log_bytes
        if client is None or buckets is None:
            return 0.0
        return buckets.wait_s(client, now)

    def charge_log(self, client: bytes | None, now: float, size: int) -> None:
        """Rule 6: charge ``size`` bytes of log entries to ``client`` (None:
        unlimited), into debt if need be."""
        buckets = self.log_bytes
        if client is not None and buckets is not None and size:
            buckets.charge(client, now, float(size))

    def refund_probe(self, target_key: str) -> None:
        """Give the target back the probe ``admit_probe`` charged it: it was
        refused by the address policy, so no connection was made (the
        client's charge stays: it made the notary resolve a name)."""
        if self.target_probes is not None:
            self.target_probes.refund(target_key)

    def admit_destination(self, address: str, now: float) -> None:
        """Rule 5 for a probe about to connect to ``address`` (a resolved
        IP address the policy allows), charging its prefix.

        Error handling: :class:`ProbeThrottled` when the prefix's budget is
        spent, charging nothing."""
        destinations = self.destination_probes
        if destinations is None:
            return
        if destinations.take(destination_prefix(address), now):
            self._refused_destination += 1
            raise ProbeThrottled("could not observe the target's certificate")

    def statistics(self) -> AbuseStatistics:
        tables = {
            "queries": self.queries, "client_probes": self.client_probes,
            "target_probes": self.target_probes, "destination_probes": self.destination_probes,
            "log_bytes": self.log_bytes,
        }
        return AbuseStatistics(
            connections_refused_address=(
                self.connections.refused_address + self.relay_connections.refused_address
            ),
            connections_refused_prefix=(
                self.connections.refused_prefix + self.relay_connections.refused_prefix
            ),
            queries_refused=self.queries.refused if self.queries is not None else 0,
            probes_refused_client=self._refused_client,
            probes_refused_target=self._refused_target,
            probes_refused_destination=self._refused_destination,
            tracked={name: len(table) for name, table in tables.items() if table is not None},
            probes_refused_log=self._refused_log,
        )
