"""Whether a site serves one certificate or several at once (issue 31, "the
Citibank problem"): a target's *current set* and its *consistency*
(docs/v2.md, rule S8).

- The **current set** of a timeline (``Timeline.current``): the newest
  observation's certificate and every certificate observed within
  ``fresh_for_s`` of ``now``; what every protocol judges against
  (docs/v2.md, V1; ``notary.protocol.convergence.status_of``). A timeline
  is ordered by ``last_seen``, newest first, so the current set is always
  its first observations.
- The **consistency** of the current set: ``stable`` when it has one
  certificate; ``rotating`` when one address is among the addresses of two
  of its certificates (per-connection alternation, or a rotation moving
  across addresses); ``split`` otherwise (several certificates, each
  address serving one of them). Also every address that served the
  current set (sorted by code point, deduplicated) and the current set's
  SHA-256s in timeline order.

What an observation says of its addresses is what it keeps: its
certificate's :data:`~notary.model.observations.MAX_ADDRESSES_PER_OBSERVATION`
newest (``Observation.addresses``). Pure: no I/O, no clock (``now`` is a
parameter).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from notary.model.observations import Timeline

__all__ = ["Consistency", "ConsistencyKind", "consistency_of", "summarise"]


class ConsistencyKind(StrEnum):
    """How a target's current set is served (the wire names of rule S8)."""

    STABLE = "stable"
    ROTATING = "rotating"
    SPLIT = "split"


@dataclass(frozen=True, slots=True)
class Consistency:
    """The consistency of a current set: its ``kind``, the ``addresses``
    that served it (sorted by code point, each once) and its certificates'
    SHA-256s (``current``, in timeline order: newest ``last_seen`` first)."""

    kind: ConsistencyKind
    addresses: tuple[str, ...]
    current: tuple[bytes, ...]

    @property
    def certificates(self) -> int:
        """How many certificates the current set has."""
        return len(self.current)


def consistency_of(timeline: Timeline, *, now: int, fresh_for_s: int) -> Consistency | None:
    """The consistency of ``timeline``'s current set at ``now`` (see the
    module docstring); None when the timeline has no observation."""
    current = timeline.current(now, fresh_for_s)
    if not current:
        return None
    return summarise((o.certificate.sha256, o.addresses) for o in current)


def summarise(served: Iterable[tuple[bytes, Iterable[str]]]) -> Consistency:
    """The consistency of a current set given as ``(sha256, addresses)``
    pairs in timeline order, one per certificate: what a notary computes
    from its timeline and what a client recomputes from a statement's
    observations to check its ``consistency`` (rule S8).

    Raises ``ValueError`` for an empty current set (a target with no
    observation has none)."""
    hashes: list[bytes] = []
    certificates_at: dict[str, int] = {}
    for sha256, addresses in served:
        hashes.append(sha256)
        for address in set(addresses):
            certificates_at[address] = certificates_at.get(address, 0) + 1
    if not hashes:
        raise ValueError("a current set has at least one certificate")
    if len(hashes) == 1:
        kind = ConsistencyKind.STABLE
    elif any(count > 1 for count in certificates_at.values()):
        kind = ConsistencyKind.ROTATING
    else:
        kind = ConsistencyKind.SPLIT
    return Consistency(kind, tuple(sorted(certificates_at)), tuple(hashes))
