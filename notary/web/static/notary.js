// The live parts of the notary's pages; every page works without them.
// Loaded as an external file (the CSP forbids inline scripts); it writes
// text with textContent only, never markup from the network, except the
// #history section re-fetched from this same origin (server-rendered and
// escaped there) and parsed inert with DOMParser.
"use strict";

(function () {
  const body = document.body;

  function now() {
    return new Date().toLocaleTimeString();
  }

  function formatFigure(key, value) {
    if (value === null || value === undefined) return "n/a";
    if (key === "cache_hit_ratio") return (value * 100).toFixed(1) + " %";
    if (key === "uptime_s") {
      let minutes = Math.floor(value / 60);
      const days = Math.floor(minutes / 1440);
      const hours = Math.floor(minutes / 60) % 24;
      minutes = minutes % 60;
      return days ? days + "d " + hours + "h " + minutes + "m" : hours + "h " + minutes + "m";
    }
    if (key === "targets_known") return Math.floor(value).toLocaleString("en-US");
    return Number(value).toFixed(1);
  }

  // One WebSocket to /v2/ws, reopened with back-off; `subscriptions`
  // returns the messages to send each time it opens.
  function liveSocket(subscriptions, onMessage, onState) {
    const url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/v2/ws";
    let socket = null;
    let delay = 1000;
    function open() {
      socket = new WebSocket(url);
      socket.addEventListener("open", function () {
        delay = 1000;
        onState(true);
        for (const message of subscriptions()) socket.send(JSON.stringify(message));
      });
      socket.addEventListener("message", function (event) {
        let message;
        try { message = JSON.parse(event.data); } catch (_) { return; }
        onMessage(message);
      });
      socket.addEventListener("close", function () {
        onState(false);
        setTimeout(open, delay);
        delay = Math.min(delay * 2, 30000);
      });
    }
    open();
    return {
      send: function (message) {
        if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(message));
      },
    };
  }

  function startFigures() {
    const status = document.getElementById("figures-status");
    liveSocket(
      function () { return [{ type: "figures", id: "figures" }]; },
      function (message) {
        if (message.type !== "figures" || !message.figures) return;
        for (const cell of document.querySelectorAll("[data-figure]")) {
          const key = cell.getAttribute("data-figure");
          if (key in message.figures) cell.textContent = formatFigure(key, message.figures[key]);
        }
        if (status) status.textContent = "Live: updated at " + now() + ".";
      },
      function (connected) {
        if (!connected && status) status.textContent = "Live updates paused: reconnecting…";
      }
    );
  }

  async function refreshHistory() {
    const response = await fetch(location.pathname, { headers: { Accept: "text/html" } });
    if (!response.ok) return false;
    const parsed = new DOMParser().parseFromString(await response.text(), "text/html");
    const fresh = parsed.getElementById("history");
    const current = document.getElementById("history");
    if (!fresh || !current) return false;
    current.replaceWith(document.importNode(fresh, true));
    return true;
  }

  function startSite() {
    const status = document.getElementById("live-status");
    const form = document.getElementById("check-form");
    const say = function (text) { if (status) status.textContent = text; };
    if (form) {
      form.addEventListener("submit", async function (event) {
        event.preventDefault();
        const button = form.querySelector("button");
        button.disabled = true;
        say("Checking…");
        try {
          const response = await fetch(form.action, {
            method: "POST",
            headers: { Accept: "application/json" },
          });
          let answer = {};
          try { answer = await response.json(); } catch (_) { /* not JSON */ }
          await refreshHistory();
          say(answer.message || "The check failed (HTTP " + response.status + ").");
        } catch (_) {
          say("The check failed: the notary could not be reached.");
        } finally {
          button.disabled = false;
        }
      });
    }
    const toggle = document.getElementById("watch");
    if (!toggle) return;
    toggle.closest("[hidden]").hidden = false;
    const target = { host: body.getAttribute("data-host"), port: Number(body.getAttribute("data-port")) };
    let live = null;
    function subscriptions() {
      return toggle.checked ? [Object.assign({ type: "watch", id: "watch" }, target)] : [];
    }
    function onMessage(message) {
      if (message.type === "watching") say("Watching: changes show here as they are observed.");
      if (message.type === "unwatched") say("Not watching.");
      if (message.type === "error") say("The notary refused the watch: " + message.message);
      if (message.type === "observation") {
        refreshHistory().then(function () {
          say("A new certificate was observed at " + now() + ".");
        });
      }
    }
    toggle.addEventListener("change", function () {
      if (!live) {
        live = liveSocket(subscriptions, onMessage, function () {});
        return;
      }
      live.send(Object.assign({ type: toggle.checked ? "watch" : "unwatch", id: "watch" }, target));
    });
    if (toggle.checked) live = liveSocket(subscriptions, onMessage, function () {});
  }

  const page = body.getAttribute("data-page");
  if (page === "index" && body.hasAttribute("data-figures-interval")) startFigures();
  if (page === "site") startSite();
})();
