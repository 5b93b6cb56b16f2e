// Firecrawl's MCP server (firecrawl-mcp, pinned in package-lock.json) against crawld, the way an
// agent host runs it: a separate process speaking MCP over stdio, FIRECRAWL_API_URL pointed at
// crawld, FIRECRAWL_API_KEY set when crawld has an API key. The client is the MCP SDK's own, which
// checks every tool answer against the tool's output schema, as hosts do.
// tests/crawlapi/test_mcp_search_js.py starts crawld and the SearXNG simulator and runs
// `node --test` on this file with
//   CRAWLD_URL  crawld's base URL     CRAWLD_KEY  the API key, or unset for none
// and reads the TAP summary (# pass / # fail).
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
await client.listTools(); // the Client validates only the tools it has listed

async function search(args) {
  const answer = await client.callTool({ name: "firecrawl_search", arguments: args });
  assert.ok(!answer.isError, JSON.stringify(answer.content).slice(0, 500));
  // firecrawl-mcp drops keys its zod output schema lacks; the text keeps crawld's whole answer.
  assert.deepEqual(answer.structuredContent, JSON.parse(answer.content[0].text));
  return answer.structuredContent;
}

test("firecrawl_search with the MCP's own defaults finds web results", async () => {
  // With a key, the MCP adds sources ["web", "alexandria"], domainTools and toolDetail itself.
  const found = await search({ query: "nurseries", limit: 3 });
  assert.equal(found.success, true);
  assert.equal(found.data.web.length, 3);
  assert.equal(found.data.web[0].title, "nurseries — general result 0");
  assert.ok(found.id);
  if (key) assert.match(found.warning, /Alexandria.*ignored/);
  else assert.equal(found.warning, undefined);
});

test("firecrawl_search with the sources and the category the model names", async () => {
  // The MCP tells models to add categories: ["developer"] to programming questions.
  const found = await search({ query: "nurseries", limit: 2, sources: [{ type: "web" }, { type: "news" }],
                               categories: ["developer"] });
  assert.equal(found.success, true);
  assert.equal(found.data.news.length, 2);
  assert.equal(found.data.web.length, 2);
  for (const item of found.data.web) {
    assert.equal(new URL(item.url).host, "github.com");
    assert.equal(item.category, "developer");
  }
  assert.equal(found.warning, undefined);
});

test("the Alexandria catalogue alone is refused, never a silent empty answer", { skip: !key }, async () => {
  let refused;
  try {
    const answer = await client.callTool({ name: "firecrawl_search",
                                           arguments: { query: "tools", sources: ["alexandria"] } });
    refused = answer.isError ? JSON.stringify(answer.content) : undefined;
  } catch (error) {
    refused = String(error);
  }
  assert.ok(refused, "an alexandria-only search must fail");
});
