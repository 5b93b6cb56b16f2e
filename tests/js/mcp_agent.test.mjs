// Firecrawl's MCP server (firecrawl-mcp, pinned in package-lock.json) running crawld's agent and a
// prompted crawl, the way an agent host runs it: a separate process speaking MCP over stdio,
// FIRECRAWL_API_URL pointed at crawld, FIRECRAWL_API_KEY set when crawld has an API key. Two
// checks stand between crawld's answer and the host: firecrawl-mcp parses it with the tool's zod
// output schema (a wrong type fails the call, an unknown key is silently dropped), then the MCP
// SDK's Client validates it against the JSON form of that schema (additionalProperties: false),
// once it has listed the tools. call() below makes a dropped key fail too.
// tests/crawlapi/test_mcp_agent_js.py starts crawld, the site, the SearXNG and model simulators
// (the model's first answer scripted for the crawl prompt, the rest derived from the pages) and
// runs `node --test` on this file with
//   CRAWLD_URL  crawld's base URL     CRAWLD_KEY  the API key, or unset for none
//   SITE_URL    the site simulator's base URL (no trailing slash)
//   SEARXNG_URL the SearXNG simulator's base URL (its /_searxng/mode slows searches down)
// and reads the TAP summary (# pass / # fail). The tests run in order: the crawl comes first, so
// the scripted answer is its.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { setTimeout as sleep } from "node:timers/promises";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const key = process.env.CRAWLD_KEY || undefined;
const site = process.env.SITE_URL;
const searxng = process.env.SEARXNG_URL;
const server = new URL("./node_modules/firecrawl-mcp/dist/index.js", import.meta.url).pathname;
const env = { PATH: process.env.PATH, HOME: process.env.HOME, FIRECRAWL_API_URL: process.env.CRAWLD_URL };
if (key) env.FIRECRAWL_API_KEY = key;
const transport = new StdioClientTransport({ command: process.execPath, args: [server], env, stderr: "pipe" });
const client = new Client({ name: "crawld-tests", version: "1.0.0" });
await client.connect(transport);
after(() => client.close());
const { tools } = await client.listTools(); // the Client validates only the tools it has listed

const SCHEMA = { type: "object", properties: { name: { type: "string" } }, required: ["name"] };

/** A tool's structured answer. firecrawl-mcp (fastmcp) parses it with the tool's zod output
 * schema before sending it: a wrong type fails the call, an unknown key is dropped without a
 * word (the text content keeps crawld's whole answer). So a key crawld sends that the schema
 * lacks shows here as a difference between the two, and fails. */
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

/** Starts an agent through firecrawl_agent and polls firecrawl_agent_status to its end;
 * every answer on the way passed the MCP SDK's output-schema check. */
async function agent(args) {
  const started = await call("firecrawl_agent", args);
  assert.equal(started.success, true);
  assert.match(started.id, /^[0-9a-f-]{36}$/);
  const seen = [];
  for (let i = 0; i < 400; i++) {
    const status = await call("firecrawl_agent_status", { id: started.id });
    seen.push(status.status);
    if (status.status !== "processing") return { started, status, seen };
    await sleep(50);
  }
  assert.fail(`agent ${started.id} still processing: ${seen.join(", ")}`);
}

test("the agent tools' output schemas refuse unknown keys", async () => {
  for (const name of ["firecrawl_agent", "firecrawl_agent_status"]) {
    const tool = tools.find((t) => t.name === name);
    assert.ok(tool, `${name} is not listed`);
    assert.equal(tool.outputSchema.additionalProperties, false, name);
  }
});

test("firecrawl_crawl passes its prompt through: the generated options shape the crawl", async () => {
  const crawled = await call("firecrawl_crawl", { url: `${site}/pages/0`, prompt: "three tree pages" });
  assert.equal(crawled.status, "completed");
  const urls = crawled.data.map((doc) => doc.metadata.sourceURL);
  assert.equal(urls.length, 3, urls.join(" "));
  for (const url of urls) assert.match(url, /\/pages\/\d+$/);
  assert.equal(crawled.completed, 3);
});

test("firecrawl_agent searches, reads and answers the schema with its sources", async () => {
  const { status, seen } = await agent({ prompt: "The name of the widget company", schema: SCHEMA });
  assert.equal(status.status, "completed", JSON.stringify(status));
  assert.deepEqual(status.data, { name: "Acme Widgets" });
  assert.deepEqual(status.sources, [`${site}/co/1`]);
  assert.equal(status.model, "spark-2");
  assert.ok(Number.isInteger(status.creditsUsed) && status.creditsUsed >= 4, status.creditsUsed);
  assert.ok(!Number.isNaN(Date.parse(status.expiresAt)), status.expiresAt);
  assert.equal(status.message, undefined);
  assert.ok(seen.length >= 1);
});

test("firecrawl_agent held to its URLs, with effort, answers freely", async () => {
  const { status } = await agent({ prompt: "Company name", urls: [`${site}/co/1`],
                                   strictConstrainToURLs: true, effort: "low" });
  assert.equal(status.status, "completed", JSON.stringify(status));
  assert.equal(typeof status.data.answer, "string");
  assert.deepEqual(status.sources, [`${site}/co/1`]);
});

test("a budget that ends reading early says so in message", async () => {
  const { status } = await agent({ prompt: "Company name", schema: SCHEMA, maxCredits: 3,
                                   urls: [`${site}/co/1`, `${site}/co/2`], strictConstrainToURLs: true });
  assert.equal(status.status, "completed", JSON.stringify(status));
  assert.deepEqual(status.data, { name: "Acme Widgets" });
  assert.match(status.message, /^Stopped reading after 1 page: maxCredits \(3\)/);
  assert.ok(status.creditsUsed <= 3);
});

test("a budget too small for one page fails the run, the error said", async () => {
  const { status } = await agent({ prompt: "Company name", schema: SCHEMA, maxCredits: 1,
                                   urls: [`${site}/co/1`], strictConstrainToURLs: true });
  assert.equal(status.status, "failed", JSON.stringify(status));
  assert.match(status.error, /^Max credits exceeded: maxCredits \(1\)/);
  assert.equal(status.data, undefined);
});

test("what crawld does not do is refused, never dropped", async () => {
  // The MCP shows only the 400's `error` ("Bad Request"), not the `details` naming the field.
  const thread = await refusal("firecrawl_agent", { prompt: "Company name",
                                                    threadId: "0190d0a4-5d2e-7b3a-9c1d-2e3f4a5b6c7d" });
  assert.match(thread ?? "", /Bad Request/, thread);
  const chat = await refusal("firecrawl_agent", { prompt: "Company name", mode: "chat" });
  assert.match(chat ?? "", /Bad Request/, chat);
});

test("firecrawl_agent_status of an unknown id is an error, not a silent empty answer", async () => {
  const missing = await refusal("firecrawl_agent_status", { id: "0190d0a4-5d2e-7b3a-9c1d-2e3f4a5b6c7d" });
  assert.match(missing ?? "", /not found|404/i, missing);
});

test("a run cancelled over HTTP (the MCP has no cancel tool) reads as cancelled", async () => {
  const mode = (body) => fetch(`${searxng}/_searxng/mode`, { method: "POST", body: JSON.stringify(body) });
  await mode({ mode: "slow", slow_s: 2 }); // the run sits in its web search
  try {
    const started = await call("firecrawl_agent", { prompt: "Who makes widgets", schema: SCHEMA });
    const headers = key ? { Authorization: `Bearer ${key}` } : {};
    const cancelled = await fetch(`${process.env.CRAWLD_URL}/v2/agent/${started.id}`,
                                  { method: "DELETE", headers });
    assert.equal(cancelled.status, 200, await cancelled.text());
    let status;
    for (let i = 0; i < 100; i++) {
      status = await call("firecrawl_agent_status", { id: started.id });
      if (status.status !== "processing") break;
      await sleep(20);
    }
    assert.equal(status.status, "cancelled", JSON.stringify(status));
    assert.match(status.error, /^cancelled by a user/);
    assert.equal(status.data, undefined);
  } finally {
    await mode({ mode: "ok" });
  }
});
