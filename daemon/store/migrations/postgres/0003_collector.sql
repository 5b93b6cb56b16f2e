-- The collector's memory per task (daemon/collector/crawler.py): the paging progress of the
-- current or last run, written in the same transaction as the window's outbox items.
CREATE TABLE collector_tasks (
    task            TEXT PRIMARY KEY,   -- our task id ([[collector.tasks]].id)
    progress        BYTEA,               -- paging.encode_progress; NULL before the first run
    run_id          TEXT,
    job_id          TEXT,
    run_started_ms  BIGINT,
    last_result     BYTEA,               -- JSON summary of the last finished run
    updated_ms      BIGINT NOT NULL
);
