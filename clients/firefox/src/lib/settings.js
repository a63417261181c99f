// The user's settings: defaults, and a validated copy of what is stored or
// imported (the options page's "import settings" and the tests use it).

import { parseCidr, normaliseHost } from "./addresses.js";
import { DEFAULTS } from "./check.js";

export const SETTINGS_DEFAULTS = Object.freeze({
  ...DEFAULTS,
  // Ask about loopback and private addresses like any site (a lab, or
  // notaries on the same network); off: such sites are "internal".
  checkInternalAddresses: false,
  // Domains (and their subdomains) no public notary can check, each with
  // the names of the organisation's own notaries for it (maybe none).
  internalDomains: [],
  // When notaries cannot decide (none answered, or all stood aside):
  // "allow" (the page loads, marked unverified) or "block".
  onInconclusive: "allow",
  // No cookie or Authorization header to a host whose certificate is not
  // yet verified in this session.
  strictMode: false,
  // Checking on or paused (the toolbar's popup can pause it).
  enabled: true,
});

const THRESHOLDS = ["consensus", "majority", "minority"];

function bounded(value, min, max, fallback) {
  return Number.isInteger(value) && value >= min && value <= max ? value : fallback;
}

/** A complete, valid settings object from raw (missing or invalid fields
 * take their default; names of notaries are kept as given). */
export function normaliseSettings(raw = {}) {
  const d = SETTINGS_DEFAULTS;
  const r = raw && typeof raw === "object" ? raw : {};
  const domains = Array.isArray(r.internalDomains) ? r.internalDomains : [];
  return {
    quorum: bounded(r.quorum, 1, 16, d.quorum),
    threshold: THRESHOLDS.includes(r.threshold) ? r.threshold : d.threshold,
    strictVote: typeof r.strictVote === "boolean" ? r.strictVote : d.strictVote,
    timeoutMs: bounded(r.timeoutMs, 500, 60_000, d.timeoutMs),
    batchWindowMs: bounded(r.batchWindowMs, 0, 1000, d.batchWindowMs),
    relay: typeof r.relay === "string" && r.relay ? r.relay : d.relay,
    maxVerdictAgeS: bounded(r.maxVerdictAgeS, 1, 7 * 86400, d.maxVerdictAgeS),
    rejectedForS: bounded(r.rejectedForS, 1, 3600, d.rejectedForS),
    inconclusiveForS: bounded(r.inconclusiveForS, 1, 3600, d.inconclusiveForS),
    checkInternalAddresses: typeof r.checkInternalAddresses === "boolean" ? r.checkInternalAddresses : d.checkInternalAddresses,
    internalDomains: domains.slice(0, 256).flatMap((item) => {
      const domain = typeof item === "string" ? item : item?.domain;
      if (typeof domain !== "string" || !domain.trim()) return [];
      const cidr = parseCidr(domain);
      const notaries = Array.isArray(item?.notaries) ? item.notaries.filter((n) => typeof n === "string").slice(0, 16) : [];
      return [{ domain: cidr ? domain.trim() : normaliseHost(domain.trim().replace(/^\*?\./, "")), notaries }];
    }),
    onInconclusive: ["allow", "block"].includes(r.onInconclusive) ? r.onInconclusive : d.onInconclusive,
    strictMode: typeof r.strictMode === "boolean" ? r.strictMode : d.strictMode,
    enabled: typeof r.enabled === "boolean" ? r.enabled : d.enabled,
  };
}
