// The notary's transparency log as a client checks it (docs/v2.md, rule
// S7): RFC 9162 Merkle inclusion proofs, C2SP signed notes and checkpoints,
// and a statement's promise of inclusion.

import { concatBytes, equalBytes, fromBase64, utf8 } from "./bytes.js";
import { sha256 } from "./hashing.js";
import { importEd25519, verifyEd25519 } from "./ed25519.js";

export const MAX_CHECKPOINT_BYTES = 8192;
const ED25519_TYPE = 0x01;
const KEY_ID_BYTES = 4;
const SIGNATURE_PREFIX = "\u2014 ";

export const leafHash = (entry) => sha256(concatBytes(Uint8Array.of(0), entry));
export const nodeHash = (left, right) => sha256(concatBytes(Uint8Array.of(1), left, right));

/** Throws unless proof shows leaf at index in the tree of size leaves with
 * this root (RFC 9162, 2.1.3.2). index and size are BigInt or Number. */
export async function verifyInclusion(leaf, index, size, proof, root) {
  let fn = BigInt(index);
  let sn = BigInt(size) - 1n;
  if (fn < 0n || fn > sn) throw new Error("leaf index is not in the tree");
  let computed = leaf;
  for (const sibling of proof) {
    if (sibling.length !== 32) throw new Error("a proof hash is not 32 bytes");
    if (sn === 0n) throw new Error("proof is longer than the path to the root");
    if ((fn & 1n) === 1n || fn === sn) {
      computed = await nodeHash(sibling, computed);
      while ((fn & 1n) === 0n && fn !== 0n) {
        fn >>= 1n;
        sn >>= 1n;
      }
    } else {
      computed = await nodeHash(computed, sibling);
    }
    fn >>= 1n;
    sn >>= 1n;
  }
  if (sn !== 0n) throw new Error("proof is shorter than the path to the root");
  if (!equalBytes(computed, root)) throw new Error("proof does not lead to the root");
}

function validKeyName(name) {
  return typeof name === "string" && name !== "" && !/[\s+\x00-\x1f\x7f]/u.test(name);
}

/** The key id of an Ed25519 note key: SHA-256(name "\n" 0x01 key)[:4]. */
export async function noteKeyId(name, publicRaw) {
  const digest = await sha256(concatBytes(utf8(name + "\n"), Uint8Array.of(ED25519_TYPE), publicRaw));
  return digest.subarray(0, KEY_ID_BYTES);
}

/** {name, publicRaw} of a verifier key "name+hex8+base64(0x01 || key)";
 * throws for anything else, including a key id that is not the key's. */
export async function parseVerifierKey(text) {
  if (typeof text !== "string" || text.length > 1024) throw new Error("malformed verifier key");
  // name+hex8+base64: the base64 may hold "+" too, the name never does.
  const first = text.indexOf("+");
  const second = text.indexOf("+", first + 1);
  if (first < 0 || second < 0) throw new Error("malformed verifier key");
  const name = text.slice(0, first);
  const keyIdHex = text.slice(first + 1, second);
  const material = text.slice(second + 1);
  if (!validKeyName(name)) throw new Error("verifier key has an invalid name");
  if (!/^[0-9a-f]{8}$/.test(keyIdHex ?? "")) throw new Error("verifier key id is not 8 hex digits");
  const raw = fromBase64(material ?? "");
  if (raw.length !== 33 || raw[0] !== ED25519_TYPE) throw new Error("verifier key is not an Ed25519 key");
  const publicRaw = raw.subarray(1);
  const keyId = await noteKeyId(name, publicRaw);
  if (Array.from(keyId, (b) => b.toString(16).padStart(2, "0")).join("") !== keyIdHex) {
    throw new Error("verifier key id does not match its key");
  }
  return { name, publicRaw };
}

/** The checkpoint {origin, size (BigInt), root} of a signed note, signed by
 * publicRaw under the key name origin and naming origin; throws otherwise. */
export async function openCheckpoint(note, origin, publicRaw) {
  if (typeof note !== "string" || utf8(note).length > MAX_CHECKPOINT_BYTES) {
    throw new Error("checkpoint note too large");
  }
  if (/[\x00-\x09\x0b-\x1f\x7f]/.test(note)) throw new Error("note holds a control character");
  const split = note.lastIndexOf("\n\n");
  if (split < 0) throw new Error("note has no empty line before its signatures");
  const text = note.slice(0, split + 1);
  const block = note.slice(split + 2);
  if (!block.endsWith("\n")) throw new Error("note must end in a newline");
  const keyId = await noteKeyId(origin, publicRaw);
  const key = await importEd25519(publicRaw);
  let signed = false;
  for (const line of block.slice(0, -1).split("\n")) {
    if (!line.startsWith(SIGNATURE_PREFIX)) throw new Error("bad signature line");
    const [name, encoded, extra] = line.slice(SIGNATURE_PREFIX.length).split(" ");
    if (extra !== undefined || !validKeyName(name)) throw new Error("bad signature line");
    const raw = fromBase64(encoded ?? "");
    if (raw.length <= KEY_ID_BYTES) throw new Error("bad signature line");
    if (name !== origin || !equalBytes(raw.subarray(0, KEY_ID_BYTES), keyId)) continue;
    if (!(await verifyEd25519(key, raw.subarray(KEY_ID_BYTES), utf8(text)))) {
      throw new Error("invalid signature by the log's key");
    }
    signed = true;
  }
  if (!signed) throw new Error("checkpoint not signed by the log's key");
  const lines = text.slice(0, -1).split("\n");
  if (lines.length < 3 || lines.some((l) => l === "")) throw new Error("malformed checkpoint");
  const [named, sizeText, rootText] = lines;
  if (!/^(0|[1-9][0-9]{0,18})$/.test(sizeText) || BigInt(sizeText) >= 2n ** 63n) {
    throw new Error("bad tree size");
  }
  const root = fromBase64(rootText);
  if (root.length !== 32) throw new Error("bad root hash");
  if (named !== origin) throw new Error("the checkpoint is of another log");
  return { origin: named, size: BigInt(sizeText), root };
}

/** Rule S7 for one verified statement: null without a promise (the notary
 * keeps no log); "promised" while merge_by has not passed without a proof;
 * {index, size} once the proof leads to a checkpoint signed by publicRaw.
 * Throws naming what failed. pinnedOrigin: the bundle's log origin, which
 * the promise must name (a statement without a promise is then a failure). */
export async function verifyLogged(stated, publicRaw, { now, pinnedOrigin = null }) {
  const promise = stated.log;
  const inclusion = stated.inclusion;
  if (!promise) {
    if (inclusion) throw new Error("an inclusion proof for a statement that promises no log");
    if (pinnedOrigin) throw new Error("no log promise, but its bundle pins a log");
    return null;
  }
  if (pinnedOrigin && promise.origin !== pinnedOrigin) {
    throw new Error("the statement promises another log than its bundle pins");
  }
  if (!inclusion) {
    if (now > promise.merge_by) throw new Error("the log's promise is broken");
    return "promised";
  }
  const checkpoint = await openCheckpoint(inclusion.checkpoint, promise.origin, publicRaw);
  await verifyInclusion(await leafHash(stated.entryBytes), inclusion.index, checkpoint.size,
    inclusion.proof, checkpoint.root);
  return { index: inclusion.index, size: checkpoint.size };
}
