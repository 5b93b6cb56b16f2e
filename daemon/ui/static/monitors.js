// crawld console: the monitors pages (issue 34), loaded after app.js and using its helpers (el,
// fill, table, card, api, refresh). The monitors with their last checks, one monitor's checks,
// one check's pages, and a changed page's diff, unified or side by side. Page content (URLs,
// markdown, diffs, errors) is hostile: it reaches the DOM only as text nodes, as in app.js.
// The diff's rows come from the server already parsed (daemon/ui/diffview.py).
"use strict";

const PAGE_STATUSES = ["changed", "new", "removed", "error", "same"];
const STATUS_CLASS = { changed: "warn", new: "ok", removed: "bad", error: "bad", same: "muted",
  completed: "ok", partial: "warn", failed: "bad", running: "", queued: "muted", skipped_overlap: "muted",
  active: "ok", paused: "warn" };
const DIFF_MODE_KEY = "crawld.diffMode";

function isoMs(iso) { return iso ? Date.parse(iso) : null; }

function fmtWhen(iso) {
  const ms = isoMs(iso);
  if (ms === null || Number.isNaN(ms)) return "–";
  const s = Math.round((ms - Date.now()) / 1000);
  const rel = s >= 0 ? (s < 90 ? `in ${s}s` : (s < 5400 ? `in ${Math.round(s / 60)}min` : `in ${Math.round(s / 3600)}h`))
    : fmtAgo(ms);
  return `${fmtTime(ms)} (${rel})`;
}

function statusCell(status, attrs) {
  return el("td", { class: `status ${STATUS_CLASS[status] || ""}`, ...(attrs || {}) }, status || "–");
}

// "4 pages: 1 changed · 1 new · 2 same", each count a span the tests (and a stylesheet) can find
function summaryNode(summary, status) {
  const s = summary || {};
  const node = el("span", { class: "summary", "data-total": s.totalPages || 0 });
  if (!s.totalPages) { node.append(status === "running" || status === "queued" ? "no page yet" : "no pages"); return node; }
  node.append(`${fmtNum(s.totalPages)} pages: `);
  const shown = PAGE_STATUSES.filter((k) => s[k]);
  shown.forEach((k, i) => {
    if (i) node.append(" · ");
    node.append(el("span", { class: `count ${STATUS_CLASS[k]}`, "data-count": k }, `${fmtNum(s[k])} ${k}`));
  });
  return node;
}

function scheduleText(m) {
  return `${m.schedule.cron} (${m.schedule.timezone})`;
}

// Run now, Pause / Resume: through /v2/monitor itself; a 409 (paused, or a check runs) is a
// message saying why, with a link to the running check
function monitorActions(m, message) {
  async function act(kind) {
    message.textContent = "";
    message.className = "";
    try {
      if (kind === "run") {
        const answer = await api(`/v2/monitor/${encodeURIComponent(m.id)}/run`, { method: "POST" });
        const check = answer.data;
        message.append(`${m.name}: check started, `, el("a", { href: `#/check/${m.id}/${check.id}` }, `check ${check.id.slice(0, 8)}`));
        message.className = "ok";
      } else {
        const status = kind === "pause" ? "paused" : "active";
        await api(`/v2/monitor/${encodeURIComponent(m.id)}`, { method: "PATCH", body: { status } });
        message.textContent = `${m.name}: ${kind === "pause" ? "paused" : "resumed"}.`;
        message.className = "ok";
      }
    } catch (e) {
      if (e.status === 409 && e.data) {
        message.append(`${m.name}: not started. ${e.data.error || "refused"}.`);
        if (e.data.checkId) {
          message.append(" ", el("a", { href: `#/check/${m.id}/${e.data.checkId}` }, "See the running check"), ".");
        } else if (m.status === "paused" || /paused/i.test(e.data.error || "")) {
          message.append(" Resume it to run a check.");
        }
        message.className = "warn";
      } else {
        message.textContent = `${m.name}: ${kind} failed: ${e.message}`;
        message.className = "error";
      }
    }
    await refresh();
  }
  const paused = m.status === "paused";
  return el("span", { class: "actions" },
    el("button", { type: "button", "data-action": "run", onclick: () => act("run"),
      "aria-label": `Run ${m.name} now` }, "Run now"), " ",
    el("button", { type: "button", "data-action": paused ? "resume" : "pause",
      onclick: () => act(paused ? "resume" : "pause"), "aria-label": `${paused ? "Resume" : "Pause"} ${m.name}` },
    paused ? "Resume" : "Pause"));
}

function lastChecks(m) {
  if (!m.checks.length) return el("span", { class: "muted" }, "no check yet");
  return el("ul", { class: "checks" }, m.checks.map((c) => el("li", { "data-check": c.id },
    el("a", { href: `#/check/${m.id}/${c.id}` }, fmtTime(isoMs(c.startedAt || c.scheduledFor))), " ",
    el("span", { class: STATUS_CLASS[c.status] || "" }, c.status), " · ", summaryNode(c.summary, c.status))));
}

function monitorsPage(main) {
  const message = el("p", { role: "status", id: "monitor-message" });
  const live = el("div", { id: "monitors" });
  main.append(el("h2", {}, "Monitors"), message, live);
  return {
    async refresh() {
      const answer = await api("/ui/api/monitors?limit=200&checks=5");
      if (!answer.enabled) {
        fill(live, el("p", {}, "Monitors are off on this daemon ([monitors] enabled = false, or [crawl] is off)."));
        return;
      }
      fill(live, answer.monitors.length === 0 ? el("p", {}, "No monitor yet: create one with POST /v2/monitor.") : table(
        ["monitor", "schedule", "status", "next run", "last checks", "actions"],
        answer.monitors.map((m) => [
          el("td", { "data-monitor": m.id }, el("a", { href: `#/monitor/${m.id}` }, m.name)),
          el("td", {}, el("code", {}, scheduleText(m))),
          statusCell(m.currentCheckId ? "running" : m.status, { "data-status": m.status }),
          el("td", { "data-next": m.nextRunAt || "" }, m.status === "paused" ? "–" : fmtWhen(m.nextRunAt)),
          el("td", {}, lastChecks(m)),
          el("td", {}, monitorActions(m, message))])));
    },
  };
}

function targetText(t) {
  if (t.type === "scrape") return `scrape ${(t.urls || []).join(", ")}`;
  if (t.type === "crawl") return `crawl ${t.url}`;
  return `search ${(t.queries || []).join(" | ")}`;
}

function monitorPage(main, id) {
  const head = el("div", { id: "monitor-head" });
  const message = el("p", { role: "status", id: "monitor-message" });
  const checks = el("div", { id: "monitor-checks" });
  main.append(el("p", {}, el("a", { href: "#/monitors" }, "← all monitors")), head, message,
    el("h3", {}, "Checks (newest 50)"), checks);
  return {
    async refresh() {
      const [one, list] = await Promise.all([api(`/v2/monitor/${encodeURIComponent(id)}`),
        api(`/v2/monitor/${encodeURIComponent(id)}/checks?limit=50`)]);
      const m = one.data;
      fill(head, el("h2", {}, m.name),
        el("section", { class: "cards", "aria-label": "Monitor" },
          card("status", m.status, STATUS_CLASS[m.status]),
          card("schedule", scheduleText(m)),
          card("next run", m.status === "paused" ? "paused" : fmtWhen(m.nextRunAt)),
          card("last run", fmtWhen(m.lastRunAt)),
          card("running check", m.currentCheckId ? el("a", { href: `#/check/${m.id}/${m.currentCheckId}` },
            m.currentCheckId.slice(0, 8)) : "none"),
          card("keeps checks", `${m.retentionDays} days`)),
        el("p", {}, monitorActions(m, message)),
        el("h3", {}, "Targets"), el("ul", {}, m.targets.map((t) => el("li", {}, targetText(t)))),
        m.goal ? el("p", {}, "Goal: ", el("q", {}, m.goal), m.judgeEnabled ? " (changes judged by the model)" : "") : null);
      fill(checks, list.data.length === 0 ? el("p", { class: "muted" }, "No check yet.") : table(
        ["check", "scheduled", "trigger", "status", "pages", "finished"],
        list.data.map((c) => [
          el("td", {}, el("a", { href: `#/check/${m.id}/${c.id}` }, c.id.slice(0, 8))),
          fmtTime(isoMs(c.scheduledFor)), c.trigger, statusCell(c.status),
          el("td", {}, summaryNode(c.summary, c.status), c.error ? el("div", { class: "error" }, c.error) : null),
          fmtTime(isoMs(c.finishedAt))])));
    },
  };
}

function pageNumber(pageId) { return pageId.slice(pageId.lastIndexOf(":") + 1); }

function judgmentText(j) {
  if (!j) return "–";
  return `${j.meaningful ? "meaningful" : "not meaningful"} (${j.confidence})${j.reason ? `: ${j.reason}` : ""}`;
}

function checkPage(main, id, checkId) {
  let skip = 0;
  let status = "";
  const head = el("div", { id: "check-head" });
  const pages = el("div", { id: "check-pages" });
  const select = el("select", { id: "check-status", name: "status", onchange: () => { status = select.value; skip = 0; refresh(); } },
    el("option", { value: "" }, "every status"), PAGE_STATUSES.map((s) => el("option", { value: s }, s)));
  const prev = el("button", { type: "button", onclick: () => { skip = Math.max(0, skip - 100); refresh(); } }, "← previous 100");
  const next = el("button", { type: "button", onclick: () => { skip += 100; refresh(); } }, "next 100 →");
  main.append(el("p", {}, el("a", { href: `#/monitor/${id}` }, "← monitor")), head,
    el("form", { class: "inline", onsubmit: (e) => e.preventDefault() }, el("label", { for: "check-status" }, "Pages"), select),
    pages, el("p", { class: "pager" }, prev, " ", next));
  return {
    async refresh() {
      const query = `limit=100&skip=${skip}${status ? `&status=${status}` : ""}`;
      const answer = await api(`/v2/monitor/${encodeURIComponent(id)}/checks/${encodeURIComponent(checkId)}?${query}`);
      const c = answer.data;
      prev.hidden = skip === 0;
      next.hidden = !answer.next;
      fill(head, el("h2", {}, `Check ${checkId.slice(0, 8)}`),
        el("section", { class: "cards", "aria-label": "Check" },
          card("status", c.status, STATUS_CLASS[c.status]), card("trigger", c.trigger),
          card("scheduled", fmtTime(isoMs(c.scheduledFor))), card("started", fmtTime(isoMs(c.startedAt))),
          card("finished", fmtTime(isoMs(c.finishedAt)))),
        el("p", {}, summaryNode(c.summary, c.status)), c.error ? el("p", { class: "error" }, c.error) : null);
      fill(pages, c.pages.length === 0 ? el("p", { class: "muted" }, "No page here (yet).") : table(
        ["page", "status", "HTTP", "judgment", "diff"],
        c.pages.map((p) => [
          el("td", { class: "url" }, p.url, p.error ? el("div", { class: "error" }, p.error) : null),
          statusCell(p.status, { "data-page-status": p.status }), num(p.statusCode), judgmentText(p.judgment),
          el("td", {}, p.diff ? el("a", { href: `#/diff/${id}/${checkId}/${pageNumber(p.id)}`, "data-diff": p.url },
            "view diff") : "–")])));
    },
  };
}

// ---- the diff ------------------------------------------------------------------------------

const SIGN = { add: "+", del: "−", ctx: " " };

function partsNodes(parts, kind) {
  const mark = kind === "add" ? "ins" : "del";
  return parts.map(([text, changed]) => (changed && kind !== "ctx" ? el(mark, { class: "hl" }, text) : text));
}

function unifiedTable(rows) {
  return el("table", { class: "diff diff-unified", "data-mode": "unified" },
    el("tbody", {}, rows.map((r) => {
      if (r.kind === "hunk" || r.kind === "note") {
        return el("tr", { class: `diff-${r.kind}` }, el("td", { colspan: 4 }, r.text));
      }
      return el("tr", { class: `diff-${r.kind}` },
        el("td", { class: "ln" }, r.old ?? ""), el("td", { class: "ln" }, r.new ?? ""),
        el("td", { class: "sign", "aria-hidden": "true" }, SIGN[r.kind]),
        el("td", { class: "code" }, partsNodes(r.parts, r.kind)));
    })));
}

function splitCells(cell) {
  if (!cell) return [el("td", { class: "ln diff-empty" }), el("td", { class: "code diff-empty" })];
  return [el("td", { class: `ln diff-${cell.kind}` }, cell.n),
    el("td", { class: `code diff-${cell.kind}` }, el("span", { class: "sign", "aria-hidden": "true" }, SIGN[cell.kind]),
      partsNodes(cell.parts, cell.kind))];
}

function splitTable(rows) {
  return el("table", { class: "diff diff-split", "data-mode": "split" },
    el("thead", {}, el("tr", {}, el("th", { colspan: 2, scope: "colgroup" }, "before"),
      el("th", { colspan: 2, scope: "colgroup" }, "after"))),
    el("tbody", {}, rows.map((r) => (r.kind === "line"
      ? el("tr", {}, ...splitCells(r.left), ...splitCells(r.right))
      : el("tr", { class: `diff-${r.kind}` }, el("td", { colspan: 4 }, r.text))))));
}

function fieldTable(fields) {
  return el("div", { class: "table-wrap" }, el("table", { class: "diff diff-fields" },
    el("thead", {}, el("tr", {}, el("th", { scope: "col" }, "field"), el("th", { scope: "col" }, "before"),
      el("th", { scope: "col" }, "after"))),
    el("tbody", {}, fields.map((f) => el("tr", {}, el("td", {}, f.field),
      el("td", { class: "code diff-del" }, f.previous), el("td", { class: "code diff-add" }, f.current))))));
}

function diffMode() {
  try { return localStorage.getItem(DIFF_MODE_KEY) === "split" ? "split" : "unified"; } catch (e) { return "unified"; }
}

function diffPage(main, id, checkId, n) {
  let mode = diffMode();
  let loaded = null;
  const head = el("div", { id: "diff-head" });
  const body = el("div", { id: "diff-body" });
  const buttons = [["unified", "Unified"], ["split", "Side by side"]].map(([value, label]) =>
    el("button", { type: "button", "data-mode": value, "aria-pressed": String(value === mode), onclick: () => {
      mode = value;
      try { localStorage.setItem(DIFF_MODE_KEY, mode); } catch (e) { /* private mode: not kept */ }
      buttons.forEach((b) => b.setAttribute("aria-pressed", String(b.dataset.mode === mode)));
      draw();
    } }, label));
  main.append(el("p", {}, el("a", { href: `#/check/${id}/${checkId}` }, "← check")), head,
    el("div", { class: "ranges", role: "group", "aria-label": "Diff layout" }, buttons), body);

  function draw() {
    if (!loaded) return;
    const v = loaded.view;
    const lines = v.unified.length ? el("div", { class: "table-wrap" },
      mode === "split" ? splitTable(v.split) : unifiedTable(v.unified)) : null;
    fill(body,
      el("p", { class: "legend" }, el("span", { class: "diff-del" }, `− ${fmtNum(v.removed)} removed`),
        el("span", { class: "diff-add" }, `+ ${fmtNum(v.added)} added`)),
      v.cut ? el("p", { class: "warn" }, `${fmtNum(v.cut)} more diff lines are not shown.`) : null,
      lines, v.fields.length ? fieldTable(v.fields) : null,
      !lines && !v.fields.length ? el("p", { class: "muted" }, `No diff: this page is ${loaded.page.status}.`) : null);
  }

  return {
    async refresh() {
      if (loaded) return;  // a stored diff does not change
      const answer = await api(`/ui/api/monitors/${encodeURIComponent(id)}/checks/${encodeURIComponent(checkId)}/pages/${encodeURIComponent(n)}`);
      const p = answer.page;
      fill(head, el("h2", { class: "url" }, p.url),
        el("p", {}, `${answer.monitor.name} · check ${checkId.slice(0, 8)} · `,
          el("span", { class: STATUS_CLASS[p.status] || "", "data-page-status": p.status }, p.status),
          p.statusCode ? ` · HTTP ${p.statusCode}` : ""),
        p.judgment ? el("p", {}, "Judgment: ", judgmentText(p.judgment)) : null);
      loaded = answer;
      draw();
    },
  };
}

Object.assign(PAGES, { monitors: monitorsPage, monitor: monitorPage, check: checkPage, diff: diffPage });
Object.assign(NAV_OF, { monitor: "monitors", check: "monitors", diff: "monitors" });
