// cairn console: keeps pages live without a framework.
// - Run page: new events arrive as server-sent events (WatchRun in follow mode; the stream
//   stays open past the run's end) and are appended to the event table; after each, the page
//   is fetched again and every part marked data-live that changed is replaced.
// - Runs list: fetched again every few seconds, its data-live parts replaced the same way.
// - Node panels of the run page: each pre.log listens to its node's output (server-sent `log`
//   messages) and appends it as text; a node that starts again (rework, resume) reconnects.
// Markup inserted here is the server's own (maud escapes every value); nothing from an event's
// fields is ever parsed as HTML on its own, and log output only ever becomes textContent.
"use strict";
(function () {
  const RUNS_EVERY_MS = 4000;

  // A part someone is using (a form field focused or edited) is left alone for now.
  function busy(el) {
    const active = document.activeElement;
    if (active && el.contains(active) && /^(TEXTAREA|INPUT|SELECT)$/.test(active.tagName)) return true;
    const fields = el.querySelectorAll("textarea, input[type=text], select");
    for (const f of fields) {
      if (f.tagName === "SELECT") {
        if (f.multiple) {
          for (const o of f.options) if (o.selected !== o.defaultSelected) return true;
        } else {
          // Without a `selected` option the first one is the default.
          let initial = 0;
          for (let i = 0; i < f.options.length; i++) if (f.options[i].defaultSelected) initial = i;
          if (f.options.length && f.selectedIndex !== initial) return true;
        }
      } else if (f.value !== f.defaultValue) return true;
    }
    return false;
  }

  // Folded details the reader opened stay open when their part is replaced.
  function keepOpen(from, to) {
    const open = Array.from(from.querySelectorAll("details[open]"), function (d) { return d.textContent; });
    to.querySelectorAll("details").forEach(function (d) {
      if (open.indexOf(d.textContent) >= 0) d.open = true;
    });
  }

  let inFlight = false;
  let again = false;
  function refresh() {
    if (inFlight) { again = true; return; }
    inFlight = true;
    fetch(window.location.pathname + window.location.search, {
      credentials: "same-origin",
      headers: { "X-Cairn-Live": "1" },
    })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (text) {
        if (!text) return;
        const fresh = new DOMParser().parseFromString(text, "text/html");
        fresh.querySelectorAll("[data-live]").forEach(function (part) {
          const old = document.getElementById(part.id);
          if (!old || busy(old) || old.innerHTML === part.innerHTML) return;
          const node = document.importNode(part, true);
          keepOpen(old, node);
          old.replaceWith(node);
        });
      })
      .catch(function () { /* the next event or tick tries again */ })
      .finally(function () {
        inFlight = false;
        if (again) { again = false; refresh(); }
      });
  }

  let timer = null;
  // Soon after an event, and once more a little later (snapshots may lag the event).
  function refreshSoon() {
    if (timer) clearTimeout(timer);
    timer = setTimeout(function () { timer = null; refresh(); setTimeout(refresh, 1500); }, 250);
  }

  // Node output: appended as text only (it is whatever the program printed).
  const logSources = {};
  function followLog(pre) {
    const node = pre.closest("[data-node]");
    if (!node || !window.EventSource) return;
    const id = node.dataset.node;
    if (logSources[id]) return;
    const status = document.getElementById("log-status-" + id);
    const say = function (text) { if (status) status.textContent = text; };
    const after = pre.dataset.after || "";
    const source = new EventSource(pre.dataset.src + (after ? "?after=" + encodeURIComponent(after) : ""));
    logSources[id] = source;
    source.onopen = function () { say("Live: new output appears as it is printed."); };
    source.addEventListener("log", function (m) {
      let c;
      try { c = JSON.parse(m.data); } catch (e) { return; }
      const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      (c.pieces || []).forEach(function (p) {
        const span = document.createElement("span");
        span.className = /^(stdout|stderr|step|note)$/.test(p.class) ? p.class : "note";
        span.textContent = String(p.text || "");
        pre.appendChild(span);
      });
      if (m.lastEventId) pre.dataset.after = m.lastEventId;
      if (atBottom) pre.scrollTop = pre.scrollHeight;
    });
    source.addEventListener("end", function () {
      source.close();
      delete logSources[id];
      say("The output is complete.");
    });
    source.onerror = function () {
      if (source.readyState === EventSource.CLOSED) {
        delete logSources[id];
        say("The output stream is unavailable; reload the page to retry.");
      } else say("Connection lost; reconnecting…");
    };
  }
  document.querySelectorAll("pre.log[data-src]").forEach(followLog);

  const table = document.getElementById("event-table");
  if (table && window.EventSource) {
    const body = table.tBodies[0];
    const status = document.getElementById("events-status");
    const say = function (text) { if (status) status.textContent = text; };
    const source = new EventSource(table.dataset.src);
    source.onopen = function () { say("Live: new events appear as they happen, also after the run ends."); };
    source.addEventListener("run-event", function (m) {
      let ev;
      try { ev = JSON.parse(m.data); } catch (e) { return; }
      if (document.getElementById("ev-" + ev.seq)) return;
      const t = document.createElement("template");
      t.innerHTML = String(ev.row || "");
      const row = t.content.firstElementChild;
      if (row) body.appendChild(row);
      if (ev.type === "node.started") {
        const pre = document.getElementById("log-" + ev.node_id);
        if (pre) followLog(pre);
      }
      refreshSoon();
    });
    source.addEventListener("end", function (m) {
      source.close();
      let reason = "";
      try { reason = JSON.parse(m.data).reason || ""; } catch (e) { reason = ""; }
      say("Stream closed: " + reason);
    });
    source.onerror = function () {
      if (source.readyState === EventSource.CLOSED) say("The event stream is unavailable; reload the page to retry.");
      else say("Connection lost; reconnecting…");
    };
  }

  if (document.getElementById("runs-live")) {
    setInterval(function () { if (!document.hidden) refresh(); }, RUNS_EVERY_MS);
  }
})();
