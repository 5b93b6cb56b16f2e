-- /v2/agent jobs (daemon/crawl/agent/). An agent job is a row of `jobs` (kind agent); here its
-- validated request and, once answered, its result; the pages it knows of (the request's URLs,
-- search results and links found, each a candidate until chosen, then read or failed, with the
-- text the model is shown); and its steps (the search, each page read, each choice of what to
-- read next, the answer), each with what it cost. A step, the pages it changed and its
-- `agent.action` webhook event commit together, so a restarted run continues from the last
-- step that committed and never sends a step's event twice.
CREATE TABLE agent_jobs (
    job_id      TEXT PRIMARY KEY REFERENCES jobs(id) ON DELETE CASCADE,
    plan        BYTEA NOT NULL,               -- the validated request, defaults applied (JSON)
    kicked_off  BIGINT NOT NULL DEFAULT 0,     -- the request's URLs and the search's results admitted
    result      BYTEA,                        -- the answer (JSON), once answered
    sources     BYTEA,                        -- [url] the answer came from (JSON), once answered
    message     TEXT                          -- why reading stopped early, when it did
);

CREATE TABLE agent_pages (
    job_id   TEXT NOT NULL REFERENCES agent_jobs(job_id) ON DELETE CASCADE,
    n        BIGINT NOT NULL,                  -- order found
    key      TEXT NOT NULL,                  -- dedupe key of the URL
    url      TEXT NOT NULL,
    origin   TEXT NOT NULL CHECK (origin IN ('request', 'search', 'link')),
    root     BIGINT NOT NULL,                  -- the request URL (index) whose /* scope it is in; -1
    title    TEXT NOT NULL DEFAULT '',
    snippet  TEXT NOT NULL DEFAULT '',
    state    TEXT NOT NULL CHECK (state IN ('candidate', 'chosen', 'read', 'failed')),
    text     TEXT,                           -- the markdown the model is shown, once read
    error    TEXT,                           -- why it could not be read
    PRIMARY KEY (job_id, n)
);

CREATE UNIQUE INDEX agent_pages_key ON agent_pages(job_id, key);

CREATE TABLE agent_steps (
    job_id    TEXT NOT NULL REFERENCES agent_jobs(job_id) ON DELETE CASCADE,
    n         BIGINT NOT NULL,                 -- 1, 2, ... in the order the steps committed
    action    TEXT NOT NULL,                  -- search | scrape | choose | answer
    input     BYTEA NOT NULL,                 -- JSON
    output    BYTEA NOT NULL,                 -- JSON
    pages     BIGINT NOT NULL DEFAULT 0,       -- what the step cost: pages read, searches, tokens
    searches  BIGINT NOT NULL DEFAULT 0,
    tokens    BIGINT NOT NULL DEFAULT 0,
    credits   BIGINT NOT NULL,                 -- the run's credits once this step was done
    ms        BIGINT NOT NULL DEFAULT 0,      -- how long its work took (fetch, search, model call)
    at_ms     BIGINT NOT NULL,
    PRIMARY KEY (job_id, n)
);
