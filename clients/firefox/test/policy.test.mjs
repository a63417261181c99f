import "./webcrypto.mjs";
import { test } from "node:test";
import assert from "node:assert/strict";
import { addressInCidr, hostInDomain, internalKind, normaliseHost, targetKey } from "../src/lib/addresses.js";
import { BoundedCache, Reliability, VerdictCache } from "../src/lib/cache.js";
import { actionFor, decide, summary } from "../src/lib/policy.js";
import { normaliseSettings } from "../src/lib/settings.js";

test("targets are written as the notary writes them", () => {
  assert.equal(targetKey("Example.COM.", 443), "example.com:443");
  assert.equal(targetKey("[::1]", 8443), "[::1]:8443");
  assert.equal(targetKey("2001:DB8:0:0:0:0:0:1", 443), "[2001:db8::1]:443");
  assert.equal(normaliseHost("::ffff:192.0.2.1"), "::ffff:c000:201");
});

test("internal addresses: loopback, private, link-local, unique local", () => {
  for (const [address, kind] of [
    ["127.0.0.1", "loopback"], ["127.9.9.9", "loopback"], ["::1", "loopback"],
    ["10.1.2.3", "private"], ["172.20.0.1", "private"], ["192.168.1.1", "private"],
    ["169.254.1.1", "private"], ["fd00::1", "private"], ["fe80::1", "private"], ["::ffff:10.0.0.1", "private"],
    ["192.0.2.1", null], ["8.8.8.8", null], ["2001:db8::1", null], ["172.32.0.1", null], ["example.com", null], [null, null],
  ]) assert.equal(internalKind(address), kind, address);
  assert.ok(addressInCidr("10.0.0.5", "10.0.0.0/29"));
  assert.ok(!addressInCidr("10.0.0.9", "10.0.0.0/29"));
  assert.ok(hostInDomain("intranet.corp.example", "corp.example"));
  assert.ok(hostInDomain("corp.example", ".corp.example"));
  assert.ok(!hostInDomain("evilcorp.example", "corp.example"));
});

const notaries = [{ name: "Public" }, { name: "Corp" }];
const base = normaliseSettings({ internalDomains: [{ domain: "corp.example", notaries: ["Corp"] }, "lab.example", { domain: "10.9.0.0/16" }] });

test("what is checked, and by whom", () => {
  const d = (fields, settings = base) => decide({ host: "site.example", ip: "192.0.2.1", captive: false, settings, notaries, ...fields });
  assert.deepEqual(d({}).notaries, notaries);
  assert.deepEqual(d({ host: "www.corp.example" }).notaries, [{ name: "Corp" }]);
  assert.equal(d({ host: "www.lab.example" }).mark, "internal");
  assert.equal(d({ ip: "10.9.1.1" }).mark, "internal");
  assert.equal(d({ ip: "127.0.0.1" }).mark, "internal");
  assert.match(d({ host: "10.1.1.1", ip: null }).reason, /private address: not checkable by public notaries/);
  assert.equal(d({ ip: "127.0.0.1" }, { ...base, checkInternalAddresses: true }).action, "check");
  assert.equal(d({ captive: true }).mark, "captive-portal");
  assert.equal(d({}, { ...base, enabled: false }).mark, "paused");
  assert.equal(d({ notaries: [] }).mark, "no-notaries");
  assert.equal(actionFor("verified", base), "allow");
  assert.equal(actionFor("rejected", base), "block");
  assert.equal(actionFor("inconclusive", base), "allow");
  assert.equal(actionFor("inconclusive", { ...base, onInconclusive: "block" }), "block");
});

test("settings: defaults, bounds, junk ignored", () => {
  const s = normaliseSettings({ quorum: 99, threshold: "all", timeoutMs: "5", relay: "", strictMode: true });
  assert.equal(s.quorum, 3);
  assert.equal(s.threshold, "majority");
  assert.equal(s.timeoutMs, 10000);
  assert.equal(s.relay, "off");
  assert.equal(s.strictMode, true);
  assert.deepEqual(normaliseSettings(null).internalDomains, []);
  assert.deepEqual(base.internalDomains.map((r) => r.domain), ["corp.example", "lab.example", "10.9.0.0/16"]);
});

test("summaries say N of M", () => {
  const report = (outcome, successes) => ({ threshold: "majority", answers: [{}, {}, {}], tally: { outcome, successes } });
  assert.equal(summary(report("verified", 2)), "verified by 2 of 3 notaries");
  assert.equal(summary(report("rejected", 1)), "rejected: 1 of 3 notaries vouch (majority)");
  assert.equal(summary(report("inconclusive", 0)), "unverified: no notary could vouch (3 asked)");
});

test("caches are bounded and expire", () => {
  let now = 100;
  const cache = new BoundedCache(2, () => now);
  cache.set("a", 1, 150);
  cache.set("b", 2);
  cache.get("a");
  cache.set("c", 3);
  assert.deepEqual([cache.get("a"), cache.get("b"), cache.get("c")], [1, undefined, 3]);
  now = 151;
  assert.equal(cache.get("a"), undefined);
  assert.throws(() => new BoundedCache(0));
  const verdicts = new VerdictCache(10, () => now);
  verdicts.remember({ host: "h", port: 443, sha256: "aa", expiresAt: 200 });
  assert.equal(verdicts.lookup("h", 443, "aa").host, "h");
  assert.equal(verdicts.lookup("h", 443, "bb"), undefined);
  const reliability = new Reliability({ perNotary: 3 });
  for (const v of ["success", "failure", "connectivity-failure", "success"]) reliability.record("A", v, 1);
  assert.deepEqual(reliability.summary("A"), { asked: 3, answered: 2, success: 1, failure: 1, inconclusive: 0, connectivityFailure: 1, last: { verdict: "success", at: 1 } });
});
