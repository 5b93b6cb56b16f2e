# What a stored crawl or batch plan asks of the run that works on it (daemon/crawl/runs/crawler.py):
# the scrape options, the page limit, pacing asked for, the crawl's scope and link policy. A
# pure reading of the plan, so a restarted daemon (or another instance) works on exactly what
# was accepted.
from __future__ import annotations

import math
from dataclasses import dataclass

import msgspec

from daemon.crawl.fetching.urls import CrawlScope
from daemon.crawl.options import rules
from daemon.crawl.options.models import BatchPlan, CrawlPlan, ScrapeOptions
from daemon.crawl.runs import store as crawlstore

_plan_decoder = msgspec.json.Decoder(CrawlPlan)
_batch_decoder = msgspec.json.Decoder(BatchPlan)


@dataclass(frozen=True)
class RunSettings:
    options: ScrapeOptions
    limit: float
    """Pages at most (a batch has none: infinity)."""
    max_concurrency: int | None
    delay: float | None
    zero_data_retention: bool
    scope: CrawlScope | None
    """Which URLs a crawl may follow; None for a batch, which follows none."""
    policy: rules.LinkPolicy
    plan: CrawlPlan | None
    """A crawl's plan; None for a batch."""


def run_settings(row: crawlstore.CrawlJobRow) -> RunSettings:
    """The settings of the job `row` (a crawl or a batch scrape) from its stored plan."""
    if row.kind == "batch_scrape":
        batch = _batch_decoder.decode(row.plan)
        return RunSettings(
            options=batch.options,
            limit=math.inf,
            max_concurrency=batch.max_concurrency,
            delay=None,
            zero_data_retention=batch.zero_data_retention,
            scope=None,
            policy=rules.LinkPolicy(follow_links=False),
            plan=None,
        )
    plan = _plan_decoder.decode(row.plan)
    request = plan.request
    return RunSettings(
        options=plan.options,
        limit=plan.limit,
        max_concurrency=request.maxConcurrency,
        delay=request.delay,
        zero_data_retention=request.zeroDataRetention,
        scope=CrawlScope(
            start_url=request.url,
            include_paths=tuple(request.includePaths),
            exclude_paths=tuple(request.excludePaths),
            regex_on_full_url=request.regexOnFullURL,
            crawl_entire_domain=request.crawlEntireDomain,
            allow_subdomains=request.allowSubdomains,
            allow_external_links=request.allowExternalLinks,
            max_url_depth=plan.max_url_depth,
        ),
        policy=rules.LinkPolicy(
            follow_links=request.sitemap != "only",
            max_depth=request.maxDiscoveryDepth,
            ignore_query=request.ignoreQueryParameters,
            similar=request.deduplicateSimilarURLs,
        ),
        plan=plan,
    )
