// geolog console: polls the overview once a second and renders it. No
// library; every value goes in through textContent, never as markup.
"use strict";

const pollMs = 1000;
const historyMax = 120;
const palette = ["#2a6fdb", "#d35400", "#16a085", "#8e44ad", "#c0392b", "#7f8c8d", "#27ae60", "#b9770e"];

const state = { polls: 0, history: [], prevTails: null, prevTime: 0, colors: {} };

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function svgEl(tag, attrs) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  return e;
}

function colorOf(region) {
  if (!(region in state.colors)) {
    state.colors[region] = palette[Object.keys(state.colors).length % palette.length];
  }
  return state.colors[region];
}

function fmtMs(ms) {
  if (ms < 1000) return ms + " ms";
  if (ms < 60000) return (ms / 1000).toFixed(1) + " s";
  return (ms / 60000).toFixed(1) + " min";
}

function cell(text, cls, data) {
  const td = el("td", Object.assign({ class: cls || "" }, data || {}), text);
  return td;
}

function table(head, rows) {
  const thead = el("thead", null, el("tr", null, ...head.map((h) => el("th", null, h))));
  return el("table", null, thead, el("tbody", null, ...rows));
}

// records/s from tail deltas: only ranges whose tail is known in both
// polls count, and a tail never counts backwards.
function rateOf(o, now) {
  const tails = new Map();
  for (const s of o.streams) {
    for (const r of s.ranges || []) {
      if (r.known) tails.set(s.name + "/" + r.range, r.tail);
    }
  }
  let rate = null;
  if (state.prevTails !== null && now > state.prevTime) {
    let added = 0;
    for (const [k, tail] of tails) {
      const prev = state.prevTails.get(k);
      if (prev !== undefined && tail > prev) added += tail - prev;
    }
    rate = added / ((now - state.prevTime) / 1000);
  }
  state.prevTails = tails;
  state.prevTime = now;
  return rate;
}

function record(o) {
  const now = o.time_unix_ms;
  const rate = rateOf(o, now);
  const last = state.history[state.history.length - 1];
  if (last && last.t === now) return; // the same snapshot again
  state.history.push({ t: now, rate: rate, lag: Object.assign({}, o.lag_by_region) });
  while (state.history.length > historyMax) state.history.shift();
}

function niceMax(v) {
  if (v <= 0) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

// drawChart plots series (name -> [{t, v}]) over the last historyMax
// seconds.
function drawChart(svg, series, colorFor) {
  while (svg.firstChild) svg.firstChild.remove();
  const W = 600, H = 160, L = 48, B = 18, T = 6, R = 6;
  const tEnd = state.history.length ? state.history[state.history.length - 1].t : 0;
  const tStart = tEnd - historyMax * pollMs;
  let vmax = 0;
  for (const pts of Object.values(series)) for (const p of pts) vmax = Math.max(vmax, p.v);
  vmax = niceMax(vmax);
  const x = (t) => L + ((t - tStart) / (tEnd - tStart || 1)) * (W - L - R);
  const y = (v) => T + (1 - v / vmax) * (H - T - B);
  for (const frac of [0, 0.5, 1]) {
    svg.append(svgEl("line", { class: "axis", x1: L, x2: W - R, y1: y(vmax * frac), y2: y(vmax * frac) }));
    const label = svgEl("text", { x: L - 4, y: y(vmax * frac) + 3, "text-anchor": "end" });
    label.textContent = String(Math.round(vmax * frac * 10) / 10);
    svg.append(label);
  }
  const ago = svgEl("text", { x: L, y: H - 4 });
  ago.textContent = "−2 min";
  svg.append(ago);
  const nowLabel = svgEl("text", { x: W - R, y: H - 4, "text-anchor": "end" });
  nowLabel.textContent = "now";
  svg.append(nowLabel);
  for (const [name, pts] of Object.entries(series)) {
    if (pts.length === 0) continue;
    const d = pts.map((p) => x(p.t).toFixed(1) + "," + y(p.v).toFixed(1)).join(" ");
    svg.append(svgEl("polyline", { points: d, fill: "none", stroke: colorFor(name), "stroke-width": 1.6, "data-series": name }));
  }
}

function renderCharts() {
  const rate = state.history.filter((h) => h.rate !== null).map((h) => ({ t: h.t, v: h.rate }));
  drawChart(document.getElementById("chart-rate"), { "records/s": rate }, () => palette[0]);
  const last = state.history[state.history.length - 1];
  document.getElementById("rate-now").textContent = last && last.rate !== null ? Math.round(last.rate) + " now" : "";
  const lag = {};
  for (const h of state.history) {
    for (const [region, v] of Object.entries(h.lag || {})) (lag[region] = lag[region] || []).push({ t: h.t, v: v });
  }
  drawChart(document.getElementById("chart-lag"), lag, colorOf);
  const legend = document.getElementById("lag-legend");
  legend.replaceChildren(...Object.keys(lag).sort().map((r) => {
    const s = el("span", null, r + " " + (last && last.lag[r] !== undefined ? last.lag[r] : "?"));
    s.style.color = colorOf(r);
    return s;
  }));
}

function renderRegions(o) {
  const box = el("div", { class: "regions" });
  for (const region of o.regions) {
    const rows = region.nodes.map((n) => el("tr", { "data-node": n.addr },
      cell(n.addr), cell(n.up ? "up" : "down", n.up ? "up" : "down"), cell(n.error || "", "error")));
    const h = el("h3", null, region.name + (region.name === o.region ? " (this node's region)" : ""));
    box.append(el("div", { "data-region": region.name }, h, table(["node", "state", "last error"], rows)));
  }
  document.getElementById("regions").replaceChildren(box);
}

function regionCell(c) {
  if (!c.known) return cell("?", "unknown c-region");
  if (c.home) return cell(c.applied_end + " home", "num c-region");
  let text = c.applied_end + " lag " + c.offset_lag + " / " + fmtMs(c.time_lag_ms);
  if (c.state && c.state !== "streaming" && c.state !== "mirror") text += " " + c.state;
  return cell(text, "num c-region" + (c.offset_lag > 0 ? " lagging" : ""));
}

function renderStream(s) {
  const box = el("div", { class: "stream", "data-stream": s.name });
  box.append(el("h3", null, s.name + "  ", el("small", null,
    s.range_count + " ranges in " + (s.regions || []).join(", "))));
  if (s.error) box.append(el("p", { class: "error" }, s.error));
  if (s.ranges_left_out) {
    box.append(el("p", { class: "note" }, "the first " + s.ranges.length + " ranges; " + s.ranges_left_out + " more not shown"));
  }
  const regions = s.regions || [];
  const head = ["range", "home", "epoch", "tail", "leader"].concat(regions.map((r) => "in " + r));
  const rows = (s.ranges || []).map((r) => {
    const tr = el("tr", { "data-range": r.range },
      cell(r.range, "num c-range"), cell(r.home || "?", "c-home"),
      cell(r.known ? r.epoch : "?", "num c-epoch"), cell(r.known ? r.tail : "?", "num c-tail"),
      cell(r.known ? (r.leader || "-") : "?", "c-leader"));
    for (const region of regions) {
      const c = regionCell(r.regions[region] || { known: false });
      c.setAttribute("data-region", region);
      tr.append(c);
    }
    return tr;
  });
  box.append(table(head, rows));
  box.append(renderGroups(s));
  box.append(renderOrphans(s));
  return box;
}

function renderGroups(s) {
  const div = el("div", { class: "groups" }, el("h4", null, "consumer groups"));
  if (!s.groups || s.groups.length === 0) {
    div.append(el("p", { class: "note" }, "none"));
    return div;
  }
  const rows = s.groups.map((g) => {
    let detail = g.error || g.hidden || (g.ranges || []).map((r) =>
      r.range + ": " + (r.has_position ? r.committed : "-") + " lag " + r.lag_records + " / " + fmtMs(r.lag_ms)).join("; ");
    return el("tr", { "data-group": g.group }, cell(g.group), cell(g.state), cell(g.members, "num"),
      cell(g.hidden ? "?" : g.lag_records, "num c-lag"), cell(detail, g.error ? "error" : g.hidden ? "note" : ""));
  });
  div.append(table(["group", "state", "members", "lag (records)", "per range: committed, lag"], rows));
  return div;
}

function renderOrphans(s) {
  const div = el("div", { class: "orphans" }, el("h4", null, "orphan logs"));
  const o = s.orphans;
  if (!o) return div;
  if (o.hidden) {
    div.append(el("p", { class: "note" }, o.hidden));
    return div;
  }
  if (o.error) div.append(el("p", { class: "error" }, o.error));
  for (const u of o.unanswered || []) div.append(el("p", { class: "error" }, "did not answer: " + u));
  if (!o.forks || o.forks.length === 0) {
    div.append(el("p", { class: "note" }, "none (listed " + fmtMs(o.age_ms) + " ago)"));
    return div;
  }
  const rows = o.forks.map((f) => el("tr", null, cell(f.region), cell(f.range, "num"), cell(f.fork_index, "num"),
    cell(f.fork_offset, "num"), cell(f.epoch, "num"), cell(f.records, "num"), cell(f.bytes, "num"), cell(f.node)));
  div.append(table(["region", "range", "fork", "fork offset", "new epoch", "records", "bytes", "node"], rows));
  return div;
}

function render(o) {
  document.getElementById("whoami").textContent = "node " + o.node + " in " + o.region +
    (o.viewer ? " — viewing as " + o.viewer : "");
  const errs = document.getElementById("errors");
  errs.hidden = !(o.errors && o.errors.length);
  errs.replaceChildren(...(o.errors || []).map((e) => el("p", null, e)));
  renderRegions(o);
  document.getElementById("streams-count").textContent = "(" + o.streams.length +
    (o.streams_left_out ? ", " + o.streams_left_out + " more not shown" : "") + ")";
  const list = document.getElementById("streams");
  if (o.streams.length === 0) list.replaceChildren(el("p", { class: "note" }, "no stream to show"));
  else list.replaceChildren(...o.streams.map(renderStream));
  renderCharts();
}

function setStatus(ok, text) {
  const s = document.getElementById("status");
  s.className = "status " + (ok ? "ok" : "bad");
  s.textContent = text;
}

async function poll() {
  try {
    const resp = await fetch("api/overview", { cache: "no-store" });
    const body = await resp.json();
    if (!resp.ok) throw new Error(body.error || resp.statusText);
    record(body);
    render(body);
    state.polls++;
    document.body.setAttribute("data-polls", String(state.polls));
    setStatus(true, "live · " + new Date(body.time_unix_ms).toLocaleTimeString());
  } catch (e) {
    setStatus(false, "not updating: " + e.message);
  } finally {
    setTimeout(poll, pollMs);
  }
}

poll();
