"use strict";
const SERIES = [["pages", "#2563eb", "pages done"], ["discovered", "#16a34a", "discovered"],
                ["duplicates", "#f59e0b", "duplicates"], ["other_skips", "#9ca3af", "other refusals"],
                ["errors", "#dc2626", "errors"]];
const $ = (id) => document.getElementById(id);
const fmt = (n) => Number(n).toLocaleString("en-US");
function cell(text, cls) { const td = document.createElement("td"); td.textContent = text; if (cls) td.className = cls; return td; }
function row(cells, attrs) {
  const tr = document.createElement("tr");
  for (const [k, v] of Object.entries(attrs || {})) tr.setAttribute(k, v);
  cells.forEach((c) => tr.appendChild(c));
  return tr;
}
function fill(id, rows) { const body = $(id); body.replaceChildren(...rows); }

function crawls(state) {
  const shown = state.crawls.length, all = state.crawl_count || shown;
  $("crawls-note").textContent = all > shown ? `(the ${shown} with the most URLs of ${fmt(all)})` : "";
  fill("crawls", state.crawls.map((c) => row([
    cell(c.id), cell(fmt(c.done), "done"), cell(fmt(c.queued), "queued"), cell(fmt(c.in_flight), "in-flight"),
    cell(fmt(c.known), "known"), cell(fmt(c.queues) + " (" + fmt(c.active_queues) + ")", "queues"),
    cell(c.revisit || "never", "revisit")], { "data-crawl": c.id })));
}

const SVG = "http://www.w3.org/2000/svg";
// Every value from the API reaches the page as text or as an attribute
// set through the DOM, never as markup: crawl IDs, queue keys, outcome
// classes and node IDs come from clients.
function svg(tag, attrs, text) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = text;
  return el;
}
function span(text, attrs) {
  const el = document.createElement("span");
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  el.textContent = text;
  return el;
}

function chart(rates) {
  const W = 600, H = 200, L = 40, B = 18;
  const n = rates.at.length;
  let max = 1;
  for (const [name] of SERIES) for (const v of rates.series[name] || []) max = Math.max(max, v);
  const x = (i) => L + (n <= 1 ? 0 : (i * (W - L - 4)) / (n - 1));
  const y = (v) => H - B - (v / max) * (H - B - 6);
  const parts = [svg("line", { x1: L, y1: H - B, x2: W, y2: H - B, stroke: "#e5e7eb" }),
    svg("text", { x: 2, y: 12 }, fmt(max.toFixed(max < 10 ? 1 : 0))), svg("text", { x: 2, y: H - B }, "0")];
  if (n === 0) parts.push(svg("text", { x: L + 8, y: H / 2 }, `the first rates appear after ${rates.every_secs * 2} s`));
  for (const [name, color] of SERIES) {
    const values = rates.series[name] || [];
    if (values.length === 0) continue;
    const points = values.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
    parts.push(svg("polyline", { fill: "none", stroke: color, "stroke-width": 1.6, points, "data-series": name }));
  }
  $("chart").replaceChildren(...parts);
  $("legend").replaceChildren(...SERIES.map(([name, color, label]) => {
    const values = rates.series[name] || [];
    const last = values.length ? values[values.length - 1] : 0;
    const swatch = document.createElement("i");
    swatch.style.background = color;
    const figure = document.createElement("b");
    figure.id = "rate-" + name;
    figure.textContent = last.toFixed(1);
    const item = span(label + " ");
    item.prepend(swatch);
    item.append(figure, "/s");
    return item;
  }));
  const classes = Object.entries(rates.errors_by_class || {});
  const errors = $("errors");
  if (classes.length === 0) {
    errors.replaceChildren("errors by class: none reported");
    return;
  }
  const items = classes.map(([name, c]) => {
    const item = span(name + " ", { "data-class": name });
    const total = document.createElement("b");
    total.textContent = fmt(c.total);
    item.append(total, c.per_sec === null ? "" : ` (${c.per_sec.toFixed(1)}/s)`);
    return item;
  });
  errors.replaceChildren("errors by class: ", ...items.flatMap((item, i) => (i ? [", ", item] : [item])));
}

function heat(fillRatio, limit) {
  // Green while far from the rebuild threshold, through yellow to red at it.
  const t = Math.min(1, fillRatio / Math.max(limit, 1e-9));
  const hue = 120 - 120 * t;
  return `hsl(${hue.toFixed(0)}, 70%, ${(88 - 30 * t).toFixed(0)}%)`;
}

function filters(f) {
  $("filters-note").textContent = `(rebuilt past fill ${f.rebuild_fill}, target FP ${f.target_fp}, ${fmt(f.memory_bytes)} bytes)`;
  let worst = null;
  $("heatmap").replaceChildren(...f.partitions.map((p) => {
    const div = document.createElement("div");
    div.className = "cell";
    div.dataset.partition = p.partition;
    div.dataset.fill = p.fill;
    div.style.background = heat(p.fill, f.rebuild_fill);
    div.textContent = p.partition;
    div.title = `partition ${p.partition}${p.node ? " on " + p.node : ""}\nfill ${(p.fill * 100).toFixed(2)}%\n` +
      `estimated FP ${p.estimated_fp.toExponential(2)}\nobserved FP ${p.refuted}/${p.lookups}\n` +
      `stored ${fmt(p.stored)}\nrebuilds ${p.rebuilds}${p.rebuilding ? " (rebuilding)" : ""}`;
    if (!worst || p.fill > worst.fill) worst = p;
    return div;
  }));
  $("filters-worst").textContent = worst
    ? `fullest: partition ${worst.partition}, fill ${(worst.fill * 100).toFixed(2)}%, estimated FP ${worst.estimated_fp.toExponential(2)}; ` +
      `rebuilds ${f.partitions.reduce((s, p) => s + p.rebuilds, 0)}`
    : "";
}

function queues(q) {
  $("queues-crawl").textContent = `(crawl ${q.crawl})`;
  const blocked = (secs) => (secs ? new Date(secs * 1000).toISOString().replace("T", " ").slice(0, 19) : "");
  fill("queues", q.top.map((v) => row([cell(v.key), cell(fmt(v.waiting), "waiting"), cell(fmt(v.in_flight)),
    cell(fmt(v.completed)), cell(fmt(v.delay_ms)), cell(blocked(v.blocked_until)), cell(v.crawl_limit ? fmt(v.crawl_limit) : "")],
    { "data-queue": v.key })));
}

function cluster(c) {
  $("cluster-section").hidden = !c;
  if (!c) return;
  $("cluster-note").textContent = `(${c.name}, map epoch ${c.epoch}, ${c.moves} moves in flight)`;
  fill("nodes", c.nodes.map((n) => row([cell(n.id), cell(n.address), cell(fmt(n.partitions)),
    cell((n.leader ? "leader" : "") + (n.draining ? " draining" : ""))], { "data-node": n.id })));
}

async function refresh() {
  const headers = {};
  const token = sessionStorage.getItem("frontier-token");
  if (token) headers.Authorization = "Bearer " + token;
  try {
    const answer = await fetch("/api/state", { headers, cache: "no-store" });
    if (answer.status === 401) {
      $("main").hidden = true;
      $("login").style.display = "block";
      $("login-error").textContent = token ? "that token was refused" : "";
      $("updated").textContent = "token needed";
      return;
    }
    const state = await answer.json();
    $("login").style.display = "none";
    $("main").hidden = false;
    $("node").textContent = state.node ? "node " + state.node : "";
    crawls(state);
    chart(state.rates);
    filters(state.filters);
    queues(state.queues);
    cluster(state.cluster);
    $("updated").textContent = "updated " + new Date().toLocaleTimeString("en-GB");
    document.body.dataset.loaded = "yes";
  } catch (error) {
    $("updated").textContent = "frontier unreachable: " + error;
  }
}

$("login").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem("frontier-token", $("token").value);
  refresh();
});
refresh();
setInterval(refresh, 2000);
