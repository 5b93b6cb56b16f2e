// The official JS SDK (@mendable/firecrawl-js, pinned in package-lock.json) against a running
// crawld, as a second real client next to firecrawl-py. tests/crawlapi/test_sdk_js.py starts crawld
// and the generated test site, then runs `node --test` on this file with:
//   CRAWLD_URL  crawld's base URL          CRAWLD_KEY  the API key, or unset for none
//   SITE_URL    the test site (site.test)  EXPECT_WEBSOCKET  "1" when the watcher must use one
// and reads the TAP summary (# pass / # fail). Calls use the SDK's own defaults wherever possible.
import { test } from "node:test";
import assert from "node:assert/strict";

// Count WebSocket opens, so a watcher that silently fell back to polling is caught.
let opened = 0;
const NativeWebSocket = globalThis.WebSocket;
if (typeof NativeWebSocket === "function") {
  globalThis.WebSocket = class extends NativeWebSocket {
    constructor(...args) {
      super(...args);
      this.addEventListener("open", () => { opened += 1; });
    }
  };
}

const { default: Firecrawl } = await import("@mendable/firecrawl-js");

const site = process.env.SITE_URL;
const key = process.env.CRAWLD_KEY || undefined;
const expectWebSocket = process.env.EXPECT_WEBSOCKET === "1";
const fc = new Firecrawl({ apiUrl: process.env.CRAWLD_URL, apiKey: key ?? null });
const url = (path) => `${site}${path}`;
const paths = (docs) => docs.map((d) => new URL(d.metadata.sourceURL).pathname).sort();

async function settled(id) {
  for (;;) {
    const status = await fc.getCrawlStatus(id);
    if (status.status !== "scraping") return status;
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function watch(id, kind) {
  const watcher = fc.watcher(id, { kind, pollInterval: 1, timeout: 60 });
  const documents = [];
  let done;
  let error;
  watcher.on("document", (doc) => documents.push(doc));
  watcher.on("done", (state) => { done = state; });
  watcher.on("error", (err) => { error = err; });
  await watcher.start();
  watcher.close();
  return { documents, done, error };
}

test("scrape a page with formats", async () => {
  const doc = await fc.scrape(url("/rich"), { formats: ["markdown", "links"] });
  assert.match(doc.markdown, /Rich/);
  assert.ok(doc.links.includes(url("/pages/3")));
  assert.equal(doc.metadata.statusCode, 200);
});

test("crawl waits and follows the absolute next links", async () => {
  const job = await fc.crawl(url("/pages/0"), {
    limit: 120, sitemap: "skip", crawlEntireDomain: true, includePaths: ["^/pages/"],
    pollInterval: 1, timeout: 120,
  });
  assert.equal(job.status, "completed");
  assert.equal(job.completed, 120);
  assert.equal(job.data.length, 120); // 100 in the first page, 20 through `next`
  assert.equal(new Set(job.data.map((d) => d.metadata.sourceURL)).size, 120);
});

test("startCrawl, status, errors, active, cancel", async () => {
  const blocked = await fc.startCrawl(url("/"), {
    sitemap: "skip", maxDiscoveryDepth: 1, includePaths: ["^/private/", "^/about$"],
  });
  assert.ok(blocked.id && blocked.url.endsWith(`/v2/crawl/${blocked.id}`));
  assert.equal((await settled(blocked.id)).status, "completed");
  const errors = await fc.getCrawlErrors(blocked.id);
  assert.ok(errors.robotsBlocked.includes(url("/private/secret")));

  const slow = await fc.startCrawl(url("/slow"), { sitemap: "skip" });
  const active = await fc.getActiveCrawls();
  assert.ok(active.crawls.some((c) => c.id === slow.id && c.teamId === "crawld"));
  assert.equal(await fc.cancelCrawl(slow.id), true);
  assert.equal((await settled(slow.id)).status, "cancelled"); // it stops at once
  await assert.rejects(fc.cancelCrawl(slow.id)); // 409: already cancelled
});

test("batchScrape with an idempotency key", async () => {
  const urls = [url("/about"), url("/pages/1"), "not a url"];
  const idempotencyKey = `js-${Date.now()}-${Math.random()}`;
  const job = await fc.batchScrape(urls, { idempotencyKey, pollInterval: 1, timeout: 60 });
  assert.equal(job.status, "completed");
  assert.deepEqual(paths(job.data), ["/about", "/pages/1"]);
  const again = await fc.startBatchScrape(urls, { idempotencyKey });
  assert.equal(again.id, job.id); // a retried POST gets the first job
  assert.deepEqual(again.invalidURLs, ["not a url"]);
});

test("map", async () => {
  const map = await fc.map(url("/"), { sitemap: "skip", limit: 50 });
  const links = map.links.map((l) => (typeof l === "string" ? l : l.url));
  assert.ok(links.includes(url("/about")));
});

test("watcher for a crawl and for a batch", async () => {
  const started = await fc.startCrawl(url("/chain/0"), {
    sitemap: "skip", crawlEntireDomain: true, includePaths: ["^/chain/"],
  });
  const crawl = await watch(started.id, "crawl");
  assert.equal(crawl.error, undefined, JSON.stringify(crawl.error));
  assert.equal(crawl.done.status, "completed");
  assert.deepEqual(paths(crawl.documents), [0, 1, 2, 3, 4, 5].map((d) => `/chain/${d}`).sort());
  const batch = await fc.startBatchScrape([url("/about"), url("/rich")]);
  const watched = await watch(batch.id, "batch");
  assert.equal(watched.error, undefined, JSON.stringify(watched.error));
  assert.equal(watched.done.status, "completed");
  assert.deepEqual(paths(watched.documents), ["/about", "/rich"]);
  if (expectWebSocket) assert.ok(opened >= 2, `the watcher opened ${opened} WebSockets`);
  else assert.equal(opened, 0, "no WebSocket expected here");
});

test("usage, queue and concurrency", async () => {
  assert.equal((await fc.getCreditUsage()).remainingCredits, 99999999);
  assert.equal((await fc.getTokenUsage()).remainingTokens, 99999999);
  const queue = await fc.getQueueStatus();
  assert.equal(queue.success, true);
  for (const field of ["jobsInQueue", "activeJobsInQueue", "waitingJobsInQueue"]) {
    assert.equal(typeof queue[field], "number");
  }
  assert.equal(queue.maxConcurrency, 8);
  const concurrency = await fc.getConcurrency();
  assert.equal(concurrency.maxConcurrency, 8);
  assert.equal(typeof concurrency.concurrency, "number");
});
