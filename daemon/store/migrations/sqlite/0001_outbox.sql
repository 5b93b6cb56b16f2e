-- Ordered durable streams (daemon/outbox.py). One row per stream holds its ack cursor and the last
-- sequence number issued, so numbering continues after items are deleted or the daemon restarts.
CREATE TABLE outbox_streams (
    stream      TEXT PRIMARY KEY,
    last_seq    INTEGER NOT NULL DEFAULT 0,
    ack_cursor  INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;

CREATE TABLE outbox_items (
    stream      TEXT NOT NULL REFERENCES outbox_streams(stream) ON DELETE CASCADE,
    seq         INTEGER NOT NULL,
    key         TEXT NOT NULL,      -- message_id / webhookId: stable across resends
    body        BLOB NOT NULL,
    meta        BLOB NOT NULL,      -- JSON object: headers, event type, offsets …
    created_ms  INTEGER NOT NULL,
    expires_ms  INTEGER,            -- NULL: never expires
    PRIMARY KEY (stream, seq)
) WITHOUT ROWID;
