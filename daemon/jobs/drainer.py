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
# producer may live on another instance, so an idle drainer also polls the store (`poll_s`).
#
# The HTTP side (`Deliverer`) is shared by every drainer: one set of keep-alive connections per
# destination host (connections.HostConnections), so no connection verified for one name serves
# another name on the same IP, closed after CLIENT_IDLE_S without requests; requests go straight
# to it (no client layers: cookies, auth flows, redirects, Response rebuilds are not needed here)
# and the per-host limiter is what caps the connections in use;
# the signing secret, the retry schedule, the per-host limiters (all swappable on reload) and a
# short-lived cache of vetted addresses (see ssrf.VettingCache).
from __future__ import annotations

import functools
import random
import time
from collections import Counter as Tally
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import httpx
import msgspec
import trio
from prometheus_client import Counter, Histogram

from daemon import outbox as outbox_mod
from daemon.cluster import Lease, LeaseLost
from daemon.config import WebhookFields, WebhooksConfig, webhook_secret
from daemon.jobs import events, retry, signing, ssrf, webhook_rules
from daemon.jobs import store as jobstore
from daemon.jobs.connections import HostConnections
from daemon.logs import get_logger
from daemon.metrics import REGISTRY
from daemon.outbox import Item, MemoryStream, Signal
from daemon.redact import redact_url
from daemon.store import DB_ERRORS, Conn, Store

log = get_logger("webhooks")

OUTCOMES = ("delivered", "failed", "blocked", "skipped", "degraded", "dropped")
EVENTS = Counter(
    "crawld_webhook_events",
    "Webhook events by outcome: delivered, failed (retries exhausted, 410, invalid settings), "
    "blocked (SSRF guard) and skipped (not sent: the endpoint answered 410 Gone earlier) are "
    "final; degraded counts events queued in memory because the store failed; dropped counts "
    "memory-queued events lost at shutdown",
    ["outcome"],
    registry=REGISTRY,
)
ATTEMPTS = Counter(
    "crawld_webhook_attempts",
    "Webhook HTTP attempts by result: 2xx, 3xx, 4xx, 5xx, timeout, connect, dns, network, "
    "blocked, error (the request could not be built or sent)",
    ["result"],
    registry=REGISTRY,
)
DELIVERY_SECONDS = Histogram(
    "crawld_webhook_delivery_seconds",
    "Time from a webhook event being queued to its delivery (2xx)",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600),
    registry=REGISTRY,
)
ATTEMPT_SECONDS = Histogram(
    "crawld_webhook_attempt_seconds",
    "Duration of one webhook HTTP attempt",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
for _outcome in OUTCOMES:
    EVENTS.labels(_outcome)

READ_BATCH = 64
CLIENT_IDLE_S = 60.0
"""A destination host's HTTP client is closed after this long without a request."""


@dataclass(eq=False)
class JobState:
    """What the manager and the job's drainer share about one job with live webhook state."""

    id: str
    kind: str
    webhook: WebhookFields | None
    durable: bool
    """Events go to the outbox stream (jobs.store); False: the memory queue only."""
    last_seq: int = 0
    """Highest event seq known to be issued (committed, or numbered in memory)."""
    terminated: bool = False
    """The terminal event (or final status) is committed: the drainer may end once drained."""
    attached: bool = False
    """A producer in this process is working on the job (DELETE then only asks it to stop)."""
    degraded: bool = False
    """The store failed for this job: its later events go to the memory queue."""
    disk_closed: bool = False
    """The drainer stopped reading the outbox (it failed, or the job degraded and it ran dry)."""
    pending: int = 0
    """Events issued and not yet at a final outcome."""
    head_ms: int | None = None
    """When the event now being delivered was queued (epoch ms)."""
    memory: MemoryStream | None = None
    drainer: bool = False
    drained: bool = False
    """The drainer ended normally: the job is finished and every event has a final outcome."""
    cancel: trio.Event = field(default_factory=trio.Event)
    lock: trio.Lock = field(default_factory=trio.Lock)
    wake: Signal = field(default_factory=Signal)
    done: trio.Event = field(default_factory=trio.Event)
    host_key: str = ""
    problem: str | None = None
    """Why the webhook setting cannot be used (stored by an older crawld); each event fails."""
    gone: jobstore.GoneMark | None = None
    """The endpoint answered 410 Gone: nothing more is sent (kept in the store)."""
    gone_checked: bool = False
    remote: bool = False
    """Another instance held the job's drainer lease when this one tried (cluster mode): the
    periodic scan takes the job over once the lease is free."""

    def __post_init__(self) -> None:
        if self.webhook is not None:
            hook = self.webhook
            self.problem = webhook_rules.webhook_problem(hook.url, hook.headers, hook.metadata)
            try:
                url = httpx.URL(hook.url)
                self.host_key = f"{url.scheme}://{url.host}:{url.port or ''}"
            except httpx.InvalidURL:  # the SSRF guard refuses it at the first attempt
                self.host_key = hook.url

    @property
    def stream(self) -> str:
        return jobstore.stream_name(self.id)

    def degrade(self, why: str, exc: BaseException | None = None) -> None:
        """Send this job's later events through the memory queue (the store failed)."""
        if not self.degraded:
            self.degraded = True
            log.error(
                "store failed; the job's later webhook events go to the memory queue",
                job=self.id,
                why=why,
                error=None if exc is None else f"{type(exc).__name__}: {exc}",
            )
        self.wake.fire()


class DeliverySettings(msgspec.Struct, frozen=True):
    secret: str | None
    timeout: float
    schedule: tuple[float, ...]
    allow: tuple[ssrf.Network, ...]
    per_host: int

    @classmethod
    def from_config(cls, cfg: WebhooksConfig) -> DeliverySettings:
        return cls(
            secret=webhook_secret(cfg),
            timeout=float(cfg.timeout),
            schedule=tuple(float(s) for s in cfg.retry_schedule),
            allow=tuple(ssrf.parse_networks(cfg.allow_cidrs)),
            per_host=cfg.per_host_concurrency,
        )


class Final(msgspec.Struct, frozen=True):
    """An event's final outcome."""

    outcome: str  # delivered | failed | blocked | gone
    attempts: int
    status: int | None
    reason: str


def _result_label(status: int | None, kind: str | None) -> str:
    if status is not None:
        return f"{status // 100}xx"
    return kind or "network"


class _HostPool:
    def __init__(self, transport: HostConnections, now: float) -> None:
        self.transport = transport
        self.in_use = 0
        self.last_used = now


class Deliverer:
    """Sends one event until it has a final outcome: signing, SSRF guard, retries, host caps."""

    def __init__(
        self,
        settings: DeliverySettings,
        transport: httpx.AsyncBaseTransport | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.transport = transport
        """One transport for every host (tests); None: a connection pool per destination host."""
        self.rng = rng or random.Random()
        self.outcomes: Tally[str] = Tally()
        self.vetting = ssrf.VettingCache()
        self._limiters: dict[str, trio.CapacityLimiter] = {}
        self._clients: dict[str, _HostPool] = {}
        self._client_added = trio.Event()
        self._creating: dict[str, trio.Event] = {}

    def reconfigure(self, settings: DeliverySettings) -> None:
        self.settings = settings
        self.vetting.clear()
        for limiter in self._limiters.values():
            limiter.total_tokens = settings.per_host
        for held in self._clients.values():
            held.transport.max_idle = max(1, settings.per_host)

    def limiter(self, host_key: str) -> trio.CapacityLimiter:
        limiter = self._limiters.get(host_key)
        if limiter is None:
            limiter = self._limiters[host_key] = trio.CapacityLimiter(self.settings.per_host)
        return limiter

    @property
    def host_clients(self) -> int:
        return len(self._clients)

    async def close_idle(self, now: float, idle_s: float = CLIENT_IDLE_S) -> int:
        """Close the clients of hosts without a request for `idle_s` (monotonic `now`)."""
        idle = [
            key
            for key, held in self._clients.items()
            if held.in_use == 0 and now - held.last_used >= idle_s
        ]
        for key in idle:
            await self._clients.pop(key).transport.aclose()
        return len(idle)

    async def close_idle_clients(self, idle_s: float = CLIENT_IDLE_S) -> None:
        """Run until cancelled: close each host's client once it has been idle for `idle_s`.
        Sleeps without a deadline while there is no client (tests on trio's mock clock)."""
        while True:
            if not self._clients:
                await self._client_added.wait()
                self._client_added = trio.Event()
                continue
            now = trio.current_time()
            await self.close_idle(now, idle_s)
            if self._clients:
                due = min(held.last_used for held in self._clients.values()) + idle_s
                await trio.sleep_until(max(due, now + 1.0))

    async def aclose(self) -> None:
        """Close every host's client (shutdown)."""
        clients, self._clients = list(self._clients.values()), {}
        for held in clients:
            with trio.CancelScope(shield=True):
                await held.transport.aclose()

    async def _acquire(self, host_key: str) -> _HostPool:
        """The host's pool, created on first use. An https pool loads the CA certificates
        (~20 ms), so it is built in a worker thread, not on the event loop; a plain-http pool
        never does TLS and skips them."""
        while True:
            held = self._clients.get(host_key)
            if held is not None:
                held.in_use += 1
                return held
            pending = self._creating.get(host_key)
            if pending is not None:
                await pending.wait()
                continue
            done = self._creating[host_key] = trio.Event()
            try:
                size = max(1, self.settings.per_host)
                if host_key.startswith("http://"):
                    pool = ssrf.new_transport(max_connections=size, verify=False)
                else:
                    pool = await trio.to_thread.run_sync(
                        functools.partial(ssrf.new_transport, max_connections=size)
                    )
                self._clients[host_key] = _HostPool(pool, trio.current_time())
                self._client_added.set()
            finally:
                del self._creating[host_key]
                done.set()

    async def deliver(
        self, job: JobState, item: Item, guard: Callable[[], None] | None = None
    ) -> Final:
        """Attempts until a final outcome. Never raises for a problem with this one delivery
        (bad settings, encoding, an unexpected error): that is the event's final failure.
        `guard()` runs before each attempt and may raise (LeaseLost) to send nothing more."""
        assert job.webhook is not None
        if job.problem is not None:
            return Final("failed", 0, None, f"invalid webhook settings: {job.problem}")
        webhook = job.webhook
        type_ = item.meta.get("type")
        attempt = 0
        while True:
            if guard is not None:
                guard()
            attempt += 1
            settings = self.settings
            status: int | None = None
            kind: str | None = None
            retry_after: str | None = None
            detail: str | None = None
            async with self.limiter(job.host_key):
                started = time.perf_counter()
                held: _HostPool | None = None
                try:
                    if self.transport is None:
                        held = await self._acquire(job.host_key)
                    headers = signing.attempt_headers(
                        item.body,
                        webhook_id=item.key,
                        timestamp=int(time.time()),
                        secret=settings.secret,
                        event_type=type_,
                        job_id=job.id,
                        user_headers=webhook.headers,
                    )
                    answer = await ssrf.send_vetted(
                        self.transport or held.transport,  # type: ignore[union-attr]
                        webhook.url,
                        item.body,
                        headers,
                        settings.allow,
                        settings.timeout,
                        cache=self.vetting,
                        now=trio.current_time(),
                    )
                    status = answer.status
                    retry_after = answer.retry_after
                except ssrf.BlockedAddress as exc:
                    kind, detail = ssrf.error_kind(exc), exc.reason
                except (httpx.HTTPError, httpx.InvalidURL, OSError) as exc:
                    kind = ssrf.error_kind(exc)
                except Exception as exc:
                    # Not a network outcome: the request could not be built or sent (h11 refusing
                    # a header, an encoding error). Retrying would fail the same way.
                    ATTEMPTS.labels("error").inc()
                    return Final(
                        "failed",
                        attempt,
                        None,
                        f"the request could not be built or sent ({type(exc).__name__})",
                    )
                finally:
                    if held is not None:
                        held.in_use -= 1
                        held.last_used = trio.current_time()
            ATTEMPT_SECONDS.observe(time.perf_counter() - started)
            ATTEMPTS.labels(_result_label(status, kind)).inc()
            decision = retry.decide(
                attempt,
                status,
                cast("retry.ErrorKind | None", kind),
                retry_after,
                time.time(),
                settings.schedule,
                self.rng,
                reason_detail=detail,
            )
            if decision.final:
                return Final(decision.kind, attempt, status, decision.reason)
            log.debug(
                "webhook attempt failed; retrying",
                job=job.id,
                event=events.event_id(job.id, item.meta.get("seq", 0)),
                attempt=attempt,
                reason=decision.reason,
                delay_s=round(decision.delay, 3),
            )
            await trio.sleep(decision.delay)


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

    async def _write(self, fn: Callable[[Conn], Any]) -> Any:
        """`fn` in a store transaction that first checks the lease (LeaseLost: nothing kept)."""
        lease = self.lease

        def tx(conn: Conn) -> Any:
            if lease is not None:
                lease.check(conn)
            return fn(conn)

        return await self.store.write(tx)

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
            if job.durable and not job.disk_closed:
                await self._drain_disk()  # its first read checks the gone mark too
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

        def read(conn: Conn, gone: bool) -> tuple[jobstore.GoneMark | None, list[Item], bool]:
            mark = jobstore.webhook_gone(conn, job.id) if gone else None
            # Read first: when another instance produces, a terminal flag seen in the same
            # snapshot means its terminal event is in this read (or was acked before it).
            ended = polled and jobstore.is_terminated(conn, job.id)
            return mark, outbox_mod.read_after_cursor(conn, stream, READ_BATCH), ended

        while True:
            woken = job.wake.event
            terminated, degraded = job.terminated, job.degraded
            check_gone = not job.gone_checked  # the first read also fetches the gone mark
            try:
                mark, batch, ended = await self.store.read(functools.partial(read, gone=check_gone))
            except DB_ERRORS as exc:
                self._close_disk("reading the webhook outbox failed", exc)
                return
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
                await outbox_mod.woken_or_polled(woken, self.poll_s)
                continue
            if job.gone is not None:
                if not await self._skip_disk(batch):
                    return
                continue
            last = batch[-1].seq
            for item in batch:
                final = await self._send(item)
                if final.outcome == "gone":
                    if not await self._gone(item, final, durable=True):
                        return
                    break  # the cursor moved to the end: read again
                error = self._error_for(item, final)
                try:
                    # The cursor alone per event; the batch's last ack deletes the batch.
                    await self._write(
                        functools.partial(
                            self._ack_in_tx, seq=item.seq, prune=item.seq == last, error=error
                        )
                    )
                except DB_ERRORS as exc:
                    # Sent, but not recorded: it goes out once more after a restart, with the
                    # same webhookId, and the receiver deduplicates it.
                    self._close_disk("advancing the webhook cursor failed", exc)
                    self._finalized(item, final)
                    return
                self._finalized(item, final)
            else:
                if terminated and len(batch) < READ_BATCH:
                    # The terminal event was committed before this read, and nothing follows
                    # it: the read returned everything there will ever be.
                    return

    def _close_disk(self, why: str, exc: BaseException | None) -> None:
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
                final = await self._send(item)
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

        def tx(conn: Conn) -> jobstore.GoneMark:
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

    async def _send(self, item: Item) -> Final:
        self.job.head_ms = item.created_ms
        try:
            return await self.deliverer.deliver(self.job, item, self._may_send)
        finally:
            self.job.head_ms = None

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

    def _ack_in_tx(self, conn: Conn, seq: int, prune: bool, error: dict[str, Any] | None) -> None:
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
