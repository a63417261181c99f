// Bounded maps: every cache and table the add-on keeps has a size bound.

/** A least-recently-used map of at most maxEntries; entries may carry an
 * expiry (seconds, compared with now() at lookup). */
export class BoundedCache {
  constructor(maxEntries, now = () => Math.floor(Date.now() / 1000)) {
    if (!(maxEntries > 0)) throw new Error("a cache needs a positive bound");
    this.maxEntries = maxEntries;
    this.now = now;
    this.map = new Map();
  }

  get size() {
    return this.map.size;
  }

  get(key) {
    const item = this.map.get(key);
    if (item === undefined) return undefined;
    if (item.expiresAt !== null && item.expiresAt < this.now()) {
      this.map.delete(key);
      return undefined;
    }
    this.map.delete(key);
    this.map.set(key, item);
    return item.value;
  }

  has(key) {
    return this.get(key) !== undefined;
  }

  set(key, value, expiresAt = null) {
    this.map.delete(key);
    this.map.set(key, { value, expiresAt });
    while (this.map.size > this.maxEntries) this.map.delete(this.map.keys().next().value);
  }

  delete(key) {
    this.map.delete(key);
  }

  clear() {
    this.map.clear();
  }

  values() {
    return [...this.map.values()].map((item) => item.value);
  }
}

/** The verdict cache: one vote per (host, port, certificate SHA-256) for
 * as long as it holds (check.js verdictExpiry). */
export class VerdictCache extends BoundedCache {
  static key(host, port, sha256) {
    return `${host}:${port}:${sha256}`;
  }

  lookup(host, port, sha256) {
    return this.get(VerdictCache.key(host, port, sha256));
  }

  remember(report) {
    this.set(VerdictCache.key(report.host, report.port, report.sha256), report, report.expiresAt);
  }
}

/** Each notary's recent answers (at most perNotary each, at most
 * maxNotaries notaries): what the options page shows as reliability. */
export class Reliability {
  constructor({ perNotary = 50, maxNotaries = 256 } = {}) {
    this.perNotary = perNotary;
    this.table = new BoundedCache(maxNotaries);
  }

  record(name, verdict, atS) {
    const rows = this.table.get(name) ?? [];
    rows.push({ verdict, at: atS });
    if (rows.length > this.perNotary) rows.splice(0, rows.length - this.perNotary);
    this.table.set(name, rows);
  }

  summary(name) {
    const rows = this.table.get(name) ?? [];
    const count = (v) => rows.filter((r) => r.verdict === v).length;
    return {
      asked: rows.length,
      answered: rows.length - count("connectivity-failure"),
      success: count("success"),
      failure: count("failure"),
      inconclusive: count("inconclusive"),
      connectivityFailure: count("connectivity-failure"),
      last: rows.length ? rows[rows.length - 1] : null,
    };
  }

  toJSON() {
    return Object.fromEntries([...this.table.map.entries()].map(([k, v]) => [k, v.value]));
  }

  load(saved) {
    for (const [name, rows] of Object.entries(saved ?? {})) {
      if (Array.isArray(rows)) this.table.set(name, rows.slice(-this.perNotary));
    }
  }
}
