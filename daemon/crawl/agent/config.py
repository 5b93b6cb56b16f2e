# The `[agent]` section: the bounds of every /v2/agent run. An agent needs nothing but `[llm]`
# (and `[search]` to search the web), so every key has a default that works as shipped; the
# values here are ceilings a request can lower (maxCredits, effort), never raise.
from __future__ import annotations

import re

from daemon.config_types import Duration, Section

FIRECRAWL_MODELS = ("spark-2", "spark-1-pro", "spark-1-mini")
"""The model names Firecrawl's SDKs send; each runs on `[llm]` unless `models` maps it."""
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class AgentConfig(Section, frozen=True):
    max_steps: int = 30
    """Most actions of one run: its web search, each page read, each model choice of what to
    read next, and the answer (always kept for last). A request's `effort` may lower it."""
    pages_per_step: int = 3
    """Most pages the model may choose to read at once."""
    max_credits: int = 2500
    """maxCredits of a request that sends none (Firecrawl's default)."""
    tokens_per_credit: int = 1000
    """Model tokens (prompt + completion, as the server counts them) that cost one credit; a
    page read and a web search cost one credit each."""
    page_chars: int = 8000
    """Most characters of one page's markdown the model is shown."""
    candidates: int = 30
    """Most unread links and search results shown to the model in one choice."""
    timeout: Duration = Duration(900)
    """Most time one run may take from its creation; past it the run fails."""
    models: dict[str, str] = {}
    """A request's `model` → an `[llm.providers]` name (e.g. `"spark-1-mini" = "small"`); a
    model not listed runs on `[llm]` itself when it is one of Firecrawl's, or on the provider
    of that name."""

    def __post_init__(self) -> None:
        if not 3 <= self.max_steps <= 500:
            raise ValueError("max_steps: between 3 and 500")
        if not 1 <= self.pages_per_step <= 20:
            raise ValueError("pages_per_step: between 1 and 20")
        if not 1 <= self.max_credits <= 1_000_000:
            raise ValueError("max_credits: between 1 and 1000000")
        if not 1 <= self.tokens_per_credit <= 10_000_000:
            raise ValueError("tokens_per_credit: between 1 and 10000000")
        if not 500 <= self.page_chars <= 1_000_000:
            raise ValueError("page_chars: between 500 and 1000000")
        if not 1 <= self.candidates <= 200:
            raise ValueError("candidates: between 1 and 200")
        if not 10 <= self.timeout <= 86400:
            raise ValueError("timeout: between 10s and 24h")
        for model, provider in self.models.items():
            if not _NAME.match(model) or not _NAME.match(provider):
                raise ValueError(
                    f"models: {model[:64]!r} = {provider[:64]!r} must map a model name to an"
                    " [llm.providers] name (letters, digits, '.', '_' or '-')"
                )
