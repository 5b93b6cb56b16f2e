# Firecrawl's v1 API, served on the v2 engine: each v1 request body is checked against v1's own
# keys (strict, as Firecrawl's v1 schemas are), then rewritten into the v2 body it means and
# handed to the v2 parsers, so there is one set of rules and one engine. What v1 has and v2 does
# not is carried beside the plan (a crawl's `maxDepth`, the `extract` format's key in the
# answer). Pure functions over plain dicts: tested with plain values.
from __future__ import annotations

from typing import Any

from daemon.crawl.fetching.urls import parse_http_url
from daemon.crawl.options.schemas import MAX_SAFE_INTEGER
from daemon.crawl.problems import problem, unknown_keys
from daemon.crawl.v1 import models

Problems = list[dict[str, Any]]

V1_SCRAPE_OPTIONS = models.SCRAPE_OPTION_KEYS
CLIENT_KEYS = frozenset(models.CLIENT_KEYS)
V1_SCRAPE_TOP = frozenset(models.V1ScrapeBody.__struct_fields__) - V1_SCRAPE_OPTIONS
V1_CRAWL_KEYS = frozenset(models.V1CrawlBody.__struct_fields__)
V1_BATCH_TOP = frozenset(models.V1BatchBody.__struct_fields__) - V1_SCRAPE_OPTIONS
V1_MAP_KEYS = frozenset(models.V1MapBody.__struct_fields__)
V1_SEARCH_KEYS = CLIENT_KEYS | {"query", "limit", "tbs", "filter", "lang", "country", "location",
                               "timeout", "ignoreInvalidURLs", "scrapeOptions"}  # fmt: skip
"""The keys of POST /v1/search (its model is the search room's: V1SearchBody)."""
V1_FORMATS = models.V1_FORMATS
DEFAULT_MAX_DEPTH = models.DEFAULT_MAX_DEPTH
PAIRING = ("When 'extract' or 'json' format is specified, corresponding options must be provided,"
           " and vice versa")  # fmt: skip


def scrape_options(raw: dict[str, Any], path: str, *, default_formats: list[str] | None = None
                   ) -> tuple[dict[str, Any], Problems]:  # fmt: skip
    """v1 scrape options (top level of /v1/scrape and /v1/batch/scrape, a crawl's or a search's
    `scrapeOptions`) as the v2 options they mean; problems name v1's fields."""
    problems: Problems = []
    out = {k: v for k, v in raw.items() if k in V1_SCRAPE_OPTIONS}
    formats = out.pop("formats", default_formats if default_formats is not None else ["markdown"])
    extract, json_options = out.pop("extract", None), out.pop("jsonOptions", None)
    tracking = out.pop("changeTrackingOptions", None)
    if not isinstance(formats, list):
        return {}, [problem(f"{path}.formats", "a list of format names")]
    v2_formats: list[Any] = []
    for i, name in enumerate(formats):
        if not isinstance(name, str) or name not in V1_FORMATS:
            expected = " | ".join(f"'{f}'" for f in sorted(V1_FORMATS))
            problems.append(problem(f"{path}.formats[{i}]",
                                     f"Invalid enum value. Expected {expected}"))  # fmt: skip
        elif name in ("extract", "json"):
            options = extract if name == "extract" else json_options
            if isinstance(options, dict):
                v2_formats.append({"type": "json", **{k: options[k] for k in ("schema", "prompt")
                                                      if options.get(k) is not None}})  # fmt: skip
        elif name == "changeTracking":
            v2_formats.append({**(tracking if isinstance(tracking, dict) else {}),
                               "type": "changeTracking"})  # fmt: skip
        else:
            v2_formats.append(name)
    names = {f for f in formats if isinstance(f, str)}
    if ("extract" in names) != (extract is not None) or ("json" in names) != (
        json_options is not None
    ):
        problems.append(problem(f"{path}.formats", PAIRING))
    for key, value in (("extract", extract), ("jsonOptions", json_options)):
        if value is not None and not isinstance(value, dict):
            problems.append(problem(f"{path}.{key}", "an object {schema?, prompt?}"))
    if out.pop("agent", None):
        problems.append(problem(f"{path}.agent", "agent is not supported by crawld"))
    parse_pdf = out.pop("parsePDF", True)
    if not isinstance(parse_pdf, bool):
        problems.append(problem(f"{path}.parsePDF", "must be a boolean"))
    elif not parse_pdf:
        out["parsers"] = []
    geolocation = out.pop("geolocation", None)
    location = out.get("location", geolocation)
    if isinstance(location, dict):
        country = location.get("country")
        out["location"] = {**location, **({"country": country.upper()}
                                          if isinstance(country, str) else {})}  # fmt: skip
    out["formats"] = v2_formats
    out.setdefault("maxAge", 0)  # v1 reads no cached copy unless asked (Firecrawl's v1 default)
    return out, problems


def scrape_body(raw: dict[str, Any]) -> tuple[dict[str, Any], Problems]:
    """POST /v1/scrape as the v2 /v2/scrape body."""
    problems = unknown_keys(raw, V1_SCRAPE_OPTIONS | V1_SCRAPE_TOP, "$")
    options, more = scrape_options(raw, "$")
    top = {k: raw[k] for k in V1_SCRAPE_TOP if k in raw}
    return {**top, **options}, problems + more


def url_depth(url: str) -> int:
    """Firecrawl's URL depth: the number of non-empty path segments."""
    parsed = parse_http_url(url)
    if parsed is None:
        return 0
    return len([s for s in parsed.raw_path.split("/") if s])


def crawl_body(raw: dict[str, Any]) -> tuple[dict[str, Any], int, Problems]:
    """POST /v1/crawl as the v2 /v2/crawl body, and the crawl's maxDepth."""
    problems = unknown_keys(raw, V1_CRAWL_KEYS, "$")
    passed = V1_CRAWL_KEYS - {"maxDepth", "allowBackwardLinks", "ignoreSitemap"}
    body = {k: v for k, v in raw.items() if k in passed}
    max_depth = raw.get("maxDepth", DEFAULT_MAX_DEPTH)
    if type(max_depth) is not int or not 0 <= max_depth <= MAX_SAFE_INTEGER:
        problems.append(problem("$.maxDepth", f"an integer between 0 and {MAX_SAFE_INTEGER}"))
        max_depth = DEFAULT_MAX_DEPTH
    elif isinstance(raw.get("url"), str) and url_depth(raw["url"]) > max_depth:
        problems.append(problem("$.url", "URL depth exceeds the specified maxDepth"))
    if "crawlEntireDomain" not in raw and "allowBackwardLinks" in raw:
        body["crawlEntireDomain"] = raw["allowBackwardLinks"]
    for key in ("ignoreSitemap", "allowBackwardLinks"):
        if not isinstance(raw.get(key, False), bool):
            problems.append(problem(f"$.{key}", "must be a boolean"))
    ignore_sitemap = raw.get("ignoreSitemap", False)
    body["sitemap"] = "skip" if ignore_sitemap is True else "include"
    nested = raw.get("scrapeOptions")
    if isinstance(nested, dict):
        more = unknown_keys(nested, V1_SCRAPE_OPTIONS, "$.scrapeOptions")
        body["scrapeOptions"], extra = scrape_options(nested, "$.scrapeOptions")
        problems += more + extra
    return body, max_depth, problems


def batch_body(raw: dict[str, Any]) -> tuple[dict[str, Any], Problems]:
    """POST /v1/batch/scrape as the v2 /v2/batch/scrape body."""
    problems = unknown_keys(raw, V1_SCRAPE_OPTIONS | V1_BATCH_TOP, "$")
    options, more = scrape_options(raw, "$")
    top = {k: raw[k] for k in V1_BATCH_TOP if k in raw}
    return {**top, **options}, problems + more


def map_body(raw: dict[str, Any]) -> tuple[dict[str, Any], Problems]:
    """POST /v1/map as the v2 /v2/map body (v1 allows at most 30,000 links)."""
    problems = unknown_keys(raw, V1_MAP_KEYS, "$")
    body = {k: v for k, v in raw.items() if k in V1_MAP_KEYS - {"ignoreSitemap", "sitemapOnly"}}
    if raw.get("sitemapOnly") is True:
        body["sitemap"] = "only"
    elif raw.get("ignoreSitemap") is True:
        body["sitemap"] = "skip"
    for key in ("ignoreSitemap", "sitemapOnly"):
        if key in raw and not isinstance(raw[key], bool):
            problems.append(problem(f"$.{key}", "must be a boolean"))
    limit = raw.get("limit", 5000)
    if type(limit) is not int or not 1 <= limit <= models.V1_MAX_MAP_LIMIT:
        problems.append(problem("$.limit", f"an integer between 1 and {models.V1_MAX_MAP_LIMIT}"))
    return body, problems


def search_body(raw: dict[str, Any]) -> tuple[dict[str, Any], Problems]:
    """POST /v1/search as the v2 /v2/search body (v1: `limit` defaults to 5, web only, the
    provider's snippets: v1 has no highlights)."""
    problems = unknown_keys(raw, V1_SEARCH_KEYS, "$")
    body = {k: v for k, v in raw.items() if k in V1_SEARCH_KEYS - {"scrapeOptions"}}
    body.setdefault("limit", 5)
    body["highlights"] = False
    nested = raw.get("scrapeOptions")
    if isinstance(nested, dict):
        problems += unknown_keys(nested, V1_SCRAPE_OPTIONS, "$.scrapeOptions")
        body["scrapeOptions"], more = scrape_options(nested, "$.scrapeOptions", default_formats=[])
        problems += more
    elif nested is not None:
        problems.append(problem("$.scrapeOptions", "an object"))
    return body, problems


def v1_document(document: dict[str, Any], formats: list[Any]) -> dict[str, Any]:
    """A v2 document in v1's shape: the `extract` format's result under `extract`."""
    if "extract" in formats and "json" not in formats and "json" in document:
        document = dict(document)
        document["extract"] = document.pop("json")
    return document
