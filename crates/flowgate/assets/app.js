// flowgate dashboard: live figures from /api/v1/stream (server-sent events), charts drawn
// on <canvas>, drain/undrain through the API with the token kept in sessionStorage.
"use strict";

const HISTORY_SECS = 300;            // charts show the last five minutes
const COLORS = ["#2f81f7", "#3fb950", "#d29922", "#f778ba", "#a371f7", "#56d4dd", "#ff7b72", "#e3b341"];
const TOKEN_KEY = "flowgate.token";

const history = new Map();           // "svc/addr" -> [{t, rps, active, rt}]
const serviceEls = new Map();        // service name -> {root, charts, rows}
let lastSnapshot = null;

const $ = (sel, root) => (root || document).querySelector(sel);
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k === "dataset") Object.assign(e.dataset, v);
    else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k);
  return e;
}
function fmt(v, digits) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  return Number(v).toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: digits });
}
function fmtInt(v) { return v === null || v === undefined ? "–" : Number(v).toLocaleString("en-US"); }
function fmtDuration(secs) {
  secs = Math.floor(secs);
  const d = Math.floor(secs / 86400), h = Math.floor(secs / 3600) % 24, m = Math.floor(secs / 60) % 60, s = secs % 60;
  if (d) return `${d}d ${h}h`;
  if (h) return `${h}h ${m}m`;
  if (m) return `${m}m ${s}s`;
  return `${s}s`;
}

// ----- token ------------------------------------------------------------------------------
function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }
function showTokenState() {
  const t = token();
  $("#token-state").textContent = t ? "token set" : "no token";
  $("#token-state").className = t ? "badge b-ok" : "muted";
}
$("#token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const v = $("#token").value.trim();
  if (v) sessionStorage.setItem(TOKEN_KEY, v); else sessionStorage.removeItem(TOKEN_KEY);
  $("#token").value = "";
  showTokenState();
});
showTokenState();

function flash(msg, ok) {
  const f = $("#flash");
  f.textContent = msg;
  f.className = "flash " + (ok ? "ok" : "err");
  f.hidden = false;
  clearTimeout(flash.timer);
  flash.timer = setTimeout(() => { f.hidden = true; }, 6000);
}

async function act(service, backend, action) {
  const url = `/api/v1/services/${encodeURIComponent(service)}/backends/${encodeURIComponent(backend)}/${action}`;
  const headers = {};
  if (token()) headers["Authorization"] = "Bearer " + token();
  try {
    const r = await fetch(url, { method: "POST", headers });
    const body = await r.json().catch(() => ({}));
    if (!r.ok) { flash(`${action} ${service}/${backend}: ${body.error || r.status}`, false); return; }
    flash(`${service}/${backend} is now ${body.state}`, true);
  } catch (e) {
    flash(`${action} ${service}/${backend}: ${e}`, false);
  }
}

// ----- charts -------------------------------------------------------------------------------
function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}
function drawChart(canvas, series, field, unit, now) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
    canvas.width = Math.round(w * dpr); canvas.height = Math.round(h * dpr);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  const left = 44, right = 8, top = 8, bottom = 20;
  const pw = w - left - right, ph = h - top - bottom;
  let max = 0;
  for (const s of series) for (const p of s.points) if (p[field] !== null && p[field] > max) max = p[field];
  max = niceMax(max * 1.1);
  ctx.font = "11px system-ui, sans-serif";
  ctx.fillStyle = "#8b949e";
  ctx.strokeStyle = "#21262d";
  ctx.lineWidth = 1;
  ctx.textAlign = "right"; ctx.textBaseline = "middle";
  for (let i = 0; i <= 4; i++) {
    const y = top + ph - (ph * i) / 4;
    ctx.beginPath(); ctx.moveTo(left, Math.round(y) + 0.5); ctx.lineTo(left + pw, Math.round(y) + 0.5); ctx.stroke();
    const v = (max * i) / 4;
    ctx.fillText((v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2)).replace(/\.?0+$/, "") + unit, left - 6, y);
  }
  ctx.textAlign = "center"; ctx.textBaseline = "top";
  for (let m = 0; m <= 5; m++) {
    const x = left + pw - (pw * m * 60) / HISTORY_SECS;
    ctx.fillText(m === 0 ? "now" : `-${m}m`, Math.min(Math.max(x, left + 10), left + pw - 12), top + ph + 5);
  }
  const x0 = now - HISTORY_SECS * 1000;
  for (const s of series) {
    ctx.strokeStyle = s.color; ctx.lineWidth = 1.8; ctx.beginPath();
    let started = false;
    for (const p of s.points) {
      if (p[field] === null || p.t < x0) { started = false; continue; }
      const x = left + ((p.t - x0) / (HISTORY_SECS * 1000)) * pw;
      const y = top + ph - (Math.min(p[field], max) / max) * ph;
      if (!started) { ctx.moveTo(x, y); started = true; } else ctx.lineTo(x, y);
    }
    ctx.stroke();
  }
}

// ----- services -------------------------------------------------------------------------------
const COLUMNS = [
  ["Backend", ""], ["Weight", "num"], ["Health", ""], ["State", ""], ["Gap", ""],
  ["Active", "num"], ["Total", "num"], ["Req/s", "num"], ["Resp. time", "num"], ["", ""],
];
function serviceCard(name) {
  const charts = {
    rps: el("canvas", { "aria-label": "request rate" }),
    active: el("canvas", { "aria-label": "active connections" }),
    rt: el("canvas", { "aria-label": "response time" }),
  };
  const head = el("div", { class: "svc-head" });
  const tbody = el("tbody");
  // Backends removed from the pool while connections to them are open.
  const left = el("tbody", { class: "left" });
  const root = el("section", { class: "card service", dataset: { service: name } },
    head,
    el("div", { class: "charts" },
      el("div", { class: "chart" }, el("h3", {}, "Request rate (new connections/s)"), charts.rps),
      el("div", { class: "chart" }, el("h3", {}, "Active connections"), charts.active),
      el("div", { class: "chart" }, el("h3", {}, "Response time (ms)"), charts.rt)),
    el("table", { class: "grid backends" },
      el("thead", {}, el("tr", {}, ...COLUMNS.map(([t, c]) => el("th", { class: c }, t)))),
      tbody, left));
  return { root, head, tbody, left, charts, rows: new Map() };
}
function backendRow(service, b, color) {
  const key = `${service}/${b.address}`;
  const cell = (field, cls) => el("td", { class: cls || "", dataset: { field } });
  const btn = el("button", { type: "button", class: "danger", dataset: { action: "drain", target: key } }, "Drain");
  btn.addEventListener("click", () => {
    const action = btn.dataset.action;
    act(service, b.address, action);
  });
  const sw = el("span", { class: "swatch" });
  sw.style.background = color;
  const tr = el("tr", { dataset: { backend: key } },
    el("td", { class: "mono" }, sw, b.address),
    cell("weight", "num"), cell("health"), cell("state"), cell("gap"),
    cell("active_connections", "num"), cell("connections_total", "num"),
    cell("rps", "num"), cell("response_time_ms", "num"),
    el("td", { class: "num" }, btn));
  return { tr, btn };
}
// A backend removed from the pool whose open connections still go to it, until they end
// (those the controller tracks): when it is gone from here, nothing the controller placed
// goes to it any more.
function leftRow(service, l) {
  const badge = el("span", { class: "badge b-none" }, "removed");
  const blank = () => el("td", { class: "muted" }, "–");
  return el("tr", { dataset: { left: `${service}/${l.address}` },
    title: "removed from the pool: its open connections go on to it until they end" },
    el("td", { class: "mono muted" }, el("span", { class: "swatch" }), l.address),
    blank(), blank(), el("td", {}, badge), blank(),
    el("td", { class: "num", dataset: { field: "open_connections" } }, fmtInt(l.open_connections)),
    blank(), blank(), blank(), el("td"));
}
function setBadge(td, text, cls) {
  if (td.textContent !== text) td.textContent = "";
  let span = td.firstChild;
  if (!span) { span = el("span"); td.append(span); }
  span.className = "badge " + cls;
  span.textContent = text;
}
// A backend's overload gate (GapView): its mode, and while it gaps, the gap between two
// admitted new flows.
function gapBadge(g) {
  if (g === null || g === undefined) return ["n/a", "b-none"];
  if (g.mode === "off") return ["off", "b-none"];
  if (!g.gapping) return [`${g.mode}: open`, "b-ok"];
  return [g.gap_ms === null ? `${g.mode}: gapping` : `${g.mode}: ${fmt(g.gap_ms, 1)} ms`, "b-warn"];
}
// Connections still open to a service's removed backends.
function leftOpen(s) { return (s.left_backends || []).reduce((n, l) => n + l.open_connections, 0); }
function renderService(s, now) {
  let v = serviceEls.get(s.name);
  if (!v) { v = serviceCard(s.name); serviceEls.set(s.name, v); $("#services").append(v.root); }
  v.head.replaceChildren(
    el("h2", {}, s.name),
    el("span", { class: "kv" }, "VIP ", el("b", { class: "mono" }, `${s.vip || "(backend addresses)"}:${s.port}`)),
    el("span", { class: "kv" }, "mode ", el("b", { dataset: { field: "mode" } }, s.mode)),
    el("span", { class: "kv" }, "algorithm ", el("b", { dataset: { field: "algorithm" } }, s.algorithm)),
    ...(s.threshold_rps ? [el("span", { class: "kv" }, "threshold ", el("b", {}, `${fmt(s.threshold_rps, 0)}/s`))] : []),
    el("span", { class: "kv" }, "req/s ", el("b", { dataset: { field: "service_rps" } }, fmt(s.rps, 1))),
    el("span", { class: "kv" }, "active ", el("b", { dataset: { field: "service_active" } }, fmtInt(s.active_connections)),
      // The pool's count; connections still open to removed backends are apart (their rows).
      ...(leftOpen(s) ? [el("span", { class: "muted", dataset: { field: "service_left" } }, ` + ${fmtInt(leftOpen(s))} to removed`)] : [])),
    el("span", { class: "kv" }, "connections ", el("b", { dataset: { field: "service_connections_total" } }, fmtInt(s.counters.connections_total))),
    el("span", { class: "kv" }, "refused ", el("b", {}, fmtInt(s.counters.refused_no_backend))),
    // The service's overload gate, when it has one: its state, and what it has refused.
    ...(s.gap && s.gap.mode !== "off" ? [
      el("span", { class: "kv" }, "gate ", el("b", { dataset: { field: "service_gate" } }, gapBadge(s.gap)[0])),
      el("span", { class: "kv" }, "gapped ", el("b", {}, fmtInt(s.gap.refused_total)))] : []));
  const seen = new Set();
  s.backends.forEach((b, i) => {
    const key = `${s.name}/${b.address}`;
    seen.add(key);
    const color = COLORS[i % COLORS.length];
    let row = v.rows.get(key);
    if (!row) { row = backendRow(s.name, b, color); v.rows.set(key, row); v.tbody.append(row.tr); }
    const td = (f) => row.tr.querySelector(`td[data-field="${f}"]`);
    // The effective weight is a fraction while slow start ramps it (0.25 of weight 1).
    const eff = Math.round(b.effective_weight * 100) / 100;
    td("weight").textContent = eff !== b.weight ? `${b.weight} (${eff})` : String(b.weight);
    // Ejected by passive outlier detection: out, or still in use while the pool panics.
    // The detector that ejected it is named: consecutive failures, or its rate against the pool's.
    const ejected = b.ejected_by ? `ejected: ${b.ejected_by.replace("_", " ")}` : "ejected";
    const [health, healthClass] = !b.located ? ["unlocated", "b-warn"] : !b.healthy ? ["down", "b-bad"]
      : b.ejected ? (s.panic ? [`${ejected} (panic: in use)`, "b-warn"] : [ejected, "b-bad"]) : ["healthy", "b-ok"];
    setBadge(td("health"), health, healthClass);
    setBadge(td("state"), b.state, b.draining ? "b-warn" : "b-ok");
    setBadge(td("gap"), ...gapBadge(b.gap));
    td("active_connections").textContent = fmtInt(b.active_connections);
    td("connections_total").textContent = fmtInt(b.connections_total);
    td("connections_total").dataset.value = String(b.connections_total);
    td("rps").textContent = fmt(b.rps, 1);
    td("response_time_ms").textContent = b.response_time_ms === null ? "–" : fmt(b.response_time_ms, 2) + " ms";
    row.btn.dataset.action = b.draining ? "undrain" : "drain";
    row.btn.textContent = b.draining ? "Undrain" : "Drain";
    row.color = color;
    let h = history.get(key);
    if (!h) { h = []; history.set(key, h); }
    h.push({ t: now, rps: b.rps, active: b.active_connections, rt: b.response_time_ms });
    while (h.length && h[0].t < now - HISTORY_SECS * 1000) h.shift();
  });
  for (const [key, row] of v.rows) if (!seen.has(key)) { row.tr.remove(); v.rows.delete(key); history.delete(key); }
  v.left.replaceChildren(...(s.left_backends || []).map((l) => leftRow(s.name, l)));
  const series = [...v.rows.entries()].map(([key, row]) => ({ color: row.color, points: history.get(key) || [] }));
  drawChart(v.charts.rps, series, "rps", "", now);
  drawChart(v.charts.active, series, "active", "", now);
  drawChart(v.charts.rt, series, "rt", "", now);
}

// ----- switches and events -------------------------------------------------------------------
function renderSwitches(list) {
  const tb = $("#switches tbody");
  if (!list.length) { tb.replaceChildren(el("tr", {}, el("td", { colspan: "7", class: "muted" }, "No switch connected."))); return; }
  tb.replaceChildren(...list.map((s) => {
    const up = s.ports.filter((p) => p.up).length;
    const since = new Date(s.connected_since_unix * 1000);
    // A port at max_hosts_per_port refuses new hosts: name it, so the operator sees where.
    const hosts = s.ports.reduce((n, p) => n + p.hosts, 0);
    const full = s.ports.filter((p) => p.full).map((p) => p.port_no);
    return el("tr", { dataset: { dpid: s.dpid } },
      el("td", { class: "mono" }, s.dpid),
      el("td", {}, `${up}/${s.ports.length}`),
      el("td", { class: "num", dataset: { field: "hosts" } },
        full.length ? `${fmtInt(hosts)} (port ${full.join(", ")} full)` : fmtInt(hosts)),
      el("td", {}, `${since.toLocaleTimeString()} (${fmtDuration(s.connected_secs)})`),
      el("td", { class: "num", dataset: { field: "flow_count" } }, s.flow_count === null ? "–" : fmtInt(s.flow_count)),
      el("td", { class: "num" }, fmtInt(s.packet_in)),
      el("td", { class: s.last_error ? "" : "muted" }, s.last_error || "none"));
  }));
}
function renderEvents(list) {
  const ol = $("#events");
  if (!list.length) { ol.replaceChildren(el("li", { class: "muted" }, "No events yet.")); return; }
  ol.replaceChildren(...list.slice().reverse().map((e) =>
    el("li", {}, el("span", { class: "t" }, `+${(e.at_ms / 1000).toFixed(1)}s`), el("span", { class: "k" }, e.kind), el("span", {}, e.detail))));
}

function render(snap) {
  const now = Date.now();
  lastSnapshot = snap;
  $("#uptime").textContent = fmtDuration(snap.uptime_ms / 1000);
  $("#n-switches").textContent = fmtInt(snap.switches.length);
  $("#n-connections").textContent = fmtInt(snap.connections);
  $("#n-packet-in").textContent = fmtInt(snap.packet_in_total);
  $("#decision-latency").textContent = snap.decision_latency.count ? `${fmt(snap.decision_latency.mean_us, 1)} µs` : "–";
  $("#controller-gate").textContent = gapBadge(snap.controller_gate)[0];
  const names = new Set(snap.services.map((s) => s.name));
  for (const [name, v] of serviceEls) if (!names.has(name)) { v.root.remove(); serviceEls.delete(name); }
  snap.services.forEach((s) => renderService(s, now));
  if (!snap.services.length) $("#services").replaceChildren(el("section", { class: "card muted" }, "No service configured."));
  renderSwitches(snap.switches);
  renderEvents(snap.events);
  document.body.dataset.seq = String(snap.seq);
}

// ----- live stream ---------------------------------------------------------------------------
function connect() {
  const es = new EventSource("/api/v1/stream");
  es.addEventListener("snapshot", (ev) => {
    $("#live").textContent = "live"; $("#live").className = "pill pill-on";
    try { render(JSON.parse(ev.data)); } catch (e) { console.error(e); }
  });
  es.onerror = () => { $("#live").textContent = "reconnecting"; $("#live").className = "pill pill-off"; };
}
fetch("/api/v1/status").then((r) => r.json()).then((s) => {
  $("#version").textContent = "v" + s.version;
  if (!s.mutations_enabled) $("#token-state").textContent = "changes disabled (no token configured)";
}).catch(() => {});
window.addEventListener("resize", () => { if (lastSnapshot) render(lastSnapshot); });
connect();
