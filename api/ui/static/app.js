// oscar-zoo web UI: progressive enhancement only; every page works without this file.
"use strict";

// "/" focuses the search box (unless typing in a field already).
document.addEventListener("keydown", (e) => {
  const box = document.getElementById("q");
  if (e.key === "/" && box && !/^(INPUT|SELECT|TEXTAREA)$/.test(document.activeElement.tagName)) {
    e.preventDefault();
    box.focus();
  }
});

// Copy buttons next to commands.
document.querySelectorAll("button[data-copy]").forEach((btn) => {
  btn.hidden = false;
  btn.addEventListener("click", async () => {
    const text = document.getElementById(btn.dataset.copy).innerText;
    try { await navigator.clipboard.writeText(text); btn.textContent = "Copied"; }
    catch (err) { btn.textContent = "Select and copy"; }
    setTimeout(() => { btn.textContent = "Copy"; }, 1500);
  });
});

// Job page: follow GET /v1/jobs/{id}/events until the job ends.
const TERMINAL = ["succeeded", "failed", "cancelled"];
const root = document.getElementById("job");
if (root && root.dataset.events && !("terminal" in root.dataset) && window.EventSource) {
  const source = new EventSource(root.dataset.events);
  const field = (name) => document.querySelector(`[data-field="${name}"]`);
  const refresh = field("refresh");
  const reload = refresh.querySelector("a");
  const say = (text, link) => {
    if (refresh.dataset.said === text) return;
    refresh.dataset.said = text;
    refresh.replaceChildren(text, ...(link ? [" ", reload] : []));
  };
  let ended = false;
  source.addEventListener("job", (e) => {
    const job = JSON.parse(e.data);
    showJob(job, field);
    if (TERMINAL.includes(job.status)) { ended = true; source.close(); }
    else say("Live: this page follows the job.", false);
  });
  // a dropped stream is retried by the browser; one answered with an error is given up for good
  source.addEventListener("error", () => {
    if (ended) return;
    if (source.readyState === EventSource.CLOSED) say("Live updates stopped (the server refused the stream).", true);
    else say("Connection lost; reconnecting…", true);
  });
  say("Live: this page follows the job.", false);
}

// Live regions (status, phase, waiting) are announced by screen readers on every change to
// their DOM, even a rewrite with the same text: each event writes only what differs.
function setText(el, text) {
  if (el.textContent !== text) el.textContent = text;
}

function setHidden(el, hidden) {
  if (el.hidden !== hidden) el.hidden = hidden;
}

// `cmd` in a message as <code>cmd</code>, as the server renders it
function ticked(el, text) {
  if (el.dataset.text === text) return;
  el.dataset.text = text;
  el.replaceChildren(...text.split("`").map((part, i) => {
    if (i % 2 === 0) return document.createTextNode(part);
    const code = document.createElement("code");
    code.textContent = part;
    return code;
  }));
}

function showJob(job, field) {
  const p = job.progress || {};
  const status = field("status");
  setText(status, job.status);
  if (status.className !== "badge status-" + job.status) status.className = "badge status-" + job.status;
  setText(field("phase"), job.phase || p.phase || "");
  const bar = field("bar");
  bar.max = p.total || 1;
  bar.value = p.done || 0;
  setText(field("count"), p.total ? `${p.done || 0} / ${p.total}` : "");
  setText(field("layer"), p.layer == null ? "" : `layer ${p.layer}`);
  setText(field("attempts"), job.max_attempts ? `${job.attempts} of ${job.max_attempts}` : `${job.attempts}`);
  setText(field("updated"), job.updated_at ? when(job.updated_at) : "");
  setText(field("error"), job.error || "–");
  const waiting = field("waiting");
  setHidden(waiting, !job.waiting);
  ticked(waiting, job.waiting ? `Cannot start yet: ${job.waiting}` : "");
  setHidden(field("cancel"), !(job.cancel_requested && job.status === "running"));
  setText(field("finished"), job.finished_at ? when(job.finished_at) : "–");
  showTimings(job.timings || {}, field("timings"));
  setText(field("worker"), workerOf(job));
  setText(field("started"), job.started_at ? when(job.started_at) : "–");
  if (job.result) {
    const a = document.createElement("a");
    a.href = `/models/${encodeURIComponent(job.result.model)}/versions/${job.result.version}`;
    a.textContent = `${job.result.model} v${job.result.version}`;
    field("result").replaceChildren(a);
  }
  if (TERMINAL.includes(job.status)) setText(field("refresh"), "This job has ended.");
}

// the lease holder while it runs, else the worker its last progress named (as api/ui/jobs.py)
function workerOf(job) {
  if (job.lease && job.lease.holder) return job.lease.holder;
  const w = (job.progress || {}).worker;
  if (!w || typeof w !== "object") return "–";
  const name = String(w.id || ""), host = String(w.host || "");
  if (name && host && !name.includes(host)) return `${name} on ${host}`;
  return name || host || "–";
}

function showTimings(timings, section) {
  const rows = Object.entries(timings).map(([k, s]) => {
    const tr = document.createElement("tr");
    const th = document.createElement("th");
    th.scope = "row";
    th.textContent = k;
    const td = document.createElement("td");
    td.textContent = `${Number(s).toFixed(1)} s`;
    tr.append(th, td);
    return tr;
  });
  section.hidden = rows.length === 0;
  section.querySelector("tbody").replaceChildren(...rows);
}

// 2026-11-22T10:03:04.000Z -> 2026-11-22 10:03 UTC (as the server renders it)
function when(iso) { return iso.slice(0, 10) + " " + iso.slice(11, 16) + " UTC"; }
