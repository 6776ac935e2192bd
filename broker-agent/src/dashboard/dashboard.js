// gearshift broker agent dashboard: polls api/dashboard every second and
// rebuilds the page with textContent only (bus data is never parsed as HTML).
"use strict";

const REFRESH_MS = 1000;

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}

function td(text, cls) { return el("td", cls, text); }

function fill(id, rows) {
  const body = document.querySelector("#" + id + " tbody");
  body.replaceChildren(...rows);
}

function show(id, visible) {
  const e = document.getElementById(id);
  if (e) e.classList.toggle("hidden", !visible);
}

function set(id, text) {
  const e = document.getElementById(id);
  if (e) e.textContent = text;
}

function pct(x) { return (Math.round(x * 10) / 10).toFixed(1) + " %"; }

function ago(ts, now) {
  const s = Math.max(0, (now - Date.parse(ts)) / 1000);
  if (s < 1) return "now";
  if (s < 90) return Math.round(s) + " s ago";
  if (s < 5400) return Math.round(s / 60) + " min ago";
  return Math.round(s / 3600) + " h ago";
}

function clock(ts) {
  const d = new Date(Date.parse(ts));
  return d.toLocaleTimeString([], { hour12: false });
}

function meter(fraction, label, cls) {
  const m = el("div", "meter " + (cls || ""));
  const bar = el("span");
  bar.style.width = Math.max(0, Math.min(100, fraction * 100)).toFixed(1) + "%";
  m.append(bar, el("em", null, label));
  return m;
}

function usageMeter(u) {
  const cls = u >= 90 ? "over" : u >= 80 ? "high" : "";
  return meter(u / 100, pct(u), cls);
}

function badge(kind) { return el("span", "badge " + kind, kind.replace(/_/g, " ")); }

function renderCards(s, snap) {
  let active = 0, inactive = 0, missing = 0, gears = 0, avail = 0;
  for (const n of s.nodes) {
    if (!n.fresh) missing++;
    else if (n.active) active++;
    else inactive++;
    if (n.fresh) gears += n.gears_active;
  }
  for (const p of s.profiles) avail += p.stats.available_active_gears;
  const total = s.nodes.length;
  set("nodes-count", total);
  set("nodes-detail", active + " active · " + inactive + " inactive · " + missing + " missing");
  set("gears-count", gears);
  set("gears-detail", avail + " more fit on active nodes");
  const usage = gears + avail > 0 ? (100 * gears) / (gears + avail) : 0;
  set("usage", pct(usage));
  set("usage-detail", s.profiles.map((p) => p.profile + " " + pct(p.stats.usage_pct)).join(" · "));
  const inflight = s.ops.filter((o) => !o.done);
  set("ops-count", inflight.length);
  set("ops-detail", inflight.map((o) => o.kind.replace("_", "-") + " " + o.state).join(" · "));
  set("exhausted-count", snap.exhausted.length);
  const refused = Object.entries(s.refused || {}).map(([k, v]) => k + " " + v);
  set("refused-detail", refused.length ? "refused messages: " + refused.join(", ") : "no message refused");
}

function renderGroups(s) {
  fill("groups", s.groups.map((g) => {
    const t = g.stats;
    const tr = el("tr");
    tr.dataset.group = g.district + "/" + g.profile;
    const nodes = t.nodes_active + " active" + (t.nodes_inactive ? ", " + t.nodes_inactive + " inactive" : "") +
      (t.nodes_missing ? ", " + t.nodes_missing + " missing" : "");
    const usage = td(); usage.append(usageMeter(t.usage_pct));
    const notes = [];
    if (g.paused) notes.push("PAUSED " + g.paused);
    if (g.exhausted) notes.push("EXHAUSTED " + g.exhausted);
    if (g.backoff_until) notes.push("backoff until " + clock(g.backoff_until));
    notes.push("min " + g.min_nodes + ", max " + g.max_nodes);
    tr.append(td(g.district, "mono"), td(g.profile), td(nodes), td(t.gears_active), usage,
      td(t.available_active_gears), td(t.district_free_uids ?? "–"), td(g.handler, "mono"), td(notes.join("; "), "reason"));
    return tr;
  }));
}

function renderOps(s, now) {
  const inflight = s.ops.filter((o) => !o.done);
  show("ops-empty", inflight.length === 0);
  fill("ops", inflight.map((o) => {
    const tr = el("tr");
    tr.dataset.op = o.id;
    const prog = td();
    if (o.progress && o.progress.total > 0) {
      const p = o.progress;
      prog.append(meter((p.moved + p.failed) / p.total, p.moved + "/" + p.total + " gears moved" +
        (p.failed ? ", " + p.failed + " failed" : ""), "progress"));
    } else {
      prog.textContent = o.kind === "scale_up" ? "booting since " + ago(o.created, now) : "–";
    }
    tr.append(td(o.id, "mono"), td(o.kind.replace("_", "-")), td(o.district + "/" + o.profile, "mono"),
      td(o.node || "(new node)", "mono"), td(o.state), prog, td(o.reason, "reason"));
    return tr;
  }));
  const done = s.ops.filter((o) => o.done).slice(0, 10);
  fill("history", done.map((o) => {
    const tr = el("tr");
    tr.append(td(o.id, "mono"), td(o.kind.replace("_", "-")), td(o.node || "–", "mono"), td(o.state), td(ago(o.updated, now)));
    return tr;
  }));
}

function renderNodes(s, now) {
  fill("nodes", s.nodes.map((n) => {
    const tr = el("tr");
    tr.dataset.node = n.node;
    const state = !n.fresh ? "missing" : n.cordoned ? "cordoned" : n.active ? "active" : "inactive";
    const g = td();
    g.append(meter(n.max_active_gears ? n.gears_active / n.max_active_gears : 0,
      n.gears_active + " / " + n.max_active_gears, n.gears_active >= n.max_active_gears ? "over" : ""));
    tr.title = n.cordoned || "";
    tr.append(td(n.node + (n.do_not_disrupt ? " (do not disrupt)" : ""), "mono"), td(n.district + "/" + n.profile, "mono"),
      td(state, "state-" + state), g, td(n.gears_total), td(ago(n.last_report, now)));
    return tr;
  }));
}

function renderDecisions(snap) {
  const list = document.getElementById("decisions");
  show("decisions-empty", snap.decisions.length === 0);
  list.replaceChildren(...snap.decisions.slice(0, 40).map((e) => {
    const d = e.decision;
    const li = el("li");
    li.dataset.kind = d.decision;
    li.append(el("span", "when", clock(e.at)), badge(d.decision),
      el("span", "what mono", d.district + "/" + d.profile + (d.node ? " " + d.node : "")),
      el("span", "reason", d.reason));
    return li;
  }));
}

function renderExplanations(snap) {
  const box = document.getElementById("explanations");
  show("explanations-empty", snap.explanations.length === 0);
  box.replaceChildren(...snap.explanations.map((x) => {
    const d = el("details", "expl");
    const sum = el("summary");
    sum.append(badge(x.outcome), el("span", "what mono", " " + x.district + "/" + x.profile + " "), el("span", null, x.summary));
    const ul = el("ul");
    for (const r of x.reasons) {
      const li = el("li", r.ok ? "ok" : "no");
      li.append(el("span", "rule", r.rule), document.createTextNode(r.ok ? " ✓ " : " · "), document.createTextNode(r.detail));
      ul.append(li);
    }
    d.append(sum, ul);
    return d;
  }));
}

function renderExhausted(snap) {
  show("exhausted-empty", snap.exhausted.length === 0);
  document.getElementById("exhausted").replaceChildren(...snap.exhausted.map((g) => {
    const li = el("li");
    li.append(el("span", "mono", g.district + "/" + g.profile + ": "), document.createTextNode(g.detail));
    return li;
  }));
}

function historyLine(r) {
  switch (r.type) {
    case "decision": return ["decision " + r.decision, r.district + "/" + r.profile, (r.node ? r.node + ": " : "") + r.reason];
    case "explanation": return ["explanation " + r.outcome, r.district + "/" + r.profile, r.summary];
    case "saga": return [r.kind.replace("_", "-") + " " + r.op, r.district + "/" + r.profile,
      (r.node ? r.node + ": " : "") + (r.from || "(new)") + " → " + r.to];
    case "operator": return ["operator " + r.by, r.request.district ? r.request.district + "/" + r.request.profile : "–",
      r.request.command + (r.request.node ? " " + r.request.node : "") + ": " + (r.ok ? "" : "REFUSED ") + r.message];
    default: return [r.type, "–", ""];
  }
}

function renderJournal(snap, now) {
  const rows = snap.history || [];
  show("journal-empty", rows.length === 0);
  fill("journal", rows.map((r) => {
    const tr = el("tr");
    const [what, group, detail] = historyLine(r);
    tr.dataset.type = r.type;
    tr.append(td(clock(r.at) + " (" + ago(r.at, now) + ")"), td(what), td(group, "mono"), td(detail, "reason"));
    return tr;
  }));
}

// Who leads the cluster (docs/ha.md): this agent, or another one it heard.
function renderLead(ha) {
  const l = document.getElementById("lead");
  if (!ha) { l.textContent = ""; l.className = ""; return; }
  if (ha.role === "leader") {
    l.textContent = "leader of " + ha.cluster + " (epoch " + ha.epoch + ")";
    l.className = "pill ok";
  } else {
    l.textContent = "standby" + (ha.leader ? ": " + ha.leader + " leads " + ha.cluster : ": no leader heard");
    l.className = "pill " + (ha.leader ? "warn" : "bad");
  }
}

function render(snap) {
  const s = snap.status;
  const now = Date.parse(snap.at);
  set("agent", snap.agent + " " + snap.version);
  const b = document.getElementById("breaker");
  b.textContent = s.breaker_open ? "BREAKER OPEN: scaling stopped" : s.paused ? "PAUSED: " + s.paused : "scaling enabled";
  b.className = "pill " + (s.breaker_open || s.paused ? "bad" : "ok");
  set("updated", "updated " + clock(snap.at));
  renderLead(s.ha);
  renderCards(s, snap);
  renderGroups(s);
  renderOps(s, now);
  renderNodes(s, now);
  renderDecisions(snap);
  renderExplanations(snap);
  renderExhausted(snap);
  renderJournal(snap, now);
  document.body.dataset.loaded = "yes";
}

// Keep open <details> open across refreshes.
function openGroups() {
  return new Set([...document.querySelectorAll("#explanations details[open] .what")].map((e) => e.textContent));
}

function reopen(open) {
  for (const d of document.querySelectorAll("#explanations details")) {
    const w = d.querySelector(".what");
    if (w && open.has(w.textContent)) d.open = true;
  }
}

async function refresh() {
  try {
    const r = await fetch("api/dashboard", { cache: "no-store" });
    if (!r.ok) throw new Error("HTTP " + r.status);
    const snap = await r.json();
    const open = openGroups();
    render(snap);
    reopen(open);
  } catch (e) {
    set("updated", "cannot reach the agent: " + e.message);
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}

refresh();
