// rlm-mcp trajectory viewer. Draws the JSON model the server embedded (or polls for it live).
// Every string from a run is hostile: it only ever reaches the page as a text node or an
// attribute value set through the DOM, never as markup (no innerHTML anywhere in this file or in
// viewer_run.js). The page inlines viewer_run.js, then this file, in one strict-mode script.

const CONFIG = JSON.parse(document.getElementById("rlm-data").textContent);
const SVGNS = "http://www.w3.org/2000/svg";
const root = document.getElementById("app");
const opened = new Set(); // data-key of every <details> the reader opened: kept across live redraws

function h(tag, props, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = String(v);
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, String(v));
  }
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined || kid === false) continue;
    el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return el;
}

function s(tag, attrs, ...kids) {
  const el = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined) continue;
    el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return el;
}

// A <details> whose body is built only when first opened: a batch of 2,000 sub-calls costs
// nothing until someone looks at it.
function lazy(key, summary, build, cls) {
  const det = h("details", { class: cls, "data-key": key }, h("summary", {}, summary));
  let built = false;
  const fill = () => { if (!built && det.open) { built = true; det.append(build()); } };
  det.addEventListener("toggle", () => { if (det.open) opened.add(key); else opened.delete(key); fill(); });
  if (opened.has(key)) { det.open = true; fill(); }
  return det;
}

const fmtS = (x) => (typeof x === "number" ? (x < 10 ? x.toFixed(2) : x.toFixed(1)) + " s" : "–");
const fmtN = (x) => (typeof x === "number" ? x.toLocaleString("en") : "–");
const fmtTime = (ts) => (typeof ts === "number" ? new Date(ts * 1000).toISOString().replace("T", " ").slice(0, 19) : "–");
const span = (a, b) => (typeof a === "number" && typeof b === "number" ? b - a : null);
const badge = (status) => h("span", { class: "badge st-" + String(status || "unknown").replace(/[^a-z_]/g, "") }, status || "unknown");

// ---- a kept session: its runs as a chain ------------------------------------------------------
const fmtBytes = (n) => (typeof n === "number" ? (n >= 1048576 ? (n / 1048576).toFixed(1) + " MiB" : n >= 1024 ? (n / 1024).toFixed(1) + " KiB" : n + " B") : "–");
const fmtAge = (s) => (s >= 86400 ? (s / 86400).toFixed(1) + " d" : s >= 3600 ? (s / 3600).toFixed(1) + " h" : s >= 60 ? Math.round(s / 60) + " min" : Math.round(s) + " s");
const fmtTokens = (tot) => `${fmtN(tot.prompt_tokens)}+${fmtN(tot.completion_tokens)} tokens` +
  (tot.cached_prompt_tokens ? ` (${fmtN(tot.cached_prompt_tokens)} cached)` : "") + fmtCost(tot.cost_usd);
const STATE_TEXT = { live: "idle, its sandbox live", running: "answering a question", saving: "idle, being saved as its sandbox is given back",
  stored: "idle, saved (restored on the next question)", ended: "ended" };

function chainLink(run) {
  const tot = (run.usage && run.usage.total) || {};
  const names = run.contexts.map((c) => c.name).join(", ");
  const item = h("li", { class: "link", "data-run": run.run_id },
    h("div", { class: "linkhead" }, h("span", { class: "idx" }, `#${run.step}`), " ", badge(run.status), " ",
      h("a", { href: (CONFIG.index_href || "./") + encodeURIComponent(run.run_id), class: "query" }, run.query || run.run_id)),
    h("p", { class: "meta" }, `${fmtTime(run.created_at)} · ${fmtN(run.iterations)} turns · ${fmtN(run.sub_calls)} sub-calls · ` +
      `${fmtS(run.duration_s)} · ${fmtTokens(tot)}`),
    h("p", { class: "meta binds" }, run.contexts.length ? `binds ${names} (${run.contexts.map((c) => c.context_id).join(", ")})` : "no new context"));
  if (run.status !== "completed" && run.status !== "running" && run.reason) item.append(h("div", { class: "banner bad" }, `${run.status}: ${run.reason}`));
  if (run.answer !== null && run.answer !== undefined) {
    item.append(h("pre", { class: "answer" }, run.answer));
    if (run.answer_chars > run.answer.length) item.append(h("p", { class: "meta" }, `… ${fmtN(run.answer_chars)} characters in all: the run's page has the whole answer`));
  }
  return item;
}

function sessionPage(model) {
  const state = model.state;
  const tot = (model.usage && model.usage.total) || {};
  const age = typeof model.created_at === "number" ? Math.max(0, Date.now() / 1000 - model.created_at) : null;
  const status = state ? state.state : "unknown here";
  const page = h("main", { class: "session" },
    h("p", {}, h("a", { href: CONFIG.index_href || "./" }, "← all runs")),
    h("h1", {}, "Kept session ", h("span", { class: "sid" }, model.session_id)),
    h("p", { class: "meta" }, badge(status), ` ${state ? STATE_TEXT[state.state] || state.state : "this server holds no state of it (it ended before this server started, or another process holds it)"}`),
    h("p", { class: "meta summary" }, `started ${fmtTime(model.created_at)}` + (age === null ? "" : ` · ${fmtAge(age)} old`) +
      ` · ${model.runs.length} run${model.runs.length === 1 ? "" : "s"} · ${model.contexts_bound} context${model.contexts_bound === 1 ? "" : "s"} bound · ${fmtTokens(tot)}`));
  if (state && state.state !== "ended") {
    page.append(h("p", { class: "meta size" }, `contexts ${fmtBytes(state.context_bytes)} · ` +
      (typeof state.snapshot_bytes === "number" ? `snapshot ${fmtBytes(state.snapshot_bytes)}` : "no snapshot") +
      (typeof state.histories === "number" ? ` · ${state.histories} histories` : "") + (state.sandbox_live ? " · sandbox live" : " · no sandbox")));
    if (state.snapshot_error) page.append(h("div", { class: "banner warn" }, state.snapshot_error));
  }
  if (state && state.state === "ended" && state.why) page.append(h("div", { class: "banner warn" }, `This session ${state.why}.`));
  page.append(h("ol", { class: "chain" }, model.runs.map(chainLink)));
  return page;
}

// ---- the index ----------------------------------------------------------------------------
function indexPage(runs) {
  const maxTok = Math.max(1, ...runs.map((r) => r.tokens || 0)), maxDur = Math.max(0.001, ...runs.map((r) => r.duration_s || 0));
  const search = h("input", { type: "search", placeholder: "search query, run id, model, session", id: "q", value: CONFIG.q || new URLSearchParams(location.search).get("q") || "" });
  const step = {};  // a kept session's runs numbered in the order they ran (the chain)
  for (const r of [...runs].sort((a, b) => a.created_at - b.created_at)) if (r.session_id) step[r.run_id] = (step[r.session_id] = (step[r.session_id] || 0) + 1);
  const status = h("select", { id: "status" }, h("option", { value: "" }, "any status"),
    [...new Set(runs.map((r) => r.status))].map((st) => h("option", { value: st }, st)));
  status.value = CONFIG.status || "";
  const body = h("tbody");
  for (const r of runs) {
    const bar = s("svg", { class: "spark", viewBox: "0 0 100 12", width: 100, height: 12 },
      s("rect", { class: "bar", x: 0, y: 0, height: 5, width: ((r.tokens || 0) / maxTok) * 100 }, s("title", {}, `${r.tokens} tokens`)),
      s("rect", { class: "bar2", x: 0, y: 7, height: 5, width: ((r.duration_s || 0) / maxDur) * 100 }, s("title", {}, fmtS(r.duration_s))));
    body.append(h("tr", { class: "row", "data-status": r.status, "data-text": `${r.query} ${r.run_id} ${r.model} ${r.session_id || ""}`.toLowerCase() },
      h("td", {}, fmtTime(r.created_at)), h("td", {}, h("a", { href: (CONFIG.run_href || "") + encodeURIComponent(r.run_id) }, r.query || r.run_id),
        r.session_id ? h("span", { class: "meta" }, " · ", h("a", { href: (CONFIG.run_href || "") + encodeURIComponent(r.session_id), class: "session-link", title: r.session_id },
          `session ${r.session_id.slice(0, 10)} #${step[r.run_id]}`)) : null),
      h("td", {}, badge(r.status)), h("td", {}, fmtS(r.duration_s)), h("td", {}, fmtN(r.tokens)), h("td", {}, bar), h("td", {}, r.model || "")));
  }
  const apply = () => {
    const q = search.value.toLowerCase(), st = status.value;
    CONFIG.q = search.value; CONFIG.status = st;
    for (const tr of body.children) tr.hidden = (q && !tr.dataset.text.includes(q)) || (st && tr.dataset.status !== st);
  };
  search.addEventListener("input", apply);
  status.addEventListener("change", apply);
  apply();
  return h("main", { class: "index" }, h("h1", {}, "rlm-mcp runs"), GATES.length ? throttlePanel(GATES) : null, h("div", { class: "filters" }, search, " ", status),
    h("table", {}, h("thead", {}, h("tr", {}, ["time", "query", "status", "duration", "tokens", "", "model"].map((x) => h("th", {}, x)))), body));
}

// ---- the LM endpoints' limits, on the runs list ----------------------------------------------
// Each endpoint and model's limit as the serving process knows it (lm/throttle.py), fetched
// beside the index's own data; nothing is drawn while no endpoint was called.
let GATES = [];  // the last answer of api/throttles (a redrawn index keeps its panel)

function throttlePanel(gates) {
  const rows = gates.map((g) => h("tr", { class: "gate" + (g.limit < g.ceiling ? " warn" : "") },
    h("td", {}, `${g.endpoint} · ${g.model}`), h("td", {}, `${g.limit} of ${g.ceiling}`), h("td", {}, `${g.in_flight}` + (g.waiting ? ` (+${g.waiting} waiting)` : "")),
    h("td", {}, fmtN(g.throttled)), h("td", {}, `${fmtN(g.cuts)}` + (g.queueing_cuts ? ` (${fmtN(g.queueing_cuts)} for latency)` : "")),
    h("td", {}, g.latency_ratio === null || g.latency_ratio === undefined ? "–" : `${g.latency_ratio}×`), h("td", { class: "meta" }, g.process || "")));
  return h("section", { class: "throttles" }, h("div", { class: "lbl" }, "LM endpoints: calls allowed in flight"),
    h("table", {}, h("thead", {}, h("tr", {}, ["endpoint · model", "limit", "in flight", "429/503", "cuts", "latency", ""].map((x) => h("th", {}, x)))), h("tbody", {}, rows)));
}

async function refreshThrottles() {
  try {
    const resp = await fetch((CONFIG.run_href || "") + "api/throttles", { credentials: "same-origin", cache: "no-store" });
    if (resp.ok) {
      GATES = (await resp.json()).data || [];
      const old = document.querySelector("section.throttles");
      const panel = GATES.length ? throttlePanel(GATES) : null;
      if (old && panel) old.replaceWith(panel);
      else if (old) old.remove();
      else if (panel) document.querySelector("main.index h1")?.after(panel);
    }
  } catch (err) { /* the server may be restarting: the next tick tries again */ }
  if (CONFIG.live) setTimeout(refreshThrottles, CONFIG.live.interval_ms);
}

// ---- drawing and live updates -------------------------------------------------------------
function draw(data) {
  const focused = document.activeElement && document.activeElement.id;
  const y = window.scrollY;
  root.replaceChildren(CONFIG.view === "index" ? indexPage(data) : CONFIG.view === "session" ? sessionPage(data) : runPage(data));
  if (focused) document.getElementById(focused)?.focus();
  window.scrollTo(0, y);
  document.body.dataset.version = String(CONFIG.version ?? "");
}

async function poll() {
  const live = CONFIG.live;
  try {
    const resp = await fetch(live.url + (live.url.includes("?") ? "&" : "?") + "since=" + encodeURIComponent(CONFIG.version ?? ""),
      { credentials: "same-origin", cache: "no-store" });
    if (resp.ok) {
      const got = await resp.json();
      if (got.version !== CONFIG.version) { CONFIG.version = got.version; CONFIG.data = got.data; draw(got.data); }
    }
  } catch (err) { /* the server may be restarting: try again on the next tick */ }
  const running = CONFIG.view !== "run" || !(CONFIG.data && CONFIG.data.finished);
  if (running) setTimeout(poll, live.interval_ms);
}

// A live run page follows the run's event stream (`live.events`) rather than polling: each event
// (a turn, a cell, a sub-call batch, the end) asks for the model once, so nothing is asked while
// the run is quiet. The request names the event that caused it (`event=`). Events that arrive
// while a request is out are folded into one more request after it. A stream the server refuses
// (429: too many open, 404) or a browser without EventSource falls back to polling; a dropped
// connection is resumed by EventSource itself (Last-Event-ID). The stream's `end` event stops it.
function follow() {
  const live = CONFIG.live;
  let busy = false, pending = null;
  const refresh = async (cause) => {
    if (busy) { pending = cause; return; }
    busy = true;
    try {
      const resp = await fetch(live.url + (live.url.includes("?") ? "&" : "?") + "since=" + encodeURIComponent(CONFIG.version ?? "") +
        "&event=" + encodeURIComponent(cause), { credentials: "same-origin", cache: "no-store" });
      if (resp.ok) {
        const got = await resp.json();
        if (got.version !== CONFIG.version) { CONFIG.version = got.version; CONFIG.data = got.data; draw(got.data); }
      }
    } catch (err) { /* the next event asks again */ }
    busy = false;
    if (pending !== null) { const next = pending; pending = null; refresh(next); }
  };
  let stream = null, opened = false;
  const state = (value) => { document.body.dataset.live = value; };
  const open = () => {
    const es = (stream = new EventSource(live.events));
    es.onopen = () => { opened = true; state("stream"); };
    es.onmessage = (e) => refresh(e.lastEventId || "message");
    for (const type of live.event_types || []) es.addEventListener(type, (e) => refresh(e.lastEventId || type));
    es.addEventListener("end", () => { es.close(); stream = null; state("ended"); refresh("end"); });
    es.onerror = () => {
      // CONNECTING: EventSource reconnects by itself. CLOSED: the server refused the stream.
      if (es.readyState !== EventSource.CLOSED || es !== stream) return;
      stream = null;
      state("poll");
      setTimeout(poll, opened ? 0 : live.interval_ms);
    };
  };
  // A hidden tab gives its stream back (a browser holds at most 6 connections to one HTTP/1.1
  // server, and an owner a few streams), and opens a new one when shown again: the new stream
  // starts from the run's first event, which costs a request only if the model changed.
  document.addEventListener("visibilitychange", () => {
    const now = document.body.dataset.live;
    if (document.hidden && stream) { stream.close(); stream = null; state("hidden"); }
    else if (!document.hidden && now === "hidden") open();
  });
  open();
}

draw(CONFIG.data);
if (CONFIG.live && CONFIG.live.events && !(CONFIG.data && CONFIG.data.finished) && typeof EventSource === "function") follow();
else if (CONFIG.live) setTimeout(poll, CONFIG.live.interval_ms);
if (CONFIG.view === "index" && CONFIG.live) refreshThrottles();
