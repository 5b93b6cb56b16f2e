# The HTTP side of webhook delivery: one `Deliverer` shared by every job's drainer (drainer.py)
# sends one event until its final outcome (delivered, failed after the retry schedule, blocked by
# the SSRF guard, or 410 Gone); the drainer decides what that outcome does to the job.
#
# It holds one set of keep-alive connections per destination host (daemon/net/connections.py), so
# no connection verified for one name serves another name on the same IP, closed after
# CLIENT_IDLE_S without requests; requests go straight to it (no client layers: cookies, auth
# flows, redirects, Response rebuilds are not needed here) and the per-host limiter is what caps
# the connections in use. Also the signing secret, the retry schedule, the per-host limiters (all
# swappable on reload) and a short-lived cache of vetted addresses (daemon/net/ssrf.py).
from __future__ import annotations

import functools
import random
import time
from collections import Counter as Tally
from collections.abc import Awaitable, Callable
from typing import NamedTuple, cast

import httpx
import msgspec
import trio

from daemon.config import WebhooksConfig, webhook_secret
from daemon.jobs import events, retry, signing
from daemon.jobs.jobstate import JobState
from daemon.jobs.webhook_metrics import ATTEMPT_SECONDS, ATTEMPTS
from daemon.logs import get_logger
from daemon.net import ssrf
from daemon.net.connections import HostConnections
from daemon.outbox import Item

log = get_logger("webhooks")

CLIENT_IDLE_S = 60.0
"""A destination host's HTTP client is closed after this long without a request."""


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


RetryHook = Callable[[int, int | None, retry.Decision], Awaitable[None]]
"""Called after attempt number n failed and will be retried: (n, its status, the decision)."""


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


class _Tried(NamedTuple):
    """One attempt: the answer's status, or the network error's kind (with the SSRF guard's
    reason), or `unsent`: why the request could not be built or sent."""

    status: int | None = None
    kind: str | None = None
    retry_after: str | None = None
    detail: str | None = None
    seconds: float = 0.0
    unsent: str | None = None


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
        self,
        job: JobState,
        item: Item,
        guard: Callable[[], None] | None = None,
        *,
        first_attempt: int = 1,
        on_retry: RetryHook | None = None,
    ) -> Final:
        """Attempts until a final outcome. Never raises for a problem with this one delivery
        (bad settings, encoding, an unexpected error): that is the event's final failure.
        `guard()` runs before each attempt and may raise (LeaseLost) to send nothing more.
        `first_attempt` numbers the first attempt made here (earlier ones were made before a
        restart); `on_retry` runs before each wait for a retry (the drainer stores the schedule;
        the wait counts from before it)."""
        assert job.webhook is not None
        if job.problem is not None:
            return Final("failed", 0, None, f"invalid webhook settings: {job.problem}")
        attempt = max(1, first_attempt) - 1
        while True:
            if guard is not None:
                guard()
            attempt += 1
            settings = self.settings
            tried = await self._attempt(job, item, settings)
            if tried.unsent is not None:
                ATTEMPTS.labels("error").inc()
                return Final("failed", attempt, None, tried.unsent)
            ATTEMPT_SECONDS.observe(tried.seconds)
            ATTEMPTS.labels(_result_label(tried.status, tried.kind)).inc()
            decision = retry.decide(
                attempt,
                tried.status,
                cast("retry.ErrorKind | None", tried.kind),
                tried.retry_after,
                time.time(),
                settings.schedule,
                self.rng,
                reason_detail=tried.detail,
            )
            if decision.final:
                return Final(decision.kind, attempt, tried.status, decision.reason)
            log.debug(
                "webhook attempt failed; retrying",
                job=job.id,
                event=events.event_id(job.id, item.meta.get("seq", 0)),
                attempt=attempt,
                reason=decision.reason,
                delay_s=round(decision.delay, 3),
            )
            due = trio.current_time() + decision.delay
            if on_retry is not None:
                await on_retry(attempt, tried.status, decision)
            await trio.sleep_until(due)

    async def _attempt(self, job: JobState, item: Item, settings: DeliverySettings) -> _Tried:
        """One HTTP attempt under the host's limiter: its answer or network error, or why the
        request could not be built or sent at all."""
        webhook = job.webhook
        assert webhook is not None
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
                    event_type=item.meta.get("type"),
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
                why = f"the request could not be built or sent ({type(exc).__name__})"
                return _Tried(unsent=why)
            finally:
                if held is not None:
                    held.in_use -= 1
                    held.last_used = trio.current_time()
        return _Tried(status, kind, retry_after, detail, time.perf_counter() - started)
