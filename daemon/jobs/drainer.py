# One drainer per job delivers that job's webhook events in seq order, one request in flight,
# so a receiver sees started < pages < terminal and a failing event holds back the ones after it
# until it has a final outcome (delivered, failed after the retry schedule, or blocked by the
# SSRF guard). Many jobs drain at once; a limiter per destination host caps how many requests hit
# one receiver together.
#
# Where events come from (JobState says which):
# - the job's durable outbox stream: read after the ack cursor; after each final outcome ONE
#   transaction advances the cursor and, for a failure, appends the job error (the batch's rows
#   are deleted with its last event's ack: one statement per event instead of two). The next
#   event goes out only once that transaction committed, so a crash can only repeat the event in
#   flight (same webhookId and bytes);
# - its bounded memory queue: with `jobs.store = false`, or for events issued after the store
#   failed (the job is "degraded"). A degraded durable job first sends what it can still read
#   from disk, then the memory queue; anything left unread on disk goes out after a restart.
#
# Failing soft: anything that goes wrong while building or sending one delivery (settings an older
# crawld stored that today's rules refuse, an encoding error, a bug) is that event's final failure,
# recorded as a job error, never an exception that restarts the drainer in a loop.
#
# 410 Gone disables the endpoint for the job: the event and every later one (also those issued
# afterwards) become ONE job error whose count grows, the cursor moves to the end, and a row in
# `webhook_gone` keeps it so after a restart. The job's own status is not touched.
#
# Cluster mode: a drainer runs under the lease `webhook:<job id>` (manager.py takes it), so one
# instance delivers a job's events at a time. Every write it makes (cursor, errors, the gone mark)
# checks the lease in its own transaction, and no attempt starts once the lease may have run out
# locally: an instance paused past its lease wakes up unable to send or move the cursor. The job's
# producer may live on another instance: its appends wake the drainer through the store's
# wake-ups (daemon/store/wake.py), and an idle drainer still looks every `poll_s` in case one
# was lost.
#
# Retries outlive the drainer: after each failed attempt that will be retried, the attempts made
# and the time of the next one are stored for the event at the cursor (jobs.store.RetryState,
# written under the lease); the transaction giving the event its final outcome deletes them. A
# drainer starting on a job (after a restart, a reload, or on the instance the lease moved to)
# continues that schedule (retry.resume): same attempt numbers, nothing sent before its time.
#
# A store shared with other instances (PostgreSQL) going away is an outage to wait out, not a
# reason to stop reading the outbox: the drainer reads again from the cursor once it answers
# (the ack of the event in flight may be lost: that one event goes out twice), and ends without
# sending anything once its lease may have run out; whoever takes the lease next continues at the
# cursor. With SQLite a failed read or ack degrades the job (spec "Delivery" 6).
#
# The HTTP side is delivery.py (`Deliverer`, shared by every drainer); what the manager and a
# drainer share about a job is jobstate.py; the webhook metrics are webhook_metrics.py.
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal

import trio

from daemon import outbox as outbox_mod
from daemon.cluster import Lease, LeaseLost, fenced
from daemon.jobs import events, retry
from daemon.jobs import store as jobstore
from daemon.jobs.delivery import Deliverer, Final
from daemon.jobs.jobstate import JobState
from daemon.jobs.webhook_metrics import DELIVERY_SECONDS, EVENTS
from daemon.logs import get_logger
from daemon.outbox import Item
from daemon.redact import redact_url
from daemon.store import DB_ERRORS, Conn, Store, wake

log = get_logger("webhooks")

READ_BATCH = 64
STORE_RETRY_S = 0.5
"""A drainer on a shared store that failed reads again from the cursor after this long."""


class _StoreDown(Exception):
    """A shared store failed under the drainer: read again from the cursor once it answers."""

    def __init__(self, why: str, exc: BaseException) -> None:
        super().__init__(why)
        self.why = why
        self.exc = exc


_Read = tuple[jobstore.GoneMark | None, list[Item], bool, jobstore.RetryState | None]


class JobDrainer:
    """Delivers one job's events until the job is finished and its queue is empty."""

    def __init__(
        self,
        job: JobState,
        deliverer: Deliverer,
        store: Store,
        clock_ms: Callable[[], int] = outbox_mod.now_ms,
        *,
        lease: Lease | None = None,
        poll_s: float | None = None,
    ) -> None:
        self.job = job
        self.deliverer = deliverer
        self.store = store
        self.clock_ms = clock_ms
        self.lease = lease
        """The job's drainer lease (cluster mode): every write checks it."""
        self.poll_s = poll_s
        """Set when other instances share the store: re-read it this often while idle (the
        producer may be another instance), and send nothing once the lease may have run out."""
        self._stored_retry = False
        """A retry row may exist for the job (read or written): the next ack deletes it."""

    async def _write(self, fn: Callable[[Conn], Any], *, small: bool = False) -> Any:
        """`fn` in a store transaction that first checks the lease (LeaseLost: nothing kept);
        `small`: an ack, awaited before the next event goes out (Store.write)."""
        return await fenced.write(self.store, self.lease, fn, small=small)

    def _may_send(self) -> None:
        """Raise LeaseLost once the lease may have run out (e.g. after a pause): nothing more
        goes out on the strength of it."""
        lease = self.lease
        if lease is None or self.poll_s is None:
            return
        if lease.lost.is_set() or lease.deadline <= trio.current_time():
            raise LeaseLost(lease.name)

    async def run(self) -> None:
        job = self.job
        try:
            while job.durable and not job.disk_closed:
                try:
                    await self._drain_disk()  # its first read checks the gone mark too
                    break
                except _StoreDown as down:
                    log.warning(
                        "the store failed under the webhook drainer; reading again from the"
                        " cursor once it answers",
                        job=job.id,
                        why=down.why,
                        error=f"{type(down.exc).__name__}: {down.exc}",
                    )
                    await trio.sleep(STORE_RETRY_S)
                    self._may_send()  # the lease may have run out meanwhile: stop here
            if not job.gone_checked:
                try:
                    job.gone = await self.store.read(lambda c: jobstore.webhook_gone(c, job.id))
                    job.gone_checked = True
                except DB_ERRORS as exc:
                    log.warning("could not read the job's webhook state", job=job.id, error=exc)
            await self._drain_memory()
        except trio.Cancelled:
            if job.memory is not None and job.memory.pending:
                EVENTS.labels("dropped").inc(job.memory.pending)
                log.warning(
                    "shutting down with webhook events only in memory; they are lost",
                    job=job.id,
                    events=job.memory.pending,
                )
            raise

    async def _drain_disk(self) -> None:
        job = self.job
        stream = job.stream

        polled = self.poll_s is not None

        def read(conn: Conn, gone: bool, retries: bool) -> _Read:
            mark = jobstore.webhook_gone(conn, job.id) if gone else None
            # Read first: when another instance produces, a terminal flag seen in the same
            # snapshot means its terminal event is in this read (or was acked before it).
            ended = polled and jobstore.is_terminated(conn, job.id)
            items = outbox_mod.read_after_cursor(conn, stream, READ_BATCH)
            # The retries stored for the event at the cursor (unless this drainer wrote them).
            stored = jobstore.retry_state(conn, job.id) if items and retries else None
            return mark, items, ended, stored

        wakeups = self.store.wakeups
        while True:
            woken = job.wake.event
            appended = wakeups.event(wake.APPENDED, stream)  # by any cluster member
            terminated, degraded = job.terminated, job.degraded
            check_gone = not job.gone_checked  # the first read also fetches the gone mark
            retries = not self._stored_retry
            try:
                mark, batch, ended, stored = await self.store.read(
                    functools.partial(read, gone=check_gone, retries=retries)
                )
            except DB_ERRORS as exc:
                self._close_disk("reading the webhook outbox failed", exc)
                return
            if batch and retries:
                job.retry, self._stored_retry = stored, stored is not None
            if ended:
                terminated = job.terminated = True
            if check_gone:
                job.gone, job.gone_checked = mark, True
            if not batch:
                if degraded:
                    self._close_disk("the job's outbox is drained", None)
                    return
                if terminated:
                    return
                await wakeups.wait(woken, appended)
                continue
            if job.gone is not None:
                if not await self._skip_disk(batch):
                    return
                continue
            sent = await self._send_batch(batch)
            if sent == "stop":
                return
            if sent == "all" and terminated and len(batch) < READ_BATCH:
                # The terminal event was committed before this read, and nothing follows it:
                # the read returned everything there will ever be.
                return

    async def _send_batch(self, batch: list[Item]) -> Literal["all", "again", "stop"]:
        """Deliver a batch read from the outbox, acking each event: "all" when every event was
        acked, "again" when a 410 Gone moved the cursor to the end (read again), "stop" when
        the store failed (the disk drain ends)."""
        last = batch[-1].seq
        for item in batch:
            final = await self._send(item, durable=True)
            if final.outcome == "gone":
                if not await self._gone(item, final, durable=True):
                    return "stop"
                return "again"  # the cursor moved to the end: read again
            error = self._error_for(item, final)
            try:
                # The cursor alone per event; the batch's last ack deletes the batch.
                await self._write(
                    functools.partial(
                        self._ack_in_tx,
                        seq=item.seq,
                        prune=item.seq == last,
                        error=error,
                        clear=self._stored_retry,
                    ),
                    small=True,
                )
            except DB_ERRORS as exc:
                # Sent, but not recorded: it goes out once more after a restart, with the
                # same webhookId, and the receiver deduplicates it.
                self._close_disk("advancing the webhook cursor failed", exc)
                self._finalized(item, final)
                return "stop"
            self._stored_retry = False
            self.job.retry = None
            self._finalized(item, final)
        return "all"

    def _close_disk(self, why: str, exc: BaseException | None) -> None:
        """Stop reading the outbox (`exc`: because the store failed, which degrades the job).
        On a shared store a failure raises _StoreDown instead: it is read again."""
        if exc is not None and self.poll_s is not None:
            raise _StoreDown(why, exc)
        job = self.job
        job.disk_closed = True
        if exc is not None:
            job.degrade(why, exc)

    async def _drain_memory(self) -> None:
        job = self.job
        while True:
            woken = job.wake.event
            terminated = job.terminated
            memory = job.memory
            if memory is not None and memory.pending:
                [item] = await memory.next_batch(1)
                if job.gone is not None:
                    await memory.ack(item.seq)
                    await self._skip_memory(1)
                    continue
                final = await self._send(item, durable=False)
                await memory.ack(item.seq)
                if final.outcome == "gone":
                    await self._gone(item, final, durable=False)
                    continue
                error = self._error_for(item, final)
                if error is not None:
                    try:
                        await self._write(functools.partial(self._add_error, error=error))
                    except DB_ERRORS as exc:
                        log.error(
                            "could not record an undelivered webhook event",
                            job=job.id,
                            error=f"{type(exc).__name__}: {exc}",
                            lost=error["error"],
                        )
                self._finalized(item, final)
                continue
            if terminated:
                return
            await outbox_mod.woken_or_polled(woken, self.poll_s)

    async def _gone(self, item: Item, final: Final, *, durable: bool) -> bool:
        """The endpoint answered 410 Gone for `item`: record the one error and the mark, skip
        what is queued. False when the store failed (the disk drain must stop)."""
        job = self.job
        assert job.webhook is not None
        eid = events.event_id(job.id, item.meta.get("seq", 0))
        type_ = str(item.meta.get("type", "?"))
        at = self.clock_ms()
        url = redact_url(job.webhook.url)

        clear = durable and self._stored_retry

        def tx(conn: Conn) -> jobstore.GoneMark:
            if clear:
                jobstore.clear_retry(conn, job.id)
            return jobstore.mark_gone(
                conn,
                job.id,
                event_id=eid,
                type_=type_,
                url=url,
                at_ms=at,
                stream=job.stream if durable else None,
                seq=item.seq,
            )

        ok = True
        try:
            mark = await self._write(tx)
        except DB_ERRORS as exc:
            ok = False
            self._close_disk("recording a 410 Gone failed", exc)
            mark = jobstore.GoneMark(event_id=eid, type=type_, error_id="", skipped=0)
        job.gone = mark
        if ok and clear:
            self._stored_retry, job.retry = False, None
        self._finalized(item, Final("failed", final.attempts, final.status, final.reason))
        self._skipped(mark.skipped)
        log.warning(
            "webhook endpoint gone (HTTP 410); the job's later events are not sent",
            job=job.id,
            event=eid,
            type=type_,
            skipped=mark.skipped,
        )
        return ok

    async def _skip_disk(self, batch: list[Item]) -> bool:
        job = self.job
        upto, count = batch[-1].seq, len(batch)
        try:
            await self._write(
                lambda c: jobstore.skip_gone(c, job.id, count, stream=job.stream, upto=upto)
            )
        except DB_ERRORS as exc:
            self._close_disk("advancing the webhook cursor failed", exc)
            return False
        self._skipped(count)
        return True

    async def _skip_memory(self, count: int) -> None:
        job = self.job
        try:
            await self._write(lambda c: jobstore.skip_gone(c, job.id, count))
        except DB_ERRORS as exc:
            log.error("could not count a webhook event not sent", job=job.id, error=exc)
        self._skipped(count)

    def _skipped(self, count: int) -> None:
        if count:
            self.job.pending = max(0, self.job.pending - count)
            self.deliverer.outcomes["skipped"] += count
            EVENTS.labels("skipped").inc(count)
            log.debug("webhook events not sent: the endpoint is gone", job=self.job.id, n=count)

    async def _send(self, item: Item, *, durable: bool) -> Final:
        """Deliver `item` until its final outcome; a durable one continues the retries stored
        for it (waiting for the next attempt's time) and stores each retry it schedules."""
        job = self.job
        job.head_ms = item.created_ms
        try:
            first = 1
            stored = job.retry if durable else None
            if stored is not None:
                plan = retry.resume(
                    item.seq,
                    stored.seq,
                    stored.attempts,
                    stored.next_ms,
                    self.clock_ms(),
                    self.deliverer.settings.schedule,
                )
                first = plan.attempt
                if plan.attempt > 1:
                    log.info(
                        "continuing a webhook event's retries",
                        job=job.id,
                        event=events.event_id(job.id, item.seq),
                        attempt=plan.attempt,
                        wait_s=round(plan.wait, 3),
                    )
                    await trio.sleep(plan.wait)
            return await self.deliverer.deliver(
                job,
                item,
                self._may_send,
                first_attempt=first,
                on_retry=functools.partial(self._save_retry, item) if durable else None,
            )
        finally:
            job.head_ms = None

    async def _save_retry(
        self, item: Item, attempt: int, status: int | None, decision: retry.Decision
    ) -> None:
        """Store that attempt `attempt` of `item` failed and when the next one is due (under the
        lease). A store failure leaves the schedule in memory only: a restart would then repeat
        attempts from the last one stored, never skip the wait."""
        job = self.job
        now = self.clock_ms()
        state = jobstore.RetryState(
            job_id=job.id,
            seq=item.seq,
            attempts=attempt,
            next_ms=retry.next_attempt_ms(now, decision.delay),
            last_status=status,
            last_error=decision.reason,
            at_ms=now,
        )
        job.retry = state
        try:
            await self._write(lambda conn: jobstore.save_retry(conn, state))
        except DB_ERRORS as exc:
            log.warning(
                "could not store a webhook retry; the schedule goes on in memory",
                job=job.id,
                error=f"{type(exc).__name__}: {exc}",
            )
        self._stored_retry = True

    def _error_for(self, item: Item, final: Final) -> dict[str, Any] | None:
        if final.outcome == "delivered":
            return None
        assert self.job.webhook is not None
        eid = events.event_id(self.job.id, item.meta.get("seq", 0))
        return {
            "code": events.WEBHOOK_FAILED,
            "url": redact_url(self.job.webhook.url),
            "error": events.undelivered_error(eid, item.meta.get("type", "?"), final.reason),
        }

    def _ack_in_tx(
        self, conn: Conn, seq: int, prune: bool, error: dict[str, Any] | None, clear: bool = False
    ) -> None:
        if clear:
            jobstore.clear_retry(conn, self.job.id)
        if prune:
            outbox_mod.ack(conn, self.job.stream, seq)
        else:
            outbox_mod.advance_cursor(conn, self.job.stream, seq)
        if error is not None:
            self._add_error(conn, error)

    def _add_error(self, conn: Conn, error: dict[str, Any]) -> None:
        jobstore.add_error(conn, self.job.id, at_ms=self.clock_ms(), **error)

    def _finalized(self, item: Item, final: Final) -> None:
        job = self.job
        job.pending = max(0, job.pending - 1)
        self.deliverer.outcomes[final.outcome] += 1
        EVENTS.labels(final.outcome).inc()
        eid = events.event_id(job.id, item.meta.get("seq", 0))
        context = {
            "job": job.id,
            "event": eid,
            "type": item.meta.get("type"),
            "attempts": final.attempts,
            "status": final.status,
        }
        if final.outcome == "delivered":
            DELIVERY_SECONDS.observe(max(0, self.clock_ms() - item.created_ms) / 1000)
            log.info("webhook event delivered", **context)
        else:
            log.warning(f"webhook event {final.outcome}", reason=final.reason, **context)
