// Ed25519 signatures with WebCrypto (RFC 8032, pure Ed25519: Firefox 129+,
// Node 20), and the notary's key ids (docs/v2.md, rule S4).

import { fromBase64, toHex } from "./bytes.js";
import { sha256 } from "./hashing.js";

export const ED25519_PUBLIC_KEY_BYTES = 32;
export const ED25519_SIGNATURE_BYTES = 64;

/** A CryptoKey for the raw 32-byte Ed25519 public key. */
export async function importEd25519(raw) {
  if (!(raw instanceof Uint8Array) || raw.length !== ED25519_PUBLIC_KEY_BYTES) {
    throw new Error("an Ed25519 public key is 32 bytes");
  }
  return crypto.subtle.importKey("raw", raw, { name: "Ed25519" }, false, ["verify"]);
}

/** True when signature (bytes) is key's Ed25519 signature of data; false
 * for a bad signature, never an exception. */
export async function verifyEd25519(key, signature, data) {
  if (!(signature instanceof Uint8Array) || signature.length !== ED25519_SIGNATURE_BYTES) return false;
  try {
    return await crypto.subtle.verify({ name: "Ed25519" }, key, signature, data);
  } catch {
    return false;
  }
}

/** verifyEd25519 with a base64 signature (rule S3); false if not base64. */
export async function verifyEd25519Base64(key, signatureB64, data) {
  let signature;
  try {
    signature = fromBase64(signatureB64);
  } catch {
    return false;
  }
  return verifyEd25519(key, signature, data);
}

/** Rule S4: the first 16 hex digits of SHA-256 of the raw public key. */
export async function keyIdOf(raw) {
  return toHex(await sha256(raw)).slice(0, 16);
}
