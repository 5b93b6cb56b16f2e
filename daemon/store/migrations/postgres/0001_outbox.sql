-- PostgreSQL spelling of sqlite/0001_outbox.sql (same tables; BIGINT for INTEGER, BYTEA for BLOB).
-- Ordered durable streams (daemon/outbox.py). One row per stream holds its ack cursor and the last
-- sequence number issued, so numbering continues after items are deleted or the daemon restarts.
CREATE TABLE outbox_streams (
    stream      TEXT PRIMARY KEY,
    last_seq    BIGINT NOT NULL DEFAULT 0,
    ack_cursor  BIGINT NOT NULL DEFAULT 0
);

CREATE TABLE outbox_items (
    stream      TEXT NOT NULL REFERENCES outbox_streams(stream) ON DELETE CASCADE,
    seq         BIGINT NOT NULL,
    key         TEXT NOT NULL,      -- message_id / webhookId: stable across resends
    body        BYTEA NOT NULL,
    meta        BYTEA NOT NULL,      -- JSON object: headers, event type, offsets …
    created_ms  BIGINT NOT NULL,
    expires_ms  BIGINT,            -- NULL: never expires
    PRIMARY KEY (stream, seq)
);
