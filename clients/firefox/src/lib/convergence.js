// The legacy Convergence API (PROTOCOLS.md 1.2-1.4) for notaries that have
// only it: POST /target/host+port with the SHA-1 fingerprint, and the
// answer's RSA signature (PKCS#1 v1.5, SHA-1) checked against the key of
// the host's certificate pinned in its bundle. The signed list does not
// name the target (a weakness of v1): the add-on also checks that the
// connection presented the pinned certificate (background.js).

import { colonHex, fromBase64, fromHex, utf8 } from "./bytes.js";

export const MAX_ANSWER_BYTES = 1024 * 1024;
const MAX_SIGNATURE_CHARS = 1368;
const FINGERPRINT_RE = /^[0-9A-Fa-f]{2}(?::[0-9A-Fa-f]{2}){19}$/;
const TIMESTAMP_RE = /^[0-9]{1,12}$/;

export class ConvergenceError extends Error {}

/** The path segment of a target: host+port, IPv6 in brackets. */
export function targetPath(host, port) {
  return `/target/${host.includes(":") ? `[${host}]` : host}+${port}`;
}

/** The form body of a POST: fingerprint=<SHA-1 as colon hex>. */
export function formBody(sha1Hex) {
  return `fingerprint=${colonHex(fromHex(sha1Hex))}`;
}

function exactKeys(value, keys, where) {
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    throw new ConvergenceError(`${where} must be an object`);
  }
  const got = Object.keys(value).sort();
  if (got.length !== keys.length || got.some((k, i) => k !== [...keys].sort()[i])) {
    throw new ConvergenceError(`${where} must be an object with ${keys.join(", ")}`);
  }
  return value;
}

/** Python's json.dumps with its default separators (", " and ": "), keys
 * in the order received: the bytes a Convergence notary signs. The shape is
 * exact (strings and containers only, ASCII), so nothing else is needed. */
function pythonDumps(value) {
  if (typeof value === "string") return JSON.stringify(value);
  if (Array.isArray(value)) return "[" + value.map(pythonDumps).join(", ") + "]";
  return "{" + Object.keys(value).map((k) => JSON.stringify(k) + ": " + pythonDumps(value[k])).join(", ") + "}";
}

/** {entries: [{sha1 (hex), start, finish}], payload (bytes), signature}
 * of an answer body, as strict as notary.protocol.convergence.parse_answer. */
export function parseAnswer(text) {
  if (typeof text !== "string" || text.length > MAX_ANSWER_BYTES) throw new ConvergenceError("answer too large");
  let document;
  try {
    document = JSON.parse(text);
  } catch {
    throw new ConvergenceError("answer is not JSON");
  }
  exactKeys(document, ["fingerprintList", "signature"], "answer");
  if (!Array.isArray(document.fingerprintList)) throw new ConvergenceError("fingerprintList must be an array");
  const entries = document.fingerprintList.map((row, i) => {
    const where = `fingerprintList[${i}]`;
    exactKeys(row, ["timestamp", "fingerprint"], where);
    exactKeys(row.timestamp, ["start", "finish"], `${where}.timestamp`);
    const { start, finish } = row.timestamp;
    if (![start, finish].every((t) => typeof t === "string" && TIMESTAMP_RE.test(t))) {
      throw new ConvergenceError(`${where}.timestamp must be strings of digits`);
    }
    if (Number(finish) < Number(start)) throw new ConvergenceError(`${where}.timestamp.finish is before start`);
    if (typeof row.fingerprint !== "string" || !FINGERPRINT_RE.test(row.fingerprint)) {
      throw new ConvergenceError(`${where}.fingerprint must be 20 hex pairs`);
    }
    return { sha1: row.fingerprint.replaceAll(":", "").toLowerCase(), start: Number(start), finish: Number(finish) };
  });
  const signature = document.signature;
  if (typeof signature !== "string" || signature.length > MAX_SIGNATURE_CHARS
      || !/^[A-Za-z0-9+/]+={0,2}$/.test(signature)) {
    throw new ConvergenceError("signature must be base64");
  }
  const signed = Object.fromEntries(Object.entries(document).filter(([k]) => k !== "signature"));
  return { entries, payload: utf8(pythonDumps(signed)), signature };
}

/** True when signature (base64) is the RSA PKCS#1 v1.5 SHA-1 signature of
 * payload by the key in spkiDer (the pinned certificate's); false
 * otherwise, never an exception. */
export async function verifySignature(spkiDer, payload, signatureB64) {
  try {
    const key = await crypto.subtle.importKey(
      "spki", Uint8Array.from(spkiDer), { name: "RSASSA-PKCS1-v1_5", hash: "SHA-1" }, false, ["verify"],
    );
    return await crypto.subtle.verify("RSASSA-PKCS1-v1_5", key, fromBase64(signatureB64), payload);
  } catch {
    return false;
  }
}
