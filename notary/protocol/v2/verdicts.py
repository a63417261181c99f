"""Verdicts for the submitted hashes, whether an entry can be answered
without a probe (docs/v2.md, rules V1-V6), whether a match is by key alone
(``matched_by``, V6), and how long a statement signed earlier still gives
every verdict a new one would (``sightings_deadline``)."""

from __future__ import annotations

import math

from notary.model.observations import Observation, Timeline
from notary.protocol.convergence import Decision
from notary.protocol.v2.constants import (
    MATCHED_BY_SPKI,
    MAX_STATEMENT_OBSERVATIONS,
    VERDICT_MATCH,
    VERDICT_MISMATCH,
    VERDICT_UNKNOWN,
)
from notary.protocol.v2.requests import TargetQuery


def _matches(
    observation: Observation,
    sha256: bytes | None,
    sha1: bytes | None,
    spki_sha256: bytes | None = None,
) -> bool:
    """True when the observed certificate has every submitted hash."""
    certificate = observation.certificate
    return (
        (sha256 is None or certificate.sha256 == sha256)
        and (sha1 is None or certificate.sha1 == sha1)
        and (spki_sha256 is None or certificate.spki_sha256 == spki_sha256)
    )


def verdict_of(
    timeline: Timeline | None,
    sha256: bytes | None,
    sha1: bytes | None,
    *,
    now: int,
    fresh_for_s: int,
    spki_sha256: bytes | None = None,
) -> str:
    """``match``, ``mismatch`` or ``unknown`` for the submitted hashes
    (docs/v2.md, rules V1-V6): a match is a certificate of the current set
    (the newest observation's, or one seen within ``fresh_for_s``) with
    every submitted hash, ``spki_sha256`` included (V6). ``unreachable``
    and ``refused`` are for the caller to give when a probe failed or was
    refused."""
    if sha256 is None and sha1 is None and spki_sha256 is None:
        return VERDICT_UNKNOWN
    observations = (
        timeline.observations[:MAX_STATEMENT_OBSERVATIONS] if timeline is not None else ()
    )
    if not observations:
        return VERDICT_UNKNOWN
    if _matches(observations[0], sha256, sha1, spki_sha256):
        return VERDICT_MATCH
    fresh = [o for o in observations if o.is_fresh(now, fresh_for_s)]
    if any(_matches(o, sha256, sha1, spki_sha256) for o in fresh):
        return VERDICT_MATCH
    return VERDICT_MISMATCH if fresh else VERDICT_UNKNOWN


def matched_by(query: TargetQuery, verdict: str) -> str | None:
    """The result's ``matched_by`` (rules S2, V6): ``"spki"`` for a
    ``match`` of an entry that submitted ``spki_sha256`` alone, else None
    (the member is left out)."""
    return MATCHED_BY_SPKI if verdict == VERDICT_MATCH and query.key_only else None


def decide(
    timeline: Timeline | None,
    sha256: bytes | None,
    sha1: bytes | None,
    *,
    now: int,
    fresh_for_s: int,
    reprobe_after_s: int,
    spki_sha256: bytes | None = None,
) -> Decision:
    """Whether a v2 entry can be answered now or needs a probe first
    (docs/v2.md, "Answer now or probe"), with the rules of
    :func:`notary.protocol.convergence.decide`; ``spki_sha256`` is a
    submitted hash like the others (V6)."""
    newest = timeline.newest if timeline is not None else None
    if timeline is None or newest is None:
        return Decision.PROBE
    if sha256 is None and sha1 is None and spki_sha256 is None:
        return Decision.ANSWER if newest.is_fresh(now, fresh_for_s) else Decision.PROBE
    if any(
        _matches(o, sha256, sha1, spki_sha256) and o.is_fresh(now, fresh_for_s)
        for o in timeline.observations[:MAX_STATEMENT_OBSERVATIONS]
    ):
        return Decision.ANSWER
    if newest.is_fresh(now, reprobe_after_s):
        return Decision.ANSWER
    return Decision.PROBE


def sightings_deadline(stated: Timeline, current: Timeline, lag_s: int) -> float | None:
    """Until when a statement of the observations ``stated`` gives, for any
    submitted hashes, the verdict (``verdict_of``) a statement of
    ``current`` would, with ``fresh_for_s`` at least ``lag_s``: None when
    the two differ by more than sightings (a certificate added or dropped
    among the first ``MAX_STATEMENT_OBSERVATIONS``, a ``first_seen`` moved,
    a ``last_seen`` gone back); else the earliest ``last_seen + lag_s`` in
    ``stated`` of the observations whose ``last_seen`` moved (``math.inf``
    when none did: only addresses differ, which no verdict reads).

    Why: before then each moved observation is fresh in both (its stated
    ``last_seen`` is within ``lag_s``) and each other one is the same in
    both, so the fresh sets are equal; the stated newest is at least as
    recent as a moved one, so fresh, and so is the current newest: in both,
    a hash matches exactly when a fresh observation has it (V1), and V2 and
    V3 read only the fresh set."""
    before = {o.certificate.sha256: o for o in stated.observations[:MAX_STATEMENT_OBSERVATIONS]}
    now_seen = current.observations[:MAX_STATEMENT_OBSERVATIONS]
    if len(now_seen) != len(before):
        return None
    deadline = math.inf
    for observation in now_seen:
        earlier = before.get(observation.certificate.sha256)
        if earlier is None or earlier.first_seen != observation.first_seen:
            return None
        if earlier.last_seen != observation.last_seen:
            if earlier.last_seen > observation.last_seen:
                return None
            deadline = min(deadline, earlier.last_seen + lag_s)
    return deadline
