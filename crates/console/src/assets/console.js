// cairn console: the live event table of a run page (server-sent events from WatchRun).
// Every value is inserted with textContent: nothing from an event is ever parsed as HTML.
"use strict";
(function () {
  const table = document.getElementById("event-table");
  if (!table || !window.EventSource) return;
  const body = table.tBodies[0];
  const status = document.getElementById("events-status");
  const renderedSeq = Number(table.dataset.seq || "0");
  const finalTypes = { "task.completed": "completed", "task.failed": "failed", "task.canceled": "canceled" };
  const stateOf = Object.assign(
    { "task.created": "created", "task.working": "working", "task.resumed": "working", "task.input-required": "input-required" },
    finalTypes
  );
  const badgeClass = {
    completed: "badge ok", failed: "badge bad", canceled: "badge bad",
    "input-required": "badge wait", working: "badge busy", created: "badge"
  };
  let warned = false;

  function say(text) {
    if (status) status.textContent = text;
  }

  function details(data) {
    if (data === null || typeof data !== "object") return String(data);
    return Object.keys(data)
      .map(function (k) {
        const v = data[k];
        return k + ": " + (typeof v === "string" ? v : JSON.stringify(v));
      })
      .join(" · ");
  }

  function setState(state) {
    const holder = document.getElementById("run-state");
    if (!holder) return;
    const badge = document.createElement("span");
    badge.className = badgeClass[state] || "badge";
    badge.textContent = state;
    holder.replaceChildren(badge);
    holder.dataset.state = state;
  }

  function warnStale() {
    if (warned) return;
    warned = true;
    const p = document.createElement("p");
    p.className = "flash ok";
    p.id = "stale-notice";
    p.append("The run moved on since this page was loaded. ");
    const a = document.createElement("a");
    a.href = window.location.pathname;
    a.textContent = "Reload";
    p.append(a, " to see its gates and files now.");
    table.parentNode.insertBefore(p, table);
  }

  const source = new EventSource(table.dataset.src);
  source.onopen = function () { say("Live: new events appear as they happen."); };
  source.addEventListener("run-event", function (m) {
    let ev;
    try { ev = JSON.parse(m.data); } catch (e) { return; }
    const tr = document.createElement("tr");
    tr.className = "level-" + ev.level;
    tr.dataset.type = ev.type;
    // The time of day is enough in the table; the whole timestamp is the cell's tooltip.
    const ts = String(ev.ts || "");
    const time = ts.length >= 19 ? ts.slice(11, 23).replace(/Z$/, "") : ts;
    [String(ev.seq), time, ev.type, ev.node_id, details(ev.data)].forEach(function (text, i) {
      const td = document.createElement("td");
      td.className = ["num", "nowrap", "nowrap", "nowrap", "details"][i];
      if (i === 1) td.title = ts;
      td.textContent = text || "";
      tr.appendChild(td);
    });
    body.appendChild(tr);
    // The page was rendered with the state as of event `renderedSeq`: replayed older events
    // must not move the badge back.
    const state = stateOf[ev.type];
    if (state && ev.seq > renderedSeq) setState(state);
    if (ev.seq > renderedSeq && renderedSeq > 0 && (ev.type.indexOf("gate.") === 0 || finalTypes[ev.type])) warnStale();
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
})();
