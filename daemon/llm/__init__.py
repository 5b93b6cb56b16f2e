# The daemon's LLM service: one object per process that turns page text into JSON or a summary
# through any OpenAI-compatible `/v1/chat/completions` endpoint (OpenAI, Ollama, vLLM, llama.cpp
# server, LM Studio), configured by `[llm]` in config.toml. It is core, like the store and the
# outbox: it never imports an area; areas (crawl, extract) call it.
#
# How an area gets it: `daemon/llm/component.py` is installed before the areas (daemon/areas.py)
# and sets `daemon.llm` (daemon/runtime.py Daemon.llm) to the LlmService. It always exists, with
# or without `[llm]`: `configured()` says whether a call can be made, so a reload that adds or
# removes `[llm]` (SIGHUP) takes effect for the next request without re-wiring any area. An
# area reads it at install time (`service = daemon.llm`) and keeps the reference.
#
# What a caller can rely on (the operator's guarantees): every call is bounded (`timeout` per
# attempt, `max_concurrency` in flight per provider, `requests_per_minute` / `tokens_per_minute`
# reserved before sending), retried on 429/5xx with Retry-After honoured and capped backoff,
# cancellable (a trio cancel drops the request), counted (tokens from the answer's `usage`, per
# provider, in /metrics and /v2/team/token-usage) and cached in the store by (model, prompt,
# schema, content hash) so the same page and question never pay twice within the TTL. Failures
# are an LlmError with a stable `code`, never another exception type.
from __future__ import annotations

from daemon.llm.types import (
    LLM_BAD_OUTPUT,
    LLM_BAD_REQUEST,
    LLM_NOT_CONFIGURED,
    LLM_RATE_LIMITED,
    LLM_REFUSED,
    LLM_TIMEOUT,
    LLM_UNAVAILABLE,
    LlmError,
    LlmResult,
    Usage,
)

__all__ = [
    "LLM_BAD_OUTPUT",
    "LLM_BAD_REQUEST",
    "LLM_NOT_CONFIGURED",
    "LLM_RATE_LIMITED",
    "LLM_REFUSED",
    "LLM_TIMEOUT",
    "LLM_UNAVAILABLE",
    "LlmError",
    "LlmResult",
    "LlmService",
    "Usage",
]


def __getattr__(name: str) -> object:
    # The service pulls in httpx and the store; the value types above stay importable alone.
    if name == "LlmService":
        from daemon.llm.service import LlmService

        return LlmService
    raise AttributeError(name)
