# Search highlights, the I/O around the pure passage picker (daemon/search/highlights.py): each web
# result's `description` and each news result's `snippet` becomes the passages of its page that
# match the query, or stays the provider's snippet when the page cannot be read in time or nothing
# on it matches (as Firecrawl: one unreadable page never fails a search, and says nothing).
#
# Where the page text comes from: a search that scrapes its results (`scrapeOptions`) has their
# markdown already. Otherwise `[search] highlights` decides: "fetch" reads the first
# `highlight_pages` result pages through the crawl engine like a `/v2/scrape {url}` (SSRF guard,
# the document cache read and written under the same key, so a page scraped before costs no
# request and a later scrape of it is a hit), at most `scrape_concurrency` at once and for at most
# `highlight_timeout` (and never past the request's `timeout`); "cache" only takes pages already
# in the cache; "off" keeps the snippets. Firecrawl itself reads its own index, never the site.
from __future__ import annotations

from typing import Any

import trio
from prometheus_client import Counter

from daemon.crawl.fetching.fetch import FetchError
from daemon.crawl.options.models import ScrapeOptions, ScrapeRequest
from daemon.crawl.runs.service import CrawlService
from daemon.metrics import REGISTRY
from daemon.search import SearchConfig
from daemon.search.highlights import highlight

highlights = Counter(
    "crawld_search_highlights",
    "Search results by highlight outcome (passages: the description is the page's passages;"
    " no_match: nothing on the page matched; unread: the page could not be read in time)",
    ["outcome"],
    registry=REGISTRY,
)

FIELD = {"web": "description", "news": "snippet"}
"""The field of a result of each source that highlights replace (images have none)."""


def targets(data: dict[str, list[dict[str, Any]]]) -> list[tuple[dict[str, Any], str]]:
    """(result, field to replace) of every web and news result, web first."""
    return [(item, field) for source, field in FIELD.items() for item in data.get(source, [])]


def apply(item: dict[str, Any], field: str, query: str, markdown: str | None) -> bool:
    """Replace `item[field]` by the passages of `markdown` matching `query`; whether it was."""
    passages = highlight(query, markdown) if markdown else None
    if passages is None:
        highlights.labels("no_match" if markdown else "unread").inc()
        return False
    item[field] = passages
    highlights.labels("passages").inc()
    return True


class Highlighter:
    """Gives a search's results their highlights, reading pages through `crawl`."""

    def __init__(self, crawl: CrawlService, config: SearchConfig) -> None:
        self.crawl = crawl
        self.config = config
        self.counts = {"highlighted": 0, "highlight_reads": 0}

    async def from_scraped(self, data: dict[str, list[dict[str, Any]]], query: str) -> None:
        """Highlights from the markdown the results were scraped with (nothing is read)."""
        for item, field in targets(data):
            self.counts["highlighted"] += apply(item, field, query, item.get("markdown"))

    async def by_reading(
        self, data: dict[str, list[dict[str, Any]]], query: str, deadline: float
    ) -> None:
        """Highlights from pages read for them (`[search] highlights`), until `deadline` or
        `highlight_timeout`, whichever comes first; the results not read keep their snippets."""
        mode = self.config.highlights
        if mode == "off":
            return
        chosen = targets(data)[: self.config.highlight_pages]
        options = ScrapeOptions(formats=["markdown"], minAge=0 if mode == "cache" else None)
        limiter = trio.CapacityLimiter(self.config.scrape_concurrency)
        done: set[int] = set()

        async def one(n: int, item: dict[str, Any], field: str) -> None:
            async with limiter:
                try:
                    document = await self.crawl.scrape(ScrapeRequest(url=item["url"],
                                                                     options=options))  # fmt: skip
                except FetchError:
                    return
            self.counts["highlight_reads"] += 1
            done.add(n)
            self.counts["highlighted"] += apply(item, field, query, document.get("markdown"))

        until = min(deadline, trio.current_time() + float(self.config.highlight_timeout))
        with trio.move_on_at(until):
            async with trio.open_nursery() as nursery:
                for n, (item, field) in enumerate(chosen):
                    nursery.start_soon(one, n, item, field)
        highlights.labels("unread").inc(len(chosen) - len(done))
