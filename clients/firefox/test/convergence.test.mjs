import "./webcrypto.mjs";
import { test } from "node:test";
import assert from "node:assert/strict";
import { parseBundle } from "../src/lib/bundle.js";
import { ConvergenceError, formBody, parseAnswer, targetPath, verifySignature } from "../src/lib/convergence.js";
import { fixtures } from "./fixtures.mjs";

const [host] = (await parseBundle(fixtures.legacy_bundle)).hosts;

test("a Convergence answer the Python notary signed verifies with the pinned certificate's key", async () => {
  const parsed = parseAnswer(fixtures.convergence.answer);
  assert.equal(parsed.entries.length, 1);
  assert.equal(parsed.entries[0].sha1, fixtures.convergence.sha1);
  assert.ok(await verifySignature(host.spkiDer, parsed.payload, parsed.signature));
});

test("a tampered answer does not verify", async () => {
  const document = JSON.parse(fixtures.convergence.answer);
  document.fingerprintList[0].timestamp.start = "1";
  const parsed = parseAnswer(JSON.stringify(document));
  assert.equal(await verifySignature(host.spkiDer, parsed.payload, parsed.signature), false);
  assert.equal(await verifySignature(host.spkiDer, parsed.payload, "AAAA"), false);
  assert.equal(await verifySignature([1, 2, 3], parsed.payload, parsed.signature), false);
});

test("answers of another shape are refused", () => {
  const good = JSON.parse(fixtures.convergence.answer);
  for (const change of [
    (d) => { d.extra = 1; },
    (d) => { d.fingerprintList[0].timestamp.start = 5; },
    (d) => { d.fingerprintList[0].timestamp.finish = "0"; },
    (d) => { d.fingerprintList[0].fingerprint = "AB"; },
    (d) => { d.signature = "not base64!"; },
    (d) => { delete d.signature; },
  ]) {
    const document = structuredClone(good);
    change(document);
    assert.throws(() => parseAnswer(JSON.stringify(document)), ConvergenceError);
  }
});

test("request path and form", () => {
  assert.equal(targetPath("site.test", 443), "/target/site.test+443");
  assert.equal(targetPath("::1", 8443), "/target/[::1]+8443");
  assert.equal(formBody("ab".repeat(20)), "fingerprint=" + Array(20).fill("AB").join(":"));
});
