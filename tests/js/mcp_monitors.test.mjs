// Firecrawl's MCP server (firecrawl-mcp, pinned in package-lock.json) driving crawld's monitors
// with its eight monitor tools, as an agent host runs it: a separate process speaking MCP over
// stdio, FIRECRAWL_API_URL pointed at crawld, FIRECRAWL_API_KEY set when crawld has one. Each
// answer passes the tool's output schema (additionalProperties: false on the top level) and
// call() fails when a key crawld sent was dropped by it.
// tests/crawlapi/test_mcp_monitors_js.py starts crawld and the site and runs `node --test` on
// this file with
//   CRAWLD_URL  crawld's base URL     CRAWLD_KEY  the API key, or unset for none
//   SITE_URL    the site simulator's base URL (no trailing slash)
// and reads the TAP summary (# pass / # fail). The tests run in order on one monitor.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { setTimeout as sleep } from "node:timers/promises";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const key = process.env.CRAWLD_KEY || undefined;
const site = process.env.SITE_URL;
const server = new URL("./node_modules/firecrawl-mcp/dist/index.js", import.meta.url).pathname;
const env = { PATH: process.env.PATH, HOME: process.env.HOME, FIRECRAWL_API_URL: process.env.CRAWLD_URL };
if (key) env.FIRECRAWL_API_KEY = key;
const transport = new StdioClientTransport({ command: process.execPath, args: [server], env, stderr: "pipe" });
const client = new Client({ name: "crawld-tests", version: "1.0.0" });
await client.connect(transport);
after(() => client.close());
await client.listTools(); // the Client validates only the tools it has listed

async function call(name, args) {
  const answer = await client.callTool({ name, arguments: args });
  assert.ok(!answer.isError, JSON.stringify(answer.content).slice(0, 500));
  assert.ok(answer.structuredContent, `${name} answered no structured content`);
  assert.deepEqual(answer.structuredContent, JSON.parse(answer.content[0].text),
                   `${name}: keys dropped by the output schema`);
  return answer.structuredContent;
}

async function refusal(name, args) {
  try {
    const answer = await client.callTool({ name, arguments: args });
    return answer.isError ? JSON.stringify(answer.content) : undefined;
  } catch (error) {
    return String(error);
  }
}

let monitor;

test("firecrawl_monitor_create with a page and a goal: every 30 minutes by default", async () => {
  const created = await call("firecrawl_monitor_create", { page: `${site}/about`, goal: "any change",
                                                          name: "about page" });
  monitor = created.data;
  assert.equal(created.success, true);
  assert.equal(monitor.name, "about page");
  assert.deepEqual(monitor.schedule, { cron: "*/30 * * * *", timezone: "UTC" });
  assert.equal(monitor.targets[0].type, "scrape");
  assert.equal(monitor.judgeEnabled, true);
});

test("an email notification is refused, not dropped", async () => {
  const refused = await refusal("firecrawl_monitor_create", { page: `${site}/about`, goal: "g",
                                                             email: "ops@example.org" });
  assert.match(refused ?? "", /Bad Request/, refused);
});

test("firecrawl_monitor_list and firecrawl_monitor_get", async () => {
  const listed = await call("firecrawl_monitor_list", { limit: 10 });
  assert.deepEqual(listed.data.map((m) => m.id), [monitor.id]);
  const got = await call("firecrawl_monitor_get", { id: monitor.id });
  assert.equal(got.data.id, monitor.id);
});

test("a paused monitor does not run; firecrawl_monitor_update resumes it", async () => {
  const paused = await call("firecrawl_monitor_update", { id: monitor.id, body: { status: "paused" } });
  assert.equal(paused.data.status, "paused");
  const refused = await refusal("firecrawl_monitor_run", { id: monitor.id });
  assert.match(refused ?? "", /paused/, refused);
  const active = await call("firecrawl_monitor_update", { id: monitor.id,
                                                         body: { status: "active", name: "about" } });
  assert.equal(active.data.status, "active");
  assert.equal(active.data.name, "about");
});

test("firecrawl_monitor_run, then firecrawl_monitor_check and firecrawl_monitor_checks", async () => {
  const run = await call("firecrawl_monitor_run", { id: monitor.id });
  assert.equal(run.data.trigger, "manual");
  let check;
  for (let i = 0; i < 300; i++) {
    check = await call("firecrawl_monitor_check", { id: monitor.id, checkId: run.data.id });
    if (!["queued", "running"].includes(check.data.status)) break;
    await sleep(50);
  }
  assert.equal(check.data.status, "completed", JSON.stringify(check.data));
  assert.deepEqual(check.data.pages.map((p) => [p.url, p.status]), [[`${site}/about`, "new"]]);
  const news = await call("firecrawl_monitor_check", { id: monitor.id, checkId: run.data.id,
                                                      pageStatus: "same" });
  assert.deepEqual(news.data.pages, []);
  const checks = await call("firecrawl_monitor_checks", { id: monitor.id, status: "completed" });
  assert.deepEqual(checks.data.map((c) => c.id), [run.data.id]);
});

test("firecrawl_monitor_delete", async () => {
  const deleted = await call("firecrawl_monitor_delete", { id: monitor.id });
  assert.equal(deleted.success, true);
  const missing = await refusal("firecrawl_monitor_get", { id: monitor.id });
  assert.match(missing ?? "", /not found/i, missing);
});
