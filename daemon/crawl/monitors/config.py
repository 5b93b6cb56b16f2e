# The `[monitors]` section: how often a monitor may run and how the scheduler and its checks
# work. Everything works with the defaults; tests and small sites lower min_interval.
from __future__ import annotations

from daemon.config_types import Duration, Section


class MonitorConfig(Section, frozen=True):
    enabled: bool = True
    """Serve /v2/monitor and run the scheduler (needs [crawl] enabled)."""
    min_interval: Duration = Duration(300)
    """The shortest time between two runs a schedule may ask for (Firecrawl: 5 minutes);
    at least 1 minute (cron's grain)."""
    tick: Duration = Duration(5)
    """The longest the scheduler sleeps between two looks for due monitors (it also wakes at
    the earliest next run and when a monitor is created or changed)."""
    claim_batch: int = 10
    """Due monitors claimed per store read (oldest due first); a full batch is followed by
    another read at once, so a backlog drains in one look."""
    check_concurrency: int = 4
    """Pages of one check fetched at once (the crawl engine's limits apply over all work)."""
    crawl_limit: int = 100
    """Pages a crawl target's crawl reaches when its crawlOptions give no `limit`."""

    def __post_init__(self) -> None:
        if self.min_interval < 60:
            raise ValueError("min_interval: at least 1m (a cron schedule's grain)")
        if self.tick <= 0 or self.tick > 60:
            raise ValueError("tick: more than 0 and at most 60 s")
        if not 1 <= self.claim_batch <= 1000:
            raise ValueError("claim_batch: between 1 and 1000")
        if not 1 <= self.check_concurrency <= 64:
            raise ValueError("check_concurrency: between 1 and 64")
        if not 1 <= self.crawl_limit <= 100_000:
            raise ValueError("crawl_limit: between 1 and 100000")
