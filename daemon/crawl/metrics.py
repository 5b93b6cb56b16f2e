# Prometheus metrics of the crawl API (registered in the process registry, daemon/metrics.py).
from __future__ import annotations

from prometheus_client import Counter

from daemon.metrics import REGISTRY

crawl_pages = Counter(
    "crawld_crawl_pages",
    "Pages of crawl and batch jobs by outcome (fetched: a document, failed: an error)",
    ["outcome"],
    registry=REGISTRY,
)
crawl_jobs = Counter(
    "crawld_crawl_jobs",
    "Finished crawl and batch jobs by kind and status",
    ["kind", "status"],
    registry=REGISTRY,
)
crawl_interruptions = Counter(
    "crawld_crawl_interruptions",
    "Times the work on a crawl or batch job stopped on a store failure or a lost lease and"
    " started again from what was committed (the job goes on)",
    ["kind"],
    registry=REGISTRY,
)
scrapes = Counter(
    "crawld_crawl_scrapes",
    "POST /v2/scrape requests by outcome (ok or the Firecrawl error code)",
    ["outcome"],
    registry=REGISTRY,
)
maps = Counter(
    "crawld_crawl_maps", "POST /v2/map requests by outcome", ["outcome"], registry=REGISTRY
)
