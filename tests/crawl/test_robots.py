from __future__ import annotations

import pytest

from daemon.crawl.discovery.robots import Robots, fetch_robots
from daemon.crawl.fetching.fetch import Fetcher
from daemon.fakes.site import SiteSim

RULES = """
User-agent: *
Disallow: /

User-agent: FireCrawlAgent
Disallow: /private/
Allow: /private/allowed
Disallow: /*.cgi$
Disallow: /search?q=
Crawl-delay: 1.5

Sitemap: http://site.test/sitemap_index.xml
Sitemap: http://site.test/other.xml
"""


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        ("/", True),
        ("/page", True),
        ("/private/x", False),
        ("/private", False),  # also checked as /private/
        ("/private?x=1", False),
        ("/privateer", True),
        ("/private/allowed", True),
        ("/private/allowed/deeper", True),
        ("/script.cgi", False),
        ("/script.cgi?x=1", True),  # `$` anchors the end
        ("/dir/script.cgi", False),
        ("/search?q=1", False),
        ("/search?page=1", True),
    ],
)
def test_rules_for_firecrawl_agent(path: str, allowed: bool) -> None:
    robots = Robots.parse(RULES)
    assert robots.allowed(f"http://site.test{path}") is allowed


def test_crawl_delay_and_sitemaps() -> None:
    robots = Robots.parse(RULES)
    assert robots.crawl_delay == 1.5
    assert robots.sitemaps == ["http://site.test/sitemap_index.xml", "http://site.test/other.xml"]


def test_other_spelling_and_star_group() -> None:
    robots = Robots.parse("User-agent: FirecrawlAgent\nDisallow: /a\n")
    assert not robots.allowed("http://s.test/a")
    star_only = Robots.parse("User-agent: *\nDisallow: /b\n")
    assert not star_only.allowed("http://s.test/b/c")
    assert star_only.allowed("http://s.test/c")
    assert star_only.crawl_delay is None


def test_allow_all() -> None:
    robots = Robots.allow_all()
    assert robots.allowed("http://s.test/anything")
    assert robots.crawl_delay is None and robots.sitemaps == []


async def test_fetch_robots_from_site(site: SiteSim, fetcher: Fetcher) -> None:
    site.crawl_delay = 0.5
    robots = await fetch_robots(fetcher, site.url(""))
    assert robots.crawl_delay == 0.5
    assert robots.sitemaps == [site.url("/sitemap_index.xml")]
    assert not robots.allowed(site.url("/private/secret"))
    assert robots.allowed(site.url("/private/allowed"))
    assert robots.allowed(site.url("/agent-test/page"))  # only `*` is refused there


@pytest.mark.parametrize(
    "robots_txt",
    [
        "<!doctype html><html><body>Not found</body></html>",
        '{"error": "not found"}',
        "<?xml version='1.0'?><error/>",
    ],
)
async def test_markup_body_means_allow_all(
    site: SiteSim, fetcher: Fetcher, robots_txt: str
) -> None:
    site.robots = robots_txt
    robots = await fetch_robots(fetcher, site.url(""))
    assert robots.allowed(site.url("/private/secret"))


async def test_unreachable_robots_means_allow_all(fetcher: Fetcher) -> None:
    robots = await fetch_robots(fetcher, "http://unknown.test")
    assert robots.allowed("http://unknown.test/private/")


async def test_missing_robots_means_allow_all(site: SiteSim, fetcher: Fetcher) -> None:
    robots = await fetch_robots(fetcher, site.url("", host="blog.site.test"))  # 404 page
    assert robots.allowed(site.url("/private/", host="blog.site.test"))
    assert site.counts["/robots.txt"] == 1


def test_crawl_delay_is_capped() -> None:
    assert Robots.parse("User-agent: *\nCrawl-delay: 86400\n").crawl_delay == 60.0
