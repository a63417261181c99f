// The v2 signed API as the add-on asks it (docs/v2.md): a batched request
// with a nonce, and the answer verified with Ed25519 against the keys the
// notary's bundle pins, in the order of "Verifying an answer" (checks 1-6)
// plus the log's promise (rule S7) and a statement's consistency (S8).
//
// Parsing is strict about what the add-on reads and lenient about members
// it does not know: an unknown member of a signed object (a newer notary's
// "consistency", "matched_by", ...) is covered by that object's signature,
// which is checked over the canonical re-encoding of everything received
// (rule C7). Every defect is a V2Error: that notary's failure, never more.

import { fromBase64 } from "./bytes.js";
import { canonicalBytes, MAX_SAFE_INTEGER } from "./canonical.js";
import { importEd25519, verifyEd25519Base64 } from "./ed25519.js";
import { normaliseHost, targetKey } from "./addresses.js";
import { verifyLogged } from "./tlog.js";

export const ANSWER_TYPE = "notary.v2.answer";
export const STATEMENT_TYPE = "notary.v2.statement";
export const VERDICTS = new Set(["match", "mismatch", "unknown", "unreachable", "refused"]);
export const MAX_ANSWER_BYTES = 16 * 1024 * 1024;
export const MAX_ANSWER_RESULTS = 4096;
export const MAX_STATEMENT_OBSERVATIONS = 64;
export const MAX_ADDRESSES = 64;
export const MAX_BATCH = 100;
const CONSISTENCY_KINDS = new Set(["stable", "rotating", "split"]);

export class V2Error extends Error {}

const fail = (message) => new V2Error(message);

/** The request body for entries [{host, port, sha256}] and a nonce. Only
 * host, port and sha256 are sent: every notary since v2's first rules
 * accepts them (spki_sha256 and address, issue 31, are refused by older
 * ones as unknown keys, rule R4). */
export function queryBody(entries, nonce) {
  return JSON.stringify({
    nonce,
    targets: entries.map((e) => ({ host: normaliseHost(e.host), port: e.port, sha256: e.sha256 })),
  });
}

/** A random nonce of 32 hex digits (rule R5: printable ASCII). */
export function makeNonce(random = crypto.getRandomValues.bind(crypto)) {
  return Array.from(random(new Uint8Array(16)), (b) => b.toString(16).padStart(2, "0")).join("");
}

function object(value, where) {
  if (value === null || typeof value !== "object" || Array.isArray(value)) throw fail(`${where} must be an object`);
  return value;
}
function integer(obj, name, where) {
  const value = obj[name];
  if (!Number.isInteger(value) || value < 0 || value > MAX_SAFE_INTEGER) {
    throw fail(`${where}.${name} must be a non-negative integer`);
  }
  return value;
}
function string(obj, name, where) {
  if (typeof obj[name] !== "string") throw fail(`${where}.${name} must be a string`);
  return obj[name];
}
function hex(obj, name, size, where) {
  const value = string(obj, name, where);
  if (value.length !== 2 * size || !/^[0-9a-f]*$/.test(value)) {
    throw fail(`${where}.${name} must be ${2 * size} lower-case hex digits`);
  }
  return value;
}
function signature(obj, name, where) {
  const value = string(obj, name, where);
  if (value.length > 128 || !/^[A-Za-z0-9+/]+={0,2}$/.test(value)) throw fail(`${where}.${name} must be base64`);
  return value;
}
function array(obj, name, max, where) {
  const value = obj[name];
  if (!Array.isArray(value) || value.length > max) throw fail(`${where}.${name} must be an array of at most ${max}`);
  return value;
}
function target(obj, name, where) {
  const value = string(obj, name, where);
  const match = /^(\[[0-9a-f:.]+\]|[^:[\]]+):([1-9][0-9]{0,4})$/.exec(value);
  if (!match || Number(match[2]) > 65535) throw fail(`${where}.${name} is not a target`);
  const host = match[1].replace(/^\[|\]$/g, "");
  if (targetKey(host, Number(match[2])) !== value) throw fail(`${where}.${name} is not a normalised target`);
  return value;
}
function canonical(value, where) {
  try {
    return canonicalBytes(value);
  } catch {
    throw fail(`${where} has no canonical form`);
  }
}

function parseObservation(row, where) {
  object(row, where);
  const addresses = array(row, "addresses", MAX_ADDRESSES, where);
  if (!addresses.every((a) => typeof a === "string")) throw fail(`${where}.addresses must be strings`);
  const firstSeen = integer(row, "first_seen", where);
  const lastSeen = integer(row, "last_seen", where);
  if (lastSeen < firstSeen) throw fail(`${where}.last_seen is before first_seen`);
  return {
    sha256: hex(row, "sha256", 32, where),
    spkiSha256: hex(row, "spki_sha256", 32, where),
    sha1: hex(row, "sha1", 20, where),
    firstSeen, lastSeen, addresses,
  };
}

function parseVerification(value, where) {
  object(value, where);
  const backend = string(value, "backend", where);
  if (!["dane", "perspective"].includes(backend)) throw fail(`${where}.backend is unknown`);
  let dane = null;
  if (value.dane !== null && value.dane !== undefined) {
    const d = object(value.dane, `${where}.dane`);
    dane = {
      outcome: string(d, "outcome", `${where}.dane`),
      sha256: d.sha256 === null ? null : hex(d, "sha256", 32, `${where}.dane`),
      checkedAt: integer(d, "checked_at", `${where}.dane`),
      tlsa: array(d, "tlsa", 16, `${where}.dane`),
      matched: d.matched ?? null,
    };
  }
  return { backend, dane };
}

/** Rule S8, checked against the statement's own observations: current is
 * the SHA-256 of its first observations, addresses and kind what their
 * addresses make. */
function parseConsistency(value, observations, where) {
  object(value, where);
  const kind = string(value, "kind", where);
  if (!CONSISTENCY_KINDS.has(kind)) throw fail(`${where}.kind is unknown`);
  const current = array(value, "current", MAX_STATEMENT_OBSERVATIONS, where);
  const addresses = array(value, "addresses", 64, where);
  if (current.length === 0 || current.length > observations.length
      || current.some((sha, i) => sha !== observations[i].sha256)) {
    throw fail(`${where}.current is not the statement's first observations`);
  }
  const held = observations.slice(0, current.length);
  const all = [...new Set(held.flatMap((o) => o.addresses))].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
  if (JSON.stringify(all.slice(0, 64)) !== JSON.stringify(addresses)) {
    throw fail(`${where}.addresses are not those of the current set`);
  }
  let expected = "stable";
  if (held.length > 1) {
    const seen = new Map();
    expected = "split";
    for (const [index, o] of held.entries()) {
      for (const address of new Set(o.addresses)) {
        if (seen.has(address) && seen.get(address) !== index) expected = "rotating";
        seen.set(address, index);
      }
    }
  }
  if (kind !== expected) throw fail(`${where}.kind is not what its addresses make`);
  return { kind, addresses, current };
}

function parseLogPromise(value, where) {
  object(value, where);
  return { origin: string(value, "origin", where), merge_by: integer(value, "merge_by", where) };
}

function parseInclusion(value, where) {
  object(value, where);
  const checkpoint = string(value, "checkpoint", where);
  const index = integer(value, "index", where);
  const proof = array(value, "proof", 63, where).map((node) => {
    let bytes = null;
    try {
      bytes = fromBase64(node);
    } catch {
      bytes = null;
    }
    if (!bytes || bytes.length !== 32) throw fail(`${where}.proof holds something other than SHA-256 hashes`);
    return bytes;
  });
  return { checkpoint, index, proof };
}

function parseStatementEntry(entry, index) {
  const where = `statements[${index}]`;
  object(entry, where);
  const sig = signature(entry, "signature", where);
  const body = object(entry.statement, `${where}.statement`);
  const at = `${where}.statement`;
  if (body.type !== STATEMENT_TYPE) throw fail(`${at}.type must be ${STATEMENT_TYPE}`);
  const observations = array(body, "observations", MAX_STATEMENT_OBSERVATIONS, at)
    .map((row, i) => parseObservation(row, `${at}.observations[${i}]`));
  const signedAt = integer(body, "signed_at", at);
  const validUntil = integer(body, "valid_until", at);
  if (validUntil < signedAt) throw fail(`${at}.valid_until is before signed_at`);
  const signedBytes = canonical(body, at);
  return {
    target: target(body, "target", at),
    observations,
    signedAt,
    validUntil,
    keyId: string(body, "key_id", at),
    signature: sig,
    signedBytes,
    verification: "verification" in body ? parseVerification(body.verification, `${at}.verification`) : null,
    consistency: "consistency" in body && body.consistency !== null
      ? parseConsistency(body.consistency, observations, `${at}.consistency`) : null,
    log: "log" in body && body.log !== null ? parseLogPromise(body.log, `${at}.log`) : null,
    inclusion: "inclusion" in entry ? parseInclusion(entry.inclusion, `${where}.inclusion`) : null,
    entryBytes: canonical({ signature: sig, statement: body }, where),
  };
}

/** An answer document (rule S5) taken apart, not yet verified. */
export function parseAnswer(text) {
  if (typeof text !== "string" || text.length > MAX_ANSWER_BYTES) throw fail("answer too large");
  let document;
  try {
    document = JSON.parse(text);
  } catch {
    throw fail("answer is not JSON");
  }
  object(document, "document");
  const body = object(document.answer, "answer");
  if (body.type !== ANSWER_TYPE) throw fail(`answer.type must be ${ANSWER_TYPE}`);
  if (body.nonce !== null && typeof body.nonce !== "string") throw fail("answer.nonce must be a string or null");
  const results = array(body, "results", MAX_ANSWER_RESULTS, "answer").map((row, i) => {
    const where = `answer.results[${i}]`;
    object(row, where);
    const verdict = string(row, "verdict", where);
    if (!VERDICTS.has(verdict)) throw fail(`${where}.verdict is not a known verdict`);
    return {
      target: target(row, "target", where),
      verdict,
      statementSignature: row.statement_signature === null ? null : signature(row, "statement_signature", where),
      matchedBy: row.matched_by ?? null,
    };
  });
  const statements = array(document, "statements", MAX_ANSWER_RESULTS, "document").map(parseStatementEntry);
  return {
    nonce: body.nonce,
    signedAt: integer(body, "signed_at", "answer"),
    keyId: string(body, "key_id", "answer"),
    results,
    signature: signature(document, "signature", "document"),
    signedBytes: canonical(body, "answer"),
    statements,
  };
}

/** The trusted keys of a bundle host: {keyId: {key: CryptoKey, raw}}. */
export async function trustedKeys(hosts) {
  const keys = {};
  for (const host of hosts) {
    if (host.v2Key && host.v2KeyId) {
      const raw = fromBase64(host.v2Key);
      keys[host.v2KeyId] = { key: await importEd25519(raw), raw };
    }
  }
  return keys;
}

/** The verified results of parsed, in request order: checks 1-6 of "Verifying
 * an answer" (docs/v2.md), each result's log promise or inclusion (S7) when
 * its statement carries one. queries: [{host, port, sha256}] as sent.
 * Throws V2Error naming the first check that fails. */
export async function verifyAnswer(parsed, keys, { nonce, now, queries, logOrigin = null }) {
  const envelopeKey = keys[parsed.keyId];
  if (!envelopeKey) throw fail("answer signed with an unknown key id");
  if (!(await verifyEd25519Base64(envelopeKey.key, parsed.signature, parsed.signedBytes))) {
    throw fail("bad answer signature");
  }
  if (parsed.nonce !== nonce) throw fail("wrong nonce");
  const bySignature = new Map();
  for (const stated of parsed.statements) {
    const key = keys[stated.keyId];
    if (!key) throw fail(`statement for ${stated.target} has an unknown key id`);
    if (!(await verifyEd25519Base64(key.key, stated.signature, stated.signedBytes))) {
      throw fail(`bad statement signature for ${stated.target}`);
    }
    bySignature.set(stated.signature, stated);
  }
  const asked = queries.map((q) => targetKey(q.host, q.port));
  if (asked.length !== parsed.results.length || asked.some((t, i) => t !== parsed.results[i].target)) {
    throw fail("results do not answer the targets asked, in order");
  }
  const verified = [];
  for (const [index, result] of parsed.results.entries()) {
    const query = queries[index];
    let stated = null;
    if (result.statementSignature !== null) {
      stated = bySignature.get(result.statementSignature);
      if (!stated || stated.target !== result.target) {
        throw fail(`result for ${result.target} is not bound to a statement of its target`);
      }
      if (stated.validUntil < now) throw fail(`statement for ${result.target} expired`);
    } else if (result.verdict === "match" || result.verdict === "mismatch") {
      throw fail(`${result.verdict} for ${result.target} without a statement`);
    }
    let backing = [];
    if (result.verdict === "match") {
      backing = stated.observations.filter((o) => !query.sha256 || o.sha256 === query.sha256);
      if (!backing.length) throw fail(`match for ${result.target} not backed by its statement`);
      const v = stated.verification;
      if (v && v.backend === "dane"
          && (!v.dane || v.dane.outcome !== "match" || !backing.some((o) => o.sha256 === v.dane.sha256))) {
        throw fail(`match for ${result.target} not backed by its DANE evidence`);
      }
    }
    let logged = null;
    if (stated) {
      try {
        logged = await verifyLogged(stated, keys[stated.keyId].raw, { now, pinnedOrigin: logOrigin });
      } catch (error) {
        throw fail(`log: ${error.message}`);
      }
    }
    verified.push({
      target: result.target,
      verdict: result.verdict,
      observations: stated ? stated.observations : [],
      backing,
      validUntil: stated ? stated.validUntil : null,
      verification: stated ? stated.verification : null,
      consistency: stated ? stated.consistency : null,
      logged,
    });
  }
  return verified;
}
