# Wires the Firecrawl-compatible crawl API into the daemon: the CrawlService (runs crawl and batch
# jobs, resumes them after a restart) as a supervised component, its routes (placed before the
# jobs API's so /v2/crawl/active is not read as a job id; the jobs API's DELETE /v2/crawl/{id}
# cancels a crawl through the store first, so it reaches every instance), the `crawl` /status
# section and the reload hook that gives new jobs the new [crawl] limits.
from __future__ import annotations

from typing import Any

import trio

from daemon import config
from daemon.crawl.service import CrawlService
from daemon.logs import get_logger
from daemon.runtime import Daemon

log = get_logger("crawl")


def install(daemon: Daemon) -> None:
    from daemon.api import crawl as crawl_api

    cfg = daemon.config.crawl
    if not cfg.enabled:
        return
    assert daemon.store is not None and daemon.jobs is not None
    service = CrawlService(cfg, daemon.store, daemon.jobs, cluster=daemon.cluster)
    daemon.parts["crawl"] = service

    async def run_crawl(daemon: Daemon, *, task_status: trio.TaskStatus[None]) -> None:
        await service.run(task_status=task_status)

    async def crawl_section() -> dict[str, Any]:
        return await service.status()

    async def on_reload(old: config.Config, new: config.Config, change: config.ConfigDiff) -> None:
        if "crawl" in change.sections_changed and new.crawl.enabled:
            if new.crawl.browser != old.crawl.browser:
                log.warning("[crawl.browser] changes take effect at the next restart")
            service.configure(new.crawl)

    daemon.add_component("crawl", run_crawl)
    daemon.routes[:0] = crawl_api.routes(service)
    daemon.routes[:] = [
        crawl_api.cancel_anywhere(r, service) if r.path == "/v2/crawl/{id}" else r
        for r in daemon.routes
    ]
    daemon.status_sections["crawl"] = crawl_section
    daemon.reload_hooks.append(on_reload)
