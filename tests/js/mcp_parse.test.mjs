// Firecrawl's MCP server (firecrawl-mcp, pinned in package-lock.json) parsing local files through
// crawld: in local mode `firecrawl_parse` reads `filePath` and posts it as multipart to
// FIRECRAWL_API_URL/v2/parse with the tool's options (`pdfOptions` among them) as `options` JSON.
// tests/crawlapi/test_mcp_parse_js.py starts crawld, writes the files and runs `node --test` with
//   CRAWLD_URL  crawld's base URL     FILES  the directory holding four.pdf and memo.docx
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const server = new URL("./node_modules/firecrawl-mcp/dist/index.js", import.meta.url).pathname;
const env = { PATH: process.env.PATH, HOME: process.env.HOME, FIRECRAWL_API_URL: process.env.CRAWLD_URL };
const transport = new StdioClientTransport({ command: process.execPath, args: [server], env, stderr: "pipe" });
const client = new Client({ name: "crawld-tests", version: "1.0.0" });
await client.connect(transport);
after(() => client.close());
await client.listTools(); // the Client validates only the tools it has listed

async function parse(args) {
  const answer = await client.callTool({ name: "firecrawl_parse", arguments: args });
  assert.ok(!answer.isError, JSON.stringify(answer.content).slice(0, 500));
  return JSON.parse(answer.content[0].text);
}

test("firecrawl_parse reads a PDF with pdfOptions.maxPages", async () => {
  // The MCP applies pdfOptions only with parsers: ["pdf"] (it drops them otherwise) and its schema
  // keeps only maxPages of them.
  const doc = await parse({ filePath: `${process.env.FILES}/four.pdf`, formats: ["markdown"],
                            parsers: ["pdf"], pdfOptions: { maxPages: 2 } });
  assert.equal(doc.success, true);
  assert.match(doc.data.markdown, /Beta page text/);
  assert.doesNotMatch(doc.data.markdown, /Gamma/);
  assert.equal(doc.data.metadata.numPages, 2);
  assert.equal(doc.data.metadata.totalPages, 4);
});

test("firecrawl_parse reads a Word file", async () => {
  const doc = await parse({ filePath: `${process.env.FILES}/memo.docx` });
  assert.match(doc.data.markdown, /\| north \| 12 \|/);
});

test("a file crawld cannot read is the tool's error, not an empty document", async () => {
  const answer = await client.callTool({ name: "firecrawl_parse",
                                         arguments: { filePath: `${process.env.FILES}/enc.pdf` } });
  assert.ok(answer.isError);
  assert.match(JSON.stringify(answer.content), /encrypted/);
});
