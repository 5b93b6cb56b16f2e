# What every crawl job, batch and /v2/scrape of one config shares: the fetcher, the per-host
# gate, the global fetch and job limits, and the turning of fetched pages into documents (in the
# content worker processes when there are some, daemon/crawl/content/pool.py; else small pages
# on the event loop, big ones in a worker thread). A reload builds a new Engine for new
# jobs (daemon/crawl/runs/service.py), so none of this is reconfigured in place. CrawlWrites is here
# because every run of one process shares it, like the engine.
from __future__ import annotations

import ctypes
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import trio

from daemon.crawl.config import CrawlConfig
from daemon.crawl.content.document import (
    DocumentOptions,
    extracts_main_content,
    scrape_page,
    scrape_page_of,
)
from daemon.crawl.content.pool import PagePool, WorkerLost
from daemon.crawl.fetching.fetch import (
    Fetcher,
    FetchError,
    FetchPolicy,
    FetchResult,
    HostGate,
    Resolver,
)
from daemon.crawl.options.models import ScrapeOptions
from daemon.crawl.rendering.browser import BrowserPool
from daemon.crawl.runs.pages import PageMaker, PagePlan, page_plan
from daemon.store import Conn, Store

T = TypeVar("T")

CPU_THREADS = 2
"""Threads turning big pages into documents (html-to-markdown and selectolax release the GIL)."""
INLINE_BYTES = 128 * 1024
"""Pages up to this size become documents on the event loop: about a millisecond of work, less
than the hand-off to a thread and the GIL contention it brings."""
EXTRACT_INLINE_BYTES = 16 * 1024
"""With onlyMainContent's extractor, pages over this go to a worker thread (a 16 KiB page costs
a few ms of CPU; a real article page of 100 KiB and more, tens of ms)."""


def _malloc_trim() -> Callable[[], None]:
    """glibc's malloc_trim: parsing a multi-megabyte page takes a hundred MB of C heap for a
    moment (selectolax's tree, html-to-markdown's buffers) that glibc keeps after it is freed;
    trimming after such a page gives it back to the system. A no-op elsewhere."""
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return lambda: None

    def release() -> None:
        trim(0)

    return release


release_memory = _malloc_trim()


def scrape_large_page(
    result: FetchResult, options: DocumentOptions, source_url: str, scrape_id: str
) -> tuple[dict[str, Any], list[str]]:
    """`scrape_page` for a page over INLINE_BYTES (in a worker thread), then `release_memory`."""
    try:
        return scrape_page(result, options, source_url=source_url, scrape_id=scrape_id)
    finally:
        release_memory()


class CrawlWrites:
    """Hands the store the writes that lock a crawl's rows (claims, page commits, the kickoff,
    deciding the end) one at a time on a shared store; straight through otherwise."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = trio.Lock() if store.backend.shared else None

    async def write(self, fn: Callable[[Conn], T]) -> T:
        if self._lock is None:
            return await self.store.write(fn)
        async with self._lock:
            return await self.store.write(fn)


@dataclass
class Engine:
    """What every job shares: the fetcher, the per-host gate and the global limits."""

    config: CrawlConfig
    fetcher: Fetcher
    gate: HostGate
    fetch_slots: trio.CapacityLimiter
    job_slots: trio.CapacityLimiter
    cpu: trio.CapacityLimiter = field(default_factory=lambda: trio.CapacityLimiter(CPU_THREADS))
    pages: Counter[str] = field(default_factory=Counter)
    last_success_ms: int | None = None
    """When a page (crawl, batch or /v2/scrape) was last produced: queue-status's
    mostRecentSuccess."""
    browser: BrowserPool | None = None
    llm: Any = None
    """The daemon's LlmService, for the json and summary formats."""
    pool: PagePool | None = None
    """The content workers (None: documents are made in this process)."""
    maker: PageMaker = field(init=False)

    def __post_init__(self) -> None:
        self.maker = PageMaker(
            self.fetcher, self.document, browser=self.browser, render_mode=self.config.render,
            gate=self.gate, cpu=self.cpu, llm=self.llm,
        )  # fmt: skip

    def plan(self, options: ScrapeOptions, *, zero_data_retention: bool = False) -> PagePlan:
        return page_plan(
            options, self.fetcher.policy.timeout, self.config.browser.max_screenshot_height,
            zero_data_retention=zero_data_retention,
        )  # fmt: skip

    async def document(
        self, result: FetchResult, options: DocumentOptions, source_url: str
    ) -> tuple[dict[str, Any], list[str]]:
        scrape_id = str(uuid.uuid4())
        if self.pool is not None:
            try:
                return await self.pool.run(scrape_page_of, result, options, source_url, scrape_id)
            except WorkerLost as exc:
                self.pages["worker_lost"] += 1
                raise FetchError("SCRAPE_ALL_ENGINES_FAILED", str(exc), source_url) from None
        inline = EXTRACT_INLINE_BYTES if extracts_main_content(options) else INLINE_BYTES
        if len(result.body) <= inline:
            await trio.lowlevel.checkpoint()
            return scrape_page(result, options, source_url=source_url, scrape_id=scrape_id)
        return await trio.to_thread.run_sync(
            scrape_large_page, result, options, source_url, scrape_id, limiter=self.cpu
        )


def new_engine(
    config: CrawlConfig,
    resolver: Resolver | None = None,
    browser: BrowserPool | None = None,
    llm: Any = None,
    pool: PagePool | None = None,
) -> Engine:
    gate = HostGate(config.per_host_concurrency)
    return Engine(
        config=config,
        fetcher=Fetcher(FetchPolicy.from_config(config), resolver=resolver, gate=gate),
        gate=gate,
        fetch_slots=trio.CapacityLimiter(config.concurrency),
        job_slots=trio.CapacityLimiter(config.max_running_jobs),
        browser=browser,
        llm=llm,
        pool=pool,
    )
