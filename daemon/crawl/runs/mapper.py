# POST /v2/map: the URLs of a site without crawling it. Firecrawl answers from its index and the
# site's sitemaps; crawld has no index, so it reads the sitemaps (robots.txt `Sitemap:` lines and
# the usual places) and the links of the start page, and with `sitemap: "skip"` one more level of
# links from the pages the start page links to. Which URLs come back is the pure `rules.map_links`.
from __future__ import annotations

import trio

from daemon.crawl.content.document import page_links
from daemon.crawl.discovery.robots import fetch_robots
from daemon.crawl.discovery.sitemap import sitemap_urls
from daemon.crawl.fetching.fetch import Fetcher, FetchError
from daemon.crawl.fetching.urls import parse_http_url
from daemon.crawl.options import rules
from daemon.crawl.options.models import MapRequest

SECOND_LEVEL_PAGES = 20
"""Pages linked from the start page whose links are also read when sitemaps are skipped."""


class MapTimeout(Exception):
    """The request's `timeout` passed before the map was complete."""


async def map_site(fetcher: Fetcher, request: MapRequest) -> list[str]:
    """The site's URLs for `request`; MapTimeout after `request.timeout` ms."""
    budget = request.timeout / 1000 if request.timeout is not None else float("inf")
    with trio.move_on_after(budget):
        return await _map(fetcher, request)
    raise MapTimeout(f"map did not finish within {request.timeout} ms")


async def _map(fetcher: Fetcher, request: MapRequest) -> list[str]:
    start = request.url
    parsed = parse_http_url(start)
    assert parsed is not None
    found: list[str] = [start]
    if request.sitemap != "skip":
        robots = await fetch_robots(fetcher, str(parsed.origin()))
        found += await sitemap_urls(fetcher, start, robots, limit=request.limit * 2)
    if request.sitemap != "only":
        links = await _links(fetcher, start)
        found += links
        if request.sitemap == "skip":
            for link in links[:SECOND_LEVEL_PAGES]:
                found += await _links(fetcher, link)
    return rules.map_links(
        start,
        found,
        include_subdomains=request.includeSubdomains,
        ignore_query=request.ignoreQueryParameters,
        search=request.search,
        limit=request.limit,
    )


async def _links(fetcher: Fetcher, url: str) -> list[str]:
    try:
        return page_links(await fetcher.fetch(url))
    except FetchError:
        return []
