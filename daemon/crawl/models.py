# Request and response shapes of the Firecrawl v2 scrape/crawl/batch/map API, as firecrawl-py
# (4.55.0) sends and validates them. Firecrawl's schemas are strict, so ours are too: a request is
# first read as a JSON object, every key not in the struct is collected and reported at once (the
# SDK user sees them all in one 400), and only then converted with msgspec. The sync and async
# clients send different subsets of keys, so every default lives here, not in the client.
#
# Options fall in three groups: supported (they change what we fetch or return), accepted and
# ignored because they tune a cloud service we do not run (cache age, ad blocking, proxies of the
# basic kind), and refused because they need a browser or an LLM (screenshot, actions, json,
# summary, changeTracking, prompt...). Refusing is a 400 naming the option, never silent
# emptiness; harmless ignored ones that change the result add a `warning` to the answer.
from __future__ import annotations

from typing import Any, Literal, TypeVar

import msgspec

from daemon.api.errors import integral_floats
from daemon.config import WebhookSpec, WebhookURL, webhook_spec
from daemon.crawl import render_rules
from daemon.crawl.document import FORMATS, DocumentOptions
from daemon.crawl.pdf import parsers_problems
from daemon.crawl.urls import compile_paths, parse_http_url

T = TypeVar("T", bound=msgspec.Struct)

MAX_URL_LENGTH = 8192
MAX_BATCH_URLS = 10_000
SCREENSHOT_FORMATS = frozenset({"screenshot", "screenshot@fullPage"})
BROWSER_FORMATS = frozenset({"actions", "branding", "audio"})
LLM_FORMATS = frozenset(
    {"json", "summary", "changeTracking", "query", "question", "highlights", "attributes"}
)
INTEGRATIONS = (
    "dify", "zapier", "pipedream", "raycast", "langchain", "crewai", "llamaindex", "n8n",
    "camelai", "make", "flowise", "metagpt", "relevanceai", "viasocket", "cli", "hermes",
    "gstack", "prometheus",
)  # fmt: skip
"""Firecrawl's IntegrationEnum (apps/api/src/controllers/v2/types.ts); any other `integration`
must start with `_`, as Firecrawl's schema says."""


class BadRequest(Exception):
    """A request Firecrawl would refuse with 400; `details` lists every problem found."""

    def __init__(self, details: list[dict[str, Any]]) -> None:
        super().__init__("; ".join(f"{d['path']}: {d['message']}" for d in details))
        self.details = details


def _problem(path: str, message: str) -> dict[str, Any]:
    return {"path": path, "message": message}


class ScrapeOptions(msgspec.Struct, kw_only=True):
    """Scrape options: top level of /v2/scrape and /v2/batch/scrape, `scrapeOptions` of a crawl."""

    formats: list[str | dict[str, Any]] = msgspec.field(default_factory=lambda: ["markdown"])
    onlyMainContent: bool = True
    includeTags: list[str] = []
    excludeTags: list[str] = []
    headers: dict[str, str] = {}
    waitFor: int = 0
    timeout: int | None = None
    """Milliseconds for the whole page; [crawl] page_timeout when absent."""
    removeBase64Images: bool = True
    skipTlsVerification: bool | None = None
    # Accepted and ignored: tuning of Firecrawl's cloud (cache, ads, proxy pools, devices).
    mobile: bool | None = None
    fastMode: bool | None = None
    blockAds: bool | None = None
    storeInCache: bool | None = None
    maxAge: int | None = None
    minAge: int | None = None
    proxy: str | None = None
    location: dict[str, Any] | None = None
    lockdown: bool | None = None
    useMock: str | None = None
    profile: dict[str, Any] | None = None
    integration: str | None = None
    auditMetadata: dict[str, Any] | None = None
    # Served: PDF parsing, and with [crawl.browser] the browser's options.
    parsers: list[Any] | None = None
    # Refused when set to something that needs a browser or an LLM.
    actions: list[Any] | None = None
    redactPII: bool | dict[str, Any] | None = None
    checkPromptInjection: bool | None = None
    threatProtection: dict[str, Any] | None = None
    domainTools: bool | None = None
    toolDetail: str | None = None


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


_SCRAPE_KEYS = frozenset(ScrapeOptions.__struct_fields__)
_SCRAPE_TOP = frozenset({"url", "origin", "zeroDataRetention"})
_BATCH_TOP = frozenset(
    {"urls", "origin", "webhook", "appendToId", "ignoreInvalidURLs", "maxConcurrency",
     "zeroDataRetention"}
)  # fmt: skip


def _object(body: bytes) -> dict[str, Any]:
    try:
        value = msgspec.json.decode(body or b"{}")
    except msgspec.DecodeError as exc:
        raise BadRequest([_problem("$", f"request body is not valid JSON: {exc}")]) from None
    if not isinstance(value, dict):
        raise BadRequest([_problem("$", "request body must be a JSON object")])
    try:
        normalized: dict[str, Any] = integral_floats(value)
    except RecursionError:
        raise BadRequest([_problem("$", "request body is nested too deeply")]) from None
    return normalized


def _unknown(raw: dict[str, Any], allowed: frozenset[str], path: str) -> list[dict[str, Any]]:
    return [
        _problem(f"{path}.{key}"[:200], "unrecognized key")
        for key in sorted(raw)[:50]
        if key not in allowed
    ]


def _convert(raw: dict[str, Any], type_: type[T], problems: list[dict[str, Any]]) -> T:
    try:
        return msgspec.convert(raw, type_)
    except msgspec.ValidationError as exc:
        # msgspec ends its message with " - at `$.path`": that path names the field.
        message, _, where = str(exc).rpartition(" - at `")
        if message and where.endswith("`"):
            raise BadRequest([*problems, _problem(where[:-1], message)]) from None
        raise BadRequest([*problems, _problem("$", str(exc))]) from None


def _client_fields(raw: dict[str, Any], path: str) -> list[dict[str, Any]]:
    """`origin` (any string, the SDKs send `python-sdk@4.55.0`) and `integration` (Firecrawl's
    list, or a name starting with `_`) of a request object."""
    problems = []
    origin = raw.get("origin")
    if origin is not None and not isinstance(origin, str):
        problems.append(_problem(f"{path}.origin", "must be a string"))
    integration = raw.get("integration")
    if integration is not None and not (
        isinstance(integration, str)
        and (integration.startswith("_") or integration in INTEGRATIONS)
    ):
        expected = " | ".join(f"'{v}'" for v in INTEGRATIONS)
        problems.append(
            _problem(
                f"{path}.integration",
                f"Invalid enum value. Expected {expected}, or a name starting with '_'",
            )
        )
    return problems


def _check_url(url: str, path: str) -> list[dict[str, Any]]:
    if len(url) > MAX_URL_LENGTH:
        return [_problem(path, f"longer than {MAX_URL_LENGTH} characters")]
    if parse_http_url(url.strip()) is None:
        return [_problem(path, "must be an absolute http:// or https:// URL")]
    return []


def check_scrape_options(
    options: ScrapeOptions, path: str, *, browser: bool = False
) -> tuple[list[dict[str, Any]], str]:
    """Problems (400) and a warning text for the options crawld accepts but ignores.
    `browser`: a browser is configured ([crawl.browser] enabled), so screenshots, actions,
    waitFor, mobile and location.languages are served."""
    problems: list[dict[str, Any]] = []
    warnings: list[str] = []
    for i, fmt in enumerate(options.formats):
        name = fmt if isinstance(fmt, str) else fmt.get("type")
        where = f"{path}.formats[{i}]"
        if not isinstance(name, str):
            problems.append(_problem(where, "a format is a string or an object with `type`"))
        elif name in SCREENSHOT_FORMATS:
            if not browser:
                problems.append(
                    _problem(where, f"format {name!r} needs a browser; [crawl.browser] is off")
                )
        elif name in BROWSER_FORMATS:
            problems.append(_problem(where, f"format {name!r} needs a browser; crawld has none"))
        elif name in LLM_FORMATS:
            problems.append(_problem(where, f"format {name!r} needs an LLM; crawld has none"))
        elif name not in FORMATS:
            problems.append(
                _problem(where, f"unknown format {name[:50]!r}; supported: {sorted(FORMATS)}")
            )
    if browser:
        problems += render_rules.screenshot_spec(options.formats, path)[1]
        problems += render_rules.parse_actions(options.actions, f"{path}.actions",
                                               options.waitFor)[1]  # fmt: skip
    elif options.actions:
        problems.append(
            _problem(f"{path}.actions", "actions need a browser; [crawl.browser] is off")
        )
    problems += parsers_problems(options.parsers, f"{path}.parsers")
    for key in ("redactPII", "checkPromptInjection", "domainTools"):
        if getattr(options, key):
            problems.append(_problem(f"{path}.{key}", f"{key} needs an LLM; crawld has none"))
    if options.threatProtection:
        problems.append(_problem(f"{path}.threatProtection", "not supported by crawld"))
    if options.timeout is not None and not 1000 <= options.timeout <= 300_000:
        problems.append(_problem(f"{path}.timeout", "milliseconds between 1000 and 300000"))
    if not 0 <= options.waitFor <= 60_000:
        problems.append(_problem(f"{path}.waitFor", "milliseconds between 0 and 60000"))
    elif options.waitFor and options.timeout and options.waitFor > options.timeout / 2:
        problems.append(_problem(f"{path}.waitFor", "waitFor must not exceed half of timeout"))
    for field in ("includeTags", "excludeTags"):
        if len(getattr(options, field)) > 100:
            problems.append(_problem(f"{path}.{field}", "at most 100 selectors"))
    if options.waitFor and not browser:
        warnings.append("waitFor is ignored: [crawl.browser] is off, pages are not rendered")
    if options.mobile and not browser:
        warnings.append("mobile is ignored: [crawl.browser] is off, pages are not rendered")
    if options.proxy in ("stealth", "enhanced"):
        warnings.append(f"proxy {options.proxy!r} is ignored: crawld fetches directly")
    location = options.location or {}
    languages = location.get("languages")
    if languages is not None and (
        not isinstance(languages, list)
        or len(languages) > 10
        or not all(isinstance(x, str) and 0 < len(x) <= 35 for x in languages)
    ):
        problems.append(_problem(f"{path}.location.languages", "a list of language tags"))
    if location.get("country"):
        warnings.append("location.country is ignored: crawld fetches from where it runs")
    return problems, " ".join(warnings)


def document_options(options: ScrapeOptions) -> DocumentOptions:
    names = {f if isinstance(f, str) else str(f.get("type")) for f in options.formats}
    return DocumentOptions(
        formats=frozenset(names & FORMATS),
        only_main_content=options.onlyMainContent,
        include_tags=tuple(options.includeTags),
        exclude_tags=tuple(options.excludeTags),
        remove_base64_images=options.removeBase64Images,
    )


class ScrapeRequest(msgspec.Struct, kw_only=True):
    url: str
    options: ScrapeOptions
    zeroDataRetention: bool = False
    warning: str = ""


def parse_scrape(body: bytes, *, browser: bool = False) -> ScrapeRequest:
    raw = _object(body)
    problems = _unknown(raw, _SCRAPE_KEYS | _SCRAPE_TOP, "$") + _client_fields(raw, "$")
    url = raw.pop("url", None)
    if not isinstance(url, str):
        problems.append(_problem("$.url", "required string"))
    else:
        problems += _check_url(url, "$.url")
    zdr = raw.pop("zeroDataRetention", False)
    raw.pop("origin", None)
    options = _convert({k: v for k, v in raw.items() if k in _SCRAPE_KEYS}, ScrapeOptions, problems)
    more, warning = check_scrape_options(options, "$", browser=browser)
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


def parse_crawl(body: bytes, *, default_limit: int, browser: bool = False) -> CrawlPlan:
    raw = _object(body)
    problems = _unknown(raw, frozenset(CrawlRequest.__struct_fields__), "$")
    problems += _client_fields(raw, "$")
    nested = raw.get("scrapeOptions")
    if isinstance(nested, dict):
        problems += _unknown(nested, _SCRAPE_KEYS, "$.scrapeOptions")
        problems += _client_fields(nested, "$.scrapeOptions")
    if problems:
        raise BadRequest(problems)
    request = _convert(raw, CrawlRequest, problems)
    problems += _check_url(request.url, "$.url")
    options = request.scrapeOptions or ScrapeOptions()
    more, warning = check_scrape_options(options, "$.scrapeOptions", browser=browser)
    problems += more
    if request.prompt:
        problems.append(_problem("$.prompt", "prompt needs an LLM; crawld has none"))
    if request.limit is not None and request.limit < 1:
        problems.append(_problem("$.limit", "must be at least 1"))
    if request.maxDiscoveryDepth is not None and request.maxDiscoveryDepth < 0:
        problems.append(_problem("$.maxDiscoveryDepth", "must be at least 0"))
    if request.delay is not None and not 0 < request.delay <= 60:
        problems.append(_problem("$.delay", "seconds, more than 0 and at most 60"))
    if request.maxConcurrency is not None and request.maxConcurrency < 1:
        problems.append(_problem("$.maxConcurrency", "must be at least 1"))
    for field in ("includePaths", "excludePaths"):
        try:
            compile_paths(getattr(request, field), field=field)
        except ValueError as exc:
            problems.append(_problem(f"$.{field}", str(exc)))
    webhook, more = _webhook(request.webhook)
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


def _webhook(value: str | WebhookSpec | None) -> tuple[WebhookSpec | None, list[dict[str, Any]]]:
    try:
        return webhook_spec(value), []
    except ValueError as exc:
        return None, [_problem("$.webhook", str(exc))]


class BatchPlan(msgspec.Struct, kw_only=True):
    urls: list[str]
    invalid_urls: list[str]
    options: ScrapeOptions
    webhook: WebhookSpec | None
    append_to: str | None
    max_concurrency: int | None
    zero_data_retention: bool
    warning: str = ""


def parse_batch(body: bytes, *, browser: bool = False) -> BatchPlan:
    raw = _object(body)
    problems = _unknown(raw, _SCRAPE_KEYS | _BATCH_TOP, "$") + _client_fields(raw, "$")
    urls = raw.get("urls")
    if not isinstance(urls, list) or not urls or not all(isinstance(u, str) for u in urls):
        problems.append(_problem("$.urls", "a non-empty list of URL strings"))
        urls = []
    elif len(urls) > MAX_BATCH_URLS:
        problems.append(_problem("$.urls", f"at most {MAX_BATCH_URLS} URLs"))
    ignore_invalid = raw.get("ignoreInvalidURLs", True)
    valid: list[str] = []
    invalid: list[str] = []
    for i, url in enumerate(urls):
        bad = _check_url(url, f"$.urls[{i}]")
        if not bad:
            valid.append(url.strip())
        elif ignore_invalid:
            invalid.append(url[:MAX_URL_LENGTH])
        else:
            problems += bad
    if urls and not valid and not problems:
        problems.append(_problem("$.urls", "No valid URLs provided"))
    options = _convert({k: v for k, v in raw.items() if k in _SCRAPE_KEYS}, ScrapeOptions, problems)
    more, warning = check_scrape_options(options, "$", browser=browser)
    problems += more
    append_to = raw.get("appendToId")
    if append_to is not None and not isinstance(append_to, str):
        problems.append(_problem("$.appendToId", "a job id string"))
    concurrency = raw.get("maxConcurrency")
    if concurrency is not None and (type(concurrency) is not int or concurrency < 1):
        problems.append(_problem("$.maxConcurrency", "an integer of at least 1"))
    hook = raw.get("webhook")
    if hook is not None and not isinstance(hook, str):
        try:
            hook = msgspec.convert(hook, WebhookSpec)
        except msgspec.ValidationError as exc:
            problems.append(_problem("$.webhook", str(exc)))
            hook = None
    webhook, more = _webhook(hook)
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
    raw = _object(body)
    problems = _unknown(raw, frozenset(MapRequest.__struct_fields__), "$")
    problems += _client_fields(raw, "$")
    if problems:
        raise BadRequest(problems)
    request = _convert(raw, MapRequest, problems)
    problems += _check_url(request.url, "$.url")
    if not 1 <= request.limit <= 100_000:
        problems.append(_problem("$.limit", "between 1 and 100000"))
    if request.timeout is not None and request.timeout < 1:
        problems.append(_problem("$.timeout", "milliseconds, at least 1"))
    if request.search is not None and len(request.search) > 1000:
        problems.append(_problem("$.search", "at most 1000 characters"))
    if request.location:
        problems.append(_problem("$.location", "not supported by crawld"))
    if problems:
        raise BadRequest(problems)
    request.url = request.url.strip()
    return request


# -- responses ---------------------------------------------------------------------------------


class StartResponse(msgspec.Struct, kw_only=True, omit_defaults=True):
    success: bool
    id: str
    url: str
    invalidURLs: list[str] | None = None
    warning: str | None = None


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


class TokenUsageData(msgspec.Struct, kw_only=True):
    remainingTokens: int


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
