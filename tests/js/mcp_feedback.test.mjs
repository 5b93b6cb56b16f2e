// firecrawl-mcp's feedback, developer-search and credit-usage tools against crawld, over stdio
// with the MCP SDK's client (which checks every answer against the tool's output schema once it
// has listed the tools). tests/crawlapi/test_mcp_feedback_js.py starts crawld (with an API key)
// and the SearXNG simulator and runs `node --test` on this file with CRAWLD_URL and CRAWLD_KEY.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const key = process.env.CRAWLD_KEY || undefined;
const server = new URL("./node_modules/firecrawl-mcp/dist/index.js", import.meta.url).pathname;
const env = { PATH: process.env.PATH, HOME: process.env.HOME, FIRECRAWL_API_URL: process.env.CRAWLD_URL };
if (key) env.FIRECRAWL_API_KEY = key;
const transport = new StdioClientTransport({ command: process.execPath, args: [server], env, stderr: "pipe" });
const client = new Client({ name: "crawld-tests", version: "1.0.0" });
await client.connect(transport);
after(() => client.close());
const { tools } = await client.listTools(); // the Client validates only the tools it has listed

/** A tool's structured answer. firecrawl-mcp drops the keys its output schema lacks without a
 * word (the text keeps crawld's whole answer), so where the text is the JSON answer a key crawld
 * sends that the schema lacks shows as a difference between the two, and fails. */
async function call(name, args, textIsJson = true) {
  const answer = await client.callTool({ name, arguments: args });
  assert.ok(!answer.isError, JSON.stringify(answer.content).slice(0, 800));
  assert.ok(answer.structuredContent, `${name} answered no structured content`);
  if (textIsJson) {
    assert.deepEqual(answer.structuredContent, JSON.parse(answer.content[0].text),
                     `${name}: keys dropped by the output schema`);
  }
  return answer.structuredContent;
}

test("the four tools are listed, their output schemas refusing unknown keys", () => {
  for (const name of ["firecrawl_feedback", "firecrawl_search_feedback", "firecrawl_developer_search",
                      "firecrawl_credit_usage"]) {
    const tool = tools.find((t) => t.name === name);
    assert.ok(tool, `${name} is not listed`);
    assert.equal(tool.outputSchema.additionalProperties, false, name);
  }
});

test("firecrawl_search_feedback on a search's id is recorded", async () => {
  const found = await call("firecrawl_search", { query: "nurseries", limit: 2 }, false);
  const recorded = await call("firecrawl_search_feedback", {
    searchId: found.id, rating: "good",
    valuableSources: [{ url: found.data.web[0].url, reason: "answers it" }],
  });
  assert.equal(recorded.success, true);
  assert.ok(recorded.feedbackId);
  assert.equal(recorded.alreadySubmitted, false);
});

test("firecrawl_feedback on a scrape job is recorded; a bad one is refused", async () => {
  const recorded = await call("firecrawl_feedback", {
    endpoint: "scrape", jobId: "5b0c8f64-1d1e-4a57-9a53-0d5b1c2f3e4a", rating: "partial",
    issues: ["missing_content"], note: "the table was cut",
  });
  assert.equal(recorded.success, true);
  assert.ok(recorded.feedbackId);
  // The MCP lets any URL scheme through; crawld wants http(s): a 400 the tool reports as such.
  const refused = await call("firecrawl_feedback", {
    endpoint: "scrape", jobId: "5b0c8f64-1d1e-4a57-9a53-0d5b1c2f3e4a", rating: "bad",
    url: "ftp://example.org/a",
  });
  assert.equal(refused.success, false);
  assert.equal(refused.status, 400);
  assert.equal(refused.retryable, false);
});

test("firecrawl_developer_search answers ranked results with passages", async () => {
  const found = await call("firecrawl_developer_search", { query: "nurseries", k: 3 }, false);
  assert.deepEqual(Object.keys(found), ["results"]);
  assert.equal(found.results.length, 3);
  for (const item of found.results) {
    assert.match(item.id, /^(issue|pr|readme|doc):/);
    assert.ok(item.url.startsWith("https://github.com/"));
    assert.ok(item.passages.length >= 1);
  }
});

test("firecrawl_credit_usage current and historical", async () => {
  const current = await call("firecrawl_credit_usage", {});
  assert.equal(current.remainingCredits, 99999999);
  const history = await call("firecrawl_credit_usage", { view: "historical" });
  assert.equal(history.success, true);
  assert.equal(history.periods[0].creditsUsed, 0);
  const byKey = await call("firecrawl_credit_usage", { byApiKey: true });
  assert.equal(byKey.periods.length, 1);
});
