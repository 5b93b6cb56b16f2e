# The bodies of Firecrawl's v1 routes as models: the keys each takes (translate.py reads its key
# sets from here) and their rules, for /openapi.json. A v1 body is rewritten into the v2 body it
# means and checked by the v2 parsers, so a v1 field that passes through is the v2 model's field
# (`borrowed`: its type, rules and default); what is v1's own (formats as names, `extract` and
# `jsonOptions` beside their format, `maxDepth`, `ignoreSitemap`, `sitemapOnly`, `parsePDF`) is
# declared here. The rules that depend on the config (an [llm] for extract/json, a browser for
# screenshots) and those between fields are the deployment schemas of `v1_schemas`.
from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from daemon.crawl.options.models import BatchFields, CrawlRequest, MapRequest, ScrapeBody
from daemon.crawl.options.schemas import (
    JSON_SCHEMA,
    MAX_SAFE_INTEGER,
    UNSUPPORTED,
    body_model,
    borrowed,
    nullable,
)
from daemon.crawl.options.scrape_options import Location, ScrapeOptions
from daemon.crawl.tracking import changes as tracking
from daemon.jsonvalues import deployment_schema
from daemon.llm import rules as llm_rules

DEFAULT_MAX_DEPTH = 10
V1_MAX_MAP_LIMIT = 30_000
SCREENSHOT_FORMATS = ("screenshot", "screenshot@fullPage")
LLM_FORMATS = ("extract", "json")
V1_FORMATS = frozenset(("markdown", "html", "rawHtml", "links", "changeTracking",
                        *SCREENSHOT_FORMATS, *LLM_FORMATS))  # fmt: skip
CLIENT_KEYS = ("origin", "integration")
_MODEL_OPTIONS = {"properties": {
    "schema": nullable(JSON_SCHEMA),
    "prompt": nullable({"type": "string", "maxLength": llm_rules.MAX_PROMPT}),
}}  # fmt: skip
"""`extract` / `jsonOptions`: the model's schema and prompt (other keys are not read)."""
_BORROWED_SCRAPE_OPTIONS = (
    "onlyMainContent", "includeTags", "excludeTags", "headers", "waitFor", "mobile",
    "skipTlsVerification", "timeout", "actions", "location", "removeBase64Images", "blockAds",
    "proxy", "maxAge", "storeInCache", "fastMode", "useMock",
)  # fmt: skip


def _formats(default: list[str]) -> tuple[Any, Any]:
    kind = Annotated[list[str], Meta(extra_json_schema=deployment_schema("V1ScrapeFormats"))]
    return kind, msgspec.field(default_factory=lambda: list(default))


def marked(model: Any, name: str) -> Any:
    """`model` marked with deployment schema `name` (rules across its fields)."""
    return Annotated[model, Meta(extra_json_schema=deployment_schema(name))]


def with_rules(model: Any, **more: Any) -> Any:
    """`model` with the rules between the v1 scrape options (and `more` JSON schema) declared
    on it. Mark `X | None` as a whole: msgspec drops a Meta put on a struct inside a union."""
    return Annotated[model, Meta(extra_json_schema={
        **deployment_schema("V1ScrapeRules"), **more})]  # fmt: skip


_OWN_SCRAPE_OPTIONS: dict[str, tuple[Any, Any]] = {
    "parsePDF": (bool, True),
    "jsonOptions": (Annotated[dict[str, Any], Meta(extra_json_schema=_MODEL_OPTIONS)] | None, None),
    "extract": (Annotated[dict[str, Any], Meta(extra_json_schema=_MODEL_OPTIONS)] | None, None),
    "changeTrackingOptions": (Annotated[Any, Meta(
        description="read with the changeTracking format only, as its options")], None),
    "geolocation": (Annotated[Any, Meta(
        description="v1's older name of `location`: read when it is an object")], None),
    "agent": (Annotated[Any, UNSUPPORTED], None),
}  # fmt: skip
V1ScrapeOptions = body_model(
    "V1ScrapeOptions",
    "v1's scrape options: top level of /v1/scrape and /v1/batch/scrape, `scrapeOptions` of a v1"
    " crawl or extract.",
    borrowed(ScrapeOptions, _BORROWED_SCRAPE_OPTIONS, formats=_formats(["markdown"]),
             **_OWN_SCRAPE_OPTIONS),
)  # fmt: skip
V1SearchScrapeOptions = body_model(
    "V1SearchScrapeOptions", "A v1 search's `scrapeOptions`: results are scraped when `formats`"
    " names some.",
    borrowed(ScrapeOptions, _BORROWED_SCRAPE_OPTIONS, formats=_formats([]),
             **_OWN_SCRAPE_OPTIONS),
)  # fmt: skip
SCRAPE_OPTION_KEYS = frozenset(V1ScrapeOptions.__struct_fields__)

V1ScrapeBody = body_model(
    "V1ScrapeBody", "The body of POST /v1/scrape.",
    borrowed(ScrapeBody, ("url", "zeroDataRetention", *CLIENT_KEYS)), (V1ScrapeOptions,),
)  # fmt: skip
V1BatchBody = body_model(
    "V1BatchBody", "The body of POST /v1/batch/scrape.",
    borrowed(BatchFields, ("urls", "webhook", "maxConcurrency", "appendToId", "ignoreInvalidURLs",
                           "zeroDataRetention", *CLIENT_KEYS)),
    (V1ScrapeOptions,),
)  # fmt: skip
V1CrawlBody = body_model(
    "V1CrawlBody", "The body of POST /v1/crawl.",
    borrowed(CrawlRequest, (
        "url", "includePaths", "excludePaths", "maxDiscoveryDepth", "limit", "crawlEntireDomain",
        "allowExternalLinks", "allowSubdomains", "ignoreRobotsTxt", "deduplicateSimilarURLs",
        "ignoreQueryParameters", "regexOnFullURL", "delay", "webhook", "maxConcurrency",
        "zeroDataRetention", *CLIENT_KEYS),
        maxDepth=(Annotated[int, Meta(ge=0, le=MAX_SAFE_INTEGER, description=(
            "the most path segments a followed link (and `url` itself) may have"))],
            DEFAULT_MAX_DEPTH),
        allowBackwardLinks=(bool, False), ignoreSitemap=(bool, False),
        scrapeOptions=(with_rules(V1ScrapeOptions | None), None)),
)  # fmt: skip
V1MapBody = body_model(
    "V1MapBody", "The body of POST /v1/map (v1 allows at most 30,000 links).",
    borrowed(MapRequest, ("url", "search", "includeSubdomains", "ignoreQueryParameters",
                          "timeout", "useIndex", "location", *CLIENT_KEYS),
             ignoreSitemap=(bool, False), sitemapOnly=(bool, False),
             limit=(Annotated[int, Meta(ge=1, le=V1_MAX_MAP_LIMIT)], 5000)),
)  # fmt: skip


def _names(*names: str) -> dict[str, Any]:
    return {"contains": {"enum": list(names)}}


def _paired(option: str, fmt: str) -> list[dict[str, Any]]:
    """`option` (an object) is given exactly when `formats` names `fmt`."""
    given = {"required": [option], "properties": {option: {"type": "object"}}}
    named = {"required": ["formats"], "properties": {"formats": _names(fmt)}}
    return [{"if": named, "then": given}, {"if": given, "then": named}]


def v1_schemas(*, browser: bool, providers: Sequence[str]) -> dict[str, Any]:
    """`V1ScrapeFormats`, and `V1ScrapeRules` (the rules between v1 scrape options), as a
    deployment with (or without) a browser and these `[llm]` providers serves them."""
    names = ["markdown", "html", "rawHtml", "links", "changeTracking"]
    names += list(LLM_FORMATS) if providers else []
    names += list(SCREENSHOT_FORMATS) if browser else []
    modes = ["git-diff", "json"] if providers else ["git-diff"]
    tracked = {"type": "object", "additionalProperties": False, "properties": {
        "type": {}, "modes": {"type": "array", "items": {"enum": modes}},
        "schema": nullable(JSON_SCHEMA),
        "prompt": nullable({"type": "string", "maxLength": llm_rules.MAX_PROMPT}),
        "tag": nullable({"type": "string", "maxLength": tracking.MAX_TAG})}}  # fmt: skip
    rules: list[dict[str, Any]] = [
        *_paired("extract", "extract"), *_paired("jsonOptions", "json"),
        {"if": {"required": ["formats"], "properties": {"formats": _names("changeTracking")}},
         "then": {"required": ["formats"], "properties": {
             "formats": _names("markdown"),
             "changeTrackingOptions": {"anyOf": [{"not": {"type": "object"}}, tracked]}}}},
        {"if": {"not": {"required": ["location"]}},
         "then": {"properties": {"geolocation": {"anyOf": [
             {"not": {"type": "object"}}, msgspec.json.schema(Location)]}}}},
    ]  # fmt: skip
    formats: dict[str, Any] = {"type": "array", "items": {"enum": names}}
    if browser:
        shot = {"enum": list(SCREENSHOT_FORMATS)}
        formats["anyOf"] = [{"not": {"contains": shot}}, {"contains": shot, "maxContains": 1}]
    described = ("extract (jsonOptions) is given exactly with the extract (json) format;"
                 " changeTracking needs markdown")  # fmt: skip
    return {"V1ScrapeFormats": formats,
            "V1ScrapeRules": {"allOf": rules, "description": described}}  # fmt: skip
