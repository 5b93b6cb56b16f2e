# The `[llm]` section: the default model endpoint, and `[llm.providers.<name>]` for others a
# request can pick by name. Every endpoint is the operator's setting: a request names a provider,
# never a URL, so `base_url` may point at loopback or a private network (a local Ollama) without
# opening an SSRF hole. The API key is named by `api_key_env`, never written in the file.
from __future__ import annotations

import re
from typing import Literal

from daemon.config_types import Duration, Section

StructuredOutput = Literal["auto", "json_schema", "json_object", "tools"]
STRONGEST_FIRST: tuple[str, ...] = ("json_schema", "tools", "json_object")
"""What `structured_output = "auto"` tries, in order, skipping what the server refused."""
DEFAULT_PROVIDER = "default"
"""The name of the endpoint `[llm]` itself describes."""

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


class ProviderConfig(Section, frozen=True):
    """One OpenAI-compatible endpoint and the limits crawld keeps towards it."""

    base_url: str
    """The endpoint's OpenAI-compatible root, ending in /v1 (crawld posts to
    <base_url>/chat/completions)."""
    model: str
    """The model name the server knows (e.g. "gpt-4o-mini", "qwen2.5:7b")."""
    api_key_env: str | None = None
    """Environment variable holding the API key (sent as `Authorization: Bearer`); none for a
    local server that needs no key."""
    timeout: Duration = Duration(120)
    """Most time one attempt may take, from sending to the last byte of the answer."""
    max_concurrency: int = 4
    """Most requests in flight to this endpoint at once (over every job and /v2/scrape)."""
    requests_per_minute: int = 0
    """Requests sent per minute at most (GCRA, reserved before sending); 0: no limit."""
    tokens_per_minute: int = 0
    """Tokens (prompt, estimated before sending, then completion as counted) per minute at
    most; 0: no limit."""
    max_input_tokens: int = 16_000
    """Page content is cut to about this many tokens (4 characters a token) with a `warning`
    on the document; set it below the model's context window less max_output_tokens."""
    max_output_tokens: int = 2048
    """`max_tokens` of each request."""
    structured_output: StructuredOutput = "auto"
    """How JSON is asked for: "json_schema" (response_format json_schema, strict), "tools" (a
    forced function call whose parameters are the schema), "json_object" (JSON mode, the
    schema in the prompt) or "auto": the strongest of these the server accepts, remembering
    what it refused."""
    temperature: float = 0.0
    retries: int = 3
    """Attempts after the first on 429, 5xx, timeouts and connection errors."""
    retry_backoff_max: Duration = Duration(30)
    """Longest wait before a retry (a longer Retry-After is cut to this)."""

    def __post_init__(self) -> None:
        if not re.match(r"^https?://[^/\s?#@]+(/[^\s?#]*)?$", self.base_url):
            raise ValueError(
                f"base_url must be an http(s) URL without credentials, query or fragment, got "
                f"{self.base_url!r}"
            )
        if not self.model.strip():
            raise ValueError("model must name the model (e.g. 'gpt-4o-mini' or 'qwen2.5:7b')")
        if self.api_key_env is not None and not re.fullmatch(
            r"[A-Za-z_][A-Za-z0-9_]*", self.api_key_env
        ):
            raise ValueError(
                f"api_key_env must be an environment variable name, got {self.api_key_env!r}"
            )
        if not 0.1 <= self.timeout <= 3600:
            raise ValueError(f"timeout must be between 100ms and 1h, got {self.timeout}s")
        if not 1 <= self.max_concurrency <= 1024:
            raise ValueError("max_concurrency must be between 1 and 1024")
        if self.requests_per_minute < 0 or self.tokens_per_minute < 0:
            raise ValueError("requests_per_minute and tokens_per_minute cannot be negative")
        if not 256 <= self.max_input_tokens <= 10_000_000:
            raise ValueError("max_input_tokens must be between 256 and 10000000")
        if self.tokens_per_minute and self.tokens_per_minute < self.max_input_tokens:
            raise ValueError(
                "tokens_per_minute must be 0 or at least max_input_tokens (one page must fit)"
            )
        if not 16 <= self.max_output_tokens <= 1_000_000:
            raise ValueError("max_output_tokens must be between 16 and 1000000")
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError("temperature must be between 0 and 2")
        if not 0 <= self.retries <= 10:
            raise ValueError("retries must be between 0 and 10")

    @property
    def chat_url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"


class LlmConfig(ProviderConfig, frozen=True):
    """`[llm]`: the default provider, the cache, and the named extra providers."""

    cache_ttl: Duration = Duration(7 * 86400)
    """How long an answer is kept in the store and served again for the same model, prompt,
    schema and page content; 0: no cache."""
    providers: dict[str, ProviderConfig] = {}
    """Extra endpoints by name (`[llm.providers.local]`); a format picks one with
    `"provider": "local"`."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in self.providers:
            if not _NAME.match(name) or name == DEFAULT_PROVIDER:
                raise ValueError(
                    f"providers: {name!r} must be 1-64 letters, digits, '_' or '-' and not "
                    f"{DEFAULT_PROVIDER!r}"
                )

    def provider(self, name: str | None) -> ProviderConfig | None:
        """The named provider's settings (None or "default": `[llm]` itself)."""
        if name is None or name == DEFAULT_PROVIDER:
            return self
        return self.providers.get(name)

    def provider_names(self) -> list[str]:
        return [DEFAULT_PROVIDER, *self.providers]
