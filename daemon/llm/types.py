# The LLM service's value types and error codes, apart from the service so that a caller (an
# area's models, a test) can name them without importing httpx or the store.
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LLM_NOT_CONFIGURED = "LLM_NOT_CONFIGURED"
"""No `[llm]` section, or the request named a provider that is not configured."""
LLM_TIMEOUT = "LLM_TIMEOUT"
"""Every attempt ran out of `timeout` (or the caller's deadline came first)."""
LLM_RATE_LIMITED = "LLM_RATE_LIMITED"
"""The server kept answering 429 through every retry."""
LLM_BAD_OUTPUT = "LLM_BAD_OUTPUT"
"""The model's answer was not valid JSON for the schema, also after the repair round-trip."""
LLM_UNAVAILABLE = "LLM_UNAVAILABLE"
"""The server could not be reached or kept answering 5xx through every retry."""
LLM_BAD_REQUEST = "LLM_BAD_REQUEST"
"""The server refused the request itself (4xx other than 429): context too long, unknown
model, bad key. Not retried."""
LLM_REFUSED = "LLM_REFUSED"
"""The model refused to answer (OpenAI's `refusal`)."""


class LlmError(Exception):
    """A call that gave no result; `code` is one of the LLM_* constants, `message` says why in
    words fit for a page's error (never the API key, never the request body)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Usage:
    """Tokens of one call as the server counted them (`usage`); 0 when it sent none."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
        )


@dataclass(frozen=True)
class LlmResult:
    """What a call produced. `value`: a JSON value for extract_json (an object, validated against
    the schema when one was given), a string for summarize. `usage`: what this call cost (zero
    when `cached`: the answer came from the store). `warning`: set when the content was cut to
    `max_input_tokens` (to be added to the document's `warning`)."""

    value: Any
    usage: Usage
    cached: bool
    provider: str
    model: str
    warning: str | None = None
