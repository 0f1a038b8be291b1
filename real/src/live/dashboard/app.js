// Pelican's dashboard: a page of the API's own routes (GET /queue, /stats,
// /runs (by filter or key), /runs/count, /runs/{id}, its events over SSE,
// /dead-letters, /schedules; cancel and requeue, one run or in bulk;
// make and delete schedules), with the
// operator's bearer token. No build step, no dependencies.
"use strict";

const view = document.getElementById("view");
const conn = document.getElementById("conn");
const TERMINAL = ["succeeded", "failed", "dead", "cancelled"];
const STATUSES = ["delayed", "queued", "running", "retry_wait", "succeeded", "failed", "dead", "cancelled"];

let token = sessionStorage.getItem("pelican-token") || "";
// Every route change starts a new page: the old one's timers and streams
// see a stale generation and stop.
let generation = 0;
let stream = null;

function esc(v) {
  return String(v ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

function pill(status) {
  return `<span class="pill s-${esc(status)}">${esc(status)}</span>`;
}

function when(ms) {
  return ms == null ? "" : new Date(ms).toLocaleTimeString();
}

async function api(method, path, body, headers = {}) {
  const h = { ...headers };
  if (token) h.Authorization = `Bearer ${token}`;
  if (body !== undefined) h["Content-Type"] = "application/json";
  let r;
  try {
    r = await fetch(path, { method, headers: h, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (e) {
    setConn("unreachable", "s-failed");
    throw new Error("the API is unreachable");
  }
  const text = await r.text();
  let json = null;
  try { json = text ? JSON.parse(text) : null; } catch (_) { json = { error: text }; }
  if (r.status === 401 || r.status === 403) setConn(json?.error || "not authorized", "s-failed");
  else if (r.ok) setConn("connected", "s-succeeded");
  if (!r.ok) throw new Error(json?.error || `HTTP ${r.status}`);
  return json;
}

function setConn(text, cls) {
  conn.textContent = text;
  conn.className = `pill ${cls}`;
}

// Search: a run id opens the run; anything else (or an id no run has) is
// looked up as an idempotency key.
document.getElementById("search").addEventListener("submit", async (e) => {
  e.preventDefault();
  const q = document.getElementById("search-q").value.trim();
  if (!q) return;
  try {
    const id = q.match(/^(?:run-)?(\d+)$/);
    if (id) {
      try { await api("GET", `/runs/${id[1]}`); location.hash = `#/runs/${id[1]}`; return; } catch (_) { /* a key, then */ }
    }
    const page = await api("GET", `/runs?${new URLSearchParams({ key: q })}`);
    if (page.runs.length) location.hash = `#/runs/${page.runs[0].run_id}`;
    else searchMiss(q);
  } catch (err) { searchMiss(q, err.message); }
});

function searchMiss(q, why) {
  const el = document.getElementById("error");
  if (el) el.textContent = why ? `${q}: ${why}` : `no run has the id or the idempotency key ${q}`;
}

document.getElementById("login").addEventListener("submit", (e) => {
  e.preventDefault();
  token = document.getElementById("token").value.trim();
  sessionStorage.setItem("pelican-token", token);
  route();
});

function every(ms, gen, f) {
  const tick = async () => {
    if (gen !== generation) return;
    try { await f(); } catch (e) { showError(e); }
    if (gen === generation) setTimeout(tick, ms);
  };
  tick();
}

function showError(e) {
  const el = document.getElementById("error");
  if (el) el.textContent = e.message;
}

// --- the queue and the runs ------------------------------------------------

let filter = { status: "", kind: "", from: "", to: "", cursor: "" };

// A datetime-local input's value as ms since the epoch ("" stays "").
function ms(local) {
  return local ? String(new Date(local).getTime()) : "";
}

function filterParams() {
  const p = new URLSearchParams();
  if (filter.status) p.set("status", filter.status);
  if (filter.kind) p.set("kind", filter.kind);
  if (filter.from) p.set("ended_from_ms", ms(filter.from));
  if (filter.to) p.set("ended_to_ms", ms(filter.to));
  return p;
}

function overview(gen) {
  view.innerHTML = `
    <p id="error" class="error"></p>
    <h2>Queue</h2><div class="cards" id="queue"></div>
    <h2>Last hour <span class="legend"><span><i style="background:#9dbfe6"></i>finished per minute</span><span><i style="background:var(--ok)"></i>p50 latency</span><span><i style="background:var(--bad)"></i>p99 latency</span></span></h2>
    <svg class="chart" id="hour" viewBox="0 0 1200 200"></svg>
    <p class="muted" id="hour-summary"></p>
    <h2>Consumers</h2><div id="consumers"></div>
    <h2>Submit a run</h2>
    <form class="inline" id="submit-form">
      <input id="submit-kind" placeholder="kind" required>
      <input id="submit-input" placeholder='input JSON, e.g. {"ms": 1000}' size="40" value="{}">
      <button id="submit" type="submit">Submit</button>
    </form>
    <h2>Runs</h2>
    <form class="inline" id="filter-form">
      <select id="filter-status"><option value="">any status</option>${STATUSES.map((s) => `<option>${s}</option>`).join("")}</select>
      <input id="filter-kind" placeholder="any kind">
      <label class="muted">ended from <input id="filter-from" type="datetime-local"></label>
      <label class="muted">to <input id="filter-to" type="datetime-local"></label>
      <button type="submit" id="filter-go">Filter</button>
      <button type="button" id="first-page">First page</button>
      <button type="button" id="next-page">Next page</button>
      <button type="button" class="danger" id="bulk-cancel">Cancel all matching…</button>
    </form>
    <div id="bulk"></div>
    <div id="runs"></div>`;
  document.getElementById("filter-status").value = filter.status;
  document.getElementById("filter-kind").value = filter.kind;
  document.getElementById("filter-from").value = filter.from;
  document.getElementById("filter-to").value = filter.to;
  document.getElementById("filter-form").addEventListener("submit", (e) => {
    e.preventDefault();
    filter = {
      status: document.getElementById("filter-status").value,
      kind: document.getElementById("filter-kind").value.trim(),
      from: document.getElementById("filter-from").value,
      to: document.getElementById("filter-to").value,
      cursor: "",
    };
    runs();
  });
  document.getElementById("bulk-cancel").addEventListener("click", () => bulkCancel().catch(showError));
  document.getElementById("first-page").addEventListener("click", () => { filter.cursor = ""; runs(); });
  document.getElementById("next-page").addEventListener("click", () => { if (nextCursor) { filter.cursor = nextCursor; runs(); } });
  document.getElementById("submit-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    try {
      const kind = document.getElementById("submit-kind").value.trim();
      const input = JSON.parse(document.getElementById("submit-input").value || "{}");
      const key = `dashboard-${Date.now()}-${Math.random().toString(36).slice(2)}`;
      const run = await api("POST", "/runs", { kind, input }, { "Idempotency-Key": key });
      location.hash = `#/runs/${run.run_id}`;
    } catch (err) { showError(err); }
  });
  every(2000, gen, async () => { await Promise.all([queue(), runs()]); });
  // The hour's figures read every run that finished in it (see
  // PERFORMANCE.md): once a minute, and not while the tab is hidden.
  every(60000, gen, () => (document.hidden ? Promise.resolve() : hour()));
}

// A bulk action, confirmed: `count` is what it would take (GET
// /runs/count), `label` says what it does; `send(cursor)` runs one
// request and answers its BulkDone, and is sent again after its
// next_cursor while more runs match.
function confirmBulk(count, label, send) {
  const el = document.getElementById("bulk");
  if (!count.total) {
    el.innerHTML = `<div class="confirm" id="bulk-confirm">No run matches: nothing to ${esc(label)}.</div>`;
    return;
  }
  el.innerHTML = `<div class="confirm" id="bulk-confirm">${esc(label)} <b id="bulk-count">${count.total}</b> run(s)?
    <button class="danger" id="bulk-yes">${esc(label)} ${count.total} run(s)</button> <button id="bulk-no">Keep them</button></div>`;
  document.getElementById("bulk-no").addEventListener("click", () => { el.innerHTML = ""; });
  document.getElementById("bulk-yes").addEventListener("click", async () => {
    let changed = 0, skipped = 0, cursor = null;
    try {
      for (;;) {
        const done = await send(cursor);
        changed += done.changed;
        skipped += done.skipped;
        cursor = done.next_cursor;
        el.innerHTML = `<div class="confirm" id="bulk-done">${esc(label)}: <b id="bulk-changed">${changed}</b> changed, ${skipped} had moved on${cursor ? " (going on)" : ""}.</div>`;
        if (!cursor) break;
      }
    } catch (e) { showError(e); }
  });
}

async function bulkCancel() {
  const status = filter.status || "queued";
  if (!["delayed", "queued", "retry_wait", "running"].includes(status)) throw new Error("bulk cancel takes delayed, queued, retry_wait or running runs: pick one of those statuses");
  const p = new URLSearchParams({ status });
  if (filter.kind) p.set("kind", filter.kind);
  const count = await api("GET", `/runs/count?${p}`);
  const body = { status, ...(filter.kind ? { kind: filter.kind } : {}) };
  confirmBulk(count, `Cancel ${status}${filter.kind ? ` ${filter.kind}` : ""}`, (cursor) => api("POST", "/runs/cancel", { ...body, ...(cursor ? { cursor } : {}) }));
}

// The last hour from GET /stats: finished runs per minute as bars, the
// succeeded runs' p50 and p99 latency as lines on their own scale.
async function hour() {
  const s = await api("GET", "/stats?minutes=60");
  const svg = document.getElementById("hour");
  if (!svg) return;
  const n = s.minutes.length, w = 1200 / n, h = 160;
  const totals = s.minutes.map((m) => Object.values(m.finished).reduce((a, b) => a + b, 0));
  const top = Math.max(1, ...totals);
  const slow = Math.max(1, ...s.minutes.map((m) => m.p99_ms ?? 0));
  const y = (v, max) => (h - (h * v) / max + 10).toFixed(1);
  const points = (key) => s.minutes.map((m, i) => (m[key] == null ? null : [(i * w + w / 2).toFixed(1), y(m[key], slow)])).filter(Boolean);
  const line = (key) => `<polyline class="${key}" points="${points(key).map((p) => p.join(",")).join(" ")}"/>`
    + points(key).map(([px, py]) => `<circle class="${key}" cx="${px}" cy="${py}" r="3"/>`).join("");
  svg.innerHTML = s.minutes.map((m, i) => `<rect class="bar" data-minute="${m.minute_ms}" x="${(i * w + 1).toFixed(1)}" y="${y(totals[i], top)}" width="${(w - 2).toFixed(1)}" height="${((h * totals[i]) / top).toFixed(1)}"><title>${when(m.minute_ms)}: ${totals[i]} finished, p50 ${m.p50_ms ?? "–"} ms, p99 ${m.p99_ms ?? "–"} ms</title></rect>`).join("")
    + line("p50_ms") + line("p99_ms")
    + `<text x="4" y="12">${top} runs/min</text><text x="1196" y="12" text-anchor="end">${slow} ms</text>`
    + `<text x="4" y="196">${when(s.minutes[0].minute_ms)}</text><text x="1196" y="196" text-anchor="end">${when(s.minutes[n - 1].minute_ms)}</text>`;
  const sum = totals.reduce((a, b) => a + b, 0);
  const last = [...s.minutes].reverse().find((m) => m.p99_ms != null);
  document.getElementById("hour-summary").innerHTML = `<span id="hour-finished">${sum}</span> runs finished in the last hour` + (last ? `; latest minute with successes: p50 <span id="hour-p50">${last.p50_ms}</span> ms, p99 <span id="hour-p99">${last.p99_ms}</span> ms` : "");
}

async function queue() {
  const q = await api("GET", "/queue");
  const cards = [
    ["queue-length", "stream length", q.length],
    ["queue-lag", "lag (not yet delivered)", q.lag ?? "?"],
    ["queue-pending", "pending deliveries", q.pending],
    ["queue-oldest", "oldest pending idle", q.oldest_idle_ms == null ? "none" : `${(q.oldest_idle_ms / 1000).toFixed(1)} s`],
    ["queue-dead", "dead-letter stream", q.dead_letters],
    ...Object.entries(q.runs || {}).map(([s, n]) => [`runs-${s}`, `runs ${s}`, n]),
  ];
  document.getElementById("queue").innerHTML = cards
    .map(([id, l, n]) => `<div class="card"><div class="n" id="${id}">${esc(n)}</div><div class="l">${esc(l)}</div></div>`)
    .join("");
  document.getElementById("consumers").innerHTML = q.consumers.length
    ? `<table><tr><th>consumer</th><th>pending</th></tr>${q.consumers.map((c) => `<tr><td>${esc(c.name)}</td><td>${c.pending}</td></tr>`).join("")}</table>`
    : `<p class="muted">No consumer holds a delivery.</p>`;
}

let nextCursor = null;

async function runs() {
  const p = filterParams();
  p.set("limit", "20");
  if (filter.cursor) p.set("cursor", filter.cursor);
  const page = await api("GET", `/runs?${p}`);
  nextCursor = page.next_cursor;
  const el = document.getElementById("runs");
  if (!el) return;
  el.innerHTML = page.runs.length
    ? `<table id="runs-table"><tr><th>run</th><th>kind</th><th>status</th><th>attempts</th><th>events</th><th>finished</th><th>error</th></tr>
      ${page.runs.map((r) => `<tr data-run="${r.run_id}"><td><a href="#/runs/${r.run_id}">${r.run_id}</a></td><td>${esc(r.kind)}</td>
        <td>${pill(r.status)}</td><td>${r.attempts}/${r.attempts_max}</td><td>${r.events}</td><td>${when(r.finished_at_ms)}</td>
        <td>${r.error ? esc(`${r.error.class}: ${r.error.message}`) : ""}</td></tr>`).join("")}</table>`
    : `<p class="muted">No runs here.</p>`;
}

// --- one run ---------------------------------------------------------------

function runPage(gen, id) {
  view.innerHTML = `
    <p id="error" class="error"></p>
    <h2>Run <span id="run-id">${esc(id)}</span> <span id="run-status"></span></h2>
    <div id="run-actions" class="inline"></div>
    <h2>Timeline <span class="muted">(one lane per worker; Postgres's clock)</span></h2><div id="timeline"></div>
    <div class="grid2">
      <div><h2>Attempts</h2><ul class="timeline" id="attempts"></ul></div>
      <div><h2>Events <span class="muted" id="events-state"></span></h2><table id="events"><tr><th>#</th><th>event</th><th>attempt</th><th>fence</th><th>detail</th></tr></table></div>
    </div>
    <h2>Steps</h2><div id="steps"></div>
    <div class="grid2"><div><h2>Input</h2><pre id="run-input"></pre></div><div><h2>Result or error</h2><pre id="run-result"></pre></div></div>`;
  const refresh = () => run(gen, id).catch(showError);
  refresh();
  follow(gen, id, refresh);
  // Leases and statuses change without events too (a reclaim waits for one).
  every(2000, gen, () => run(gen, id));
}

async function run(gen, id) {
  const r = await api("GET", `/runs/${id}`);
  if (gen !== generation) return;
  const due = r.due_at_ms ? ` <span class="muted" id="run-due">${r.status === "delayed" ? "starts at" : "was due"} ${when(r.due_at_ms)}</span>` : "";
  document.getElementById("run-status").innerHTML = pill(r.status) + due;
  const active = r.attempts.length && r.status === "running" ? r.attempts[r.attempts.length - 1].attempt : null;
  document.getElementById("attempts").innerHTML = r.attempts.length
    ? r.attempts.map((a) => `<li class="${a.outcome ? "ended" : ""} ${a.outcome === "succeeded" ? "succeeded" : ""}" data-attempt="${a.attempt}" data-fence="${a.fence}">
        <b>attempt ${a.attempt}</b> · fence <span class="fence">${a.fence}</span> · worker <span class="worker">${esc(a.worker)}</span>
        · entry ${esc(a.entry_id)} · <span class="outcome">${a.outcome ? pill(a.outcome) : a.attempt === active ? pill("running") : pill("no outcome: fenced off")}</span>
        ${a.attempt === active && r.lease_until_ms ? ` · lease until ${when(r.lease_until_ms)}` : ""}</li>`).join("")
    : `<li class="ended">no attempt yet (${esc(r.status)})</li>`;
  document.getElementById("timeline").innerHTML = timeline(r);
  document.getElementById("steps").innerHTML = r.steps.length
    ? `<table><tr><th>step</th><th>name</th><th>fence</th><th>output</th></tr>${r.steps.map((s) => `<tr><td>${s.step}</td><td>${esc(s.name)}</td><td>${s.fence}</td><td><code>${esc(JSON.stringify(s.output))}</code></td></tr>`).join("")}</table>`
    : `<p class="muted">No recorded steps.</p>`;
  document.getElementById("run-input").textContent = JSON.stringify(r.input, null, 2);
  document.getElementById("run-result").textContent = r.result != null ? JSON.stringify(r.result, null, 2) : r.error ? `${r.error.class}: ${r.error.message}` : "";
  const actions = [];
  if (!TERMINAL.includes(r.status)) actions.push(`<button class="danger" id="cancel">Cancel run</button>`);
  if (r.status === "dead") actions.push(`<button id="requeue">Requeue (one more attempt)</button>`);
  const el = document.getElementById("run-actions");
  el.innerHTML = actions.join(" ");
  document.getElementById("cancel")?.addEventListener("click", () => act("POST", `/runs/${id}/cancel`, undefined, gen, id));
  document.getElementById("requeue")?.addEventListener("click", () => act("POST", `/dead-letters/${id}/requeue`, { extra_attempts: 1 }, gen, id));
}

// The run's attempts on a time axis, a lane per worker: each attempt from
// its claim to its outcome; one with no outcome that a later attempt took
// over ends at the takeover, marked (its worker was killed or stalled and
// its lease ran out); the running one's lease shows ahead of it.
function timeline(r) {
  const timed = r.attempts.filter((a) => a.claimed_at_ms != null);
  if (!timed.length) return `<p class="muted">No timed attempt yet.</p>`;
  const now = Date.now();
  const spans = timed.map((a, i) => {
    const next = timed[i + 1];
    let end = a.ended_at_ms, how = a.outcome || "no outcome";
    if (end == null && next) { end = next.claimed_at_ms; how = "taken-over"; }
    else if (end == null && r.status === "running") { end = Math.max(now, a.claimed_at_ms); how = "running"; }
    else if (end == null) end = a.claimed_at_ms;
    return { a, end, how, next };
  });
  const t0 = timed[0].claimed_at_ms;
  const t1 = Math.max(t0 + 1, ...spans.map((s) => s.end), r.status === "running" && r.lease_until_ms ? r.lease_until_ms : 0);
  const x = (t) => (100 * (t - t0)) / (t1 - t0);
  const workers = [...new Set(timed.map((a) => a.worker))];
  const lane = (w) => spans.filter((s) => s.a.worker === w).map(({ a, end, how, next }) => {
    const left = x(a.claimed_at_ms), width = Math.max(0.6, x(end) - left);
    const cls = { succeeded: "s-succeeded", running: "s-running", "taken-over": "s-dead" }[how] || "s-failed";
    let out = `<div class="bar ${esc(cls)}" data-attempt="${a.attempt}" data-end="${esc(how)}" style="left:${left.toFixed(2)}%;width:${width.toFixed(2)}%"
      title="attempt ${a.attempt}, fence ${a.fence}: ${when(a.claimed_at_ms)} to ${when(end)} (${esc(how)})">#${a.attempt} · fence ${a.fence}</div>`;
    if (how === "taken-over") out += `<div class="mark" data-takeover="${a.attempt}" style="left:${x(end).toFixed(2)}%" title="lease ran out: taken over by ${esc(next.worker)} under fence ${next.fence} at ${when(end)}">✕ taken over by ${esc(next.worker)}</div>`;
    if (how === "running" && r.lease_until_ms) out += `<div class="lease" data-lease="${a.attempt}" style="left:${x(end).toFixed(2)}%;width:${Math.max(0.6, x(r.lease_until_ms) - x(end)).toFixed(2)}%" title="lease until ${when(r.lease_until_ms)}">lease</div>`;
    return out;
  }).join("");
  return `<div class="lanes">${workers.map((w) => `<div class="lane" data-worker="${esc(w)}"><span class="who">${esc(w)}</span><div class="track">${lane(w)}</div></div>`).join("")}
    <div class="axis"><span>${when(t0)}</span><span>${when((t0 + t1) / 2)}</span><span>${when(t1)}</span></div></div>`;
}

async function act(method, path, body, gen, id) {
  try {
    await api(method, path, body);
    await run(gen, id);
  } catch (e) { showError(e); }
}

// The run's events over SSE (fetch, so the token goes in a header), resumed
// with Last-Event-ID after a drop; each event refreshes the run.
async function follow(gen, id, refresh) {
  let last = 0;
  const state = (t) => { const el = document.getElementById("events-state"); if (el) el.textContent = t; };
  while (gen === generation) {
    const ctl = new AbortController();
    stream = ctl;
    try {
      const h = { Accept: "text/event-stream" };
      if (token) h.Authorization = `Bearer ${token}`;
      if (last) h["Last-Event-ID"] = String(last);
      const r = await fetch(`/runs/${id}/events`, { headers: h, signal: ctl.signal });
      if (r.status === 204) { state("(ended)"); return; }
      if (!r.ok) { state(`(${r.status})`); return; }
      state("(live)");
      const reader = r.body.getReader();
      const decoder = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
          if (!data || gen !== generation) continue;
          const e = JSON.parse(data);
          if (e.seq <= last) continue;
          last = e.seq;
          addEvent(e);
          refresh();
          if (TERMINAL.includes(e.kind) || e.kind === "succeeded") { state("(ended)"); }
        }
      }
    } catch (_) {
      if (gen !== generation) return;
      state("(reconnecting)");
    }
    await new Promise((ok) => setTimeout(ok, 1000));
  }
}

function addEvent(e) {
  const table = document.getElementById("events");
  if (!table) return;
  const detail = e.worker ? `worker ${e.worker}` : e.progress !== undefined ? JSON.stringify(e.progress) : e.class ? `${e.class}: ${e.message}` : "";
  const tr = document.createElement("tr");
  tr.dataset.seq = e.seq;
  tr.innerHTML = `<td>${e.seq}</td><td>${pill(e.kind)}</td><td>${e.attempt}</td><td>${e.fence}</td><td>${esc(detail)}</td>`;
  table.appendChild(tr);
}

// --- dead letters ----------------------------------------------------------

function deadLetters(gen) {
  view.innerHTML = `<p id="error" class="error"></p><h2>Dead letters</h2>
    <form class="inline" id="requeue-form">
      Requeue every dead run of kind <input id="requeue-kind" placeholder="kind" required>
      <label class="muted">that died from <input id="requeue-from" type="datetime-local"></label>
      <label class="muted">to <input id="requeue-to" type="datetime-local"></label>
      with <input id="requeue-extra" type="number" min="1" max="100" value="1" style="width:4em"> more attempt(s)
      <button type="submit" id="requeue-all">Requeue…</button>
    </form>
    <div id="bulk"></div>
    <div id="letters"></div>`;
  document.getElementById("requeue-form").addEventListener("submit", (e) => {
    e.preventDefault();
    bulkRequeue().catch(showError);
  });
  every(3000, gen, async () => {
    const page = await api("GET", "/dead-letters?limit=100");
    const el = document.getElementById("letters");
    if (!el) return;
    el.innerHTML = page.dead_letters.length
      ? `<table><tr><th>run</th><th>class</th><th>message</th><th>attempts</th><th>requeued</th><th></th></tr>
        ${page.dead_letters.map((d) => `<tr><td><a href="#/runs/${d.run_id}">${d.run_id}</a></td><td>${esc(d.class)}</td><td>${esc(d.message)}</td>
          <td>${d.attempts.length}</td><td>${d.requeued ? "yes" : ""}</td>
          <td>${d.requeued ? "" : `<button data-requeue="${d.run_id}">Requeue</button>`}</td></tr>`).join("")}</table>`
      : `<p class="muted">No dead letters.</p>`;
    el.querySelectorAll("button[data-requeue]").forEach((b) => b.addEventListener("click", async () => {
      try { await api("POST", `/dead-letters/${b.dataset.requeue}/requeue`, { extra_attempts: 1 }); } catch (e) { showError(e); }
    }));
  });
}

async function bulkRequeue() {
  const kind = document.getElementById("requeue-kind").value.trim();
  const from = ms(document.getElementById("requeue-from").value);
  const to = ms(document.getElementById("requeue-to").value);
  const extra = Number(document.getElementById("requeue-extra").value || "1");
  const p = new URLSearchParams({ status: "dead", kind });
  if (from) p.set("ended_from_ms", from);
  if (to) p.set("ended_to_ms", to);
  const count = await api("GET", `/runs/count?${p}`);
  const body = { kind, extra_attempts: extra, ...(from ? { ended_from_ms: Number(from) } : {}), ...(to ? { ended_to_ms: Number(to) } : {}) };
  confirmBulk(count, `Requeue dead ${kind}`, (cursor) => api("POST", "/dead-letters/requeue", { ...body, ...(cursor ? { cursor } : {}) }));
}

// --- schedules ---------------------------------------------------------------

function date(ms) {
  return ms == null ? "" : new Date(ms).toLocaleString();
}

// The schedule whose Delete was clicked once: its button asks again.
let sureDelete = "";

function schedules(gen) {
  view.innerHTML = `
    <p id="error" class="error"></p>
    <h2>Make or replace a schedule</h2>
    <form class="inline" id="schedule-form">
      <input id="schedule-name" placeholder="name" required>
      <input id="schedule-kind" placeholder="kind" required>
      <input id="schedule-cron" placeholder="cron, e.g. 0 9 * * 1-5" required>
      <input id="schedule-tz" placeholder="time zone" value="UTC" size="14">
      <select id="schedule-overlap"><option>skip</option><option>queue</option><option>cancel</option></select>
      <select id="schedule-catchup"><option>one</option><option>skip</option></select>
      <input id="schedule-input" placeholder="input JSON" value="{}" size="16">
      <button type="submit" id="schedule-put">Save</button>
    </form>
    <p class="muted">Overlap: what a tick does while the last run is live. Catch-up: whether ticks missed while no worker ran make one run.</p>
    <h2>Schedules</h2>
    <div id="schedules"></div>`;
  document.getElementById("schedule-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const v = (id) => document.getElementById(id).value.trim();
    try {
      await api("POST", "/schedules", {
        name: v("schedule-name"), kind: v("schedule-kind"), cron: v("schedule-cron"), tz: v("schedule-tz"),
        overlap: v("schedule-overlap"), catchup: v("schedule-catchup"), input: JSON.parse(v("schedule-input") || "{}"),
      });
      showError({ message: "" });
    } catch (err) { showError(err); }
  });
  every(2000, gen, async () => {
    const all = (await api("GET", "/schedules")).schedules;
    const el = document.getElementById("schedules");
    if (!el) return;
    el.innerHTML = all.length
      ? `<table id="schedules-table"><tr><th>name</th><th>kind</th><th>cron</th><th>next ticks</th><th>lag</th><th>overlap</th><th>catch-up</th><th>fired</th><th>skipped</th><th>last run</th><th></th></tr>
        ${all.map((s) => `<tr data-schedule="${esc(s.name)}"><td>${esc(s.name)}</td><td>${esc(s.kind)}</td><td><code>${esc(s.cron)}</code> ${esc(s.tz)}</td>
          <td class="next-ticks">${s.next_ticks_ms.map(date).map(esc).join("<br>") || "none"}</td>
          <td class="${s.lag_ms > 60000 ? "error" : ""}">${s.lag_ms ? `${s.lag_ms} ms` : ""}</td>
          <td>${esc(s.overlap)}</td><td>${esc(s.catchup)}</td><td>${s.fired}</td><td>${s.skipped}</td>
          <td>${s.last_run ? `<a href="#/runs/${s.last_run}">${s.last_run}</a>` : ""}</td>
          <td>${s.name === sureDelete ? `<button class="danger" data-delete="${esc(s.name)}">Really delete</button>` : `<button data-delete="${esc(s.name)}">Delete</button>`}</td></tr>`).join("")}</table>`
      : `<p class="muted">No schedules.</p>`;
    el.querySelectorAll("button[data-delete]").forEach((b) => b.addEventListener("click", async () => {
      if (sureDelete !== b.dataset.delete) { sureDelete = b.dataset.delete; b.textContent = "Really delete"; b.className = "danger"; return; }
      sureDelete = "";
      try { await api("DELETE", `/schedules/${encodeURIComponent(b.dataset.delete)}`); b.closest("tr").remove(); } catch (e) { showError(e); }
    }));
  });
}

// --- routing ---------------------------------------------------------------

function route() {
  generation += 1;
  if (stream) stream.abort();
  const gen = generation;
  if (!token) {
    view.innerHTML = `<p class="muted">Give an API token (the read-only one shows; cancel and requeue need the full one).</p>`;
    setConn("no token", "");
    return;
  }
  const m = location.hash.match(/^#\/runs\/(\d+)$/);
  if (m) runPage(gen, m[1]);
  else if (location.hash === "#/dead-letters") deadLetters(gen);
  else if (location.hash === "#/schedules") schedules(gen);
  else overview(gen);
}

window.addEventListener("hashchange", route);
document.getElementById("token").value = token;
route();
