-- Monitor notifications (daemon/crawl/monitors/notifier.py): one row per (check, channel) that a
-- finished check had something to tell, written in the transaction that finishes the check, so a
-- crash never loses one. `channel` is "email" or "target:<name>" (a [[monitors.notification_targets]]
-- name, never a URL); `message` the rendered text (JSON: subject, text, recipients). A deliverer
-- claims a row by a compare-and-set on `next_ms` (one instance of a cluster sends it), then makes
-- it `sent`, schedules its next attempt, or makes it `failed` once its retries are spent.
CREATE TABLE monitor_notifications (
    check_id        TEXT NOT NULL,
    channel         TEXT NOT NULL,
    monitor_id      TEXT NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('pending', 'sent', 'failed')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_ms         INTEGER NOT NULL,
    message         BLOB NOT NULL,
    error           TEXT,
    created_ms      INTEGER NOT NULL,
    updated_ms      INTEGER NOT NULL,
    PRIMARY KEY (check_id, channel)
) WITHOUT ROWID;
CREATE INDEX monitor_notifications_due ON monitor_notifications(next_ms) WHERE state = 'pending';
