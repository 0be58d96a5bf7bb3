// Live decisions: new audit records arrive as server-sent events and are added
// at the top of the table. Every value is set with textContent (never as HTML);
// the server has already made control and bidi characters visible.
"use strict";
(function () {
  const box = document.getElementById("decisions");
  if (!box) {
    return;
  }
  const rows = document.getElementById("decision-rows");
  const state = document.getElementById("live-state");
  const source = new EventSource(box.dataset.events);
  const cell = function (tr, text) {
    const td = document.createElement("td");
    td.textContent = text;
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
    cell(tr, r.time);
    cell(tr, r.peer || "-");
    cell(tr, r.capability || "-");
    cell(tr, r.constraint || "-");
    cell(tr, r.served || "-");
    const decision = document.createElement("span");
    decision.className = r.decision === "allow" ? "allow" : "refuse";
    decision.textContent = r.decision;
    cell(tr, "").appendChild(decision);
    cell(tr, r.reason);
    cell(tr, String(r.size));
    cell(tr, r.latency_ms.toFixed(1));
    cell(tr, r.request_id);
    const trace = cell(tr, r.trace_id ? "" : "-");
    if (r.trace_id) {
      const link = document.createElement("a");
      link.className = "trace";
      link.href = "/?trace=" + encodeURIComponent(r.trace_id);
      link.textContent = r.trace_id;
      trace.appendChild(link);
    }
    rows.insertBefore(tr, rows.firstChild);
    while (rows.children.length > 500) {
      rows.removeChild(rows.lastChild);
    }
  });
})();
