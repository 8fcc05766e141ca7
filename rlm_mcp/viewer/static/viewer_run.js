// The run page of the viewer: code highlighting, the charts, turns, cells, calls and children.
// Inlined before viewer.js in the page's one script (rlm_mcp/viewer/page.py): its helpers (h, s,
// lazy, the formatters) are defined there and called only once the whole script has run. Every
// string from a run reaches the page as a text node or a DOM-set attribute, never as markup.

// ---- code highlighting (Python, the only language of a ```repl block) -----------------------
const KW = new Set(("False None True and as assert async await break class continue def del elif else except " +
  "finally for from global if import in is lambda nonlocal not or pass raise return try while with yield").split(" "));
const FN = new Set(("print len range str int float list dict set sorted enumerate zip min max sum any all open " +
  "llm_query llm_query_batched rlm_query rlm_query_batched SHOW_VARS FINAL FINAL_VAR answer context").split(" "));
const TOKEN = /(#[^\n]*)|("""[\s\S]*?"""|'''[\s\S]*?'''|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')|(\b\d[\d_]*(?:\.\d+)?\b)|(\b[A-Za-z_]\w*\b)/g;

function highlight(code) {
  const pre = h("pre", { class: "code" });
  let last = 0;
  for (const m of code.matchAll(TOKEN)) {
    if (m.index > last) pre.append(code.slice(last, m.index));
    let cls = m[1] ? "c" : m[2] ? "s" : m[3] ? "n" : KW.has(m[4]) ? "k" : FN.has(m[4]) ? "f" : null;
    pre.append(cls ? h("span", { class: "t" + cls }, m[0]) : m[0]);
    last = m.index + m[0].length;
  }
  if (last < code.length) pre.append(code.slice(last));
  return pre;
}

// The model's reply: prose as text, each ```repl block highlighted.
function reply(text) {
  const box = h("div", { class: "reply" });
  const fence = /```repl[^\n]*\n([\s\S]*?)(?:```|$)/g;
  let last = 0;
  for (const m of text.matchAll(fence)) {
    if (m.index > last) box.append(h("pre", { class: "prose" }, text.slice(last, m.index)));
    box.append(highlight(m[1]));
    last = m.index + m[0].length;
  }
  if (last < text.length) box.append(h("pre", { class: "prose" }, text.slice(last)));
  return box;
}

// ---- charts ---------------------------------------------------------------------------------
function turnChart(run) {
  const turns = run.turns.filter((t) => typeof t.iteration === "number");
  if (!turns.length) return null;
  const W = 640, H = 120, pad = 28, bw = (W - pad * 2) / turns.length;
  const tokens = turns.map((t) => t.root_calls.reduce((a, c) => Math.max(a, c.prompt_tokens || 0), 0));
  const secs = turns.map((t) => span(t.start, t.end) || 0);
  const maxT = Math.max(1, ...tokens), maxS = Math.max(0.001, ...secs);
  const svg = s("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "root-window tokens and seconds per turn" });
  const points = [];
  turns.forEach((t, i) => {
    const x = pad + i * bw, bh = (tokens[i] / maxT) * (H - 40);
    svg.append(s("rect", { class: "bar", x: x + 2, y: H - 20 - bh, width: Math.max(1, bw - 4), height: bh },
      s("title", {}, `turn ${t.iteration}: ${tokens[i]} tokens in the root window, ${fmtS(secs[i])}`)));
    points.push(`${x + bw / 2},${H - 20 - (secs[i] / maxS) * (H - 40)}`);
    if (turns.length <= 40) svg.append(s("text", { x: x + bw / 2, y: H - 6, "text-anchor": "middle" }, t.iteration));
  });
  svg.append(s("polyline", { class: "line", points: points.join(" ") }));
  svg.append(s("text", { x: 4, y: 12 }, `bars: root-window tokens (max ${fmtN(maxT)}) · line: seconds per turn (max ${fmtS(maxS)})`));
  return svg;
}

// Turns, root LM calls, cells, sub-call batches and child runs of one run on the tree's time axis.
function timeline(run, model) {
  const t0 = model.t0, t1 = Math.max(model.t1 || 0, t0 + 0.001);
  if (typeof t0 !== "number") return null;
  const W = 900, L = 90, row = 18;
  const rows = [["turns", []], ["root LM", []], ["cells", []], ["sub-calls", []], ["child RLMs", []]];
  for (const t of run.turns) {
    rows[0][1].push([t.start, t.end, `turn ${t.iteration}`, "turn", `turn-${run.run_id}-${t.iteration}`]);
    for (const c of t.root_calls) rows[1][1].push([c.start, c.end, `root call: ${c.prompt_tokens}+${c.completion_tokens} tokens, ${fmtS(c.latency_s)}`, c.status === "ok" ? "lm" : "bad", null]);
    for (const c of t.cells) {
      const bad = c.error || c.timed_out || c.restarted;
      if (c.block !== null) rows[2][1].push([c.start, c.end, `turn ${t.iteration} cell ${c.block}: ${fmtS(c.duration_s)}`, bad ? "bad" : "cell", null]);
      for (const b of c.batches) rows[3][1].push([b.start, b.end, `${b.kind || "?"} batch #${b.batch}: ${b.count} calls, ${b.failed} failed`, b.failed ? "warn" : "batch", null]);
    }
  }
  for (const id of run.children) {
    const ch = model.runs[id];
    if (ch) rows[4][1].push([ch.start, ch.end, `child ${id}: ${ch.status}`, ch.status === "completed" ? "child" : "bad", "run-" + id]);
  }
  const H = rows.length * row + 16;
  const svg = s("svg", { class: "timeline", viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "timeline" });
  const x = (ts) => L + ((ts - t0) / (t1 - t0)) * (W - L - 4);
  rows.forEach(([label, items], r) => {
    const y = r * row;
    svg.append(s("text", { x: 2, y: y + 13 }, label));
    for (const [a, b, tip, cls, target] of items) {
      if (typeof a !== "number") continue;
      const end = typeof b === "number" ? b : model.t1;
      const rect = s("rect", { class: "tl " + cls, x: x(a), y: y + 3, width: Math.max(1.5, x(end) - x(a)), height: row - 6 }, s("title", {}, tip));
      if (target) rect.addEventListener("click", () => document.getElementById(target)?.scrollIntoView({ behavior: "smooth" }));
      svg.append(rect);
    }
  });
  svg.append(s("text", { x: L, y: H - 2 }, "0 s"), s("text", { x: W - 4, y: H - 2, "text-anchor": "end" }, fmtS(t1 - t0)));
  return h("div", { class: "tlbox" }, svg);
}

// ---- a run page ---------------------------------------------------------------------------
// What an LM call waited besides its answer (logged only when it did): a place under the
// endpoint's limit, retries, answers 429/503, sleeps between attempts.
function fmtWaits(call) {
  let text = call.queued_s ? ` · waited ${fmtS(call.queued_s)}` : "";
  if (call.retries) text += ` · ${call.retries} ${call.retries === 1 ? "retry" : "retries"}` +
    (call.throttled ? ` (${call.throttled}× 429/503)` : "") + (call.backoff_s ? `, ${fmtS(call.backoff_s)} backing off` : "");
  return text;
}

// The run tree's LM waits, one line; null when no call waited or retried.
function waitsLine(w) {
  if (!w || !(w.retried || w.queued_s >= 0.05)) return null;
  const parts = [];
  if (w.queued_s >= 0.05) parts.push(`waited ${fmtS(w.queued_s)} in all for a place under the endpoints' limits`);
  if (w.retried) parts.push(`${fmtN(w.retried)} of ${fmtN(w.calls)} calls retried (${fmtN(w.retries)} retries, ` +
    `${fmtN(w.throttled)} answers 429/503, ${fmtS(w.backoff_s)} backing off)`);
  return h("p", { class: "meta lmwaits" + (w.throttled ? " warn" : "") }, "LM calls: " + parts.join(" · "));
}

function callView(call, key) {
  const bad = call.status !== "ok";
  const sum = [h("span", { class: "idx" }, `#${call.index}`), " ", badge(bad ? "error" : "ok"), " ",
    h("span", { class: "meta" }, `${call.model} · ${fmtN(call.prompt_tokens)}+${fmtN(call.completion_tokens)} tok · ${fmtS(call.latency_s)}${fmtCost(call.cost_usd)}${fmtWaits(call)}`),
    " ", h("span", { class: "preview" }, String(call.prompt || "").slice(0, 90))];
  return lazy(key, sum, () => h("div", { class: "callbody" },
    h("div", { class: "lbl" }, `prompt (${fmtN(call.prompt_chars)} chars)`), h("pre", { class: "prompt" }, call.prompt || ""),
    h("div", { class: "lbl" }, `answer (${fmtN(call.answer_chars)} chars)`), h("pre", { class: bad ? "answer bad" : "answer" }, call.answer || ""),
    call.error ? h("div", { class: "bad" }, call.error) : null), bad ? "call bad" : "call");
}

function batchView(batch, runId) {
  const key = `b-${runId}-${batch.batch}`;
  const sum = `${batch.kind || "llm"}_query batch #${batch.batch}: ${batch.count ?? batch.calls.length} calls` +
    (batch.failed ? `, ${batch.failed} failed` : "") + (batch.refused ? `, ${batch.refused} refused by limits` : "") +
    ` · ${fmtS(span(batch.start, batch.end))}` + (batch.end === null ? " (running)" : "");
  return lazy(key, sum, () => {
    const list = h("div", { class: "calls" });
    batch.calls.forEach((c) => list.append(callView(c, `${key}-${c.index}`)));
    if (!batch.calls.length && batch.kind === "rlm") list.append(h("p", { class: "meta" }, "child RLMs: see below"));
    return list;
  }, batch.failed ? "batch warn" : "batch");
}

function cellView(cell, t, run, model) {
  const box = h("div", { class: "cell" });
  if (cell.block !== null) {
    const problems = [];
    if (cell.timed_out) problems.push("timed out");
    if (cell.restarted) problems.push("sandbox restarted: every variable was lost");
    if (cell.error) problems.push("raised an exception");
    box.classList.toggle("bad", problems.length > 0);
    box.append(h("div", { class: "cellhead" }, `cell ${cell.block} · ${fmtS(cell.duration_s)}`,
      cell.end === null ? " · running" : "", problems.length ? h("span", { class: "reason" }, " · " + problems.join(", ")) : null));
    if (cell.output !== null) box.append(h("pre", { class: "output" }, cell.output));
    if (cell.error) box.append(lazy(`e-${run.run_id}-${t.iteration}-${cell.block}`, "exception", () => h("pre", { class: "bad" }, cell.error), "err"));
  }
  for (const b of cell.batches) box.append(batchView(b, run.run_id));
  for (const id of cell.children) if (model.runs[id]) box.append(childView(model.runs[id], model));
  return box;
}

function turnView(t, run, model) {
  const rootTok = t.root_calls.map((c) => `${fmtN(c.prompt_tokens)} in window + ${fmtN(c.completion_tokens)} out`).join("; ");
  const sec = h("section", { class: "turn", id: `turn-${run.run_id}-${t.iteration}`, "data-turn": t.iteration },
    h("h3", {}, `Turn ${t.iteration}`, h("span", { class: "meta" }, ` · ${fmtS(span(t.start, t.end))}` + (rootTok ? ` · ${rootTok} tokens` : ""))));
  if (t.elided) sec.append(h("div", { class: "warnline" }, `window full: ${t.elided.messages} older message(s) elided, ` +
    `${fmtN(t.elided.tokens_before)} → ${fmtN(t.elided.tokens_after)} tokens of ${fmtN(t.elided.window)}`));
  for (const c of t.root_calls) if (c.status !== "ok") sec.append(h("div", { class: "bad" }, `root LM call failed: ${c.error}`));
  if (t.messages.length) {
    sec.append(lazy(`m-${run.run_id}-${t.iteration}`, `messages sent (${t.messages.length})`, () =>
      h("div", {}, t.messages.map((m) => h("div", { class: "msg" }, h("div", { class: "lbl" }, m.role), h("pre", {}, m.content)))), "msgs"));
  }
  if (t.reply !== null) sec.append(reply(t.reply));
  else if (t.end === null) sec.append(h("p", { class: "meta" }, "waiting for the model…"));
  for (const c of t.cells) sec.append(cellView(c, t, run, model));
  return sec;
}

function runBody(run, model) {
  const body = h("div", { class: "runbody" });
  const chart = turnChart(run);
  if (chart) body.append(chart);
  const tl = timeline(run, model);
  if (tl) body.append(tl);
  for (const t of run.turns) body.append(turnView(t, run, model));
  return body;
}

function childView(child, model) {
  const sum = [`child RLM ${child.run_id} `, badge(child.status), " ", h("span", { class: "preview" }, String(child.prompt || "").slice(0, 90))];
  return lazy(`c-${child.run_id}`, sum, () => h("div", { class: "child", id: "run-" + child.run_id },
    h("div", { class: "lbl" }, `prompt (${fmtN(child.prompt_chars)} chars)`), h("pre", { class: "prompt" }, child.prompt || ""),
    h("div", { class: "lbl" }, `answer (${fmtN(child.answer_chars)} chars)`), h("pre", { class: "answer" }, child.answer ?? ""),
    child.reason && child.status !== "completed" ? h("div", { class: "bad" }, child.reason) : null,
    runBody(child, model)), "childbox");
}

// A cost from the price table (RLM_MCP_MODEL_PRICES); nothing when no model had a price.
function fmtCost(usd) {
  if (usd === null || usd === undefined) return "";
  return ` · $${usd >= 0.01 ? usd.toFixed(2) : usd.toPrecision(2)}`;
}

function runPage(model) {
  const rootRun = model.runs[model.run_id];
  const tot = (model.usage && model.usage.total) || {};
  const page = h("main", { class: "run" },
    h("p", {}, h("a", { href: CONFIG.index_href || "./" }, "← all runs")),
    h("h1", { class: "query" }, model.query || "(no query)"),
    h("p", { class: "meta" }, badge(model.status), ` ${model.run_id} · ${model.model || ""} · ${fmtTime(model.created_at)} · ` +
      `${fmtS(model.duration_s ?? span(model.t0, model.t1))} · ${fmtN(model.iterations)} turns · ${fmtN(model.sub_calls)} sub-calls · ` +
      `${fmtN(tot.prompt_tokens)}+${fmtN(tot.completion_tokens)} tokens` + fmtCost(tot.cost_usd)));
  if (model.session_id) {  // a kept session's run: its page shows the session's runs as a chain
    const chain = (CONFIG.index_href || "./") + encodeURIComponent(model.session_id);
    page.append(h("p", { class: "meta" }, "kept session ", h("a", { href: chain, class: "session-link", title: "every run of this session, in order" }, model.session_id)));
  }
  const waits = waitsLine(model.lm_waits);
  if (waits) page.append(waits);
  if (model.status !== "completed" && model.status !== "running" && model.reason) page.append(h("div", { class: "banner bad" }, `${model.status}: ${model.reason}`));
  for (const note of model.notes) page.append(h("div", { class: "banner warn" }, note));
  page.append(h("section", { class: "final" }, h("div", { class: "lbl" }, "answer"),
    model.answer === null || model.answer === undefined ? h("p", { class: "meta" }, model.status === "running" ? "running…" : "no answer")
      : h("pre", { class: "answer" }, model.answer)));
  page.append(runBody(rootRun, model));
  return page;
}
