// meshp2p dashboard: polls /api/status, draws coverage, nodes and routes,
// and, when this origin serves the OpenAI API (/v1/models), a chat panel
// streaming from /v1/chat/completions. Everything from the swarm (names,
// peer ids) is untrusted and only ever set as text.
"use strict";

const POLL_MS = 1000;
let last = null; // previous {t, rows, recv} for the tokens/s rate

function el(tag, props, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k === "style") for (const [p, q] of Object.entries(v)) e.style.setProperty(p, q);
    else e.setAttribute(k, v);
  }
  for (const c of kids) if (c != null) e.append(c);
  return e;
}
const short = (id) => (id && id.length > 14 ? "…" + id.slice(-8) : id || "");
const badge = (cls, text) => el("span", { class: "badge " + cls, text: text || cls });
const $ = (id) => document.getElementById(id);

function replicaClass(n) {
  return n <= 0 ? "gap" : n === 1 ? "r1" : n === 2 ? "r2" : "r3";
}

// backendBadge names the device a shard's layers run on: "cpu", or a
// GPU's backend and device ("vulkan (llvmpipe (LLVM 15.0.6, 256 bits))");
// nothing for nodes that do not say (older ones). The full kernel class
// is its tooltip.
function backendBadge(s) {
  if (!s.backend) return null;
  const text = s.device ? `${s.backend} (${s.device})` : s.backend;
  return el("span", { class: "badge backend" + (s.backend === "cpu" ? "" : " gpu"), title: s.kernel_class || text,
    "data-backend": s.backend, "data-device": s.device || "", text });
}

function drawModel(m, self) {
  const card = el("div", { class: "model", "data-fingerprint": m.fingerprint });
  card.append(el("div", { class: "model-head" },
    el("span", { class: "model-name", text: m.name || m.fingerprint.slice(0, 16) }),
    el("span", { class: "muted", text: `${m.arch || "?"} · ${m.n_layer} layers · ${m.fingerprint.slice(0, 12)}…` }),
    m.routable ? badge("ok", "routable") : badge("bad", "NOT routable")));
  const bar = el("div", { class: "bar", role: "img", "aria-label": `layer coverage of ${m.name}` });
  (m.replicas || []).forEach((n, i) => {
    bar.append(el("div", { class: "cell " + replicaClass(n), "data-layer": String(i), "data-replicas": String(n),
      title: `layer ${i}: ${n} replica${n === 1 ? "" : "s"}` }));
  });
  card.append(bar, el("div", { class: "axis" }, el("span", { text: "0" }), el("span", { text: String(m.n_layer) })));
  const legend = el("div", { class: "legend" },
    el("span", {}, el("i", { style: { background: "var(--gap)" } }), "gap"),
    el("span", {}, el("i", { style: { background: "var(--r1)" } }), "1 replica"),
    el("span", {}, el("i", { style: { background: "var(--r2)" } }), "2"),
    el("span", {}, el("i", { style: { background: "var(--r3)" } }), "3+"));
  if (!m.routable && m.missing) legend.append(el("span", { class: "error", text: m.missing }));
  const pl = self && self.fingerprint === m.fingerprint ? self.placement : null;
  if (!m.routable && pl && pl.last_reason) {
    // What this node's placement is doing about it (docs/placement.md).
    legend.append(el("span", { class: "muted placement-why", text: "placement: " + pl.last_reason }));
  }
  if (pl && pl.model_reason) {
    // A multi-model node's last choice between its models.
    legend.append(el("span", { class: "muted model-why", text: "models: " + pl.model_reason }));
  }
  card.append(legend);
  const list = el("div", { class: "shards" });
  for (const s of m.shards || []) {
    const pct = (x) => (100 * x / Math.max(1, m.n_layer)).toFixed(2) + "%";
    const span = el("div", { class: "span" }, el("b", { style: { left: pct(s.start), width: pct(s.end - s.start) } }));
    const facts = [`${Math.round((s.load || 0) * 100)}% load`];
    if (s.rtt_ms) facts.push(`${s.rtt_ms.toFixed(1)} ms rtt`);
    if (s.tokens_per_sec) facts.push(`${s.tokens_per_sec.toFixed(0)} tok/s`);
    list.append(el("div", { class: "shard" + (s.live ? "" : " dead"), "data-peer": s.peer, "data-live": String(s.live) },
      el("div", { class: "row" }, el("b", { text: `layers ${s.start}-${s.end}` }), el("span", { class: "id", title: s.peer, text: short(s.peer) }),
        s.self ? badge("self", "this node") : s.live ? badge(s.path, s.path) : badge("dead", "dead")),
      span, el("div", { class: "row facts" }, el("span", { class: "muted", text: facts.join(" · ") }), backendBadge(s))));
  }
  card.append(list);
  return card;
}

function drawNodes(doc) {
  const list = $("node-list");
  list.replaceChildren();
  const peers = doc.peers || [];
  if (!peers.length) list.append(el("p", { class: "muted", text: "no peers" }));
  for (const p of peers) {
    list.append(el("div", { class: "node" + (p.live ? "" : " dead"), "data-peer": p.id },
      el("div", { class: "row" }, el("span", { class: "id", title: p.id, text: short(p.id) }),
        badge(p.live ? p.path : "dead", p.live ? p.path : "dead"),
        p.rtt_ms ? el("span", { class: "muted", text: `${p.rtt_ms.toFixed(1)} ms` }) : null),
      el("div", { class: "muted", text: (p.layers || []).join(", ") || (p.agent || "") })));
  }
}

function drawRoutes(doc) {
  const list = $("route-list");
  list.replaceChildren();
  const rs = doc.routes || [];
  if (!rs.length) list.append(el("li", { class: "muted", text: "none yet" }));
  for (const r of rs) {
    const hops = [];
    (r.hops || []).forEach((h, i) => {
      if (i) hops.push(" → ");
      hops.push(el("span", { class: "hop", title: h.peer, text: `${short(h.peer)}[${h.start}-${h.end}]${h.path === "direct" || h.path === "relayed" ? " " + h.path : ""}` }));
    });
    const t = new Date(r.time).toLocaleTimeString();
    const role = r.hop_index < 0 ? "origin" : `hop ${r.hop_index + 1}`;
    list.append(el("li", { "data-epoch": String(r.epoch), "data-hop-index": String(r.hop_index) }, el("span", { class: "muted", text: `${t} ${role}: ` }),
      r.reroute ? el("span", { class: "reroute", text: `re-route (epoch ${r.epoch}) ` }) : null, ...hops));
  }
}

// rate shows a per-second demand figure with 2 decimals, or 2
// significant digits below 1 (decayed rates get small, not zero).
function rate(x) {
  const v = Number(x) || 0;
  if (v === 0) return "0";
  return Math.abs(v) >= 1 ? v.toFixed(2) : v.toPrecision(2);
}

// The states a model's demand can be in (status.ModelDemand); anything
// else is shown as a plain badge.
const DEMAND_STATES = ["served", "warming", "warmable", "unserved"];

// drawDemand lists the swarm's demand per model, most requested first
// (the collector's order). reason is the node's last choice between its
// models when no model card shows it (a standby node serves none).
function drawDemand(doc, reason) {
  const list = $("demand-list");
  list.replaceChildren();
  if (reason) list.append(el("p", { class: "muted model-why", text: "models: " + reason }));
  const ds = doc.demand || [];
  if (!ds.length) {
    list.append(el("p", { class: "muted", text: "no demand reported yet" }));
    return;
  }
  const cols = ["model", "state", "requests/s", "queued/s", "refused/s", "tokens/s", "offers"];
  const body = el("tbody");
  for (const d of ds) {
    const fp = d.fingerprint || "";
    const st = d.state || "";
    const cells = [
      el("span", { class: "model-name", title: fp, text: d.name || fp.slice(0, 16) }),
      el("span", { class: "badge" + (DEMAND_STATES.includes(st) ? " state-" + st : ""), "data-state": st, text: st || "?" }),
      rate(d.requests_per_sec), rate(d.queued_per_sec), rate(d.refused_per_sec), rate(d.tokens_per_sec),
      String(d.offers || 0),
    ];
    body.append(el("tr", { class: "demand-row", "data-fingerprint": fp, "data-state": st },
      ...cells.map((c, i) => el("td", { "data-label": cols[i] }, c))));
  }
  list.append(el("table", { class: "demand" },
    el("thead", {}, el("tr", {}, ...cols.map((c) => el("th", { text: c })))), body));
}

// tokens/s: the faster of the decode steps this hop computed and the
// tokens this node's origin (the API gateway) received; `start --api`
// counts both for the same tokens when it is on its own route.

function draw(doc) {
  const s = doc.self || {};
  $("self").textContent = `${s.role || "node"} ${short(s.peer_id)} · ${s.network || ""}` +
    (s.model ? ` · serves ${s.model} ${s.start}-${s.end}` : "");
  const now = Date.now();
  const c = doc.counters || {};
  if (last) {
    const dt = (now - last.t) / 1000;
    const rate = dt > 0 ? Math.max(0, ((c.decode_rows || 0) - last.rows) / dt, ((c.tokens_received || 0) - last.recv) / dt) : 0;
    $("tps").textContent = rate.toFixed(1);
  }
  last = { t: now, rows: c.decode_rows || 0, recv: c.tokens_received || 0 };
  $("active").textContent = String(c.sessions_active || 0);
  $("npeers").textContent = String((doc.peers || []).filter((p) => p.live).length);
  $("reroutes").textContent = String(c.reroutes || 0);
  const proposed = c.spec_proposed || 0;
  $("accept").textContent = proposed ? `${Math.round((100 * (c.spec_accepted || 0)) / proposed)}%` : "–";
  $("accept").title = `${c.spec_accepted || 0} of ${proposed} proposed tokens in ${c.spec_windows || 0} windows`;
  const audits = (c.audits_passed || 0) + (c.audits_failed || 0) + (c.audits_inconclusive || 0);
  $("audits").textContent = audits ? `${c.audits_passed || 0}/${c.audits_failed || 0}/${c.audits_inconclusive || 0}` : "–";
  $("audits").title = `${audits} audits: ${c.audits_passed || 0} passed, ${c.audits_failed || 0} failed (hop convicted), ${c.audits_inconclusive || 0} inconclusive`;
  const ml = $("model-list");
  ml.replaceChildren();
  if (!(doc.models || []).length) ml.append(el("p", { class: "muted", text: "no model seen yet" }));
  for (const m of doc.models || []) ml.append(drawModel(m, s));
  const pl = s.placement || {};
  const carded = !!s.fingerprint && (doc.models || []).some((m) => m.fingerprint === s.fingerprint);
  drawDemand(doc, carded ? "" : pl.model_reason || "");
  drawNodes(doc);
  drawRoutes(doc);
  document.body.dataset.updated = doc.time;
}

async function poll() {
  try {
    const r = await fetch("/api/status", { cache: "no-store" });
    if (!r.ok) throw new Error(`/api/status: HTTP ${r.status}`);
    draw(await r.json());
    $("error").hidden = true;
  } catch (e) {
    $("error").textContent = String(e.message || e);
    $("error").hidden = false;
  }
  setTimeout(poll, POLL_MS);
}

// --- chat (only where this origin serves /v1) ---

const history = [];

async function initChat() {
  let models;
  try {
    const r = await fetch("/v1/models", { cache: "no-store" });
    if (!r.ok) return;
    models = (await r.json()).data || [];
  } catch (e) {
    return;
  }
  const sel = $("chat-model");
  for (const m of models) sel.append(el("option", { value: m.id, text: m.id }));
  $("chat").hidden = false;
  $("chat-form").addEventListener("submit", (ev) => { ev.preventDefault(); send(); });
  $("chat-input").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); send(); }
  });
}

// Models without a chat template in their GGUF (base models) are
// refused by /v1/chat/completions; the panel then continues the text
// through /v1/completions and says so.
const noTemplate = {};

async function stream(url, body, onText) {
  const r = await fetch(url, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
  if (!r.ok || !r.body) {
    const err = new Error(`HTTP ${r.status}`);
    try { const e = (await r.json()).error || {}; err.message = e.message || err.message; err.param = e.param; } catch (e) { /* not JSON */ }
    err.status = r.status;
    throw err;
  }
  const reader = r.body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { done, value } = await reader.read();
    if (done) return;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, i).trim();
      buf = buf.slice(i + 1);
      if (!line.startsWith("data:")) continue;
      const data = line.slice(5).trim();
      if (data === "[DONE]") continue;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message || "error");
      const c = chunk.choices && chunk.choices[0];
      const t = c && ((c.delta && c.delta.content) || c.text);
      if (t) onText(t);
    }
  }
}

async function send() {
  const input = $("chat-input");
  const text = input.value.trim();
  if (!text || $("chat-send").disabled) return;
  input.value = "";
  const log = $("chat-log");
  log.append(el("div", { class: "msg user", text }));
  const out = el("div", { class: "msg assistant" });
  log.append(out);
  const model = $("chat-model").value;
  history.push({ role: "user", content: text });
  $("chat-send").disabled = true;
  let reply = "";
  const show = (t) => { reply += t; out.textContent = reply; log.scrollTop = log.scrollHeight; };
  try {
    if (!noTemplate[model]) {
      try {
        await stream("/v1/chat/completions", { model, messages: history, stream: true }, show);
      } catch (e) {
        if (e.status !== 400 || e.param !== "messages" || reply) throw e;
        noTemplate[model] = true;
      }
    }
    if (noTemplate[model]) {
      out.dataset.mode = "completion";
      log.insertBefore(el("div", { class: "msg note", text: `${model} has no chat template: continuing your text instead` }), out);
      reply = text;
      out.textContent = reply;
      await stream("/v1/completions", { model, prompt: text, stream: true, max_tokens: 128 }, show);
    }
    history.push({ role: "assistant", content: reply });
    out.dataset.done = "true";
  } catch (e) {
    out.classList.add("err");
    out.textContent = reply + " [" + String(e.message || e) + "]";
    history.pop();
  } finally {
    $("chat-send").disabled = false;
  }
}

poll();
initChat();
