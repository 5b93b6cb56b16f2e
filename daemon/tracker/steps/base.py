# What every step of the tracker shares: its state (config, store, client, classifier, clock,
# claimant, what the ticks claimed and have not sent), the fenced write, schedule placement, the
# wait for a proxy with room, and the recovery of schedules left processing. The steps
# themselves live beside it by job (ingest.py, classify.py, ticks.py, dispatch.py); see
# daemon/tracker/engine.py for how they cut transactions and run in a cluster.
from __future__ import annotations

import random
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import trio

from daemon.clock import EpochClock, sleep_until_ms
from daemon.cluster import fenced
from daemon.logs import get_logger
from daemon.store import Conn, Store
from daemon.tracker import metrics, rules
from daemon.tracker import store as ts
from daemon.tracker.bilibili import NoProxyAvailable, Stat, Timed, VideoDetail
from daemon.tracker.classifier import Classifier
from daemon.tracker.config import TaskKind, TrackerConfig
from daemon.tracker.rules import MINUTE, SECOND

if TYPE_CHECKING:
    from daemon.cluster import Lease

log = get_logger("tracker")
T = TypeVar("T")

DISCOVERY_PAGE_SIZE = 30
DISCOVERY_MAX_PAGES = 100
"""A pass stops here even if every page held unseen aids (a bound against a looping upstream)."""
DISPATCH_BATCH = 500
LAG_WINDOW_MS = 15 * MINUTE
BULK_CONCURRENCY = 4
NO_PROXY_INGEST_RETRY_MS = 5 * SECOND
ROOM_WAIT_MAX_MS = 5 * SECOND
"""Discovery and ingest wait this long at most for a proxy to have room before giving up."""
TICK_ROOM_WAIT_MAX_MS = SECOND
"""The ticks wait this long at most for room (a bulk group up to its tick's period, the time it
was claimed for), then the spec's no_proxy retry delays apply."""
LOCAL_CLAIMANT = "local"
"""The claimant of a tracker outside a cluster (tests): no member, so `prepare` recovers its
rows as a dead process's."""
FENCE: ContextVar[Lease | None] = ContextVar("tracker_fence", default=None)
"""The lease a singleton step runs under (set by the service): its writes check it."""


class Client(Protocol):
    """The Bilibili calls the tracker makes (daemon/tracker/bilibili.py's BiliClient)."""

    async def newlist(self, pn: int, ps: int, rid: int = 30) -> Timed[list[int]]: ...
    async def view_detail(self, aid: int) -> Timed[VideoDetail]: ...
    async def view_stat(self, aid: int) -> Timed[Stat]: ...
    async def bulk_stats(self, aids: Sequence[int]) -> Timed[dict[int, Stat]]: ...


class AlreadyTracked(Exception):
    """The aid is stored or already waiting for ingest."""


@dataclass
class TrackerStats:
    discovery_last_ms: int | None = None
    discovery_new: int = 0
    """Aids the last discovery pass queued."""
    discovery_pages: int = 0
    discovery_error: str | None = None
    discovered_total: int = 0
    ingested: int = 0
    classified: int = 0
    songs_added: int = 0
    milestones_hit: int = 0
    lags: dict[str, deque[tuple[int, int]]] = field(
        default_factory=lambda: {t: deque() for t in rules.SCHEDULE_TYPES}
    )
    last_runs: dict[str, int] = field(default_factory=dict)

    def record_lag(self, type_: str, at_ms: int, lag_ms: int) -> None:
        self.record_lags(type_, at_ms, (lag_ms,))

    def record_lags(self, type_: str, at_ms: int, lags_ms: Iterable[int]) -> None:
        """Lags of snapshots of one type stored at `at_ms` (and into the lag histogram)."""
        samples = self.lags.setdefault(type_, deque())
        histogram = metrics.schedule_lag.labels(type_)
        for lag_ms in lags_ms:
            samples.append((at_ms, lag_ms))
            histogram.observe(lag_ms / 1000)
        while samples and samples[0][0] < at_ms - LAG_WINDOW_MS:
            samples.popleft()

    def lag_summary(self, now_ms: int) -> dict[str, dict[str, Any]]:
        out = {}
        for type_, samples in self.lags.items():
            recent = [lag for at, lag in samples if at >= now_ms - LAG_WINDOW_MS]
            p50, p99 = rules.lag_percentiles(recent, (0.5, 0.99))
            out[type_] = {
                "count": len(recent),
                "p50_s": None if p50 is None else p50 / 1000,
                "p99_s": None if p99 is None else p99 / 1000,
            }
        return out


class TrackerBase:
    """The tracker's state and the helpers its steps share (see `Tracker`)."""

    def __init__(
        self,
        config: TrackerConfig,
        store: Store,
        client: Client,
        classifier: Classifier,
        *,
        clock: EpochClock,
        rng: random.Random | None = None,
        classifier_errors: tuple[type[Exception], ...] = (),
        claimant: str = LOCAL_CLAIMANT,
        room: Callable[[TaskKind, int, int], Awaitable[int]] | None = None,
    ) -> None:
        """`room(task, horizon_ms, limit)`: how many requests of `task` (at most `limit`) this
        process's proxies let through within `horizon_ms` (NetworkDelegate.room); None: the
        ticks claim every due row (a client without limits, tests)."""
        self.config = config
        self.room = room
        self._unsent: dict[TaskKind, set[int]] = {"snapshot": set(), "bulk": set()}
        """Requests the ticks claimed that have not been sent yet, by task: the schedule id
        of a single snapshot, the first schedule id of a bulk group."""
        self.claimant = claimant
        """Stamped on the schedules this process claims (Cluster.claimant)."""
        self.classifier_errors = classifier_errors
        """What the classifier raises when it is down (the video is retried by the sweep)."""
        self.store = store
        self.client = client
        self.classifier = classifier
        self.clock = clock
        self.rng = rng or random.Random()
        self.stats = TrackerStats()
        self.ingest_wakeup = trio.Event()
        self._window_stored: int | None = None
        """The window length known to be in the store (None: read it there)."""
        self.classify_send, self.classify_recv = trio.open_memory_channel[int](10_000)

    # ---- helpers ----------------------------------------------------------------------------

    async def _write(self, fn: Callable[[Conn], T]) -> T:
        """`store.write(fn)`, checking the lease of the singleton step running it (FENCE) in
        the same transaction: LeaseLost rolls it back."""
        return await fenced.write(self.store, FENCE.get(), fn)

    @property
    def window_ms(self) -> int:
        return int(self.config.window * 1000)

    def _schedule(
        self,
        conn: Conn,
        aid: int,
        type_: str,
        at_ms: int,
        now_ms: int,
        force: bool = False,
    ) -> ts.Scheduled:
        """Runs in the writer's thread: never reads the clock (it may follow trio's)."""
        return ts.schedule_snapshot(
            conn,
            aid,
            type_,
            at_ms,
            now_ms=now_ms,
            force=force,
            capacity=self.config.window_capacity,
            rng=self.rng,
            window=self._window_stored,
        )

    async def schedule(self, aid: int, type_: str, at_ms: int, force: bool = False) -> ts.Scheduled:
        """Plan a snapshot (see store.schedule_snapshot)."""
        now = self.clock()
        return await self._write(lambda c: self._schedule(c, aid, type_, at_ms, now, force))

    async def use_window(self) -> None:
        """Windows of the configured length from now on (recounted when it changed)."""
        size = self.window_ms
        await self._write(lambda c: ts.set_window_ms(c, size))
        self._window_stored = size

    async def prepare(self) -> int:
        """Before the ticks start: use the configured window length and turn schedules a dead
        process (or this one, before its ticks were switched off) left processing back into
        pending ones (planned now). Returns how many."""
        now = self.clock()
        size = self.window_ms

        def tx(conn: Conn) -> int:
            ts.set_window_ms(conn, size)
            return ts.recover_processing(conn, now, also=self.claimant)

        recovered = await self._write(tx)
        self._window_stored = size
        if recovered:
            log.warning("schedules left processing by a stopped process run again", count=recovered)
        return recovered

    async def reclaim(self) -> int:
        """Schedules claimed by processes that are no live member any more run again now (the
        cluster's reclaim duty, every tick). Returns how many."""
        now = self.clock()
        recovered = await self._write(lambda c: ts.recover_processing(c, now))
        if recovered:
            log.warning("schedules claimed by a stopped instance run again", count=recovered)
        return recovered

    async def release_claims(self) -> int:
        """Hand this process's processing schedules back (its ticks were stopped)."""
        now = self.clock()
        return await self._write(lambda c: ts.release_claims(c, self.claimant, now))

    async def _when_room(
        self, call: Callable[[], Awaitable[T]], max_wait_ms: int = ROOM_WAIT_MAX_MS
    ) -> T:
        """`call()`; while every proxy is limited but one has room within `max_wait_ms` of the
        first try, wait for it and call again (a short wait beats a no_proxy retry later)."""
        deadline = self.clock() + max_wait_ms
        while True:
            try:
                return await call()
            except NoProxyAvailable as exc:
                if exc.retry_in_ms is None or self.clock() + exc.retry_in_ms > deadline:
                    raise
                await sleep_until_ms(self.clock, self.clock() + max(exc.retry_in_ms, 1))

    async def _room(self, task: TaskKind, horizon_ms: int, limit: int) -> int | None:
        """How many more requests of `task` a tick may claim (None: no bound)."""
        if self.room is None:
            return None
        unsent = len(self._unsent[task])
        return max(0, await self.room(task, horizon_ms, limit + unsent) - unsent)

    async def _send_claimed(
        self, task: TaskKind, key: int, call: Callable[[], Awaitable[T]], max_wait_ms: int
    ) -> T:
        """`_when_room(call)` for a request a tick claimed (`key` in `_unsent`), which no
        longer counts against the tick's room once it was made or given up."""
        try:
            return await self._when_room(call, max_wait_ms)
        finally:
            self._unsent[task].discard(key)

    async def _released(self, rows: Sequence[ts.Due], lookback_ms: int, tick_ms: int) -> bool:
        """After a claimed request found no room (another task or instance took what `room`
        counted): hand the rows back to pending in their place for a tick with room, unless
        claiming by room is off or one of them would leave the tick's lookback before the next
        tick (then the spec's no_proxy retry applies). Whether they were handed back."""
        if self.room is None:
            return False
        now = self.clock()
        low, _ = rules.due_range(now, lookback_ms, tick_ms)
        if rules.expiring(rows, low + tick_ms):
            return False
        await self._write(lambda c: ts.release(c, [r[0] for r in rows], claimant=self.claimant))
        return True
