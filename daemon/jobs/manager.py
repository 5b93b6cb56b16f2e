# The jobs part's one object: producers (the collector, later Firecrawl-style crawls) create jobs,
# report pages, errors and the final status through it; the API reads jobs through it; it runs a
# drainer per job with a webhook.
#
# Why events are issued where they are: a job's state change and the event announcing it commit
# in ONE store transaction (`page_in_tx` runs inside the collector's own window transaction), so
# whatever a webhook points to is readable before it is sent, and a crash can lose neither. The
# seq comes from the job row in that transaction (`jobstore.issue_seq`), so the store's single
# writer is the lock that makes queue order = seq order = delivery order, and a rolled-back
# transaction leaves no gap. `after_commit` then wakes the drainer, or (memory mode, degraded
# jobs) puts the numbered event in the job's bounded memory queue, waiting while it is full.
#
# Contract for producers: one producer per job at a time, and `after_commit(pending)` is awaited
# before that job's next event is issued. The manager's own methods hold the job's lock.
#
# Cluster mode (`cluster` given): a job's drainer runs under the lease `webhook:<job id>` (the
# instance creating the job tries first); every instance scans each poll for jobs with undelivered
# events whose lease is free (the owner died or let go) and takes up to its fair share of them
# (spread.py), continuing after the ack cursor. Expiry runs on one instance (`jobs:expiry`).
#
# Store failures: if one of the manager's own writes raises DB_ERRORS the job degrades: its
# later events are numbered in memory (after the highest seq it knows) and go to the memory
# queue; `finish` keeps the final status in memory and the cleanup loop retries saving it.
from __future__ import annotations

import contextlib
import functools
import random
import uuid
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
import msgspec
import trio
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from daemon import config
from daemon import outbox as outbox_mod
from daemon.cluster import Cluster, Lease, LeaseLost
from daemon.cluster import rules as cluster_rules
from daemon.cluster import store as cluster_store
from daemon.config import JobsConfig, WebhookFields, WebhooksConfig, WebhookSpec
from daemon.jobs import events, spread
from daemon.jobs import store as jobstore
from daemon.jobs.drainer import (
    EVENTS,
    Deliverer,
    DeliverySettings,
    JobDrainer,
    JobState,
)
from daemon.jobs.store import JobError, JobFinished, JobNotFound, JobRecord
from daemon.logs import get_logger
from daemon.metrics import REGISTRY
from daemon.outbox import MemoryStream, NewItem, Outbox, now_ms
from daemon.store import DB_ERRORS, Conn, Store, StoreClosed
from daemon.supervise import ComponentState, GaveUp, supervise

log = get_logger("jobs")

FinalStatus = Literal["completed", "failed", "cancelled"]
DELETE_CHUNK = 2000
EXPIRY_LEASE = "jobs:expiry"


@dataclass
class PendingEvents:
    """What a transaction issued for a job; pass it to `after_commit` once it committed."""

    job_id: str
    durable: list[NewItem] = field(default_factory=list)
    """Events appended to the job's outbox stream in the transaction."""
    memory: list[NewItem] = field(default_factory=list)
    """Numbered events for the job's memory queue, in seq order."""
    terminal: bool = False
    degraded: bool = False
    first_row: int | None = None
    """`n` of the first job row the transaction stored (`page_in_tx`), None when none was kept."""


class _UnsavedFinish(msgspec.Struct, frozen=True):
    status: str
    error: str | None
    at_ms: int
    expires_ms: int


def _seq(item: NewItem) -> int:
    return int(item.meta["seq"])


class JobManager:
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
        self._unsaved: dict[str, _UnsavedFinish] = {}
        self._nursery: trio.Nursery | None = None
        self._stopping = False
        self._push_scopes: set[trio.CancelScope] = set()
        _LIVE.add(self)

    # -- configuration ---------------------------------------------------------------------

    def configure(self, jobs: JobsConfig, webhooks: WebhooksConfig) -> None:
        """New settings: delivery settings apply from the next attempt, jobs settings to jobs
        created from now on."""
        self.deliverer.reconfigure(DeliverySettings.from_config(webhooks))
        self.jobs_cfg = jobs

    async def on_reload(
        self, old: config.Config, new: config.Config, change: config.ConfigDiff
    ) -> None:
        if {"jobs", "webhooks"} & set(change.sections_changed):
            self.configure(new.jobs, new.webhooks)
            log.info("jobs and webhook settings updated")

    @property
    def ttl_ms(self) -> int:
        return int(self.jobs_cfg.ttl * 1000)

    # -- producers -------------------------------------------------------------------------

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

    async def after_commit(self, pending: PendingEvents) -> None:
        """After the transaction that issued `pending` committed: wake the job's drainer, or
        queue its events in memory (waiting while the job's memory queue is full)."""
        job = self._active.get(pending.job_id)
        if job is None:
            if not (pending.durable or pending.memory):
                return
            job = await self._job_state(pending.job_id, allow_finished=True)
        if pending.durable:
            job.last_seq = max(job.last_seq, *(_seq(i) for i in pending.durable))
            job.pending += len(pending.durable)
            if job.disk_closed:
                # The drainer no longer reads the outbox (the store failed under it): send these
                # from memory now; after a restart they go out again from disk, same webhookId.
                for item in pending.durable:
                    await self._push_memory(job, item, degraded=True, count=False)
        for item in pending.memory:
            job.last_seq = max(job.last_seq, _seq(item))
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
            try:
                pending = await self.store.write(
                    lambda c: self.page_in_tx(c, job_id, rows, total=total)
                )
            except DB_ERRORS as exc:
                stored = False
                pending = self._degraded_event(job, "page", rows, None, exc)
            await self.after_commit(pending)
        return stored

    async def finish(self, job_id: str, status: FinalStatus, error: str | None = None) -> None:
        """Give the job its final status and issue its one terminal event (`completed`, or
        `failed` with the error; `cancelled` sends `failed` with error "cancelled")."""
        name, reason = events.terminal_for_status(status, error)
        job = await self._job_state(job_id)
        async with job.lock:
            at = self.clock_ms()
            expires = at + self.ttl_ms
            saved_error = reason if status == "failed" else error

            def tx(conn: Conn) -> PendingEvents:
                record = jobstore.require_running(conn, job_id)
                pending = PendingEvents(job_id, terminal=True)
                self._event_in_tx(conn, record, name, [], reason, pending)
                jobstore.set_finished(conn, job_id, status, saved_error, at, expires)
                return pending

            if job_id in self._unsaved:
                raise JobFinished(job_id, self._unsaved[job_id].status)
            try:
                pending = await self.store.write(tx)
            except DB_ERRORS as exc:
                pending = self._degraded_event(job, name, [], reason, exc, terminal=True)
                self._unsaved[job_id] = _UnsavedFinish(status, saved_error, at, expires)
                log.error("could not save the job's final status; will retry", job=job_id)
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
        """DELETE: ask an attached producer to stop, or cancel a job nobody produces for."""
        record = await self.get_job(job_id)
        if record is None:
            raise JobNotFound(job_id)
        if record.finished:
            raise JobFinished(job_id, record.status)
        job = self._active.get(job_id)
        if job is not None and job.attached:
            job.cancel.set()
            log.info("job cancel requested", job=job_id)
            return
        await self.finish(job_id, "cancelled")

    # -- readers ---------------------------------------------------------------------------

    async def get_job(self, job_id: str) -> JobRecord | None:
        """The job as stored (with a final status not yet saved), or None (unknown or expired)."""
        record = await self.store.read(lambda c: jobstore.get_job(c, job_id))
        if record is None:
            return None
        unsaved = self._unsaved.get(job_id)
        if unsaved is not None and not record.finished:
            record = msgspec.structs.replace(
                record,
                status=unsaved.status,
                error=unsaved.error,
                completed_ms=unsaved.at_ms,
                expires_ms=unsaved.expires_ms,
                terminated=True,
            )
        if record.finished and record.expires_ms <= self.clock_ms():
            return None
        return record

    async def job_rows(
        self, job_id: str, skip: int, limit: int, max_bytes: int
    ) -> tuple[list[bytes], bool]:
        return await self.store.read(
            lambda c: jobstore.read_rows(c, job_id, skip, limit, max_bytes)
        )

    async def has_error_code(self, job_id: str, code: str) -> bool:
        return await self.store.read(lambda c: jobstore.has_error_code(c, job_id, code))

    async def job_errors(self, job_id: str) -> list[JobError]:
        return await self.store.read(lambda c: jobstore.list_errors(c, job_id))

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

    async def cluster_status(self, cluster: Cluster, top: int = 20) -> dict[str, Any]:
        """Every instance's view of the shared store: drainers per instance, the backlog, and
        the `top` jobs with the biggest backlog with the instance draining each (None: nobody
        yet; a scan takes it within a second)."""
        scan = await self.store.read(functools.partial(_scan, instance=cluster.instance))
        biggest = sorted(scan.backlog, key=lambda j: (-scan.backlog[j], j))[:top]
        return {
            "drainers": spread.per_instance(scan.holders.values()),
            "backlog_events": sum(scan.backlog.values()),
            "backlog_jobs": len(scan.backlog),
            "jobs": [
                {"job": j, "backlog": scan.backlog[j], "instance": scan.holders.get(j)}
                for j in biggest
            ],
        }

    # -- components ------------------------------------------------------------------------

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

    async def run_cleanup(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Delete expired finished jobs (and their rows, errors and events) periodically; in
        cluster mode on one instance at a time (the lease `jobs:expiry`), while every instance
        retries saving its own unsaved final statuses."""
        task_status.started()
        if self.cluster is None:
            await self._cleanup_loop(None)
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._cleanup_loop, None, True)
            await self.cluster.run_owned(EXPIRY_LEASE, self._cleanup_loop)

    async def _cleanup_loop(self, lease: Lease | None, unsaved_only: bool = False) -> None:
        while True:
            try:
                if unsaved_only:
                    await self._save_unsaved()
                else:
                    await self.cleanup_once(lease)
            except DB_ERRORS as exc:
                log.error(
                    "jobs cleanup failed; retrying later", error=f"{type(exc).__name__}: {exc}"
                )
            await trio.sleep(max(1.0, min(60.0, self.jobs_cfg.ttl / 10)))

    async def cleanup_once(self, lease: Lease | None = None) -> int:
        """One cleanup pass; returns the number of jobs deleted. With `lease` (cluster mode)
        each delete checks it, and the finished job's drainer lease row goes with the job."""
        await self._save_unsaved()
        now = self.clock_ms()
        removed = 0
        while ids := [
            i
            for i in await self.store.read(lambda c: jobstore.expired(c, now, 100))
            if i not in self._active
        ]:
            for job_id in ids:
                step = functools.partial(_delete_step, job_id=job_id, lease=lease)
                while not await self.store.write(step):
                    pass
                removed += 1
            if len(ids) < 100:
                break
        if removed:
            log.info("expired jobs deleted", jobs=removed)
        return removed

    # -- internals -------------------------------------------------------------------------

    def _event_in_tx(
        self,
        conn: Conn,
        record: JobRecord,
        name: str,
        data: list[Any],
        error: str | None,
        pending: PendingEvents,
    ) -> None:
        if record.webhook is None:
            return
        job = self._active.get(record.id)
        seq = jobstore.issue_seq(conn, record, name, job.last_seq if job else 0)
        if seq is None:
            return
        item = _new_item(record.kind, record.id, record.webhook, name, seq, data, error)
        durable = job.durable and not job.degraded if job else self.jobs_cfg.store
        if durable:
            outbox_mod.append(conn, jobstore.stream_name(record.id), [item], self.clock_ms())
            pending.durable.append(item)
        else:
            pending.memory.append(item)
            pending.degraded = job is not None and job.durable

    def _degraded_event(
        self,
        job: JobState,
        name: str,
        data: list[Any],
        error: str | None,
        exc: BaseException,
        *,
        terminal: bool = False,
    ) -> PendingEvents:
        """The store failed: number the event in memory and queue it there."""
        pending = PendingEvents(job.id, terminal=terminal, degraded=job.durable)
        log.error(
            "store write failed for a job",
            job=job.id,
            event=name,
            error=f"{type(exc).__name__}: {exc}",
        )
        if job.webhook is None:
            return pending
        if job.durable:
            job.degrade(f"storing its {name} event failed", exc)
        seqr = events.Sequencer(
            kind=job.kind,
            events=list(job.webhook.events),
            last_seq=job.last_seq,
            terminated=job.terminated,
        )
        try:
            seq = seqr.issue(name)
        except events.TerminalAlreadyIssued:
            raise JobFinished(job.id, "finished") from exc
        if seq is not None:
            pending.memory.append(_new_item(job.kind, job.id, job.webhook, name, seq, data, error))
        return pending

    async def _push_memory(
        self, job: JobState, item: NewItem, *, degraded: bool, count: bool = True
    ) -> None:
        if degraded and count:
            EVENTS.labels("degraded").inc()
        if self._stopping:
            self._dropped(job)
            return
        if job.memory is None:
            job.memory = MemoryStream(job.stream, self.jobs_cfg.memory_queue_size)
        with self._push_scope() as scope:
            await job.memory.append([item])
        if scope.cancelled_caught:
            self._dropped(job)
            return
        job.wake.fire()

    @contextlib.contextmanager
    def _push_scope(self) -> Iterator[trio.CancelScope]:
        with trio.CancelScope() as scope:
            self._push_scopes.add(scope)
            try:
                yield scope
            finally:
                self._push_scopes.discard(scope)

    def _dropped(self, job: JobState) -> None:
        EVENTS.labels("dropped").inc()
        job.pending = max(0, job.pending - 1)
        log.warning("webhook event dropped: shutting down", job=job.id)

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
                poll_s=cluster_rules.poll_every_s(cluster.lease_s) if cluster.multi else None,  # type: ignore[union-attr]
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

    async def _scan_loop(self, cluster: Cluster) -> None:
        while True:
            await trio.sleep(cluster_rules.poll_every_s(cluster.lease_s))
            try:
                await self.scan_once(cluster)
            except DB_ERRORS as exc:
                log.warning("webhook drainer scan failed", error=f"{type(exc).__name__}: {exc}")

    async def scan_once(self, cluster: Cluster) -> list[str]:
        """Take the drainer leases of jobs with undelivered events nobody drains (up to this
        instance's fair share) and start their drainers; returns the job ids taken."""

        scan = await self.store.read(functools.partial(_scan, instance=cluster.instance))
        running = [j.id for j in self._active.values() if j.drainer]
        wanted = spread.to_take(
            spread.free_jobs(scan.backlog, scan.held, running),
            scan.held_here,
            len(scan.backlog),
            scan.members,
        )
        if not wanted:
            return []
        leases = await cluster.try_acquire([jobstore.stream_name(j) for j in wanted])
        if not leases:
            return []
        ids = [lease.name[len(jobstore.STREAM_PREFIX) :] for lease in leases]
        records = await self.store.read(lambda c: [jobstore.get_job(c, i) for i in ids])
        for lease, record in zip(leases, records, strict=True):
            job = self._active.get(record.id) if record is not None else None
            if record is None or record.webhook is None or (job is not None and job.drainer):
                await cluster.release(lease)
                continue
            if job is None:
                job = self._active[record.id] = self._state_from(record, scan.backlog[record.id])
            log.info("taking over a job's webhook delivery", job=record.id)
            self._spawn(job, lease)
        return ids

    def _forget_if_done(self, job: JobState) -> None:
        done = job.terminated and not job.attached and not job.drainer
        ended = job.webhook is None or job.drained or job.remote
        if done and ended and self._active.get(job.id) is job:
            del self._active[job.id]

    async def _save_unsaved(self) -> None:
        for job_id, unsaved in list(self._unsaved.items()):

            def tx(conn: Conn, j: str = job_id, u: _UnsavedFinish = unsaved) -> None:
                with contextlib.suppress(JobFinished, JobNotFound):
                    jobstore.set_finished(conn, j, u.status, u.error, u.at_ms, u.expires_ms)

            try:
                await self.store.write(tx)
            except DB_ERRORS as exc:
                log.warning("final job status still not saved", job=job_id, error=str(exc))
                continue
            del self._unsaved[job_id]
            log.info("final job status saved", job=job_id, status=unsaved.status)


class _Scan(msgspec.Struct, frozen=True):
    backlog: dict[str, int]
    """Job id → events after its cursor."""
    held: list[str]
    """Jobs whose drainer lease is held now (by any instance)."""
    held_here: int
    """Of those, how many this instance holds."""
    members: int
    """Live instances."""
    holders: dict[str, str]
    """Job id → instance draining it."""


def _scan(conn: Conn, instance: str) -> _Scan:
    """One read: the jobs with a backlog, who drains what, how many instances are alive."""
    prefix = jobstore.STREAM_PREFIX
    holders = {
        row["name"][len(prefix) :]: row["holder"]
        for row in cluster_store.leases(conn, prefix)
        if row["held"]
    }
    members = sum(
        1 for m in cluster_store.members(conn) if cluster_rules.alive(m["expires_ms"], m["now_ms"])
    )
    return _Scan(
        backlog=jobstore.undelivered(conn),
        held=list(holders),
        held_here=sum(1 for h in holders.values() if h == instance),
        members=members,
        holders=holders,
    )


def _delete_step(conn: Conn, job_id: str, lease: Lease | None) -> bool:
    """One transaction of deleting an expired job (checking the expiry lease); the job's
    drainer lease row goes with the job."""
    if lease is not None:
        lease.check(conn)
    done = jobstore.delete_job(conn, job_id, DELETE_CHUNK)
    if done:
        cluster_store.drop_leases(conn, jobstore.stream_name(job_id))
    return done


def _new_item(
    kind: str,
    job_id: str,
    webhook: WebhookFields,
    name: str,
    seq: int,
    data: list[Any],
    error: str | None,
) -> NewItem:
    webhook_id = str(uuid.uuid4())
    body = events.build_body(
        kind=kind,
        name=name,
        job_id=job_id,
        seq=seq,
        webhook_id=webhook_id,
        data=data,
        error=error,
        metadata=webhook.metadata,
    )
    return NewItem(
        key=webhook_id, body=events.encode_body(body), meta={"type": body.type, "seq": seq}
    )


# Scrape-time gauges over every live manager (several daemons may share a test process).
_LIVE: weakref.WeakSet[JobManager] = weakref.WeakSet()


class _WebhookGauges(Collector):
    def collect(self) -> Iterator[GaugeMetricFamily]:
        lag = GaugeMetricFamily(
            "crawld_webhook_cursor_lag",
            "Webhook events of a job issued but not yet at a final outcome",
            labels=["job"],
        )
        oldest = GaugeMetricFamily(
            "crawld_webhook_oldest_pending_seconds",
            "Age of the oldest webhook event being delivered (0 when none)",
        )
        now = outbox_mod.now_ms()
        heads = []
        for manager in list(_LIVE):
            for job in list(manager._active.values()):
                if job.webhook is not None and (job.pending or job.drainer):
                    lag.add_metric([job.id], job.pending)
                if job.head_ms is not None:
                    heads.append(job.head_ms)
        oldest.add_metric([], (now - min(heads)) / 1000 if heads else 0.0)
        yield lag
        yield oldest


REGISTRY.register(_WebhookGauges())


@contextlib.asynccontextmanager
async def running(manager: JobManager) -> AsyncIterator[JobManager]:
    """Run the manager's drainers for the duration of the block (tests, scripts)."""
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.run)
        try:
            yield manager
        finally:
            nursery.cancel_scope.cancel()
