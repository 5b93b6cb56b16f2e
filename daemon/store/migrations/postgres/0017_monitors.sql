-- Monitors (/v2/monitor, daemon/crawl/monitors/). A monitor is its validated definition (JSON,
-- schedule normalised to cron) and its schedule state: `due_ms` the next cron time (the check's
-- scheduledFor), `next_run_ms` that plus the monitor's jitter (when the scheduler claims it, by
-- a compare-and-set on next_run_ms: one instance of a cluster creates the check).
CREATE TABLE monitors (
    id              TEXT PRIMARY KEY,
    name            TEXT NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('active', 'paused')),
    spec            BYTEA NOT NULL,
    due_ms          BIGINT,
    next_run_ms     BIGINT,
    last_run_ms     BIGINT,
    current_check   TEXT,
    last_summary    BYTEA,
    created_ms      BIGINT NOT NULL,
    updated_ms      BIGINT NOT NULL
);
CREATE INDEX monitors_next_run ON monitors(next_run_ms) WHERE status = 'active';

-- One check of a monitor: its definition as it was when the check was created (`spec`), its
-- status and, once finished, its summary. A running check is also a row of `jobs` (kind monitor,
-- same id) that carries its webhook events; this row outlives that one (retentionDays).
CREATE TABLE monitor_checks (
    id              TEXT PRIMARY KEY,
    monitor_id      TEXT NOT NULL,
    status          TEXT NOT NULL,
    trigger_kind    TEXT NOT NULL,
    spec            BYTEA NOT NULL,
    kicked_off      BIGINT NOT NULL DEFAULT 0,
    scheduled_ms    BIGINT,
    started_ms      BIGINT,
    finished_ms     BIGINT,
    summary         BYTEA,
    target_results  BYTEA,
    error           TEXT,
    created_ms      BIGINT NOT NULL,
    updated_ms      BIGINT NOT NULL
);
CREATE INDEX monitor_checks_by_monitor ON monitor_checks(monitor_id, created_ms);
CREATE INDEX monitor_checks_open ON monitor_checks(created_ms) WHERE status IN ('queued', 'running');

-- The pages of a check: a scrape target's URLs are queued at the check's start; a crawl
-- target's pages, a search target's unseen results and every removed page are inserted done. (check, target, key) is unique, so a
-- page redone after a crash is never counted (or announced) twice.
CREATE TABLE monitor_pages (
    check_id        TEXT NOT NULL,
    n               BIGINT NOT NULL,
    target_id       TEXT NOT NULL,
    key             TEXT NOT NULL,
    url             TEXT NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('queued', 'done')),
    status          TEXT,
    status_code     BIGINT,
    previous_scrape TEXT,
    current_scrape  TEXT,
    error           TEXT,
    diff            BYTEA,
    metadata        BYTEA,
    judgment        BYTEA,                  -- the model's judgment of a changed page (goal)
    snapshot        BYTEA,                  -- the page's current JSON extraction (json format)
    created_ms      BIGINT NOT NULL,
    PRIMARY KEY (check_id, n)
);
CREATE UNIQUE INDEX monitor_pages_key ON monitor_pages(check_id, target_id, key);

-- The previous snapshot of each page of a monitor's target: the markdown a check compares with.
CREATE TABLE monitor_snapshots (
    monitor_id      TEXT NOT NULL,
    target_id       TEXT NOT NULL,
    key             TEXT NOT NULL,
    url             TEXT NOT NULL,
    scrape_id       TEXT NOT NULL,
    markdown        TEXT NOT NULL,
    gone            BIGINT NOT NULL DEFAULT 0,
    seen_ms         BIGINT NOT NULL,
    PRIMARY KEY (monitor_id, target_id, key)
);
