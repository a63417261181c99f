"""One probe per node: the workers sharing a store probe a target once at a
time, whichever of them is asked (``notary.state.claims`` has the rules).

``NodeProber.probe`` claims the target in the store and probes it; when
another worker holds the claim it waits for that worker's observation to be
committed (it reads the store every ``poll_interval_s``), shares the failure
the holder left on the claim, or probes itself once the claim has expired.

Resource handling: borrows the storage and the prober; owns nothing.

Error handling: the probe's ``ProbeError``, or the holder's failure as the
same kind of ``ProbeError``; a store error while claiming or waiting is
logged and the target is probed here (a store that fails costs a duplicate
probe, never an answer).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import trio

from notary import errors
from notary.errors import ProbeError, StoreError
from notary.model.observations import ProbeReport, ProbeResult, Timeline
from notary.model.targets import Target
from notary.outbound.probe import Prober
from notary.outbound.writer import Storage

__all__ = ["NodeProber", "Probed"]

log = logging.getLogger(__name__)

#: The ``ProbeError`` class of each reason a holder can leave on a claim.
_ERRORS = {
    cls.reason: cls for cls in (
        ProbeError, errors.ProbeRefused, errors.ProbeResolveFailed, errors.ProbeConnectFailed,
        errors.ProbeHandshakeFailed, errors.ProbeTimeout, errors.ProbeThrottled,
    )
}


@dataclass(frozen=True, slots=True)
class Probed:
    """What a target served: ``report``; ``stored``: another worker's probe,
    already in the store (nothing to write again; its report is what the
    store says that probe saw: each certificate at the address it was seen
    at last, without chains)."""

    report: ProbeReport
    stored: bool = False


class NodeProber:
    """Probes a target once per node; see the module docstring. ``ttl_s``:
    how long a claim holds (the probe's timeout and the writer's delay);
    ``linger_s``: how long a claim stands after its probe, for waiters to read
    the failure or the committed observation."""

    def __init__(
        self, storage: Storage, prober: Prober, *, ttl_s: float, poll_interval_s: float,
        linger_s: float, clock: Callable[[], float],
    ) -> None:
        self._storage = storage
        self._prober = prober
        self._ttl_ms = math.ceil(ttl_s * 1000)
        self._poll_interval_s = poll_interval_s
        self._linger_ms = math.ceil(linger_s * 1000)
        self._clock = clock
        self.waited = 0  # probes another worker made for this one
        self.claims_expired = 0  # waits that ended in a probe here

    async def probe(
        self, target: Target, *, samples_per_address: int = 1,
        extra_addresses: Sequence[str] = (),
    ) -> Probed:
        """Probe ``target`` once per node (``Prober.probe``'s arguments),
        or take the probe another worker holding the claim made."""

        async def probe_here() -> Probed:
            return Probed(await self._prober.probe(
                target, samples_per_address=samples_per_address,
                extra_addresses=extra_addresses,
            ))

        try:
            claim = await self._storage.claim_probe(target, self._now_ms(), self._ttl_ms)
        except StoreError as exc:
            log.error("probe claim of %s failed, probing: %s", target, exc)
            return await probe_here()
        if claim.holder != self._storage.origin:
            since_s = (claim.until_ms - self._ttl_ms) // 1000
            seen = await self._wait_for_holder(target, since_s)
            if seen is not None:
                self.waited += 1
                return Probed(seen, stored=True)
            self.claims_expired += 1
        failure: str | None = None
        try:
            return await probe_here()
        except ProbeError as exc:
            failure = exc.reason
            raise
        finally:
            with trio.CancelScope(shield=True):
                await self._release(target, failure)

    async def _release(self, target: Target, failure: str | None) -> None:
        try:
            await self._storage.release_claim(target, failure, self._now_ms(), self._linger_ms)
        except StoreError as exc:
            log.error("could not release the probe claim of %s: %s", target, exc)

    async def _wait_for_holder(self, target: Target, since_s: int) -> ProbeReport | None:
        """The observations another worker stored at ``since_s`` or later (as
        a ``ProbeReport``); None when its claim ended without one. Raises
        the holder's failure."""
        while True:
            await trio.sleep(self._poll_interval_s)
            try:
                timeline = await self._storage.load_timeline(target)
                newest = timeline.newest
                if newest is not None and newest.last_seen >= since_s:
                    return _as_report(timeline, since_s)
                claim = await self._storage.read_claim(target)
            except StoreError as exc:
                log.error("waiting for another worker's probe of %s failed: %s", target, exc)
                return None
            if claim is None or claim.until_ms <= self._now_ms():
                return None
            if claim.failure is not None:
                raise _ERRORS.get(claim.failure, ProbeError)(
                    f"another worker's probe failed ({claim.failure})"
                )

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)


def _as_report(timeline: Timeline, since_s: int) -> ProbeReport:
    """What the store says the probes since ``since_s`` saw: each
    certificate seen since, at the address it was seen at last (the store
    keeps no more), newest first."""
    target = timeline.target
    results = tuple(
        ProbeResult(target, o.certificate, (), o.addresses[0] if o.addresses else "", o.last_seen)
        for o in timeline.observations if o.last_seen >= since_s
    )
    addresses = tuple(dict.fromkeys(result.address for result in results))
    return ProbeReport(target, results, addresses, (), results[0].observed_at)
