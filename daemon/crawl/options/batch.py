# Batch scrape (POST /v2/batch/scrape) runs on the crawl machinery with the crawl-only parts off:
# no robots.txt, no scope, no links followed, and no dedupe (Firecrawl scrapes a URL listed twice
# twice), so each listed URL is a frontier row keyed by its position in the job. `appendToId` adds
# rows to a running batch after the ones it has.
from __future__ import annotations

from daemon.crawl.options.rules import Candidate


def batch_candidates(urls: list[str], offset: int) -> list[Candidate]:
    """Frontier candidates for `urls` listed after `offset` earlier ones: one row each."""
    return [(f"#{offset + i}", url, 0) for i, url in enumerate(urls)]
