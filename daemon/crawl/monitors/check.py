# One monitor check being worked on by this process (service.py creates checks and runs one
# CheckRun per open check). A check is a durable job: its pages are rows queued at its start
# (scrape targets' URLs), each fetched through the crawl engine (maxAge 0, markdown always) and
# committed with its status, its snapshot and its `monitor.page` event in ONE transaction; a
# crawl target is an ordinary crawl job (its id kept with the check, started with an idempotency
# key so a resumed check finds the same crawl) whose documents become pages the same way. A kill
# -9 loses only pages not committed yet, which the resumed run (same check id) does again; a
# page committed is never counted or announced twice (one row per (check, target, URL)). The
# check ends with `monitor.check.completed` (the jobs part's terminal event), then its row, in
# whose transaction its notifications are recorded (notifier.py).
from __future__ import annotations

import contextlib
import uuid
from typing import TYPE_CHECKING, Any

import msgspec
import trio
from prometheus_client import Counter

from daemon.cluster import Lease, LeaseLost, fenced
from daemon.cluster import store as cluster_store
from daemon.crawl.fetching.fetch import FetchError
from daemon.crawl.fetching.urls import dedupe_key
from daemon.crawl.monitors import compare, models, notifier
from daemon.crawl.monitors import store as mstore
from daemon.crawl.search.service import MAX_QUERY
from daemon.jobs.store import JobFinished, JobNotFound
from daemon.llm import LlmError
from daemon.logs import get_logger
from daemon.metrics import REGISTRY
from daemon.redact import redact_url
from daemon.search import SearchError, SearchQuery
from daemon.store import DB_ERRORS, Conn, StoreClosed

if TYPE_CHECKING:
    from daemon.crawl.monitors.service import MonitorService

log = get_logger("monitors")

CRAWL_POLL_S = 0.5
"""How often a check waiting for its crawl target's crawl looks at it."""
ROWS = 50
SEARCH_RESULTS = 10
"""Results a search target's query asks for when it gives no maxResults."""
ROW_BYTES = 8 * 1024 * 1024
_decode = msgspec.json.Decoder().decode

monitor_checks = Counter(
    "crawld_monitor_checks",
    "Monitor checks by final status (completed, partial, failed, skipped_overlap)",
    ["status"],
    registry=REGISTRY,
)
monitor_pages = Counter(
    "crawld_monitor_pages",
    "Pages of monitor checks by status (same, new, changed, removed, error)",
    ["status"],
    registry=REGISTRY,
)


_STORE_FAILURES: tuple[type[BaseException], ...] = (*DB_ERRORS, StoreClosed)
CANCELLED = "the check was cancelled (DELETE /v2/crawl/{id}, or its job ended)"


class CheckGone(Exception):
    """The check (or its monitor) was deleted, or ended elsewhere."""


def page_key(url: str) -> str:
    return dedupe_key(url, ignore_query=False, similar=False)


class CheckRun:
    """One open check being worked on by this process."""

    def __init__(self, service: MonitorService, row: mstore.CheckRow) -> None:
        self.service = service
        self.store = service.store
        self.jobs = service.jobs
        self.row = row
        self.job_id = row.id
        self.spec = models.decode_spec(row.spec)
        self.targets = {str(t["id"]): t for t in self.spec.targets}
        self.lease: Lease | None = None
        self.target_errors: list[str] = []
        self.done = 0

    def status(self) -> dict[str, Any]:
        return {"monitor": self.row.monitor_id, "pages_done": self.done}

    async def run(self) -> None:
        """Work on the check until it has its final status; returns early, the check left
        open, when the daemon stops or the store fails (the service's scan resumes it). A
        DELETE /v2/crawl/{check id} (or its job ended otherwise) fails the check."""
        try:
            cancel = self.jobs.cancel_requested(self.job_id)
        except JobNotFound:
            cancel = trio.Event()  # its job ended: the check is closed below
        failure: str | None = None
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                await cancel.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            try:
                await self._owned()
            except (JobFinished, JobNotFound):
                failure = CANCELLED
            except (CheckGone, LeaseLost):
                self.jobs.detach(self.job_id)
            except _STORE_FAILURES as exc:
                log.warning("monitor check paused by the store; the next scan resumes it",
                            check=self.job_id, error=f"{type(exc).__name__}: {exc}")  # fmt: skip
                nursery.cancel_scope.cancel()
                return
            except Exception as exc:
                log.error("monitor check failed", check=self.job_id, exc_info=exc)
                failure = f"internal error: {type(exc).__name__}"
            nursery.cancel_scope.cancel()
        if cancel.is_set():
            failure = CANCELLED
        if failure is not None:
            self.lease = None  # the job ended: no instance works on the check any more
            with contextlib.suppress(CheckGone):
                await self._finish(failure)
        cluster = self.service.cluster
        if cluster is not None and cluster.multi:
            with contextlib.suppress(*DB_ERRORS, StoreClosed):
                await self.store.write(
                    lambda c: cluster_store.drop_leases(c, f"monitor:{self.job_id}")
                )

    async def _owned(self) -> None:
        cluster = self.service.cluster
        if cluster is None or not cluster.multi:
            await self._work(None)
            return
        await cluster.run_owned(f"monitor:{self.job_id}", self._work)

    async def _work(self, lease: Lease | None) -> None:
        self.lease = lease
        at = self.service.clock_ms()

        def start(conn: Conn) -> mstore.CheckRow:
            self._check(conn)
            mstore.set_running(conn, self.job_id, at)
            if mstore.set_kicked_off(conn, self.job_id):
                pages = [(tid, page_key(url), url) for tid, t in self.targets.items()
                         if t["type"] == "scrape" for url in t["urls"]]  # fmt: skip
                mstore.queue_pages(conn, self.job_id, pages, at)
                results = [{"targetId": tid, "type": t["type"]} for tid, t in self.targets.items()]
                mstore.set_target_results(conn, self.job_id, results)
            row = mstore.get_check(conn, self.job_id)
            assert row is not None
            return row

        self.row = await self.store.write(start)
        await self._scrape_pages()
        for target_id, target in self.targets.items():
            if target["type"] == "crawl":
                await self._crawl_target(target_id, target)
            elif target["type"] == "search":
                await self._search_target(target_id, target)
        await self._finish(None)

    def _check(self, conn: Conn) -> None:
        fenced.check(conn, self.lease)
        row = mstore.get_check(conn, self.job_id)
        if row is None or row.status not in mstore.OPEN:
            raise CheckGone(self.job_id)

    # -- pages -----------------------------------------------------------------------------

    async def _scrape_pages(self) -> None:
        queued = await self.store.read(lambda c: mstore.queued_pages(c, self.job_id, 0, 10_000))
        send, receive = trio.open_memory_channel[mstore.PageRow](len(queued) or 1)
        for page in queued:
            send.send_nowait(page)
        send.close()

        async def worker() -> None:
            async for page in receive:
                await self._scrape(page)

        async with trio.open_nursery() as nursery:
            for _ in range(max(1, min(self.service.config.check_concurrency, len(queued)))):
                nursery.start_soon(worker)

    async def _scrape(self, page: mstore.PageRow) -> None:
        target = self.targets[page.target_id]
        crawl = self.service.crawl
        engine = crawl.engine
        markdown: str | None = None
        code: int | None = None
        error: str | None = None
        document: dict[str, Any] | None = None
        try:
            request = models.scrape_request(
                page.url, target.get("scrapeOptions"), browser=crawl.browser is not None,
                llm=self.service.llm, tag=self._tag(page.target_id),
            )  # fmt: skip
            produced = await engine.maker.produce(
                page.url, engine.plan(request.options), slot=engine.fetch_slots
            )
            document = produced.document
            markdown = str(document.get("markdown") or "")
            code = document.get("metadata", {}).get("statusCode")
        except FetchError as exc:
            error = f"could not fetch the page: {exc.message}"
        except Exception as exc:
            log.warning("monitor page failed", url=redact_url(page.url), exc_info=exc)
            error = f"{type(exc).__name__} while scraping the page"
        await self._commit(page.target_id, page.url, markdown, code, error, document=document)

    def _tag(self, target_id: str) -> str:
        """The changeTracking tag of the target's pages: its own snapshots in the engine."""
        return f"monitor:{self.row.monitor_id}:{target_id}"

    def _diff(self, target_id: str, diff: dict[str, Any] | None,
              document: dict[str, Any] | None) -> dict[str, Any] | None:  # fmt: skip
        """A changed page's diff: the markdown's (text and parse-diff's structure), or with a
        changeTracking json mode the field diff `{field: {previous, current}}` as `json` (and
        the text too when git-diff is asked as well)."""
        modes = models.tracking_modes(self.targets[target_id])
        if diff is None or "json" not in modes:
            return diff
        tracked = ((document or {}).get("changeTracking") or {}).get("json")
        out: dict[str, Any] = {"json": tracked if tracked is not None else {}}
        if "git-diff" in modes:
            out["text"] = diff["text"]
        return out

    async def _commit(self, target_id: str, url: str, markdown: str | None, code: int | None,
                      error: str | None, *, removed: mstore.Snapshot | None = None,
                      document: dict[str, Any] | None = None) -> None:  # fmt: skip
        at = self.service.clock_ms()
        key = page_key(url) if removed is None else removed.key
        monitor_id = self.row.monitor_id
        if markdown is not None:
            ignore = tuple(self.targets[target_id].get("ignorePatterns") or ())
            markdown = compare.without_noise(markdown, ignore)
        judged: tuple[str, bytes] | None = None
        if removed is None and markdown is not None and self._judges():
            judged = await self._judge(target_id, key, markdown, code)

        def tx(conn: Conn) -> Any:
            self._check(conn)
            previous = mstore.snapshot(conn, monitor_id, target_id, key)
            before = None if previous is None else compare.Previous(
                previous.scrape_id, previous.markdown, previous.gone)  # fmt: skip
            if removed is not None:
                outcome = compare.Outcome("removed", keep=True, gone=True)
            else:
                outcome = compare.page_outcome(before, markdown, code, error)
            scrape_id = str(uuid.uuid4()) if markdown is not None and removed is None else None
            judgment = None
            if (
                outcome.diff is not None
                and judged is not None
                and judged[0] == outcome.diff["text"]
            ):
                judgment = judged[1]
            diff = self._diff(target_id, outcome.diff, document)
            extracted = None if document is None else document.get("json")
            page = mstore.PageRow(
                0, target_id, key, url, "done", outcome.status, code,
                None if previous is None else previous.scrape_id, scrape_id, outcome.error,
                None if diff is None else models.encode(diff), at, None, judgment,
                None if extracted is None else models.encode(extracted),
            )  # fmt: skip
            if not mstore.record_page(conn, self.job_id, page):
                return None
            if outcome.keep:
                mstore.keep_snapshot(conn, monitor_id, target_id, key, url, scrape_id or "",
                                     markdown, outcome.gone, at)  # fmt: skip
            event = models.page_event(monitor_id, self.job_id, page)
            return self.jobs.page_in_tx(conn, self.job_id, [event], keep=False), page.status

        pending = await self.store.write(tx)
        if pending is not None:
            self.done += 1
            monitor_pages.labels(pending[1]).inc()
            await self.jobs.after_commit(pending[0])

    def _judges(self) -> bool:
        llm = self.service.llm
        return bool(self.spec.goal and self.spec.judgeEnabled and llm and llm.configured())

    async def _judge(self, target_id: str, key: str, markdown: str, code: int | None
                     ) -> tuple[str, bytes] | None:  # fmt: skip
        """The model's judgment of the page's diff (a `changed` page only; `new`, `same`,
        `removed` and `error` pages never reach the model), as (diff text, judgment); the LLM
        service caches answers by (goal, diff)."""
        monitor_id = self.row.monitor_id
        previous = await self.store.read(lambda c: mstore.snapshot(c, monitor_id, target_id, key))
        before = None if previous is None else compare.Previous(
            previous.scrape_id, previous.markdown, previous.gone)  # fmt: skip
        outcome = compare.page_outcome(before, markdown, code, None)
        if outcome.diff is None:
            return None
        text = str(outcome.diff["text"])
        judgment = await self._ask_judge(text, models.judge_prompt(self.spec.goal or ""))
        return None if judgment is None else (text, models.encode(judgment))

    async def _ask_judge(self, text: str, prompt: str) -> dict[str, Any] | None:
        """The model's judgment of `text` (a changed page's diff, or a search result seen for
        the first time: Firecrawl judges both) under the monitor's goal; None when the model
        failed or answered out of shape."""
        llm = self.service.llm
        if llm is None:
            return None
        try:
            self.service.judged += 1
            answer = await llm.extract_json(text, schema=models.JUDGMENT_SCHEMA, prompt=prompt)
        except LlmError as exc:
            log.warning("monitor judge failed", check=self.job_id, error=exc.message)
            return None
        return models.judgment_of(answer.value)

    # -- crawl targets ---------------------------------------------------------------------

    async def _crawl_target(self, target_id: str, target: dict[str, Any]) -> None:
        crawl = self.service.crawl
        results: list[dict[str, Any]] = _decode(self.row.target_results or b"[]")
        mine = next((r for r in results if r.get("targetId") == target_id), None)
        crawl_id = None if mine is None else mine.get("crawlId")
        if crawl_id is None:
            plan = models.crawl_plan(target, default_limit=self.service.config.crawl_limit,
                                     browser=crawl.browser is not None, llm=self.service.llm,
                                     tag=self._tag(target_id))  # fmt: skip
            crawl_id = await crawl.start_crawl(
                plan, idempotency_key=f"monitor:{self.job_id}:{target_id}"
            )
            for r in results:
                if r.get("targetId") == target_id:
                    r["crawlId"] = crawl_id

            def keep(conn: Conn) -> None:
                self._check(conn)
                mstore.set_target_results(conn, self.job_id, results)

            await self.store.write(keep)
            self.row = msgspec.structs.replace(self.row, target_results=models.encode(results))
        while (record := await self.jobs.get_job(crawl_id)) is not None and not record.finished:
            await trio.sleep(CRAWL_POLL_S)
        if record is None:
            self.target_errors.append(f"target {target_id}: its crawl {crawl_id} is gone")
            return
        if record.status != "completed":
            self.target_errors.append(f"target {target_id}: its crawl {crawl_id} {record.status}:"
                                      f" {record.error or 'no reason given'}")  # fmt: skip
        found = await self._crawl_pages(target_id, crawl_id)
        if record.status != "completed" or not found:
            return  # a crawl that failed (or reached nothing) is no evidence that pages went away
        gone = await self.store.read(
            lambda c: mstore.unseen(c, self.row.monitor_id, target_id, self.job_id)
        )
        for snap in gone:
            await self._commit(target_id, snap.url, None, None, None, removed=snap)

    async def _crawl_pages(self, target_id: str, crawl_id: str) -> int:
        """The crawl's documents and failed pages committed as the target's pages; how many
        documents it had."""
        skip = 0
        while True:
            rows, more = await self.jobs.job_rows(crawl_id, skip, ROWS, ROW_BYTES)
            for raw in rows:
                doc = _decode(raw)
                meta = doc.get("metadata") or {}
                url = str(meta.get("sourceURL") or meta.get("url") or "")
                if url:
                    await self._commit(target_id, url, str(doc.get("markdown") or ""),
                                       meta.get("statusCode"), None, document=doc)  # fmt: skip
            skip += len(rows)
            if not rows or not more:
                break
        for err in await self.jobs.job_errors(crawl_id):
            if err.url and err.code != "ROBOTS_BLOCKED":
                key = page_key(err.url)
                seen = await self.store.read(
                    lambda c, k=key: mstore.has_page(c, self.job_id, target_id, k)  # type: ignore[misc]
                )
                if not seen:
                    await self._commit(target_id, err.url, None, None, err.error[:500])
        return skip

    # -- search targets --------------------------------------------------------------------

    async def _search_target(self, target_id: str, target: dict[str, Any]) -> None:
        """Each query through [search]; a result (by URL) is a `new` page the first time any
        check of this target sees it, and no page after that."""
        search = self.service.search
        if search is None or search.client is None:
            self.target_errors.append(f"target {target_id}: no search provider ([search])")
            return
        found: dict[str, tuple[str, dict[str, Any]]] = {}
        for query in target["queries"]:
            asked = SearchQuery(
                query=query[:MAX_QUERY], limit=target.get("maxResults") or SEARCH_RESULTS,
                include_domains=tuple(target.get("includeDomains") or ()),
                exclude_domains=tuple(target.get("excludeDomains") or ()),
                tbs=models.SEARCH_WINDOWS.get(target.get("searchWindow") or ""),
            )  # fmt: skip
            try:
                data = await search.client.search(asked, timeout_s=float(search.config.timeout))
            except SearchError as exc:
                self.target_errors.append(f"target {target_id}: search failed: {exc.message}")
                continue
            for item in data.get("web", []):
                if item.get("url"):
                    found.setdefault(str(item["url"]), (query, item))
        for url, (query, item) in found.items():
            await self._commit_result(target_id, url, query, item)

    async def _commit_result(self, target_id: str, url: str, query: str,
                             item: dict[str, Any]) -> None:  # fmt: skip
        key = page_key(url)
        monitor_id = self.row.monitor_id
        text = f"{item.get('title') or ''}\n\n{item.get('description') or ''}"
        judgment = None
        if self._judges() and not await self.store.read(
            lambda c: mstore.snapshot(c, monitor_id, target_id, key) is not None
        ):
            prompt = models.judge_result_prompt(self.spec.goal or "")
            judgment = await self._ask_judge(f"{url}\n{text}", prompt)
        metadata = {"searchStatus": models.search_status(judgment), "query": query,
                    "title": item.get("title"), "description": item.get("description")}  # fmt: skip
        at = self.service.clock_ms()

        def tx(conn: Conn) -> Any:
            self._check(conn)
            if mstore.snapshot(conn, monitor_id, target_id, key) is not None:
                return None  # seen by an earlier check: reported once
            scrape_id = str(uuid.uuid4())
            verdict = None if judgment is None else models.encode(judgment)
            page = mstore.PageRow(0, target_id, key, url, "done", "new", None, None, scrape_id,
                                  None, None, at, models.encode(metadata), verdict)  # fmt: skip
            if not mstore.record_page(conn, self.job_id, page):
                return None
            mstore.keep_snapshot(conn, monitor_id, target_id, key, url, scrape_id, text, False, at)
            event = models.page_event(monitor_id, self.job_id, page)
            return self.jobs.page_in_tx(conn, self.job_id, [event], keep=False), page.status

        pending = await self.store.write(tx)
        if pending is not None:
            self.done += 1
            monitor_pages.labels(pending[1]).inc()
            await self.jobs.after_commit(pending[0])

    # -- the end ---------------------------------------------------------------------------

    async def _finish(self, failure: str | None) -> None:
        statuses, queued = await self.store.read(lambda c: mstore.status_counts(c, self.job_id))
        if queued and failure is None:
            raise CheckGone(self.job_id)  # a page left queued (store failure): the scan resumes
        counts = compare.summary(statuses)
        status = "failed" if failure else compare.check_status(counts, len(self.target_errors))
        error = failure or "; ".join(self.target_errors) or None
        if status == "partial" and error is None:
            error = f"{counts['error']} of {counts['totalPages']} pages could not be checked"
        elif status == "failed" and error is None:
            error = "every page of the check failed"
        data = [{"monitorId": self.row.monitor_id, "checkId": self.job_id, "status": status,
                 "summary": counts}]  # fmt: skip
        with contextlib.suppress(JobFinished, JobNotFound):
            await self.jobs.finish(self.job_id, "completed" if status == "completed" else "failed",
                                   error, data=data)  # fmt: skip
        at = self.service.clock_ms()
        keep_days = self.spec.retentionDays

        def tx(conn: Conn) -> bool:
            fenced.check(conn, self.lease)
            if not mstore.finish_check(conn, self.job_id, status, counts, error, at):
                return False
            notifier.record(conn, self.spec, monitor_id=self.row.monitor_id, check_id=self.job_id,
                            status=status, summary=counts, at_ms=at)  # fmt: skip
            mstore.release(conn, self.row.monitor_id, self.job_id, counts)
            mstore.purge_checks(conn, self.row.monitor_id, at - keep_days * 86_400_000, 100)
            return True

        if await self.store.write(tx):
            monitor_checks.labels(status).inc()
        log.info("monitor check finished", check=self.job_id, monitor=self.row.monitor_id,
                 status=status, **counts)  # fmt: skip
