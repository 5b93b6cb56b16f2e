# One /v2/extract job being worked on by this process (daemon/crawl/extract/service.py creates the
# jobs and runs one ExtractRun per running job): the kickoff admits the request's URLs, the sitemap
# URLs of each `/*` URL and a web search's results; workers fetch each page through the crawl
# engine, ask the model, and store the answer with the links it admitted in one transaction; once
# no page is queued the answers are merged (merge.py) into the job's result.
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec
import trio
from prometheus_client import Counter

from daemon.cluster import Lease, LeaseLost, fenced
from daemon.crawl.discovery.robots import Robots, fetch_scope_robots
from daemon.crawl.discovery.sitemap import sitemap_urls
from daemon.crawl.extract import store as xstore
from daemon.crawl.extract.merge import merge
from daemon.crawl.extract.models import decode_plan, instruction, wildcard_base
from daemon.crawl.fetching.fetch import FetchError
from daemon.crawl.fetching.urls import CrawlScope, dedupe_key
from daemon.crawl.options import rules
from daemon.crawl.runs.owned import work_on
from daemon.crawl.search.service import MAX_QUERY
from daemon.jobs import store as jobstore
from daemon.jobs.events import CANCELLED_BY_USER
from daemon.jobs.store import JobFinished, JobNotFound
from daemon.llm import LlmError
from daemon.logs import get_logger
from daemon.metrics import REGISTRY
from daemon.redact import redact_url
from daemon.search import SearchError, SearchQuery
from daemon.store import DB_ERRORS, Conn

if TYPE_CHECKING:
    from daemon.crawl.extract.service import ExtractService

log = get_logger("extract")

WORKERS = 8
"""Pages of one job in flight at most (fetch, then model): the LLM service's max_concurrency
bounds the model calls over all jobs."""
REFILL = 64
EMPTY_PAGE = "EXTRACT_EMPTY_PAGE"
HTTP_ERROR = "EXTRACT_HTTP_ERROR"
FAILED_PAGE = "EXTRACT_FAILED"
SEARCH_FAILED = "SEARCH_FAILED"
SEARCH_RESULTS = 10
"""Web results a web search adds (Firecrawl's extract searches 10)."""

extract_pages = Counter(
    "crawld_extract_pages",
    "Pages of /v2/extract jobs by outcome (done, fetch_failed, http_error, empty, llm_failed)",
    ["outcome"],
    registry=REGISTRY,
)
extract_jobs = Counter(
    "crawld_extract_jobs", "Finished /v2/extract jobs by status", ["status"], registry=REGISTRY
)

_decode_any = msgspec.json.Decoder().decode
_STOP: tuple[type[BaseException], ...] = (JobFinished, JobNotFound, LeaseLost, *DB_ERRORS)


class ExtractFailed(Exception):
    """The job cannot go on (e.g. a web search found nothing to read): it fails with this."""


class _Outcome(msgspec.Struct):
    entry: xstore.PageEntry
    value: Any = None
    tokens: int = 0
    error: str | None = None
    code: str | None = None
    links: list[tuple[str, str, int, int]] = []


class ExtractRun:
    """One extract job being worked on by this process."""

    def __init__(self, service: ExtractService, row: xstore.ExtractJobRow) -> None:
        self.service = service
        self.store = service.store
        self.jobs = service.jobs
        self.job_id = row.job_id
        self.row = row
        self.plan = decode_plan(row.plan)
        self.engine = service.crawl.engine
        self.page_plan = self.engine.plan(self.plan.options)
        self.lease: Lease | None = None
        self.scopes: dict[int, CrawlScope] = {}
        self.robots: dict[int, Robots] = {}
        for i, url in enumerate(self.plan.urls):
            base = wildcard_base(url)
            if base is not None:
                self.scopes[i] = CrawlScope(
                    start_url=base,
                    allow_subdomains=self.plan.include_subdomains,
                    allow_external_links=self.plan.allow_external_links,
                )
        self.policy = rules.LinkPolicy()
        self.queue: deque[xstore.PageEntry] = deque()
        self.after_n = 0
        self.in_flight = 0
        self.lot = trio.lowlevel.ParkingLot()
        self.refill_lock = trio.Lock()
        self.done = 0
        self.failed = 0
        self.stopped: BaseException | None = None
        """Why the workers stopped early (raised again once they all have)."""

    def status(self) -> dict[str, Any]:
        return {"in_flight": self.in_flight, "done": self.done, "failed": self.failed}

    # -- lifecycle -------------------------------------------------------------------------

    async def run(self) -> None:
        """Work on the job until it has its final status; returns early, the job left running,
        when the daemon stops or the store fails (the service's scan starts it again)."""
        await work_on(
            "extract", self.job_id, jobs=self.jobs, store=self.store,
            cluster=self.service.cluster, work=self._work, finish=self._finish, end=self._end,
            deadline=self._deadline, failure=ExtractFailed,
            timed_out=f"Extract timed out after {self.plan.timeout} ms",
            cancelled=CANCELLED_BY_USER,
        )  # fmt: skip

    async def _end(self, status: str, error: str | None) -> None:
        await self._finish(status, error, None)

    def _deadline(self) -> float:
        if self.plan.timeout is None:
            return float("inf")
        left_ms = self.row.created_ms + self.plan.timeout - self.service.clock_ms()
        return trio.current_time() + max(0.0, left_ms / 1000)

    async def _finish(self, status: str, error: str | None, data: list[Any] | None) -> None:
        try:
            await self.jobs.finish(self.job_id, status, error, data=data)  # type: ignore[arg-type]
        except (JobFinished, JobNotFound):
            return
        extract_jobs.labels(status).inc()
        log.info("extract job finished", job=self.job_id, status=status, pages=self.done,
                 failed=self.failed, error=error)  # fmt: skip

    async def _work(self, lease: Lease | None) -> tuple[str, str | None, list[Any] | None]:
        self.lease = lease
        record = await self.jobs.get_job(self.job_id)
        if record is None or record.finished:
            raise JobFinished(self.job_id, record.status if record else "gone")
        await fetch_scope_robots(self.engine.fetcher, self.scopes, self.robots)
        if not await self.store.read(lambda c: xstore.kicked_off(c, self.job_id)):
            await self._kickoff()
        self.queue.clear()
        self.after_n = 0
        self.stopped = None
        async with trio.open_nursery() as workers:
            for _ in range(WORKERS):
                workers.start_soon(self._worker, workers.cancel_scope)
        if self.stopped is not None:
            raise self.stopped
        return await self._merge()

    async def _kickoff(self) -> None:
        """Admit the request's URLs (a `/*` URL as its base) and the sitemap URLs in the scope
        of each `/*` URL (unless ignoreSitemap)."""
        first: list[tuple[str, str, int, int]] = []
        found: list[tuple[str, str, int, int]] = []
        for i, url in enumerate(self.plan.urls):
            base = wildcard_base(url) or url
            first.append((dedupe_key(base, ignore_query=False, similar=True), base, i, 0))
            if i in self.scopes and not self.plan.ignore_sitemap:
                try:
                    urls = await sitemap_urls(
                        self.engine.fetcher, base, self.robots[i], limit=self.plan.limit
                    )
                except FetchError as exc:
                    log.info("no sitemap", job=self.job_id, error=exc.message)
                    urls = []
                found += self._admissible(i, urls, -1)
        searched, search_error = await self._web_search() if self.plan.web_search else ([], None)
        if not first and not searched:
            raise ExtractFailed(search_error or "No search results found")
        first += searched
        at = self.service.clock_ms()

        def tx(conn: Conn) -> None:
            self._check(conn)
            if not xstore.set_kicked_off(conn, self.job_id):
                return
            if search_error is not None:
                jobstore.add_error(conn, self.job_id, code=SEARCH_FAILED, error=search_error,
                                   url=None, at_ms=at)  # fmt: skip
            xstore.admit(conn, self.job_id, first, len(first))
            room = self.plan.limit - xstore.page_count(conn, self.job_id)
            xstore.admit(conn, self.job_id, found, room)
            jobstore.set_total(conn, self.job_id, xstore.page_count(conn, self.job_id))

        await self.store.write(tx)

    async def _web_search(self) -> tuple[list[tuple[str, str, int, int]], str | None]:
        """Pages of a web search for the prompt (at most SEARCH_RESULTS web results, in the
        provider's order; Firecrawl searches an LLM rewrite of it), and the error when the
        search failed. Their root is -1: no link of theirs is followed."""
        search = self.service.search
        if search is None or search.client is None:
            return [], "web search is not configured ([search])"
        query = SearchQuery(query=(self.plan.prompt or "")[:MAX_QUERY], limit=SEARCH_RESULTS)
        try:
            data = await search.client.search(query, timeout_s=float(search.config.timeout))
        except SearchError as exc:
            log.warning("extract web search failed", job=self.job_id, error=exc.message)
            return [], f"Web search failed: {exc.message}"
        urls = [str(item["url"]) for item in data.get("web", []) if item.get("url")]
        return [(dedupe_key(u, ignore_query=False, similar=True), u, -1, 0) for u in urls], None

    def _admissible(
        self, root: int, links: list[str], depth: int
    ) -> list[tuple[str, str, int, int]]:
        scope = self.scopes.get(root)
        if scope is None:
            return []
        robots = self.robots[root]
        admission = rules.admit_links(links, depth, self.policy, scope.refusal, robots.allowed)
        return [(key, url, root, d) for key, url, d in admission.candidates]

    def _check(self, conn: Conn) -> None:
        fenced.check(conn, self.lease)
        jobstore.require_running(conn, self.job_id)

    # -- pages -----------------------------------------------------------------------------

    async def _next(self) -> xstore.PageEntry | None:
        while True:
            if self.queue:
                self.in_flight += 1
                return self.queue.popleft()
            async with self.refill_lock:
                if not self.queue:
                    rows = await self.store.read(
                        lambda c: xstore.queued(c, self.job_id, self.after_n, REFILL)
                    )
                    if rows:
                        self.after_n = rows[-1].n
                        self.queue.extend(rows)
            if self.queue:
                continue
            if self.in_flight == 0:
                self.lot.unpark_all()
                return None
            await self.lot.park()  # a page in flight may admit more

    async def _worker(self, workers: trio.CancelScope) -> None:
        try:
            while (entry := await self._next()) is not None:
                try:
                    outcome = await self._page(entry)
                    await self._commit(outcome)
                finally:
                    self.in_flight -= 1
                    self.lot.unpark_all()
        except _STOP as exc:
            # The job ended elsewhere (a cancel, another instance), or the store failed: stop
            # every worker; the run ends (or its scan restarts it) without a group to unwrap.
            if self.stopped is None:
                self.stopped = exc
            workers.cancel()

    def _check_hop(self, entry: xstore.PageEntry) -> Callable[[str], str | None] | None:
        scope = self.scopes.get(entry.root)
        if scope is None:
            return None
        return lambda url: None if url == entry.url else scope.refusal(url)

    async def _page(self, entry: xstore.PageEntry) -> _Outcome:
        engine = self.engine
        try:
            produced = await engine.maker.produce(
                entry.url, self.page_plan, check_hop=self._check_hop(entry),
                slot=engine.fetch_slots,
            )  # fmt: skip
        except FetchError as exc:
            extract_pages.labels("fetch_failed").inc()
            return _Outcome(entry, error=f"could not fetch the page: {exc.message}", code=exc.code)
        except Exception as exc:
            log.warning("page could not be turned into a document", url=redact_url(entry.url),
                        exc_info=exc)  # fmt: skip
            extract_pages.labels("fetch_failed").inc()
            return _Outcome(entry, error=f"{type(exc).__name__} while parsing the page",
                            code="UNKNOWN_ERROR")  # fmt: skip
        links = self._admissible(entry.root, produced.links, entry.depth)
        markdown = str(produced.document.get("markdown") or "")
        status = produced.document.get("metadata", {}).get("statusCode")
        if isinstance(status, int) and status >= 400:
            # An error page's text is no data of the site's: never merged into the result.
            extract_pages.labels("http_error").inc()
            return _Outcome(entry, error=f"the page answered HTTP {status}", code=HTTP_ERROR,
                            links=links)  # fmt: skip
        if not markdown.strip():
            extract_pages.labels("empty").inc()
            return _Outcome(entry, error="the page has no text to extract from", code=EMPTY_PAGE,
                            links=links)  # fmt: skip
        llm = self.service.llm
        if llm is None:
            return _Outcome(entry, error="no LLM is configured ([llm])", code="LLM_NOT_CONFIGURED",
                            links=links)  # fmt: skip
        try:
            self.service.model_calls += 1
            answer = await llm.extract_json(
                markdown, schema=self.plan.schema, prompt=instruction(self.plan),
                provider=self.plan.provider,
            )  # fmt: skip
        except LlmError as exc:
            extract_pages.labels("llm_failed").inc()
            return _Outcome(entry, error=f"{exc.code}: {exc.message}"[:2000], code=exc.code,
                            links=links)  # fmt: skip
        except Exception as exc:  # a bug must not stick the job: this page fails
            log.error("model call failed unexpectedly", job=self.job_id, exc_info=exc)
            extract_pages.labels("llm_failed").inc()
            return _Outcome(entry, error=f"internal error: {type(exc).__name__}",
                            code="LLM_ERROR", links=links)  # fmt: skip
        tokens = 0
        if not answer.cached:
            tokens = int(answer.usage.prompt_tokens) + int(answer.usage.completion_tokens)
        extract_pages.labels("done").inc()
        return _Outcome(entry, value=answer.value, tokens=tokens, links=links)

    async def _commit(self, outcome: _Outcome) -> None:
        at = self.service.clock_ms()
        entry = outcome.entry

        def tx(conn: Conn) -> None:
            self._check(conn)
            stored = xstore.finish_page(conn, self.job_id, entry.n, value=outcome.value,
                                        tokens=outcome.tokens, error=outcome.error)  # fmt: skip
            if not stored:
                return
            if outcome.error is not None:
                jobstore.add_error(conn, self.job_id, code=outcome.code or FAILED_PAGE,
                                   error=outcome.error, url=entry.url, at_ms=at)  # fmt: skip
            else:
                jobstore.add_rows(conn, self.job_id, [entry.url], keep=False)
            if outcome.links:
                room = self.plan.limit - xstore.page_count(conn, self.job_id)
                xstore.admit(conn, self.job_id, outcome.links, room)
            jobstore.set_total(conn, self.job_id, xstore.page_count(conn, self.job_id))

        try:
            await self.store.write(tx)
        except DB_ERRORS as exc:
            # The page stays queued: a later run (or restart) does it again.
            log.error("extract page not stored", job=self.job_id, error=str(exc))
            return
        if outcome.error is None:
            self.done += 1
        else:
            self.failed += 1

    # -- result ----------------------------------------------------------------------------

    async def _merge(self) -> tuple[str, str | None, list[Any] | None]:
        pages = await self.store.read(lambda c: xstore.results(c, self.job_id))
        if any(p.state == "queued" for p in pages):
            raise JobFinished(self.job_id, "stopped")  # a store failure left pages: next run
        done = [(p.url, _decode_any(p.value)) for p in pages if p.state == "done" and p.value]
        failed = [p for p in pages if p.state == "failed"]
        if not done:
            if not failed:
                return "failed", "No pages could be found to extract from", None
            first = failed[0]
            return (
                "failed",
                (f"Every page failed ({len(failed)}); {redact_url(first.url)}: {first.error}"),
                None,
            )
        result, sources = merge(self.plan.schema, done)
        tokens = sum(p.tokens for p in pages)
        warnings = [self.plan.warning] if self.plan.warning else []
        if failed:
            warnings.append(
                f"{len(failed)} of {len(pages)} pages could not be extracted; GET"
                f" /v2/crawl/{self.job_id}/errors lists them"
            )
        warning = " ".join(warnings) or None

        def tx(conn: Conn) -> None:
            self._check(conn)
            xstore.save_result(conn, self.job_id, result, sources, tokens, warning)

        await self.store.write(tx)
        body: dict[str, Any] = {"success": True, "data": result, "extractId": self.job_id,
                                "tokensUsed": tokens}  # fmt: skip
        if self.plan.show_sources:
            body["sources"] = sources
        return "completed", None, [body]
