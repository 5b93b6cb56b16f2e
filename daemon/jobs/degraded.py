# Degraded mode: when one of the manager's own writes raises DB_ERRORS the job degrades: its
# later events are numbered in memory (after the highest seq it knows) and go to the memory
# queue; `finish` keeps the final status in memory and the cleanup loop retries saving it. On a
# store other processes share (PostgreSQL) a lost connection is waited out instead (`_settle`):
# the failed write may have committed, and numbering its event again would give one seq to two
# events.
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import trio

from daemon.jobs import events
from daemon.jobs import store as jobstore
from daemon.jobs.jobstate import JobState
from daemon.jobs.numbering import PendingEvents, new_item
from daemon.jobs.shared import ManagerState
from daemon.jobs.types import JobFinished, JobNotFound, JobRecord
from daemon.jobs.webhook_metrics import EVENTS
from daemon.logs import get_logger
from daemon.outbox import MemoryStream, NewItem
from daemon.store import DB_ERRORS, Conn

log = get_logger("jobs")


class UnsavedFinish(msgspec.Struct, frozen=True):
    status: str
    error: str | None
    at_ms: int
    expires_ms: int


class DegradedMode(ManagerState):
    def _settles(self, job: JobState, type_: str | None) -> bool:
        """Whether a failed write issuing an event of `type_` (None: the terminal one) for `job`
        is settled by reading the store again instead of degrading: on a store other processes
        share (PostgreSQL) a lost connection is an outage to wait out, and the failed write may
        have committed (its COMMIT was sent), so numbering the event again in memory would give
        one seq to two events. Only where the job row shows whether it committed: an event the
        job's filter keeps moves its last seq, a terminal one gives it its final status; and only
        for errors of a lost connection (`backend.retryable`), others degrade the job."""
        if not (self.store.backend.shared and job.durable and not job.degraded):
            return False
        if job.webhook is None:
            return False
        return type_ is None or events.wants(job.webhook.events, type_)

    async def _settle(
        self, job: JobState, exc: BaseException, committed: Callable[[JobRecord], bool]
    ) -> PendingEvents | None:
        """After a failed write for `job` on a shared store: wait until the store answers and
        read the job; if `committed(record)` the write went through (the events it issued are
        taken as issued; None otherwise: run it again)."""
        log.warning(
            "a job's write failed; settling it once the store answers",
            job=job.id,
            error=f"{type(exc).__name__}: {exc}",
        )
        delay = 0.1
        while True:
            try:
                record = await self.store.read(lambda c: jobstore.get_job(c, job.id))
                break
            except DB_ERRORS:
                await trio.sleep(delay)
                delay = min(delay * 2, 2.0)
        if record is None:
            raise JobNotFound(job.id)
        if not committed(record):
            if record.finished:
                raise JobFinished(job.id, record.status)
            await trio.sleep(0.1)  # then it runs again
            return None
        log.info("the failed write had committed", job=job.id, last_seq=record.last_seq)
        issued = max(0, record.last_seq - job.last_seq)
        job.last_seq = max(job.last_seq, record.last_seq)
        job.pending += issued
        return PendingEvents(job.id, terminal=record.terminated)

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
            pending.memory.append(new_item(job.kind, job.id, job.webhook, name, seq, data, error))
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

    async def _save_unsaved(self) -> None:
        for job_id, unsaved in list(self._unsaved.items()):

            def tx(conn: Conn, j: str = job_id, u: UnsavedFinish = unsaved) -> None:
                with contextlib.suppress(JobFinished, JobNotFound):
                    jobstore.set_finished(conn, j, u.status, u.error, u.at_ms, u.expires_ms)

            try:
                await self.store.write(tx)
            except DB_ERRORS as exc:
                log.warning("final job status still not saved", job=job_id, error=str(exc))
                continue
            del self._unsaved[job_id]
            log.info("final job status saved", job=job_id, status=unsaved.status)
