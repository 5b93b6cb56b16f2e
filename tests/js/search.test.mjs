// firecrawl-js `search` against crawld with the SearXNG simulator behind it:
// tests/crawlapi/test_search_js.py starts both and runs `node --test` on this file with
//   CRAWLD_URL  crawld's base URL       SITE_HOST  "site.test:<port>" of the generated site
// and reads the TAP summary (# pass / # fail).
import { test } from "node:test";
import assert from "node:assert/strict";

const { default: Firecrawl } = await import("@mendable/firecrawl-js");

const fc = new Firecrawl({ apiUrl: process.env.CRAWLD_URL, apiKey: null });

test("search returns web, news and images in Firecrawl's shapes", async () => {
  const data = await fc.search("nurseries", { sources: ["web", "news", "images"], limit: 3 });
  assert.equal(data.web.length, 3);
  assert.equal(data.web[0].title, "nurseries — general result 0");
  assert.equal(data.web[0].position, 1);
  assert.equal(data.news.length, 3);
  assert.ok(data.news[0].snippet.startsWith("About nurseries"));
  assert.equal(data.images[1].imageUrl, "https://example.org/img/1.png");
});

test("search scrapes results when asked", async () => {
  const data = await fc.search("nurseries", {
    limit: 2, includeDomains: ["site.test"], scrapeOptions: { formats: ["markdown"] },
  });
  assert.equal(data.web.length, 2);
  for (const doc of data.web) {
    assert.match(doc.markdown, /^# Page \d+/);
    assert.ok(new URL(doc.metadata.sourceURL).host.endsWith(process.env.SITE_HOST));
  }
});

test("a bad search is the SDK's error", async () => {
  await assert.rejects(fc.search("q", { limit: 500 }));
});
