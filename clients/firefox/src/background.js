// The add-on's browser glue: Firefox's events in, the pure modules of lib/
// deciding, Firefox's answers out. Kept thin: what can be decided without
// a browser API is decided in lib/ (and tested in Node).
//
// Every HTTPS response (pages and sub-resources) is held in a blocking
// onHeadersReceived until its leaf certificate (getSecurityInfo, rawDER) is
// judged: from the verdict cache, or by asking the user's notaries (one
// check per host, port and certificate at a time). A rejected page is
// replaced by the add-on's block page; a rejected sub-resource is cancelled.
//
// Resource handling: every table here is bounded (lib/cache.js); every
// network wait has a deadline (the transport's AbortController, the strict
// mode's preflight). Error handling: a notary's fault is its answer
// (lib/check.js); a fault of this glue on one response lets that response
// through marked "error" and is logged, never stopping later checks.

import { normaliseHost, targetKey } from "./lib/addresses.js";
import { concatBytes } from "./lib/bytes.js";
import { parseBundle, describePins, protocolOf, BundleError } from "./lib/bundle.js";
import { BoundedCache, Reliability, VerdictCache } from "./lib/cache.js";
import { checkCertificate, NotaryClient, TransportError, RELAY_NOTARY_PORT } from "./lib/check.js";
import { certificateHashes } from "./lib/hashing.js";
import { actionFor, decide, Mark, summary } from "./lib/policy.js";
import { normaliseSettings } from "./lib/settings.js";
import { Outcome } from "./lib/voting.js";

const EXTENSION_BASE = browser.runtime.getURL("");
const MAX_NOTARY_ANSWER_BYTES = 16 * 1024 * 1024;
const MAX_BUNDLE_BYTES = 1024 * 1024;
const PREFLIGHT_EXTRA_MS = 2000;
const STALL_MS = 1000;
const CREDENTIAL_HEADERS = /^(cookie|authorization|proxy-authorization)$/i;

const state = {
  settings: normaliseSettings({}),
  notaries: [], // [{name, bundle}]
  clients: new Map(), // name -> NotaryClient
  endpoints: new Map(), // "host:port" of a notary -> SHA-1 pins its bundle names
  alwaysTrust: {}, // "host:port" -> [sha256]
  captive: false,
};
const verdicts = new VerdictCache(4096);
const pending = new Map(); // single flight: cache key -> Promise<report>
const reliability = new Reliability();
const trustedOnce = new BoundedCache(1024); // "host:port:sha256" trusted for this session
const sessionVerified = new BoundedCache(4096); // "host:port" -> sha256 verified this session
const preflights = new Map(); // "host:port" -> Promise (strict mode)
const relayRoutes = new Map(); // "host:port" of a notary -> {relay, count}
const ownRequests = new Map(); // the add-on's requests to notaries in flight: tagged URL -> state
let ownSequence = 0;
const reports = new BoundedCache(256); // block page reports by id
const tabs = new BoundedCache(512); // tabId -> what the popup shows
let reportSequence = 0;

// -- settings and notaries ----------------------------------------------------

async function load() {
  const saved = await browser.storage.local.get(["settings", "notaries", "alwaysTrust", "reliability"]);
  state.settings = normaliseSettings(saved.settings ?? {});
  state.alwaysTrust = saved.alwaysTrust && typeof saved.alwaysTrust === "object" ? saved.alwaysTrust : {};
  const notaries = [];
  for (const stored of Array.isArray(saved.notaries) ? saved.notaries : []) {
    try {
      const bundle = await parseBundle(stored.text);
      notaries.push({ name: bundle.name, bundle });
    } catch (error) {
      console.warn(`notary check: stored bundle ${stored.name} no longer parses: ${error.message}`);
    }
  }
  state.notaries = notaries;
  state.clients = new Map(notaries.map((n) => [n.name, new NotaryClient(n, {
    transport, settings: state.settings,
  })]));
  state.endpoints = new Map();
  for (const notary of notaries) {
    const pins = notary.bundle.hosts.map((h) => h.sha1Pin);
    for (const host of notary.bundle.hosts) {
      for (const port of [host.sslPort, RELAY_NOTARY_PORT]) {
        const key = targetKey(host.host, port);
        state.endpoints.set(key, [...(state.endpoints.get(key) ?? []), ...pins]);
      }
    }
  }
  if (!reliability.loaded) {
    reliability.load(saved.reliability);
    reliability.loaded = true;
  }
  verdicts.clear();
  updateListeners();
}

/** The listeners that only some settings need, on or off: each one Firefox
 * waits for costs every request a round trip to this process (the bench:
 * bench/bench_firefox.py). Strict mode's header check only in strict mode;
 * the relay's proxy.onRequest only with a relay, and only for the
 * notaries' hosts. */
function updateListeners() {
  const strict = state.settings.strictMode && state.settings.enabled;
  const hasStrict = browser.webRequest.onBeforeSendHeaders.hasListener(onBeforeSendHeaders);
  if (strict && !hasStrict) {
    browser.webRequest.onBeforeSendHeaders.addListener(onBeforeSendHeaders, { urls: ["https://*/*", "wss://*/*"] }, ["blocking", "requestHeaders"]);
  } else if (!strict && hasStrict) {
    browser.webRequest.onBeforeSendHeaders.removeListener(onBeforeSendHeaders);
  }
  browser.proxy.onRequest.removeListener(onProxyRequest);
  if (state.settings.relay !== "off" && state.notaries.length > 1) {
    const hosts = [...new Set(state.notaries.flatMap((n) => n.bundle.hosts.map((h) => h.host)))];
    const urls = hosts.map((h) => `https://${h.includes(":") ? `[${h}]` : h}/*`);
    browser.proxy.onRequest.addListener(onProxyRequest, { urls });
  }
}

let saveTimer = null;
function saveReliabilitySoon() {
  if (saveTimer !== null) return;
  saveTimer = setTimeout(() => {
    saveTimer = null;
    browser.storage.local.set({ reliability: reliability.toJSON() }).catch(() => {});
  }, 2000);
}

// -- the transport: the add-on's own requests to notaries ----------------------

function isOwn(details) {
  return (details.originUrl ?? "").startsWith(EXTENSION_BASE)
    || (details.documentUrl ?? "").startsWith(EXTENSION_BASE);
}

async function readBounded(response, limit) {
  const reader = response.body.getReader();
  const chunks = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.length;
    if (size > limit) {
      reader.cancel().catch(() => {});
      throw new TransportError(`answer larger than ${limit} bytes`);
    }
    chunks.push(value);
  }
  return new TextDecoder().decode(concatBytes(...chunks));
}

class StalledError extends Error {}

/** One request to a notary host, under timeoutMs, through relay if given;
 * its certificate is checked against the bundle's pins in
 * onHeadersReceived (checkNotaryResponse). A request whose response passed
 * that check but that fetch did not deliver within STALL_MS is sent once
 * more, within the same deadline: under load, with many responses held by
 * the add-on, Firefox ESR 153 now and then never delivers such a response
 * to the fetch (bench/bench_firefox.py saw one cold page load in about 20
 * wait for the whole 10 s deadline). */
async function transport(request) {
  const deadlineAt = Date.now() + request.timeoutMs;
  try {
    return await exchangeOnce(request, request.timeoutMs);
  } catch (error) {
    const left = deadlineAt - Date.now();
    if (!(error instanceof StalledError) || left <= 0) throw error;
    console.warn(`notary check: ${request.url}: the answer's headers came, the answer did not; asking again`);
  }
  try {
    return await exchangeOnce(request, deadlineAt - Date.now());
  } catch (error) {
    if (error instanceof StalledError) throw new TransportError("its answer stalled in Firefox twice");
    throw error;
  }
}

async function exchangeOnce({ url, method, body, contentType, relay }, timeoutMs) {
  const endpoint = targetKey(new URL(url).hostname, Number(new URL(url).port || 443));
  // The fragment (never sent) tells this request's response apart in
  // onHeadersReceived from others to the same URL.
  ownSequence += 1;
  const tagged = `${url}#notary-check-${ownSequence}`;
  const controller = new AbortController();
  const own = { pinned: null, stalled: false, stallTimer: null };
  own.headersPassed = () => {
    own.pinned = true;
    own.stallTimer = setTimeout(() => { own.stalled = true; controller.abort(); }, STALL_MS);
  };
  ownRequests.set(tagged, own);
  const timer = setTimeout(() => controller.abort(), timeoutMs);
  if (relay) {
    const route = relayRoutes.get(endpoint) ?? { relay, count: 0 };
    route.count += 1;
    relayRoutes.set(endpoint, route);
  }
  try {
    const response = await fetch(tagged, {
      method, body, headers: { "Content-Type": contentType }, signal: controller.signal,
      credentials: "omit", cache: "no-store", redirect: "error", referrerPolicy: "no-referrer",
    });
    clearTimeout(own.stallTimer);
    return { status: response.status, text: await readBounded(response, MAX_NOTARY_ANSWER_BYTES) };
  } catch (error) {
    if (error instanceof TransportError) throw error;
    if (own.pinned === false) throw new TransportError("its host presented a certificate its bundle does not pin");
    if (own.stalled) throw new StalledError();
    throw new TransportError(controller.signal.aborted ? `timed out after ${Math.round(timeoutMs)} ms`
      : relay ? `not reachable through the relay ${relay.name}` : "not reachable (connection or TLS failed)");
  } finally {
    clearTimeout(timer);
    clearTimeout(own.stallTimer);
    ownRequests.delete(tagged);
    if (relay) {
      const route = relayRoutes.get(endpoint);
      if (route && (route.count -= 1) <= 0) relayRoutes.delete(endpoint);
    }
  }
}

/** The add-on's own questions through a notary's bounce relay: the relay
 * learns who asks, the notary what is asked (README, "Bouncing"). */
function onProxyRequest(details) {
  if (!isOwn(details)) return undefined;
  let url;
  try {
    url = new URL(details.url);
  } catch {
    return undefined;
  }
  const route = relayRoutes.get(targetKey(url.hostname, Number(url.port || 443)));
  if (!route) return undefined;
  return { type: "http", host: route.relay.host, port: route.relay.port, failoverTimeout: 1 };
}

/** A response from a notary's host (host:port of a bundle): authenticated
 * by the bundle's pins, never by asking notaries (which would ask about
 * itself). The add-on's own request is cancelled when the pin does not
 * match; a page the user opens there is blocked the same way. Null: not a
 * notary's endpoint. */
async function checkNotaryResponse(details, url) {
  const endpoint = targetKey(url.hostname, Number(url.port || 443));
  const pins = state.endpoints.get(endpoint);
  if (!pins) return null;
  try {
    const info = await browser.webRequest.getSecurityInfo(details.requestId, {});
    const sha1 = String(info?.certificates?.[0]?.fingerprint?.sha1 ?? "").toUpperCase();
    if (pins.includes(sha1)) {
      if (!isOwn(details)) record(details, { host: url.hostname, port: Number(url.port || 443), status: "verified", words: "a notary you trust (its pinned certificate)" });
      ownRequests.get(details.url)?.headersPassed();
      return {};
    }
  } catch (error) {
    console.warn("notary check: cannot check a notary's certificate", error);
  }
  const own = ownRequests.get(details.url);
  if (own) own.pinned = false;
  else if (!isOwn(details)) record(details, { host: url.hostname, port: Number(url.port || 443), status: "blocked", words: "a notary's host presenting a certificate its bundle does not pin" });
  return { cancel: true };
}

// -- judging a response ---------------------------------------------------------

function tabState(tabId) {
  let tab = tabs.get(tabId);
  if (!tab) {
    tab = { url: null, main: null, resources: {}, blocked: 0, withheld: 0 };
    tabs.set(tabId, tab);
  }
  return tab;
}

const ICONS = {
  verified: "icons/verified.svg", blocked: "icons/blocked.svg", internal: "icons/internal.svg", unchecked: "icons/unchecked.svg",
};

function showOnButton(tabId) {
  if (tabId < 0) return;
  const tab = tabs.get(tabId);
  const main = tab?.main;
  let icon = "unchecked";
  let title = "Notary check: nothing checked in this tab";
  let badge = "";
  if (main) {
    title = `Notary check: ${main.host}:${main.port} ${main.words}`;
    if (main.status === "verified") icon = "verified";
    else if (main.status === "blocked") icon = "blocked";
    else if (main.status === Mark.INTERNAL || main.status === Mark.CAPTIVE) icon = "internal";
  }
  if (tab?.blocked) {
    badge = String(tab.blocked);
    title += `; ${tab.blocked} blocked`;
  }
  browser.browserAction.setIcon({ tabId, path: `/src/${ICONS[icon]}` }).catch(() => {});
  browser.browserAction.setTitle({ tabId, title }).catch(() => {});
  browser.browserAction.setBadgeText({ tabId, text: badge }).catch(() => {});
  browser.browserAction.setBadgeBackgroundColor({ tabId, color: "#c62828" }).catch(() => {});
}

function record(details, entry) {
  if (details.tabId < 0) return;
  const tab = tabState(details.tabId);
  if (details.type === "main_frame") {
    tab.url = details.url;
    tab.main = entry;
    tab.resources = {};
    tab.blocked = 0;
    tab.withheld = 0;
  } else {
    const key = `${entry.host}:${entry.port}`;
    const keys = Object.keys(tab.resources);
    if (!(key in tab.resources) && keys.length >= 64) delete tab.resources[keys[0]];
    const seen = tab.resources[key];
    tab.resources[key] = { ...entry, count: (seen?.count ?? 0) + 1 };
    if (entry.status !== "blocked") return; // the button shows the page and what was blocked
    tab.blocked += 1;
  }
  showOnButton(details.tabId);
}

/** The vote about (host, port, certificate): cached, joined, or asked
 * (now: at once, for a page's own document). */
function vote(entry, notaries, now) {
  const key = VerdictCache.key(entry.host, entry.port, entry.sha256);
  const cached = verdicts.lookup(entry.host, entry.port, entry.sha256);
  if (cached) return Promise.resolve(cached);
  let running = pending.get(key);
  if (!running) {
    running = checkCertificate(entry, notaries, state.clients, state.settings, { now }).then((report) => {
      for (const answer of report.answers) reliability.record(answer.notary, answer.verdict, report.checkedAt);
      saveReliabilitySoon();
      verdicts.remember(report);
      return report;
    }).finally(() => pending.delete(key));
    pending.set(key, running);
  }
  return running;
}

function certificateOf(leaf, hashes) {
  return {
    subject: leaf.subject, issuer: leaf.issuer, serialNumber: leaf.serialNumber,
    notBefore: leaf.validity?.start ?? null, notAfter: leaf.validity?.end ?? null, ...hashes,
  };
}

async function judge(details) {
  await ready;
  const url = new URL(details.url);
  const notary = await checkNotaryResponse(details, url);
  if (notary !== null) return notary;
  // The fast path asks Firefox for the certificate's SHA-256 fingerprint
  // only: a cached verdict needs no DER and no hashing. The DER is fetched
  // and hashed here (SHA-256, SHA-1, SPKI SHA-256) when notaries are asked
  // or a page is blocked.
  let info;
  try {
    info = await browser.webRequest.getSecurityInfo(details.requestId, {});
  } catch {
    return {};
  }
  const leaf = info?.certificates?.[0];
  if (!leaf || !["secure", "weak"].includes(info.state)) return {}; // Firefox's own error page
  const host = normaliseHost(url.hostname);
  const port = Number(url.port || 443);
  const sha256 = String(leaf.fingerprint?.sha256 ?? "").replaceAll(":", "").toLowerCase();
  const base = { host, port, sha256, url: details.url };
  const decision = decide({ host, ip: details.ip ?? null, captive: state.captive, settings: state.settings, notaries: state.notaries });
  const endpoint = `${host}:${port}`;
  if (trustedOnce.has(`${endpoint}:${sha256}`) || (state.alwaysTrust[targetKey(host, port)] ?? []).includes(sha256)) {
    sessionVerified.set(targetKey(host, port), sha256);
    record(details, { ...base, status: Mark.TRUSTED_BY_USER, words: "trusted by you (certificate exception)" });
    return {};
  }
  if (decision.action === "pass") {
    record(details, { ...base, status: decision.mark, words: decision.reason });
    return {};
  }
  let hashes = null;
  const hashed = async () => {
    if (!hashes) {
      const full = await browser.webRequest.getSecurityInfo(details.requestId, { rawDER: true });
      hashes = await certificateHashes(full.certificates[0].rawDER);
      if (hashes.sha256 !== sha256) throw new Error("the certificate's hash is not Firefox's fingerprint");
    }
    return hashes;
  };
  let report = verdicts.lookup(host, port, sha256);
  if (!report) {
    const { sha1 } = await hashed();
    report = await vote({ host, port, sha256, sha1 }, decision.notaries, details.type === "main_frame");
  }
  const action = actionFor(report.tally.outcome, state.settings);
  const words = `${summary(report)}${decision.scope.startsWith("organisation") ? ` (${decision.scope})` : ""}`;
  if (action === "allow") {
    if (report.tally.outcome === Outcome.VERIFIED) sessionVerified.set(targetKey(host, port), sha256);
    record(details, { ...base, status: report.tally.outcome === Outcome.VERIFIED ? "verified" : "unverified", words, report });
    return {};
  }
  reportSequence += 1;
  const id = `r${reportSequence}`;
  reports.set(id, { id, url: details.url, type: details.type, tabId: details.tabId, certificate: certificateOf(leaf, await hashed()), report, scope: decision.scope });
  record(details, { ...base, status: "blocked", words, report, reportId: id });
  if (details.type === "main_frame") {
    return { redirectUrl: browser.runtime.getURL(`src/pages/block.html?id=${id}`) };
  }
  return { cancel: true };
}

async function onHeadersReceived(details) {
  try {
    return await judge(details);
  } catch (error) {
    console.error("notary check: a response could not be judged", error);
    if (!isOwn(details)) {
      const url = new URL(details.url);
      record(details, { host: url.hostname, port: Number(url.port || 443), status: "error", words: `not checked: ${error.message}` });
    }
    return {};
  }
}

// -- strict mode: no credentials before the host is verified --------------------

/** Verify host:port before a request carrying credentials goes to it: a
 * request of the add-on's own, without credentials, whose response is
 * judged like any other. True when it verified. */
function preflight(host, port) {
  const key = targetKey(host, port);
  let running = preflights.get(key);
  if (!running) {
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(), state.settings.timeoutMs + PREFLIGHT_EXTRA_MS);
    const origin = `https://${host.includes(":") ? `[${host}]` : host}:${port}/`;
    running = fetch(origin, { method: "HEAD", credentials: "omit", cache: "no-store", redirect: "manual", signal: controller.signal })
      .catch(() => null)
      .then(() => sessionVerified.has(key))
      .finally(() => {
        clearTimeout(timer);
        preflights.delete(key);
      });
    preflights.set(key, running);
  }
  return running;
}

async function onBeforeSendHeaders(details) {
  await ready;
  if (!state.settings.strictMode || !state.settings.enabled || isOwn(details)) return {};
  const url = new URL(details.url);
  const host = normaliseHost(url.hostname);
  const port = Number(url.port || 443);
  if (sessionVerified.has(targetKey(host, port))) return {};
  const headers = details.requestHeaders ?? [];
  if (!headers.some((h) => CREDENTIAL_HEADERS.test(h.name))) return {};
  if (await preflight(host, port)) return {};
  if (details.tabId >= 0) {
    tabState(details.tabId).withheld += 1;
    showOnButton(details.tabId);
  }
  return { requestHeaders: headers.filter((h) => !CREDENTIAL_HEADERS.test(h.name)) };
}

// -- captive portals ------------------------------------------------------------

function onCaptiveState({ state: portal }) {
  state.captive = portal === "locked_portal";
}

async function watchCaptivePortal() {
  try {
    browser.captivePortal.onStateChanged.addListener(onCaptiveState);
    onCaptiveState({ state: await browser.captivePortal.getState() });
  } catch {
    state.captive = false; // detection off (network.captive-portal-service.enabled)
  }
}

// -- pages: popup, block page, options ------------------------------------------

async function addNotary(text, { replace = false } = {}) {
  const bundle = await parseBundle(text);
  const saved = await browser.storage.local.get("notaries");
  const stored = Array.isArray(saved.notaries) ? saved.notaries : [];
  const old = stored.find((n) => n.name === bundle.name);
  if (old && !replace) {
    const oldPins = describePins(await parseBundle(old.text)).join("\n");
    if (oldPins !== describePins(bundle).join("\n")) {
      return { error: `a notary named ${bundle.name} is already trusted with other pins: replace it explicitly`, oldPins };
    }
  }
  const notaries = [...stored.filter((n) => n.name !== bundle.name), { name: bundle.name, text, addedAt: Date.now() }];
  await browser.storage.local.set({ notaries });
  return { added: bundle.name };
}

async function preview({ text, url }) {
  if (url) {
    const target = new URL(url);
    if (target.protocol !== "https:") throw new BundleError("a bundle is fetched over https:// only");
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(), state.settings.timeoutMs);
    try {
      const response = await fetch(target, { credentials: "omit", cache: "no-store", signal: controller.signal });
      if (!response.ok) throw new BundleError(`HTTP ${response.status}`);
      text = await readBounded(response, MAX_BUNDLE_BYTES);
    } finally {
      clearTimeout(timer);
    }
  }
  const bundle = await parseBundle(text);
  return { name: bundle.name, region: bundle.region, pins: describePins(bundle), protocol: protocolOf(bundle), text };
}

function optionsView() {
  return {
    settings: state.settings,
    notaries: state.notaries.map((n) => ({
      name: n.name, location: n.bundle.location, region: n.bundle.region, protocol: protocolOf(n.bundle),
      pins: describePins(n.bundle), reliability: reliability.summary(n.name),
    })),
    alwaysTrust: state.alwaysTrust,
    captive: state.captive,
  };
}

async function trust(host, port, sha256, scope) {
  if (scope === "always") {
    const key = targetKey(host, port);
    const list = [...new Set([...(state.alwaysTrust[key] ?? []), sha256])].slice(-8);
    const alwaysTrust = { ...state.alwaysTrust, [key]: list };
    await browser.storage.local.set({ alwaysTrust });
  } else {
    trustedOnce.set(`${host}:${port}:${sha256}`, true);
  }
}

async function onMessage(message) {
  switch (message?.type) {
    case "tab-state": {
      // By id (the toolbar's popup), or the tab that last loaded a URL.
      const tab = message.url ? [...tabs.map.values()].map((i) => i.value).reverse().find((t) => t.url === message.url) ?? null
        : tabs.get(message.tabId) ?? null;
      return { tab, notaries: state.notaries.length, settings: state.settings, captive: state.captive };
    }
    case "report":
      return reports.get(message.id) ?? null;
    case "trust-report": {
      const saved = reports.get(message.id);
      if (!saved) return { error: "this report is no longer kept: load the page again" };
      await trust(saved.report.host, saved.report.port, saved.report.sha256, message.scope);
      return { url: saved.url };
    }
    case "trust-tab": {
      const main = tabs.get(message.tabId)?.main;
      if (!main?.sha256) return { error: "nothing to trust in this tab" };
      await trust(main.host, main.port, main.sha256, message.scope);
      return { url: tabs.get(message.tabId).url };
    }
    case "options":
      return optionsView();
    case "preview-bundle":
      try {
        return await preview(message);
      } catch (error) {
        return { error: error.message };
      }
    case "add-notary":
      try {
        return await addNotary(message.text, { replace: Boolean(message.replace) });
      } catch (error) {
        return { error: error.message };
      }
    case "remove-notary": {
      const saved = await browser.storage.local.get("notaries");
      await browser.storage.local.set({ notaries: (saved.notaries ?? []).filter((n) => n.name !== message.name) });
      return { removed: message.name };
    }
    case "forget-trust": {
      const alwaysTrust = { ...state.alwaysTrust };
      delete alwaysTrust[message.key];
      await browser.storage.local.set({ alwaysTrust });
      return { forgotten: message.key };
    }
    case "save-settings":
      await browser.storage.local.set({ settings: normaliseSettings({ ...state.settings, ...message.settings }) });
      return { saved: true };
    case "export": {
      const saved = await browser.storage.local.get(["settings", "notaries", "alwaysTrust"]);
      return { settings: state.settings, notaries: (saved.notaries ?? []).map((n) => n.text), alwaysTrust: saved.alwaysTrust ?? {} };
    }
    case "import":
      return importSettings(message.document);
    default:
      return undefined;
  }
}

/** Settings, notaries (bundle texts) and certificate exceptions from an
 * exported document; every bundle is parsed before anything is kept. */
async function importSettings(document) {
  try {
    const data = typeof document === "string" ? JSON.parse(document) : document;
    const notaries = [];
    for (const text of Array.isArray(data.notaries) ? data.notaries : []) {
      const bundle = await parseBundle(typeof text === "string" ? text : JSON.stringify(text));
      notaries.push({ name: bundle.name, text: bundle.text, addedAt: Date.now() });
    }
    const alwaysTrust = data.alwaysTrust && typeof data.alwaysTrust === "object" ? data.alwaysTrust : {};
    await browser.storage.local.set({ settings: normaliseSettings(data.settings ?? {}), notaries, alwaysTrust });
    await load();
    return { imported: notaries.length };
  } catch (error) {
    return { error: error.message };
  }
}

// -- start ------------------------------------------------------------------------

browser.storage.onChanged.addListener((changes, area) => {
  if (area === "local" && (changes.settings || changes.notaries || changes.alwaysTrust)) load().catch(console.error);
});
browser.tabs.onRemoved.addListener((tabId) => tabs.delete(tabId));
browser.runtime.onMessage.addListener(onMessage);
browser.webRequest.onHeadersReceived.addListener(onHeadersReceived, { urls: ["https://*/*", "wss://*/*"] }, ["blocking"]);
watchCaptivePortal();
const ready = load().catch((error) => console.error("notary check: settings could not be loaded", error));
