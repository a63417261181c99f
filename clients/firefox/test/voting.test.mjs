import "./webcrypto.mjs";
import { test } from "node:test";
import assert from "node:assert/strict";
import { classify, tally, Verdict as V } from "../src/lib/voting.js";

test("classify mirrors notary.protocol.voting.classify", () => {
  assert.equal(classify(200, { listed: true, signatureOk: true }), V.SUCCESS);
  assert.equal(classify(200, { listed: false, signatureOk: true }), V.FAILURE);
  assert.equal(classify(200, { listed: true, signatureOk: false }), V.FAILURE);
  assert.equal(classify(409, { listed: true, signatureOk: true }), V.FAILURE);
  assert.equal(classify(303, { listed: false, signatureOk: false }), V.INCONCLUSIVE);
  assert.equal(classify(503, { listed: false, signatureOk: false }), V.CONNECTIVITY_FAILURE);
  assert.equal(classify(null, { listed: false, signatureOk: false }), V.CONNECTIVITY_FAILURE);
});

test("thresholds, standing aside and strict votes", () => {
  const t = (verdicts, threshold, strict = false) => tally(verdicts, threshold, { strict });
  assert.deepEqual(t([V.SUCCESS, V.SUCCESS, V.FAILURE], "majority"),
    { outcome: "verified", successes: 2, counted: 3, stoodAside: 0 });
  assert.equal(t([V.SUCCESS, V.FAILURE], "majority").outcome, "rejected"); // exactly half is not a majority
  assert.equal(t([V.SUCCESS, V.FAILURE], "minority").outcome, "verified");
  assert.equal(t([V.SUCCESS, V.FAILURE], "consensus").outcome, "rejected");
  // One of two notaries down: it stands aside, the other decides ...
  assert.deepEqual(t([V.SUCCESS, V.CONNECTIVITY_FAILURE], "consensus"),
    { outcome: "verified", successes: 1, counted: 1, stoodAside: 1 });
  // ... unless silent notaries count against.
  assert.equal(t([V.SUCCESS, V.CONNECTIVITY_FAILURE], "majority", true).outcome, "rejected");
  assert.equal(t([V.SUCCESS, V.CONNECTIVITY_FAILURE], "minority", true).outcome, "verified");
  assert.deepEqual(t([V.INCONCLUSIVE, V.CONNECTIVITY_FAILURE], "majority"),
    { outcome: "inconclusive", successes: 0, counted: 0, stoodAside: 2 });
  assert.equal(t([], "minority").outcome, "inconclusive");
  assert.throws(() => t([V.SUCCESS], "plurality"));
});
