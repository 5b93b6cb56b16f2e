-- The crawl API's document cache (daemon/crawl/cache.py): the newest successful document of one
-- (URL, document-changing options) key, with the links and final URL a crawl follows from it.
-- `url` (without #fragment) serves the admin deletion by prefix; `bytes` the size bound.
CREATE TABLE crawl_cache (
    key         TEXT PRIMARY KEY,
    url         TEXT NOT NULL,
    created_ms  BIGINT NOT NULL,
    bytes       BIGINT NOT NULL,
    value       TEXT NOT NULL
);
CREATE INDEX crawl_cache_created ON crawl_cache(created_ms);
CREATE INDEX crawl_cache_url ON crawl_cache(url);
-- changeTracking (daemon/crawl/tracking.py): the markdown of the last scrape of one (URL, tag)
-- (tag '' is a request without one), kept until it is replaced: Firecrawl's snapshots never
-- expire.
CREATE TABLE crawl_snapshots (
    url         TEXT NOT NULL,
    tag         TEXT NOT NULL,
    scraped_ms  BIGINT NOT NULL,
    markdown    TEXT NOT NULL,
    PRIMARY KEY (url, tag)
);
