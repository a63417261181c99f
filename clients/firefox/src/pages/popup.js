import { compactRows, el, send } from "./common.js";

const STATUS = {
  verified: "Verified",
  blocked: "Blocked",
  unverified: "Not verified",
  internal: "Internal site",
  "captive-portal": "Captive portal",
  "trusted-by-user": "Trusted by you",
  "no-notaries": "No notaries",
  paused: "Paused",
  error: "Not checked",
};

async function currentTab() {
  const fromQuery = new URLSearchParams(location.search).get("tab");
  if (fromQuery !== null) return Number(fromQuery);
  const [tab] = await browser.tabs.query({ active: true, currentWindow: true });
  return tab?.id ?? -1;
}

async function show() {
  const url = new URLSearchParams(location.search).get("url");
  const tabId = url ? -1 : await currentTab();
  const { tab, notaries, captive } = await send({ type: "tab-state", tabId, url });
  const status = document.getElementById("status");
  const words = document.getElementById("words");
  const main = tab?.main;
  if (!main) {
    status.textContent = "Nothing checked in this tab";
    words.textContent = notaries ? `${notaries} notaries configured` : "No notary is configured yet.";
  } else {
    status.textContent = `${STATUS[main.status] ?? main.status}: ${main.host}:${main.port}`;
    status.className = `status-${main.status}`;
    words.textContent = main.words + (captive ? " (a captive portal is locked)" : "");
    if (main.report) {
      const table = document.getElementById("notaries");
      table.tBodies[0].append(...compactRows(main.report));
      table.hidden = false;
    }
    if (main.status !== "verified" && main.sha256) {
      document.getElementById("actions").append(
        el("button", { onclick: () => trust(tabId, "once") }, "Trust this certificate once"),
        el("button", { class: "danger", onclick: () => trust(tabId, "always") }, "Always for this site"));
    }
  }
  const resources = Object.values(tab?.resources ?? {});
  if (resources.length) {
    const verified = resources.filter((r) => r.status === "verified").length;
    document.getElementById("resources").textContent =
      `Sub-resources from ${resources.length} host${resources.length === 1 ? "" : "s"}: ${verified} verified, ${tab.blocked} requests blocked`
      + (tab.withheld ? `, credentials withheld from ${tab.withheld} requests (strict mode)` : "") + ".";
    const others = resources.filter((r) => r.status !== "verified").slice(0, 8);
    if (others.length) {
      document.getElementById("resources").after(el("ul", { id: "unverified", class: "muted" },
        others.map((r) => el("li", {}, `${r.host}:${r.port}: ${r.words}`,
          r.report ? ` (${r.report.answers.map((a) => `${a.notary}: ${a.detail || a.verdict}`).join("; ")})` : ""))));
    }
  }
}

async function trust(tabId, scope) {
  const answer = await send({ type: "trust-tab", tabId, scope });
  if (answer.url) await browser.tabs.update(tabId, { url: answer.url });
  window.close();
}

document.getElementById("options").addEventListener("click", (event) => {
  event.preventDefault();
  browser.runtime.openOptionsPage();
});
show();
