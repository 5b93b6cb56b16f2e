# The tracker's moving parts: discovery, ingest, classification, the 1 s snapshot tick, the 15 s
# bulk tick, the dispatchers and cleanup. Each is a short async step that moves data between the
# pure rules (rules.py), the store (store.py, one writer transaction per step) and the network
# (the Bilibili client and the classifier, passed in so tests can hand in fakes).
#
# Crash safety comes from where the transactions are cut: a schedule is claimed ("processing") in
# one transaction before its request goes out, and the snapshot it produced is stored in the same
# transaction that completes the schedule and chains the next one. A kill -9 between the two
# leaves a processing row, which the next start turns back into a pending one (planned now), so
# the schedule runs again and its snapshot is stored exactly once. Discovered aids wait in the
# store's ingest queue and leave it in the transaction that stores their metadata.
#
# In a cluster every instance runs the ticks: a claim stamps the rows with this process's
# claimant, and the transaction that stores a snapshot first finishes the schedule only if it
# is still processing by that claimant (a process paused past its lease, whose rows another
# instance took, stores nothing). The steps that run in one place (discovery, ingest, the
# dispatchers, cleanup) run under a lease set in FENCE, and every write they make checks it.
#
# A tick claims only what this process's proxies can send within the tick ("claim what you can
# do now", as the crawl workers do): as many requests as their limits let through before the
# next tick (`room`), less the ones it claimed and has not sent yet. The due rows beyond that
# stay pending, in order, for the instance whose proxies have room: otherwise the first tick
# to run would claim every due row and wait on its own proxies while the others idle. A claimed
# request that finds no room after all (another task took it) hands its rows back the same way.
# Rows about to leave the tick's lookback are claimed and retried as the spec says regardless.
from __future__ import annotations

import contextlib
import functools
import random
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import trio

from daemon.clock import EpochClock, sleep_until_ms
from daemon.logs import get_logger
from daemon.store import Conn, Store
from daemon.tracker import metrics, rules
from daemon.tracker import store as ts
from daemon.tracker.bilibili import (
    BiliError,
    NoProxyAvailable,
    Stat,
    Timed,
    UpstreamError,
    VideoDetail,
)
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


class Tracker:
    """The tracker's steps over one store, one Bilibili client and one classifier."""

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
        lease = FENCE.get()
        if lease is None:
            return await self.store.write(fn)

        def fenced(conn: Conn) -> T:
            lease.check(conn)
            return fn(conn)

        return await self.store.write(fenced)

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

    # ---- discovery and ingest ---------------------------------------------------------------

    async def discovery_pass(self) -> int:
        """Page through newlist until a page is empty or has no unseen aid; queue unseen aids
        for ingest. Returns how many were queued."""
        queued_total, page = 0, 1
        self.stats.discovery_error = None
        try:
            while page <= DISCOVERY_MAX_PAGES:
                answer = await self._when_room(
                    functools.partial(self.client.newlist, pn=page, ps=DISCOVERY_PAGE_SIZE)
                )
                aids = answer.value
                now = self.clock()
                queued = await self._write(
                    lambda c, a=aids, n=now: ts.enqueue_ingest(c, a, "discovery", n)  # type: ignore[misc]
                )
                queued_total += len(queued)
                if not rules.discovery_continues(aids, queued):
                    break
                page += 1
        except NoProxyAvailable as exc:
            metrics.no_proxy.labels(exc.task).inc()
            self.stats.discovery_error = "no proxy available"
        except BiliError as exc:
            metrics.upstream_errors.labels(str(exc.code)).inc()
            self.stats.discovery_error = str(exc)
        except UpstreamError as exc:
            metrics.upstream_errors.labels("network").inc()
            self.stats.discovery_error = str(exc)
        if self.stats.discovery_error:
            log.warning("discovery pass stopped early", error=self.stats.discovery_error, page=page)
        self.stats.discovery_last_ms = self.clock()
        self.stats.discovery_new = queued_total
        self.stats.discovery_pages = page
        self.stats.discovered_total += queued_total
        if queued_total:
            self.ingest_wakeup.set()
        return queued_total

    async def track(self, aid: int) -> None:
        """Queue `aid` for ingest (POST /tracker/videos); AlreadyTracked if known."""
        now = self.clock()
        queued = await self._write(lambda c: ts.enqueue_ingest(c, [aid], "api", now))
        if not queued:
            raise AlreadyTracked(aid)
        self.ingest_wakeup.set()

    async def ingest_pass(self, limit: int = 50) -> int:
        """Ingest the queued aids that are due; returns how many were handled."""
        now = self.clock()
        due = await self.store.read(lambda c: ts.due_ingest(c, now, limit))
        for aid, attempts in due:
            await self.ingest_one(aid, attempts)
        return len(due)

    async def next_ingest_ms(self) -> int | None:
        return await self.store.read(ts.next_ingest_ms)

    async def ingest_one(self, aid: int, attempts: int) -> None:
        try:
            answer = await self._when_room(functools.partial(self.client.view_detail, aid))
        except NoProxyAvailable as exc:
            metrics.no_proxy.labels(exc.task).inc()
            at = self.clock() + NO_PROXY_INGEST_RETRY_MS
            await self._write(lambda c: ts.delay_ingest(c, aid, at))
            return
        except BiliError as exc:
            code, message = exc.code, str(exc)
            metrics.upstream_errors.labels(str(code)).inc()
            now = self.clock()
            if exc.rate_limited:
                retry = rules.ingest_retry(attempts + 1, now)
                await self._write(lambda c: ts.ingest_failed(c, aid, message, retry))
                return
            log.info("video gone at ingest", aid=aid, code=code)
            await self._write(lambda c: ts.store_gone_video(c, aid, code, now))
            return
        except UpstreamError as exc:
            message = str(exc)
            metrics.upstream_errors.labels("network").inc()
            retry = rules.ingest_retry(attempts + 1, self.clock())
            if retry is None:
                log.warning("ingest gave up", aid=aid, attempts=attempts + 1, error=message)
            await self._write(lambda c: ts.ingest_failed(c, aid, message, retry))
            return
        detail, now = answer.value, self.clock()
        await self._write(lambda c: ts.store_video(c, detail, answer.server_ms, now))
        metrics.snapshots.labels("ingest").inc()
        self.stats.ingested += 1
        with contextlib.suppress(trio.WouldBlock):  # if full, the 5-min sweep picks it up
            self.classify_send.send_nowait(aid)

    # ---- classification -----------------------------------------------------------------------

    async def classify_one(self, aid: int) -> bool | None:
        """Label a stored video; a song gets into songs with its four `new` schedules. Returns
        whether it is a song (None: not classified now — no text, or the classifier is down)."""
        text = await self.store.read(lambda c: ts.video_text(c, aid))
        if text is None:
            return None
        try:
            result = await self.classifier.classify(aid, text.title, text.description, text.tags)
        except self.classifier_errors as exc:
            log.warning("classifier unavailable; retried within 5 min", aid=aid, error=str(exc))
            return None
        now = self.clock()

        def tx(conn: Conn) -> bool:
            added = ts.store_label(
                conn, aid, result.label, result.probabilities, result.model_version, now
            )
            if added:
                for at in rules.new_schedule_times(now):
                    self._schedule(conn, aid, "new", at, now, force=True)
            return added

        added = await self._write(tx)
        self.stats.classified += 1
        if added:
            self.stats.songs_added += 1
            log.info("new song", aid=aid, label=result.label, title=text.title[:80])
        return result.label != 0

    async def classify_sweep(self) -> int:
        """Classify every ingested video without a label (any model version)."""
        done, after = 0, 0
        while True:
            batch = await self.store.read(lambda c, a=after: ts.unlabelled(c, a, 200))  # type: ignore[misc]
            if not batch:
                return done
            for text in batch:
                if await self.classify_one(text.aid) is None:
                    return done  # the classifier is down: the next sweep tries again
                done += 1
            after = batch[-1].aid

    # ---- the 1 s snapshot tick --------------------------------------------------------------

    async def claim_single(self) -> list[ts.Due]:
        """Select the single tick's due schedules and mark them processing (one transaction)."""
        now, tick_ms = self.clock(), self.snapshot_tick_ms
        low, high = rules.due_range(now, rules.SINGLE_LOOKBACK_MS, tick_ms)
        types = [t for group in rules.SINGLE_TYPES_BY_PRIORITY for t in group]
        room = await self._room("snapshot", tick_ms, rules.SINGLE_LIMIT)

        def tx(conn: Conn) -> list[ts.Due]:
            due = ts.due(conn, types, low, high, rules.SINGLE_LIMIT * 5)
            busy = ts.busy_aids(conn, [r[1] for r in due])
            picked = rules.pick_single(due, busy)
            taken = rules.within_room([[r] for r in picked], room, low + tick_ms)
            return ts.claim(conn, [r[0] for r in taken], now, claimant=self.claimant)

        return await self._write(tx)

    async def run_single(self, row: ts.Due) -> str:
        """Take one claimed schedule's snapshot through /view; returns its final status (or
        "released": handed back to pending, see `_released`)."""
        sid, aid, type_, planned = row
        status = await self.store.read(lambda c: ts.video_status(c, aid))
        if status:
            self._unsent["snapshot"].discard(sid)
            await self._finish_retry(row, "bili_error", f"video status {status}", None)
            return "bili_error"
        try:
            answer = await self._send_claimed(
                "snapshot",
                sid,
                functools.partial(self.client.view_stat, aid),
                TICK_ROOM_WAIT_MAX_MS,
            )
        except NoProxyAvailable as exc:
            metrics.no_proxy.labels(exc.task).inc()
            if await self._released([row], rules.SINGLE_LOOKBACK_MS, self.snapshot_tick_ms):
                return "released"
            await self._finish_retry(row, "no_proxy", str(exc), rules.single_retry_ms(type_))
            return "no_proxy"
        except BiliError as exc:
            code = exc.code
            metrics.upstream_errors.labels(str(code)).inc()
            if exc.rate_limited:
                await self._finish_retry(row, "failed", str(exc), rules.single_retry_ms(type_))
                return "failed"
            now = self.clock()

            def gone(conn: Conn) -> None:
                if ts.finish(conn, [sid], "bili_error", now, str(code), claimant=self.claimant):
                    ts.set_video_status(conn, aid, code)

            await self._write(gone)
            log.info("video gone", aid=aid, code=code)
            return "bili_error"
        except UpstreamError as exc:
            metrics.upstream_errors.labels("network").inc()
            await self._finish_retry(row, "failed", str(exc), rules.single_retry_ms(type_))
            return "failed"
        stat, at_ms = answer.value, answer.server_ms
        now = self.clock()

        def complete(conn: Conn) -> tuple[bool, int | None]:
            """Whether it was stored (not when the schedule is no longer this process's), and
            the milestone passed if this snapshot crossed one (counted and logged once the write
            committed: the store may run a job twice)."""
            if not ts.finish(conn, [sid], "completed", now, claimant=self.claimant):
                return False, None
            previous = ts.latest(conn, aid)
            ts.insert_snapshot(conn, aid, at_ms, stat)
            if type_ == "new":
                published = ts.published_ms(conn, aid)
                delay = (
                    None
                    if published is None
                    else rules.new_continuation_ms(published, at_ms, stat.views)
                )
                if delay is not None:
                    self._schedule(conn, aid, "new", now + delay, now)
            elif type_ == "milestone":
                if previous is not None and rules.milestone_achieved(previous.views, stat.views):
                    return True, rules.closest_milestone(previous.views)
                eta = ts.eta_of(conn, aid, now)
                if eta is None:
                    return True, None
                ts.upsert_eta(conn, aid, eta.table_hours, eta.speed, stat.views, now)
                delay = rules.milestone_continuation_ms(eta.adjusted_hours)
                if delay is not None:
                    self._schedule(conn, aid, "milestone", now + delay, now)
            return True, None

        stored, milestone = await self._write(complete)
        if not stored:
            metrics.stale_finishes.inc()
            log.warning("schedule taken by another instance meanwhile: snapshot dropped", aid=aid)
            return "stale"
        if milestone is not None:
            self.stats.milestones_hit += 1
            log.info("milestone reached", aid=aid, milestone=milestone, views=stat.views)
        metrics.snapshots.labels(type_).inc()
        self.stats.record_lag(type_, now, max(at_ms - planned, 0))
        return "completed"

    async def _finish_retry(
        self, row: ts.Due, status: str, error: str, retry_ms: int | None
    ) -> None:
        sid, aid, type_, _ = row
        now = self.clock()

        def tx(conn: Conn) -> None:
            if not ts.finish(conn, [sid], status, now, error[:500], claimant=self.claimant):
                return
            if retry_ms is not None:
                self._schedule(conn, aid, type_, now + retry_ms, now)

        await self._write(tx)

    async def snapshot_tick(self, nursery: trio.Nursery) -> int:
        """One tick: claim due single schedules and start their snapshots (milestones first)."""
        claimed = await self.claim_single()
        self._unsent["snapshot"].update(row[0] for row in claimed)
        for row in claimed:
            nursery.start_soon(self.run_single, row)
        return len(claimed)

    # ---- the 15 s bulk tick -------------------------------------------------------------------

    async def claim_bulk(self) -> list[ts.Due]:
        """Select the bulk tick's due schedules, as many bulk groups as there is room for, and
        mark them processing (one transaction)."""
        now, tick_ms = self.clock(), self.bulk_tick_ms
        low, high = rules.due_range(now, rules.BULK_LOOKBACK_MS, tick_ms)
        types = [t for group in rules.BULK_TYPES_BY_PRIORITY for t in group]
        room = await self._room("bulk", tick_ms, rules.BULK_LIMIT)

        def tx(conn: Conn) -> list[ts.Due]:
            due = ts.due(conn, types, low, high, rules.BULK_LIMIT)
            taken = rules.within_room(self.bulk_groups(due), room, low + tick_ms)
            return ts.claim(conn, [r[0] for r in taken], now, claimant=self.claimant)

        return await self._write(tx)

    @property
    def snapshot_tick_ms(self) -> int:
        return int(self.config.snapshot_tick * 1000)

    @property
    def bulk_tick_ms(self) -> int:
        return int(self.config.bulk_tick * 1000)

    def bulk_groups(self, rows: Sequence[ts.Due]) -> list[list[ts.Due]]:
        """Claimed rows in groups whose distinct aids fit one request (`bulk_size`)."""
        out: list[list[ts.Due]] = []
        current: list[ts.Due] = []
        aids: set[int] = set()
        for row in rows:
            if row[1] not in aids and len(aids) == self.config.bulk_size:
                out.append(current)
                current, aids = [], set()
            current.append(row)
            aids.add(row[1])
        if current:
            out.append(current)
        return out

    async def run_bulk(self, group: Sequence[ts.Due]) -> str:
        """One bulk request for a group of claimed schedules; returns the group's outcome
        ("released": handed back to pending, see `_released`)."""
        aids = list(dict.fromkeys(r[1] for r in group))
        try:
            answer = await self._send_claimed(
                "bulk",
                group[0][0],
                functools.partial(self.client.bulk_stats, aids),
                max(TICK_ROOM_WAIT_MAX_MS, self.bulk_tick_ms),
            )
        except NoProxyAvailable as exc:
            metrics.no_proxy.labels(exc.task).inc()
            if await self._released(group, rules.BULK_LOOKBACK_MS, self.bulk_tick_ms):
                return "released"
            await self._bulk_failed(group, "no_proxy", str(exc), None)
            return "no_proxy"
        except (BiliError, UpstreamError) as exc:
            code = str(exc.code) if isinstance(exc, BiliError) else "network"
            metrics.upstream_errors.labels(code).inc()
            await self._bulk_failed(group, "failed", str(exc), rules.BULK_ERROR_RETRY_MS)
            return "failed"
        stats, at_ms = answer.value, answer.server_ms
        now = self.clock()

        def complete(conn: Conn) -> list[tuple[str, int]]:
            return ts.complete_bulk(
                conn,
                group,
                stats,
                at_ms,
                now,
                capacity=self.config.window_capacity,
                rng=self.rng,
                window=self._window_stored,
                claimant=self.claimant,
            )

        by_type: dict[str, list[int]] = {}
        for type_, lag in await self._write(complete):
            by_type.setdefault(type_, []).append(lag)
        for type_, lags in by_type.items():
            metrics.snapshots.labels(type_).inc(len(lags))
            self.stats.record_lags(type_, now, lags)
        for aid in dict.fromkeys(r[1] for r in group if r[1] not in stats):
            await self.confirm_gone(aid)
        return "completed"

    async def confirm_gone(self, aid: int) -> int | None:
        """A video missing from a bulk answer is usually deleted or hidden, which only the
        single endpoint says: ask it once and store the code as the video's status (so the
        dispatchers stop planning it). Returns the code, or None if it answered or failed."""
        try:
            await self._when_room(
                functools.partial(self.client.view_stat, aid), TICK_ROOM_WAIT_MAX_MS
            )
        except BiliError as exc:
            metrics.upstream_errors.labels(str(exc.code)).inc()
            if not exc.video_gone:
                return None
            code = exc.code
            await self._write(lambda c: ts.set_video_status(c, aid, code))
            log.info("video gone (missing from a bulk answer)", aid=aid, code=code)
            return code
        except (NoProxyAvailable, UpstreamError):
            return None  # the next regular snapshot tries again
        return None

    async def _bulk_failed(
        self, group: Sequence[ts.Due], status: str, error: str, retry_ms: int | None
    ) -> None:
        now = self.clock()

        def tx(conn: Conn) -> None:
            held = set(
                ts.finish(
                    conn, [r[0] for r in group], status, now, error[:500], claimant=self.claimant
                )
            )
            for sid, aid, type_, _ in group:
                if sid not in held:
                    continue
                delay = retry_ms if retry_ms is not None else rules.bulk_no_proxy_retry_ms(self.rng)
                self._schedule(conn, aid, type_, now + delay, now)

        await self._write(tx)

    async def bulk_tick(self, nursery: trio.Nursery, limiter: trio.CapacityLimiter) -> int:
        """One tick: claim due normal/archive schedules and start their bulk requests."""
        claimed = await self.claim_bulk()

        async def run(group: list[ts.Due]) -> None:
            async with limiter:
                await self.run_bulk(group)

        groups = self.bulk_groups(claimed)
        self._unsent["bulk"].update(group[0][0] for group in groups)
        for group in groups:
            nursery.start_soon(run, group)
        return len(claimed)

    # ---- dispatchers and cleanup --------------------------------------------------------------

    async def _each_batch(
        self,
        select: Callable[[Conn, int], list[int]],
        plan: Callable[[Conn, int], bool],
    ) -> int:
        """Page through aids (`select(conn, after_aid)`) and plan each (`plan(conn, aid)`) in
        one write transaction per batch; returns how many were planned."""
        planned, after = 0, 0
        while True:
            aids = await self.store.read(lambda c, a=after: select(c, a))  # type: ignore[misc]
            if not aids:
                return planned

            def tx(conn: Conn, batch: list[int] = aids) -> int:
                return sum(1 for aid in batch if plan(conn, aid))

            planned += await self._write(tx)
            after = aids[-1]

    async def dispatch_regular(self) -> int:
        """Songs without an active normal schedule get one, after their regular interval."""

        def select(conn: Conn, after: int) -> list[int]:
            return ts.without_active(
                conn, "normal", songs=True, after_aid=after, limit=DISPATCH_BATCH
            )

        now = self.clock()

        def plan(conn: Conn, aid: int) -> bool:
            hours = ts.regular_interval_hours(conn, aid, now)
            last = ts.latest(conn, aid)
            at = rules.regular_target_ms(last.at_ms if last else None, hours, now)
            return self._schedule(conn, aid, "normal", at, now).outcome == "inserted"

        return await self._each_batch(select, plan)

    async def dispatch_milestone(self) -> int:
        """Videos near a milestone get a milestone schedule at their (clamped) ETA."""
        aids = await self.store.read(ts.milestone_candidates)
        planned, now = 0, self.clock()
        for start in range(0, len(aids), DISPATCH_BATCH):
            batch = aids[start : start + DISPATCH_BATCH]

            def tx(conn: Conn, batch: list[int] = batch) -> int:
                count = 0
                for aid in batch:
                    eta = ts.eta_of(conn, aid, now)
                    if eta is None:
                        continue
                    last = ts.latest(conn, aid)
                    assert last is not None
                    ts.upsert_eta(conn, aid, eta.table_hours, eta.speed, last.views, now)
                    delay = rules.milestone_dispatch_delay_ms(eta.adjusted_hours)
                    if delay is None:
                        continue
                    if self._schedule(conn, aid, "milestone", now + delay, now).outcome != "kept":
                        count += 1
                return count

            planned += await self._write(tx)
        return planned

    async def dispatch_archive(self) -> int:
        """Songs get an archive snapshot next Saturday; other videos some time next week."""
        tz = self.config.timezone
        total, now = 0, self.clock()
        for songs in (True, False):

            def select(conn: Conn, after: int, songs: bool = songs) -> list[int]:
                return ts.without_active(
                    conn, "archive", songs=songs, after_aid=after, limit=DISPATCH_BATCH
                )

            def plan(conn: Conn, aid: int, songs: bool = songs) -> bool:
                at = rules.archive_time_ms(now, songs, tz, self.rng)
                return self._schedule(conn, aid, "archive", at, now).outcome == "inserted"

            total += await self._each_batch(select, plan)
        return total

    async def cleanup(self) -> int:
        """Delete pending/processing schedules more than 2 min past their planned time."""
        now = self.clock()
        size = self.window_ms

        def tx(conn: Conn) -> int:
            deleted = ts.cleanup(conn, now - rules.CLEANUP_AGE_MS)
            ts.drop_empty_windows(conn, rules.window_of(now, size))
            return deleted

        deleted = await self._write(tx)
        if deleted:
            log.info("cleanup deleted overdue schedules", count=deleted)
        return deleted

    # ---- reading ----------------------------------------------------------------------------

    async def schedules_overview(self, windows: int = 12) -> dict[str, Any]:
        now = self.clock()
        size = self.window_ms
        first = rules.window_of(now, size)

        def read(conn: Conn) -> tuple[dict[str, dict[str, int]], dict[int, int]]:
            return ts.schedule_counts(conn), ts.window_fill(conn, first, windows)

        counts, fill = await self.store.read(read)
        return {
            "counts": counts,
            "windows": [
                {
                    "start_ms": (first + i) * size,
                    "pending": fill.get(first + i, 0),
                    "capacity": self.config.window_capacity,
                }
                for i in range(windows)
            ],
            "window_ms": size,
            "lag": self.stats.lag_summary(now),
        }
