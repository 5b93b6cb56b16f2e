# The answers of the Firecrawl v2 API as firecrawl-py and firecrawl-js read them: scrapes, maps,
# active crawls, errors, and the team endpoints crawld answers as a self-hosted Firecrawl does
# (no credits counted). The requests, and the start answer /openapi.json names after their
# module, are in models.py.
from __future__ import annotations

from typing import Any

import msgspec


class ScrapeResponse(msgspec.Struct, kw_only=True, omit_defaults=True):
    success: bool
    data: dict[str, Any]
    warning: str | None = None


class MapLink(msgspec.Struct, kw_only=True, omit_defaults=True):
    url: str
    title: str | None = None
    description: str | None = None


class MapResponse(msgspec.Struct, kw_only=True):
    success: bool
    links: list[MapLink]


class ActiveCrawl(msgspec.Struct, kw_only=True):
    id: str
    teamId: str
    url: str
    created_at: str
    options: dict[str, Any]


class ActiveCrawls(msgspec.Struct, kw_only=True):
    success: bool
    crawls: list[ActiveCrawl]


class FirecrawlError(msgspec.Struct, kw_only=True, omit_defaults=True):
    success: bool = msgspec.field(default_factory=lambda: False)  # a factory: never omitted
    error: str
    code: str | None = None
    details: list[dict[str, Any]] | None = None
    detail: Any = None


SELF_HOSTED_CREDITS = 99_999_999
"""What Firecrawl's self-hosted server answers for remaining credits and tokens (its mock
account when USE_DB_AUTHENTICATION is off): crawld counts no credits either."""


class CreditUsageData(msgspec.Struct, kw_only=True):
    remainingCredits: int


class CreditUsage(msgspec.Struct, kw_only=True):
    success: bool
    data: CreditUsageData


class CreditPeriod(msgspec.Struct, kw_only=True):
    startDate: str
    endDate: str | None
    """None: the period still running"""
    creditsUsed: int


class CreditUsageHistorical(msgspec.Struct, kw_only=True):
    success: bool
    periods: list[CreditPeriod]


class ProviderTokens(msgspec.Struct, kw_only=True):
    model: str
    requests: int
    promptTokens: int
    completionTokens: int
    totalTokens: int


class TokenUsageData(msgspec.Struct, kw_only=True):
    """Firecrawl's fields, then crawld's: the tokens its model endpoints counted (`usage`) since
    the daemon started (`billingPeriodStart`), in total and per `[llm]` provider."""

    remainingTokens: int
    billingPeriodStart: str | None = None
    tokensUsed: int
    providers: dict[str, ProviderTokens]


class TokenUsage(msgspec.Struct, kw_only=True):
    success: bool
    data: TokenUsageData


class QueueStatus(msgspec.Struct, kw_only=True):
    """Firecrawl's queue counts are of pages (each page is one of its scrape jobs); crawld adds
    the crawl and batch jobs running and waiting for a `[crawl] max_running_jobs` slot."""

    success: bool
    jobsInQueue: int
    activeJobsInQueue: int
    waitingJobsInQueue: int
    maxConcurrency: int
    mostRecentSuccess: str | None
    runningCrawls: int
    waitingCrawls: int


class ConcurrencyCheck(msgspec.Struct, kw_only=True):
    success: bool
    concurrency: int
    maxConcurrency: int
