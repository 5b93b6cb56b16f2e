-- LLM answers (daemon/llm/): the value a model gave for one (kind, model, prompt, schema, page
-- content hash), kept until `expires_ms` ([llm] cache_ttl) so the same page and question never
-- pay twice. `key` is the sha256 of those (daemon/llm/rules.py cache_key); `value` is JSON.
CREATE TABLE llm_cache (
    key                TEXT PRIMARY KEY,
    kind               TEXT NOT NULL,
    model              TEXT NOT NULL,
    value              TEXT NOT NULL,
    prompt_tokens      BIGINT NOT NULL,
    completion_tokens  BIGINT NOT NULL,
    created_ms         BIGINT NOT NULL,
    expires_ms         BIGINT NOT NULL
);
CREATE INDEX llm_cache_expires ON llm_cache(expires_ms);
