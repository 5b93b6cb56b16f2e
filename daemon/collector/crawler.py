# One TaskCrawler per enabled collector task. It is the thin trio shell around the pure rules:
# `paging` decides which window to request, `datefilter` which rows to keep, `messages` how a
# row becomes a queue item (`contracts` holds what it shares with the service and the API).
# Each window ends in ONE store transaction that appends the kept rows to the queue's outbox
# stream, saves the task's paging progress and records the page on the run's job; a crash
# therefore either loses the whole window (it is fetched again on resume) or keeps all of it,
# and the drainer publishes it later. Nothing is ever marked done before its rows are durable.
#
# A run stops between windows (manual stop, job cancelled) or is cut short (shutdown, reload,
# lease lost, the store failing under it); its progress stays unfinished and the next run resumes
# it before starting a new range. A run that fails (upstream errors after the client's retries) is
# recorded, its job fails, and the next run resumes. What becomes of the run's job is `runrules`'
# to say: only a user or the configuration ends it `cancelled`; a run cut short by anything else
# leaves it running, and the next run of the task (here once the store answers again, on another
# instance, or at the next start) continues the same job id.
#
# In cluster mode a crawler runs only while its instance holds the task's lease (`run(lease)`);
# every write a run makes (window commits, progress, the job it opened, its result) checks the
# lease's token in the same transaction, so an owner paused past its lease writes nothing once
# another instance took over. The new owner resumes from the last committed window.
#
# This module decides when runs happen (the schedule, manual starts and stops, continuing an
# interrupted run's job); daemon/collector/run.py is one run, window by window.
from __future__ import annotations

import trio

from daemon.cluster import Lease
from daemon.collector import paging, runrules
from daemon.collector.contracts import STORE_FAILURES, AlreadyRunning, Continuation, CrawlerStopped
from daemon.collector.run import StartRequest, TaskRun
from daemon.collector.store import TaskState, load_task_state, save_progress
from daemon.config import WebhookSpec, webhook_spec
from daemon.jobs.store import JobFinished, JobNotFound

__all__ = [  # what the service, the API and the tests import from here
    "AlreadyRunning", "CrawlerStopped", "TaskCrawler", "interrupted", "load_task_state",
    "save_progress",
]  # fmt: skip


class TaskCrawler(TaskRun):
    """Runs one task's collection: periodic runs, manual start/stop, progress in the store."""

    async def start_now(self, webhook: str | WebhookSpec | None = None) -> str | None:
        """Start a run at once (webhook overrides the task's); returns its job id."""
        if self.running or self._pending_start is not None:
            raise AlreadyRunning(self.task.id)
        request = self._pending_start = StartRequest()  # reserved before anything awaits
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
        """Ask the current run to stop after its window (or a job waiting to be continued to
        end); False when nothing runs."""
        if not self.running:
            return False
        self._stop.set()
        return True

    async def run(
        self,
        lease: Lease | None = None,
        *,
        resume_interrupted: bool = False,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """The crawler's life: runs at boot (auto_start) and every `interval`, or on demand.

        `lease`: the task's lease, checked by every write (cluster mode). A job an earlier run
        left running (cut short by a shutdown, a kill, a lost lease) is continued at once;
        `resume_interrupted`: a range its previous owner left unfinished without such a job
        (its job was ended meanwhile) is resumed at once too."""
        self.lease = lease
        self._stop = trio.Event()
        try:
            state = await self._start_state()
            self.last_result = state.last_result
            self.high_water = paging.high_water(state.progress)
            task_status.started()
            due = self.collector.auto_start or (resume_interrupted and interrupted(state))
            while True:
                if self.continuing is None and (due or self._pending_start is not None):
                    await self.run_once(job_id=await self._take_start_request())
                    due = False
                while self.continuing is not None:
                    await self._continue(self.continuing)
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
                waiting, self.continuing = self.continuing, None
                if waiting is not None and waiting.job_id is not None and self.removed:
                    await self._end_job(waiting.job_id, ("cancelled", self.removed))

    async def _start_state(self) -> TaskState:
        """The task's stored state, and what to do with the job it points to (sets
        `continuing`); waits for the store while it fails."""
        attempt = 0
        while True:
            try:
                state = await self.store.read(lambda c: load_task_state(c, self.task.id))
                if state.job_id is not None and self.jobs is not None:
                    await self._left_running(state, state.job_id)
                return state
            except STORE_FAILURES as exc:
                attempt += 1
                delay = runrules.retry_in_s(attempt)
                self.log.warning("cannot read the task's state; retrying", error=str(exc),
                                 retry_in_s=delay)  # fmt: skip
                await trio.sleep(delay)

    async def _left_running(self, state: TaskState, job_id: str) -> None:
        assert self.jobs is not None
        try:
            await self.jobs.attach(job_id)
            running = True
        except (JobFinished, JobNotFound):
            running = False
        plan = runrules.on_start(
            job_running=running,
            range_done=state.progress is not None and state.progress.end is not None,
            last_cut_short=interrupted(state),
        )
        if plan == "complete":  # every window was committed; only the bookkeeping was lost
            await self._end_job(job_id, ("completed", None))
        elif plan == "continue":
            why = state.last_result.error if state.last_result is not None else None
            self.continuing = Continuation(
                job_id=job_id,
                why=why or "its instance stopped without recording the run's end (killed)",
                since_ms=self.clock_ms(),
            )
            self.log.info("continuing the job an interrupted run left running", job=job_id)

    async def _continue(self, continuation: Continuation) -> None:
        """Run once more under the job an interrupted run left running (after a pause when the
        store failed under the last try)."""
        if continuation.attempts:
            delay = runrules.retry_in_s(continuation.attempts)
            continuation.next_try_ms = self.clock_ms() + int(delay * 1000)
            with trio.move_on_after(delay):
                await self._stop.wait()
            continuation.next_try_ms = None
        stats = await self.run_once(job_id=continuation.job_id, continues=True)
        if stats.status != "interrupted":
            self.continuing = None

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
        if request.ready.is_set() and request.job_id is not None:
            # The caller was told the run did not begin; its job never ran a window.
            late = f"{why} before the run began"
            outcome: tuple[runrules.FinalStatus, str] = (
                ("cancelled", self.removed) if self.removed else ("failed", late)
            )
            await self._end_job(request.job_id, outcome)


def interrupted(state: TaskState) -> bool:
    """Whether the task's last run was cut short by its instance rather than ended: it never
    recorded its result (killed, or fenced out) or was cut short (shutdown, reload, lost lease,
    the store failing, the task removed)."""
    if state.run_id is None:
        return False
    last = state.last_result
    return last is None or last.run_id != state.run_id or last.interrupted
