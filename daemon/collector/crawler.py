# One TaskCrawler per enabled collector task. It is the thin trio shell around the pure rules:
# `paging` decides which window to request, `datefilter` which rows to keep, `messages` how a row
# becomes a queue item. Each window ends in ONE store transaction that appends the kept rows to
# the queue's outbox stream, saves the task's paging progress and records the page on the run's
# job; a crash therefore either loses the whole window (it is fetched again on resume) or keeps
# all of it, and the drainer publishes it later. Nothing is ever marked done before its rows are
# durable.
#
# A run stops between windows (manual stop, job cancelled, shutdown); its progress stays
# unfinished and the next run resumes it before starting a new range. A run that fails (upstream
# errors after the client's retries) is recorded, its job fails, and the next run resumes.
#
# In cluster mode a crawler runs only while its instance holds the task's lease (`run(lease)`);
# every write a run makes (window commits, progress, the job it opened, its result) checks the
# lease's token in the same transaction, so an owner paused past its lease writes nothing once
# another instance took over. The new owner resumes from the last committed window.
from __future__ import annotations

import contextlib
import functools
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import msgspec
import trio

from daemon import metrics
from daemon import outbox as outbox_mod
from daemon.cluster import Lease, LeaseLost
from daemon.collector import paging
from daemon.collector.datefilter import DateCounts, DateRule, expiration_ms, judge
from daemon.collector.messages import row_items
from daemon.collector.octoparse import OctoparseClient
from daemon.collector.store import (
    RunStats,
    TaskState,
    load_task_state,
    save_job,
    save_progress,
    save_result,
)
from daemon.config import CollectorConfig, TaskConfig, WebhookSpec, webhook_spec
from daemon.logs import get_logger
from daemon.outbox import Outbox, now_ms
from daemon.store import Conn, Store


class PageWritten(Protocol):
    first_row: int | None
    """`n` of the page's first job row (its queue items point there); None: rows not kept."""


class JobSink(Protocol):
    """What the crawler needs from the jobs part (daemon.jobs.manager.JobManager)."""

    async def create_job(
        self, kind: str, *, webhook: WebhookSpec | None, source: dict[str, Any]
    ) -> str: ...
    def page_in_tx(self, conn: Conn, job_id: str, rows: list[Any]) -> PageWritten: ...
    async def after_commit(self, pending: Any) -> None: ...
    async def finish(
        self,
        job_id: str,
        status: Literal["completed", "failed", "cancelled"],
        error: str | None = None,
    ) -> None: ...
    def cancel_requested(self, job_id: str) -> trio.Event: ...


class AlreadyRunning(Exception):
    pass


class CrawlerStopped(Exception):
    """A manual start was refused because the crawler stopped before serving it."""


class EmptyPage(Exception):
    """Upstream answered an empty page where its total says rows exist."""


@dataclass
class _StartRequest:
    """A manual start: reserved at once, served by the run loop once its job exists."""

    job_id: str | None = None
    ready: trio.Event = field(default_factory=trio.Event)
    taken: trio.Event = field(default_factory=trio.Event)
    refused: str | None = None


class TaskCrawler:
    """Runs one task's collection: periodic runs, manual start/stop, progress in the store."""

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
        self._pending_start: _StartRequest | None = None
        self.lease: Lease | None = None
        """The task's lease while this instance owns it (None: single-instance use)."""

    def _fence(self, conn: Conn) -> None:
        if self.lease is not None:
            self.lease.check(conn)

    def _write(self, fn: Callable[[Conn], Any]) -> Awaitable[Any]:
        """A store write made on the strength of the task's lease."""

        def tx(conn: Conn) -> Any:
            self._fence(conn)
            return fn(conn)

        return self.store.write(tx)

    @property
    def running(self) -> bool:
        return self.current is not None

    async def start_now(self, webhook: str | WebhookSpec | None = None) -> str | None:
        """Start a run at once (webhook overrides the task's); returns its job id."""
        if self.running or self._pending_start is not None:
            raise AlreadyRunning(self.task.id)
        request = self._pending_start = _StartRequest()  # reserved before anything awaits
        try:
            request.job_id = await self._create_job(webhook_spec(webhook) if webhook else None)
        except BaseException:
            self._pending_start = None
            raise
        request.ready.set()
        self._wake.set()
        await request.taken.wait()
        if request.refused is not None:
            raise CrawlerStopped(request.refused)
        return request.job_id

    def request_stop(self) -> bool:
        """Ask the current run to stop after its window; False when nothing runs."""
        if not self.running:
            return False
        self._stop.set()
        return True

    async def _create_job(self, webhook: WebhookSpec | None) -> str | None:
        if self.jobs is None:
            return None
        return await self.jobs.create_job(
            "crawl",
            webhook=webhook or webhook_spec(self.task.webhook),
            source={"task_id": self.task.id, "octoparse_task_id": self.task.task_id},
        )

    async def run(
        self,
        lease: Lease | None = None,
        *,
        resume_interrupted: bool = False,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """The crawler's life: runs at boot (auto_start) and every `interval`, or on demand.

        `lease`: the task's lease, checked by every write (cluster mode). `resume_interrupted`:
        a run its previous owner left unfinished (killed, or fenced out) continues at once."""
        self.lease = lease
        state = await self.store.read(lambda c: load_task_state(c, self.task.id))
        self.last_result = state.last_result
        self.high_water = paging.high_water(state.progress)
        if state.job_id:
            # A job the process died with ends now; an unfinished range resumes in the next run.
            ended = state.progress is not None and state.progress.end is not None
            await self._close_orphaned_job(state.job_id, ended)
        task_status.started()
        due = self.collector.auto_start or (resume_interrupted and interrupted(state))
        try:
            while True:
                if due or self._pending_start is not None:
                    await self.run_once(job_id=await self._take_start_request())
                    due = False
                if self.collector.auto_start:
                    self.next_run_ms = self.clock_ms() + int(self.interval * 1000)
                    with trio.move_on_after(self.interval) as timer:
                        await self._wait_for_start()
                    due = timer.cancelled_caught
                else:
                    self.next_run_ms = None
                    await self._wait_for_start()
        finally:
            self.lease = None
            with trio.CancelScope(shield=True):
                await self._refuse_start_request("the task's crawler stopped")

    async def _wait_for_start(self) -> None:
        while self._pending_start is None:
            self._wake = trio.Event()
            await self._wake.wait()

    async def _take_start_request(self) -> str | None:
        """The job id of a manual start waiting to be served (None for a scheduled run)."""
        request = self._pending_start
        if request is None:
            return None
        await request.ready.wait()  # its job is being created; this run is that start
        self._pending_start = None
        request.taken.set()
        return request.job_id

    async def _refuse_start_request(self, why: str) -> None:
        request, self._pending_start = self._pending_start, None
        if request is None:
            return
        request.refused = why
        request.taken.set()
        if request.ready.is_set() and request.job_id is not None and self.jobs is not None:
            with contextlib.suppress(Exception):
                await self.jobs.finish(request.job_id, "cancelled", why)

    async def run_once(self, job_id: str | None = None) -> RunStats:
        """One run: resume the unfinished range or read what is new since the last one."""
        run_id = uuid.uuid4().hex
        self._stop = trio.Event()
        stats = self.current = RunStats(run_id=run_id, job_id=job_id, started_ms=self.clock_ms())
        try:
            await self._run(stats)
        except Exception as exc:
            if not isinstance(exc, LeaseLost):
                stats.status = "failed"
                stats.error = f"{type(exc).__name__}: {exc}"
                self.log.error("run failed; the next run resumes it", run=run_id, error=stats.error)
            else:
                await self._cut_short(stats, "another instance took the task over")
                raise
        except BaseException:  # cancelled: shutdown, reload, the task removed or its lease lost
            await self._cut_short(stats, "the crawler was stopped (shutdown or reload)")
            raise
        with trio.CancelScope(shield=True):
            await self._finish(stats)
        return stats

    async def _cut_short(self, stats: RunStats, why: str) -> None:
        stats.status = "stopped"
        stats.error = why
        stats.interrupted = True
        with trio.CancelScope(shield=True):
            await self._finish(stats)

    async def _run(self, stats: RunStats) -> None:
        state = await self.store.read(lambda c: load_task_state(c, self.task.id))
        if stats.job_id is None:
            stats.job_id = await self._create_job(None)
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
            if self._stop.is_set() or (cancel is not None and cancel.is_set()):
                stats.status = "cancelled" if cancel is not None and cancel.is_set() else "stopped"
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
        kept: list[tuple[dict[str, Any], int]] = []
        window_counts = DateCounts()
        for row in page.rows:
            judgement = judge(row, self.rule, now)
            window_counts.count(judgement)
            ttl = expiration_ms(
                judgement,
                now,
                ttl_from=self.task.ttl_from,
                filter_days=self.rule.filter_days,
                fixed_ttl_ms=self.fixed_ttl_ms,
            )
            if ttl is not None:
                kept.append((row, ttl))
            else:
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
            self._fence(conn)
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

    async def _close_orphaned_job(self, job_id: str, ended: bool) -> None:
        if self.jobs is None:
            return
        try:
            if ended:  # every window was committed; only the bookkeeping was lost
                await self.jobs.finish(job_id, "completed")
            else:
                await self.jobs.finish(
                    job_id,
                    "failed",
                    "interrupted by a restart or failover; the next run resumes its range",
                )
        except Exception as exc:  # already finished or expired: nothing to close
            self.log.debug("previous job not closed", job=job_id, error=str(exc))

    async def _finish(self, stats: RunStats) -> None:
        stats.finished_ms = self.clock_ms()
        self.current = None
        self.last_result = stats
        metrics.collector_runs.labels(self.task.id, stats.status).inc()
        try:
            await self._write(lambda c: save_result(c, self.task.id, stats, stats.finished_ms or 0))
        except LeaseLost:
            # The new owner closes the run's job and resumes its range: leave both to it.
            self.log.warning("run ended after the task moved to another instance", run=stats.run_id)
            return
        except Exception as exc:  # the run's rows are safe; only its summary is not stored
            self.log.error("could not store the run's result", run=stats.run_id, error=str(exc))
        if self.jobs is not None and stats.job_id is not None:
            status: Literal["completed", "failed", "cancelled"] = (
                "completed" if stats.status == "completed" else
                "cancelled" if stats.status in ("cancelled", "stopped") else "failed"
            )  # fmt: skip
            try:
                await self.jobs.finish(stats.job_id, status, stats.error)
            except Exception as exc:
                self.log.warning("could not finish the run's job", job=stats.job_id, error=str(exc))
        self.log.info(
            "run finished",
            run=stats.run_id,
            status=stats.status,
            end=stats.end,
            fetched=stats.fetched,
            kept=stats.kept,
            published=stats.published,
            windows=stats.windows,
        )


def interrupted(state: TaskState) -> bool:
    """Whether the task's last run was cut short by its instance rather than ended: it never
    recorded its result (killed, or fenced out) or was cancelled by a shutdown or reload."""
    if state.run_id is None:
        return False
    last = state.last_result
    return last is None or last.run_id != state.run_id or last.interrupted
