"use strict";
// The kvroute fleet page: polls the admin API every second with the
// admin token kept in this tab's sessionStorage. It only ever sets
// textContent, never markup, so nothing a backend reports can inject any.
(function () {
  const KEY = "kvroute-admin-token";
  const PERIOD = 1000;
  const $ = (id) => document.getElementById(id);
  const stats = { renders: 0, lastRenderMs: 0, firstFullRenderAt: 0, backends: 0 };
  window.kvrouteFleet = stats; // read by the browser test and handy in a console

  // A token in the fragment (never sent to a server) is taken once.
  const m = /^#token=(.+)$/.exec(location.hash);
  if (m) {
    sessionStorage.setItem(KEY, decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }

  const token = () => sessionStorage.getItem(KEY);
  const setStatus = (text, error) => {
    const s = $("status");
    s.textContent = text;
    s.className = error ? "error" : "";
  };

  function showLogin(message) {
    $("view").hidden = true;
    $("forget").hidden = true;
    $("login").hidden = false;
    setStatus(message || "admin token needed", Boolean(message));
    $("token").focus();
  }

  $("login").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem(KEY, $("token").value.trim());
    $("token").value = "";
    start();
  });
  $("forget").addEventListener("click", () => {
    sessionStorage.removeItem(KEY);
    stop();
    showLogin();
  });

  const num = (v) => (v === undefined || v === null ? "—" : String(v));
  const rate = (tps) => (tps >= 1000 ? (tps / 1000).toFixed(1) + "k" : tps.toFixed(0)) + " tok/s";
  const pct = (x) => (x * 100).toFixed(1) + "%";
  const clock = (t) => new Date(t).toLocaleTimeString([], { hour12: false });

  function cell(tr, i, text, cls, title) {
    const td = tr.cells[i];
    td.textContent = text;
    td.className = cls || "";
    if (title !== undefined) td.title = title;
    return td;
  }

  function meter(td, frac) {
    const bar = document.createElement("span");
    bar.className = "meter";
    const fill = document.createElement("i");
    fill.style.width = Math.round(Math.min(Math.max(frac, 0), 1) * 100) + "%";
    bar.appendChild(fill);
    td.appendChild(bar);
  }

  const COLS = ["backend", "role", "health", "breaker", "in_flight", "pending_prefill", "decoding",
    "engine_running", "engine_waiting", "kv_usage", "prefill_rate", "hit_rate", "reported"];
  const LABELS = Array.from(document.querySelectorAll("#backends thead th"), (th) => th.textContent);
  const rows = new Map(); // backend name -> tr

  function newRow(name) {
    const tr = document.createElement("tr");
    tr.dataset.backend = name;
    COLS.forEach((c, i) => {
      const td = document.createElement("td");
      td.dataset.col = c;
      td.dataset.label = LABELS[i];
      tr.appendChild(td);
    });
    return tr;
  }

  function renderBackends(list) {
    const body = document.querySelector("#backends tbody");
    const seen = new Set();
    let healthy = 0;
    list.forEach((b, i) => {
      seen.add(b.name);
      let tr = rows.get(b.name);
      if (!tr) {
        tr = newRow(b.name);
        rows.set(b.name, tr);
      }
      if (body.children[i] !== tr) body.insertBefore(tr, body.children[i] || null);

      const nameCell = cell(tr, 0, b.name, "name");
      const url = document.createElement("small");
      url.textContent = b.url + (b.models && b.models.length ? " · " + b.models.join(", ") : "");
      nameCell.appendChild(url);

      cell(tr, 1, b.role || "both", b.role && b.role !== "both" ? "role" : "",
        b.adapters ? "LoRA adapters: " + b.adapters.used + " of " + b.adapters.max +
          (b.adapters.running.length ? "; running " + b.adapters.running.join(", ") : "") : "");

      if (b.healthy) healthy++;
      const health = b.healthy ? (b.draining ? "draining" : "healthy") : "ejected";
      cell(tr, 2, health, b.healthy ? (b.draining ? "warn" : "ok") : "bad");
      const br = b.breaker || {};
      let brText = br.state || "—";
      if (br.consecutive_failures) brText += " (" + br.consecutive_failures + " fails)";
      cell(tr, 3, brText, br.state === "closed" ? "" : "bad",
        br.open_until ? "open until " + clock(br.open_until) : "");
      const l = b.load || {};
      cell(tr, 4, num(l.in_flight));
      cell(tr, 5, num(l.pending_prefill_tokens), "", "estimated uncached prompt tokens before their first byte");
      cell(tr, 6, num(l.decoding));
      const e = b.engine;
      const age = e ? "reported " + e.age_seconds.toFixed(1) + " s ago" : "no engine report";
      cell(tr, 7, e ? num(e.running) : "—", e ? "" : "none", age);
      cell(tr, 8, e ? num(e.waiting) : "—", e ? (e.waiting > 0 ? "warn" : "") : "none", age);
      const kv = cell(tr, 9, e ? pct(e.kv_usage) : "—", e ? "" : "none", age);
      if (e) meter(kv, e.kv_usage);
      cell(tr, 10, rate(b.prefill_rate_tokens_per_second || 0), "", "learned from observed TTFTs");
      const routed = b.routed_prompt_tokens || 0;
      cell(tr, 11, routed ? pct((b.predicted_cached_tokens || 0) / routed) : "—", routed ? "" : "none",
        num(b.predicted_cached_tokens) + " of " + num(routed) + " routed prompt tokens predicted cached");
      const a = b.cache_audit || {};
      const audited = a.audited_prompt_tokens || 0;
      const rep = (a.reported_cached_tokens || 0) / (audited || 1), pred = (a.predicted_cached_tokens || 0) / (audited || 1);
      const acts = Object.entries(a.actions || {}).filter(([, n]) => n > 0).map(([k, n]) => k + " " + n).join(", ");
      cell(tr, 12, audited ? pct(rep) + " / " + pct(pred) + (a.trusted === false ? " untrusted" : "") : "—",
        !audited ? "none" : (a.trusted === false || Math.abs(rep - pred) > 0.1 ? "warn" : ""),
        "hit rate the engine reported / the router predicted, over " + num(audited) + " prompt tokens of requests whose engine reported its cache hits; " +
        "best any backend held: " + pct((a.best_cached_tokens || 0) / (audited || 1)) + "; index capacity " + num(a.capacity_blocks) + " blocks" +
        (acts ? "; audit: " + acts : ""));
    });
    for (const [name, tr] of rows) {
      if (!seen.has(name)) {
        tr.remove();
        rows.delete(name);
      }
    }
    $("summary").textContent = "(" + healthy + " of " + list.length + " healthy)";
  }

  const DCOLS = ["Time", "Model", "Session", "Prefill", "Backend", "TTFT", "Reason", "Retries", "Status"];
  // prefillOf is a decision's Prefill cell: the prefill leg's engine (or
  // why it was skipped) for a split request, "whole" for a request that
  // could have been split (why in its title), "—" for the rest.
  function prefillOf(d) {
    const leg = (d.legs || []).find((l) => l.role === "prefill");
    if (leg) return [leg.skipped ? "skipped: " + leg.skipped : leg.backend || "—", leg.reason || ""];
    if (d.whole) return ["whole", d.whole];
    return ["—", ""];
  }
  const ttft = (ms) => (ms ? (ms >= 1000 ? (ms / 1000).toFixed(2) + " s" : ms.toFixed(0) + " ms") : "—");
  function renderDecisions(list) {
    const body = document.querySelector("#decisions tbody");
    const frag = document.createDocumentFragment();
    for (const d of list) {
      const tr = document.createElement("tr");
      const [prefill, prefillWhy] = prefillOf(d);
      const vals = [clock(d.time), d.model, d.session || "", prefill, d.backend || "—", ttft(d.ttft_ms), d.reason, String(d.retries), String(d.status)];
      vals.forEach((v, i) => {
        const td = document.createElement("td");
        td.textContent = v;
        td.dataset.label = DCOLS[i];
        if (i === 3 && prefillWhy) td.title = prefillWhy;
        if (i === 8 && d.status >= 400) td.className = "bad";
        tr.appendChild(td);
      });
      frag.appendChild(tr);
    }
    body.replaceChildren(frag);
  }

  async function get(path) {
    const r = await fetch(path, { headers: { Authorization: "Bearer " + token() }, cache: "no-store" });
    if (r.status === 401) throw Object.assign(new Error("the admin token was refused"), { auth: true });
    if (!r.ok) throw new Error(path + ": HTTP " + r.status);
    return r.json();
  }

  let timer = 0;
  let running = false;
  async function poll() {
    try {
      const [b, d] = await Promise.all([get("/admin/backends"), get("/admin/decisions?limit=50")]);
      if (!running) return;
      const t0 = performance.now();
      renderBackends(b.backends || []);
      renderDecisions(d.decisions || []);
      void document.body.offsetHeight; // style and layout, so that they count too
      stats.lastRenderMs = performance.now() - t0;
      stats.renders++;
      stats.backends = (b.backends || []).length;
      if (!stats.firstFullRenderAt) stats.firstFullRenderAt = performance.now();
      setStatus("updated " + new Date().toLocaleTimeString([], { hour12: false }));
    } catch (err) {
      if (err.auth) {
        sessionStorage.removeItem(KEY);
        stop();
        showLogin(err.message);
        return;
      }
      setStatus(err.message + "; retrying", true);
    }
    if (running) timer = setTimeout(poll, PERIOD);
  }

  function start() {
    $("login").hidden = true;
    $("view").hidden = false;
    $("forget").hidden = false;
    running = true;
    poll();
  }
  function stop() {
    running = false;
    clearTimeout(timer);
  }

  if (token()) start();
  else showLogin();
})();
