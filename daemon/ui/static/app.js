// crawld console: a single page, routed by the URL hash, that polls the daemon's JSON API every
// few seconds. Data (titles from Bilibili, crawled pages, errors) is hostile: it only ever
// reaches the DOM through textContent / createElement / setAttribute, never innerHTML. Charts
// are SVG elements built here from points the server already decimated (at most ~1000).
"use strict";

const POLL_MS = 5000;
const SVG_NS = "http://www.w3.org/2000/svg";
const RANGES = ["6h", "24h", "7d", "30d", "all"];
const STATUSES = ["pending", "processing", "completed", "failed", "no_proxy", "bili_error"];
const state = { csrf: null, authRequired: false, page: null, timer: null };

// ---- DOM helpers ---------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") node.className = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function fill(node, ...children) {
  node.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined));
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
  for (const child of children) node.append(child instanceof Node ? child : String(child));
  return node;
}

function fmtNum(n) {
  return typeof n === "number" ? n.toLocaleString("en-US") : (n === null || n === undefined ? "–" : String(n));
}

function fmtTime(ms) {
  if (ms === null || ms === undefined) return "–";
  return new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

function fmtAgo(ms) {
  if (ms === null || ms === undefined) return "–";
  const s = Math.round((Date.now() - ms) / 1000);
  if (Math.abs(s) < 90) return `${s}s ago`;
  if (Math.abs(s) < 5400) return `${Math.round(s / 60)}min ago`;
  return `${Math.round(s / 3600)}h ago`;
}

function table(headers, rows, caption) {
  return el("div", { class: "table-wrap" },
    el("table", {},
      caption ? el("caption", { class: "muted" }, caption) : null,
      el("thead", {}, el("tr", {}, headers.map((h) => el("th", { scope: "col" }, h)))),
      el("tbody", {}, rows.map((cells) => el("tr", {}, cells.map((c) =>
        c instanceof Node && c.tagName === "TD" ? c : el("td", {}, c)))))));
}

function num(value) { return el("td", { class: "num" }, fmtNum(value)); }

function kv(obj) {
  const list = el("dl", { class: "kv" });
  for (const [key, value] of Object.entries(obj || {})) {
    let shown;
    if (value !== null && typeof value === "object") shown = JSON.stringify(value);
    else shown = typeof value === "number" ? fmtNum(value) : String(value);
    if (shown.length > 300) shown = shown.slice(0, 300) + "…";
    list.append(el("dt", {}, key), el("dd", {}, shown));
  }
  return list;
}

function card(label, value, cls) {
  return el("div", { class: "card" }, el("div", { class: "label" }, label),
    el("div", { class: "value " + (cls || "") }, value));
}

// ---- API -----------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, message, data) { super(message); this.status = status; this.data = data; }
}

async function api(path, options) {
  const opts = options || {};
  const headers = { Accept: "application/json" };
  const init = { method: opts.method || "GET", headers, credentials: "same-origin", cache: "no-store" };
  if (init.method !== "GET") {
    headers["Content-Type"] = "application/json";
    if (state.csrf) headers["X-CSRF-Token"] = state.csrf;
    init.body = JSON.stringify(opts.body || {});
  }
  const response = await fetch(path, init);
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (e) { data = null; }
  if (!response.ok) {
    if (response.status === 401 && !opts.login) showLogin();
    let message = `${response.status}`;
    if (data && data.error) message += ` ${data.error}`;
    if (data && data.detail) message += `: ${typeof data.detail === "string" ? data.detail : JSON.stringify(data.detail)}`;
    throw new ApiError(response.status, message, data);
  }
  return data;
}

// ---- login ---------------------------------------------------------------------------------

function showLogin() {
  stopPolling();
  fill(document.getElementById("main"));
  document.getElementById("login").hidden = false;
  document.getElementById("logout").hidden = true;
  document.getElementById("updated").textContent = "log in to see the daemon";
  document.getElementById("login-key").focus();
}

async function onLogin(event) {
  event.preventDefault();
  const input = document.getElementById("login-key");
  const error = document.getElementById("login-error");
  error.textContent = "";
  try {
    const answer = await api("/ui/api/login", { method: "POST", body: { key: input.value }, login: true });
    state.csrf = answer.csrf;
    input.value = "";
    document.getElementById("login").hidden = true;
    document.getElementById("logout").hidden = !state.authRequired;
    route();
  } catch (e) {
    error.textContent = e.status === 401 ? "That key is not valid." : `Login failed: ${e.message}`;
    input.select();
  }
}

async function onLogout() {
  try { await api("/ui/api/logout", { method: "POST" }); } catch (e) { /* shown below */ }
  state.csrf = null;
  showLogin();
}

// ---- polling -------------------------------------------------------------------------------

function stopPolling() {
  if (state.timer !== null) clearTimeout(state.timer);
  state.timer = null;
}

async function refresh() {
  stopPolling();
  const page = state.page;
  if (!page) return;
  const updated = document.getElementById("updated");
  try {
    await page.refresh();
    if (state.page !== page) return;
    updated.textContent = `last updated ${new Date().toLocaleTimeString()}`;
    updated.className = "";
  } catch (e) {
    if (e.status === 401) return;
    updated.textContent = `update failed (${e.message}); retrying`;
    updated.className = "error";
  }
  if (state.page === page) state.timer = setTimeout(refresh, POLL_MS);
}

// ---- charts --------------------------------------------------------------------------------

function polyline(points, cls, x, y) {
  const coords = points.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ");
  return svg("polyline", { class: cls, points: coords });
}

// the queue's last hour as the server keeps it (/ui/api/queue): a bar per minute of rows
// published into the queue, and the depth at each minute's last reading as a line
function queueChart(q) {
  const w = 720, h = 150, left = 56, right = 8, top = 14, bottom = 18;
  const minutes = q.minutes;
  const seen = minutes.map((m, i) => [i, m]).filter(([, m]) => m.published !== null);
  const pmax = Math.max(1, ...seen.map(([, m]) => m.published));
  const dmax = Math.max(1, ...seen.map(([, m]) => m.depth));
  const depthNow = seen.length ? seen[seen.length - 1][1].depth : null;
  const box = svg("svg", { class: "chart queue-chart", viewBox: `0 0 ${w} ${h}`, role: "img",
    "aria-label": `rows published into the queue per minute over the last hour: ${q.published_last_hour} in all; depth now ${fmtNum(depthNow)}`,
    "data-published": q.published_last_hour, "data-minutes": seen.length });
  const slot = (w - left - right) / minutes.length;
  const base = h - bottom;
  const yOf = (max) => (v) => top + (1 - v / max) * (base - top);
  const yBar = yOf(pmax), yDepth = yOf(dmax);
  box.append(svg("line", { class: "axis", x1: left, y1: base, x2: w - right, y2: base }));
  for (const [i, m] of seen) {
    const top_ = yBar(m.published);
    box.append(svg("rect", { class: "bar", x: (left + i * slot + 0.5).toFixed(1), y: top_.toFixed(1),
      width: Math.max(1, slot - 1).toFixed(1), height: Math.max(0, base - top_).toFixed(1) },
    svg("title", {}, `${fmtTime(m.minute_ms)}: ${fmtNum(m.published)} published, ${fmtNum(m.delivered)} delivered, depth ${fmtNum(m.depth)}`)));
  }
  if (seen.length > 1) {
    box.append(polyline(seen.map(([i, m]) => [i, m.depth]), "depth", (i) => left + (i + 0.5) * slot, yDepth));
  }
  box.append(svg("text", { x: 2, y: top }, `${fmtNum(pmax)}/min`));
  box.append(svg("text", { class: "depth-label", x: 2, y: top + 14 }, `depth ${fmtNum(dmax)}`));
  box.append(svg("text", { x: left, y: h - 4 }, "60 min ago"));
  box.append(svg("text", { x: w - right - 28, y: h - 4 }, "now"));
  if (!seen.length) box.append(svg("text", { x: left + 8, y: h / 2 }, "no reading yet"));
  return box;
}

function curveChart(data) {
  const w = 800, h = 320, left = 64, right = 8, top = 10, bottom = 24;
  const points = data.points;
  const box = svg("svg", { class: "chart", viewBox: `0 0 ${w} ${h}`, role: "img",
    "aria-label": `views over ${data.range}: ${points.length} points`,
    "data-points": points.length, "data-total": data.total });
  if (points.length === 0) {
    box.append(svg("text", { x: left, y: h / 2 }, "no snapshots in this range"));
    return box;
  }
  const t0 = points[0][0], t1 = Math.max(points[points.length - 1][0], t0 + 1);
  const vs = points.map((p) => p[1]);
  const lines = data.milestones || [];
  let vmin = Math.min(...vs), vmax = Math.max(...vs);
  const next = lines.find((m) => m > vmax);
  if (next !== undefined && next - vmax < (vmax - vmin || vmax) * 0.5) vmax = next;
  if (vmax === vmin) { vmax += 1; vmin = Math.max(0, vmin - 1); }
  const x = (t) => left + ((t - t0) / (t1 - t0)) * (w - left - right);
  const y = (v) => top + (1 - (v - vmin) / (vmax - vmin)) * (h - top - bottom);
  box.append(svg("line", { class: "axis", x1: left, y1: h - bottom, x2: w - right, y2: h - bottom }));
  box.append(svg("line", { class: "axis", x1: left, y1: top, x2: left, y2: h - bottom }));
  box.append(svg("text", { x: 2, y: top + 10 }, fmtNum(vmax)));
  box.append(svg("text", { x: 2, y: h - bottom }, fmtNum(vmin)));
  box.append(svg("text", { x: left, y: h - 6 }, fmtTime(t0)));
  box.append(svg("text", { x: w - right - 150, y: h - 6 }, fmtTime(t1)));
  for (const m of lines) {
    if (m < vmin || m > vmax) continue;
    box.append(svg("line", { class: "milestone", x1: left, x2: w - right, y1: y(m), y2: y(m) }));
    box.append(svg("text", { class: "milestone-label", x: left + 4, y: y(m) - 3 }, `${fmtNum(m)} views`));
  }
  box.append(polyline(points.map((p) => [p[0], p[1]]), "views", x, y));
  return box;
}

function smallChart(points, label) {
  const w = 800, h = 140, left = 64, right = 8, top = 8, bottom = 8;
  const box = svg("svg", { class: "chart", viewBox: `0 0 ${w} ${h}`, role: "img", "aria-label": label });
  if (points.length === 0) return box;
  const t0 = points[0][0], t1 = Math.max(points[points.length - 1][0], t0 + 1);
  const vmax = Math.max(1, ...points.map((p) => Math.max(p[2], p[3])));
  const x = (t) => left + ((t - t0) / (t1 - t0)) * (w - left - right);
  const y = (v) => top + (1 - v / vmax) * (h - top - bottom);
  box.append(svg("text", { x: 2, y: top + 10 }, fmtNum(vmax)));
  box.append(polyline(points.map((p) => [p[0], p[2]]), "likes", x, y));
  box.append(polyline(points.map((p) => [p[0], p[3]]), "coins", x, y));
  return box;
}

// ---- pages ---------------------------------------------------------------------------------

function overviewPage(main) {
  const live = el("div", { id: "overview" });
  main.append(el("h2", {}, "Overview"), live);
  return {
    async refresh() {
      const [s, q] = await Promise.all([api("/status"), api("/ui/api/queue")]);
      const queued = findNumber(s.collector, ["undelivered", "pending", "queue_size"]);
      const clustered = s.cluster && s.cluster.enabled !== false && Array.isArray(s.cluster.members);
      const members = clustered ? s.cluster.members : [];
      const alive = members.filter((m) => m && m.alive === true).length;
      const reload = s.config.last_reload;
      const store = s.store || {};
      const down = s.components.filter((c) => c.state !== "running").length;
      fill(live, 
        el("section", { class: "cards", "aria-label": "Summary" },
          card("state", s.state, s.state === "running" ? "ok" : "warn"),
          card("version", s.version),
          card("uptime", `${Math.round(s.uptime_s)} s`),
          card("components", `${s.components.length - down}/${s.components.length} running`, down ? "warn" : "ok"),
          card("store", store.writable === false ? `not writable: ${store.reason || ""}` : `${store.backend || "sqlite"} writable`,
            store.writable === false ? "bad" : "ok"),
          card("queue depth", fmtNum(queued), queued ? "" : "ok"),
          card("webhook backlog", s.webhooks ? `${fmtNum(s.webhooks.pending_events)} events` +
            (s.webhooks.oldest_pending_s ? `, oldest ${Math.round(s.webhooks.oldest_pending_s)} s` : "") : "–",
            s.webhooks && s.webhooks.pending_events ? "warn" : "ok"),
          card("broker", s.broker ? `${s.broker.kind || ""} ${s.broker.connected === false ? "disconnected" : "ok"}` : "–",
            s.broker && s.broker.connected === false ? "bad" : "ok"),
          members.length ? card("cluster", `${alive}/${members.length} members alive`, alive === members.length ? "ok" : "warn") : null,
          card("published, last hour", `${fmtNum(q.published_last_hour)} rows`),
          card("config generation", String(s.config.generation)),
          card("last reload", reload ? `${reload.ok ? "ok" : "rejected"} ${fmtAgo(reload.at_ms)}` : "none",
            reload && !reload.ok ? "bad" : "")),
        reload ? el("p", { class: "muted" }, reload.message) : null,
        el("h3", {}, "Components"),
        table(["name", "state", "restarts", "last error"], s.components.map((c) => [
          c.name, el("td", { class: c.state === "running" ? "ok" : "warn" }, c.state), num(c.restarts),
          c.last_error || ""])),
        el("h3", {}, "Queue ", el("code", {}, q.queue), ": the last hour"),
        el("div", { class: "legend" }, el("span", { class: "views" }, "■ rows published per minute"),
          el("span", { class: "coins" }, "— depth")),
        queueChart(q),
        clusterMembers(s.cluster, members),
        section("Store", s.store), section("Cluster", s.cluster), section("Broker", s.broker), section("Webhooks", s.webhooks),
        section("Collector", s.collector), section("Tracker", s.tracker), section("Crawl", s.crawl),
        section("HTTP", s.http));
    },
  };
}

// /status.cluster in cluster mode (a single instance reports enabled: false): every field comes
// from another process's row in the store, so each is shown as text (an http address is no link)
function clusterMembers(cluster, members) {
  if (!members.length) return null;
  const text = (v) => (v === null || v === undefined ? "–" : String(v));
  return el("section", { id: "cluster", "aria-label": "Cluster members" },
    el("h3", {}, `Cluster members (this instance: ${text(cluster.instance)}, lease ${text(cluster.lease_s)} s)`),
    table(["instance", "host", "pid", "version", "http", "started", "heartbeat", "lease until", "alive", "holds"],
      members.map((m) => [text(m.instance) + (m.self === true ? " (this one)" : ""), text(m.host), num(m.pid),
        text(m.version), text(m.http), fmtAgo(m.started_ms),
        fmtAgo(m.heartbeat_ms), fmtTime(m.expires_ms),
        el("td", { class: m.alive === true ? "ok" : "bad" }, m.alive === true ? "alive" : "not alive"),
        Array.isArray(m.holds) ? m.holds.map(text).join(", ") : "–"])));
}

function section(title, obj) {
  if (!obj) return null;
  return el("details", {}, el("summary", {}, title), kv(obj));
}

function findNumber(obj, names) {
  if (!obj || typeof obj !== "object") return null;
  for (const name of names) if (typeof obj[name] === "number") return obj[name];
  for (const value of Object.values(obj)) {
    const found = findNumber(value, names);
    if (found !== null) return found;
  }
  return null;
}

function collectorPage(main) {
  const live = el("div", { id: "collector" });
  const message = el("p", { role: "status", id: "collector-message" });
  main.append(el("h2", {}, "Collector"), message, live);
  async function act(kind, taskId) {
    message.textContent = "";
    try {
      const answer = await api(`/crawl/${kind}`, { method: "POST", body: { task_id: taskId } });
      message.textContent = `${kind}: ${JSON.stringify(answer)}`;
      message.className = "";
    } catch (e) {
      message.textContent = `${kind} failed: ${e.message}`;
      message.className = "error";
    }
    await refresh();
  }
  return {
    async refresh() {
      const answer = await api("/tasks");
      const tasks = answer.tasks || [];
      fill(live, tasks.length === 0 ? el("p", {}, "No collector task is configured.") : null,
        ...tasks.map((t) => taskCard(t, act)));
    },
  };
}

function taskCard(t, act) {
  const id = t.settings.id;
  const p = t.progress || {};
  const run = p.current_run || p.last_run;
  const running = Boolean(p.running);
  const lines = [];
  if (run) {
    const span = Math.max(1, run.range_high - run.range_low);
    const done = run.lowest_done === null || run.lowest_done === undefined ? 0 : run.range_high - run.lowest_done;
    lines.push(el("p", {}, running ? "current run " : "last run ", el("code", {}, String(run.run_id).slice(0, 8)),
      ` · range ${fmtNum(run.range_low)}–${fmtNum(run.range_high)} · ${run.status || "running"}`),
    el("progress", { max: span, value: Math.min(span, done), "aria-label": `run progress of task ${id}` }),
    el("p", {}, `fetched ${fmtNum(run.fetched)} · kept ${fmtNum(run.kept)} · dropped ${fmtNum(
      Object.values(run.dropped || {}).reduce((a, b) => a + b, 0))} · published ${fmtNum(run.published)}`));
  }
  return el("article", { class: "card", "data-task": id },
    el("h3", {}, `task ${id}`, t.active ? "" : " (inactive)"),
    el("p", {}, "run: ", el("strong", { class: running ? "ok" : "muted", "data-run": running ? "running" : "idle",
      "data-run-id": run ? run.run_id : "" }, running ? "running" : "idle"),
    ` · next run ${p.next_run_ms ? fmtTime(p.next_run_ms) : "–"}`),
    ...lines,
    el("p", {},
      el("button", { type: "button", "data-action": "start", onclick: () => act("start", id),
        "aria-label": `Start task ${id}` }, "Start"), " ",
      el("button", { type: "button", "data-action": "stop", onclick: () => act("stop", id),
        "aria-label": `Stop task ${id}` }, "Stop")),
    el("details", {}, el("summary", {}, "settings"), kv(t.settings)));
}

function jobsPage(main) {
  const live = el("div", { id: "jobs" });
  main.append(el("h2", {}, "Jobs"), live);
  return {
    async refresh() {
      const answer = await api("/ui/api/jobs?limit=200");
      fill(live, answer.jobs.length === 0 ? el("p", {}, "No jobs yet.") : table(
        ["job", "kind", "status", "progress", "source", "created", "webhook delivery"],
        answer.jobs.map((j) => [
          el("td", {}, el("a", { href: `#/job/${j.id}` }, j.id.slice(0, 8))), j.kind,
          el("td", { class: j.status === "failed" ? "bad" : (j.status === "completed" ? "ok" : "") }, j.status),
          el("td", {}, el("progress", { max: Math.max(1, j.total), value: j.completed,
            "aria-label": `${j.completed} of ${j.total}` }), ` ${fmtNum(j.completed)}/${fmtNum(j.total)}`),
          JSON.stringify(j.source), fmtAgo(j.created_ms),
          el("td", { class: deliveryClass(j.delivery), "data-delivery": j.id }, deliveryText(j.delivery))])));
    },
  };
}

function deliveryText(d) {
  if (!d) return "no webhook";
  const parts = [`cursor ${fmtNum(d.cursor)}/${fmtNum(d.last_seq)}`, `pending ${fmtNum(d.pending)}`,
    `failed ${fmtNum(d.failed)}`];
  if (d.gone) parts.push(`gone (410 at ${d.gone.event_id}, ${fmtNum(d.gone.skipped)} skipped)`);
  return parts.join(" · ");
}

function deliveryClass(d) {
  if (!d) return "muted";
  return d.gone || d.failed ? "bad" : (d.pending ? "warn" : "ok");
}

function deliveryCards(d) {
  if (!d) return el("p", { class: "muted" }, "This job has no webhook.");
  return el("section", { class: "cards", id: "job-delivery", "aria-label": "Webhook delivery" },
    card("cursor", `${fmtNum(d.cursor)} of ${fmtNum(d.last_seq)} events`),
    card("pending", fmtNum(d.pending), d.pending ? "warn" : "ok"),
    card("failed", fmtNum(d.failed), d.failed ? "bad" : "ok"),
    card("gone", d.gone ? `410 at ${d.gone.event_id} (${d.gone.type}), ${fmtNum(d.gone.skipped)} skipped` : "no",
      d.gone ? "bad" : "ok"));
}

function jobPage(main, id) {
  const live = el("div", { id: "job" });
  main.append(el("h2", {}, `Job ${id}`), el("p", {}, el("a", { href: "#/jobs" }, "← all jobs")), live);
  return {
    async refresh() {
      const jobs = await api("/ui/api/jobs?limit=1000");
      const job = jobs.jobs.find((j) => j.id === id);
      const base = job && job.kind === "batch_scrape" ? "/v2/batch/scrape" : "/v2/crawl";
      const [status, errors] = await Promise.all([
        api(`${base}/${encodeURIComponent(id)}?limit=50`), api(`${base}/${encodeURIComponent(id)}/errors`)]);
      const docs = (status.data || []).map((d) => {
        const meta = d.metadata || {};
        const text = typeof d.markdown === "string" ? d.markdown.slice(0, 2000) : JSON.stringify(d).slice(0, 2000);
        return el("details", {}, el("summary", {}, meta.sourceURL || meta.url || meta.title || "row"),
          el("pre", {}, text));
      });
      fill(live, 
        el("section", { class: "cards" }, card("status", status.status), card("completed", fmtNum(status.completed)),
          card("total", fmtNum(status.total)), card("created", status.createdAt), card("duration", status.duration ?? "–")),
        job ? kv({ kind: job.kind, source: job.source, error: job.error }) : null,
        el("h3", {}, "Webhook delivery"), job ? deliveryCards(job.delivery) : null,
        el("h3", {}, `Errors (${errors.errors.length})`),
        errors.errors.length ? table(["time", "url", "code", "error"],
          errors.errors.map((e) => [e.timestamp, e.url, e.code || "", e.error])) : el("p", { class: "muted" }, "none"),
        el("h3", {}, `Documents (first ${docs.length})`), ...docs);
    },
  };
}

function trackerPage(main) {
  const results = el("div", { id: "video-results" });
  const near = el("div", { id: "milestones" });
  const input = el("input", { id: "video-q", type: "search", name: "q", placeholder: "aid, avNNN, title or uploader" });
  const form = el("form", { class: "inline", role: "search", onsubmit: (e) => { e.preventDefault(); refresh(); } },
    el("label", { for: "video-q" }, "Search videos"), input, el("button", { type: "submit" }, "Search"));
  const schedules = el("div", { id: "schedules" });
  main.append(el("h2", {}, "Tracker"), form, results, el("h3", {}, "Songs nearest a milestone"), near,
    el("h3", {}, "Schedules by type and status"), schedules);
  return {
    async refresh() {
      const [found, songs, plan] = await Promise.all([
        api(`/ui/api/videos?limit=50&q=${encodeURIComponent(input.value)}`), api("/tracker/milestones?limit=20"),
        api("/tracker/schedules")]);
      fill(schedules, scheduleTable(plan));
      fill(results, found.videos.length === 0 ? el("p", {}, "No video matches.") :
        table(["aid", "title", "uploader", "views", "song", "last snapshot"], found.videos.map((v) => [
          el("td", {}, el("a", { href: `#/video/${v.aid}` }, `av${v.aid}`)), v.title || "", v.uploader || "",
          num(v.views), v.song ? "yes" : "no", fmtAgo(v.last_snapshot_ms)])));
      fill(near, songs.songs.length === 0 ? el("p", {}, "No song is tracked yet.") :
        table(["aid", "title", "views", "target", "to go", "ETA"], songs.songs.map((s) => [
          el("td", {}, el("a", { href: `#/video/${s.aid}` }, `av${s.aid}`)), s.title || "", num(s.views),
          num(s.target), num(s.views_to_go), s.eta_hours === null ? "–" : `${s.eta_hours.toFixed(1)} h`])));
    },
  };
}

// rows per schedule type × status (kept by the store's triggers) next to the lag of the
// snapshots each type stored in the tracker's lag window (p50/p99: taken after planned)
function scheduleTable(plan) {
  const types = Object.keys(plan.counts);
  const extra = [...new Set(types.flatMap((t) => Object.keys(plan.counts[t])))].filter((st) => !STATUSES.includes(st));
  const statuses = [...STATUSES, ...extra];
  const secs = (v) => (typeof v === "number" ? `${v.toFixed(1)} s` : "–");
  return table(["type", ...statuses, "lag p50", "lag p99", "snapshots (lag window)"], types.map((t) => {
    const lag = plan.lag[t] || {};
    return [el("td", { "data-type": t }, t), ...statuses.map((st) => num(plan.counts[t][st] || 0)),
      el("td", { class: "num" }, secs(lag.p50_s)), el("td", { class: "num" }, secs(lag.p99_s)), num(lag.count || 0)];
  }));
}

function videoPage(main, aid) {
  let range = "7d";
  const head = el("div", { id: "video-head" });
  const chart = el("div", { id: "video-chart" });
  const rows = el("div", { id: "video-rows" });
  const buttons = RANGES.map((r) => el("button", { type: "button", "data-range": r, "aria-pressed": String(r === range),
    onclick: () => { range = r; buttons.forEach((b) => b.setAttribute("aria-pressed", String(b.dataset.range === r))); refresh(); } }, r));
  main.append(el("p", {}, el("a", { href: "#/tracker" }, "← tracker")), head,
    el("div", { class: "ranges", role: "group", "aria-label": "Range" }, buttons),
    el("div", { class: "legend" }, el("span", { class: "views" }, "— views"), el("span", { class: "likes" }, "— likes"),
      el("span", { class: "coins" }, "— coins"), el("span", {}, "dashed: milestones")),
    chart, el("p", {}, el("a", { href: `/tracker/videos/${aid}/snapshots?format=csv&limit=10000`, download: `av${aid}.csv` },
      "Download CSV (first 10,000 snapshots; the Link header gives the next page)")),
    el("h3", {}, "Latest snapshots"), rows);
  return {
    async refresh() {
      const [video, curve] = await Promise.all([
        api(`/tracker/videos/${aid}`), api(`/ui/api/videos/${aid}/curve?range=${range}`)]);
      // the latest ~50 snapshots: start a few decimated points before the end (each stands for
      // total/count rows), so the table never reads more than a few hundred rows
      const pts = curve.points;
      const back = pts.length ? Math.min(pts.length, Math.ceil((50 * pts.length) / Math.max(1, curve.total)) + 1) : 0;
      const from = back ? pts[pts.length - back][0] : curve.since_ms;
      const snaps = await api(`/tracker/videos/${aid}/snapshots?since=${from}&limit=10000`);
      const latest = video.latest_snapshot || {};
      fill(head, el("h2", { id: "video-title" }, video.title || `av${aid}`),
        el("section", { class: "cards" }, card("aid", `av${aid}`), card("views", fmtNum(latest.views)),
          card("uploader", (video.uploader && video.uploader.name) || "–"), card("song", video.song ? "yes" : "no"),
          card("next milestone", video.milestone ? fmtNum(video.milestone.target ?? null) : "–"),
          card("status", String(video.status))));
      fill(chart, el("p", { class: "muted" },
        `${fmtNum(curve.count)} points drawn of ${fmtNum(curve.total)} snapshots in ${curve.range}`),
        curveChart(curve), smallChart(curve.points, `likes and coins over ${curve.range}`));
      const last = snaps.snapshots.slice(-50).reverse();
      fill(rows, table(["time", "views", "likes", "coins", "favorites", "danmakus", "replies", "shares"],
        last.map((s) => [fmtTime(s.at_ms), num(s.views), num(s.likes), num(s.coins), num(s.favorites),
          num(s.danmakus), num(s.replies), num(s.shares)])));
    },
  };
}

function crawlPage(main) {
  const live = el("div", { id: "crawls" });
  const message = el("p", { role: "status", id: "crawl-message" });
  const url = el("input", { id: "crawl-url", type: "url", name: "url", required: true, placeholder: "https://example.com/" });
  const limit = el("input", { id: "crawl-limit", type: "number", name: "limit", min: 1, max: 100000, value: 10 });
  const kind = el("select", { id: "crawl-kind", name: "kind" }, el("option", { value: "crawl" }, "crawl"),
    el("option", { value: "scrape" }, "scrape (one page)"));
  const form = el("form", { class: "stack", onsubmit: async (e) => {
    e.preventDefault();
    message.textContent = "";
    message.className = "";
    try {
      if (kind.value === "scrape") {
        const answer = await api("/v2/scrape", { method: "POST", body: { url: url.value, formats: ["markdown"] } });
        message.append(el("pre", {}, (answer.data && answer.data.markdown || "").slice(0, 3000)));
      } else {
        const answer = await api("/v2/crawl", { method: "POST", body: { url: url.value, limit: Number(limit.value) } });
        message.append("started ", el("a", { href: `#/job/${answer.id}` }, answer.id));
      }
    } catch (err) {
      message.textContent = `refused: ${err.message}`;
      message.className = "error";
    }
    await refresh();
  } },
  el("label", { for: "crawl-url" }, "URL"), url, el("label", { for: "crawl-kind" }, "What"), kind,
  el("label", { for: "crawl-limit" }, "Page limit (crawl)"), limit, el("button", { type: "submit" }, "Start"));
  main.append(el("h2", {}, "Crawl"), form, message, live);
  return {
    async refresh() {
      const [active, jobs, feedback] = await Promise.all([api("/v2/crawl/active"),
        api("/ui/api/jobs?kind=crawl&limit=100"), api("/v2/feedback?limit=20")]);
      const crawls = jobs.jobs.filter((j) => j.source && j.source.url !== undefined);
      fill(live, el("h3", {}, `Running (${active.crawls.length})`),
        active.crawls.length ? table(["id", "url", "created"], active.crawls.map((c) => [
          el("td", {}, el("a", { href: `#/job/${c.id}` }, c.id.slice(0, 8))), c.url, c.created_at])) : el("p", { class: "muted" }, "none"),
        el("h3", {}, "Recent crawls"),
        crawls.length ? table(["id", "url", "status", "pages", "pages/s"], crawls.map((j) => {
          const end = j.completed_ms || Date.now();
          const rate = j.completed / Math.max(1, (end - j.created_ms) / 1000);
          return [el("td", {}, el("a", { href: `#/job/${j.id}` }, j.id.slice(0, 8))), String(j.source.url),
            j.status, num(j.completed), rate.toFixed(2)];
        })) : el("p", { class: "muted" }, "none"),
        el("h3", {}, `Feedback (${feedback.total})`), feedbackTable(feedback.data));
    },
  };
}

// Feedback from agents (firecrawl-mcp's feedback tools, GET /v2/feedback): newest first, what
// they rated, the sources they valued and what they missed, all as text.
function feedbackTable(items) {
  if (!items.length) return el("p", { class: "muted" }, "none");
  return el("div", { id: "feedback" }, table(["when", "endpoint", "target", "rating", "said"], items.map((f) => {
    const b = f.body || {};
    const said = [b.note, b.rationale, b.querySuggestions,
      ...(b.valuableSources || []).map((v) => `valuable: ${v.url}${v.reason ? ` (${v.reason})` : ""}`),
      ...(b.missingContent || []).map((m) => `missing: ${m.topic}`),
      ...(b.issues || []).map((i) => `issue: ${i}`)].filter(Boolean).join(" · ");
    return [f.createdAt, f.endpoint, f.targetId ? f.targetId.slice(0, 8) : "", f.rating, said];
  })));
}

const PAGES = { overview: overviewPage, collector: collectorPage, jobs: jobsPage, job: jobPage,
  tracker: trackerPage, video: videoPage, crawl: crawlPage };
// the navigation entry a page belongs to when it has none of its own (monitors.js adds its own)
const NAV_OF = { job: "jobs", video: "tracker" };

function route() {
  stopPolling();
  const parts = (location.hash || "#/overview").slice(2).split("/");
  const name = PAGES[parts[0]] ? parts[0] : "overview";
  const args = parts.slice(1).map((p) => decodeURIComponent(p));
  const main = document.getElementById("main");
  fill(main);
  const navName = NAV_OF[name] || name;
  for (const link of document.querySelectorAll("nav a")) {
    if (link.getAttribute("href") === `#/${navName}`) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  document.title = `crawld · ${name}`;
  state.page = PAGES[name](main, ...args);
  refresh();
}

async function start() {
  document.getElementById("login-form").addEventListener("submit", onLogin);
  document.getElementById("logout").addEventListener("click", onLogout);
  window.addEventListener("hashchange", () => { if (document.getElementById("login").hidden) route(); });
  const session = await api("/ui/api/session");
  state.authRequired = session.auth_required;
  state.csrf = session.csrf;
  if (!session.logged_in) { showLogin(); return; }
  document.getElementById("logout").hidden = !session.auth_required;
  route();
}

document.addEventListener("DOMContentLoaded", start);
