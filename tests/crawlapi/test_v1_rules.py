"""v1 request bodies rewritten into the v2 bodies they mean (daemon/crawl/v1/translate.py), plain values."""

from __future__ import annotations

from daemon.crawl.fetching.urls import CrawlScope
from daemon.crawl.v1 import translate as v1


def test_scrape_options_become_v2() -> None:
    body, problems = v1.scrape_body({
        "url": "https://a.test/", "formats": ["markdown", "extract", "screenshot@fullPage"],
        "extract": {"schema": {"type": "object"}, "prompt": "p", "systemPrompt": ""},
        "parsePDF": False, "geolocation": {"country": "de"}, "origin": "api",
    })  # fmt: skip
    assert problems == []
    assert body == {
        "url": "https://a.test/", "origin": "api",
        "formats": ["markdown", {"type": "json", "schema": {"type": "object"}, "prompt": "p"},
                    "screenshot@fullPage"],
        "parsers": [], "location": {"country": "DE"}, "maxAge": 0,
    }  # fmt: skip


def test_extract_and_json_need_their_options_and_vice_versa() -> None:
    for raw in ({"formats": ["json"]}, {"formats": ["markdown"], "jsonOptions": {}},
                {"formats": ["extract"], "jsonOptions": {"prompt": "p"}}):  # fmt: skip
        _, problems = v1.scrape_body({"url": "https://a.test/", **raw})
        assert [p["message"] for p in problems] == [v1.PAIRING], raw


def test_unknown_keys_and_formats_are_named() -> None:
    _, problems = v1.scrape_body({"url": "u", "formats": ["markdown", "branding"], "maxDepth": 1,
                                  "agent": {"model": "x"}})  # fmt: skip
    paths = {p["path"] for p in problems}
    assert paths == {"$.maxDepth", "$.formats[1]", "$.agent"}


def test_change_tracking_carries_its_options() -> None:
    body, problems = v1.scrape_body({"url": "u", "formats": ["markdown", "changeTracking"],
                                     "changeTrackingOptions": {"modes": ["git-diff"],
                                                               "tag": "t"}})  # fmt: skip
    assert problems == []
    assert body["formats"][1] == {"type": "changeTracking", "modes": ["git-diff"], "tag": "t"}


def test_crawl_body() -> None:
    body, depth, problems = v1.crawl_body({
        "url": "https://a.test/docs/", "maxDepth": 3, "allowBackwardLinks": True,
        "ignoreSitemap": True, "limit": 5,
        "scrapeOptions": {"formats": ["markdown", "links"], "parsePDF": True},
    })  # fmt: skip
    assert (depth, problems) == (3, [])
    assert body == {"url": "https://a.test/docs/", "limit": 5, "crawlEntireDomain": True,
                    "sitemap": "skip",
                    "scrapeOptions": {"formats": ["markdown", "links"], "maxAge": 0}}  # fmt: skip
    body, depth, _ = v1.crawl_body({"url": "https://a.test/", "allowBackwardLinks": True,
                                    "crawlEntireDomain": False})  # fmt: skip
    assert body["crawlEntireDomain"] is False and body["sitemap"] == "include" and depth == 10
    _, _, problems = v1.crawl_body({"url": "https://a.test/a/b/c", "maxDepth": 2})
    assert problems == [{"path": "$.url", "message": "URL depth exceeds the specified maxDepth"}]
    _, _, problems = v1.crawl_body({"url": "https://a.test/", "maxDepth": -1, "bogus": 1,
                                    "scrapeOptions": {"nope": 1}})  # fmt: skip
    assert {p["path"] for p in problems} == {"$.maxDepth", "$.bogus", "$.scrapeOptions.nope"}


def test_scope_refuses_links_deeper_than_max_depth() -> None:
    scope = CrawlScope(start_url="https://a.test/", crawl_entire_domain=True, max_url_depth=2)
    assert scope.refusal("https://a.test/x/y") is None
    assert scope.refusal("https://a.test/x/y/z") == "URL depth exceeds the specified maxDepth"
    assert v1.url_depth("https://a.test/x//y/") == 2 and v1.url_depth("nonsense") == 0


def test_map_body() -> None:
    assert v1.map_body({"url": "u", "sitemapOnly": True, "ignoreSitemap": True}) == (
        {"url": "u", "sitemap": "only"},
        [],
    )
    assert v1.map_body({"url": "u", "ignoreSitemap": True})[0]["sitemap"] == "skip"
    assert v1.map_body({"url": "u"})[0] == {"url": "u"}
    _, problems = v1.map_body({"url": "u", "limit": 30_001, "ignoreSitemap": "yes"})
    assert {p["path"] for p in problems} == {"$.limit", "$.ignoreSitemap"}


def test_search_body() -> None:
    body, problems = v1.search_body({"query": "q", "lang": "en", "country": "us",
                                     "origin": "api", "timeout": 60000,
                                     "scrapeOptions": {"formats": ["markdown"]}})  # fmt: skip
    assert problems == []
    assert body == {"query": "q", "lang": "en", "country": "us", "origin": "api",
                    "timeout": 60000, "limit": 5, "highlights": False,  # v1 has none
                    "scrapeOptions": {"formats": ["markdown"], "maxAge": 0}}  # fmt: skip
    assert v1.search_body({"query": "q", "scrapeOptions": {}})[0]["scrapeOptions"] == {
        "formats": [],
        "maxAge": 0,
    }


def test_v1_document_puts_extract_under_its_key() -> None:
    doc = {"markdown": "m", "json": {"a": 1}}
    assert v1.v1_document(doc, ["markdown", "extract"]) == {"markdown": "m", "extract": {"a": 1}}
    assert v1.v1_document(doc, ["json"]) == doc
