import "./webcrypto.mjs";
// The check's orchestration with a fake transport: a notary written here in
// JavaScript signs with its own Ed25519 key (the Python notary's answers are
// tested in v2.test.mjs; this is about batching, deadlines, failures and
// the vote).
import { test } from "node:test";
import assert from "node:assert/strict";
import { toBase64 } from "../src/lib/bytes.js";
import { canonicalBytes } from "../src/lib/canonical.js";
import { parseBundle } from "../src/lib/bundle.js";
import { checkCertificate, NotaryClient, pickNotaries, TransportError, verdictExpiry } from "../src/lib/check.js";
import { keyIdOf } from "../src/lib/ed25519.js";
import { fixtures } from "./fixtures.mjs";

const NOW_S = 1_800_000_000;
const clock = () => NOW_S * 1000;

/** A notary: its bundle (v2 key pinned) and what it has seen per target. */
async function fakeNotary(name, seen, { port = 4243 } = {}) {
  const pair = await crypto.subtle.generateKey({ name: "Ed25519" }, true, ["sign", "verify"]);
  const raw = new Uint8Array(await crypto.subtle.exportKey("raw", pair.publicKey));
  const keyId = await keyIdOf(raw);
  const document = JSON.parse(fixtures.bundle);
  document.name = name;
  delete document.log;
  document.hosts[0].ssl_port = port;
  document.hosts[0].v2_key = toBase64(raw);
  const sign = async (value) => toBase64(new Uint8Array(await crypto.subtle.sign({ name: "Ed25519" }, pair.privateKey, canonicalBytes(value))));
  const notary = { name, bundle: await parseBundle(JSON.stringify(document)), requests: [] };
  notary.answer = async (body, tamper = false) => {
    const request = JSON.parse(body);
    notary.requests.push(request);
    const statements = [];
    const results = [];
    for (const t of request.targets) {
      const key = `${t.host}:${t.port}`;
      const sha256 = seen[key];
      if (!sha256) {
        results.push({ target: key, verdict: "unknown", statement_signature: null });
        continue;
      }
      const statement = {
        type: "notary.v2.statement", target: key, key_id: keyId, signed_at: NOW_S - 5, valid_until: NOW_S + 600,
        observations: [{ sha256, spki_sha256: "0".repeat(64), sha1: "1".repeat(40), first_seen: NOW_S - 9000, last_seen: NOW_S - 5, addresses: [] }],
      };
      const signature = await sign(statement);
      statements.push({ signature, statement });
      results.push({ target: key, verdict: sha256 === t.sha256 ? "match" : "mismatch", statement_signature: signature });
    }
    const envelope = { type: "notary.v2.answer", nonce: request.nonce, signed_at: NOW_S, key_id: keyId, results };
    if (tamper) statements.forEach((s) => { s.statement.observations[0].first_seen -= 1; });
    return JSON.stringify({ answer: envelope, signature: await sign(envelope), statements });
  };
  return notary;
}

function transportFor(notaries, { down = [], tampered = [], calls = [] } = {}) {
  return async (request) => {
    calls.push(request);
    const port = Number(new URL(request.url).port);
    const notary = notaries.find((n) => n.bundle.hosts[0].sslPort === port || (request.relay && port === 4242));
    if (!notary || down.includes(notary.name)) throw new TransportError("connection refused");
    return { status: 200, text: await notary.answer(request.body, tampered.includes(notary.name)) };
  };
}

const entry = (host, sha256) => ({ host, port: 443, sha256, sha1: "ab".repeat(20) });

test("one page's certificates become one batched query per notary", async () => {
  const a = await fakeNotary("A", { "a.test:443": "aa".repeat(32), "b.test:443": "bb".repeat(32) }, { port: 1001 });
  const calls = [];
  const client = new NotaryClient(a, { transport: transportFor([a], { calls }), clock });
  const answers = await Promise.all([
    client.ask(entry("a.test", "aa".repeat(32))),
    client.ask(entry("b.test", "cc".repeat(32))),
    client.ask(entry("c.test", "dd".repeat(32))),
  ]);
  assert.equal(calls.length, 1);
  assert.equal(a.requests[0].targets.length, 3);
  assert.match(a.requests[0].nonce, /^[0-9a-f]{32}$/);
  assert.deepEqual(answers.map((x) => x.verdict), ["success", "failure", "inconclusive"]);
  assert.equal(answers[0].seenSince, NOW_S - 9000);
  assert.equal(answers[0].validUntil, NOW_S + 600);
  assert.equal(answers[1].detail, "sees another certificate");
});

test("a page's own document is asked at once, with what waits in the batch", async () => {
  const a = await fakeNotary("A", { "a.test:443": "aa".repeat(32), "b.test:443": "bb".repeat(32) }, { port: 1001 });
  const calls = [];
  const client = new NotaryClient(a, { transport: transportFor([a], { calls }), clock, settings: { batchWindowMs: 60_000 } });
  const waiting = client.ask(entry("b.test", "bb".repeat(32)));
  const asked = Promise.all([client.ask(entry("a.test", "aa".repeat(32)), { now: true }), waiting]);
  let timer;
  const late = new Promise((resolve) => { timer = setTimeout(resolve, 5000, "waited for the window"); });
  const answers = await Promise.race([asked, late]);
  clearTimeout(timer);
  assert.notEqual(answers, "waited for the window");
  assert.equal(calls.length, 1);
  assert.deepEqual(a.requests[0].targets.map((t) => t.host), ["b.test", "a.test"]);
  assert.deepEqual(answers.map((x) => x.verdict), ["success", "success"]);
});

test("agreement, a notary down, a tampered answer: the vote as the threshold says", async () => {
  const seen = { "site.test:443": "aa".repeat(32) };
  const notaries = [await fakeNotary("A", seen, { port: 1001 }), await fakeNotary("B", seen, { port: 1002 })];
  const run = async (settings, options) => {
    const transport = transportFor(notaries, options);
    const clients = new Map(notaries.map((n) => [n.name, new NotaryClient(n, { transport, clock })]));
    return checkCertificate(entry("site.test", "aa".repeat(32)), notaries, clients, settings, { clock });
  };
  let report = await run({ threshold: "consensus" });
  assert.deepEqual(report.tally, { outcome: "verified", successes: 2, counted: 2, stoodAside: 0 });
  assert.equal(report.expiresAt, NOW_S + 600);
  report = await run({ threshold: "consensus" }, { down: ["B"] });
  assert.deepEqual(report.tally, { outcome: "verified", successes: 1, counted: 1, stoodAside: 1 });
  assert.equal(report.answers.find((x) => x.notary === "B").verdict, "connectivity-failure");
  report = await run({ threshold: "majority", strictVote: true }, { down: ["B"] });
  assert.equal(report.tally.outcome, "rejected");
  report = await run({ threshold: "majority" }, { tampered: ["B"] });
  const b = report.answers.find((x) => x.notary === "B");
  assert.equal(b.verdict, "failure");
  assert.match(b.detail, /bad signed answer: bad statement signature/);
  assert.equal(report.tally.outcome, "rejected"); // 1 of 2 is not a majority
  report = await run({ threshold: "minority" }, { tampered: ["B"] });
  assert.equal(report.tally.outcome, "verified");
});

test("a notary that never answers is that notary's failure, within its deadline", async () => {
  const a = await fakeNotary("A", {}, { port: 1001 });
  const transport = ({ timeoutMs }) => new Promise((_, reject) => setTimeout(() => reject(new TransportError(`timed out after ${timeoutMs} ms`)), 20));
  const client = new NotaryClient(a, { transport, settings: { timeoutMs: 20 } });
  const result = await client.ask(entry("x.test", "aa".repeat(32)));
  assert.equal(result.verdict, "connectivity-failure");
  assert.match(result.detail, /timed out/);
});

test("answers that are not HTTP 200 or not JSON are counted as such", async () => {
  const a = await fakeNotary("A", {}, { port: 1001 });
  for (const [answer, verdict] of [
    [{ status: 503, text: "" }, "connectivity-failure"],
    [{ status: 303, text: "" }, "inconclusive"],
    [{ status: 200, text: "<html>" }, "failure"],
  ]) {
    const client = new NotaryClient(a, { transport: async () => answer });
    assert.equal((await client.ask(entry("x.test", "aa".repeat(32)))).verdict, verdict);
  }
});

test("through a relay: questions go to port 4242 via the relay's port, the relay is not asked", async () => {
  const seen = { "site.test:443": "aa".repeat(32) };
  const notaries = [await fakeNotary("A", seen, { port: 1001 }), await fakeNotary("R", seen, { port: 1002 })];
  const calls = [];
  const transport = transportFor(notaries.slice(0, 1), { calls });
  const clients = new Map(notaries.map((n) => [n.name, new NotaryClient(n, { transport, clock })]));
  const report = await checkCertificate(entry("site.test", "aa".repeat(32)), notaries, clients, { relay: "R" }, { clock });
  assert.equal(report.relay, "R");
  assert.deepEqual(report.answers.map((x) => [x.notary, x.verdict, x.via]), [["A", "success", "R"]]);
  assert.equal(new URL(calls[0].url).port, "4242");
  assert.deepEqual(calls[0].relay, { name: "R", host: "127.0.0.1", port: 8280 });
});

test("picking notaries: quorum, auto relay, named relay", () => {
  const notaries = ["A", "B", "C", "D"].map((name) => ({ name }));
  let [asked, relay] = pickNotaries(notaries, { quorum: 2, relay: "off" }, () => 0.5);
  assert.equal(asked.length, 2);
  assert.equal(relay, null);
  [asked, relay] = pickNotaries(notaries, { quorum: 3, relay: "auto" }, () => 0.5);
  assert.equal(asked.length, 3);
  assert.ok(relay && !asked.includes(relay));
  [asked, relay] = pickNotaries(notaries, { quorum: 5, relay: "C" });
  assert.equal(relay.name, "C");
  assert.deepEqual(asked.map((n) => n.name).sort(), ["A", "B", "D"]);
  [asked, relay] = pickNotaries(notaries.slice(0, 1), { quorum: 3, relay: "auto" });
  assert.equal(relay, null); // the only notary is asked, not used as a relay
});

test("a verdict holds until its first statement expires, at most the maximum age", () => {
  const settings = { maxVerdictAgeS: 3600, rejectedForS: 60, inconclusiveForS: 30 };
  const answers = [{ verdict: "success", validUntil: NOW_S + 100 }, { verdict: "success", validUntil: null }];
  assert.equal(verdictExpiry("verified", answers, NOW_S * 1000, settings), NOW_S + 100);
  assert.equal(verdictExpiry("verified", [], NOW_S * 1000, settings), NOW_S + 3600);
  assert.equal(verdictExpiry("rejected", answers, NOW_S * 1000, settings), NOW_S + 60);
  assert.equal(verdictExpiry("inconclusive", answers, NOW_S * 1000, settings), NOW_S + 30);
});
