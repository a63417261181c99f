"""Verdicts for the submitted hashes, and whether an entry can be answered
without a probe (docs/v2.md, rules V1-V5)."""

from __future__ import annotations

from notary.model.observations import Observation, Timeline
from notary.protocol.convergence import Decision
from notary.protocol.v2.constants import (
    MAX_STATEMENT_OBSERVATIONS,
    VERDICT_MATCH,
    VERDICT_MISMATCH,
    VERDICT_UNKNOWN,
)


def _matches(observation: Observation, sha256: bytes | None, sha1: bytes | None) -> bool:
    """True when the observed certificate has every submitted hash."""
    certificate = observation.certificate
    return (sha256 is None or certificate.sha256 == sha256) and (
        sha1 is None or certificate.sha1 == sha1
    )


def verdict_of(
    timeline: Timeline | None,
    sha256: bytes | None,
    sha1: bytes | None,
    *,
    now: int,
    fresh_for_s: int,
) -> str:
    """``match``, ``mismatch`` or ``unknown`` for the submitted hashes
    (docs/v2.md, rules V1-V5). ``unreachable`` and ``refused`` are for the
    caller to give when a probe failed or was refused."""
    if sha256 is None and sha1 is None:
        return VERDICT_UNKNOWN
    observations = (
        timeline.observations[:MAX_STATEMENT_OBSERVATIONS] if timeline is not None else ()
    )
    if not observations:
        return VERDICT_UNKNOWN
    if _matches(observations[0], sha256, sha1):
        return VERDICT_MATCH
    fresh = [o for o in observations if o.is_fresh(now, fresh_for_s)]
    if any(_matches(o, sha256, sha1) for o in fresh):
        return VERDICT_MATCH
    return VERDICT_MISMATCH if fresh else VERDICT_UNKNOWN


def decide(
    timeline: Timeline | None,
    sha256: bytes | None,
    sha1: bytes | None,
    *,
    now: int,
    fresh_for_s: int,
    reprobe_after_s: int,
) -> Decision:
    """Whether a v2 entry can be answered now or needs a probe first
    (docs/v2.md, "Answer now or probe"), with the rules of
    :func:`notary.protocol.convergence.decide`."""
    newest = timeline.newest if timeline is not None else None
    if timeline is None or newest is None:
        return Decision.PROBE
    if sha256 is None and sha1 is None:
        return Decision.ANSWER if newest.is_fresh(now, fresh_for_s) else Decision.PROBE
    if any(
        _matches(o, sha256, sha1) and o.is_fresh(now, fresh_for_s)
        for o in timeline.observations[:MAX_STATEMENT_OBSERVATIONS]
    ):
        return Decision.ANSWER
    if newest.is_fresh(now, reprobe_after_s):
        return Decision.ANSWER
    return Decision.PROBE
