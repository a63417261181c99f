import { ago, el, send } from "./common.js";

let previewed = null;
const $ = (id) => document.getElementById(id);

function notaryCard(notary) {
  const r = notary.reliability;
  const reliability = r.asked
    ? `last ${r.asked} questions: ${r.success} vouched, ${r.failure} objected, ${r.inconclusive} could not tell, ${r.connectivityFailure} unanswered; last answer ${ago(r.last.at)}`
    : "not asked yet";
  return el("div", { class: "card notary" },
    el("strong", { class: "notary-name" }, notary.name),
    el("span", { class: "muted" }, ` ${notary.protocol === "v2" ? "v2 API (Ed25519)" : "Convergence API (RSA)"}${notary.region ? `, ${notary.region}` : ""}`),
    el("ul", {}, notary.pins.map((pin) => el("li", { class: "hash" }, pin))),
    el("div", { class: "muted reliability" }, reliability),
    el("button", { class: "danger", onclick: async () => {
      if (confirm(`Stop trusting ${notary.name}?`)) {
        await send({ type: "remove-notary", name: notary.name });
        setTimeout(show, 100);
      }
    } }, "Remove"));
}

async function show() {
  const view = await send({ type: "options" });
  const list = $("notaries");
  list.replaceChildren(...(view.notaries.length ? view.notaries.map(notaryCard) : [el("p", {}, "No notary yet: add one below.")]));
  const s = view.settings;
  $("quorum").value = s.quorum;
  $("threshold").value = s.threshold;
  $("strictVote").checked = s.strictVote;
  $("onInconclusive").value = s.onInconclusive;
  $("timeoutMs").value = s.timeoutMs;
  $("relay").replaceChildren(el("option", { value: "off" }, "no relay (ask directly)"),
    el("option", { value: "auto" }, "a spare notary, chosen at random"),
    ...view.notaries.map((n) => el("option", { value: n.name }, n.name)));
  $("relay").value = s.relay;
  $("checkInternalAddresses").checked = s.checkInternalAddresses;
  $("internalDomains").value = s.internalDomains.map((r) => r.notaries.length ? `${r.domain} = ${r.notaries.join(", ")}` : r.domain).join("\n");
  $("strictMode").checked = s.strictMode;
  $("enabled").checked = s.enabled;
  const exceptions = Object.entries(view.alwaysTrust);
  $("exceptions").replaceChildren(...(exceptions.length ? exceptions.map(([key, hashes]) => el("div", { class: "card" },
    el("strong", {}, key), el("ul", {}, hashes.map((h) => el("li", { class: "hash" }, `SHA-256 ${h}`))),
    el("button", { onclick: async () => { await send({ type: "forget-trust", key }); setTimeout(show, 100); } }, "Forget"))) : [el("p", { class: "muted" }, "None.")]));
}

function showPreview(answer) {
  $("add-error").textContent = answer.error ?? "";
  if (answer.error) return;
  previewed = answer;
  $("preview-name").textContent = answer.name;
  $("preview-protocol").textContent = `${answer.protocol === "v2" ? "Asked with the v2 API, answers verified with the Ed25519 keys below" : "Asked with the Convergence API, answers verified with the certificates below"}. Compare these pins with the operator's before trusting it:`;
  $("preview-pins").replaceChildren(...answer.pins.map((pin) => el("li", { class: "hash" }, pin)));
  $("preview").hidden = false;
}

$("fetch").addEventListener("click", async () => showPreview(await send({ type: "preview-bundle", url: $("bundle-url").value })));
$("bundle-file").addEventListener("change", async () => {
  const file = $("bundle-file").files[0];
  if (file) showPreview(await send({ type: "preview-bundle", text: await file.text() }));
});
$("cancel").addEventListener("click", () => { $("preview").hidden = true; previewed = null; });
$("accept").addEventListener("click", async () => {
  let answer = await send({ type: "add-notary", text: previewed.text });
  if (answer.error && answer.oldPins && confirm(`${answer.error}\n\nTrusted pins:\n${answer.oldPins}\n\nReplace them?`)) {
    answer = await send({ type: "add-notary", text: previewed.text, replace: true });
  }
  $("add-error").textContent = answer.error ?? "";
  if (!answer.error) {
    $("preview").hidden = true;
    setTimeout(show, 100);
  }
});
$("save").addEventListener("click", async () => {
  const internalDomains = $("internalDomains").value.split("\n").map((line) => line.trim()).filter(Boolean).map((line) => {
    const [domain, names = ""] = line.split("=");
    return { domain: domain.trim(), notaries: names.split(",").map((n) => n.trim()).filter(Boolean) };
  });
  await send({ type: "save-settings", settings: {
    quorum: Number($("quorum").value), threshold: $("threshold").value, strictVote: $("strictVote").checked,
    onInconclusive: $("onInconclusive").value, timeoutMs: Number($("timeoutMs").value), relay: $("relay").value,
    checkInternalAddresses: $("checkInternalAddresses").checked, internalDomains,
    strictMode: $("strictMode").checked, enabled: $("enabled").checked,
  } });
  $("saved").textContent = "saved";
  setTimeout(show, 100);
});
$("export").addEventListener("click", async () => { $("document").value = JSON.stringify(await send({ type: "export" }), null, 1); });
$("import").addEventListener("click", async () => {
  const answer = await send({ type: "import", document: $("document").value });
  $("import-result").textContent = answer.error ? `not imported: ${answer.error}` : `imported ${answer.imported} notaries`;
  setTimeout(show, 100);
});
show();
