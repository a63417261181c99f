// Hosts and addresses: a target's key as the notary writes it, IP literals
// parsed, and whether an address is internal (Langley's "internal
// servers": no public notary can reach it).

/** The IPv4 address of a dotted quad as 4 bytes, or null. */
export function parseIPv4(text) {
  const parts = String(text).split(".");
  if (parts.length !== 4) return null;
  const bytes = [];
  for (const part of parts) {
    if (!/^(0|[1-9][0-9]{0,2})$/.test(part) || Number(part) > 255) return null;
    bytes.push(Number(part));
  }
  return bytes;
}

/** The 16 bytes of an IPv6 address (brackets allowed; no zone id), or null. */
export function parseIPv6(text) {
  let s = String(text);
  if (s.startsWith("[") && s.endsWith("]")) s = s.slice(1, -1);
  if (!s.includes(":") || s.includes("%")) return null;
  let tail = [];
  const lastColon = s.lastIndexOf(":");
  if (s.slice(lastColon + 1).includes(".")) {
    const v4 = parseIPv4(s.slice(lastColon + 1));
    if (!v4) return null;
    tail = v4;
    s = s.slice(0, lastColon + 1) + "0:0";
  }
  const halves = s.split("::");
  if (halves.length > 2) return null;
  const groups = (h) => (h === "" ? [] : h.split(":"));
  const head = groups(halves[0]);
  const rest = halves.length === 2 ? groups(halves[1]) : [];
  const missing = 8 - head.length - rest.length;
  if (halves.length === 2 ? missing < 1 : missing !== 0) return null;
  const all = [...head, ...Array(halves.length === 2 ? missing : 0).fill("0"), ...rest];
  const bytes = [];
  for (const group of all) {
    if (!/^[0-9a-fA-F]{1,4}$/.test(group)) return null;
    const n = parseInt(group, 16);
    bytes.push(n >> 8, n & 255);
  }
  if (tail.length) bytes.splice(12, 4, ...tail);
  return bytes;
}

/** The compressed lower-case form of IPv6 bytes (RFC 5952). */
export function formatIPv6(bytes) {
  const groups = [];
  for (let i = 0; i < 16; i += 2) groups.push(((bytes[i] << 8) | bytes[i + 1]).toString(16));
  let best = [-1, 0];
  for (let i = 0; i < 8; ) {
    if (groups[i] !== "0") { i += 1; continue; }
    let j = i;
    while (j < 8 && groups[j] === "0") j += 1;
    if (j - i > best[1] && j - i > 1) best = [i, j - i];
    i = j;
  }
  if (best[0] < 0) return groups.join(":");
  return groups.slice(0, best[0]).join(":") + "::" + groups.slice(best[0] + best[1]).join(":");
}

/** A host as the notary normalises it: lower case without trailing dot, a
 * dotted quad, or a compressed IPv6 address without brackets. (Firefox's
 * URL.hostname is already an A-label.) */
export function normaliseHost(host) {
  const text = String(host);
  const v6 = parseIPv6(text);
  if (v6) return formatIPv6(v6);
  return text.toLowerCase().replace(/\.$/, "");
}

/** "host:port", IPv6 in brackets: the notary's Target.key. */
export function targetKey(host, port) {
  const h = normaliseHost(host);
  return h.includes(":") ? `[${h}]:${port}` : `${h}:${port}`;
}

function ipBytes(address) {
  const v4 = parseIPv4(address);
  if (v4) return v4;
  const v6 = parseIPv6(address);
  if (!v6) return null;
  const mapped = v6.slice(0, 10).every((b) => b === 0) && v6[10] === 255 && v6[11] === 255;
  return mapped ? v6.slice(12) : v6;
}

function inPrefix(bytes, prefix, bits) {
  if (bytes.length !== prefix.length) return false;
  for (let i = 0; i < bits; i += 1) {
    const bit = (b) => (b[i >> 3] >> (7 - (i & 7))) & 1;
    if (bit(bytes) !== bit(prefix)) return false;
  }
  return true;
}

/** Parse "10.0.0.0/8" or "fd00::/8" into [bytes, bits]; null if malformed. */
export function parseCidr(text) {
  const [address, bitsText, extra] = String(text).trim().split("/");
  if (extra !== undefined) return null;
  const bytes = ipBytes(address);
  if (!bytes) return null;
  const bits = bitsText === undefined ? bytes.length * 8 : Number(bitsText);
  if (!Number.isInteger(bits) || bits < 0 || bits > bytes.length * 8) return null;
  return [bytes, bits];
}

export function addressInCidr(address, cidr) {
  const bytes = ipBytes(address);
  const parsed = typeof cidr === "string" ? parseCidr(cidr) : cidr;
  return Boolean(bytes && parsed && inPrefix(bytes, parsed[0], parsed[1]));
}

/** Ranges no public notary can reach from the internet. */
export const INTERNAL_RANGES = [
  "127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16",
  "100.64.0.0/10", "0.0.0.0/8", "::1/128", "::/128", "fc00::/7", "fe80::/10",
].map(parseCidr);

/** "loopback", "private" or null (a public address, or not an address). */
export function internalKind(address) {
  if (!address) return null;
  if (addressInCidr(address, INTERNAL_RANGES[0]) || addressInCidr(address, INTERNAL_RANGES[7])) {
    return "loopback";
  }
  return INTERNAL_RANGES.some((range) => addressInCidr(address, range)) ? "private" : null;
}

/** True when host is domain or one of its subdomains ("corp.example"
 * covers "intranet.corp.example"). */
export function hostInDomain(host, domain) {
  const h = normaliseHost(host);
  const d = normaliseHost(String(domain).replace(/^\*?\./, ""));
  return d !== "" && (h === d || h.endsWith("." + d));
}
