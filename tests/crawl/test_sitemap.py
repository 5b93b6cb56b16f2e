from __future__ import annotations

import gzip

import pytest

from daemon.crawl.discovery.robots import Robots, fetch_robots
from daemon.crawl.discovery.sitemap import (
    SitemapError,
    gunzip_capped,
    parse_sitemap,
    sitemap_candidates,
    sitemap_urls,
)
from daemon.crawl.fetching.fetch import Fetcher
from daemon.fakes.site import SiteSim

URLSET = b"""<?xml version="1.0" encoding="UTF-8"?>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">
  <url><loc> http://s.test/a </loc><lastmod>2025-01-01</lastmod></url>
  <url><loc>http://s.test/b</loc></url>
  <url><loc>http://s.test/a</loc></url>
  <url><loc>http://s.test/nested.xml</loc></url>
  <url><loc>http://s.test/more.xml.gz</loc></url>
  <url><loc>javascript:alert(1)</loc></url>
  <url><loc></loc></url>
</urlset>"""

INDEX = b"""<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">
  <sitemap><loc>http://s.test/s1.xml</loc></sitemap>
  <sitemap><loc>http://s.test/s2</loc></sitemap>
</sitemapindex>"""


def test_urlset() -> None:
    assert parse_sitemap(URLSET) == (
        ["http://s.test/a", "http://s.test/b"],
        ["http://s.test/nested.xml", "http://s.test/more.xml.gz"],
    )


def test_index() -> None:
    assert parse_sitemap(INDEX) == ([], ["http://s.test/s1.xml", "http://s.test/s2"])


def test_gzipped_and_plain_text() -> None:
    assert parse_sitemap(gzip.compress(URLSET))[0] == ["http://s.test/a", "http://s.test/b"]
    assert parse_sitemap(b"http://s.test/x\n\nnot a url\nhttps://s.test/y\n") == (
        ["http://s.test/x", "https://s.test/y"],
        [],
    )


def test_entities_are_not_expanded() -> None:
    xxe = b"""<?xml version="1.0"?>
<!DOCTYPE urlset [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"><url><loc>http://s.test/&xxe;</loc></url></urlset>"""
    pages, _ = parse_sitemap(xxe)
    assert all("root:" not in p for p in pages)


def test_billion_laughs_is_not_expanded() -> None:
    bomb = (
        b'<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaaaaaaaa">'
        + b"".join(
            f'<!ENTITY {chr(98 + i)} "{("&" + chr(97 + i) + ";") * 10}">'.encode() for i in range(8)
        )
        + b"]><urlset><url><loc>http://s.test/&i;</loc></url></urlset>"
    )
    pages, _ = parse_sitemap(bomb)
    assert sum(len(p) for p in pages) < 1000


def test_gzip_bomb_is_capped() -> None:
    bomb = gzip.compress(b"\0" * 2_000_000)
    with pytest.raises(SitemapError, match="decompressed"):
        gunzip_capped(bomb, cap=1_000_000)
    assert len(gunzip_capped(bomb, cap=2_000_000)) == 2_000_000


@pytest.mark.parametrize("data", [b"<html><body>nope</body></html>", b"", b"\x1f\x8bgarbage"])
def test_not_a_sitemap(data: bytes) -> None:
    with pytest.raises(SitemapError):
        parse_sitemap(data)


def test_candidates_order() -> None:
    robots = Robots.parse("Sitemap: http://blog.s.co.uk/custom.xml\n")
    assert sitemap_candidates("http://blog.s.co.uk/docs/", robots) == [
        "http://blog.s.co.uk/custom.xml",
        "http://blog.s.co.uk/docs/sitemap.xml",
        "http://blog.s.co.uk/sitemap.xml",
        "http://s.co.uk/sitemap.xml",
    ]
    assert sitemap_candidates("http://s.test", Robots.allow_all()) == ["http://s.test/sitemap.xml"]


async def test_site_sitemaps(site: SiteSim, fetcher: Fetcher) -> None:
    robots = await fetch_robots(fetcher, site.url(""))
    urls = await sitemap_urls(fetcher, site.url("/"), robots, limit=1000)
    assert set(site.orphan_urls()) <= set(urls)  # from the gzipped sitemap of the index
    assert site.url("/pages/10") in urls and site.url("/about") in urls
    assert len(urls) == len(set(urls))
    assert site.counts["/sitemap_index.xml"] == 1
    assert site.counts["/sitemap-orphans.xml.gz"] == 1


async def test_site_sitemaps_limit_and_filter(site: SiteSim, fetcher: Fetcher) -> None:
    robots = await fetch_robots(fetcher, site.url(""))
    urls = await sitemap_urls(
        fetcher, site.url("/"), robots, limit=3, accept=lambda u: "/pages/" in u
    )
    assert urls == [site.url(f"/pages/{i}") for i in (0, 10, 20)]
    assert site.counts["/sitemap-orphans.xml.gz"] == 0  # the limit was reached first


async def test_registrable_domain_sitemap(site: SiteSim, fetcher: Fetcher) -> None:
    blog = site.url("/", host="blog.site.test")  # has no sitemap; site.test has
    urls = await sitemap_urls(fetcher, blog, Robots.allow_all(), limit=1000)
    assert site.url("/about") in urls
    assert site.counts["/sitemap.xml"] == 2  # blog.site.test's (404), then site.test's


async def test_missing_sitemaps_give_nothing(fetcher: Fetcher) -> None:
    assert await sitemap_urls(fetcher, "http://unknown.test/", Robots.allow_all(), limit=10) == []
