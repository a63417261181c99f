// The .notary bundle (PROTOCOLS.md 1.6) with the two extensions the 2011
// readers ignore: each host's v2_key and the notary's log (README, "The
// client's trusted notaries"). Validated as notary/protocol/bundle.py does;
// what the user sees before adding a notary: its pins and keys.

import { colonHex, fromBase64, toHex } from "./bytes.js";
import { pemCertificateToDer, subjectPublicKeyInfo } from "./der.js";
import { sha1, sha256 } from "./hashing.js";
import { keyIdOf } from "./ed25519.js";
import { normaliseHost } from "./addresses.js";
import { parseVerifierKey } from "./tlog.js";

export const MAX_BUNDLE_BYTES = 1024 * 1024;
export const MAX_HOSTS = 64;
export const MAX_NAME_CHARS = 200;
export const MAX_BUNDLE_WITNESSES = 32;

export class BundleError extends Error {}

function port(value, what) {
  if (!Number.isInteger(value) || value < 1 || value > 65535) {
    throw new BundleError(`${what} must be a port number 1-65535`);
  }
  return value;
}

async function parseHost(raw) {
  if (raw === null || typeof raw !== "object" || Array.isArray(raw)) {
    throw new BundleError("each host must be an object");
  }
  for (const key of ["host", "ssl_port", "http_port", "certificate"]) {
    if (!(key in raw)) throw new BundleError(`host entry is missing '${key}'`);
  }
  if (typeof raw.host !== "string" || raw.host === "" || /[\s/?#@]/.test(raw.host)) {
    throw new BundleError("host must be a host name or an IP address");
  }
  const host = normaliseHost(raw.host);
  let der;
  try {
    der = pemCertificateToDer(raw.certificate);
  } catch (error) {
    throw new BundleError(`certificate of ${host} is not a readable PEM (${error.message})`);
  }
  let v2Key = null;
  let v2KeyId = null;
  if (raw.v2_key !== undefined && raw.v2_key !== null) {
    let keyRaw = null;
    try {
      keyRaw = fromBase64(raw.v2_key);
    } catch {
      keyRaw = null;
    }
    if (!keyRaw || keyRaw.length !== 32) {
      throw new BundleError(`v2_key of ${host} must be base64 of a 32-byte Ed25519 key`);
    }
    v2Key = raw.v2_key;
    v2KeyId = await keyIdOf(keyRaw);
  }
  return {
    host,
    sslPort: port(raw.ssl_port, `ssl_port of ${host}`),
    httpPort: port(raw.http_port, `http_port of ${host}`),
    certificatePem: raw.certificate,
    sha1Pin: colonHex(await sha1(der)),
    sha256: toHex(await sha256(der)),
    spkiDer: Array.from(subjectPublicKeyInfo(der)),
    v2Key,
    v2KeyId,
  };
}

async function parseLog(raw, hosts) {
  if (raw === null || typeof raw !== "object" || Array.isArray(raw)) {
    throw new BundleError("log must be an object");
  }
  for (const key of ["origin", "key"]) {
    if (!(key in raw)) throw new BundleError(`log is missing '${key}'`);
  }
  let parsed;
  try {
    parsed = await parseVerifierKey(raw.key);
  } catch (error) {
    throw new BundleError(`log key must be the log's verifier key (vkey): ${error.message}`);
  }
  if (parsed.name !== raw.origin) throw new BundleError("log key must be named after the log's origin");
  const publicB64 = btoa(String.fromCharCode(...parsed.publicRaw));
  if (hosts.some((h) => h.v2Key !== null && h.v2Key !== publicB64)) {
    throw new BundleError("log key must be the hosts' v2_key (the v2 key signs the log)");
  }
  const witnesses = raw.witnesses ?? [];
  if (!Array.isArray(witnesses) || witnesses.length > MAX_BUNDLE_WITNESSES
      || !witnesses.every((w) => typeof w === "string")) {
    throw new BundleError(`log witnesses must be a list of at most ${MAX_BUNDLE_WITNESSES} keys`);
  }
  return { origin: raw.origin, key: raw.key, publicKey: publicB64, witnesses };
}

/** The bundle in text (a .notary file), validated; BundleError naming the
 * first problem. The result is plain data (kept in storage as is). */
export async function parseBundle(text) {
  if (typeof text !== "string" || text.length > MAX_BUNDLE_BYTES) {
    throw new BundleError("bundle file is larger than 1 MiB");
  }
  let document;
  try {
    document = JSON.parse(text);
  } catch (error) {
    throw new BundleError(`bundle is not JSON (${error.message})`);
  }
  if (document === null || typeof document !== "object" || Array.isArray(document)) {
    throw new BundleError("bundle must be a JSON object");
  }
  for (const key of ["version", "name", "bundle_location"]) {
    if (!(key in document)) throw new BundleError(`bundle is missing '${key}'`);
  }
  if (document.version !== 1) throw new BundleError(`unsupported bundle version (expected 1)`);
  const name = document.name;
  if (typeof name !== "string" || !name.trim() || name.length > MAX_NAME_CHARS) {
    throw new BundleError(`bundle name must be a non-empty string of at most ${MAX_NAME_CHARS} characters`);
  }
  const location = document.bundle_location;
  let url = null;
  try {
    url = new URL(location);
  } catch {
    url = null;
  }
  if (!url || url.protocol !== "https:" || !url.hostname || !url.pathname.endsWith(".notary")) {
    throw new BundleError("bundle_location must be an https:// URL ending with .notary");
  }
  const region = document.region ?? null;
  if (region !== null && !(typeof region === "string" && /^[A-Z]{2}$/.test(region))) {
    throw new BundleError("region must be a two-letter upper-case ISO country code");
  }
  if (!Array.isArray(document.hosts) || document.hosts.length === 0) {
    throw new BundleError("a bundle needs at least one host");
  }
  if (document.hosts.length > MAX_HOSTS) throw new BundleError(`a bundle has at most ${MAX_HOSTS} hosts`);
  const hosts = [];
  for (const raw of document.hosts) hosts.push(await parseHost(raw));
  const log = document.log === undefined || document.log === null ? null : await parseLog(document.log, hosts);
  return { name, location, region, hosts, log, text };
}

/** The pins a user compares with the operator's before trusting a notary:
 * one line per host (SHA-1 of its certificate, v2 key id) and the log. */
export function describePins(bundle) {
  const lines = bundle.hosts.map((h) =>
    `${h.host} (HTTPS ${h.sslPort}, relay ${h.httpPort}): certificate SHA-1 ${h.sha1Pin}`
    + (h.v2KeyId ? `, v2 key ${h.v2KeyId}` : ", no v2 key (legacy Convergence API)"));
  if (bundle.log) lines.push(`log ${bundle.log.origin}: ${bundle.log.key}`);
  return lines;
}

/** The protocol the add-on asks a notary with: v2 when every host pins a
 * v2 key (answers verified with Ed25519 against it), else Convergence. */
export function protocolOf(bundle) {
  return bundle.hosts.every((h) => h.v2Key) ? "v2" : "convergence";
}
