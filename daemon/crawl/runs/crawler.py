# The crawl and batch-scrape job runner. What to fetch lives in the store (the job's frontier), not
# in memory: workers pull queued frontier rows in discovery order, in chunks, so a 100k-URL
# frontier costs a chunk of memory, and a restarted daemon resumes a crawl from exactly what was
# committed.
#
# Pages commit through one committer task per job: it takes whatever pages finished, stores them
# in one transaction (documents and `page` events through the JobManager, frontier states, the
# links admitted with the crawl's `limit` checked inside the transaction) and then lets the
# manager wake the webhook drainer, in order. That keeps the manager's contract (one producer per
# job, events issued in commit order) without serialising the fetches, and group-commits pages
# when a crawl is fast.
#
# Cluster mode: every instance runs a JobRun for every running crawl (the service's scan picks up
# those it did not create). Workers claim frontier rows for this process (`claimant`), a chunk of
# `concurrency` rows whenever its queue runs dry, so pages spread over the instances; a commit
# stores only the pages whose rows this process still holds, after `lock_job`, which orders the
# commits of one crawl over every instance and says whether the crawl ended. The crawl's end
# (completed, cancelled, failed) is decided once, by `conclude` (see daemon/crawl/runs/store.py),
# and the process that decided it gives the job its final status. A paced crawl (delay or
# Crawl-delay) runs in one place: under the lease `crawl:<job id>`, whose holder claims every queued
# row and checks the lease in each write; the others wait for the lease. The kickoff (start URL,
# sitemap) runs under the same lease.
#
# Why a chunk, not just the rows the workers can fetch now: with the pages waiting for their commit
# counted as in flight, that came to one row per claim, each a transaction of its own, taken one
# after the other behind the refill lock; at concurrency 16 the claims' round trips, not the
# fetches, bounded a fast crawl (scripts/bench_crawl.py: a third more pages/s in chunks).
#
# Only the pages between fetch and commit are lost at a kill -9: at most [crawl] concurrency being
# fetched, as many waiting for the committer and a batch of them being committed; their rows stay
# queued, claimed by a dead process, and another instance claims and fetches them again (as it
# does the rows claimed ahead and not yet fetched, at most a chunk).
#
# On a shared store (PostgreSQL) this process hands the store one crawl write that locks a crawl's
# rows at a time (`CrawlWrites`): the store commits queued writes in groups, and a group holding
# the rows of crawl X then Y on one instance while another holds Y then X deadlocks; PostgreSQL
# finds it only after its deadlock_timeout (1 s), long enough to make the cluster's lease
# renewals, queued behind it, late. One crawl per group cannot deadlock with another.
#
# Cancel (DELETE, on whichever instance works on the crawl) decides the end `cancelled` in the
# store: every instance finds it at its next claim or commit, claims nothing more and drops what
# it had in flight. A daemon shutdown cancels everything and leaves the job `scraping`.
#
# The rooms around this one: what every job shares (engine.py), how a plan reads (run_settings.py),
# storing a batch of pages (commit.py), and how the work ends or is interrupted (ending.py).
from __future__ import annotations

import contextlib
import functools
from collections import deque
from collections.abc import Callable
from typing import Any

import msgspec
import trio

from daemon.clock import EpochClock, wall_ms
from daemon.cluster import Cluster, Lease, fenced
from daemon.crawl.cache.documents import Hit
from daemon.crawl.discovery.robots import Robots, fetch_robots
from daemon.crawl.discovery.sitemap import sitemap_urls
from daemon.crawl.fetching.fetch import FetchError
from daemon.crawl.fetching.urls import dedupe_key, parse_http_url
from daemon.crawl.metrics import crawl_interruptions, crawl_pages
from daemon.crawl.options import rules
from daemon.crawl.runs import store as crawlstore
from daemon.crawl.runs.commit import Failed, Outcome, Page, blocked_in_tx, commit_tx
from daemon.crawl.runs.ending import (
    INTERRUPTIONS,
    CrawlEnded,
    all_of,
    any_of,
    apply_end,
    leaves,
    summary,
)
from daemon.crawl.runs.engine import CrawlWrites, Engine
from daemon.crawl.runs.run_settings import run_settings
from daemon.jobs import store as jobstore
from daemon.jobs.manager import JobManager, PendingEvents
from daemon.jobs.store import JobFinished, JobNotFound
from daemon.logs import get_logger
from daemon.redact import redact_url
from daemon.store import DB_ERRORS, Conn, Store, StoreClosed, wake

log = get_logger("crawl")

POLL_S = 0.25
"""How often a worker with nothing to claim looks again without a wake-up: links queued or
claims given back, and the crawl's end, in any instance, wake it (daemon/store/wake.py
FRONTIER); this finds the rows of an instance that died once it is no longer alive. One claim
per instance, not per worker."""
ENDING_POLL_S = 1.0
"""How often a running job looks whether its end was decided elsewhere (a DELETE on another
instance), to drop the pages it is fetching instead of finishing them for nothing."""
COMMIT_BATCH = 64
"""Most finished pages stored in one transaction (and at most [crawl] concurrency)."""


INTERRUPTED_PAUSE_S = 0.5
"""Pause before working on an interrupted job again (a write waits for the store by itself)."""


class JobRun:
    """One crawl or batch job being worked on by this process."""

    def __init__(
        self,
        engine: Engine,
        store: Store,
        jobs: JobManager,
        row: crawlstore.CrawlJobRow,
        clock_ms: EpochClock = wall_ms,
        cluster: Cluster | None = None,
        claimant: str = "",
        writes: CrawlWrites | None = None,
    ) -> None:
        self.engine = engine
        self.writes = writes or CrawlWrites(store)
        self.cluster = cluster
        self.claimant = claimant
        self.lease_name = f"crawl:{row.job_id}"
        self.lease: Lease | None = None
        self.store = store
        self.jobs = jobs
        self.row = row
        self.job_id = row.job_id
        self.clock_ms = clock_ms
        self.batch = row.kind == "batch_scrape"
        settings = run_settings(row)
        self.plan = settings.plan
        self.limit = settings.limit
        self.max_concurrency = settings.max_concurrency
        self.delay = settings.delay
        self.zdr = settings.zero_data_retention
        self.scope = settings.scope
        self.policy = settings.policy
        options = settings.options
        self.page_plan = engine.plan(options, zero_data_retention=self.zdr)
        self.robots = Robots.allow_all()
        self.concurrency = 1
        self.pace: float | None = None
        self.queue: deque[crawlstore.FrontierEntry] = deque()
        self.looked_up: dict[int, Hit | None] = {}
        """The document cache's answers for queued rows, by frontier `n` (asked per claim)."""
        self.in_flight = 0
        self.generation = 0
        self.dry: int | None = None
        """`generation` at the last claim that found nothing to take."""
        self.drained: int | None = None
        """`generation` at which a worker found nothing queued and nothing in flight: the run's
        work is done, and every worker woken at that generation stops too (instead of each
        waiting out its own poll first, one after the other behind the refill lock)."""
        self.lot = trio.lowlevel.ParkingLot()
        self.refill_lock = trio.Lock()
        self.work_scope = trio.CancelScope()
        self.cancel_asked = False
        self.ended = False
        self.prepared = False
        self.started = False
        self.fetched = 0
        self.failed = 0
        self.interruptions = 0

    # -- lifecycle -------------------------------------------------------------------------

    async def run(self) -> None:
        """Work on the job until its end is decided; the process that decides it gives the job
        its final status. Returns early (job left running) when the daemon stops."""
        try:
            cancel = self.jobs.cancel_requested(self.job_id)
        except JobNotFound:
            return
        async with trio.open_nursery() as watcher:

            async def watch() -> None:
                await cancel.wait()
                self.cancel_asked = True
                self.work_scope.cancel()

            async def watch_store() -> None:
                while True:
                    await trio.sleep(ENDING_POLL_S)
                    with contextlib.suppress(*DB_ERRORS):
                        ending = await self.store.read(
                            lambda c: crawlstore.job_ending(c, self.job_id)
                        )
                        if ending is not None:
                            self.stop()

            watcher.start_soon(watch)
            watcher.start_soon(watch_store)
            status, error = await self._until_ended()
            watcher.cancel_scope.cancel()
        if status is not None and await apply_end(
            self.store, self.jobs, self.row.kind, self.job_id, status, error
        ):
            log.info("crawl job finished", job=self.job_id, status=status, pages=self.fetched,
                     failed=self.failed)  # fmt: skip
        else:
            self.jobs.detach(self.job_id)

    async def _until_ended(self) -> tuple[str | None, str | None]:
        """(final status, error) when this process is to apply the job's end, (None, None) when
        another does. A store failure or a lost lease interrupts the work, never ends the job:
        the work starts again from what is committed once the store answers (or, for a paced
        crawl, once this process holds the crawl's lease again)."""
        while True:
            ending, error = "completed", None
            if not self.cancel_asked:
                try:
                    with trio.CancelScope() as self.work_scope:
                        await self._work()
                except trio.Cancelled:
                    raise
                except Exception as exc:
                    if any_of(exc, StoreClosed):
                        raise StoreClosed("the store closed under a crawl job") from exc
                    if any_of(exc, JobFinished):
                        return None, None
                    if all_of(exc, INTERRUPTIONS):
                        await self._interrupted(exc)
                        continue
                    log.error("crawl job failed", job=self.job_id, exc_info=exc)
                    kinds = dict.fromkeys(type(leaf).__name__ for leaf in leaves(exc))
                    ending, error = "failed", f"internal error: {', '.join(kinds)}"
            if self.cancel_asked:
                ending = "cancelled"
            frontier = self.store.wakeups.event(wake.FRONTIER, self.job_id)
            try:
                decided = await self.writes.write(
                    functools.partial(crawlstore.conclude, job_id=self.job_id,
                                      claimant=self.claimant, ending=ending)
                )  # fmt: skip
                if decided is not None:
                    return decided, error if decided == ending else None
                if await self.store.read(lambda c: crawlstore.job_ending(c, self.job_id)):
                    return None, None
            except DB_ERRORS as exc:
                await self._interrupted(exc)
                continue
            with trio.move_on_after(POLL_S):
                await frontier.wait()

    async def _interrupted(self, exc: BaseException) -> None:
        """The work stopped on a store failure or a lost lease: the job goes on (`scraping`)
        and the work starts again after a pause, from what is committed."""
        self.interruptions += 1
        crawl_interruptions.labels(self.row.kind).inc()
        log.warning("crawl work interrupted; it goes on from what is committed", job=self.job_id,
                    error=summary(exc), retry_in_s=INTERRUPTED_PAUSE_S)  # fmt: skip
        await trio.sleep(INTERRUPTED_PAUSE_S)

    async def _work(self) -> None:
        if not self.prepared:
            await self._prepare()
            self.prepared = True
        self.ended = False
        if self.pace is not None and self.cluster is not None:
            await self.cluster.run_owned(self.lease_name, self._fetch_all)
        else:
            await self._fetch_all(None)

    async def _fetch_all(self, lease: Lease | None) -> None:
        # Bounded so fetching cannot run far ahead of storing: a kill loses (and another
        # instance fetches again) at most the pages being fetched, waiting here and committed.
        self.lease = lease
        self.queue.clear()
        self.looked_up.clear()
        self.in_flight = 0
        self.drained = None
        await self.writes.write(
            functools.partial(crawlstore.release_claims, job_id=self.job_id, claimant=self.claimant)
        )
        send, recv = trio.open_memory_channel[Outcome](self.engine.config.concurrency)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._committer, recv)
            async with send, self.engine.job_slots:
                self.started = True
                await self._kick_off_once(lease)
                async with trio.open_nursery() as workers:
                    for _ in range(self.concurrency):
                        workers.start_soon(self._worker, send.clone())

    async def _prepare(self) -> None:
        if self.plan is not None:
            request = self.plan.request
            if not request.ignoreRobotsTxt:
                origin = _origin(request.url)
                self.robots = await fetch_robots(self.engine.fetcher, origin)
            self.concurrency, self.pace = rules.fetch_pacing(
                max_concurrency=request.maxConcurrency,
                delay=request.delay,
                robots_delay=self.robots.crawl_delay,
                ignore_robots=request.ignoreRobotsTxt,
                global_concurrency=self.engine.config.concurrency,
            )
        else:
            self.concurrency = min(
                self.max_concurrency or self.engine.config.concurrency,
                self.engine.config.concurrency,
            )

    async def _kick_off_once(self, lease: Lease | None) -> None:
        """The kickoff, by one instance: under the crawl's lease (held already by a paced
        crawl's owner), skipped when another instance did it."""
        if self.plan is None or await self.store.read(
            lambda c: crawlstore.kicked_off(c, self.job_id)
        ):
            return
        if lease is None and self.cluster is not None:
            await self.cluster.run_owned(self.lease_name, self._kickoff, again=False)
        else:
            await self._kickoff(lease)

    async def _kickoff(self, lease: Lease | None) -> None:
        """Admit the start URL and (sitemap include|only) the sitemap's URLs, at depth 0."""
        assert self.plan is not None and self.scope is not None
        if await self.store.read(lambda c: crawlstore.kicked_off(c, self.job_id)):
            return
        request = self.plan.request
        start = request.url
        found: list[str] = []
        if request.sitemap != "skip":
            try:
                found = await sitemap_urls(
                    self.engine.fetcher, start, self.robots, limit=self.plan.limit
                )
            except FetchError as exc:
                log.info("no sitemap", job=self.job_id, error=exc.message)
        admission = rules.admit_links(
            found, -1, rules.LinkPolicy(ignore_query=self.policy.ignore_query,
                                        similar=self.policy.similar),
            self.scope.refusal, self._robots_allowed,
        )  # fmt: skip
        start_key = dedupe_key(start, ignore_query=self.policy.ignore_query,
                               similar=self.policy.similar)  # fmt: skip
        candidates = [(start_key, start, 0), *admission.candidates]

        def tx(conn: Conn) -> None:
            fenced.check(conn, lease)
            jobstore.require_running(conn, self.job_id)
            if not crawlstore.set_kicked_off(conn, self.job_id):
                return
            crawlstore.admit(conn, self.job_id, candidates, int(self.plan.limit))  # type: ignore[union-attr]
            self._blocked_in_tx(conn, admission.robots_blocked)
            jobstore.set_total(conn, self.job_id, crawlstore.admitted(conn, self.job_id))

        await self.writes.write(tx)

    def _robots_allowed(self, url: str) -> bool:
        return self.robots.allowed(url)

    def stop(self) -> None:
        """The crawl ended (decided here or elsewhere): drop what is in flight now."""
        self.ended = True
        self.work_scope.cancel()

    def wake(self) -> None:
        """New frontier rows were stored outside this run (batch appendToId)."""
        self.generation += 1
        self.lot.unpark_all()

    # -- workers ---------------------------------------------------------------------------

    async def _next(self) -> crawlstore.FrontierEntry | None:
        wakeups = self.store.wakeups
        while True:
            frontier = wakeups.event(wake.FRONTIER, self.job_id)  # by any instance
            if self.queue:
                self.in_flight += 1
                return self.queue.popleft()
            if self.ended or self.drained == self.generation:
                return None
            async with self.refill_lock:
                if self.queue or self.ended or self.drained == self.generation:
                    continue
                if self.dry == self.generation:
                    backlog = None  # another worker just found nothing: wait with it
                else:
                    want = self.concurrency
                    rows, backlog = await self.writes.write(
                        lambda c: self._claim_tx(c, want)  # noqa: B023
                    )
                    await self._look_up(rows)
                    self.queue.extend(rows)
                    self.dry = None if rows else self.generation
            if self.queue:
                continue
            if backlog is not None:
                if backlog.ending is not None:
                    self.ended = True
                    self.lot.unpark_all()
                    return None
                if backlog.queued == 0 and self.in_flight == 0:
                    self.drained = self.generation
                    self.lot.unpark_all()
                    return None
                if backlog.claimable:
                    self.dry = None  # lost a race for those rows to another instance
                    await trio.lowlevel.checkpoint()
                    continue
            with trio.move_on_after(POLL_S):
                await wake.first(self.lot.park, frontier.wait)
            self.dry = None

    async def _look_up(self, rows: list[crawlstore.FrontierEntry]) -> None:
        """Ask the document cache for a claimed chunk in one read, not one per page."""
        cache, plan = self.engine.maker.cache, self.page_plan.cache
        if not rows or cache is None or plan is None or not plan.read:
            return
        found = await cache.lookup_many([row.url for row in rows], plan)
        for row in rows:
            self.looked_up[row.n] = found[row.url]

    def _claim_tx(
        self, conn: Conn, want: int
    ) -> tuple[list[crawlstore.FrontierEntry], _Backlog | None]:
        fenced.check(conn, self.lease)
        owner = self.lease is not None
        rows = crawlstore.claim(conn, self.job_id, self.claimant, want, owner=owner)
        if rows:
            return rows, None
        left = crawlstore.backlog(conn, self.job_id, self.claimant)
        ending = crawlstore.job_ending(conn, self.job_id)
        return [], _Backlog(left.queued, 0 if owner else left.claimable, ending)

    async def _worker(self, send: trio.MemorySendChannel[Outcome]) -> None:
        async with send:
            while (entry := await self._next()) is not None:
                await send.send(await self._fetch(entry))

    def _check_hop(self, first: str) -> Callable[[str], str | None] | None:
        scope = self.scope
        if scope is None:
            return None
        return lambda url: None if url == first else scope.refusal(url)

    async def _fetch(self, entry: crawlstore.FrontierEntry) -> Outcome:
        engine = self.engine
        # A paced job (delay or Crawl-delay) fetches one page at a time and spends most of it
        # waiting for its host's next start: it takes no global slot, so it cannot sit on one.
        slot = engine.fetch_slots if self.pace is None else contextlib.nullcontext()
        try:
            produced = await engine.maker.produce(
                entry.url,
                self.page_plan,
                check_hop=self._check_hop(entry.url),
                concurrency=self.max_concurrency,
                delay=self.pace,
                slot=slot,
                looked_up=(self.looked_up.pop(entry.n),) if entry.n in self.looked_up else None,
            )
            result, document, links = produced.result, produced.document, produced.links
        except FetchError as exc:
            return Failed(entry, exc.code, exc.message)
        except Exception as exc:
            log.warning("page could not be turned into a document", url=redact_url(entry.url),
                        exc_info=exc)  # fmt: skip
            return Failed(entry, "UNKNOWN_ERROR", f"{type(exc).__name__} while parsing the page")
        page = Page(entry, document, rules.Admission([], []))
        if self.scope is not None:
            base = result.url
            page.links = rules.admit_links(
                links, entry.depth, self.policy, self.scope.refusal, self._robots_allowed
            )
            if base != entry.url:
                final = dedupe_key(base, ignore_query=self.policy.ignore_query,
                                   similar=self.policy.similar)  # fmt: skip
                requested = dedupe_key(entry.url, ignore_query=self.policy.ignore_query,
                                       similar=self.policy.similar)  # fmt: skip
                if final != requested:
                    page.final_key = final
            if entry.depth == 0 and entry.url == self.row.url:
                if not self._robots_allowed(entry.url):
                    page.refused = (jobstore.ROBOTS_BLOCKED, "URL blocked by robots.txt")
                elif (reason := self.scope.refusal(entry.url)) is not None:
                    page.refused = ("CRAWL_DENIAL", f"start URL refused: {reason}")
        return page

    # -- committing ------------------------------------------------------------------------

    async def _committer(self, recv: trio.MemoryReceiveChannel[Outcome]) -> None:
        async with recv:
            async for first in recv:
                batch = [first]
                while len(batch) < min(COMMIT_BATCH, self.engine.config.concurrency):
                    try:
                        batch.append(recv.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                await self._commit(batch)

    async def _commit(self, batch: list[Outcome]) -> None:
        at = self.clock_ms()
        try:
            pendings = await self.writes.write(lambda conn: self._commit_tx(conn, batch, at))
        except (JobFinished, CrawlEnded):
            self.ended = True
            self.work_scope.cancel()
            pendings = []
        except DB_ERRORS as exc:
            log.error("pages not stored; fetching them again", job=self.job_id,
                      pages=len(batch), error=str(exc))  # fmt: skip
            self.queue.extendleft(reversed([o.entry for o in batch]))
            pendings = []
        else:
            for outcome in batch:
                kind = "fetched" if isinstance(outcome, Page) else "failed"
                self.engine.pages[kind] += 1
                crawl_pages.labels(kind).inc()
                if isinstance(outcome, Page):
                    self.fetched += 1
                    self.engine.last_success_ms = at
                else:
                    self.failed += 1
        for pending in pendings:
            await self.jobs.after_commit(pending)
        self.in_flight -= len(batch)
        self.generation += 1
        self.lot.unpark_all()

    def _commit_tx(self, conn: Conn, batch: list[Outcome], at: int) -> list[PendingEvents]:
        """Runs in the store's writer: one transaction for a batch of finished pages."""
        return commit_tx(
            conn, batch, at, job_id=self.job_id, claimant=self.claimant, lease=self.lease,
            jobs=self.jobs, keep=not self.zdr, limit=self.limit,
        )  # fmt: skip

    def _blocked_in_tx(self, conn: Conn, urls: list[str], at: int = 0) -> None:
        blocked_in_tx(conn, self.job_id, urls, at or self.clock_ms())

    def status(self) -> dict[str, Any]:
        return {
            "kind": self.row.kind,
            "concurrency": self.concurrency,
            "delay": self.pace,
            "in_flight": self.in_flight,
            "fetched": self.fetched,
            "failed": self.failed,
            "interruptions": self.interruptions,
        }


class _Backlog(msgspec.Struct, frozen=True):
    queued: int
    claimable: int
    ending: str | None


def _origin(url: str) -> str:
    parsed = parse_http_url(url)
    assert parsed is not None
    return str(parsed.origin())
