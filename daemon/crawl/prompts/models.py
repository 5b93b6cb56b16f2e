# POST /v2/crawl/params-preview as Firecrawl has it: `{url, prompt}` in (plus the bookkeeping keys
# the SDKs send), `{success, data: {url, ...the generated options}}` out, where `data` holds only
# the options the prompt set (Firecrawl drops the undefined ones) and firecrawl-py reads a
# top-level `warning` into its CrawlParamsData.
from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from daemon.crawl.options.models import MAX_PROMPT, client_field_problems, url_problems
from daemon.crawl.options.schemas import NOT_BLANK, HttpUrl
from daemon.crawl.options.scrape_options import Integration
from daemon.crawl.problems import BadRequest, converted, json_object, problem, unknown_keys


class ParamsPreviewRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The body of POST /v2/crawl/params-preview."""

    url: HttpUrl
    prompt: Annotated[str, Meta(extra_json_schema={"maxLength": MAX_PROMPT, **NOT_BLANK})]
    """What to crawl, in words (at most 10,000 characters)."""
    zeroDataRetention: bool = False
    origin: str | None = None
    integration: Integration | None = None


class ParamsPreviewData(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The start URL and the crawl options the prompt generated (those it did not set absent)."""

    url: str
    includePaths: list[str] | None = None
    excludePaths: list[str] | None = None
    maxDiscoveryDepth: int | None = None
    crawlEntireDomain: bool | None = None
    allowExternalLinks: bool | None = None
    allowSubdomains: bool | None = None
    sitemap: Literal["include", "skip", "only"] | None = None
    ignoreQueryParameters: bool | None = None
    deduplicateSimilarURLs: bool | None = None
    delay: float | None = None
    limit: int | None = None


class ParamsPreviewResponse(msgspec.Struct, kw_only=True, omit_defaults=True):
    success: bool
    data: ParamsPreviewData
    warning: str | None = None
    """Generated options crawld's crawl rules refused (dropped), and why."""


def parse_params_preview(body: bytes) -> ParamsPreviewRequest:
    """A validated params-preview request; BadRequest naming every problem."""
    raw = json_object(body)
    problems = unknown_keys(raw, frozenset(ParamsPreviewRequest.__struct_fields__), "$")
    problems += client_field_problems(raw, "$")
    if problems:
        raise BadRequest(problems)
    request = converted(raw, ParamsPreviewRequest, problems)
    problems += url_problems(request.url, "$.url")
    if not request.prompt.strip():
        problems.append(problem("$.prompt", "must not be empty"))
    elif len(request.prompt) > MAX_PROMPT:
        problems.append(problem("$.prompt", f"at most {MAX_PROMPT} characters"))
    if problems:
        raise BadRequest(problems)
    request.url = request.url.strip()
    return request
