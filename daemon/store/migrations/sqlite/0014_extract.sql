-- /v2/extract jobs (daemon/crawl/extract.py). An extract job is a row of `jobs` (kind extract);
-- here its validated request and, once merged, its result; and one row per page to extract from:
-- the request's URLs and the pages a `/*` URL's crawl admitted (unique per dedupe key, within the
-- job's limit). A page's extraction is stored with it the moment the model answered, so a
-- restarted job asks the model only about pages still queued.
CREATE TABLE extract_jobs (
    job_id      TEXT PRIMARY KEY REFERENCES jobs(id) ON DELETE CASCADE,
    plan        BLOB NOT NULL,              -- the validated request, defaults applied (JSON)
    kicked_off  INTEGER NOT NULL DEFAULT 0, -- request URLs (and sitemap URLs of `/*` ones) admitted
    result      BLOB,                       -- the merged object (JSON), once merged
    sources     BLOB,                       -- field -> [url] (JSON), once merged
    tokens      INTEGER NOT NULL DEFAULT 0, -- model tokens (prompt + completion) of this job
    warning     TEXT
) WITHOUT ROWID;

CREATE TABLE extract_pages (
    job_id  TEXT NOT NULL REFERENCES extract_jobs(job_id) ON DELETE CASCADE,
    n       INTEGER NOT NULL,               -- merge order: request URLs first, then discovery
    key     TEXT NOT NULL,                  -- dedupe key of the URL
    url     TEXT NOT NULL,
    root    INTEGER NOT NULL,               -- index of the request URL it came from
    depth   INTEGER NOT NULL,
    state   TEXT NOT NULL CHECK (state IN ('queued', 'done', 'failed')),
    value   BLOB,                           -- the page's extraction (JSON), when done
    tokens  INTEGER NOT NULL DEFAULT 0,
    error   TEXT,                           -- why it failed
    PRIMARY KEY (job_id, n)
) WITHOUT ROWID;

CREATE UNIQUE INDEX extract_pages_key ON extract_pages(job_id, key);
CREATE INDEX extract_pages_queued ON extract_pages(job_id, n) WHERE state = 'queued';
