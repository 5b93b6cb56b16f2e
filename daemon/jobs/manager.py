# The jobs part's one object: producers (the collector, Firecrawl-style crawls and extracts)
# create jobs, report pages, errors and the final status through it; the API reads jobs through
# it; it runs a drainer per job with a webhook.
#
# Contract for producers: one producer per job at a time, and `after_commit(pending)` is awaited
# before that job's next event is issued. The manager's own methods hold the job's lock.
#
# Its rooms, one job each: records.py (reads), numbering.py (events issued in the producer's
# transaction), degraded.py (store failures), scan.py (cluster mode: taking over drainers),
# expiry.py (deleting expired jobs); this module keeps the producers' calls and the drainers'
# lifecycle. The webhook gauges are in webhook_metrics.py.
from __future__ import annotations

import contextlib
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal

import httpx
import trio

from daemon import config
from daemon.cluster import Cluster, Lease, LeaseLost
from daemon.config import JobsConfig, WebhooksConfig, WebhookSpec
from daemon.jobs import events, webhook_metrics
from daemon.jobs import store as jobstore
from daemon.jobs.degraded import DegradedMode, UnsavedFinish
from daemon.jobs.delivery import Deliverer, DeliverySettings
from daemon.jobs.drainer import JobDrainer
from daemon.jobs.expiry import Expiry
from daemon.jobs.jobstate import JobState
from daemon.jobs.numbering import EventNumbering, PendingEvents, seq_of
from daemon.jobs.records import JobReads
from daemon.jobs.scan import ClusterScan
from daemon.jobs.types import JobFinished, JobNotFound, JobRecord
from daemon.logs import get_logger
from daemon.outbox import Outbox, now_ms
from daemon.store import DB_ERRORS, Conn, Store, StoreClosed
from daemon.supervise import ComponentState, GaveUp, supervise

__all__ = ["JobManager", "PendingEvents", "running"]

log = get_logger("jobs")

FinalStatus = Literal["completed", "failed", "cancelled"]


class JobManager(JobReads, EventNumbering, DegradedMode, ClusterScan, Expiry):
    """Jobs in the store, their webhook events and the drainers that deliver them."""

    def __init__(
        self,
        store: Store,
        outbox: Outbox,
        jobs: JobsConfig,
        webhooks: WebhooksConfig,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        clock_ms: Any = now_ms,
        rng: random.Random | None = None,
        cluster: Cluster | None = None,
    ) -> None:
        self.store = store
        self.cluster = cluster
        """Drainers and expiry run under its leases; None: this process alone (tests)."""
        self.outbox = outbox
        self.jobs_cfg = jobs
        self.clock_ms = clock_ms
        self.deliverer = Deliverer(DeliverySettings.from_config(webhooks), transport, rng)
        self._active: dict[str, JobState] = {}
        self._unsaved: dict[str, UnsavedFinish] = {}
        self._nursery: trio.Nursery | None = None
        self._stopping = False
        self._push_scopes: set[trio.CancelScope] = set()
        self._backlog_seen = True
        """The last cluster scan found undelivered events (it looks again within a tick)."""
        self._cancellers: list[Callable[[JobRecord], Awaitable[bool]]] = []
        webhook_metrics.LIVE.add(self)

    def add_canceller(self, cancel: Callable[[JobRecord], Awaitable[bool]]) -> None:
        """Let a producer end its own jobs on DELETE: `cancel(record)` is awaited with the
        running job's record before the manager's own cancel and returns True once it cancelled
        the job (the crawl part decides it in the store, so every instance working on it stops);
        False leaves the job to the manager (a job of another producer); JobFinished when it
        found the job ended otherwise meanwhile."""
        self._cancellers.append(cancel)

    def configure(self, jobs: JobsConfig, webhooks: WebhooksConfig) -> None:
        """New settings: delivery settings apply from the next attempt, jobs settings to jobs
        created from now on."""
        self.deliverer.reconfigure(DeliverySettings.from_config(webhooks))
        self.jobs_cfg = jobs

    async def on_reload(
        self, old: config.CoreConfig, new: config.CoreConfig, change: config.ConfigDiff
    ) -> None:
        if {"jobs", "webhooks"} & set(change.sections_changed):
            self.configure(new.jobs, new.webhooks)
            log.info("jobs and webhook settings updated")

    @property
    def ttl_ms(self) -> int:
        return int(self.jobs_cfg.ttl * 1000)

    async def create_job(
        self,
        kind: str,
        *,
        webhook: WebhookSpec | None,
        source: dict[str, Any],
        setup: Callable[[Conn, str], None] | None = None,
    ) -> str:
        """Create a running job (emitting `{kind}.started`); returns its id. `setup(conn, id)`
        runs in the same transaction (a producer's own rows for the job)."""
        if kind not in jobstore.KINDS:
            raise ValueError(f"unknown job kind {kind!r}; expected one of {sorted(jobstore.KINDS)}")
        job_id = str(uuid.uuid4())
        at = self.clock_ms()
        job = JobState(job_id, kind, webhook, durable=self.jobs_cfg.store, attached=True)
        lease: Lease | None = None
        if self.cluster is not None and webhook is not None and self._nursery is not None:
            # Before the first event commits, so no other instance's scan takes it first (before
            # `run`, its resume takes the lease).
            [lease] = await self.cluster.try_acquire([job.stream])
        self._active[job_id] = job

        def tx(conn: Conn) -> PendingEvents:
            jobstore.insert_job(
                conn,
                job_id=job_id,
                kind=kind,
                webhook=webhook,
                source=source,
                at_ms=at,
                expires_ms=at + self.ttl_ms,
            )
            if setup is not None:
                setup(conn, job_id)
            record = jobstore.get_job(conn, job_id)
            assert record is not None
            pending = PendingEvents(job_id)
            self._event_in_tx(conn, record, "started", [], None, pending)
            return pending

        try:
            pending = await self.store.write(tx)
        except BaseException:
            self._active.pop(job_id, None)
            if lease is not None:
                await self.cluster.release(lease)  # type: ignore[union-attr]
            raise
        log.info("job created", job=job_id, kind=kind, webhook=webhook is not None)
        self._spawn(job, lease)
        await self.after_commit(pending)
        return job_id

    def page_in_tx(
        self,
        conn: Conn,
        job_id: str,
        rows: list[dict[str, Any]],
        *,
        total: int | None = None,
        keep: bool = True,
    ) -> PendingEvents:
        """Inside the caller's transaction: store `rows` (unless not `keep`), count them, issue
        the `page` event.

        Raises JobNotFound / JobFinished (rolling the caller's transaction back, if it lets
        them through). Pass the result to `after_commit` after the transaction committed.
        """
        if job_id in self._unsaved:
            raise JobFinished(job_id, self._unsaved[job_id].status)
        record = jobstore.require_running(conn, job_id)
        first_row = jobstore.add_rows(conn, job_id, rows, total, keep=keep)
        pending = PendingEvents(job_id, first_row=first_row)
        self._event_in_tx(conn, record, "page", rows, None, pending)
        return pending

    def event_in_tx(self, conn: Conn, job_id: str, name: str, data: list[Any]) -> PendingEvents:
        """Inside the caller's transaction: issue the running job's event `name` (neither
        `page` nor a terminal one: an agent's `action`) with `data`, so the state change it
        announces and the event commit together. Raises JobNotFound / JobFinished; pass the
        result to `after_commit` after the transaction committed."""
        if name == "page" or events.is_terminal(name):
            raise ValueError(f"{name!r} is issued by page_in_tx or finish")
        if job_id in self._unsaved:
            raise JobFinished(job_id, self._unsaved[job_id].status)
        record = jobstore.require_running(conn, job_id)
        pending = PendingEvents(job_id)
        self._event_in_tx(conn, record, name, data, None, pending)
        return pending

    async def after_commit(self, pending: PendingEvents) -> None:
        """After the transaction that issued `pending` committed: wake the job's drainer, or
        queue its events in memory (waiting while the job's memory queue is full)."""
        job = self._active.get(pending.job_id)
        if job is None:
            if not (pending.durable or pending.memory):
                return
            job = await self._job_state(pending.job_id, allow_finished=True)
        if pending.durable:
            job.last_seq = max(job.last_seq, *(seq_of(i) for i in pending.durable))
            job.pending += len(pending.durable)
            if job.disk_closed:
                # The drainer no longer reads the outbox (the store failed under it): send these
                # from memory now; after a restart they go out again from disk, same webhookId.
                for item in pending.durable:
                    await self._push_memory(job, item, degraded=True, count=False)
        for item in pending.memory:
            job.last_seq = max(job.last_seq, seq_of(item))
            job.pending += 1
            await self._push_memory(job, item, degraded=pending.degraded)
        if pending.terminal:
            job.terminated = True
            job.attached = False
        job.wake.fire()
        if job.webhook is not None and not job.drainer and not job.remote:
            self._spawn(job)
        self._forget_if_done(job)

    async def page(
        self, job_id: str, rows: list[dict[str, Any]], *, total: int | None = None
    ) -> bool:
        """`page_in_tx` in a transaction of its own, then `after_commit`. Returns False when the
        store failed: the event still goes out (through memory), the rows were not stored."""
        job = await self._job_state(job_id)
        async with job.lock:
            stored = True
            before = job.last_seq
            settle = self._settles(job, events.event_type(job.kind, "page"))
            while True:
                try:
                    pending = await self.store.write(
                        lambda c: self.page_in_tx(c, job_id, rows, total=total)
                    )
                except DB_ERRORS as exc:
                    if settle and self.store.backend.retryable(exc, False):
                        settled = await self._settle(job, exc, lambda r: r.last_seq > before)
                        if settled is None:
                            continue  # it did not commit: the store answers again, retry
                        pending = settled
                        break
                    stored = False
                    pending = self._degraded_event(job, "page", rows, None, exc)
                break
            await self.after_commit(pending)
        return stored

    async def finish(
        self,
        job_id: str,
        status: FinalStatus,
        error: str | None = None,
        *,
        data: list[Any] | None = None,
    ) -> None:
        """Give the job its final status and issue its one terminal event (`completed`, or
        `failed` with the error; `cancelled` sends `failed` with error "cancelled", or the
        kind's own `cancelled`), whose `data` is `data` (default `[]`; an extract job's
        result)."""
        job = await self._job_state(job_id)
        name, reason = events.terminal_for_status(status, error, job.kind)
        async with job.lock:
            at = self.clock_ms()
            expires = at + self.ttl_ms
            saved_error = reason if status == "failed" else error

            def tx(conn: Conn) -> PendingEvents:
                record = jobstore.require_running(conn, job_id)
                pending = PendingEvents(job_id, terminal=True)
                self._event_in_tx(conn, record, name, data or [], reason, pending)
                jobstore.set_finished(conn, job_id, status, saved_error, at, expires)
                return pending

            if job_id in self._unsaved:
                raise JobFinished(job_id, self._unsaved[job_id].status)
            settle = self._settles(job, None)
            while True:
                try:
                    pending = await self.store.write(tx)
                except DB_ERRORS as exc:
                    if settle and self.store.backend.retryable(exc, False):
                        settled = await self._settle(job, exc, lambda r: r.finished)
                        if settled is None:
                            continue
                        pending = settled
                        break
                    pending = self._degraded_event(
                        job, name, data or [], reason, exc, terminal=True
                    )
                    self._unsaved[job_id] = UnsavedFinish(status, saved_error, at, expires)
                    log.error("could not save the job's final status; will retry", job=job_id)
                break
            await self.after_commit(pending)
        log.info("job finished", job=job_id, status=status, error=error)

    async def add_error(self, job_id: str, code: str, error: str, url: str | None = None) -> None:
        """Append to the job's error list (GET /v2/crawl/{id}/errors)."""
        at = self.clock_ms()

        def tx(conn: Conn) -> None:
            if jobstore.get_job(conn, job_id) is None:
                raise JobNotFound(job_id)
            jobstore.add_error(conn, job_id, code=code, error=error, url=url, at_ms=at)

        await self.store.write(tx)

    def cancel_requested(self, job_id: str) -> trio.Event:
        """Set when DELETE /v2/crawl/{id} asks the job's producer to stop."""
        job = self._active.get(job_id)
        if job is None:
            raise JobNotFound(job_id)
        return job.cancel

    async def attach(self, job_id: str) -> None:
        """Declare that this process produces for an existing running job (e.g. one resumed
        after a restart), so DELETE asks it to stop instead of cancelling at once."""
        (await self._job_state(job_id)).attached = True

    def detach(self, job_id: str) -> None:
        """This process stops producing for the job and another process gives it its final
        status (cluster mode: a crawl that ended elsewhere): drop the job's state here, or, while
        its drainer runs here, leave it to the drainer (it sees the final status in the store
        and ends once the terminal event is delivered)."""
        job = self._active.get(job_id)
        if job is None:
            return
        job.attached = False
        if not job.drainer and (job.webhook is None or job.drained or job.remote):
            del self._active[job_id]

    async def cancel(self, job_id: str) -> None:
        """DELETE: a producer's own canceller (`add_canceller`), else ask an attached producer
        to stop, or cancel a job nobody produces for."""
        record = await self.get_job(job_id)
        if record is None:
            raise JobNotFound(job_id)
        if record.finished:
            raise JobFinished(job_id, record.status)
        for producer_cancel in self._cancellers:
            if await producer_cancel(record):
                return
        job = self._active.get(job_id)
        if job is not None and job.attached:
            job.cancel.set()
            log.info("job cancel requested", job=job_id)
            return
        await self.finish(job_id, "cancelled", events.CANCELLED_BY_USER)

    async def wait_drained(self, job_id: str) -> None:
        """Return once the job's drainer (if any) has finished."""
        job = self._active.get(job_id)
        if job is not None and job.webhook is not None and not job.drained:
            await job.done.wait()

    async def status(self) -> dict[str, Any]:
        jobs = list(self._active.values())
        now = self.clock_ms()
        heads = [j.head_ms for j in jobs if j.head_ms is not None]
        shared: dict[str, Any] = {}
        if self.cluster is not None and self.cluster.multi:
            shared = {"cluster": await self.cluster_status(self.cluster)}
        if self.jobs_cfg.store:
            try:
                shared["retrying"] = await self.retrying()
            except DB_ERRORS as exc:
                shared["retrying"] = {"error": f"the store did not answer: {type(exc).__name__}"}
        return {
            **shared,
            "store": self.jobs_cfg.store,
            "jobs_active": len(jobs),
            "jobs_running": sum(1 for j in jobs if not j.terminated),
            "drainers": sum(1 for j in jobs if j.drainer),
            "pending_events": sum(j.pending for j in jobs),
            "memory_queued": sum(j.memory.pending for j in jobs if j.memory is not None),
            "degraded_jobs": sum(1 for j in jobs if j.degraded),
            "oldest_pending_s": round((now - min(heads)) / 1000, 3) if heads else None,
            "unsaved_finishes": len(self._unsaved),
            "host_clients": self.deliverer.host_clients,
            "outcomes": {
                o: self.deliverer.outcomes[o] for o in ("delivered", "failed", "blocked", "skipped")
            },
        }

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The drainers: resume every job with events left after a restart, then start one for
        each new job with a webhook. Runs until cancelled."""
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(self.deliverer.aclose)
            stack.callback(self._stopped)
            self._stopping = False
            found = await self.store.read(jobstore.resumable)
            leases: dict[str, Lease] = {}
            if self.cluster is not None and found:
                names = [jobstore.stream_name(r.id) for r, _ in found]
                leases = {lease.name: lease for lease in await self.cluster.try_acquire(names)}
                found = [(r, n) for r, n in found if jobstore.stream_name(r.id) in leases]
            for record, pending in found:
                if record.id not in self._active:
                    self._active[record.id] = self._state_from(record, pending)
            if found:
                log.info("resuming webhook delivery", jobs=len(found))
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for job in list(self._active.values()):
                    self._spawn(job, leases.pop(job.stream, None))
                for lease in leases.values():
                    await self.cluster.release(lease)  # type: ignore[union-attr]
                if self.cluster is not None:
                    # Also on SQLite: a drainer whose lease ran out (a stalled loop) restarts.
                    nursery.start_soon(self._scan_loop, self.cluster)
                task_status.started()
                await self.deliverer.close_idle_clients()

    def _stopped(self) -> None:
        self._nursery = None
        self._stopping = True
        for scope in list(self._push_scopes):
            scope.cancel()

    async def _job_state(self, job_id: str, *, allow_finished: bool = False) -> JobState:
        job = self._active.get(job_id)
        if job is not None:
            return job
        if job_id in self._unsaved and not allow_finished:
            raise JobFinished(job_id, self._unsaved[job_id].status)
        record = await self.store.read(lambda c: jobstore.get_job(c, job_id))
        if record is None:
            raise JobNotFound(job_id)
        if record.finished and not allow_finished:
            raise JobFinished(job_id, record.status)
        job = self._active.get(job_id)
        if job is None:
            job = self._active[job_id] = self._state_from(record, 0)
        return job

    def _state_from(self, record: JobRecord, pending: int) -> JobState:
        return JobState(
            record.id,
            record.kind,
            record.webhook,
            durable=self.jobs_cfg.store,
            last_seq=record.last_seq,
            terminated=record.terminated or record.finished,
            pending=pending,
        )

    def _spawn(self, job: JobState, lease: Lease | None = None) -> None:
        """Start the job's drainer (in cluster mode under `lease`, or after trying for it)."""
        if job.webhook is None or job.drainer:
            return
        if self._nursery is None:
            return  # `run` starts it
        job.drainer = True
        job.remote = False
        job.done = trio.Event()
        self._nursery.start_soon(self._drain, job, lease)

    async def _drain(self, job: JobState, lease: Lease | None) -> None:
        cluster = self.cluster
        try:
            if cluster is not None and lease is None:
                try:
                    taken = await cluster.try_acquire([job.stream])
                except DB_ERRORS as exc:
                    log.warning("could not take a drainer lease", job=job.id, error=str(exc))
                    taken = []
                if not taken:
                    job.remote = True  # the scan tries again while it has events to deliver
                    return
                [lease] = taken
            if lease is None:
                await self._supervised(JobDrainer(job, self.deliverer, self.store, self.clock_ms))
                return
            drainer = JobDrainer(
                job,
                self.deliverer,
                self.store,
                self.clock_ms,
                lease=lease,
                poll_s=self.store.wakeups.safety_s if cluster.multi else None,  # type: ignore[union-attr]
            )
            try:
                with lease.scope:
                    await self._supervised(drainer)
            finally:
                if not job.drained:
                    job.remote = True  # the scan takes it again once the lease is free
                await cluster.release(lease)  # type: ignore[union-attr]
        except StoreClosed:
            pass
        finally:
            job.drainer = False
            job.done.set()
            self._forget_if_done(job)

    async def _supervised(self, drainer: JobDrainer) -> None:
        job = drainer.job
        lost = False

        async def body(*, task_status: trio.TaskStatus[None]) -> None:
            nonlocal lost
            task_status.started()
            try:
                await drainer.run()
            except LeaseLost:
                lost = True
                log.warning("webhook drainer lease lost; another instance continues", job=job.id)

        try:
            await supervise(ComponentState(f"webhook:{job.id}"), body, max_restarts=5, window=60.0)
            job.drained = not lost
        except GaveUp:
            log.critical("webhook drainer gave up; the job resumes after a restart", job=job.id)

    def _forget_if_done(self, job: JobState) -> None:
        done = job.terminated and not job.attached and not job.drainer
        ended = job.webhook is None or job.drained or job.remote
        if done and ended and self._active.get(job.id) is job:
            del self._active[job.id]

    def jobs_in_memory(self) -> list[JobState]:
        """The jobs with live webhook state in this process (the webhook gauges read them)."""
        return list(self._active.values())


@contextlib.asynccontextmanager
async def running(manager: JobManager) -> AsyncIterator[JobManager]:
    """Run the manager's drainers for the duration of the block (tests, scripts)."""
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.run)
        try:
            yield manager
        finally:
            nursery.cancel_scope.cancel()
