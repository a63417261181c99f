import { answerRows, date, el, send } from "./common.js";

const id = new URLSearchParams(location.search).get("id");

function row(list, term, value, hash = false) {
  list.append(el("dt", {}, term), el("dd", hash ? { class: "hash" } : {}, value ?? "-"));
}

async function show() {
  const saved = await send({ type: "report", id });
  if (!saved) {
    document.getElementById("lead").textContent = "This report is no longer kept: go back and load the page again.";
    return;
  }
  const { report, certificate } = saved;
  document.title = `Blocked: ${report.host}`;
  const site = document.getElementById("site");
  row(site, "Address", saved.url);
  row(site, "Checked as", `${report.host}:${report.port} by ${saved.scope}`);
  const cert = document.getElementById("certificate");
  row(cert, "Subject", certificate.subject);
  row(cert, "Issuer", certificate.issuer);
  row(cert, "Valid", `${date(certificate.notBefore / 1000)} to ${date(certificate.notAfter / 1000)}`);
  row(cert, "SHA-256", certificate.sha256, true);
  row(cert, "SHA-1", certificate.sha1, true);
  row(cert, "SPKI SHA-256", certificate.spkiSha256, true);
  document.getElementById("answers").append(...answerRows(report));
  const t = report.tally;
  document.getElementById("vote").textContent =
    `${t.successes} of ${t.counted} counted notaries vouch (threshold: ${report.threshold}${report.strictVote ? ", silent notaries count against" : ""}); ${t.stoodAside} stood aside${report.relay ? `; asked through the relay ${report.relay}` : ""}.`;
}

async function trust(scope) {
  const answer = await send({ type: "trust-report", id, scope });
  if (answer.error) document.getElementById("error").textContent = answer.error;
  else location.replace(answer.url);
}

document.getElementById("back").addEventListener("click", () => {
  if (history.length > 1) history.back();
  else location.replace("about:blank");
});
document.getElementById("once").addEventListener("click", () => trust("once"));
document.getElementById("always").addEventListener("click", () => {
  if (confirm("Always accept this certificate for this site, whatever your notaries say?")) trust("always");
});
show();
