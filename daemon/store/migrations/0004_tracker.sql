-- Tracker (seed 002): the Bilibili video lifecycle. Instants are epoch milliseconds (UTC).
-- Per-proxy GCRA state, so rate limits survive a restart: one row per (proxy, limit key).
CREATE TABLE tracker_limiter (
    proxy TEXT NOT NULL,
    limit_key TEXT NOT NULL,
    tat_ms INTEGER NOT NULL,
    PRIMARY KEY (proxy, limit_key)
) WITHOUT ROWID;
