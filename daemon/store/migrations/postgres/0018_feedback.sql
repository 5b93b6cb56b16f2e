-- Feedback on crawld's answers (POST /v2/feedback, POST /v2/search/{id}/feedback,
-- daemon/crawl/feedback/): what firecrawl-mcp's feedback tools send, validated, kept as JSON so
-- the console and GET /v2/feedback show it as it came. `target_id` is the search or job id named.
CREATE TABLE feedback (
    id              TEXT PRIMARY KEY,
    endpoint        TEXT NOT NULL,
    target_id       TEXT,
    rating          TEXT NOT NULL,
    body            BYTEA NOT NULL,
    created_ms      BIGINT NOT NULL
);
CREATE INDEX feedback_created ON feedback(created_ms);
CREATE INDEX feedback_target ON feedback(endpoint, target_id);
