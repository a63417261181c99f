// Helpers of the add-on's pages (popup, block page, options). Text goes in
// with textContent only: what a notary or a site sends is never markup.

export function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (name === "class") node.className = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function ago(seconds, now = Date.now() / 1000) {
  if (seconds === null || seconds === undefined) return "-";
  const delta = Math.max(0, Math.round(now - seconds));
  if (delta < 120) return `${delta} s ago`;
  if (delta < 7200) return `${Math.round(delta / 60)} min ago`;
  if (delta < 172800) return `${Math.round(delta / 3600)} h ago`;
  return `${Math.round(delta / 86400)} days ago`;
}

export function date(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  return new Date(seconds * 1000).toISOString().replace("T", " ").slice(0, 16) + " UTC";
}

export function short(hex, length = 16) {
  return hex ? `${hex.slice(0, length)}…` : "-";
}

export const VERDICT_WORDS = {
  success: "vouches",
  failure: "objects",
  inconclusive: "cannot tell",
  "connectivity-failure": "no answer",
};

/** A table row per notary of a report: name, verdict, what it saw, since when. */
export function answerRows(report) {
  return report.answers.map((answer) => {
    const seen = answer.observations.slice(0, 3).map((o) =>
      `${o.sha256 ? "SHA-256 " + short(o.sha256) : "SHA-1 " + short(o.sha1)} seen ${date(o.firstSeen)} to ${date(o.lastSeen)}`);
    return el("tr", { class: `verdict-${answer.verdict}` },
      el("td", {}, answer.notary, answer.via ? el("div", { class: "muted" }, `via relay ${answer.via}`) : null),
      el("td", {}, VERDICT_WORDS[answer.verdict] ?? answer.verdict),
      el("td", {}, seen.length ? seen.map((line) => el("div", {}, line)) : "-"),
      el("td", {}, seenWords(answer)),
      el("td", { class: "muted" }, answer.detail || ""));
  });
}

function seenWords(answer) {
  if (answer.seenSince) return `seen since ${date(answer.seenSince)}`;
  return answer.observations.length ? "never seen" : "-";
}

/** The popup's shorter rows: name, verdict, this certificate, detail. */
export function compactRows(report) {
  return report.answers.map((answer) => el("tr", { class: `verdict-${answer.verdict}` },
    el("td", {}, answer.notary, answer.via ? el("div", { class: "muted" }, `via relay ${answer.via}`) : null),
    el("td", {}, VERDICT_WORDS[answer.verdict] ?? answer.verdict),
    el("td", {}, seenWords(answer), answer.detail ? el("div", { class: "muted" }, answer.detail) : null)));
}

export function send(message) {
  return browser.runtime.sendMessage(message);
}
