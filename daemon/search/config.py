# The `[search]` section: where `/v2/search` (and `/v1/search`) get their results, and where the
# highlights that replace their snippets come from. Without a `base_url` search is off and those
# routes answer 400 saying so.
from __future__ import annotations

from typing import Literal

from daemon.config_types import Duration, Section


class SearchConfig(Section, frozen=True):
    provider: Literal["searxng"] = "searxng"
    """The only provider so far: a SearXNG instance with `json` in its `search.formats`."""
    base_url: str = ""
    """SearXNG's address, e.g. "http://127.0.0.1:8888" (its /search is called); empty: off."""
    engines: list[str] = []
    """SearXNG engines to ask (its `engines` parameter); empty: the instance's defaults."""
    timeout: Duration = Duration(10)
    """Per request to the provider; a request's own `timeout` may shorten it."""
    retries: int = 1
    """Further tries of a request that timed out, failed to connect or got 429/5xx."""
    max_pages: int = 5
    """Most result pages asked of the provider for one search (SearXNG pages are ~10-20)."""
    scrape_concurrency: int = 4
    """Results scraped at once when `scrapeOptions` asks for formats (and pages read at once for
    highlights)."""
    highlights: Literal["fetch", "cache", "off"] = "fetch"
    """Where highlights (on unless a search says `highlights: false`) read a result's page when
    the search does not scrape it: "fetch" through the crawl engine and its document cache,
    "cache" from the document cache only (no request to the sites), "off" never (snippets)."""
    highlight_timeout: Duration = Duration(5)
    """Most time a search spends reading pages for highlights; a page not read by then keeps its
    snippet (the search's own `timeout` bounds it too)."""
    highlight_pages: int = 10
    """Most result pages read for highlights per search (web results first, then news); the
    others keep their snippets. Results scraped for `scrapeOptions` need no extra read."""

    def __post_init__(self) -> None:
        url = self.base_url.strip()
        if url and not url.startswith(("http://", "https://")):
            raise ValueError("base_url: must be an http:// or https:// URL (or empty: off)")
        if self.timeout <= 0:
            raise ValueError("timeout: must be more than 0")
        if not 0 <= self.retries <= 5:
            raise ValueError("retries: between 0 and 5")
        if not 1 <= self.max_pages <= 20:
            raise ValueError("max_pages: between 1 and 20")
        if not 1 <= self.scrape_concurrency <= 64:
            raise ValueError("scrape_concurrency: between 1 and 64")
        if not 0 < self.highlight_timeout <= 300:
            raise ValueError("highlight_timeout: more than 0 and at most 300 s")
        if not 0 <= self.highlight_pages <= 100:
            raise ValueError("highlight_pages: between 0 and 100")
        for engine in self.engines:
            if not engine or "," in engine or len(engine) > 64:
                raise ValueError(f"engines: {engine[:64]!r} is not an engine name")

    @property
    def enabled(self) -> bool:
        return bool(self.base_url.strip())
