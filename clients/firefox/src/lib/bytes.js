// Bytes, hex, base64 and UTF-8, with no browser API (pure: tested in Node).

const HEX = "0123456789abcdef";

/** Lower-case hex of a Uint8Array. */
export function toHex(bytes) {
  let out = "";
  for (const byte of bytes) out += HEX[byte >> 4] + HEX[byte & 15];
  return out;
}

/** Bytes of a hex string (either case, even length); throws on anything else. */
export function fromHex(text) {
  if (typeof text !== "string" || text.length % 2 !== 0 || !/^[0-9a-fA-F]*$/.test(text)) {
    throw new Error("not hex");
  }
  const out = new Uint8Array(text.length / 2);
  for (let i = 0; i < out.length; i += 1) out[i] = parseInt(text.slice(2 * i, 2 * i + 2), 16);
  return out;
}

/** "AB:CD:..." upper-case colon hex, as Convergence writes SHA-1 fingerprints. */
export function colonHex(bytes) {
  return toHex(bytes).toUpperCase().match(/../g)?.join(":") ?? "";
}

const B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const B64_RE = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

/** Standard base64 with padding (RFC 4648 section 4). */
export function toBase64(bytes) {
  let out = "";
  for (let i = 0; i < bytes.length; i += 3) {
    const n = (bytes[i] << 16) | ((bytes[i + 1] ?? 0) << 8) | (bytes[i + 2] ?? 0);
    out += B64[(n >> 18) & 63] + B64[(n >> 12) & 63];
    out += i + 1 < bytes.length ? B64[(n >> 6) & 63] : "=";
    out += i + 2 < bytes.length ? B64[n & 63] : "=";
  }
  return out;
}

/** Bytes of strict standard base64 (padding required, no whitespace);
 * throws on anything else, including non-zero padding bits. */
export function fromBase64(text) {
  if (typeof text !== "string" || !B64_RE.test(text)) throw new Error("not base64");
  const clean = text.replace(/=+$/, "");
  const out = new Uint8Array(Math.floor((clean.length * 3) / 4));
  let bits = 0;
  let value = 0;
  let index = 0;
  for (const char of clean) {
    value = (value << 6) | B64.indexOf(char);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out[index] = (value >> bits) & 255;
      index += 1;
    }
  }
  if ((value & ((1 << bits) - 1)) !== 0) throw new Error("not canonical base64");
  return out;
}

const encoder = new TextEncoder();
const decoder = new TextDecoder("utf-8", { fatal: true });

export function utf8(text) {
  return encoder.encode(text);
}

/** Text of strict UTF-8 bytes (throws on invalid UTF-8). */
export function fromUtf8(bytes) {
  return decoder.decode(bytes);
}

export function concatBytes(...parts) {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let offset = 0;
  for (const part of parts) {
    out.set(part, offset);
    offset += part.length;
  }
  return out;
}

export function equalBytes(a, b) {
  if (a.length !== b.length) return false;
  let diff = 0;
  for (let i = 0; i < a.length; i += 1) diff |= a[i] ^ b[i];
  return diff === 0;
}
