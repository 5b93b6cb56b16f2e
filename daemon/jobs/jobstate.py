# What the manager and a job's drainer share about one job with live webhook state: the last seq
# issued, whether the job degraded, its memory queue, the wake-up signal, the 410 Gone mark and
# the retries stored for the event in flight. A module of its own so the manager, the drainer and
# the metrics name it without importing one another.
from __future__ import annotations

from dataclasses import dataclass, field

import httpx
import trio

from daemon.config import WebhookFields
from daemon.jobs import store as jobstore
from daemon.jobs import webhook_rules
from daemon.logs import get_logger
from daemon.outbox import MemoryStream, Signal

log = get_logger("webhooks")


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
    retry: jobstore.RetryState | None = None
    """The retries of the event being delivered, as last stored (None: none failed yet)."""

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
