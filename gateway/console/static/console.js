// Live decisions: new audit records arrive as server-sent events and are added
// at the top of the table. Every value is set with textContent (never as HTML);
// the server has already made control and bidi characters visible. Long values
// are cut in the middle the way the server cuts them (SHOWN, as pages.SHOWN), the
// whole value in the cell's title, so the table fits a 1280 px window.
"use strict";
(function () {
  const box = document.getElementById("decisions");
  if (!box) {
    return;
  }
  const SHOWN = { peer: 32, capability: 32, request_id: 14, trace_id: 9 };
  const rows = document.getElementById("decision-rows");
  const state = document.getElementById("live-state");
  const source = new EventSource(box.dataset.events);
  const cut = function (text, shown) {
    const chars = Array.from(text);
    if (chars.length <= shown) {
      return text;
    }
    const half = Math.floor((shown - 1) / 2);
    return chars.slice(0, half).join("") + "…" + chars.slice(chars.length - (shown - 1 - half)).join("");
  };
  const cell = function (tr, text, shown) {
    const td = document.createElement("td");
    if (shown && Array.from(text).length > shown) {
      const span = document.createElement("span");
      span.title = text;
      span.textContent = cut(text, shown);
      td.appendChild(span);
    } else {
      td.textContent = text;
    }
    tr.appendChild(td);
    return td;
  };
  source.onopen = function () {
    state.textContent = "live";
    state.className = "on";
  };
  source.onerror = function () {
    state.textContent = "reconnecting…";
    state.className = "off";
  };
  source.addEventListener("decision", function (event) {
    const r = JSON.parse(event.data);
    const tr = document.createElement("tr");
    tr.className = "new";
    tr.dataset.seq = String(r.seq);
    const time = document.createElement("span");
    time.title = r.time;
    time.textContent = r.time.charAt(10) === "T" ? r.time.slice(11, 23) : r.time;
    cell(tr, "").appendChild(time);
    cell(tr, r.peer || "-", SHOWN.peer);
    cell(tr, r.capability || "-", SHOWN.capability);
    cell(tr, (r.constraint || "*") + " → " + (r.served || "-"));
    const decision = document.createElement("span");
    decision.className = r.decision === "allow" ? "allow" : "refuse";
    decision.textContent = r.decision;
    cell(tr, "").appendChild(decision);
    cell(tr, r.reason);
    cell(tr, String(r.size));
    cell(tr, r.latency_ms.toFixed(1));
    cell(tr, r.request_id || "-", SHOWN.request_id);
    const trace = cell(tr, r.trace_id ? "" : "-");
    if (r.trace_id) {
      const link = document.createElement("a");
      link.className = "trace";
      link.href = "/?trace=" + encodeURIComponent(r.trace_id);
      link.dataset.trace = r.trace_id;
      if (Array.from(r.trace_id).length > SHOWN.trace_id) {
        link.title = r.trace_id;
      }
      link.textContent = cut(r.trace_id, SHOWN.trace_id);
      trace.appendChild(link);
    }
    rows.insertBefore(tr, rows.firstChild);
    while (rows.children.length > 500) {
      rows.removeChild(rows.lastChild);
    }
  });
})();
