# Request shapes of the Firecrawl v2 scrape/crawl/batch/map API, as firecrawl-py (4.55.0) sends
# and validates them. Firecrawl's schemas are strict, so ours are too: a request is first read as
# a JSON object, every key not in the struct is collected and reported at once (the SDK user sees
# them all in one 400), and only then converted with msgspec. The sync and async clients send
# different subsets of keys, so every default lives here, not in the client. The scrape options
# every request carries, and what crawld serves, ignores or refuses of them, are in
# scrape_options.py; the answers in responses.py.
from __future__ import annotations

from typing import Any, Literal

import msgspec

from daemon.config import WebhookSpec, WebhookURL, webhook_spec
from daemon.crawl.fetching.urls import compile_paths, parse_http_url
from daemon.crawl.options.llm_formats import LlmCheck
from daemon.crawl.options.scrape_options import (
    SCRAPE_KEYS,
    ScrapeOptions,
    check_scrape_options,
)
from daemon.crawl.problems import (
    BadRequest,
    Problem,
    converted,
    json_object,
    not_supported,
    problem,
    unknown_keys,
)

MAX_URL_LENGTH = 8192
MAX_BATCH_URLS = 10_000
INTEGRATIONS = (
    "dify", "zapier", "pipedream", "raycast", "langchain", "crewai", "llamaindex", "n8n",
    "camelai", "make", "flowise", "metagpt", "relevanceai", "viasocket", "cli", "hermes",
    "gstack", "prometheus",
)  # fmt: skip
"""Firecrawl's IntegrationEnum (apps/api/src/controllers/v2/types.ts); any other `integration`
must start with `_`, as Firecrawl's schema says."""
CRAWL_PROMPT_REFUSAL = not_supported("a crawl prompt") + (
    ": give the crawl options (includePaths, excludePaths, limit, maxDiscoveryDepth, ...) in the "
    "request instead"
)
"""The one text a crawl `prompt` is refused with (change it here when prompts are served)."""


class CrawlRequest(msgspec.Struct, kw_only=True):
    url: str
    origin: str | None = None
    integration: str | None = None
    prompt: str | None = None
    includePaths: list[str] = []
    excludePaths: list[str] = []
    regexOnFullURL: bool = False
    maxDiscoveryDepth: int | None = None
    sitemap: Literal["include", "skip", "only"] = "include"
    ignoreQueryParameters: bool = False
    deduplicateSimilarURLs: bool = True
    limit: int | None = None
    crawlEntireDomain: bool = False
    allowExternalLinks: bool = False
    allowSubdomains: bool = False
    ignoreRobotsTxt: bool = False
    robotsUserAgent: str | None = None
    delay: float | None = None
    maxConcurrency: int | None = None
    webhook: WebhookURL | WebhookSpec | None = None
    scrapeOptions: ScrapeOptions | None = None
    zeroDataRetention: bool = False


class MapRequest(msgspec.Struct, kw_only=True):
    url: str
    origin: str | None = None
    integration: str | None = None
    search: str | None = None
    sitemap: Literal["include", "skip", "only"] = "include"
    includeSubdomains: bool = True
    ignoreQueryParameters: bool = True
    limit: int = 5000
    timeout: int | None = None
    filterByPath: bool = True
    useIndex: bool | None = None
    location: dict[str, Any] | None = None
    threatProtection: dict[str, Any] | None = None
    auditMetadata: dict[str, Any] | None = None


_SCRAPE_TOP = frozenset({"url", "origin", "zeroDataRetention"})
_BATCH_TOP = frozenset(
    {"urls", "origin", "webhook", "appendToId", "ignoreInvalidURLs", "maxConcurrency",
     "zeroDataRetention"}
)  # fmt: skip


def client_field_problems(raw: dict[str, Any], path: str) -> list[Problem]:
    """`origin` (any string, the SDKs send `python-sdk@4.55.0`) and `integration` (Firecrawl's
    list, or a name starting with `_`) of a request object."""
    problems = []
    origin = raw.get("origin")
    if origin is not None and not isinstance(origin, str):
        problems.append(problem(f"{path}.origin", "must be a string"))
    integration = raw.get("integration")
    if integration is not None and not (
        isinstance(integration, str)
        and (integration.startswith("_") or integration in INTEGRATIONS)
    ):
        expected = " | ".join(f"'{v}'" for v in INTEGRATIONS)
        problems.append(
            problem(
                f"{path}.integration",
                f"Invalid enum value. Expected {expected}, or a name starting with '_'",
            )
        )
    return problems


def url_problems(url: str, path: str) -> list[Problem]:
    if len(url) > MAX_URL_LENGTH:
        return [problem(path, f"longer than {MAX_URL_LENGTH} characters")]
    if parse_http_url(url.strip()) is None:
        return [problem(path, "must be an absolute http:// or https:// URL")]
    return []


class ScrapeRequest(msgspec.Struct, kw_only=True):
    url: str
    options: ScrapeOptions
    zeroDataRetention: bool = False
    warning: str = ""


def parse_scrape(
    body: bytes,
    *,
    browser: bool = False,
    llm: LlmCheck | None = None,
    stealth: bool = False,
) -> ScrapeRequest:
    raw = json_object(body)
    problems = unknown_keys(raw, SCRAPE_KEYS | _SCRAPE_TOP, "$") + client_field_problems(raw, "$")
    url = raw.pop("url", None)
    if not isinstance(url, str):
        problems.append(problem("$.url", "required string"))
    else:
        problems += url_problems(url, "$.url")
    zdr = raw.pop("zeroDataRetention", False)
    raw.pop("origin", None)
    options = converted({k: v for k, v in raw.items() if k in SCRAPE_KEYS}, ScrapeOptions, problems)
    more, warning = check_scrape_options(options, "$", browser=browser, llm=llm, stealth=stealth)
    problems += more
    if problems:
        raise BadRequest(problems)
    assert isinstance(url, str)
    return ScrapeRequest(url=url.strip(), options=options, zeroDataRetention=bool(zdr),
                         warning=warning)  # fmt: skip


class CrawlPlan(msgspec.Struct, kw_only=True):
    """A validated crawl request with every default applied; stored with the job."""

    request: CrawlRequest
    options: ScrapeOptions
    webhook: WebhookSpec | None
    limit: int
    warning: str = ""
    max_url_depth: int | None = None
    """v1's `maxDepth`: links whose URL has more path segments are not followed (v2 has none)."""


def parse_crawl(
    body: bytes,
    *,
    default_limit: int,
    browser: bool = False,
    llm: LlmCheck | None = None,
    stealth: bool = False,
) -> CrawlPlan:
    raw = json_object(body)
    problems = unknown_keys(raw, frozenset(CrawlRequest.__struct_fields__), "$")
    problems += client_field_problems(raw, "$")
    nested = raw.get("scrapeOptions")
    if isinstance(nested, dict):
        problems += unknown_keys(nested, SCRAPE_KEYS, "$.scrapeOptions")
        problems += client_field_problems(nested, "$.scrapeOptions")
    if problems:
        raise BadRequest(problems)
    request = converted(raw, CrawlRequest, problems)
    problems += url_problems(request.url, "$.url")
    options = request.scrapeOptions or ScrapeOptions()
    more, warning = check_scrape_options(
        options, "$.scrapeOptions", browser=browser, llm=llm, stealth=stealth
    )
    problems += more
    if request.prompt:
        problems.append(problem("$.prompt", CRAWL_PROMPT_REFUSAL))
    if request.limit is not None and request.limit < 1:
        problems.append(problem("$.limit", "must be at least 1"))
    if request.maxDiscoveryDepth is not None and request.maxDiscoveryDepth < 0:
        problems.append(problem("$.maxDiscoveryDepth", "must be at least 0"))
    if request.delay is not None and not 0 < request.delay <= 60:
        problems.append(problem("$.delay", "seconds, more than 0 and at most 60"))
    if request.maxConcurrency is not None and request.maxConcurrency < 1:
        problems.append(problem("$.maxConcurrency", "must be at least 1"))
    for field in ("includePaths", "excludePaths"):
        try:
            compile_paths(getattr(request, field), field=field)
        except ValueError as exc:
            problems.append(problem(f"$.{field}", str(exc)))
    webhook, more = webhook_of(request.webhook)
    problems += more
    if problems:
        raise BadRequest(problems)
    request.url = request.url.strip()
    return CrawlPlan(
        request=request,
        options=options,
        webhook=webhook,
        limit=request.limit or default_limit,
        warning=warning,
    )


_plan_decoder = msgspec.json.Decoder(CrawlPlan)


def crawl_plan(raw: bytes) -> CrawlPlan:
    return _plan_decoder.decode(raw)


def public_options(plan: CrawlPlan) -> dict[str, Any]:
    """A crawl's options as /v2/crawl/active shows them: the request without its webhook
    (its headers may hold secrets) and the client's bookkeeping keys."""
    options = msgspec.to_builtins(plan.request)
    for key in ("url", "webhook", "origin", "integration"):
        options.pop(key, None)
    options["limit"] = plan.limit
    options["scrapeOptions"] = msgspec.to_builtins(plan.options)
    return {k: v for k, v in options.items() if v is not None}


def webhook_of(value: str | WebhookSpec | None) -> tuple[WebhookSpec | None, list[Problem]]:
    try:
        return webhook_spec(value), []
    except ValueError as exc:
        return None, [problem("$.webhook", str(exc))]


class BatchPlan(msgspec.Struct, kw_only=True):
    urls: list[str]
    invalid_urls: list[str]
    options: ScrapeOptions
    webhook: WebhookSpec | None
    append_to: str | None
    max_concurrency: int | None
    zero_data_retention: bool
    warning: str = ""


def parse_batch(
    body: bytes, *, browser: bool = False, llm: LlmCheck | None = None, stealth: bool = False
) -> BatchPlan:
    raw = json_object(body)
    problems = unknown_keys(raw, SCRAPE_KEYS | _BATCH_TOP, "$") + client_field_problems(raw, "$")
    urls = raw.get("urls")
    if not isinstance(urls, list) or not urls or not all(isinstance(u, str) for u in urls):
        problems.append(problem("$.urls", "a non-empty list of URL strings"))
        urls = []
    elif len(urls) > MAX_BATCH_URLS:
        problems.append(problem("$.urls", f"at most {MAX_BATCH_URLS} URLs"))
    ignore_invalid = raw.get("ignoreInvalidURLs", True)
    valid: list[str] = []
    invalid: list[str] = []
    for i, url in enumerate(urls):
        bad = url_problems(url, f"$.urls[{i}]")
        if not bad:
            valid.append(url.strip())
        elif ignore_invalid:
            invalid.append(url[:MAX_URL_LENGTH])
        else:
            problems += bad
    if urls and not valid and not problems:
        problems.append(problem("$.urls", "No valid URLs provided"))
    options = converted({k: v for k, v in raw.items() if k in SCRAPE_KEYS}, ScrapeOptions, problems)
    more, warning = check_scrape_options(options, "$", browser=browser, llm=llm, stealth=stealth)
    problems += more
    append_to = raw.get("appendToId")
    if append_to is not None and not isinstance(append_to, str):
        problems.append(problem("$.appendToId", "a job id string"))
    concurrency = raw.get("maxConcurrency")
    if concurrency is not None and (type(concurrency) is not int or concurrency < 1):
        problems.append(problem("$.maxConcurrency", "an integer of at least 1"))
    hook = raw.get("webhook")
    if hook is not None and not isinstance(hook, str):
        try:
            hook = msgspec.convert(hook, WebhookSpec)
        except msgspec.ValidationError as exc:
            problems.append(problem("$.webhook", str(exc)))
            hook = None
    webhook, more = webhook_of(hook)
    problems += more
    if problems:
        raise BadRequest(problems)
    return BatchPlan(
        urls=valid,
        invalid_urls=invalid,
        options=options,
        webhook=webhook,
        append_to=append_to,
        max_concurrency=concurrency,
        zero_data_retention=bool(raw.get("zeroDataRetention", False)),
        warning=warning,
    )


def parse_map(body: bytes) -> MapRequest:
    raw = json_object(body)
    problems = unknown_keys(raw, frozenset(MapRequest.__struct_fields__), "$")
    problems += client_field_problems(raw, "$")
    if problems:
        raise BadRequest(problems)
    request = converted(raw, MapRequest, problems)
    problems += url_problems(request.url, "$.url")
    if not 1 <= request.limit <= 100_000:
        problems.append(problem("$.limit", "between 1 and 100000"))
    if request.timeout is not None and request.timeout < 1:
        problems.append(problem("$.timeout", "milliseconds, at least 1"))
    if request.search is not None and len(request.search) > 1000:
        problems.append(problem("$.search", "at most 1000 characters"))
    if request.location:
        problems.append(problem("$.location", "not supported by crawld"))
    if problems:
        raise BadRequest(problems)
    request.url = request.url.strip()
    return request


# The one answer kept with the requests: /openapi.json names it by module
# (`daemon.crawl.options.models.StartResponse`) because the collector API has a StartResponse too,
# and clients generated from the document know it by that name.
class StartResponse(msgspec.Struct, kw_only=True, omit_defaults=True):
    success: bool
    id: str
    url: str
    invalidURLs: list[str] | None = None
    warning: str | None = None
