// Asking notaries and voting, with no browser API: the transport (a
// fetch with a deadline, through a relay or not) is injected, so the same
// code runs in Node's tests and in the add-on.
//
// 1. Up to `quorum` notaries with distinct names are asked, in parallel,
//    each under its own deadline. With a relay ("bounce"), one spare notary
//    carries the others' questions and is not asked itself.
// 2. v2 notaries are asked in batches: the certificates of one page (30
//    resources from 5 hosts) become one POST /v2/query per notary, with a
//    nonce, verified with Ed25519 against the bundle's keys. A page's own
//    document is asked at once (`now`): nothing of its page can join its
//    batch, since its sub-resources wait for it.
// 3. Notaries with only the Convergence API are asked one target at a time
//    and their RSA signature checked against the bundle's certificate.
// 4. Whatever one notary sends (or fails to) is that notary's answer, never
//    an exception that ends the check; then the vote (voting.js).

import { protocolOf } from "./bundle.js";
import * as convergence from "./convergence.js";
import * as v2 from "./v2.js";
import { classify, Outcome, tally, Threshold, V2_VOTES, Verdict } from "./voting.js";

export const DEFAULTS = Object.freeze({
  quorum: 3,
  threshold: Threshold.MAJORITY,
  strictVote: false, // notaries that do not answer count against
  timeoutMs: 10_000,
  batchWindowMs: 15,
  relay: "off", // "off", "auto" or a notary's name
  maxVerdictAgeS: 3600,
  rejectedForS: 60,
  inconclusiveForS: 30,
});
/** The port a relayed client always asks a notary on (PROTOCOLS.md 1.1). */
export const RELAY_NOTARY_PORT = 4242;
const MAX_DETAIL_CHARS = 160;

export class TransportError extends Error {}

function oneLine(text) {
  const clean = String(text).replace(/[\x00-\x1f\x7f]/g, "?");
  return clean.length > MAX_DETAIL_CHARS ? clean.slice(0, MAX_DETAIL_CHARS - 3) + "..." : clean;
}

function urlOf(host, port, path) {
  return `https://${host.includes(":") ? `[${host}]` : host}:${port}${path}`;
}

/** The hosts of a notary to try, in order, and the port of each (4242
 * through a relay, whose CONNECT the relay only accepts to that port). */
function endpoints(notary, relay) {
  return notary.bundle.hosts.map((h) => ({ host: h, port: relay ? RELAY_NOTARY_PORT : h.sslPort }));
}

function relayProxy(relay) {
  if (!relay) return null;
  const host = relay.bundle.hosts[0];
  return { name: relay.name, host: host.host, port: host.httpPort };
}

/** One exchange with one of the notary's hosts, trying them in turn until
 * one answers, all under deadlineMs. Returns {status, text, host}. */
async function exchange(transport, notary, relay, path, body, contentType, deadlineAt, clock) {
  let lastError = "no host";
  for (const { host, port } of endpoints(notary, relay)) {
    const left = deadlineAt - clock();
    if (left <= 0) throw new TransportError("timed out");
    try {
      const answer = await transport({
        url: urlOf(host.host, port, path), method: "POST", body, contentType,
        timeoutMs: left, relay: relayProxy(relay), pins: notary.bundle.hosts.map((h) => h.sha1Pin),
      });
      return { ...answer, host: host.host };
    } catch (error) {
      lastError = error?.message || String(error);
    }
  }
  throw new TransportError(lastError);
}

function answer(notary, verdict, fields = {}) {
  return {
    notary: notary.name, verdict, host: null, status: null, detail: "", via: null,
    newestSeen: null, seenSince: null, validUntil: null, backend: null, consistency: null,
    observations: [], ...fields, detail: oneLine(fields.detail ?? ""),
  };
}

/** A notary asked through the add-on: batches v2 entries, asks Convergence
 * ones one by one. */
export class NotaryClient {
  constructor(notary, { transport, clock = () => Date.now(), random, settings = DEFAULTS }) {
    this.notary = notary;
    this.name = notary.name;
    this.protocol = protocolOf(notary.bundle);
    this.transport = transport;
    this.clock = clock;
    this.random = random;
    this.settings = { ...DEFAULTS, ...settings };
    this.queues = new Map(); // relay name or "" -> pending entries
    this.keys = null;
  }

  /** The answer of this notary about entry {host, port, sha256, sha1};
   * now: send the batch (with whatever waits in it) without waiting for
   * the batch window. */
  ask(entry, { relay = null, now = false } = {}) {
    if (this.protocol === "convergence") return this.askConvergence(entry, relay);
    return new Promise((resolve) => {
      const key = relay ? relay.name : "";
      let queue = this.queues.get(key);
      if (!queue) {
        queue = [];
        queue.timer = setTimeout(() => this.flush(key, relay), this.settings.batchWindowMs);
        this.queues.set(key, queue);
      }
      queue.push({ entry, resolve });
      if (now || queue.length >= v2.MAX_BATCH) this.flush(key, relay);
    });
  }

  flush(key, relay) {
    const queue = this.queues.get(key);
    if (!queue || !queue.length) return;
    clearTimeout(queue.timer);
    this.queues.delete(key);
    this.askV2(queue, relay).catch((error) => {
      for (const item of queue) {
        item.resolve(answer(this.notary, Verdict.CONNECTIVITY_FAILURE, { detail: `unexpected error (${error})` }));
      }
    });
  }

  async askV2(batch, relay) {
    const via = relay ? relay.name : null;
    const deadlineAt = this.clock() + this.settings.timeoutMs;
    const queries = batch.map((b) => b.entry);
    const nonce = v2.makeNonce(this.random);
    let exchanged;
    try {
      this.keys ??= await v2.trustedKeys(this.notary.bundle.hosts);
      exchanged = await exchange(this.transport, this.notary, relay, "/v2/query",
        v2.queryBody(queries, nonce), "application/json", deadlineAt, this.clock);
    } catch (error) {
      for (const item of batch) {
        item.resolve(answer(this.notary, Verdict.CONNECTIVITY_FAILURE, { detail: error.message, via }));
      }
      return;
    }
    const { status, text, host } = exchanged;
    if (status !== 200) {
      const verdict = status === 303 ? Verdict.INCONCLUSIVE : Verdict.CONNECTIVITY_FAILURE;
      for (const item of batch) item.resolve(answer(this.notary, verdict, { host, status, detail: `HTTP ${status}`, via }));
      return;
    }
    let results;
    try {
      const parsed = v2.parseAnswer(text);
      results = await v2.verifyAnswer(parsed, this.keys, {
        nonce, now: Math.floor(this.clock() / 1000), queries, logOrigin: this.notary.bundle.log?.origin ?? null,
      });
    } catch (error) {
      for (const item of batch) {
        item.resolve(answer(this.notary, Verdict.FAILURE, {
          host, status, detail: `bad signed answer: ${error.message}`, via,
        }));
      }
      return;
    }
    for (const [index, item] of batch.entries()) {
      const result = results[index];
      const matching = result.observations.filter((o) => o.sha256 === item.entry.sha256);
      const words = result.verdict === "match" ? [] : [result.verdict === "mismatch" ? "sees another certificate" : result.verdict];
      const backend = result.validUntil === null ? null : (result.verification?.backend ?? "perspective");
      if (result.consistency && result.consistency.kind !== "stable") {
        words.push(`site serves ${result.consistency.current.length} certificates (${result.consistency.kind})`);
      }
      if (result.logged === "promised") words.push("log: promised");
      else if (result.logged) words.push(`logged at ${result.logged.index}`);
      item.resolve(answer(this.notary, V2_VOTES[result.verdict], {
        host, status, via, backend, detail: words.join("; "),
        validUntil: result.validUntil,
        consistency: result.consistency,
        observations: result.observations.map((o) => ({
          sha256: o.sha256, sha1: o.sha1, firstSeen: o.firstSeen, lastSeen: o.lastSeen, addresses: o.addresses,
        })),
        newestSeen: result.observations.length ? Math.max(...result.observations.map((o) => o.lastSeen)) : null,
        seenSince: matching.length ? Math.min(...matching.map((o) => o.firstSeen)) : null,
      }));
    }
  }

  async askConvergence(entry, relay) {
    const via = relay ? relay.name : null;
    const deadlineAt = this.clock() + this.settings.timeoutMs;
    let exchanged;
    try {
      exchanged = await exchange(this.transport, this.notary, relay,
        convergence.targetPath(entry.host, entry.port), convergence.formBody(entry.sha1),
        "application/x-www-form-urlencoded", deadlineAt, this.clock);
    } catch (error) {
      return answer(this.notary, Verdict.CONNECTIVITY_FAILURE, { detail: error.message, via });
    }
    const { status, text, host } = exchanged;
    let listed = false;
    let signatureOk = false;
    let detail = `HTTP ${status}`;
    let observations = [];
    if (status === 200 || status === 409) {
      try {
        const parsed = convergence.parseAnswer(text);
        const pinned = this.notary.bundle.hosts.find((h) => h.host === host);
        signatureOk = await convergence.verifySignature(pinned.spkiDer, parsed.payload, parsed.signature);
        detail = signatureOk ? "" : "bad signature";
        listed = parsed.entries.some((e) => e.sha1 === entry.sha1);
        observations = parsed.entries.map((e) => ({ sha1: e.sha1, sha256: null, firstSeen: e.start, lastSeen: e.finish, addresses: [] }));
      } catch (error) {
        detail = `malformed answer: ${error.message}`;
      }
    }
    const verdict = classify(status, { listed, signatureOk });
    if (verdict === Verdict.FAILURE && !detail) detail = "sees another certificate";
    if (verdict === Verdict.INCONCLUSIVE) detail = `inconclusive (HTTP ${status})`;
    const matching = observations.filter((o) => o.sha1 === entry.sha1);
    return answer(this.notary, verdict, {
      host, status, detail, via, observations: signatureOk ? observations : [],
      newestSeen: signatureOk && observations.length ? Math.max(...observations.map((o) => o.lastSeen)) : null,
      seenSince: signatureOk && matching.length ? Math.min(...matching.map((o) => o.firstSeen)) : null,
    });
  }
}

function shuffle(items, random) {
  const out = [...items];
  for (let i = out.length - 1; i > 0; i -= 1) {
    const j = Math.floor(random() * (i + 1));
    [out[i], out[j]] = [out[j], out[i]];
  }
  return out;
}

/** [asked, relay]: up to quorum notaries, and the relay carrying their
 * questions (null: none). relay setting: "off", "auto" (a random spare
 * notary, when there is one) or a notary's name (not asked itself). */
export function pickNotaries(notaries, { quorum, relay }, random = Math.random) {
  let pool = shuffle(notaries, random);
  if (relay && relay !== "off" && relay !== "auto") {
    const chosen = notaries.find((n) => n.name === relay) ?? null;
    if (chosen) pool = pool.filter((n) => n.name !== relay);
    return [pool.slice(0, quorum), chosen];
  }
  if (relay !== "auto" || pool.length < 2) return [pool.slice(0, quorum), null];
  const chosen = pool.pop();
  return [pool.slice(0, quorum), chosen];
}

/** How long a verdict holds: a verified one until the first statement it
 * rests on expires, at most maxVerdictAgeS; a rejection and an
 * inconclusive vote briefly (so that trying again asks again). */
export function verdictExpiry(outcome, answers, nowMs, settings) {
  const now = Math.floor(nowMs / 1000);
  if (outcome === Outcome.VERIFIED) {
    const limits = answers.filter((a) => a.verdict === Verdict.SUCCESS && a.validUntil !== null).map((a) => a.validUntil);
    return Math.min(now + settings.maxVerdictAgeS, ...limits);
  }
  return now + (outcome === Outcome.REJECTED ? settings.rejectedForS : settings.inconclusiveForS);
}

/** Ask clients (NotaryClient by name) about a certificate and vote.
 * entry: {host, port, sha256, sha1}; now: ask without the batch window (a
 * page's own document). Never throws for a notary's fault. */
export async function checkCertificate(entry, notaries, clients, settings, { clock = () => Date.now(), random = Math.random, now = false } = {}) {
  const s = { ...DEFAULTS, ...settings };
  const [asked, relay] = pickNotaries(notaries, s, random);
  const answers = await Promise.all(asked.map(async (notary) => {
    try {
      return await clients.get(notary.name).ask(entry, { relay, now });
    } catch (error) {
      return answer(notary, Verdict.CONNECTIVITY_FAILURE, { detail: `unexpected error (${error})` });
    }
  }));
  const vote = tally(answers.map((a) => a.verdict), s.threshold, { strict: s.strictVote });
  return {
    host: entry.host, port: entry.port, sha256: entry.sha256, sha1: entry.sha1,
    threshold: s.threshold, strictVote: s.strictVote, relay: relay ? relay.name : null,
    answers, tally: vote, checkedAt: Math.floor(clock() / 1000),
    expiresAt: verdictExpiry(vote.outcome, answers, clock(), s),
  };
}
