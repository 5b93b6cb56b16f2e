# POST /v2/map: the URLs of a site without crawling it. Firecrawl answers from its index and the
# site's sitemaps; crawld has no index, so it reads the sitemaps (robots.txt `Sitemap:` lines and
# the usual places) and the links of the start page, and with `sitemap: "skip"` one more level of
# links from the pages the start page links to. Which URLs come back is the pure `rules.map_links`.
# A link carries the `title` and `description` of its page when the map read that page (the start
# page, and the pages read for their links); sitemaps name no titles, and no page is fetched for
# its title alone, so the others are bare URLs (Firecrawl fills them from its index).
from __future__ import annotations

import trio

from daemon.crawl.content.document import page_outline
from daemon.crawl.discovery.robots import fetch_robots
from daemon.crawl.discovery.sitemap import sitemap_urls
from daemon.crawl.fetching.fetch import Fetcher, FetchError
from daemon.crawl.fetching.urls import dedupe_key, parse_http_url
from daemon.crawl.options import rules
from daemon.crawl.options.models import MapRequest
from daemon.crawl.options.responses import MapLink

Known = dict[str, dict[str, str]]
"""Title and description of the pages read, by dedupe key."""

SECOND_LEVEL_PAGES = 20
"""Pages linked from the start page whose links are also read when sitemaps are skipped."""


class MapTimeout(Exception):
    """The request's `timeout` passed before the map was complete."""


async def map_site(fetcher: Fetcher, request: MapRequest) -> list[MapLink]:
    """The site's links for `request`; MapTimeout after `request.timeout` ms."""
    budget = request.timeout / 1000 if request.timeout is not None else float("inf")
    with trio.move_on_after(budget):
        return await _map(fetcher, request)
    raise MapTimeout(f"map did not finish within {request.timeout} ms")


async def _map(fetcher: Fetcher, request: MapRequest) -> list[MapLink]:
    start = request.url
    parsed = parse_http_url(start)
    assert parsed is not None
    found: list[str] = [start]
    known: Known = {}
    if request.sitemap != "skip":
        robots = await fetch_robots(fetcher, str(parsed.origin()))
        found += await sitemap_urls(fetcher, start, robots, limit=request.limit * 2)
    if request.sitemap != "only":
        links = await _links(fetcher, start, known)
        found += links
        if request.sitemap == "skip":
            for link in links[:SECOND_LEVEL_PAGES]:
                found += await _links(fetcher, link, known)
    urls = rules.map_links(
        start,
        found,
        include_subdomains=request.includeSubdomains,
        ignore_query=request.ignoreQueryParameters,
        search=request.search,
        limit=request.limit,
    )
    return [MapLink(url=url, **known.get(_key(url), {})) for url in urls]


def _key(url: str) -> str:
    return dedupe_key(url, ignore_query=False, similar=True)


async def _links(fetcher: Fetcher, url: str, known: Known) -> list[str]:
    """The links of the page at `url`; its title and description go to `known`."""
    try:
        result = await fetcher.fetch(url)
    except FetchError:
        return []
    links, outline = page_outline(result)
    if outline:
        known.setdefault(_key(url), outline)
        known.setdefault(_key(result.url), outline)
    return links
