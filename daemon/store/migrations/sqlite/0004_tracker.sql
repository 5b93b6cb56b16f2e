-- Tracker (seed 002): the Bilibili video lifecycle. Instants are epoch milliseconds (UTC).
-- Per-proxy GCRA state, so rate limits survive a restart: one row per (proxy, limit key).
CREATE TABLE tracker_limiter (
    proxy TEXT NOT NULL,
    limit_key TEXT NOT NULL,
    tat_ms INTEGER NOT NULL,
    PRIMARY KEY (proxy, limit_key)
) WITHOUT ROWID;

-- Every video seen in the zone (songs or not). `status` is 0 or the last Bilibili code that
-- said the video is gone (-404, 62002, 62012): such a video is never snapshotted singly again.
-- Metadata columns are NULL for a video whose ingest got an error code.
CREATE TABLE tracker_videos (
    aid INTEGER PRIMARY KEY,
    bvid TEXT,
    title TEXT,
    description TEXT,
    tags TEXT,             -- JSON array of tag names
    duration INTEGER,      -- seconds
    published_ms INTEGER,
    cover_url TEXT,
    uid INTEGER,
    status INTEGER NOT NULL DEFAULT 0,
    added_ms INTEGER NOT NULL
);
CREATE INDEX tracker_videos_unlabelled ON tracker_videos(aid) WHERE status = 0 AND title IS NOT NULL;
CREATE INDEX tracker_videos_gone ON tracker_videos(aid) WHERE status <> 0;

CREATE TABLE tracker_users (
    uid INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    sign TEXT NOT NULL,
    fans INTEGER NOT NULL,
    face TEXT NOT NULL,
    updated_ms INTEGER NOT NULL
);

-- Aids waiting for their metadata (discovered or added through the API). A row leaves in the
-- transaction that stores the video, so a crash in between repeats the fetch, never loses the aid.
CREATE TABLE tracker_ingest (
    aid INTEGER PRIMARY KEY,
    added_ms INTEGER NOT NULL,
    next_ms INTEGER NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    source TEXT NOT NULL,   -- discovery | api
    last_error TEXT
);
CREATE INDEX tracker_ingest_due ON tracker_ingest(next_ms);

CREATE TABLE tracker_snapshots (
    aid INTEGER NOT NULL,
    at_ms INTEGER NOT NULL,
    views INTEGER NOT NULL,
    danmakus INTEGER NOT NULL,
    replies INTEGER NOT NULL,
    likes INTEGER NOT NULL,
    coins INTEGER NOT NULL,
    shares INTEGER NOT NULL,
    favorites INTEGER NOT NULL,
    PRIMARY KEY (aid, at_ms)
) WITHOUT ROWID;

-- One row per video: its newest snapshot, kept by the trigger below in the inserting transaction.
CREATE TABLE tracker_latest (
    aid INTEGER PRIMARY KEY,
    at_ms INTEGER NOT NULL,
    views INTEGER NOT NULL,
    danmakus INTEGER NOT NULL,
    replies INTEGER NOT NULL,
    likes INTEGER NOT NULL,
    coins INTEGER NOT NULL,
    shares INTEGER NOT NULL,
    favorites INTEGER NOT NULL
);
CREATE INDEX tracker_latest_views ON tracker_latest(views);

CREATE TRIGGER tracker_snapshots_latest AFTER INSERT ON tracker_snapshots
BEGIN
    INSERT INTO tracker_latest(aid, at_ms, views, danmakus, replies, likes, coins, shares, favorites)
    VALUES (new.aid, new.at_ms, new.views, new.danmakus, new.replies, new.likes, new.coins,
            new.shares, new.favorites)
    ON CONFLICT(aid) DO UPDATE SET at_ms = excluded.at_ms, views = excluded.views,
        danmakus = excluded.danmakus, replies = excluded.replies, likes = excluded.likes,
        coins = excluded.coins, shares = excluded.shares, favorites = excluded.favorites
    WHERE excluded.at_ms >= tracker_latest.at_ms;
END;

CREATE TABLE tracker_labels (
    aid INTEGER NOT NULL,
    model_version TEXT NOT NULL,
    label INTEGER NOT NULL,
    probabilities TEXT NOT NULL,  -- JSON array
    created_ms INTEGER NOT NULL,
    PRIMARY KEY (aid, model_version)
) WITHOUT ROWID;

CREATE TABLE tracker_songs (
    aid INTEGER PRIMARY KEY,
    label INTEGER NOT NULL,
    added_ms INTEGER NOT NULL
);

CREATE TABLE tracker_eta (
    aid INTEGER PRIMARY KEY,
    eta_hours REAL NOT NULL,     -- to the strict milestone (10M for [1M, 10M))
    speed REAL NOT NULL,         -- views per hour
    views INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL
);
CREATE INDEX tracker_eta_hours ON tracker_eta(eta_hours);

-- The schedule is both the state and the queue. `planned_ms` is when the snapshot should run.
CREATE TABLE tracker_schedules (
    id INTEGER PRIMARY KEY,
    aid INTEGER NOT NULL,
    type TEXT NOT NULL CHECK (type IN ('new', 'milestone', 'normal', 'archive')),
    status TEXT NOT NULL DEFAULT 'pending' CHECK (status IN
        ('pending', 'processing', 'completed', 'failed', 'no_proxy', 'bili_error')),
    planned_ms INTEGER NOT NULL,
    created_ms INTEGER NOT NULL,
    started_ms INTEGER,
    finished_ms INTEGER,
    error TEXT
);
-- The ticks' due query: one range scan per type over pending rows only, covering (aid, type,
-- planned_ms, rowid) so it never touches the table, however many finished rows pile up.
CREATE INDEX tracker_schedules_due ON tracker_schedules(type, planned_ms, aid)
    WHERE status = 'pending';
-- "Does this aid have an active schedule of this type?" (and every other per-aid lookup, all of
-- which ask for active rows). No index covers all rows by aid: each would be one more b-tree
-- insert per snapshot on the bulk path, for finished rows nothing reads by aid.
CREATE INDEX tracker_schedules_active ON tracker_schedules(aid, type)
    WHERE status IN ('pending', 'processing');
CREATE INDEX tracker_schedules_processing ON tracker_schedules(aid, planned_ms)
    WHERE status = 'processing';

-- Pending schedules per epoch-aligned window (window length in tracker_settings), and rows per
-- type × status. Triggers keep both in the schedule row's own transaction, so they cannot drift.
CREATE TABLE tracker_settings (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    window_ms INTEGER NOT NULL
);
INSERT INTO tracker_settings(id, window_ms) VALUES (1, 300000);

CREATE TABLE tracker_windows (
    win INTEGER PRIMARY KEY,
    pending INTEGER NOT NULL
);

CREATE TABLE tracker_schedule_counts (
    type TEXT NOT NULL,
    status TEXT NOT NULL,
    n INTEGER NOT NULL,
    PRIMARY KEY (type, status)
) WITHOUT ROWID;

CREATE TRIGGER tracker_schedules_ins AFTER INSERT ON tracker_schedules
BEGIN
    INSERT INTO tracker_schedule_counts(type, status, n) VALUES (new.type, new.status, 1)
    ON CONFLICT DO UPDATE SET n = n + 1;
    INSERT INTO tracker_windows(win, pending)
    SELECT new.planned_ms / window_ms, 1 FROM tracker_settings WHERE new.status = 'pending'
    ON CONFLICT DO UPDATE SET pending = pending + 1;
END;

CREATE TRIGGER tracker_schedules_del AFTER DELETE ON tracker_schedules
BEGIN
    UPDATE tracker_schedule_counts SET n = n - 1 WHERE type = old.type AND status = old.status;
    UPDATE tracker_windows SET pending = pending - 1
    WHERE old.status = 'pending'
      AND win = old.planned_ms / (SELECT window_ms FROM tracker_settings);
END;

CREATE TRIGGER tracker_schedules_upd AFTER UPDATE OF status, planned_ms, type ON tracker_schedules
BEGIN
    UPDATE tracker_schedule_counts SET n = n - 1 WHERE type = old.type AND status = old.status;
    INSERT INTO tracker_schedule_counts(type, status, n) VALUES (new.type, new.status, 1)
    ON CONFLICT DO UPDATE SET n = n + 1;
    UPDATE tracker_windows SET pending = pending - 1
    WHERE old.status = 'pending'
      AND win = old.planned_ms / (SELECT window_ms FROM tracker_settings);
    INSERT INTO tracker_windows(win, pending)
    SELECT new.planned_ms / window_ms, 1 FROM tracker_settings WHERE new.status = 'pending'
    ON CONFLICT DO UPDATE SET pending = pending + 1;
END;
