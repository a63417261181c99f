// How the add-on turns notaries' answers into a verdict, as `notary check`
// does (notary/protocol/voting.py; PROTOCOLS.md 1.7 with its bugs fixed):
// 1. each notary's answer is one verdict: success, failure (it sees another
//    certificate, or its answer does not verify), inconclusive (it cannot
//    tell), connectivity-failure (no answer);
// 2. inconclusive and connectivity failures stand aside, unless strict, where
//    they count against;
// 3. over the counted notaries: consensus (all), majority (strictly more
//    than half), minority (at least one);
// 4. no notary counted: inconclusive.

export const Verdict = Object.freeze({
  SUCCESS: "success",
  FAILURE: "failure",
  INCONCLUSIVE: "inconclusive",
  CONNECTIVITY_FAILURE: "connectivity-failure",
});
export const Threshold = Object.freeze({ CONSENSUS: "consensus", MAJORITY: "majority", MINORITY: "minority" });
export const Outcome = Object.freeze({ VERIFIED: "verified", REJECTED: "rejected", INCONCLUSIVE: "inconclusive" });

/** The verdict of a Convergence answer (rule 1): status (null: none),
 * listed (the fingerprint is in the list), signatureOk. */
export function classify(status, { listed, signatureOk }) {
  if (status === 200 || status === 409) {
    if (!signatureOk) return Verdict.FAILURE;
    return status === 200 && listed ? Verdict.SUCCESS : Verdict.FAILURE;
  }
  if (status === 303) return Verdict.INCONCLUSIVE;
  return Verdict.CONNECTIVITY_FAILURE;
}

/** A verified v2 verdict as a vote: a notary that answered but cannot
 * vouch either way stands aside like a 303. */
export const V2_VOTES = Object.freeze({
  match: Verdict.SUCCESS,
  mismatch: Verdict.FAILURE,
  unknown: Verdict.INCONCLUSIVE,
  unreachable: Verdict.INCONCLUSIVE,
  refused: Verdict.INCONCLUSIVE,
});

/** {outcome, successes, counted, stoodAside} of verdicts (rules 2-4). */
export function tally(verdicts, threshold, { strict = false } = {}) {
  let successes = 0;
  let failures = 0;
  let aside = 0;
  for (const verdict of verdicts) {
    if (verdict === Verdict.SUCCESS) successes += 1;
    else if (verdict === Verdict.FAILURE || strict) failures += 1;
    else aside += 1;
  }
  const counted = successes + failures;
  if (counted === 0) return { outcome: Outcome.INCONCLUSIVE, successes: 0, counted: 0, stoodAside: aside };
  let verified;
  if (threshold === Threshold.CONSENSUS) verified = successes === counted;
  else if (threshold === Threshold.MAJORITY) verified = 2 * successes > counted;
  else if (threshold === Threshold.MINORITY) verified = successes >= 1;
  else throw new Error(`unknown threshold ${threshold}`);
  return { outcome: verified ? Outcome.VERIFIED : Outcome.REJECTED, successes, counted, stoodAside: aside };
}
