"""How a client turns notaries' answers into a verdict (PROTOCOLS.md 1.7),
sans-IO.

The legacy add-on's semantics, with its bugs fixed:

1. Each notary's answer is one of :class:`Verdict`: ``SUCCESS`` (200 and
   the fingerprint is in its signed list), ``FAILURE`` (200 without it, 409,
   or an answer whose signature does not verify: the add-on never checked),
   ``INCONCLUSIVE`` (303), ``CONNECTIVITY_FAILURE`` (anything else: no
   connection, wrong pinned certificate, other statuses).
2. Notaries that could not vouch either way (connectivity failures and
   inconclusive answers) *stand aside*: they are not counted, unless
   ``strict``, where they count against. (The add-on's stand-aside code was
   dead.) How many stood aside is always reported.
3. Over the counted notaries: ``consensus`` needs every one to succeed,
   ``majority`` strictly more than half (the add-on accepted exactly half),
   ``minority`` at least one.
4. With no notary counted, the outcome is ``INCONCLUSIVE``: too few answers,
   neither verified nor rejected.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Outcome", "Tally", "Threshold", "Verdict", "classify", "tally"]


class Verdict(enum.StrEnum):
    """One notary's answer about one fingerprint (rule 1)."""

    SUCCESS = "success"
    FAILURE = "failure"
    INCONCLUSIVE = "inconclusive"
    CONNECTIVITY_FAILURE = "connectivity-failure"


class Threshold(enum.StrEnum):
    CONSENSUS = "consensus"
    MAJORITY = "majority"
    MINORITY = "minority"


class Outcome(enum.StrEnum):
    VERIFIED = "verified"
    REJECTED = "rejected"
    INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True, slots=True)
class Tally:
    """The outcome of a vote and the counts behind it."""

    outcome: Outcome
    successes: int
    counted: int  # notaries whose answer took part in the vote
    stood_aside: int  # connectivity failures and inconclusive answers not counted


def classify(status: int | None, *, listed: bool, signature_ok: bool) -> Verdict:
    """The verdict of one notary's answer (rule 1).

    ``status`` is the HTTP status (None: no answer at all); ``listed``: the
    fingerprint asked about is in the answer's list; ``signature_ok``: the
    answer's signature verified with the notary's pinned key (only looked at
    for 200 and 409, which carry a signed list).
    """
    if status in (200, 409):
        if not signature_ok:
            return Verdict.FAILURE
        return Verdict.SUCCESS if status == 200 and listed else Verdict.FAILURE
    if status == 303:
        return Verdict.INCONCLUSIVE
    return Verdict.CONNECTIVITY_FAILURE


def tally(verdicts: Iterable[Verdict], threshold: Threshold, *, strict: bool = False) -> Tally:
    """Apply ``threshold`` to ``verdicts`` (rules 2-4)."""
    successes = failures = aside = 0
    for verdict in verdicts:
        if verdict is Verdict.SUCCESS:
            successes += 1
        elif verdict is Verdict.FAILURE or strict:
            failures += 1
        else:
            aside += 1
    counted = successes + failures
    if counted == 0:
        return Tally(Outcome.INCONCLUSIVE, 0, 0, aside)
    if threshold is Threshold.CONSENSUS:
        verified = successes == counted
    elif threshold is Threshold.MAJORITY:
        verified = 2 * successes > counted
    else:
        verified = successes >= 1
    outcome = Outcome.VERIFIED if verified else Outcome.REJECTED
    return Tally(outcome, successes, counted, aside)
