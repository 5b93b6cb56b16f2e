# The running daemon as the assembled process sees it: the core's Daemon (daemon/runtime.py) with
# the whole config, plus what only the assembly can name: the HTTP surface's registries (API
# routes, console pages, the session check, the edge's counters) and each area's service by
# name. Components and surfaces take this type, so mypy checks what they put in and take out.
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypedDict

from daemon import runtime
from daemon.settings import Config

if TYPE_CHECKING:
    from starlette.routing import Route

    from daemon.api.app import ApiRoute
    from daemon.api.edge import SessionCheck
    from daemon.collector.queue import RowQueue
    from daemon.collector.service import Collector
    from daemon.crawl.agent.service import AgentService
    from daemon.crawl.extract.service import ExtractService
    from daemon.crawl.feedback.service import FeedbackService
    from daemon.crawl.monitors.service import MonitorService
    from daemon.crawl.prompts.service import CrawlPrompts
    from daemon.crawl.runs.service import CrawlService
    from daemon.crawl.search.service import SearchService
    from daemon.jobs.manager import JobManager
    from daemon.llm.service import LlmService
    from daemon.tracker.service import TrackerService
    from daemon.ui.history import QueueHistory
    from daemon.ui.sessions import Sessions

__all__ = ["Daemon", "Installer", "Parts", "RefusalCounter"]


class RefusalCounter(Protocol):
    """What a route needs of the HTTP edge's counters (daemon/api/edge.py EdgeStats): to count a
    request it refuses on the edge's behalf (by reason, shown in /status and /metrics)."""

    def refuse(self, reason: str) -> None: ...


class Parts(TypedDict, total=False):
    """The services each part installed, by name, for the API and tests."""

    jobs: JobManager
    llm: LlmService
    collector: Collector
    queue: RowQueue
    tracker: TrackerService
    crawl: CrawlService
    crawl_prompts: CrawlPrompts
    search: SearchService
    extract: ExtractService
    agent: AgentService
    monitors: MonitorService
    feedback: FeedbackService
    ui: Sessions
    queue_history: QueueHistory


@dataclass
class Daemon(runtime.Daemon[Config]):
    """The running process, with the whole config and every part's registries."""

    routes: list[ApiRoute] = field(default_factory=list)
    """The API routes (in /openapi.json), in the order they are matched."""
    pages: list[Route] = field(default_factory=list)
    """Starlette routes served behind the same edge but left out of /openapi.json (the console)."""
    sessions: SessionCheck | None = None
    """The console's session check, once daemon/ui installed."""
    http_stats: RefusalCounter | None = None
    """The running HTTP edge's counters, for a route that refuses on the edge's behalf."""
    parts: Parts = field(default_factory=lambda: Parts())


Installer = Callable[[Daemon], None]
"""A part's `install(daemon)`: registers its components, routes, sections and hooks."""
