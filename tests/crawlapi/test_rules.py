"""The pure crawl rules and request models, as tables."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from daemon.crawl.fetching.urls import CrawlScope
from daemon.crawl.options import models, rules
from daemon.crawl.options.batch import batch_candidates

SCOPE = CrawlScope(start_url="http://site.test/docs/")
POLICY = rules.LinkPolicy()


def admit(links: list[str], depth: int = 0, policy: rules.LinkPolicy = POLICY,
          blocked: tuple[str, ...] = ()) -> rules.Admission:  # fmt: skip
    return rules.admit_links(links, depth, policy, SCOPE.refusal,
                             lambda u: not any(b in u for b in blocked))  # fmt: skip


def test_links_are_scoped_deduplicated_and_one_deeper() -> None:
    got = admit([
        "http://site.test/docs/a", "http://www.site.test/docs/a/", "http://site.test/docs/a#x",
        "http://site.test/blog/b", "http://other.test/docs/c", "http://site.test/docs/i.png",
        "http://site.test/docs/b?q=1", "http://site.test/docs/b?q=2",
    ], depth=3)  # fmt: skip
    assert got.candidates == [
        ("//site.test/docs/a", "http://site.test/docs/a", 4),
        ("//site.test/docs/b?q=1", "http://site.test/docs/b?q=1", 4),
        ("//site.test/docs/b?q=2", "http://site.test/docs/b?q=2", 4),
    ]
    assert got.robots_blocked == []


@pytest.mark.parametrize(
    ("policy", "depth", "count"),
    [
        (rules.LinkPolicy(), 5, 2),
        (rules.LinkPolicy(max_depth=2), 1, 2),
        (rules.LinkPolicy(max_depth=2), 2, 0),
        (rules.LinkPolicy(max_depth=0), 0, 0),
        (rules.LinkPolicy(follow_links=False), 0, 0),
        (rules.LinkPolicy(ignore_query=True), 0, 1),
    ],
)
def test_depth_and_following(policy: rules.LinkPolicy, depth: int, count: int) -> None:
    links = ["http://site.test/docs/x?a=1", "http://site.test/docs/x?a=2"]
    assert len(admit(links, depth, policy).candidates) == count


def test_robots_blocked_links_are_reported_not_admitted() -> None:
    got = admit(["http://site.test/docs/private/x", "http://site.test/docs/ok"],
                blocked=("/private/",))  # fmt: skip
    assert [c[1] for c in got.candidates] == ["http://site.test/docs/ok"]
    assert got.robots_blocked == ["http://site.test/docs/private/x"]


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({"max_concurrency": None, "delay": None, "robots_delay": None}, (16, None)),
        ({"max_concurrency": 3, "delay": None, "robots_delay": None}, (3, None)),
        ({"max_concurrency": 99, "delay": None, "robots_delay": None}, (16, None)),
        ({"max_concurrency": 8, "delay": 2.0, "robots_delay": 5.0}, (1, 2.0)),
        ({"max_concurrency": 8, "delay": None, "robots_delay": 5.0}, (1, 5.0)),
        (
            {"max_concurrency": 8, "delay": None, "robots_delay": 5.0, "ignore_robots": True},
            (8, None),
        ),
    ],
)
def test_fetch_pacing(kw: dict[str, Any], expected: tuple[int, float | None]) -> None:
    kw.setdefault("ignore_robots", False)
    assert rules.fetch_pacing(global_concurrency=16, **kw) == expected


def test_map_links() -> None:
    found = [
        "http://site.test/", "http://www.site.test/a", "http://site.test/a/", "http://site.test/b?x=1",
        "http://blog.site.test/p", "http://other.test/", "mailto:x@site.test", "http://site.test/b#f",
    ]  # fmt: skip
    assert rules.map_links("http://site.test/", found, include_subdomains=True, ignore_query=True,
                           search=None, limit=10) == [
        "http://site.test/", "http://www.site.test/a", "http://site.test/b",
        "http://blog.site.test/p",
    ]  # fmt: skip
    assert rules.map_links("http://site.test/", found, include_subdomains=False,
                           ignore_query=False, search=None, limit=10) == [
        "http://site.test/", "http://www.site.test/a", "http://site.test/b?x=1",
        "http://site.test/b",
    ]  # fmt: skip
    assert rules.map_links("http://site.test/", found, include_subdomains=True, ignore_query=True,
                           search="blog p", limit=10)[0] == "http://blog.site.test/p"  # fmt: skip
    assert len(rules.map_links("http://site.test/", found, include_subdomains=True,
                               ignore_query=True, search=None, limit=2)) == 2  # fmt: skip


def test_batch_rows_are_keyed_by_position() -> None:
    assert batch_candidates(["http://a/", "http://a/"], 3) == [
        ("#3", "http://a/", 0), ("#4", "http://a/", 0)
    ]  # fmt: skip


def test_crawl_request_defaults_match_the_sync_sdk() -> None:
    plan = models.parse_crawl(b'{"url": " http://site.test/ ", "origin": "python-sdk@4.55.0"}',
                              default_limit=10_000)  # fmt: skip
    r = plan.request
    assert r.url == "http://site.test/" and plan.limit == 10_000
    assert (r.sitemap, r.ignoreQueryParameters, r.deduplicateSimilarURLs, r.crawlEntireDomain,
            r.allowExternalLinks, r.allowSubdomains, r.ignoreRobotsTxt, r.regexOnFullURL,
            r.zeroDataRetention) == ("include", False, True, False, False, False, False, False,
                                     False)  # fmt: skip
    assert plan.options.formats == ["markdown"] and plan.options.onlyMainContent


@pytest.mark.parametrize(
    ("body", "paths"),
    [
        ({"limit": 0}, ["$.limit"]),
        ({"delay": 61}, ["$.delay"]),
        ({"maxConcurrency": 0}, ["$.maxConcurrency"]),
        ({"excludePaths": ["(a"]}, ["$.excludePaths"]),
        ({"webhook": "ftp://x"}, ["$.webhook"]),
        ({"sitemap": "maybe"}, ["$.sitemap"]),
        ({"a": 1, "b": 2}, ["$.a", "$.b"]),
    ],
)
def test_bad_crawl_requests_name_the_field(body: dict[str, Any], paths: list[str]) -> None:
    raw = msgspec.json.encode({"url": "http://site.test/", **body})
    with pytest.raises(models.BadRequest) as info:
        models.parse_crawl(raw, default_limit=10)
    assert [d["path"] for d in info.value.details] == paths


def test_active_crawl_options_hide_the_webhook() -> None:
    plan = models.parse_crawl(
        b'{"url": "http://s.test/", "webhook": {"url": "http://h.test/", "headers": {"a": "b"}}}',
        default_limit=5,
    )
    options = models.public_options(plan)
    assert "webhook" not in options and options["limit"] == 5
