# The `[crawl]` section: the Firecrawl-compatible scrape/crawl/map API (issue 10). Limits apply to
# jobs started after a reload; running jobs keep the values they started with.
from __future__ import annotations

import ipaddress

from daemon.config_types import Duration, Section


class CrawlConfig(Section, frozen=True):
    enabled: bool = True
    """Serve /v2/scrape, /v2/crawl, /v2/batch/scrape and /v2/map."""
    user_agent: str = "crawld/0.1 (self-hosted Firecrawl-compatible crawler) FirecrawlAgent"
    """Names no homepage: crawld has none. Operators put their own contact in it (a URL or a
    mail address), so site owners can reach whoever runs the crawl."""
    """Sent with every fetch; robots.txt rules are matched for FirecrawlAgent/FireCrawlAgent."""
    concurrency: int = 16
    """Most pages fetched at once over all jobs (a paced job, with `delay` or robots.txt
    Crawl-delay, fetches one page at a time outside this limit)."""
    per_host_concurrency: int = 4
    """Most pages fetched at once from one host (a job's maxConcurrency may lower it)."""
    connect_timeout: Duration = Duration(10)
    page_timeout: Duration = Duration(30)
    """Whole-page budget when the request gives no `timeout`."""
    max_bytes: int = 10 * 1024 * 1024
    """Largest response body read from a page; bigger pages fail with an error."""
    allow_cidrs: list[str] = []
    """Private networks crawls may reach (e.g. "127.0.0.0/8"); refused otherwise (SSRF guard)."""
    default_limit: int = 10_000
    """`limit` of a crawl that gives none."""
    max_running_jobs: int = 8
    """Crawl and batch jobs running at once; later ones wait their turn."""

    def __post_init__(self) -> None:
        for cidr in self.allow_cidrs:
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise ValueError(f"allow_cidrs: {cidr!r} is not a network") from None
        for name in ("concurrency", "per_host_concurrency", "max_running_jobs", "default_limit"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.max_bytes < 1024:
            raise ValueError("max_bytes must be at least 1024")
        if not self.user_agent.strip() or any(c in self.user_agent for c in "\r\n"):
            raise ValueError("user_agent must be one non-empty line")
