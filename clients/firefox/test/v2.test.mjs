import "./webcrypto.mjs";
import { test } from "node:test";
import assert from "node:assert/strict";
import { parseBundle } from "../src/lib/bundle.js";
import { parseAnswer, queryBody, trustedKeys, V2Error, verifyAnswer } from "../src/lib/v2.js";
import { fixtures } from "./fixtures.mjs";

const bundle = await parseBundle(fixtures.bundle);
const keys = await trustedKeys(bundle.hosts);
const now = fixtures.now;
const { nonce, queries } = fixtures;
const verify = async (text, options = {}) =>
  verifyAnswer(parseAnswer(text), keys, { nonce, now, queries, ...options });

/** The answer with one change made to its parsed document. */
function altered(text, change) {
  const document = JSON.parse(text);
  change(document);
  return JSON.stringify(document);
}

test("an answer the Python notary signed verifies: match, mismatch, unreachable", async () => {
  const results = await verify(fixtures.answer);
  assert.deepEqual(results.map((r) => r.verdict), ["match", "mismatch", "unreachable"]);
  assert.equal(results[0].observations[0].sha256, fixtures.site.sha256);
  assert.equal(results[0].backing.length, 1);
  assert.equal(results[0].validUntil, now - 30 + 86400);
  assert.equal(results[2].validUntil, null);
  assert.equal(results[0].logged, null);
});

test("the request carries host, port, sha256 and the nonce only", () => {
  assert.deepEqual(JSON.parse(queryBody([{ host: "Site.TEST.", port: 443, sha256: "ab", sha1: "cd" }], "n")),
    { nonce: "n", targets: [{ host: "site.test", port: 443, sha256: "ab" }] });
});

test("what is not as signed is refused, naming the check", async () => {
  const cases = [
    [altered(fixtures.answer, (d) => { d.answer.results[1].verdict = "match"; }), /bad answer signature/],
    [altered(fixtures.answer, (d) => { d.answer.signed_at += 1; }), /bad answer signature/],
    [altered(fixtures.answer, (d) => { d.statements[0].statement.observations[0].last_seen += 1; }), /bad statement signature/],
    [altered(fixtures.answer, (d) => { d.answer.key_id = "0000000000000000"; }), /unknown key id/],
    [altered(fixtures.answer, (d) => { d.answer.extra = 1; }), /bad answer signature/],
    [altered(fixtures.answer, (d) => { d.statements[0].statement.extra = 1; }), /bad statement signature/],
    [altered(fixtures.answer, (d) => { d.signature = d.statements[0].signature; }), /bad answer signature/],
  ];
  for (const [text, pattern] of cases) await assert.rejects(verify(text), pattern);
  await assert.rejects(verify(fixtures.answer, { nonce: "another" }), /wrong nonce/);
  await assert.rejects(verify(fixtures.answer, { now: now + 2 * 86400 }), /expired/);
  await assert.rejects(verify(fixtures.answer, { queries: queries.slice(0, 2) }), /targets asked/);
  await assert.rejects(verify(fixtures.answer, { queries: [{ ...queries[0], sha256: fixtures.rogue.sha256 }, ...queries.slice(1)] }),
    /not backed by its statement/);
  await assert.rejects(verifyAnswer(parseAnswer(fixtures.answer), {}, { nonce, now, queries }), /unknown key id/);
});

test("malformed answers are V2Errors, whatever the bytes", () => {
  for (const text of ["", "{", "[]", "null", '{"answer": 1}', "x".repeat(100),
    altered(fixtures.answer, (d) => { d.answer.type = "other"; }),
    altered(fixtures.answer, (d) => { d.answer.results[0].verdict = "maybe"; }),
    altered(fixtures.answer, (d) => { d.answer.results[0].target = "SITE.test:443"; }),
    altered(fixtures.answer, (d) => { d.statements[0].statement.observations[0].sha256 = "AB"; }),
    altered(fixtures.answer, (d) => { d.statements[0].statement.signed_at = 1.5; }),
    altered(fixtures.answer, (d) => { d.statements[0].statement.valid_until = 0; }),
  ]) {
    assert.throws(() => parseAnswer(text), V2Error, text.slice(0, 40));
  }
});

test("a notary of issue 31: consistency and matched_by are accepted as signed", async () => {
  const [result] = await verify(fixtures.answer_several, { queries: queries.slice(0, 1) });
  assert.equal(result.verdict, "match");
  assert.equal(result.consistency.kind, "split");
  assert.deepEqual(result.consistency.current, [fixtures.site.sha256, fixtures.other_sha256]);
  await assert.rejects(verify(altered(fixtures.answer_several, (d) => {
    d.statements[0].statement.consistency.kind = "stable";
  }), { queries: queries.slice(0, 1) }), /kind/);
  await assert.rejects(verify(altered(fixtures.answer_several, (d) => {
    d.answer.results[0].matched_by = "spki";
  }), { queries: queries.slice(0, 1) }), /bad answer signature/);
});

test("a logged statement: its inclusion proof leads to a checkpoint the notary signed (S7)", async () => {
  const one = queries.slice(0, 1);
  const [result] = await verify(fixtures.answer_logged, { queries: one, logOrigin: fixtures.log_origin });
  assert.deepEqual(result.logged, { index: 1, size: 3n });
  const [promised] = await verify(fixtures.answer_promised, { queries: one, logOrigin: fixtures.log_origin });
  assert.equal(promised.logged, "promised");
  await assert.rejects(verify(fixtures.answer_promised, { queries: one, now: now + 600 }), /promise is broken/);
  await assert.rejects(verify(fixtures.answer_logged, { queries: one, logOrigin: "other.test/log" }), /another log/);
  await assert.rejects(verify(fixtures.answer, { logOrigin: fixtures.log_origin }), /pins a log/);
  await assert.rejects(verify(altered(fixtures.answer_logged, (d) => {
    d.statements[0].inclusion.index = 0;
  }), { queries: one }), /log: proof does not lead to the root/);
  await assert.rejects(verify(altered(fixtures.answer_logged, (d) => {
    d.statements[0].inclusion.checkpoint = d.statements[0].inclusion.checkpoint.replace("\n3\n", "\n4\n");
  }), { queries: one }), /log: invalid signature/);
});
