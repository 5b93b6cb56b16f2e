# One run of a collector task, and the state a TaskCrawler keeps between runs: the run walks
# the paging windows, and each window ends in ONE store transaction that appends the kept rows
# to the queue's outbox stream, saves the task's paging progress and records the page on the
# run's job (fenced by the task's lease in cluster mode); its end is stored and its job ended
# as `runrules` says. When runs happen (schedule, manual start, continuing a job an interrupted
# run left running) is daemon/collector/crawler.py's.
from __future__ import annotations

import functools
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import trio

from daemon import metrics
from daemon import outbox as outbox_mod
from daemon.cluster import Lease, LeaseLost, fenced
from daemon.collector import paging, runrules
from daemon.collector.config import CollectorConfig, TaskConfig
from daemon.collector.contracts import STORE_WAIT_S, Continuation, EmptyPage, JobSink, PageWritten
from daemon.collector.datefilter import DateCounts, DateRule, keep_rows
from daemon.collector.messages import row_items
from daemon.collector.octoparse import OctoparseClient
from daemon.collector.store import (
    RunStats,
    load_task_state,
    save_job,
    save_progress,
    save_result,
)
from daemon.config import WebhookSpec, webhook_spec
from daemon.jobs.store import JobFinished, JobNotFound
from daemon.logs import get_logger
from daemon.outbox import Outbox, now_ms
from daemon.store import Conn, Store, StoreClosed


@dataclass
class StartRequest:
    """A manual start: reserved at once, served by the run loop once its job exists."""

    job_id: str | None = None
    ready: trio.Event = field(default_factory=trio.Event)
    taken: trio.Event = field(default_factory=trio.Event)
    refused: str | None = None


class TaskRun:
    """A task's crawler state and one run of it (TaskCrawler adds when runs happen)."""

    def __init__(
        self,
        task: TaskConfig,
        collector: CollectorConfig,
        *,
        client: OctoparseClient,
        store: Store,
        outbox: Outbox,
        stream: str,
        fixed_ttl_ms: int,
        jobs: JobSink | None = None,
        clock_ms: Callable[[], int] = now_ms,
    ) -> None:
        self.task = task
        self.collector = collector
        self.client = client
        self.store = store
        self.outbox = outbox
        self.stream = stream
        self.fixed_ttl_ms = fixed_ttl_ms
        self.jobs = jobs
        self.clock_ms = clock_ms
        self.rule = DateRule.from_task(task, collector)
        self.batch_size = task.batch_size or collector.batch_size
        self.interval = float(task.interval if task.interval is not None else collector.interval)
        self.log = get_logger("collector", task=task.id)
        self.current: RunStats | None = None
        self.last_result: RunStats | None = None
        self.next_run_ms: int | None = None
        self.high_water: int | None = None
        self.totals = DateCounts()
        self._stop = trio.Event()
        self._wake = trio.Event()
        self._pending_start: StartRequest | None = None
        self.lease: Lease | None = None
        """The task's lease while this instance owns it (None: single-instance use)."""
        self.continuing: Continuation | None = None
        """The job an interrupted run left running, while this crawler is about to continue it."""
        self.removed: str | None = None
        """Why the configuration no longer lists the task (set just before the crawler is
        cancelled): its run's job ends `cancelled` with this error."""

    def _write(self, fn: Callable[[Conn], Any]) -> Awaitable[Any]:
        """A store write made on the strength of the task's lease."""
        return fenced.write(self.store, self.lease, fn)

    @property
    def running(self) -> bool:
        """A run goes on, or is about to continue an interrupted run's job."""
        return self.current is not None or self.continuing is not None

    async def _create_job(self, webhook: WebhookSpec | None) -> str | None:
        if self.jobs is None:
            return None
        return await self.jobs.create_job(
            "crawl",
            webhook=webhook or webhook_spec(self.task.webhook),
            source={"task_id": self.task.id, "octoparse_task_id": self.task.task_id},
        )

    async def run_once(self, job_id: str | None = None, *, continues: bool = False) -> RunStats:
        """One run: resume the unfinished range or read what is new since the last one.

        `job_id`: the run's job (None: one is created); `continues`: that job was left running
        by an interrupted run, and this run continues it (a stop asked meanwhile still holds).
        A run the store failed under returns `interrupted` and sets `continuing`; a cancelled
        one (shutdown, reload, lease lost) records its end and re-raises."""
        run_id = uuid.uuid4().hex
        if not continues:
            self._stop = trio.Event()
        stats = self.current = RunStats(
            run_id=run_id, job_id=job_id, started_ms=self.clock_ms(), continues=continues
        )
        try:
            await self._run(stats)
        except BaseException as exc:
            lost = self.lease is not None and self.lease.lost.is_set()
            end = runrules.ended_by(exc, removed=self.removed, lease_lost=lost)
            stats.status, stats.error = end
            stats.interrupted = runrules.cut_short(stats.status)
            cause = runrules.leaf(exc)
            again = isinstance(cause, Exception) and not isinstance(cause, LeaseLost | StoreClosed)
            if stats.status == "failed":
                self.log.error("run failed; the next run resumes it", run=run_id, error=stats.error)
            elif stats.status == "interrupted" and again:
                self._continue_later(stats)
            with trio.CancelScope(shield=True):
                await self._finish(stats)
            if not again:
                raise
            return stats
        with trio.CancelScope(shield=True):
            await self._finish(stats)
        return stats

    def _continue_later(self, stats: RunStats) -> None:
        """The store failed under the run while this instance keeps the task: try again soon
        under the same job."""
        waiting = self.continuing
        if waiting is None:
            waiting = Continuation(job_id=stats.job_id, why="", since_ms=self.clock_ms())
        waiting.job_id = stats.job_id
        waiting.why = stats.error or ""
        waiting.attempts += 1
        self.continuing = waiting

    async def _run(self, stats: RunStats) -> None:
        state = await self.store.read(lambda c: load_task_state(c, self.task.id))
        if stats.job_id is None:
            stats.job_id = await self._create_job(None)
        elif stats.continues and self.jobs is not None:
            await self.jobs.attach(stats.job_id)  # JobFinished: ended while nobody ran it
        if stats.job_id is not None:  # before any upstream call, so a crash cannot orphan it
            job_id = stats.job_id
            await self._write(lambda c: save_job(c, self.task.id, job_id, self.clock_ms()))
        total = await self.client.total(self.task.task_id)
        start = paging.start_run(state.progress, total, self.task.paging)
        progress = start.progress
        stats.resumed, stats.reset = start.resumed, start.reset
        if isinstance(progress, paging.BackwardProgress):
            stats.range_low, stats.range_high = progress.low, progress.t0
            stats.lowest_done = progress.lowest_done
        if start.reset:
            self.log.warning(
                "task total fell below what earlier runs saw; rescanning the filter window",
                total=total,
                high_water=paging.high_water(state.progress),
            )
        self.log.info(
            "run started",
            run=stats.run_id,
            job=stats.job_id,
            total=total,
            resumed=start.resumed,
            range=f"{stats.range_low}..{stats.range_high}"
            if stats.range_high is not None
            else None,
        )
        cancel = self.jobs.cancel_requested(stats.job_id) if self.jobs and stats.job_id else None
        await self._save(progress, stats)
        while (window := paging.next_window(progress, self.batch_size)) is not None:
            await self._room_or_stop(cancel)
            if cancel is not None and cancel.is_set():
                stats.status, stats.error = "cancelled", runrules.CANCELLED_BY_USER
            elif self._stop.is_set():
                stats.status, stats.error = "stopped", runrules.STOPPED_BY_USER
            if stats.status != "running":
                self.log.info("run stopped between windows", run=stats.run_id, status=stats.status)
                return
            progress = await self._window(progress, window, stats)
        stats.end = progress.end
        stats.status = "completed"

    async def _room_or_stop(self, cancel: trio.Event | None) -> None:
        """Wait until the stream has room for another window, or a stop or cancel arrives."""
        async with trio.open_nursery() as nursery:

            async def first(wait: Callable[[], Awaitable[Any]]) -> None:
                await wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(
                first,
                functools.partial(
                    self.outbox.wait_pending_below, self.stream, self.collector.max_pending
                ),
            )
            nursery.start_soon(first, self._stop.wait)
            if cancel is not None:
                nursery.start_soon(first, cancel.wait)

    async def _window(
        self, progress: paging.Progress, window: paging.Window, stats: RunStats
    ) -> paging.Progress:
        page = await self.client.data_page(self.task.task_id, window.offset, window.size)
        now = self.clock_ms()
        judged = keep_rows(
            page.rows,
            self.rule,
            now,
            ttl_from=self.task.ttl_from,
            fixed_ttl_ms=self.fixed_ttl_ms,
        )
        kept, window_counts = judged.rows, judged.counts
        for judgement in judged.dropped:
            stats.dropped.count(judgement)
            reason = "expired" if judgement.verdict == "recent" else judgement.verdict
            metrics.collector_rows.labels(self.task.id, reason).inc()
        result = paging.WindowResult(
            rows=page.returned,
            next_offset=page.offset,
            rest_total=page.rest_total,
            all_expired=page.returned > 0 and window_counts.expired == page.returned,
        )
        after = paging.after_window(
            progress, window, result, max_expired_batches=self.collector.max_expired_batches
        )
        if after.end == "empty":
            # Rows should be there (total says so) but the page was empty: keep the progress
            # where it is so the next run asks again, rather than skipping the rest for good.
            raise EmptyPage(
                f"upstream returned no rows at offset {window.offset} (size {window.size}) "
                f"although total is {page.total}; the next run asks again"
            )
        items = row_items(
            self.task.id, stats.run_id, window.offset, kept, now, ttl_from=self.task.ttl_from
        )
        # The job's rows are the bodies already encoded for the queue, passed as msgspec.Raw:
        # stored once, in the job's rows, and sent as they are; the queue items point to them.
        rows = [msgspec.Raw(item.body) for item in items]
        pending: PageWritten | None = None

        def commit(conn: Conn) -> None:
            nonlocal pending
            fenced.check(conn, self.lease)
            bodies_in = None
            job_id = stats.job_id
            if self.jobs is not None and job_id is not None and rows:
                pending = self.jobs.page_in_tx(conn, job_id, rows)
                if pending.first_row is not None:
                    bodies_in = (job_id, pending.first_row)
            if items:
                outbox_mod.append(conn, self.stream, items, now, bodies_in=bodies_in)
            save_progress(conn, self.task.id, after, stats.run_id, stats.job_id, now)

        try:
            await self.store.write(commit)
        finally:  # a cancelled caller's write may still have committed: wake the drainer anyway
            if items:
                self.outbox.notify_appended(self.stream)
        self.high_water = paging.high_water(after)
        if pending is not None and self.jobs is not None:
            await self.jobs.after_commit(pending)
        stats.windows += 1
        rows_metric = metrics.collector_rows
        rows_metric.labels(self.task.id, "fetched").inc(page.returned)
        rows_metric.labels(self.task.id, "published").inc(len(items))
        rows_metric.labels(self.task.id, "duplicate").inc(len(kept) - len(items))
        stats.fetched += page.returned
        stats.kept += len(kept)
        stats.duplicates += len(kept) - len(items)
        stats.published += len(items)
        self.totals.add(window_counts)
        if isinstance(after, paging.BackwardProgress):
            stats.lowest_done = after.lowest_done
        return after

    async def _save(self, progress: paging.Progress, stats: RunStats) -> None:
        now = self.clock_ms()
        await self._write(
            lambda c: save_progress(c, self.task.id, progress, stats.run_id, stats.job_id, now)
        )
        self.high_water = paging.high_water(progress)

    async def _end_job(self, job_id: str, outcome: tuple[runrules.FinalStatus, str | None]) -> None:
        if self.jobs is None:
            return
        status, error = outcome
        try:
            with trio.move_on_after(STORE_WAIT_S):
                await self.jobs.finish(job_id, status, error)
        except (JobFinished, JobNotFound) as exc:  # ended elsewhere, or expired
            self.log.info("the run's job already has its final status", job=job_id, error=str(exc))
        except Exception as exc:
            self.log.warning("could not finish the run's job", job=job_id, error=str(exc))

    async def _finish(self, stats: RunStats) -> None:
        stats.finished_ms = self.clock_ms()
        self.current = None
        self.last_result = stats
        if stats.status != "interrupted":
            self.continuing = None  # its job has its outcome now
        metrics.collector_runs.labels(self.task.id, stats.status).inc()
        try:
            with trio.move_on_after(STORE_WAIT_S):
                await self._write(
                    lambda c: save_result(c, self.task.id, stats, stats.finished_ms or 0)
                )
        except LeaseLost:
            # The new owner continues the run's job and resumes its range: leave both to it.
            self.log.warning("run ended after the task moved to another instance", run=stats.run_id)
            if self.jobs is not None and stats.job_id is not None:
                self.jobs.detach(stats.job_id)
            return
        except Exception as exc:  # the run's rows are safe; only its summary is not stored
            self.log.error("could not store the run's result", run=stats.run_id, error=str(exc))
        outcome = runrules.job_outcome(stats.status, stats.error)
        if self.jobs is not None and stats.job_id is not None:
            if outcome is not None:
                await self._end_job(stats.job_id, outcome)
            else:  # whoever runs the task next (maybe this instance) continues the job
                self.jobs.detach(stats.job_id)
        if stats.status == "interrupted":
            self.log.warning(
                "run interrupted; its job continues",
                run=stats.run_id,
                job=stats.job_id,
                why=stats.error,
                windows=stats.windows,
            )
            return
        self.log.info(
            "run finished",
            run=stats.run_id,
            status=stats.status,
            end=stats.end,
            fetched=stats.fetched,
            kept=stats.kept,
            published=stats.published,
            windows=stats.windows,
            error=stats.error,
        )
