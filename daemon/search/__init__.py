# Web search through an operator-run provider (SearXNG's JSON API), a core service like `net`:
# the crawl area's `/v2/search` asks it for results and scrapes them through its own pipeline, and
# any later area (an extract job's web search) can ask it too. The provider's address is the
# operator's setting, never a request's, so it may be loopback or private and is not put through
# the SSRF guard; the result URLs are, when they are scraped.
#
# `rules` holds every decision as pure functions (query parameters, the result mapping, domain
# filters); `searxng` is the thin HTTP shell around them.
from __future__ import annotations

from daemon.search.config import SearchConfig
from daemon.search.rules import Hit, SearchError, SearchQuery
from daemon.search.searxng import SearxngClient

__all__ = ["Hit", "SearchConfig", "SearchError", "SearchQuery", "SearxngClient"]
