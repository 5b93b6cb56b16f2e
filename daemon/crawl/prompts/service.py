# Crawl options from a prompt, as Firecrawl makes them: map the site (at most 50 URLs, subdomains
# included, bounded in time: a site that cannot be mapped still gets its prompt read, with the
# start URL alone), then one structured call of the LLM service (daemon/llm: its limits, retries,
# accounting and cache apply) whose answer is checked by crawld's own crawl rules (rules.py). It
# runs inside the request, before the crawl job exists, so the job stores only the options it
# runs with and a restart never asks the model again.
#
# Without `[llm]` a prompt is refused with 501 LLM_NOT_CONFIGURED naming the section (as /v2/extract
# and /v2/agent are): the request is well formed, this deployment lacks what it needs (never a
# silent crawl without the prompt).
# A model that fails is Firecrawl's 400 "Failed to process natural language prompt" when its
# answer was unusable, a 502 when it could not be reached or kept failing.
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from prometheus_client import Counter

from daemon.crawl.options.models import CrawlPlan, MapRequest
from daemon.crawl.problems import BadRequest, json_object
from daemon.crawl.prompts import rules
from daemon.crawl.runs.mapper import MapTimeout
from daemon.crawl.runs.service import CrawlService
from daemon.llm.types import LLM_BAD_OUTPUT, LLM_REFUSED, LlmError
from daemon.logs import get_logger
from daemon.metrics import REGISTRY

log = get_logger("crawl.prompts")

prompts_total = Counter(
    "crawld_crawl_prompts",
    "Crawl prompts turned into options, by outcome (ok, or the error code)",
    ["outcome"],
    registry=REGISTRY,
)

MAP_TIMEOUT_MS = 15_000
"""Most time the map before the structured call may take."""
NOT_CONFIGURED = (
    "crawl prompts need an LLM and [llm] is not configured: add an [llm] section"
    " (docs/how-to/llm-formats.md), or give the crawl options themselves"
)
NOT_UNDERSTOOD = "Failed to process natural language prompt. Please try rephrasing."
"""Firecrawl's words when the model's answer cannot be used."""
PROMPT_ERRORS = {
    400: "the model's answer could not be used (Firecrawl's 'Failed to process natural language"
    " prompt')",
    501: "LLM_NOT_CONFIGURED: crawl prompts need [llm]",
    502: "the model could not be reached or kept failing (its LLM_* code)",
}
"""What a request with a prompt can be answered with besides its own 400s (for /openapi.json)."""


class PromptError(Exception):
    """A prompt that gave no options: `status`, Firecrawl-style `code` and `message`."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass
class Generated:
    """The options a prompt generated that crawld's rules accept, and what was dropped."""

    options: dict[str, Any]
    dropped: list[str] = field(default_factory=list)


class CrawlPrompts:
    """Turns prompts into crawl options with the daemon's LLM service."""

    def __init__(self, crawl: CrawlService, llm: Any) -> None:
        self.crawl = crawl
        self.llm = llm
        self.counts = {"generated": 0, "failed": 0, "dropped": 0}

    def configured(self) -> bool:
        return self.llm is not None and bool(self.llm.configured())

    async def generate(self, url: str, prompt: str) -> Generated:
        """The options `prompt` asks for, for a crawl of `url`; PromptError when there are
        none to give (no `[llm]`, the model failed)."""
        if not self.configured():
            self._failed("LLM_NOT_CONFIGURED")
            raise PromptError(501, "LLM_NOT_CONFIGURED", NOT_CONFIGURED)
        urls = await self._map(url)
        try:
            result = await self.llm.extract_json(
                rules.material(url, urls), schema=rules.SCHEMA, prompt=rules.instructions(prompt)
            )
        except LlmError as exc:
            self._failed(exc.code)
            log.warning("crawl prompt failed", url=url, code=exc.code, error=exc.message)
            if exc.code in (LLM_BAD_OUTPUT, LLM_REFUSED):
                raise PromptError(400, exc.code, f"{NOT_UNDERSTOOD} ({exc.message})") from None
            raise PromptError(
                502, exc.code, f"the model could not be asked: {exc.message}"
            ) from None
        kept, dropped = rules.checked(result.value, url,
                                      default_limit=self.crawl.config.default_limit)  # fmt: skip
        if result.warning:
            dropped.append(result.warning)
        self.counts["generated"] += 1
        self.counts["dropped"] += len(dropped)
        prompts_total.labels("ok").inc()
        log.info("crawl prompt read", url=url, options=sorted(kept), dropped=len(dropped))
        return Generated(kept, dropped)

    async def plan(
        self, body: bytes, plan: CrawlPlan, parse: Callable[[bytes], CrawlPlan]
    ) -> tuple[CrawlPlan, dict[str, Any]]:
        """The crawl `plan` (parsed from `body`, which has a prompt) with the generated options
        merged under its own, re-parsed with `parse`; and the generated options."""
        assert plan.request.prompt
        generated = await self.generate(plan.request.url, plan.request.prompt)
        raw = json_object(body)
        merged = rules.merge(raw, generated.options)
        try:
            prompted = parse(msgspec.json.encode(merged))
        except BadRequest as exc:  # each option passed alone; together they did not
            reason = "; ".join(f"{d['path']}: {d['message']}" for d in exc.details)
            generated.dropped.append(f"the generated options were not used: {reason}")
            prompted = plan
        said = [
            plan.warning,
            prompted.warning if prompted is not plan else "",
            rules.warning_of(generated.dropped, rules.overridden(raw, generated.options)),
        ]
        prompted.warning = " ".join(dict.fromkeys(w for w in said if w))
        return prompted, generated.options

    async def _map(self, url: str) -> list[str]:
        request = MapRequest(url=url, limit=rules.MAP_URLS, includeSubdomains=True,
                             timeout=MAP_TIMEOUT_MS)  # fmt: skip
        try:
            return [link.url for link in await self.crawl.map(request)]
        except MapTimeout:
            log.info("crawl prompt: the site's map timed out; the prompt is read without it",
                     url=url)  # fmt: skip
            return [url]

    def _failed(self, code: str) -> None:
        self.counts["failed"] += 1
        prompts_total.labels(code).inc()

    def status(self) -> dict[str, Any]:
        return {"configured": self.configured(), **self.counts}
