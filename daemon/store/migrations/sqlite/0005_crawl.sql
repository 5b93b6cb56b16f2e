-- Crawl API (Firecrawl v2 scrape/crawl/batch/map). A crawl or batch job is a row of `jobs`
-- (kind crawl | batch_scrape); its documents are that job's `job_rows`, in completion order, so
-- `skip` stays valid while it runs and across restarts. What a job still has to fetch is its
-- frontier here: one row per admitted URL, unique per dedupe key, so a restarted crawl fetches
-- each URL at most once (apart from those in flight when it stopped).
CREATE TABLE crawl_jobs (
    job_id      TEXT PRIMARY KEY REFERENCES jobs(id) ON DELETE CASCADE,
    kind        TEXT NOT NULL CHECK (kind IN ('crawl', 'batch_scrape')),
    url         TEXT NOT NULL,              -- the start URL (the first URL of a batch)
    plan        BLOB NOT NULL,              -- the validated request, defaults applied (JSON)
    kicked_off  INTEGER NOT NULL DEFAULT 0, -- start URL and sitemap URLs admitted
    admitted    INTEGER NOT NULL DEFAULT 0  -- frontier rows holding a slot of `limit`: queued
                                            -- or done (a failed page gives its slot back)
) WITHOUT ROWID;

CREATE TABLE crawl_frontier (
    job_id  TEXT NOT NULL REFERENCES crawl_jobs(job_id) ON DELETE CASCADE,
    n       INTEGER NOT NULL,               -- discovery order, 1, 2, …
    key     TEXT NOT NULL,                  -- dedupe key (a batch: the position, no dedupe)
    url     TEXT NOT NULL,
    depth   INTEGER NOT NULL,
    state   TEXT NOT NULL CHECK (state IN ('queued', 'done', 'failed', 'skipped')),
    PRIMARY KEY (job_id, n)
) WITHOUT ROWID;

CREATE UNIQUE INDEX crawl_frontier_key ON crawl_frontier(job_id, key);
CREATE INDEX crawl_frontier_queued ON crawl_frontier(job_id, n) WHERE state = 'queued';

-- URLs a crawl found but robots.txt refused (GET /v2/crawl/{id}/errors `robotsBlocked`).
CREATE TABLE crawl_robots_blocked (
    job_id  TEXT NOT NULL REFERENCES crawl_jobs(job_id) ON DELETE CASCADE,
    url     TEXT NOT NULL,
    PRIMARY KEY (job_id, url)
) WITHOUT ROWID;

-- `x-idempotency-key` of a start request -> the job it created (the SDK retries POSTs).
CREATE TABLE crawl_idempotency (
    key         TEXT PRIMARY KEY,
    job_id      TEXT NOT NULL,
    created_ms  INTEGER NOT NULL
) WITHOUT ROWID;
