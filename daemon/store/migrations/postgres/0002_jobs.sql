-- Jobs (daemon/jobs/): one row per unit of work, the rows it produced and its error list. Times
-- are epoch milliseconds. A job's webhook events live in the outbox stream `webhook:{id}`;
-- `last_seq` is the last event number issued, so numbering continues after a restart, and
-- `terminated` says its terminal event was issued (or would have been, had the filter wanted it).
CREATE TABLE jobs (
    id            TEXT PRIMARY KEY,
    kind          TEXT NOT NULL,
    status        TEXT NOT NULL
                  CHECK (status IN ('scraping', 'completed', 'failed', 'cancelled')),
    completed     BIGINT NOT NULL DEFAULT 0,
    total         BIGINT NOT NULL DEFAULT 0,
    created_ms    BIGINT NOT NULL,
    completed_ms  BIGINT,
    expires_ms    BIGINT NOT NULL,   -- created + ttl while running, completed + ttl once finished
    webhook       BYTEA,               -- JSON WebhookSpec; NULL: no webhook, no events stored
    source        BYTEA NOT NULL,      -- JSON object, e.g. {"task_id": "…"}
    last_seq      BIGINT NOT NULL DEFAULT 0,
    terminated    BIGINT NOT NULL DEFAULT 0,
    error         TEXT                -- why a failed job failed
);

CREATE INDEX jobs_finished_by_expiry ON jobs(expires_ms) WHERE status <> 'scraping';

CREATE TABLE job_rows (
    job_id  TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    n       BIGINT NOT NULL,         -- 1, 2, … in the order the job produced them
    body    BYTEA NOT NULL,            -- the row as JSON
    PRIMARY KEY (job_id, n)
);

CREATE TABLE job_errors (
    job_id  TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    n       BIGINT NOT NULL,
    id      TEXT NOT NULL,
    at_ms   BIGINT NOT NULL,
    url     TEXT,
    code    TEXT,
    error   TEXT NOT NULL,
    PRIMARY KEY (job_id, n)
);
