// Certificate hashes with WebCrypto (globalThis.crypto.subtle: Firefox and
// Node alike): SHA-256 and SHA-1 of the DER, SHA-256 of the SPKI (RFC 7469).

import { toHex } from "./bytes.js";
import { subjectPublicKeyInfo } from "./der.js";

export async function digest(algorithm, bytes) {
  return new Uint8Array(await crypto.subtle.digest(algorithm, bytes));
}

export const sha256 = (bytes) => digest("SHA-256", bytes);
export const sha1 = (bytes) => digest("SHA-1", bytes);

/** {sha256, sha1, spkiSha256} of a DER certificate, lower-case hex. */
export async function certificateHashes(der) {
  const bytes = der instanceof Uint8Array ? der : Uint8Array.from(der);
  const [full, legacy, key] = await Promise.all([
    sha256(bytes), sha1(bytes), sha256(subjectPublicKeyInfo(bytes)),
  ]);
  return { sha256: toHex(full), sha1: toHex(legacy), spkiSha256: toHex(key) };
}
