import "./webcrypto.mjs";
import { test } from "node:test";
import assert from "node:assert/strict";
import { BundleError, describePins, parseBundle, protocolOf } from "../src/lib/bundle.js";
import { fixtures } from "./fixtures.mjs";

test("a bundle with v2 keys and a pinned log: pins, key ids, protocol", async () => {
  const bundle = await parseBundle(fixtures.bundle);
  assert.equal(bundle.name, "Fixture notary");
  assert.equal(bundle.hosts.length, 1);
  const [host] = bundle.hosts;
  assert.equal(host.host, "127.0.0.1");
  assert.equal(host.sslPort, 4243);
  assert.equal(host.httpPort, 8280);
  assert.equal(host.sha1Pin.replaceAll(":", "").toLowerCase(), fixtures.notary_certificate_sha1);
  assert.equal(host.v2KeyId, fixtures.v2_key_id);
  assert.equal(bundle.log.origin, fixtures.log_origin);
  assert.equal(protocolOf(bundle), "v2");
  const pins = describePins(bundle);
  assert.match(pins[0], /certificate SHA-1 [0-9A-F:]{59}, v2 key [0-9a-f]{16}/);
  assert.match(pins[1], /^log notary\.test\/v2\/log: /);
});

test("a bundle without v2 keys is asked with the Convergence API", async () => {
  const bundle = await parseBundle(fixtures.legacy_bundle);
  assert.equal(protocolOf(bundle), "convergence");
  assert.match(describePins(bundle)[0], /no v2 key/);
});

test("a log key whose base64 holds '+' parses (name+id+base64 is split at the first two)", async () => {
  const { parseVerifierKey, noteKeyId } = await import("../src/lib/tlog.js");
  for (let seed = 0; seed < 64; seed += 1) {
    const raw = Uint8Array.from({ length: 32 }, (_, i) => (i * 31 + seed * 7) & 255);
    const material = Buffer.concat([Buffer.of(1), raw]).toString("base64");
    const id = Buffer.from(await noteKeyId("log.test/x", raw)).toString("hex");
    assert.deepEqual((await parseVerifierKey(`log.test/x+${id}+${material}`)).publicRaw, raw);
  }
});

test("invalid bundles are refused with the reason", async () => {
  const good = JSON.parse(fixtures.bundle);
  const bad = async (change, pattern) => {
    const document = structuredClone(good);
    change(document);
    await assert.rejects(parseBundle(JSON.stringify(document)), (error) => error instanceof BundleError && pattern.test(error.message));
  };
  await assert.rejects(parseBundle("{"), /not JSON/);
  await assert.rejects(parseBundle("[]"), /JSON object/);
  await bad((d) => { d.version = 2; }, /version/);
  await bad((d) => { d.version = true; }, /version/);
  await bad((d) => { delete d.name; }, /missing 'name'/);
  await bad((d) => { d.name = " "; }, /name/);
  await bad((d) => { d.bundle_location = "http://x/y.notary"; }, /https/);
  await bad((d) => { d.bundle_location = "https://x/y.json"; }, /\.notary/);
  await bad((d) => { d.region = "de"; }, /region/);
  await bad((d) => { d.hosts = []; }, /at least one host/);
  await bad((d) => { d.hosts[0].ssl_port = 0; }, /ssl_port/);
  await bad((d) => { d.hosts[0].http_port = "80"; }, /http_port/);
  await bad((d) => { delete d.hosts[0].certificate; }, /missing 'certificate'/);
  await bad((d) => { d.hosts[0].certificate = "junk"; }, /PEM/);
  await bad((d) => { d.hosts[0].v2_key = "AAAA"; }, /v2_key/);
  await bad((d) => { d.log.key = d.log.key.replace(/\+[0-9a-f]{8}\+/, "+00000000+"); }, /key id/);
  await bad((d) => { d.log.origin = "another/log"; }, /origin/);
  await bad((d) => { d.hosts[0].v2_key = Buffer.alloc(32, 1).toString("base64"); }, /v2_key/);
});
