# Wires the Firecrawl-compatible crawl API into the daemon: the CrawlService (runs crawl and batch
# jobs, resumes them after a restart) as a supervised component, its routes (placed before the
# jobs API's so /v2/crawl/active is not read as a job id), its canceller on the JobManager (the
# jobs API's DELETE /v2/crawl/{id} cancels a crawl through the store first, so it reaches every
# instance), the `crawl` /status section and the reload hook that gives new jobs the new [crawl]
# limits. `/v2/search` rides on the same service: the [search] provider answers, the crawl engine
# scrapes the results. /v2/extract jobs run on the same engine (daemon/crawl/extract/service.py)
# with the LLM service, and so do /v2/agent jobs (daemon/crawl/agent/service.py), which search
# through the same [search] provider. The document cache is pruned by its own task and emptied by
# prefix through DELETE /v2/cache. Crawl prompts (daemon/crawl/prompts/) read the LLM service too.
# Monitors (/v2/monitor, daemon/crawl/monitors/) schedule checks that run on the same engine and
# crawl service. Feedback (daemon/crawl/feedback/) is stored rows only, read by the console.
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import trio

from daemon.crawl.runs.service import CrawlService
from daemon.crawl.search.service import SearchService
from daemon.logs import get_logger
from daemon.process import Daemon
from daemon.settings import Config, ConfigDiff
from daemon.store import DB_ERRORS, StoreClosed

if TYPE_CHECKING:
    from daemon.crawl.monitors.service import MonitorService

_STORE_FAILURES: tuple[type[BaseException], ...] = (*DB_ERRORS, StoreClosed)

log = get_logger("crawl")


async def _prune_cache(
    service: CrawlService, daemon: Daemon, *, task_status: trio.TaskStatus[None]
) -> None:
    """The document cache's bounds, applied every [crawl.cache] prune_every."""
    task_status.started()
    while True:
        await trio.sleep(float(service.cache.config.prune_every))
        try:
            if gone := await service.cache.prune():
                log.info("document cache pruned", entries=gone)
        except _STORE_FAILURES as exc:
            log.warning("document cache prune failed; trying again later", error=str(exc))


def install(daemon: Daemon) -> None:
    from daemon.api import agent as agent_api
    from daemon.api import cache as cache_api
    from daemon.api import crawl as crawl_api
    from daemon.api import extract as extract_api
    from daemon.api import parse as parse_api
    from daemon.api import prompts as prompts_api
    from daemon.api import search as search_api
    from daemon.api import v1 as v1_api
    from daemon.crawl.agent.service import AgentService
    from daemon.crawl.extract.service import ExtractService
    from daemon.crawl.prompts.service import CrawlPrompts

    cfg = daemon.config.crawl
    if not cfg.enabled:
        return
    assert daemon.store is not None and daemon.jobs is not None
    service = CrawlService(
        cfg, daemon.store, daemon.jobs, cluster=daemon.cluster, llm=daemon.llm,
        ocr=daemon.config.ocr, parse=daemon.config.parse,
    )  # fmt: skip
    daemon.parts["crawl"] = service
    prompts = CrawlPrompts(service, daemon.llm)
    daemon.parts["crawl_prompts"] = prompts
    search = SearchService(service, daemon.config.search)
    daemon.parts["search"] = search
    extract = ExtractService(service, daemon.llm, search)
    daemon.parts["extract"] = extract
    agent = AgentService(service, daemon.llm, search, daemon.config.agent)
    daemon.parts["agent"] = agent
    monitors = _install_monitors(daemon, service, search)
    _install_feedback(daemon)

    async def run_crawl(daemon: Daemon, *, task_status: trio.TaskStatus[None]) -> None:
        await service.run(task_status=task_status)

    async def crawl_section() -> dict[str, Any]:
        return {**await service.status(), "search": search.status(),
                "extract": extract.status(), "agent": agent.status(),
                "prompts": prompts.status(), "monitors": monitors.status()}  # fmt: skip

    async def on_reload(old: Config, new: Config, change: ConfigDiff) -> None:
        if new.crawl.enabled and (
            new.crawl.browser != old.crawl.browser
            or new.crawl.browser.choice().binary != service.browser_choice.binary
        ):
            log.warning("[crawl.browser] changes take effect at the next restart",
                        browser=service.browser_choice.status())  # fmt: skip
        if "crawl" in change.sections_changed and new.crawl.enabled:
            service.configure(new.crawl)
        if "search" in change.sections_changed:
            search.configure(new.search)
        if "agent" in change.sections_changed:
            agent.configure(new.agent)
        if {"ocr", "parse"} & set(change.sections_changed):
            service.configure_documents(new.ocr, new.parse)

    async def run_extract(daemon: Daemon, *, task_status: trio.TaskStatus[None]) -> None:
        await extract.run(task_status=task_status)

    async def run_agent(daemon: Daemon, *, task_status: trio.TaskStatus[None]) -> None:
        await agent.run(task_status=task_status)

    daemon.add_component("crawl", run_crawl)
    daemon.add_component("crawl-cache", functools.partial(_prune_cache, service))
    daemon.add_component("extract", run_extract)
    daemon.add_component("agent", run_agent)
    daemon.routes[:0] = (
        crawl_api.routes(service, prompts) + prompts_api.routes(prompts)
        + search_api.routes(search) + v1_api.routes(service, search)
        + extract_api.routes(extract) + agent_api.routes(agent) + cache_api.routes(service.cache)
        + (parse_api.routes(service) if daemon.config.parse.enabled else [])
    )  # fmt: skip
    daemon.jobs.add_canceller(service.cancel)
    daemon.jobs.add_canceller(agent.cancel)
    daemon.status_sections["crawl"] = crawl_section
    daemon.reload_hooks.append(on_reload)


def check_secrets(cfg: Config) -> None:
    """The monitors' notification secrets: the SMTP relay's password and every target's URL
    (ConfigError naming the key path; a value is never shown)."""
    if cfg.crawl.enabled and cfg.monitors.enabled:
        from daemon.crawl.monitors.senders import Senders

        Senders(cfg.monitors)


def _install_feedback(daemon: Daemon) -> None:
    """/v2/feedback and search feedback: its service (stored rows only) and its routes."""
    from daemon.api import feedback as feedback_api
    from daemon.crawl.feedback.service import FeedbackService

    assert daemon.store is not None
    feedback = FeedbackService(daemon.store)
    daemon.parts["feedback"] = feedback
    daemon.routes[:0] = feedback_api.routes(feedback)


def _install_monitors(
    daemon: Daemon, service: CrawlService, search: SearchService
) -> MonitorService:
    """/v2/monitor: its service (scheduler and checks) as a component, its routes (unless
    [monitors] enabled is false) and its reload hook."""
    from daemon.api import monitors as monitors_api
    from daemon.crawl.monitors.service import MonitorService

    monitors = MonitorService(service, daemon.config.monitors, search, daemon.llm)
    daemon.parts["monitors"] = monitors

    async def run_monitors(daemon: Daemon, *, task_status: trio.TaskStatus[None]) -> None:
        if daemon.config.monitors.enabled:
            await monitors.run(task_status=task_status)
        else:
            task_status.started()
            await trio.sleep_forever()

    async def on_reload(old: Config, new: Config, change: ConfigDiff) -> None:
        if "monitors" in change.sections_changed:
            monitors.configure(new.monitors)

    daemon.add_component("monitors", run_monitors)
    if daemon.config.monitors.enabled:
        daemon.routes[:0] = monitors_api.routes(monitors)
    daemon.reload_hooks.append(on_reload)
    return monitors
