"""The DANE backend (issue 20): a target's TLSA records, looked up through
the validating resolvers the operator trusts, judged against the chain a
probe saw (``notary.model.dane``). ``Records`` runs one check beside each
probe when DANE is among ``[verify] backends``.

Resource handling: holds no socket between checks (each lookup opens and
closes its own, ``notary.outbound.tlsa``). Error handling: never raises for
what the network does: a resolver that does not answer within
``[dns] timeout_s`` is asked no further and the next one is tried; when
none answers the verdict is ``resolver-failure``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from notary.model.dane import DaneOutcome, DaneVerdict, DnssecStatus, TlsaLookup, Usage, verdict
from notary.model.observations import ProbeResult
from notary.model.targets import Target
from notary.outbound.tlsa import lookup_tlsa

__all__ = ["FAILED", "DaneChecker", "DaneStatistics", "needs_chain"]


@dataclass(frozen=True, slots=True)
class DaneStatistics:
    """The checks a ``DaneChecker`` made, by outcome (read by the metrics)."""

    checked: dict[str, int]


class DaneChecker:
    """Looks up and judges TLSA records; counts its verdicts by outcome
    (``checked``, read by the metrics through ``statistics``)."""

    def __init__(
        self, resolvers: Sequence[tuple[str, int]], *, timeout_s: float, max_reuse_s: int,
        failure_reuse_s: int, clock: Callable[[], float], min_reuse_s: int = 0,
    ) -> None:
        self._resolvers = tuple(resolvers)
        self._timeout_s = timeout_s
        self._max_reuse_s = max_reuse_s
        self._min_reuse_s = min_reuse_s
        self._failure_reuse_s = failure_reuse_s
        self._clock = clock
        self.checked: dict[str, int] = {outcome.value: 0 for outcome in DaneOutcome}

    def statistics(self) -> DaneStatistics:
        return DaneStatistics(dict(self.checked))

    async def lookup(self, target: Target) -> TlsaLookup:
        """The target's TLSA records from the first resolver that answers."""
        found = TlsaLookup(DnssecStatus.RESOLVER_FAILURE)
        for resolver in self._resolvers:
            found = await lookup_tlsa(target, resolver, self._timeout_s)
            if found.status is not DnssecStatus.RESOLVER_FAILURE:
                break
        return replace(found, checked_at=int(self._clock()))  # the notary's clock

    def judge(self, lookup: TlsaLookup, result: ProbeResult) -> DaneVerdict:
        """The verdict of ``lookup`` on what the probe ``result`` saw (its
        chain; its leaf alone when the chain was not kept)."""
        chain = result.chain or (result.leaf.der,)
        now = datetime.fromtimestamp(self._clock(), UTC)
        made = verdict(
            lookup, chain, result.target.host, now,
            max_reuse_s=self._max_reuse_s, failure_reuse_s=self._failure_reuse_s,
            min_reuse_s=self._min_reuse_s,
        )
        self.checked[made.outcome.value] += 1
        return made

    def failed(self, target: Target, status: DnssecStatus) -> DaneVerdict:
        """The verdict, counted, when DNSSEC failed (``status`` is BOGUS or
        RESOLVER_FAILURE) before a probe saw a certificate: the name's own
        addresses could not be looked up, or the probe failed beside a
        failed TLSA lookup. It judges no certificate (``leaf_sha256`` is
        empty) and is reused for ``failure_reuse_s``."""
        if status not in FAILED:
            raise ValueError(f"{status} is no DNSSEC failure")
        lookup = TlsaLookup(status, checked_at=int(self._clock()))
        now = datetime.fromtimestamp(self._clock(), UTC)
        made = verdict(
            lookup, (), target.host, now,
            max_reuse_s=self._max_reuse_s, failure_reuse_s=self._failure_reuse_s,
            min_reuse_s=self._min_reuse_s,
        )
        self.checked[made.outcome.value] += 1
        return made


#: The DNSSEC statuses that are failures (a verdict of their own, never a match).
FAILED = frozenset({DnssecStatus.BOGUS, DnssecStatus.RESOLVER_FAILURE})


def needs_chain(judged: DaneVerdict, result: ProbeResult) -> bool:
    """Whether ``judged`` might be a match with the chain ``result`` lacks
    (another worker's probe, read back from the store, keeps only the leaf):
    a mismatch where a DANE-TA record could vouch through the chain."""
    return (
        not result.chain and judged.outcome is DaneOutcome.MISMATCH
        and any(r.usable and r.usage == Usage.DANE_TA for r in judged.lookup.records)
    )
