import "./webcrypto.mjs";
import { test } from "node:test";
import assert from "node:assert/strict";
import { colonHex, fromBase64, fromHex, toBase64, toHex } from "../src/lib/bytes.js";
import { derElement, pemCertificateToDer, subjectPublicKeyInfo } from "../src/lib/der.js";
import { certificateHashes } from "../src/lib/hashing.js";
import { fixtures } from "./fixtures.mjs";

test("hex and base64 round trips, strict base64", () => {
  const bytes = Uint8Array.from([0, 1, 127, 128, 254, 255, 42]);
  assert.equal(toHex(bytes), "00017f80feff2a");
  assert.deepEqual(fromHex("00017F80feff2a"), bytes);
  for (let n = 0; n < 7; n += 1) {
    const part = bytes.subarray(0, n);
    assert.equal(toBase64(part), Buffer.from(part).toString("base64"));
    assert.deepEqual(fromBase64(toBase64(part)), part);
  }
  for (const bad of ["QQ", "QQ=", "Q===", "QR==", " QQ==", "QQ==\n", "Q Q=="]) {
    assert.throws(() => fromBase64(bad), /base64/, bad);
  }
  assert.throws(() => fromHex("abc"));
  assert.equal(colonHex(Uint8Array.from([0xab, 0x01])), "AB:01");
});

test("certificate hashes agree with the Python notary's (SHA-256, SHA-1, SPKI SHA-256)", async () => {
  const der = fromBase64(fixtures.site.der_b64);
  const hashes = await certificateHashes(der);
  assert.deepEqual(hashes, {
    sha256: fixtures.site.sha256, sha1: fixtures.site.sha1, spkiSha256: fixtures.site.spki_sha256,
  });
  // Firefox hands rawDER over as an array of numbers.
  assert.deepEqual(await certificateHashes(Array.from(der)), hashes);
});

test("the DER walk refuses what is not a certificate", () => {
  const der = fromBase64(fixtures.site.der_b64);
  assert.ok(subjectPublicKeyInfo(der).length > 50);
  assert.throws(() => subjectPublicKeyInfo(der.subarray(0, 40)), /overruns|truncated/);
  assert.throws(() => subjectPublicKeyInfo(Uint8Array.of(0x31, 0)), /not a certificate/);
  assert.throws(() => subjectPublicKeyInfo(Uint8Array.of()), /truncated/);
  assert.throws(() => derElement(Uint8Array.of(0x30, 0x85, 1, 1, 1, 1, 1), 0, 7), /bad DER length/);
  assert.throws(() => derElement(Uint8Array.of(0x1f, 0), 0, 2), /multi-byte/);
  const bundle = JSON.parse(fixtures.bundle);
  assert.ok(pemCertificateToDer(bundle.hosts[0].certificate).length > 300);
  assert.throws(() => pemCertificateToDer("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----"));
  assert.throws(() => pemCertificateToDer(bundle.hosts[0].certificate + bundle.hosts[0].certificate));
});
