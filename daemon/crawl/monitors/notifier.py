# Monitor notifications, recorded and delivered. `record` runs inside the transaction that
# finishes a check: it applies notify.py's rules to the check's pages and writes one pending row
# per channel (notify_store.py), so a finished check's notifications survive any crash and a
# check is never held up by a slow relay. The Notifier is the thin trio task around them: it
# claims due rows (one instance of a cluster per row), sends each in a worker thread (smtplib and
# Apprise block) under [monitors] notify_timeout, at most notify_concurrency at once, and writes
# the outcome: sent, retried after notify_retry_schedule, or failed. A row is marked sent only
# after its send returned; a crash in between may send it once more (at-least-once, as SMTP
# itself is), never lose it. An e-mail carries a Message-ID fixed per check, so a relay or a
# mail client can fold such a repeat.
from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import msgspec
import trio
from prometheus_client import Counter

from daemon.crawl.monitors import models, notify
from daemon.crawl.monitors import notify_store as nstore
from daemon.crawl.monitors import store as mstore
from daemon.crawl.monitors.config import MonitorConfig
from daemon.crawl.monitors.senders import Outcome, Senders
from daemon.logs import get_logger
from daemon.metrics import REGISTRY
from daemon.store import DB_ERRORS, Conn, Store, StoreClosed, wake

log = get_logger("monitors")

POLL_S = 5.0
"""The longest the deliverer waits between two looks when other processes share the store (a
wake-up from one of them may be lost)."""
PAGES_READ = 1000
"""Notable pages of one check read to build its message (the counts come from the summary)."""
_decode_message = msgspec.json.Decoder(notify.Message).decode

monitor_notifications = Counter(
    "crawld_monitor_notifications",
    "Monitor notification attempts by channel kind (email, target) and outcome (sent, retried,"
    " failed)",
    ["kind", "outcome"],
    registry=REGISTRY,
)
_STORE_FAILURES: tuple[type[BaseException], ...] = (*DB_ERRORS, StoreClosed)


def _noted(page: mstore.PageRow) -> notify.Noted:
    diff = None if page.diff is None else models.decode_any(page.diff)
    judgment = None if page.judgment is None else models.decode_any(page.judgment)
    text = diff.get("text") if isinstance(diff, dict) else None
    return notify.Noted(url=page.url, status=page.status or "", error=page.error,
                        diff_text=text if isinstance(text, str) else None,
                        judgment=judgment if isinstance(judgment, dict) else None)  # fmt: skip


def record(conn: Conn, spec: models.MonitorSpec, *, monitor_id: str, check_id: str, status: str,
           summary: dict[str, int], at_ms: int) -> int:  # fmt: skip
    """In the transaction finishing the check: a pending notification per channel of the
    monitor when the check has pages worth telling (notify.worth); how many were recorded."""
    wanted = notify.channels(spec.notification)
    if not wanted:
        return 0
    judging = bool(spec.goal and spec.judgeEnabled)
    pages = notify.worth([_noted(p) for p in mstore.notable_pages(conn, check_id, PAGES_READ)],
                         judging)  # fmt: skip
    if not pages:
        return 0
    email = (spec.notification or {}).get("email") or {}
    render = functools.partial(
        notify.render, name=spec.name, monitor_id=monitor_id, check_id=check_id, status=status,
        summary=summary, pages=pages,
    )  # fmt: skip
    for channel in wanted:
        if channel == notify.EMAIL:
            message = render(diffs=bool(email.get("includeDiffs")),
                             recipients=email.get("recipients") or [])  # fmt: skip
        else:
            message = render(diffs=True)
        nstore.insert(conn, check_id, monitor_id, channel, models.encode(message), at_ms)
    return len(wanted)


def _senders(config: MonitorConfig) -> Senders:
    """The configured destinations; none while monitors are off (their secrets unread, as
    check_secrets leaves them)."""
    return Senders(config if config.enabled else MonitorConfig(enabled=False))


class Notifier:
    """Delivers recorded notifications until cancelled (see the module comment)."""

    def __init__(self, store: Store, config: MonitorConfig, clock_ms: Callable[[], int]) -> None:
        self.store = store
        self.clock_ms = clock_ms
        self.config = config
        self.senders = _senders(config)
        self._limiter = trio.CapacityLimiter(config.notify_concurrency)
        self._in_flight: set[tuple[str, str]] = set()
        self._done = trio.Event()
        self.sent = 0
        self.failed = 0
        self.retried = 0
        self.last_errors: dict[str, str] = {}
        """The last error of each channel (names only: never a URL)."""

    def configure(self, config: MonitorConfig) -> None:
        """New [monitors] settings (secrets read again; ConfigError leaves the old ones)."""
        senders = _senders(config)
        self.config, self.senders = config, senders
        self._limiter.total_tokens = config.notify_concurrency

    @property
    def hold_ms(self) -> int:
        """How long a claim holds a row: past any attempt's end, however it ends."""
        return int((2 * float(self.config.notify_timeout) + 30) * 1000)

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            while True:
                woken = self.store.wakeups.event(wake.APPENDED, nstore.WAKE_KEY)
                done = self._done
                # Alone on its store (SQLite) every new row wakes it: it looks only when woken or
                # when a retry (or a claim of a process that died) comes due.
                wait = POLL_S if self.store.wakeups.safety_s is not None else math.inf
                try:
                    await self._claim_due(nursery)
                    earliest = await self.store.read(nstore.earliest)
                    if earliest is not None:
                        wait = min(wait, max(0.01, (earliest - self.clock_ms()) / 1000))
                except _STORE_FAILURES as exc:
                    log.warning("monitor notifications could not reach the store",
                                error=f"{type(exc).__name__}: {exc}")  # fmt: skip
                with trio.move_on_after(wait):
                    await wake.wait_any(woken, done)

    async def _claim_due(self, nursery: trio.Nursery) -> None:
        now = self.clock_ms()
        limit = 2 * self.config.notify_concurrency
        rows = await self.store.read(lambda c: nstore.due(c, now, limit))
        for row in rows:
            key = (row.check_id, row.channel)
            if key in self._in_flight:
                continue
            until = now + self.hold_ms
            if await self.store.write(lambda c, r=row, u=until: nstore.claim(c, r, u)):  # type: ignore[misc]
                self._in_flight.add(key)
                nursery.start_soon(self._deliver, row, until)

    async def _deliver(self, row: nstore.NotificationRow, held_until: int) -> None:
        try:
            outcome = await self._attempt(row)
            await self._keep(row, held_until, outcome)
        except _STORE_FAILURES as exc:
            log.warning("a monitor notification's outcome could not be stored; it is tried again"
                        " once its claim runs out", check=row.check_id, channel=row.channel,
                        error=f"{type(exc).__name__}: {exc}")  # fmt: skip
        finally:
            self._in_flight.discard((row.check_id, row.channel))
            self._done.set()
            self._done = trio.Event()

    async def _attempt(self, row: nstore.NotificationRow) -> Outcome:
        try:
            message = _decode_message(row.message)
        except msgspec.DecodeError:
            return Outcome(ok=False, error="the recorded message is unreadable", retry=False)
        senders = self.senders
        message_id = f"<{row.check_id}.{row.channel.replace(':', '.')}@crawld>"
        with trio.move_on_after(float(self.config.notify_timeout) + 5):
            try:
                return await trio.to_thread.run_sync(
                    senders.send, row.channel, message, message_id,
                    abandon_on_cancel=True, limiter=self._limiter,
                )  # fmt: skip
            except Exception as exc:  # a bug fails this notification, not the deliverer
                log.error("monitor notification could not be built or sent", check=row.check_id,
                          channel=row.channel, error=type(exc).__name__)  # fmt: skip
                return Outcome(ok=False, error=f"internal error: {type(exc).__name__}",
                               retry=False)  # fmt: skip
        return Outcome(ok=False, error="timed out")

    async def _keep(self, row: nstore.NotificationRow, held_until: int, outcome: Outcome) -> None:
        at = self.clock_ms()
        attempts = row.attempts + 1
        delay = None if not outcome.retry else notify.retry_delay(
            attempts, self.config.notify_retry_schedule)  # fmt: skip
        if outcome.ok:
            state, next_ms = "sent", at
        elif delay is not None:
            state, next_ms = "pending", at + int(delay * 1000)
        else:
            state, next_ms = "failed", at
        kept = await self.store.write(lambda c: nstore.outcome(
            c, row, held_until, state=state, attempts=attempts, next_ms=next_ms,
            error=outcome.error, at_ms=at))  # fmt: skip
        if not kept:
            return  # deleted (retention, the monitor) or claimed again after a long pause
        channel = row.channel
        kind = "email" if channel == notify.EMAIL else "target"
        said = "sent" if outcome.ok else "retried" if state == "pending" else "failed"
        monitor_notifications.labels(kind, said).inc()
        if outcome.ok:
            self.sent += 1
            log.info("monitor notification sent", check=row.check_id, channel=channel,
                     attempts=attempts)  # fmt: skip
            return
        self.last_errors[channel] = outcome.error or "failed"
        if state == "pending":
            self.retried += 1
            log.warning("monitor notification failed; retrying", check=row.check_id,
                        channel=channel, attempts=attempts, error=outcome.error,
                        retry_in_s=delay)  # fmt: skip
        else:
            self.failed += 1
            log.error("monitor notification failed", check=row.check_id, channel=channel,
                      attempts=attempts, error=outcome.error)  # fmt: skip

    def status(self) -> dict[str, Any]:
        return {
            "email": self.config.smtp is not None, "targets": self.senders.names(),
            "sending": len(self._in_flight), "sent": self.sent, "retried": self.retried,
            "failed": self.failed, "last_errors": dict(self.last_errors),
        }  # fmt: skip
