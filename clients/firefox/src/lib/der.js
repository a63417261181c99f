// A minimal DER walk: the SubjectPublicKeyInfo of a certificate, and PEM.
// The same fixed walk as notary/model/observations.py subject_public_key_info:
// into Certificate and TBSCertificate, past the optional version and five
// fields, every element checked to lie within its parent; no key is parsed.

import { fromBase64 } from "./bytes.js";

const SEQUENCE = 0x30;
const VERSION = 0xa0; // [0] EXPLICIT
const FIELDS_BEFORE_SPKI = 5; // serial, signature algorithm, issuer, validity, subject
const MAX_LENGTH_BYTES = 4;

/** [tag, content start, end] of the DER element at offset, ending by limit. */
export function derElement(der, offset, limit) {
  if (limit - offset < 2) throw new Error("truncated DER element");
  const tag = der[offset];
  const first = der[offset + 1];
  if ((tag & 0x1f) === 0x1f) throw new Error("unexpected multi-byte DER tag");
  let start = offset + 2;
  let length;
  if (first < 0x80) {
    length = first;
  } else {
    const count = first & 0x7f;
    if (count < 1 || count > MAX_LENGTH_BYTES || limit - start < count) {
      throw new Error("bad DER length");
    }
    length = 0;
    for (let i = 0; i < count; i += 1) length = length * 256 + der[start + i];
    start += count;
  }
  const end = start + length;
  if (end > limit) throw new Error("DER element overruns its parent");
  return [tag, start, end];
}

/** The SubjectPublicKeyInfo element of a DER certificate (tag and length
 * included), as a view of its bytes. Throws if der is not shaped so. */
export function subjectPublicKeyInfo(der) {
  let [tag, start, end] = derElement(der, 0, der.length);
  if (tag !== SEQUENCE) throw new Error("not a certificate: no outer SEQUENCE");
  let offset;
  let tbsEnd;
  [tag, offset, tbsEnd] = derElement(der, start, end);
  if (tag !== SEQUENCE) throw new Error("not a certificate: no TBSCertificate");
  const [first, , after] = derElement(der, offset, tbsEnd);
  if (first === VERSION) offset = after;
  for (let i = 0; i < FIELDS_BEFORE_SPKI; i += 1) [, , offset] = derElement(der, offset, tbsEnd);
  const [spkiTag, , spkiEnd] = derElement(der, offset, tbsEnd);
  if (spkiTag !== SEQUENCE) throw new Error("not a certificate: no SubjectPublicKeyInfo");
  return der.subarray(offset, spkiEnd);
}

const PEM_RE = /^-----BEGIN CERTIFICATE-----\r?\n([A-Za-z0-9+/=\r\n]+?)\r?\n?-----END CERTIFICATE-----\s*$/;

/** The DER bytes of a PEM text holding exactly one certificate. */
export function pemCertificateToDer(pem) {
  if (typeof pem !== "string") throw new Error("certificate must be PEM text");
  const match = PEM_RE.exec(pem.trim());
  if (!match) throw new Error("certificate must be one PEM CERTIFICATE block");
  const der = fromBase64(match[1].replace(/[\r\n]/g, ""));
  subjectPublicKeyInfo(der); // shaped like a certificate
  return der;
}
