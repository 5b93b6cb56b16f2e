# `/v2/search` (and `/v1/search`): a Firecrawl search request is validated here with Firecrawl's
# rules, answered by the core search provider (daemon/search), and, when `scrapeOptions` asks for
# formats, each web and news result is scraped through the crawl engine like a `/v2/scrape` (the
# SSRF guard, robots-free as Firecrawl's scrape, the same document formats). One deadline, the
# request's `timeout`, covers the search and its scrapes; a result that cannot be scraped keeps
# its search fields and is named in the answer's `warning`, so one bad page never fails a search.
# Highlights (on unless `highlights: false`) then replace the snippets with passages of the pages
# (daemon/crawl/search/highlights.py).
from __future__ import annotations

import re
import uuid
from typing import Annotated, Any, Literal

import msgspec
import trio
from msgspec import Meta
from prometheus_client import Counter

from daemon.crawl.fetching.fetch import FetchError
from daemon.crawl.options import models
from daemon.crawl.options.models import ScrapeOptions, ScrapeRequest
from daemon.crawl.options.schemas import INTEGRATION, SPACE, UNSUPPORTED, body_model, borrowed
from daemon.crawl.problems import BadRequest, converted, json_object, problem, unknown_keys
from daemon.crawl.runs.service import CrawlService
from daemon.crawl.search.highlights import Highlighter
from daemon.crawl.v1 import models as v1_models
from daemon.crawl.v1.translate import V1_SEARCH_KEYS
from daemon.jsonvalues import deployment_schema
from daemon.logs import get_logger
from daemon.metrics import REGISTRY
from daemon.redact import redact_url
from daemon.search import SearchConfig, SearchError, SearchQuery, SearxngClient
from daemon.search.rules import SOURCES, warnings

log = get_logger("crawl.search")

searches = Counter(
    "crawld_searches",
    "Search requests by outcome (ok, or the error code)",
    ["outcome"],
    registry=REGISTRY,
)

CATEGORIES = frozenset({"github", "research", "pdf", "developer", "gov"})
ALONE_CATEGORIES = frozenset({"developer", "gov"})
"""Categories that cannot be combined with another (Firecrawl's rule: each is its own index)."""
CLOUD_SOURCES = frozenset({"alexandria"})
"""Firecrawl cloud sources crawld accepts beside a web/news/images one and ignores (warning):
firecrawl-mcp with an API key asks for Alexandria, its cloud tool catalogue, on every search."""
MAX_QUERY = 1000
MAX_DOMAINS = 50
MAX_DOMAIN = 253
NOT_CONFIGURED = (
    "search is not configured: set [search] base_url to a SearXNG instance (see config.toml)"
)
NOT_CONFIGURED_STATUS = 501
"""A search on a crawld without [search]: the feature is missing here, the request is not bad
(Firecrawl's self-hosted server answers 501 for a service it is not configured with)."""
DOMAIN = re.compile(
    rf"^[{SPACE}]*(?:[Hh][Tt][Tt][Pp][Ss]?://)?[/.]*[^{SPACE}/.][^{SPACE}/]*/?[{SPACE}]*$"
)
"""A host name as includeDomains/excludeDomains take it: surrounding space, an http(s)://
prefix, leading dots and slashes and one trailing slash allowed."""
Domain = Annotated[str, Meta(max_length=MAX_DOMAIN, extra_json_schema={"pattern": DOMAIN.pattern})]
Domains = Annotated[list[Domain], Meta(max_length=MAX_DOMAINS)]
Limit = Annotated[int, Meta(ge=1, le=100)]


def _named(names: frozenset[str]) -> dict[str, Any]:
    """A list entry naming one of `names`, as a string or as an object's `type`."""
    named = {"enum": sorted(names)}
    return {"anyOf": [named, {"type": "object", "required": ["type"],
                              "properties": {"type": named}}]}  # fmt: skip


SourceName = Annotated[
    str | dict[str, Any],
    Meta(extra_json_schema={"allOf": [_named(frozenset(SOURCES) | CLOUD_SOURCES)]}),
]
CategoryName = Annotated[
    str | dict[str, Any], Meta(extra_json_schema={"allOf": [_named(CATEGORIES)]})
]
Sources = Annotated[list[SourceName], Meta(min_length=1, extra_json_schema={
    "not": {"items": {"not": _named(frozenset(SOURCES))}},
    "description": "web, news or images at least (alexandria beside them: ignored)"})]  # fmt: skip
Categories = Annotated[list[CategoryName], Meta(extra_json_schema={
    "allOf": [{"if": {"contains": _named(frozenset({name}))},
               "then": {"items": _named(frozenset({name}))}}
              for name in sorted(ALONE_CATEGORIES)],
    "description": "developer and gov each alone"})]  # fmt: skip


class SearchScrapeOptions(ScrapeOptions, kw_only=True, forbid_unknown_fields=True):
    """A search's `scrapeOptions`: results are scraped only when `formats` names some."""

    formats: Annotated[
        list[str | dict[str, Any]], Meta(extra_json_schema=deployment_schema("ScrapeFormats"))
    ] = []


class SearchRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The body of POST /v2/search, as Firecrawl's v2 schema has it."""

    query: Annotated[str, Meta(max_length=MAX_QUERY, extra_json_schema={
        "pattern": f"[^{SPACE}]", "description": "not only white space"})]  # fmt: skip
    limit: Limit = 10
    tbs: str | None = None
    filter: str | None = None
    sources: Sources = msgspec.field(default_factory=lambda: ["web"])
    categories: Categories = []
    includeDomains: Domains = []
    excludeDomains: Domains = []
    lang: str = "en"
    country: str | None = None
    location: str | None = None
    safe: bool = False
    timeout: Annotated[int, Meta(ge=1000, le=300_000, description="milliseconds")] = 60_000
    ignoreInvalidURLs: bool = False
    asyncScraping: bool | None = None
    highlights: bool | None = None
    enterprise: Annotated[list[str] | None, UNSUPPORTED] = None
    domainTools: bool | None = None
    toolDetail: Literal["compact", "summary", "full"] | None = None
    """Detail of Alexandria tool matches: accepted, nothing to detail (see CLOUD_SOURCES)."""
    threatProtection: Annotated[dict[str, Any] | None, UNSUPPORTED] = None
    origin: str | None = None
    integration: Annotated[str, Meta(extra_json_schema=INTEGRATION)] | None = None
    scrapeOptions: SearchScrapeOptions | None = None


SearchBody = Annotated[SearchRequest, Meta(extra_json_schema={
    "not": {"required": ["includeDomains", "excludeDomains"],
            "properties": {"includeDomains": {"minItems": 1}, "excludeDomains": {"minItems": 1}}},
    "description": "includeDomains and excludeDomains cannot both be given",
})]  # fmt: skip
V1SearchBody = body_model(
    "V1SearchBody", "The body of POST /v1/search (5 results by default, web only).",
    borrowed(SearchRequest, V1_SEARCH_KEYS - {"limit", "scrapeOptions"},
                       limit=(Limit, 5),
                       scrapeOptions=(v1_models.with_rules(v1_models.V1SearchScrapeOptions
                                                           | None), None)),
)  # fmt: skip


class ParsedSearch(msgspec.Struct, kw_only=True):
    query: SearchQuery
    options: ScrapeOptions | None
    """Scrape options with at least one format; None: results are not scraped."""
    timeout_s: float
    warning: str = ""
    highlights: bool = True
    """Replace web descriptions and news snippets with passages of their pages (Firecrawl's
    default)."""


def _types(values: list[str | dict[str, Any]], path: str, allowed: frozenset[str]) -> tuple[
    list[str], list[dict[str, Any]]
]:  # fmt: skip
    names, problems = [], []
    for i, value in enumerate(values):
        name = value.get("type") if isinstance(value, dict) else value
        if not isinstance(name, str) or name not in allowed:
            expected = " | ".join(sorted(allowed))
            problems.append(problem(f"{path}[{i}]", f"Invalid enum value. Expected {expected}"))
        elif name not in names:
            names.append(name)
    return names, problems


def _domains(values: list[str], path: str) -> tuple[tuple[str, ...], list[dict[str, Any]]]:
    out, problems = [], []
    for i, value in enumerate(values):
        if not DOMAIN.match(value):
            problems.append(problem(f"{path}[{i}]", "a host name such as example.com"))
            continue
        host = value.strip().lower()
        out.append(host.removeprefix("https://").removeprefix("http://").strip("/."))
    return tuple(out), problems


def parse_search(
    body: bytes,
    *,
    browser: bool = False,
    default_lang: str = "en",
    llm: Any = None,
    stealth: bool = False,
) -> ParsedSearch:
    """A validated search; BadRequest naming every problem (Firecrawl's 400)."""
    raw = json_object(body)
    problems = unknown_keys(raw, frozenset(SearchRequest.__struct_fields__), "$")
    problems += models.client_field_problems(raw, "$")
    nested = raw.get("scrapeOptions")
    if isinstance(nested, dict):
        problems += unknown_keys(nested, models.SCRAPE_KEYS, "$.scrapeOptions")
        problems += models.client_field_problems(nested, "$.scrapeOptions")
    if problems:
        raise BadRequest(problems)
    request = converted(raw, SearchRequest, problems)
    if not request.query.strip():
        problems.append(problem("$.query", "must not be empty"))
    sources, more = _types(request.sources, "$.sources", frozenset(SOURCES) | CLOUD_SOURCES)
    problems += more
    cloud = [s for s in sources if s in CLOUD_SOURCES]
    sources = [s for s in sources if s not in CLOUD_SOURCES]
    if not sources and not more:
        problems.append(_no_searchable_source(request.sources))
    categories, more = _types(request.categories, "$.categories", CATEGORIES)
    problems += more
    if len(categories) > 1 and (alone := ALONE_CATEGORIES.intersection(categories)):
        name = sorted(alone)[0]
        problems.append(problem("$.categories", f"{name!r} cannot be combined with other"
                                " categories"))  # fmt: skip
    include, more = _domains(request.includeDomains, "$.includeDomains")
    problems += more
    exclude, more = _domains(request.excludeDomains, "$.excludeDomains")
    problems += more
    if include and exclude:
        both = "includeDomains and excludeDomains cannot both be given"
        problems.append(problem("$.includeDomains", both))
    if request.enterprise:
        problems.append(problem("$.enterprise", "enterprise search is not offered by crawld"))
    if request.threatProtection:
        problems.append(problem("$.threatProtection", "not supported by crawld"))
    options, more, warning = _scrape_options(request.scrapeOptions, browser, llm, stealth)
    problems += more
    if problems:
        raise BadRequest(problems)
    query = SearchQuery(
        query=request.query.strip(), sources=tuple(sources), limit=request.limit,
        lang=request.lang or default_lang, country=request.country, tbs=request.tbs,
        safe=request.safe, include_domains=include, exclude_domains=exclude,
        categories=tuple(categories), location=request.location,
    )  # fmt: skip
    said = [*warnings(query), *([warning] if warning else [])]
    if ignored := _cloud_warning(cloud, bool(request.domainTools)):
        said.append(ignored)
    if request.filter:
        said.append("filter is not sent to SearXNG: ignored")
    return ParsedSearch(query=query, options=options, timeout_s=request.timeout / 1000,
                        warning=" ".join(said),
                        highlights=request.highlights is not False)  # fmt: skip


def _no_searchable_source(values: list[str | dict[str, Any]]) -> dict[str, Any]:
    """The problem of a search whose sources are only cloud ones (or none)."""
    for i, value in enumerate(values):
        name = value.get("type") if isinstance(value, dict) else value
        if name in CLOUD_SOURCES:
            return problem(f"$.sources[{i}]", f"{name} is Firecrawl's cloud tool catalogue, not"
                           " served by crawld: give web, news or images (beside one of them,"
                           f" {name} is ignored)")  # fmt: skip
    return problem("$.sources", "at least one of web, news, images")


def _cloud_warning(cloud: list[str], domain_tools: bool) -> str:
    """What a search asked of Firecrawl's cloud catalogue and got nothing for."""
    asked = [f"source {name!r}" for name in cloud] + (["domainTools"] if domain_tools else [])
    if not asked:
        return ""
    verb = "are" if len(asked) > 1 else "is"
    return (f"Firecrawl's cloud tool catalogue (Alexandria) is not served by crawld:"
            f" {' and '.join(asked)} {verb} ignored and the answer has no `tools`")  # fmt: skip


def _scrape_options(
    options: ScrapeOptions | None, browser: bool, llm: Any = None, stealth: bool = False
) -> tuple[ScrapeOptions | None, list[dict[str, Any]], str]:
    if options is None:
        return None, [], ""
    more, warning = models.check_scrape_options(
        options, "$.scrapeOptions", browser=browser, llm=llm, stealth=stealth
    )
    if more:
        return None, more, ""
    return (options if options.formats else None), [], warning


class SearchService:
    """Answers searches with the configured provider, scraping results through `crawl`."""

    def __init__(self, crawl: CrawlService, config: SearchConfig) -> None:
        self.crawl = crawl
        self.config = config
        self.client: SearxngClient | None = SearxngClient(config) if config.enabled else None
        self.counts = {"ok": 0, "failed": 0, "results": 0, "scraped": 0, "scrape_failed": 0}
        self.highlighter = Highlighter(crawl, config)

    def configure(self, config: SearchConfig) -> None:
        """A reload: searches started from now on use `config`."""
        self.config = config
        self.client = SearxngClient(config) if config.enabled else None
        self.highlighter.config = config

    @property
    def enabled(self) -> bool:
        return self.client is not None

    async def search(self, parsed: ParsedSearch) -> dict[str, Any]:
        """Firecrawl's `{success, data: {web?, news?, images?}, creditsUsed, id, warning?}`;
        SearchError when the provider fails or the deadline passes before it answers."""
        deadline = trio.current_time() + parsed.timeout_s
        try:
            if self.client is None:
                raise SearchError("SEARCH_NOT_CONFIGURED", NOT_CONFIGURED, NOT_CONFIGURED_STATUS)
            data = await self.client.search(parsed.query, timeout_s=parsed.timeout_s)
        except SearchError as exc:
            self.counts["failed"] += 1
            searches.labels(exc.code).inc()
            raise
        said = [parsed.warning] if parsed.warning else []
        options, added = parsed.options, False
        if parsed.highlights:
            options, added = _with_markdown(parsed.options)
        if options is not None:
            failed = await self._scrape_all(data, options, deadline)
            if failed:
                listed = "; ".join(failed[:5])
                said.append(f"{len(failed)} result(s) could not be scraped: {listed}")
        if parsed.highlights and options is not None:
            await self.highlighter.from_scraped(data, parsed.query.query)
        elif parsed.highlights:
            await self.highlighter.by_reading(data, parsed.query.query, deadline)
        if added:
            for items in data.values():
                for item in items:
                    item.pop("markdown", None)
        self.counts["ok"] += 1
        self.counts["results"] += sum(len(items) for items in data.values())
        searches.labels("ok").inc()
        answer: dict[str, Any] = {"success": True, "data": data, "creditsUsed": 0,
                                  "id": str(uuid.uuid4())}  # fmt: skip
        if said:
            answer["warning"] = " ".join(said)
        return answer

    async def _scrape_all(
        self, data: dict[str, list[dict[str, Any]]], options: ScrapeOptions, deadline: float
    ) -> list[str]:
        items = [item for source in ("web", "news") for item in data.get(source, [])]
        failed: list[str] = []
        limiter = trio.CapacityLimiter(self.config.scrape_concurrency)

        async def one(item: dict[str, Any]) -> None:
            async with limiter:
                try:
                    document = await self.crawl.scrape(ScrapeRequest(url=item["url"],
                                                                     options=options))  # fmt: skip
                except FetchError as exc:
                    self.counts["scrape_failed"] += 1
                    failed.append(f"{redact_url(item['url'])}: {exc.code}")
                    return
                self.counts["scraped"] += 1
                item.update(document)

        with trio.move_on_at(deadline) as scope:
            async with trio.open_nursery() as nursery:
                for item in items:
                    nursery.start_soon(one, item)
        if scope.cancelled_caught:
            done = sum(1 for item in items if "metadata" in item)
            failed.append(f"the request's timeout passed with {len(items) - done} not scraped")
        return failed

    def status(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "provider": self.config.provider,
            "base_url": redact_url(self.config.base_url) if self.enabled else None,
            "highlights": self.config.highlights,
            **self.counts,
            **self.highlighter.counts,
        }


def _with_markdown(options: ScrapeOptions | None) -> tuple[ScrapeOptions | None, bool]:
    """Scrape options that also give markdown (what highlights read), and whether it was added
    (then it is dropped from the results after)."""
    if options is None:
        return None, False
    names = {f if isinstance(f, str) else f.get("type") for f in options.formats}
    if "markdown" in names:
        return options, False
    return msgspec.structs.replace(options, formats=[*options.formats, "markdown"]), True
