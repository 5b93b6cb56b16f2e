-- Webhook retries that outlive a process (daemon/jobs/drainer.py): how many attempts the event at
-- a job's ack cursor (the one being delivered) has had and when the next one may go out. Written
-- after each failed attempt that will be retried, deleted in the transaction that gives the event
-- its final outcome (and moves the cursor), so whoever drains the job next (after a restart, or
-- on another instance) continues the schedule instead of starting it again at attempt 1.
CREATE TABLE webhook_attempts (
    job_id       TEXT PRIMARY KEY REFERENCES jobs(id) ON DELETE CASCADE,
    seq          INTEGER NOT NULL,   -- the event's seq; a row for another seq is stale
    attempts     INTEGER NOT NULL,   -- attempts made so far (each one failed)
    next_ms      INTEGER NOT NULL,   -- epoch ms before which the event is not sent again
    last_status  INTEGER,            -- HTTP status of the last attempt; NULL: no answer
    last_error   TEXT NOT NULL,      -- why the last attempt failed ("HTTP 503", "timed out")
    at_ms        INTEGER NOT NULL    -- when the last attempt ended
) WITHOUT ROWID;
