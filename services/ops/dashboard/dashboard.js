// memstream operations dashboard. Polls /v1/ops/snapshot (the same sample /metrics exports)
// and draws small SVG line charts by hand: a charting library would be the only third-party
// asset, and it would have to be vendored or built at install time for a few polylines.
"use strict";

const COLORS = { hierarchy: "#58a6ff", graph: "#bc8cff", lexical: "#3fb950", dense: "#d29922",
                 freshness_p95: "#f778ba", query_p50_ms: "#56d4dd", query_p95_ms: "#ff7b72" };
const REFRESH_MS = 1000;

function el(tag, attrs = {}, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function fmt(n, digits = 0) {
  return Number(n).toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits });
}

// series: {name: [[t, v], ...]}; draws one polyline per series on a shared time axis.
function drawChart(svg, series, unit) {
  const W = svg.clientWidth || 600, H = svg.clientHeight || 160, L = 44, B = 16, T = 6, R = 6;
  const ns = "http://www.w3.org/2000/svg";
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const points = Object.values(series).flat();
  if (!points.length) return;
  const t0 = Math.min(...points.map(p => p[0])), t1 = Math.max(...points.map(p => p[0]));
  const vmax = Math.max(1e-9, ...points.map(p => p[1])) * 1.1;
  const x = t => L + (t1 > t0 ? (t - t0) / (t1 - t0) : 1) * (W - L - R);
  const y = v => T + (1 - v / vmax) * (H - T - B);
  for (const frac of [0, 0.5, 1]) {
    const line = document.createElementNS(ns, "line");
    Object.entries({ x1: L, x2: W - R, y1: y(vmax * frac), y2: y(vmax * frac), class: "axis" }).forEach(([k, v]) => line.setAttribute(k, v));
    svg.appendChild(line);
    const label = document.createElementNS(ns, "text");
    label.setAttribute("x", 2); label.setAttribute("y", y(vmax * frac) + 3);
    label.textContent = fmt(vmax * frac, vmax < 10 ? 1 : 0) + (frac === 1 ? " " + unit : "");
    svg.appendChild(label);
  }
  const span = document.createElementNS(ns, "text");
  span.setAttribute("x", W - R - 60); span.setAttribute("y", H - 2);
  span.textContent = `last ${fmt((t1 - t0) / 60, 1)} min`;
  svg.appendChild(span);
  // Views that keep up draw identical lines: dash all but the first so none hides another.
  const DASHES = ["", "6 3", "2 3", "8 2 2 2", "4 4"];
  Object.entries(series).forEach(([name, pts], index) => {
    const poly = document.createElementNS(ns, "polyline");
    poly.setAttribute("fill", "none");
    poly.setAttribute("stroke", COLORS[name] || "#ccc");
    poly.setAttribute("stroke-width", "2");
    poly.setAttribute("points", pts.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" "));
    if (DASHES[index % DASHES.length]) poly.setAttribute("stroke-dasharray", DASHES[index % DASHES.length]);
    poly.dataset.series = name;
    svg.appendChild(poly);
  });
}

function perView(history, key) {
  const out = {};
  for (const point of history) for (const [view, v] of Object.entries(point[key] || {})) (out[view] = out[view] || []).push([point.time, v]);
  return out;
}

function render(snap) {
  document.getElementById("meta").textContent =
    `${snap.mode} · log ${snap.log_backend} · topic ${snap.topic} · health window ${snap.window_seconds}s · ${new Date(snap.time * 1000).toLocaleTimeString()}`;
  const body = document.querySelector("#projections tbody");
  body.replaceChildren(...snap.projections.map(p => {
    const tr = el("tr", { "data-projection": p.name });
    const status = el("td", { class: `status status-${p.status}` }, p.status + (p.last_error ? " \u24d8" : ""));
    if (p.last_error) status.title = p.last_error;  // why the projection fails (a store down, …)
    tr.append(el("td", {}, p.name), status, el("td", {}, p.backend),
              el("td", {}, String(p.generation) + (p.rebuilding.length ? ` (rebuilding ${p.rebuilding.join(",")})` : "")),
              el("td", { class: "num lag-events" }, String(p.lag_events)),
              el("td", { class: "num lag-seconds" }, fmt(p.lag_seconds, 1)),
              el("td", { class: "num rate" }, fmt(p.rate, 1)), el("td", { class: "num errors" }, String(p.errors)),
              el("td", { class: p.paused ? "paused state" : "state" }, p.paused ? "paused" : "running"));
    return tr;
  }));
  const h = snap.history || [];
  drawChart(document.getElementById("chart-lag-events"), perView(h, "lag_events"), "ev");
  drawChart(document.getElementById("chart-lag-seconds"), perView(h, "lag_seconds"), "s");
  drawChart(document.getElementById("chart-rate"), perView(h, "rate"), "rec/s");
  drawChart(document.getElementById("chart-latency"), {
    freshness_p95: h.map(p => [p.time, p.freshness_p95]), query_p50_ms: h.map(p => [p.time, p.query_p50_ms]),
    query_p95_ms: h.map(p => [p.time, p.query_p95_ms]) }, "");
  document.getElementById("legend").replaceChildren(...Object.entries(COLORS).map(([name, color]) => {
    const s = el("span"); const i = el("i"); i.style.background = color; s.append(i, document.createTextNode(name)); return s;
  }));
  const f = snap.freshness;
  document.getElementById("freshness").textContent = f.count
    ? `p50 ${fmt(f.p50_seconds, 2)} s · p95 ${fmt(f.p95_seconds, 2)} s over ${f.count} events (last ${f.window_seconds / 60} min)`
    : "no events became searchable in the last 5 min";
  document.querySelector("#queries tbody").replaceChildren(...Object.entries(snap.queries).map(([s, q]) => {
    const tr = el("tr", { "data-strategy": s });
    tr.append(el("td", {}, s), el("td", { class: "num" }, String(q.count)), el("td", { class: "num" }, fmt(q.p50_ms, 1)),
              el("td", { class: "num" }, fmt(q.p95_ms, 1)));
    return tr;
  }));
  const d = snap.dead_letters;
  const badge = document.getElementById("dlq-count");
  badge.textContent = String(d.pending); badge.className = d.pending ? "badge bad" : "badge";
  document.querySelector("#dead-letters tbody").replaceChildren(...d.recent.map(e => {
    const tr = el("tr");
    tr.append(el("td", {}, e.origin), el("td", {}, e.projections.join(", ")), el("td", { class: "reason" }, e.reason),
              el("td", {}, e.replayed ? "yes" : "no"));
    return tr;
  }));
  renderForgetting(snap.forgetting);
  document.body.dataset.updated = String(snap.time);
}

// Pending forgets (requested, not yet past the eraser and every view), request -> complete time,
// and each tenant's retention with its last sweep.
function renderForgetting(f) {
  if (!f) return;
  const badge = document.getElementById("forgets-pending");
  const pending = f.pending === null ? "–" : String(f.pending);
  badge.textContent = pending; badge.className = f.pending ? "badge bad" : "badge";
  const c = f.completed;
  document.getElementById("forgets-summary").textContent = f.pending === null ? "not observed by this process" :
    (f.pending ? `oldest pending ${fmt(f.oldest_pending_seconds, 1)} s · ` : "") +
    (c && c.count ? `request → complete p50 ${fmt(c.p50_seconds, 2)} s · p95 ${fmt(c.p95_seconds, 2)} s over ${c.count} forgets (last hour)`
                  : "no forget completed in the last hour");
  document.querySelector("#forgets tbody").replaceChildren(...f.pending_requests.map(p => {
    const tr = el("tr", { "data-forget": p.forget_id });
    tr.append(el("td", {}, p.forget_id), el("td", {}, p.tenant_id), el("td", {}, p.level), el("td", {}, p.requested_by || "–"),
              el("td", { class: "num" }, fmt(p.age_seconds, 1)), el("td", {}, p.partitions_pending.join(", ") || "–"));
    return tr;
  }));
  document.querySelector("#retention tbody").replaceChildren(...f.retention.map(r => {
    const s = r.last_sweep;
    const tr = el("tr", { "data-tenant": r.tenant_id });
    tr.append(el("td", {}, r.tenant_id), el("td", { class: "num retain-days" }, String(r.retain_days)),
              el("td", {}, new Date(r.cutoff).toLocaleString()),
              el("td", { class: "last-sweep" }, s ? new Date(s.requested_at).toLocaleString() : "never"),
              el("td", { class: "sweep-state" }, s ? (s.complete ? "complete" : "in progress") : "nothing to forget yet"));
    return tr;
  }));
}

async function tick() {
  try {
    const r = await fetch("/v1/ops/snapshot", { cache: "no-store" });
    if (r.status === 401) { window.location.replace("/dashboard"); return; }  // the session ended: sign in again
    if (!r.ok) throw new Error(`HTTP ${r.status}`);
    render(await r.json());
  } catch (err) {
    document.getElementById("meta").textContent = `cannot reach memstream: ${err.message}`;
  } finally {
    setTimeout(tick, REFRESH_MS);
  }
}
tick();
