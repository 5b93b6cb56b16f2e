// /v2/extract through the official JS SDK (@mendable/firecrawl-js): `extract` (start, then poll),
// `startExtract` + `getExtractStatus` with a `/*` URL, showSources and a webhook, a zod schema
// (the SDK turns it into JSON Schema), and a 400 the SDK raises. tests/crawlapi/test_extract.py
// starts crawld (with the OpenAI-compatible simulator as its model) and the site, then runs
// `node --test` on this file with CRAWLD_URL, SITE_URL and HOOK_URL, and reads the TAP summary.
import { test } from "node:test";
import assert from "node:assert/strict";

const { default: Firecrawl } = await import("@mendable/firecrawl-js");
const { z } = await import("zod");

const site = process.env.SITE_URL;
const fc = new Firecrawl({ apiUrl: process.env.CRAWLD_URL, apiKey: null });
const url = (path) => `${site}${path}`;

const schema = {
  type: "object",
  properties: { name: { type: "string" }, products: { type: "array", items: { type: "string" } } },
  required: ["name", "products"],
};

test("extract waits for the merged object", async () => {
  const result = await fc.extract({ urls: [url("/solo")], schema, prompt: "The company",
                                    pollInterval: 1, timeout: 60 });
  assert.equal(result.status, "completed");
  assert.deepEqual(result.data, { name: "Solo Corp", products: ["Thing"] });
  assert.ok(result.expiresAt);
});

test("startExtract + getExtractStatus: a /* URL, sources, a webhook", async () => {
  const started = await fc.startExtract({ urls: [url("/shop/*")], schema, showSources: true,
                                          webhook: process.env.HOOK_URL });
  assert.equal(started.success, true);
  let status;
  for (;;) {
    status = await fc.getExtractStatus(started.id);
    if (status.status !== "processing") break;
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.equal(status.status, "completed");
  assert.deepEqual(status.data, { name: "Acme", products: ["Widget", "Gadget", "Gizmo", "Doohickey"] });
  assert.deepEqual(status.sources.name, [url("/shop/"), url("/shop/a")]);
  assert.deepEqual(status.sources["products[3]"], [url("/shop/b")]);
});

test("a zod schema is sent as JSON Schema", async () => {
  const zodSchema = z.object({ name: z.string(), products: z.array(z.string()) });
  const result = await fc.extract({ urls: [url("/solo")], schema: zodSchema, pollInterval: 1 });
  assert.equal(result.status, "completed");
  assert.deepEqual(result.data, { name: "Solo Corp", products: ["Thing"] });
});

test("enableWebSearch is a 400 the SDK raises", async () => {
  await assert.rejects(
    fc.startExtract({ urls: [url("/solo")], prompt: "x", enableWebSearch: true }),
    (err) => /enableWebSearch|web search/i.test(String(err?.message ?? err)) || err?.status === 400,
  );
});
