// What the add-on does with one HTTPS response, before any notary is asked:
// check it, or let it through with a mark saying why it was not checked
// (Langley's two cases: captive portals and internal servers).

import { addressInCidr, hostInDomain, internalKind, parseCidr, parseIPv4, parseIPv6 } from "./addresses.js";
import { Outcome } from "./voting.js";

export const Mark = Object.freeze({
  PAUSED: "paused",
  CAPTIVE: "captive-portal",
  INTERNAL: "internal",
  NO_NOTARIES: "no-notaries",
  TRUSTED_BY_USER: "trusted-by-user",
});

/** The internal-domain rule covering host or its address, or null. */
export function internalRule(host, ip, rules) {
  for (const rule of rules) {
    if (parseCidr(rule.domain)) {
      if ((ip && addressInCidr(ip, rule.domain)) || addressInCidr(host, rule.domain)) return rule;
    } else if (hostInDomain(host, rule.domain)) {
      return rule;
    }
  }
  return null;
}

/** {action: "check", notaries, scope} or {action: "pass", mark, reason}.
 * host: the URL's host; ip: the address Firefox connected to (null when a
 * proxy hides it); captive: a captive portal is locked; notaries: the
 * user's, by name. */
export function decide({ host, ip, captive, settings, notaries }) {
  if (!settings.enabled) return { action: "pass", mark: Mark.PAUSED, reason: "checking is paused" };
  if (captive) {
    return { action: "pass", mark: Mark.CAPTIVE, reason: "a captive portal is locked: its page is let through unverified until you sign in" };
  }
  const rule = internalRule(host, ip, settings.internalDomains);
  if (rule) {
    const own = notaries.filter((n) => rule.notaries.includes(n.name));
    if (own.length) return { action: "check", notaries: own, scope: `organisation notaries for ${rule.domain}` };
    return { action: "pass", mark: Mark.INTERNAL, reason: `${rule.domain} is an internal domain: not checkable by public notaries` };
  }
  const literal = parseIPv4(host) || parseIPv6(host) ? host : null;
  const kind = internalKind(literal) || internalKind(ip);
  if (kind && !settings.checkInternalAddresses) {
    return { action: "pass", mark: Mark.INTERNAL, reason: `a ${kind} address: not checkable by public notaries` };
  }
  if (!notaries.length) return { action: "pass", mark: Mark.NO_NOTARIES, reason: "no notary is configured" };
  return { action: "check", notaries, scope: "public notaries" };
}

/** "allow" or "block" for a vote's outcome. */
export function actionFor(outcome, settings) {
  if (outcome === Outcome.VERIFIED) return "allow";
  if (outcome === Outcome.REJECTED) return "block";
  return settings.onInconclusive === "block" ? "block" : "allow";
}

/** The toolbar's words for a report: "verified by 2 of 3 notaries". */
export function summary(report) {
  const t = report.tally;
  const asked = report.answers.length;
  if (t.outcome === Outcome.VERIFIED) return `verified by ${t.successes} of ${asked} notaries`;
  if (t.outcome === Outcome.REJECTED) return `rejected: ${t.successes} of ${asked} notaries vouch (${report.threshold})`;
  return `unverified: no notary could vouch (${asked} asked)`;
}
