-- A collector row is stored once. Its queue item (outbox_items) names the job row that holds the
-- body (`row_job`, `row_n` → job_rows) and keeps an empty `body` of its own; items without a
-- job row (webhook events, runs without a job) keep their body as before. A finished job whose
-- rows are still referenced by queue items is kept past its expiry until they are acknowledged
-- (daemon/jobs/store.py `expired`), so no item outlives the body it points to.
ALTER TABLE outbox_items ADD COLUMN row_job TEXT;
ALTER TABLE outbox_items ADD COLUMN row_n INTEGER;
CREATE INDEX outbox_items_by_job_row ON outbox_items(row_job) WHERE row_job IS NOT NULL;
