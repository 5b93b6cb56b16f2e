-- Webhook endpoints that answered 410 Gone (daemon/jobs/drainer.py): the job sends nothing more
-- to its webhook, even after a restart. One row per job; `error_id` is the one job_errors entry
-- that says so, rewritten as later events are skipped (`skipped` counts them).
CREATE TABLE webhook_gone (
    job_id    TEXT PRIMARY KEY REFERENCES jobs(id) ON DELETE CASCADE,
    event_id  TEXT NOT NULL,          -- the eventId ("{job}:{seq}") that got the 410
    type      TEXT NOT NULL,          -- its event type, e.g. crawl.page
    error_id  TEXT NOT NULL,          -- job_errors.id of the job's WEBHOOK_FAILED entry
    skipped   INTEGER NOT NULL DEFAULT 0,
    at_ms     INTEGER NOT NULL
) WITHOUT ROWID;
