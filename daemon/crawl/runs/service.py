# The crawl API's one object per daemon: it creates crawl and batch jobs (through the JobManager,
# with the job's plan and first frontier rows in the job's own creation transaction, so a crash
# can never leave a job nothing will work on), runs a JobRun per job in its nursery, and answers
# the synchronous /v2/scrape and /v2/map. A scan of the running jobs every SCAN_S starts a JobRun
# for each one this process does not work on yet: those of a restart, and (cluster mode) those
# another instance created, so every instance fetches pages of every running crawl.
#
# Limits come from `[crawl]`: a reload builds a new Engine (fetcher, gate, limits) for jobs
# started afterwards; running jobs keep the engine they started with, as the config promises.
# The browser is decided once, at construction ([crawl.browser] changes need a restart): with
# `enabled = "auto"` a Chromium that is found but does not start turns it off (with the reason
# in /status) instead of failing the daemon, as `enabled = true` does.
from __future__ import annotations

import uuid
from typing import Any

import msgspec
import trio

from daemon.clock import EpochClock, wall_ms
from daemon.cluster import Cluster
from daemon.crawl.cache.documents import DocumentCache
from daemon.crawl.config import CrawlConfig, OcrConfig, ParseConfig
from daemon.crawl.content.pool import PagePool, pool_size
from daemon.crawl.documents.reader import DocumentReader
from daemon.crawl.fetching.fetch import Resolver
from daemon.crawl.fetching.proxy import VettingProxy
from daemon.crawl.options.batch import batch_candidates
from daemon.crawl.options.models import BatchPlan, CrawlPlan, MapRequest, ScrapeRequest
from daemon.crawl.options.parse_options import ParseRequest
from daemon.crawl.options.responses import MapLink
from daemon.crawl.rendering.browser import BrowserPool, BrowserUnavailable
from daemon.crawl.runs import store as crawlstore
from daemon.crawl.runs.crawler import JobRun
from daemon.crawl.runs.ending import apply_end
from daemon.crawl.runs.engine import CrawlWrites, Engine, new_engine
from daemon.crawl.runs.mapper import map_site
from daemon.crawl.runs.runs import Runs
from daemon.crawl.runs.uploads import parse_upload
from daemon.crawl.tracking.store import ChangeTracker
from daemon.jobs import store as jobstore
from daemon.jobs.manager import JobManager
from daemon.jobs.store import JobFinished, JobNotFound, JobRecord
from daemon.logs import get_logger
from daemon.store import Conn, Store

log = get_logger("crawl")

_encode = msgspec.json.Encoder().encode
PRELOAD = ("__main__", "daemon.crawl.content.document", "daemon.crawl.documents.pdf")
"""Imported once by the content workers' forkserver, so each worker starts as a fork of it.
"__main__": multiprocessing runs the parent's main script (the `crawld` entry point, guarded by
`if __name__ == "__main__"`) in each new process; imported once here, the workers skip it."""
SCAN_S = 5.0
"""How often the running jobs are looked for without a wake-up: a job's creation wakes the scan
of every instance (daemon/store/wake.py CRAWLS), so one created elsewhere starts here at once;
this is the safety net."""


class CrawlService:
    def __init__(
        self,
        config: CrawlConfig,
        store: Store,
        jobs: JobManager,
        *,
        resolver: Resolver | None = None,
        clock_ms: EpochClock = wall_ms,
        cluster: Cluster | None = None,
        llm: Any = None,
        ocr: OcrConfig | None = None,
        parse: ParseConfig | None = None,
    ) -> None:
        self.config = config
        self.parse_config = parse or ParseConfig()
        """`[parse]`: uploads to /v2/parse."""
        self.llm = llm
        """The daemon's LlmService (daemon.llm), serving the json and summary formats."""
        self.cluster = cluster
        self.claimant = cluster.claimant if cluster is not None else f"local/{uuid.uuid4().hex[:8]}"
        """Stamped on the frontier rows this process claims."""
        self.store = store
        self.writes = CrawlWrites(store)
        self.jobs = jobs
        self.clock_ms = clock_ms
        self.resolver = resolver
        self.proxy: VettingProxy | None = None
        self.browser: BrowserPool | None = None
        self.browser_choice = config.browser.choice()
        """What [crawl.browser] enabled came to here (/status)."""
        if self.browser_choice.enabled:
            self.proxy = VettingProxy(
                allow_cidrs=tuple(config.allow_cidrs),
                resolver=resolver,
                connect_timeout=float(config.connect_timeout),
            )
            proxy = self.proxy
            self.browser = BrowserPool(
                config.browser, lambda: proxy.port, lambda: proxy.closed_port,
                stealth_port=lambda: proxy.stealth_port,
            )  # fmt: skip
        self.cache = DocumentCache(config.cache, store, clock_ms)
        workers = pool_size(config.content_workers)
        self.pool = PagePool(workers, preload=PRELOAD) if workers > 1 else None
        """The content workers, for every engine ([crawl] content_workers is read at start)."""
        self.engine = new_engine(config, resolver, self.browser, llm, self.pool)
        self.documents = DocumentReader(ocr, self.engine.cpu, llm)
        self.documents.pool = self.pool
        """Files made documents (PDF text, OCR, office files) for every engine and upload."""
        self.tracker = ChangeTracker(store, clock_ms)
        self.engine.maker.cache = self.cache
        self.engine.maker.tracker = self.tracker
        self.engine.maker.documents = self.documents
        if self.proxy is not None:  # the browser leaves through the fetcher's proxies
            self.proxy.upstream = self.engine.fetcher.proxies
        self._engines: list[Engine] = [self.engine]
        self._runs: Runs[crawlstore.CrawlJobRow, JobRun] = Runs(
            "crawl", store, jobs, crawlstore.running_job_ids, crawlstore.get_job, self._make_run
        )
        self.runs = self._runs.by_id
        """The crawl and batch jobs running here, by job id."""
        self._create_lock = trio.Lock()
        self.waiting: set[str] = set()

    @property
    def stealth_proxies(self) -> bool:
        """`[crawl] stealth_proxies` is configured (proxy: stealth/enhanced are honoured)."""
        return self.engine.fetcher.proxies.stealth is not None

    # -- configuration ---------------------------------------------------------------------

    def configure(self, config: CrawlConfig, resolver: Resolver | None = None) -> None:
        """New limits and fetch policy for jobs started from now on."""
        self.config = config
        if resolver is not None:
            self.resolver = resolver
            if self.proxy is not None:
                self.proxy.resolver = resolver
        self.cache.configure(config.cache)
        self.engine = new_engine(config, self.resolver, self.browser, self.llm, self.pool)
        self.engine.maker.cache = self.cache
        self.engine.maker.tracker = self.tracker
        self.engine.maker.documents = self.documents
        self._engines.append(self.engine)
        if self.proxy is not None:
            self.proxy.upstream = self.engine.fetcher.proxies

    def configure_documents(self, ocr: OcrConfig, parse: ParseConfig) -> None:
        """New [ocr] and [parse] settings: files read and uploads taken from now on."""
        self.documents.configure(ocr)
        self.parse_config = parse

    # -- running ---------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Resume the running crawl and batch jobs, then run new ones until cancelled."""
        try:
            await self._runs.serve(SCAN_S, task_status, self._start_browser)
        finally:
            with trio.CancelScope(shield=True):
                for engine in self._engines:
                    await engine.fetcher.aclose()
                self._engines = [self.engine]
                if self.pool is not None:
                    await self.pool.aclose()

    async def _start_browser(self, nursery: trio.Nursery) -> None:
        """Start the browser and its vetting proxy, if there is one. With "auto", a first start
        that fails leaves the browser off (logged, and said in /status); with true it fails
        the service."""
        if self.proxy is None or self.browser is None:
            return
        proxy_scope = trio.CancelScope()

        async def run_proxy(task_status: trio.TaskStatus[int]) -> None:
            assert self.proxy is not None
            with proxy_scope:
                await self.proxy.run(task_status=task_status)

        await nursery.start(run_proxy)
        if self.browser_choice.sandbox is False:
            log.warning("Chromium runs without its sandbox ([crawl.browser] sandbox ="
                        f" {self.config.browser.sandbox!r}; as root it cannot use it):"
                        " run crawld as a user to have it")  # fmt: skip
        try:
            await nursery.start(self.browser.run)
        except (BrowserUnavailable, BaseExceptionGroup) as failure:  # the pool's nursery wraps it
            exc = _unavailable(failure)
            if exc is None or self.browser_choice.mode != "auto":
                raise
            log.warning("browser did not start; rendering is off ([crawl.browser] enabled ="
                        ' "auto")', error=str(exc))  # fmt: skip
            proxy_scope.cancel()
            self.browser = self.proxy = None
            self.browser_choice = msgspec.structs.replace(
                self.browser_choice, enabled=False, reason=f"the browser did not start: {exc}"
            )
            self.configure(self.config)

    def _spawn(self, row: crawlstore.CrawlJobRow) -> None:
        self._runs.spawn(row)

    def _make_run(self, row: crawlstore.CrawlJobRow) -> JobRun:
        return JobRun(self.engine, self.store, self.jobs, row, self.clock_ms, self.cluster,
                      self.claimant, self.writes)  # fmt: skip

    # -- producers -------------------------------------------------------------------------

    async def _create(
        self,
        kind: str,
        url: str,
        plan: bytes,
        webhook: Any,
        idempotency_key: str | None,
        setup_frontier: Any,
    ) -> tuple[str, bool]:
        """(job id, created): an idempotent retry returns the job of the first request."""
        key = f"{kind}:{idempotency_key}" if idempotency_key else None
        async with self._create_lock:
            now = self.clock_ms()
            if key is not None:
                since = now - self.jobs.ttl_ms
                existing = await self.store.read(lambda c: crawlstore.idempotent_job(c, key, since))
                if existing is not None:
                    return existing, False

            def setup(conn: Conn, job_id: str) -> None:
                crawlstore.insert_job(conn, job_id, kind, url, plan)
                setup_frontier(conn, job_id)
                if key is not None:
                    crawlstore.remember_idempotency(conn, key, job_id, now, now - self.jobs.ttl_ms)

            job_id = await self.jobs.create_job(
                kind, webhook=webhook, source={"url": url}, setup=setup
            )
        row = await self.store.read(lambda c: crawlstore.get_job(c, job_id))
        if row is not None:
            self._spawn(row)
        return job_id, True

    async def start_crawl(self, plan: CrawlPlan, idempotency_key: str | None = None) -> str:
        job_id, _ = await self._create(
            "crawl", plan.request.url, _encode(plan), plan.webhook, idempotency_key,
            lambda conn, job_id: None,
        )  # fmt: skip
        return job_id

    async def start_batch(self, plan: BatchPlan, idempotency_key: str | None = None) -> str:
        """A new batch job, or (appendToId) the given running batch with more URLs.
        JobNotFound / JobFinished for an appendToId that is unknown / finished."""
        if plan.append_to is not None:
            return await self._append(plan.append_to, plan.urls)

        def frontier(conn: Conn, job_id: str) -> None:
            crawlstore.admit(conn, job_id, batch_candidates(plan.urls, 0), len(plan.urls))
            crawlstore.set_kicked_off(conn, job_id)
            jobstore.set_total(conn, job_id, len(plan.urls))

        job_id, _ = await self._create(
            "batch_scrape", plan.urls[0], _encode(plan), plan.webhook, idempotency_key, frontier
        )
        return job_id

    async def _append(self, job_id: str, urls: list[str]) -> str:
        def tx(conn: Conn) -> None:
            row = crawlstore.get_job(conn, job_id)
            if row is None or row.kind != "batch_scrape":
                raise JobNotFound(job_id)
            if (ending := crawlstore.lock_job(conn, job_id)) is not None:
                raise JobFinished(job_id, ending)
            jobstore.require_running(conn, job_id)
            offset = crawlstore.frontier_size(conn, job_id)
            crawlstore.admit(conn, job_id, batch_candidates(urls, offset), len(urls))
            jobstore.set_total(conn, job_id, crawlstore.admitted(conn, job_id))

        await self.writes.write(tx)
        run = self.runs.get(job_id)
        if run is not None:
            run.wake()
        return job_id

    # -- synchronous endpoints -------------------------------------------------------------

    async def scrape(self, request: ScrapeRequest) -> dict[str, Any]:
        """The document of one URL (robots.txt is not consulted, as in Firecrawl); FetchError
        with Firecrawl's code when it cannot be fetched."""
        engine = self.engine
        produced = await engine.maker.produce(
            request.url,
            engine.plan(request.options, zero_data_retention=request.zeroDataRetention),
            slot=engine.fetch_slots,
        )
        engine.last_success_ms = self.clock_ms()
        return produced.document

    async def parse_file(
        self, body: bytes, filename: str, content_type: str, request: ParseRequest
    ) -> dict[str, Any]:
        """The document of an uploaded file (POST /v2/parse); DocumentError when it has none."""
        return await parse_upload(self.engine, body, filename, content_type, request)

    async def map(self, request: MapRequest) -> list[MapLink]:
        return await map_site(self.engine.fetcher, request)

    # -- readers ---------------------------------------------------------------------------

    async def active_crawls(self) -> list[crawlstore.CrawlJobRow]:
        return await self.store.read(lambda c: crawlstore.running_jobs(c, "crawl"))

    async def cancel(self, record: JobRecord) -> bool:
        """DELETE of a running job, from any instance (the JobManager's canceller): when it is a
        crawl or batch, decide its end `cancelled` in the store (every instance working on it
        claims nothing more and drops what it has in flight) and give the job its final status
        here. False when it is no crawl or batch (or another live instance is ending it): the
        manager goes on; JobFinished when it ended otherwise meanwhile."""
        job_id = record.id
        decided = await self.writes.write(
            lambda c: crawlstore.conclude(c, job_id, self.claimant, "cancelled")
        )
        if decided is None:
            return False
        row = await self.store.read(lambda c: crawlstore.get_job(c, job_id))
        kind = row.kind if row is not None else "crawl"
        # The local run (if any) may apply it first: either way the job ends as decided.
        if await apply_end(self.store, self.jobs, kind, job_id, decided, None):
            log.info("crawl job ended by a cancel", job=job_id, status=decided)
        if (run := self.runs.get(job_id)) is not None:
            run.stop()
        if decided != "cancelled":  # it ended otherwise meanwhile (the jobs API's 409)
            raise JobFinished(job_id, decided)
        return True

    def fetching(self) -> int:
        """Pages being fetched right now, over every engine still in use."""
        return sum(int(e.fetch_slots.borrowed_tokens) for e in self._engines)

    async def queue(self) -> dict[str, Any]:
        """What /v2/team/queue-status counts: pages (Firecrawl's "jobs" are pages) fetching and
        waiting over every running crawl and batch, and the crawl jobs running and waiting for
        a `max_running_jobs` slot."""
        queued = await self.store.read(crawlstore.queued_pages)
        fetching = self.fetching()
        last = max((e.last_success_ms for e in self._engines if e.last_success_ms), default=None)
        return {
            "fetching": fetching,
            "waiting": max(queued - fetching, 0),
            "max_concurrency": self.config.concurrency,
            "last_success_ms": last,
            "jobs_running": sum(1 for r in self.runs.values() if r.started),
            "jobs_waiting": sum(1 for r in self.runs.values() if not r.started),
        }

    async def status(self) -> dict[str, Any]:
        engine = self.engine
        hosts = {h: engine.gate.active(h) for h in list(getattr(engine.gate, "_hosts", {}))}
        return {
            "enabled": self.config.enabled,
            "jobs_running": sum(1 for r in self.runs.values() if r.concurrency and r.started),
            "jobs_queued": sum(1 for r in self.runs.values() if not r.started),
            "pages_fetched": sum(e.pages["fetched"] for e in self._engines),
            "pages_failed": sum(e.pages["failed"] for e in self._engines),
            "fetches_in_flight": int(engine.fetch_slots.borrowed_tokens),
            "host_gates": {h: n for h, n in hosts.items() if n},
            "jobs": {job_id: run.status() for job_id, run in list(self.runs.items())},
            "renders": dict(engine.maker.renders),
            "browser": self.browser_choice.status()
            | (self.browser.status() if self.browser is not None else {}),
            "browser_proxy": dict(self.proxy.counts) if self.proxy is not None else None,
            "cache": await self.cache.status(),
            "change_tracking": dict(self.tracker.counts),
            "ocr": self.documents.status(),
            "content_workers": self.pool.status() if self.pool is not None else None,
            "proxies": engine.fetcher.proxies.status(),
        }


def _unavailable(exc: BaseException) -> BrowserUnavailable | None:
    """The BrowserUnavailable `exc` is, looking through single-member exception groups."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc if isinstance(exc, BrowserUnavailable) else None


__all__ = ["CrawlService", "JobFinished", "JobNotFound"]
