// cairn console: keeps pages live without a framework.
// - Run page: new events arrive as server-sent events (WatchRun in follow mode; the stream
//   stays open past the run's end) and are appended to the event table; after each, the page
//   is fetched again and every part marked data-live that changed is replaced.
// - Runs list: fetched again every few seconds, its data-live parts replaced the same way.
// - Node panels of the run page: each pre.log listens to its node's output (server-sent `log`
//   messages) and appends it as text; a node that starts again (rework, resume) reconnects.
//   A panel "follows" (stays at its last line) while its switch is on; scrolling up turns it
//   off. Panels of map items that start later are added as they appear.
// - Graph: zoom (wheel, buttons, + − 0 keys) and pan (drag, arrow keys); a click on a node
//   opens its panel beside the graph.
// - Long tables show their first rows and a "show all" button (on narrow screens).
// - Live fetches send the last ETag; an unchanged page answers 304 with no body.
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

  // Folded details the reader opened stay open, and boxes they ticked (runs picked for a
  // comparison) stay ticked, when their part is replaced.
  function keepOpen(from, to) {
    const open = Array.from(from.querySelectorAll("details[open]"), function (d) { return d.textContent; });
    to.querySelectorAll("details").forEach(function (d) {
      if (open.indexOf(d.textContent) >= 0) d.open = true;
    });
    const key = function (c) { return c.name + "=" + c.value; };
    const ticked = Array.from(from.querySelectorAll("input[type=checkbox]:checked"), key);
    to.querySelectorAll("input[type=checkbox]").forEach(function (c) {
      if (ticked.indexOf(key(c)) >= 0) c.checked = true;
    });
  }

  let inFlight = false;
  let again = false;
  let etag = null;
  function refresh() {
    if (inFlight) { again = true; return; }
    inFlight = true;
    const headers = { "X-Cairn-Live": "1" };
    if (etag) headers["If-None-Match"] = etag;
    fetch(window.location.pathname + window.location.search, {
      credentials: "same-origin",
      headers: headers,
    })
      .then(function (r) {
        if (!r.ok) return null;
        etag = r.headers.get("ETag") || null;
        return r.text();
      })
      .then(function (text) {
        if (!text) return;
        const fresh = new DOMParser().parseFromString(text, "text/html");
        fresh.querySelectorAll("[data-live]").forEach(function (part) {
          const old = document.getElementById(part.id);
          if (!old || busy(old) || old.innerHTML === part.innerHTML) return;
          const node = document.importNode(part, true);
          keepOpen(old, node);
          const shown = Array.from(old.querySelectorAll("table.all[id]"), function (t) { return t.id; });
          old.replaceWith(node);
          shown.forEach(function (id) { const t = document.getElementById(id); if (t) t.classList.add("all"); });
          collapse(node);
          if (node.id === "graph-live") applyZoom();
        });
        // Panels of nodes that started since (map items): added, and listening.
        const logs = document.getElementById("logs-section");
        if (logs) {
          fresh.querySelectorAll("details.node-panel").forEach(function (panel) {
            if (document.getElementById(panel.id)) return;
            const none = document.getElementById("logs-none");
            if (none) none.remove();
            const node = document.importNode(panel, true);
            logs.appendChild(node);
            node.querySelectorAll("pre.log[data-src]").forEach(followLog);
          });
        }
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

  // Terminal colours: SGR sequences become classes from a fixed set; other escapes go.
  const ESC = /\u001b(?:\[([0-9;]*)([@-~])|\][^\u0007\u001b]*(?:\u0007|\u001b\\)?|[@-Z\\-_]?)/g;
  function sgr(style, params) {
    const codes = params === "" ? [0] : params.split(";").map(function (x) { return parseInt(x, 10) || 0; });
    for (let i = 0; i < codes.length; i++) {
      const c = codes[i];
      if (c === 0) { style.fg = null; style.bold = false; }
      else if (c === 1) style.bold = true;
      else if (c === 22) style.bold = false;
      else if (c >= 30 && c <= 37) style.fg = c - 30;
      else if (c >= 90 && c <= 97) style.fg = c - 90 + 8;
      else if (c === 39) style.fg = null;
      else if (c === 38 || c === 48) { i += codes[i + 1] === 5 ? 2 : 4; if (c === 38) style.fg = null; }
    }
  }
  function appendText(target, text, style) {
    let last = 0;
    const add = function (t) {
      t = t.replace(/[\u0000-\u0008\u000b-\u001f\u007f]/g, "");
      if (!t) return;
      if (style.fg === null && !style.bold) { target.appendChild(document.createTextNode(t)); return; }
      const span = document.createElement("span");
      const cls = [];
      if (style.fg !== null) cls.push("ansi-" + style.fg);
      if (style.bold) cls.push("ansi-b");
      span.className = cls.join(" ");
      span.textContent = t;
      target.appendChild(span);
    };
    ESC.lastIndex = 0;
    let m;
    while ((m = ESC.exec(text)) !== null) {
      add(text.slice(last, m.index));
      if (m[2] === "m") sgr(style, m[1] || "");
      last = ESC.lastIndex;
    }
    add(text.slice(last));
  }

  // Node output: appended as text only (it is whatever the program printed).
  const logSources = {};
  function atBottom(pre) { return pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4; }
  function followSwitch(pre) {
    return document.querySelector('input.follow[data-log="' + pre.id.replace(/["\\]/g, "\\$&") + '"]');
  }
  function followLog(pre) {
    const node = pre.closest("[data-node]");
    if (!node || !window.EventSource) return;
    if (logSources[pre.id]) return;
    const status = document.getElementById("log-status-" + node.dataset.node);
    const say = function (text) { if (status && pre.id.indexOf("log-") === 0) status.textContent = text; };
    const toggle = followSwitch(pre);
    const following = function () { return !toggle || toggle.checked; };
    const style = { fg: null, bold: false };
    // A terminal shows the end: so does the panel, at loading and when it is opened.
    pre.scrollTop = pre.scrollHeight;
    if (!pre.dataset.watched) {
      const panel = pre.closest("details");
      if (panel) panel.addEventListener("toggle", function () {
        if (panel.open) pre.scrollTop = pre.scrollHeight;
      });
      pre.dataset.watched = "1";
      let lastTop = pre.scrollTop;
      pre.addEventListener("scroll", function () {
        // Scrolling up (never done by the script) pauses following.
        if (toggle && pre.scrollTop < lastTop - 2 && !atBottom(pre)) toggle.checked = false;
        lastTop = pre.scrollTop;
      });
      if (toggle) toggle.addEventListener("change", function () {
        if (toggle.checked) pre.scrollTop = pre.scrollHeight;
      });
    }
    const after = pre.dataset.after || "";
    const source = new EventSource(pre.dataset.src + (after ? "?after=" + encodeURIComponent(after) : ""));
    logSources[pre.id] = source;
    source.onopen = function () { say("Live: new output appears as it is printed."); };
    source.addEventListener("log", function (m) {
      let c;
      try { c = JSON.parse(m.data); } catch (e) { return; }
      (c.pieces || []).forEach(function (p) {
        const span = document.createElement("span");
        span.className = /^(stdout|stderr|step|note)$/.test(p.class) ? p.class : "note";
        appendText(span, String(p.text || ""), style);
        pre.appendChild(span);
      });
      if (m.lastEventId) pre.dataset.after = m.lastEventId;
      if (following()) pre.scrollTop = pre.scrollHeight;
    });
    source.addEventListener("end", function () {
      source.close();
      delete logSources[pre.id];
      say("The output is complete.");
    });
    source.onerror = function () {
      if (source.readyState === EventSource.CLOSED) {
        delete logSources[pre.id];
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
        const inAside = document.getElementById("nlog-" + ev.node_id);
        if (inAside) followLog(inAside);
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

  // Long tables: the first rows, and a button for the rest (the stylesheet hides the rest
  // only on narrow screens).
  const LONG_ROWS = 20;
  function collapse(root) {
    const tables = root.tagName === "TABLE" ? [root] : root.querySelectorAll("table");
    tables.forEach(function (t) {
      if (t.classList.contains("diff") || t.classList.contains("logview") || !t.tBodies[0]) return;
      const n = t.tBodies[0].rows.length;
      let button = t.nextElementSibling;
      if (!button || !button.classList.contains("show-all")) button = null;
      if (n <= LONG_ROWS) { t.classList.remove("long"); if (button) button.remove(); return; }
      t.classList.add("long");
      if (!button) {
        button = document.createElement("button");
        button.type = "button";
        button.className = "show-all";
        button.addEventListener("click", function () {
          t.classList.toggle("all");
          label();
        });
        t.after(button);
      }
      const label = function () {
        button.textContent = t.classList.contains("all") ? "Show the first " + LONG_ROWS : "Show all " + t.tBodies[0].rows.length + " rows";
      };
      label();
    });
  }
  collapse(document.body);

  // The graph: zoom by the drawing's size (its viewBox stays), pan by scrolling its box.
  const zoom = { k: 1 };
  const view = document.getElementById("graph-view");
  function applyZoom() {
    const svg = document.getElementById("dag");
    if (!svg || !svg.viewBox || !svg.viewBox.baseVal) return;
    const vb = svg.viewBox.baseVal;
    svg.setAttribute("width", String(Math.round(vb.width * zoom.k)));
    svg.setAttribute("height", String(Math.round(vb.height * zoom.k)));
    if (view) view.dataset.zoom = zoom.k.toFixed(2);
  }
  // Zoom to `k`, keeping the point (x, y) of the box (default: its centre) in place.
  function setZoom(k, x, y) {
    if (!view) return;
    k = Math.min(4, Math.max(0.05, k));
    if (x === undefined) { x = view.clientWidth / 2; y = view.clientHeight / 2; }
    const old = zoom.k;
    const px = (view.scrollLeft + x) / old, py = (view.scrollTop + y) / old;
    zoom.k = k;
    applyZoom();
    view.scrollLeft = px * k - x;
    view.scrollTop = py * k - y;
  }
  function fit() {
    const svg = document.getElementById("dag");
    if (!view || !svg) return;
    const vb = svg.viewBox.baseVal;
    setZoom(Math.min(1, (view.clientWidth - 16) / vb.width, Math.max(200, window.innerHeight * 0.7) / vb.height));
  }
  let dragged = false;
  if (view) {
    document.querySelectorAll("[data-zoom]").forEach(function (b) {
      b.addEventListener("click", function () {
        const how = b.dataset.zoom;
        if (how === "in") setZoom(zoom.k * 1.25);
        else if (how === "out") setZoom(zoom.k / 1.25);
        else if (how === "fit") fit();
        else setZoom(1);
      });
    });
    view.addEventListener("wheel", function (e) {
      if (e.shiftKey) return;
      e.preventDefault();
      const r = view.getBoundingClientRect();
      setZoom(zoom.k * (e.deltaY < 0 ? 1.15 : 1 / 1.15), e.clientX - r.left, e.clientY - r.top);
    }, { passive: false });
    view.addEventListener("keydown", function (e) {
      if (e.target !== view) return;
      if (e.key === "+" || e.key === "=") { setZoom(zoom.k * 1.25); e.preventDefault(); }
      else if (e.key === "-" || e.key === "_") { setZoom(zoom.k / 1.25); e.preventDefault(); }
      else if (e.key === "0") { setZoom(1); e.preventDefault(); }
    });
    let start = null;
    view.addEventListener("pointerdown", function (e) {
      if (e.button !== 0) return;
      start = { x: e.clientX, y: e.clientY, left: view.scrollLeft, top: view.scrollTop };
      dragged = false;
    });
    view.addEventListener("pointermove", function (e) {
      if (!start) return;
      const dx = e.clientX - start.x, dy = e.clientY - start.y;
      if (!dragged && Math.abs(dx) + Math.abs(dy) < 5) return;
      dragged = true;
      view.classList.add("dragging");
      view.scrollLeft = start.left - dx;
      view.scrollTop = start.top - dy;
    });
    const stop = function () { start = null; view.classList.remove("dragging"); };
    view.addEventListener("pointerup", stop);
    view.addEventListener("pointerleave", stop);
    // A node's panel, beside the graph (the link is the panel's own page without script).
    view.addEventListener("click", function (e) {
      const link = e.target.closest && e.target.closest("a.nodelink");
      if (!link) return;
      if (dragged) { e.preventDefault(); dragged = false; return; }
      if (e.ctrlKey || e.metaKey || e.shiftKey || e.button !== 0) return;
      e.preventDefault();
      openNode(link);
    });
  }
  const aside = document.getElementById("node-aside");
  let opener = null;
  function closeNode() {
    if (!aside || aside.hidden) return;
    aside.querySelectorAll("pre.log").forEach(function (pre) {
      if (logSources[pre.id]) { logSources[pre.id].close(); delete logSources[pre.id]; }
    });
    aside.hidden = true;
    aside.textContent = "";
    if (opener) opener.focus();
  }
  function openNode(link) {
    if (!aside) { window.location = link.href; return; }
    opener = link;
    fetch(link.getAttribute("href"), { credentials: "same-origin", headers: { "X-Cairn-Live": "1" } })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (text) {
        if (!text) { window.location = link.href; return; }
        const fresh = new DOMParser().parseFromString(text, "text/html");
        const panel = fresh.getElementById("node-page");
        if (!panel) return;
        closeNode();
        opener = link;
        const close = document.createElement("button");
        close.type = "button";
        close.className = "close";
        close.textContent = "Close";
        close.addEventListener("click", closeNode);
        aside.appendChild(close);
        aside.appendChild(document.importNode(panel, true));
        aside.hidden = false;
        collapse(aside);
        aside.querySelectorAll("pre.log[data-src]").forEach(followLog);
        const title = aside.querySelector("h1");
        if (title) { title.tabIndex = -1; title.focus(); }
      })
      .catch(function () { window.location = link.href; });
  }
  document.addEventListener("keydown", function (e) { if (e.key === "Escape") closeNode(); });

  if (document.getElementById("runs-live")) {
    setInterval(function () { if (!document.hidden) refresh(); }, RUNS_EVERY_MS);
  }
})();
