import "./webcrypto.mjs";
import { test } from "node:test";
import assert from "node:assert/strict";
import { canonicalJson } from "../src/lib/canonical.js";
import { fixtures } from "./fixtures.mjs";

test("canonical JSON is byte for byte the Python notary's (rules C1-C7)", () => {
  for (const { value, text } of fixtures.canonical) assert.equal(canonicalJson(value), text);
});

test("re-encoding parsed values ignores the wire's spelling (C7)", () => {
  assert.equal(canonicalJson(JSON.parse('{ "b" : "\\u0041" , "a":1 }')), '{"a":1,"b":"A"}');
});

test("values outside C1 are refused, never coerced", () => {
  assert.throws(() => canonicalJson(1.5), TypeError);
  assert.throws(() => canonicalJson(NaN), TypeError);
  assert.throws(() => canonicalJson(2 ** 53), RangeError);
  assert.throws(() => canonicalJson({ "é": 1 }), RangeError);
  assert.throws(() => canonicalJson("\ud800"), RangeError);
  assert.throws(() => canonicalJson("a\udc00"), RangeError);
  assert.throws(() => canonicalJson(undefined), TypeError);
  let deep = 1;
  for (let i = 0; i < 16; i += 1) deep = [deep];
  assert.equal(canonicalJson(deep), "[".repeat(16) + "1" + "]".repeat(16)); // as deep as Python allows
  assert.throws(() => canonicalJson([deep]), RangeError);
});
