// Canonical JSON, the bytes every v2 signature covers (docs/v2.md, rules
// C1-C7): sorted keys, no whitespace, integers only, the short escapes of
// C5, UTF-8. A verifier parses a document and re-encodes the parsed values
// (C7), so the bytes on the wire need not be canonical.

import { utf8 } from "./bytes.js";

export const MAX_SAFE_INTEGER = 2 ** 53 - 1;
export const MAX_CANONICAL_DEPTH = 16;

const SHORT_ESCAPES = {
  '"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r",
};

function encodeString(text) {
  let out = '"';
  for (let i = 0; i < text.length; i += 1) {
    const char = text[i];
    const code = text.charCodeAt(i);
    if (code >= 0xd800 && code <= 0xdbff) {
      const next = text.charCodeAt(i + 1);
      if (!(next >= 0xdc00 && next <= 0xdfff)) throw new RangeError("lone surrogate");
      out += char + text[i + 1];
      i += 1;
    } else if (code >= 0xdc00 && code <= 0xdfff) {
      throw new RangeError("lone surrogate");
    } else if (char in SHORT_ESCAPES) {
      out += SHORT_ESCAPES[char];
    } else if (code < 0x20) {
      out += "\\u" + code.toString(16).padStart(4, "0");
    } else {
      out += char;
    }
  }
  return out + '"';
}

function encode(value, depth) {
  if (value === null) return "null";
  if (value === true) return "true";
  if (value === false) return "false";
  if (typeof value === "string") return encodeString(value);
  if (typeof value === "number") {
    if (!Number.isInteger(value)) throw new TypeError("only integers have a canonical form");
    if (Math.abs(value) > MAX_SAFE_INTEGER) throw new RangeError("integer out of range");
    return value === 0 ? "0" : String(value);
  }
  if (typeof value !== "object") throw new TypeError(`${typeof value} has no canonical form`);
  if (depth >= MAX_CANONICAL_DEPTH) throw new RangeError("nesting too deep");
  if (Array.isArray(value)) return "[" + value.map((v) => encode(v, depth + 1)).join(",") + "]";
  const keys = Object.keys(value);
  for (const key of keys) {
    if (!/^[\x00-\x7f]*$/.test(key)) throw new RangeError("object keys must be ASCII");
  }
  keys.sort();
  return "{" + keys.map((k) => encodeString(k) + ":" + encode(value[k], depth + 1)).join(",") + "}";
}

/** The canonical JSON text of value; throws TypeError or RangeError for a
 * value outside rule C1. */
export function canonicalJson(value) {
  return encode(value, 0);
}

/** canonicalJson(value) as UTF-8 bytes (C6). */
export function canonicalBytes(value) {
  return utf8(canonicalJson(value));
}
