// firecrawl-js with the json and summary formats against crawld and the OpenAI-compatible
// simulator: tests/crawlapi/test_sdk_js_llm.py starts both and runs `node --test` on this file with
//   CRAWLD_URL  crawld's base URL       SITE_URL  the generated site (site.test)
// and reads the TAP summary (# pass / # fail). The simulator answers from the page text it is
// sent: a string property takes the page's first line ("Page N"), `summary` is "Summary of ...".
import { test } from "node:test";
import assert from "node:assert/strict";

const { default: Firecrawl } = await import("@mendable/firecrawl-js");

const fc = new Firecrawl({ apiUrl: process.env.CRAWLD_URL, apiKey: null });
const url = (path) => `${process.env.SITE_URL}${path}`;
const schema = { type: "object", properties: { title: { type: "string" } }, required: ["title"] };

test("scrape with json and summary", async () => {
  const doc = await fc.scrape(url("/pages/3"), {
    formats: [{ type: "json", schema, prompt: "the page title" }, "summary"],
  });
  assert.deepEqual(doc.json, { title: "Page 3" });
  assert.match(doc.summary, /^Summary of Page 3:/);
  assert.equal(doc.markdown, undefined);
});

test("crawl with json and summary on every page", async () => {
  const job = await fc.crawl(url("/pages/0"), {
    limit: 5, crawlEntireDomain: true, includePaths: ["^/pages/\\d+$"],
    scrapeOptions: { formats: ["markdown", { type: "json", schema }, "summary"] }, pollInterval: 1,
  });
  assert.equal(job.status, "completed");
  assert.equal(job.data.length, 5);
  for (const doc of job.data) {
    const title = doc.markdown.split("\n")[0].replace(/^# /, "");
    assert.equal(doc.json.title, title);
    assert.ok(doc.summary.startsWith(`Summary of ${title}:`));
  }
});

test("batch scrape with summary and json", async () => {
  const job = await fc.batchScrape([url("/pages/4"), url("/pages/5")], {
    options: { formats: ["summary", { type: "json", schema }] }, pollInterval: 1,
  });
  assert.equal(job.status, "completed");
  const summaries = job.data.map((d) => d.summary.split(":")[0]).sort();
  assert.deepEqual(summaries, ["Summary of Page 4", "Summary of Page 5"]);
  assert.deepEqual(job.data.map((d) => d.json.title).sort(), ["Page 4", "Page 5"]);
});

test("a schema-less dictionary is the SDK's error", async () => {
  await assert.rejects(
    fc.scrape(url("/pages/1"), {
      formats: [{ type: "json", schema: { type: "object", additionalProperties: true } }],
    }),
    (err) => err.status === 400 && /schema-less dictionary/.test(JSON.stringify(err.details)),
  );
});

test("token usage answers in Firecrawl's shape", async () => {
  const usage = await fc.getTokenUsage();
  assert.equal(usage.remainingTokens, 99999999);
});
