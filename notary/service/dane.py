"""The DANE backend (issue 20): a target's TLSA records, looked up through
the validating resolvers the operator trusts, judged against every chain a
probe saw (``notary.model.dane``: a site serving several certificates at
once has each judged, issue 31). ``Records`` runs one check beside each
probe when DANE is among ``[verify] backends``. ``ResolverValidation``
checks that those resolvers validate DNSSEC at all (start-up, ``/readyz``).

Resource handling: holds no socket between checks (each lookup opens and
closes its own, ``notary.outbound.tlsa``). Error handling: never raises for
what the network does: a resolver that does not answer within
``[dns] timeout_s`` is asked no further and the next one is tried; when
none answers the verdict is ``resolver-failure``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import trio

from notary.errors import UsageError
from notary.model.dane import (
    JUDGING,
    DaneOutcome,
    DaneVerdict,
    DnssecStatus,
    Presented,
    TlsaLookup,
    Usage,
    verdict,
    verdict_on,
)
from notary.model.observations import ProbeReport
from notary.model.targets import Target
from notary.outbound.tlsa import Validation, ValidationCheck, check_validation, lookup_tlsa

__all__ = ["FAILED", "DaneChecker", "DaneStatistics", "ResolverValidation", "needs_chain"]

log = logging.getLogger(__name__)


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

    def judge(self, lookup: TlsaLookup, report: ProbeReport) -> DaneVerdict:
        """The verdict of ``lookup`` on everything the probe ``report`` saw:
        each distinct certificate, through each distinct chain it was served
        with (its leaf alone when the chain was not kept), counted once by
        the verdict's outcome (``notary.model.dane.verdict_on``)."""
        presented = [
            Presented(
                result.leaf.sha256, result.leaf.sha1,
                result.chain or ((result.leaf.der,) if result.leaf.der else ()),
            )
            for result in report.results
        ]
        now = datetime.fromtimestamp(self._clock(), UTC)
        made = verdict_on(
            lookup, presented, report.target.host, now,
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


def needs_chain(judged: DaneVerdict, report: ProbeReport) -> bool:
    """Whether ``judged`` might vouch for more with the chains ``report``
    lacks (another worker's probe, read back from the store, keeps only the
    leaves): a certificate served without its chain that no record vouches
    for, where a DANE-TA record could vouch through the chain."""
    if judged.outcome not in JUDGING or not any(
        r.usable and r.usage == Usage.DANE_TA for r in judged.lookup.records
    ):
        return False
    vouched = {j.sha256 for j in judged.judgements if j.matched is not None}
    return any(not r.chain and r.leaf.sha256 not in vouched for r in report.results)


class ResolverValidation:
    """Whether the resolvers DANE trusts do validate DNSSEC (``[dns]
    resolvers``; issue 30, item 14). Each is asked ``name`` (``[dns]
    validation_check_name``: SOA with the DO and AD bits, the answer must
    carry the AD bit; ``notary.outbound.tlsa.check_validation``) at
    start-up (``check_at_start``) and every ``recheck_s`` after (``serve``);
    ``/readyz`` reads the last result (``problems``, ``warnings``) and never
    asks itself.

    Rules:

    1. A resolver that answers without the AD bit does not validate: every
       signed site would look unsigned to DANE, and under "DANE, then
       perspective" a zone with broken signatures would be decided by the
       perspective. With ``required`` (``[dns] require_validation``) that
       refuses start-up, naming the resolver, and later makes ``/readyz``
       fail; without, it is a warning (the log, ``/readyz``'s body).
    2. A resolver that does not answer (silence within ``timeout_s``,
       SERVFAIL, REFUSED, a malformed answer) is a warning while another
       resolver answers as rule 1 accepts; when none does, ``/readyz``
       fails, with the reasons, until a later check succeeds. Start-up
       goes on (the resolver may be starting too).
    3. A change of a resolver's state is logged once, not at every check.

    Resource handling: one exchange per resolver per check, all at once,
    each within ``timeout_s``; no socket is held between checks. Error
    handling: ``check_at_start`` raises ``UsageError`` (rule 1); nothing
    raises for what the network does.
    """

    def __init__(
        self, resolvers: Sequence[tuple[str, int]], *, name: str, timeout_s: float,
        recheck_s: float, required: bool,
    ) -> None:
        self._resolvers = tuple(resolvers)
        self._name = name
        self._timeout_s = timeout_s
        self._recheck_s = recheck_s
        self._required = required
        #: The latest check, one per resolver, in ``[dns] resolvers`` order
        #: (empty: none made yet).
        self.checks: tuple[ValidationCheck, ...] = ()

    async def check(self, *, starting: bool = False) -> tuple[ValidationCheck, ...]:
        """Ask every resolver now; keep and return the results (``starting``:
        the start-up check, whose refusal says itself what the log would)."""
        found: list[ValidationCheck | None] = [None] * len(self._resolvers)

        async def ask(index: int, resolver: tuple[str, int]) -> None:
            found[index] = await check_validation(resolver, self._name, self._timeout_s)

        async with trio.open_nursery() as nursery:
            for index, resolver in enumerate(self._resolvers):
                nursery.start_soon(ask, index, resolver)
        previous = {check.resolver: check.result for check in self.checks}
        self.checks = tuple(check for check in found if check is not None)
        for check in self.checks:
            refused = starting and self._required and (
                check.result is Validation.DOES_NOT_VALIDATE)
            if previous.get(check.resolver) is not check.result and not refused:
                self._log_change(check, check.resolver in previous)
        return self.checks

    async def check_at_start(self) -> None:
        """The start-up check. Raises ``UsageError`` when a resolver does
        not validate and validation is required (rule 1)."""
        await self.check(starting=True)
        refusal = self.refusal()
        if refusal is not None:
            raise UsageError(refusal)

    def refusal(self) -> str | None:
        """Why start-up is refused (None: it is not), on one line."""
        bad = [check for check in self.checks if check.result is Validation.DOES_NOT_VALIDATE]
        if not bad or not self._required:
            return None
        return (
            f"[dns] resolver {', '.join(check.where for check in bad)} does not validate "
            f"DNSSEC ({bad[0].detail}): DANE would take every signed site for an unsigned "
            "one; point [dns] resolvers at a validating resolver, or set [dns] "
            "require_validation = false to run anyway"
        )

    def _usable(self) -> bool:
        return any(
            check.result is Validation.VALIDATES
            or (check.result is Validation.DOES_NOT_VALIDATE and not self._required)
            for check in self.checks
        )

    def problems(self) -> list[str]:
        """Why the worker is not ready (rules 1 and 2; empty: it is)."""
        problems = []
        if self._required:
            problems += [
                f"DNS resolver {check.where} does not validate DNSSEC ({check.detail}; "
                "[dns] require_validation)"
                for check in self.checks if check.result is Validation.DOES_NOT_VALIDATE
            ]
        if self.checks and not self._usable():
            problems += [
                f"DNS resolver {check.where} did not answer the DNSSEC check ({check.detail})"
                for check in self.checks if check.result is Validation.NO_ANSWER
            ]
        return problems

    def warnings(self) -> list[str]:
        """What ``/readyz`` adds to its body without failing (rules 1, 2)."""
        warnings = []
        if not self._required:
            warnings += [
                f"DNS resolver {check.where} does not validate DNSSEC ({check.detail}); "
                "running anyway ([dns] require_validation = false): DANE takes every site "
                "for unsigned"
                for check in self.checks if check.result is Validation.DOES_NOT_VALIDATE
            ]
        if self._usable():
            warnings += [
                f"DNS resolver {check.where} did not answer the DNSSEC check ({check.detail}); "
                "another resolver did"
                for check in self.checks if check.result is Validation.NO_ANSWER
            ]
        return warnings

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Check again every ``recheck_s``, until cancelled. A check that
        fails unexpectedly (a bug) is logged and the last result kept: the
        loop, and the notary around it, go on."""
        task_status.started()
        while True:
            await trio.sleep(self._recheck_s)
            try:
                await self.check()
            except Exception:
                log.exception("checking that the DNS resolvers validate failed")

    def _log_change(self, check: ValidationCheck, before: bool) -> None:
        if check.result is Validation.VALIDATES:
            if before:
                log.info("DNS resolver %s validates DNSSEC again", check.where)
            return
        if check.result is Validation.DOES_NOT_VALIDATE:
            log.warning(
                "DNS resolver %s does not validate DNSSEC (%s)%s", check.where, check.detail,
                "" if self._required else "; running anyway ([dns] require_validation = false)",
            )
            return
        log.warning("DNS resolver %s did not answer the DNSSEC check (%s)", check.where,
                    check.detail)
