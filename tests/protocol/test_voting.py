"""Voting on notaries' answers (notary.protocol.voting): the add-on's
semantics with its arithmetic fixed."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from notary.protocol.voting import Outcome, Threshold, Verdict, classify, tally

S, F, N, C = (Verdict.SUCCESS, Verdict.FAILURE, Verdict.INCONCLUSIVE,
              Verdict.CONNECTIVITY_FAILURE)


@pytest.mark.parametrize(
    ("status", "listed", "signature_ok", "expected"),
    [
        (200, True, True, S),
        (200, False, True, F),
        (409, False, True, F),
        (409, True, True, F),  # 409 is "I see another one", whatever the list holds
        (200, True, False, F),  # a bad signature is a failure of that notary
        (409, False, False, F),
        (303, False, False, N),
        (503, False, False, C),
        (403, True, True, C),
        (None, False, False, C),
    ],
)
def test_classify(status: int | None, listed: bool, signature_ok: bool, expected: Verdict) -> None:
    assert classify(status, listed=listed, signature_ok=signature_ok) is expected


def test_majority_is_strictly_more_than_half() -> None:
    assert tally([S, F], Threshold.MAJORITY).outcome is Outcome.REJECTED  # the add-on accepted
    assert tally([S, S, F], Threshold.MAJORITY).outcome is Outcome.VERIFIED
    assert tally([S, S, F, F], Threshold.MAJORITY).outcome is Outcome.REJECTED


def test_consensus_and_minority() -> None:
    assert tally([S, S, S], Threshold.CONSENSUS).outcome is Outcome.VERIFIED
    assert tally([S, S, F], Threshold.CONSENSUS).outcome is Outcome.REJECTED
    assert tally([S, F, F], Threshold.MINORITY).outcome is Outcome.VERIFIED
    assert tally([F, F, F], Threshold.MINORITY).outcome is Outcome.REJECTED


def test_connectivity_failures_stand_aside_unless_strict() -> None:
    relaxed = tally([S, S, C], Threshold.CONSENSUS)
    assert (relaxed.outcome, relaxed.counted, relaxed.stood_aside) == (Outcome.VERIFIED, 2, 1)
    strict = tally([S, S, C], Threshold.CONSENSUS, strict=True)
    assert (strict.outcome, strict.counted, strict.stood_aside) == (Outcome.REJECTED, 3, 0)
    assert tally([S, N], Threshold.CONSENSUS).stood_aside == 1


def test_nobody_counted_is_inconclusive() -> None:
    for verdicts in ([], [C], [C, N, C]):
        result = tally(verdicts, Threshold.MINORITY)
        assert (result.outcome, result.counted) == (Outcome.INCONCLUSIVE, 0)
        assert result.stood_aside == len(verdicts)


@given(st.lists(st.sampled_from(list(Verdict)), max_size=12), st.booleans())
def test_tally_against_a_model(verdicts: list[Verdict], strict: bool) -> None:
    successes = verdicts.count(S)
    failures = verdicts.count(F) + (verdicts.count(C) + verdicts.count(N) if strict else 0)
    counted = successes + failures
    for threshold in Threshold:
        result = tally(verdicts, threshold, strict=strict)
        assert result.successes == successes and result.counted == counted
        assert result.counted + result.stood_aside == len(verdicts)
        if counted == 0:
            assert result.outcome is Outcome.INCONCLUSIVE
            continue
        fraction = successes / counted
        expected = {
            Threshold.CONSENSUS: fraction == 1,
            Threshold.MAJORITY: fraction > 0.5,
            Threshold.MINORITY: successes > 0,
        }[threshold]
        assert (result.outcome is Outcome.VERIFIED) == expected


def test_thresholds_are_ordered() -> None:
    """Whatever the answers, consensus => majority => minority."""
    for verdicts in itertools.product([S, F, C], repeat=4):
        verified = {t: tally(verdicts, t).outcome is Outcome.VERIFIED for t in Threshold}
        assert verified[Threshold.CONSENSUS] <= verified[Threshold.MAJORITY]
        assert verified[Threshold.MAJORITY] <= verified[Threshold.MINORITY]
