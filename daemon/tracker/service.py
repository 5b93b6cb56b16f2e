# The tracker as long-running loops: one per periodic task (discovery, ingest, classification,
# the snapshot tick, the bulk tick, the three dispatchers, cleanup, limiter state). The daemon runs
# each as its own supervised component, so a failing dispatcher is restarted without touching the
# ticks; tests run them directly under autojump_clock against the simulator.
#
# `[tracker] enabled` can flip on SIGHUP. Every loop therefore runs behind a gate: while the
# tracker is off the loops wait; switching it off cancels whatever they were doing and hands the
# schedules this process had claimed back to pending (if that write fails they are recovered when
# it is switched on again, as after a crash); switching it on first recovers processing rows and
# restores the limiter state, then opens the gate. Intervals and proxies are read from the
# current config at each step, so a reload changes them without restarting anything.
#
# In a cluster (daemon/cluster/) every instance runs the two ticks, which claim schedules row by
# row, and the classification of what it ingested itself; the rest runs in one place at a time,
# each loop under its own lease (`tracker:<loop>`), with FENCE set so its writes check the lease:
# discovery, ingest, the classification sweep, the dispatchers, cleanup, and the reclaim duty
# that hands the schedules of instances that stopped heartbeating back to pending every second.
from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import httpx
import trio

from daemon.clock import EpochClock, sleep_until_ms
from daemon.logs import get_logger
from daemon.store import Store
from daemon.tracker import rules
from daemon.tracker import store as ts
from daemon.tracker.bilibili import BiliClient
from daemon.tracker.classifier import ClassifierUnavailable, make_classifier
from daemon.tracker.config import TrackerConfig
from daemon.tracker.delegate import NetworkDelegate
from daemon.tracker.engine import BULK_CONCURRENCY, FENCE, LOCAL_CLAIMANT, Tracker
from daemon.tracker.queries import TrackerQueries
from daemon.tracker.rules import HOUR, MINUTE, SECOND

if TYPE_CHECKING:
    from daemon.cluster import Cluster, Lease

log = get_logger("tracker")

REGULAR_EVERY_MS = 30 * MINUTE
MILESTONE_EVERY_MS = 5 * MINUTE
ARCHIVE_EVERY_MS = 2 * HOUR
CLEANUP_EVERY_MS = 2 * MINUTE
LIMITER_SAVE_EVERY_MS = 30 * SECOND
INGEST_IDLE_MS = 5 * SECOND
RECLAIM_EVERY_MS = SECOND


class Gate:
    """Open while the tracker is enabled; closing it cancels the work running behind it."""

    def __init__(self) -> None:
        self.open = False
        self._changed = trio.Event()
        self._scopes: set[trio.CancelScope] = set()

    def set(self, open_: bool) -> None:
        if open_ == self.open:
            return
        self.open = open_
        changed, self._changed = self._changed, trio.Event()
        changed.set()
        if not open_:
            for scope in list(self._scopes):
                scope.cancel()

    async def run(self, fn: Callable[[], Awaitable[None]]) -> None:
        """Run `fn` whenever the gate is open (again after each reopening); never returns."""
        while True:
            while not self.open:
                await self._changed.wait()
            with trio.CancelScope() as scope:
                self._scopes.add(scope)
                try:
                    await fn()
                finally:
                    self._scopes.discard(scope)
            if self.open:  # fn returned by itself: do not spin
                await self._changed.wait()


class TrackerService:
    """Builds the tracker's parts from `[tracker]` and runs its loops."""

    def __init__(
        self,
        config: TrackerConfig,
        store: Store,
        *,
        clock: EpochClock,
        http: httpx.AsyncClient | None = None,
        rng: random.Random | None = None,
        cluster: Cluster | None = None,
    ) -> None:
        """Without `cluster` every loop runs here (one process, tests); with one, see the
        module comment (and the delegate shares the limits of named proxies through the store
        when others may share it)."""
        self.config = config
        self.store = store
        self.clock = clock
        self.http = http
        self.rng = rng or random.Random()
        self.cluster = cluster
        shared = cluster is not None and cluster.multi
        self.delegate = NetworkDelegate(
            config.effective_proxies(),
            clock=clock,
            http=http,
            rng=self.rng,
            shared=store if shared else None,
            instance=cluster.instance if shared and cluster is not None else "",
        )
        self.tracker = Tracker(
            config,
            store,
            BiliClient(self.delegate, config.base_url),
            make_classifier(config.classifier_url, http),
            clock=clock,
            rng=self.rng,
            classifier_errors=(ClassifierUnavailable,),
            claimant=LOCAL_CLAIMANT if cluster is None else cluster.claimant,
            room=self.delegate.room,
        )
        self.queries = TrackerQueries(store)
        """The reads the surfaces make (daemon/api/tracker.py, the console)."""
        self.gate = Gate()
        self._state_loaded = False

    # ---- enabling and reload ----------------------------------------------------------------

    async def activate(self) -> None:
        """Recover what a stopped process left processing, restore the limiters, open the gate."""
        if self.gate.open:
            return
        await self.tracker.prepare()
        if not self._state_loaded:
            await self.delegate.load_state(self.store)
            self._state_loaded = True
        self.gate.set(True)
        log.info("tracker enabled", base_url=self.config.base_url)

    async def deactivate(self) -> None:
        if not self.gate.open:
            return
        self.gate.set(False)
        await self.tracker.release_claims()
        await self.delegate.save_state(self.store)
        log.info("tracker disabled: its tasks stopped")

    async def apply(self, config: TrackerConfig) -> None:
        """A reloaded `[tracker]`: proxies, limits, intervals, URLs; on/off last."""
        old, self.config = self.config, config
        self.tracker.config = config
        self.delegate.apply(config.effective_proxies())
        if config.base_url != old.base_url:
            self.tracker.client = BiliClient(self.delegate, config.base_url)
        if config.classifier_url != old.classifier_url:
            self.tracker.classifier = make_classifier(config.classifier_url, self.http)
        if config.window != old.window and self.gate.open:
            await self.tracker.use_window()
        if config.enabled and not self.gate.open:
            await self.activate()
        elif not config.enabled and self.gate.open:
            await self.deactivate()

    async def close(self) -> None:
        """At shutdown: store the limiter state as clean (after the last request)."""
        with trio.CancelScope(shield=True):
            if self._state_loaded:
                await self.delegate.save_state(self.store, final=True)
            await self.delegate.aclose()

    # ---- loops --------------------------------------------------------------------------------

    async def _every(
        self, name: str, period_ms: Callable[[], int], step: Callable[[], Awaitable[Any]]
    ) -> None:
        """Run `step` now and then every `period_ms()` (aligned to the first run; a step that
        overruns skips the missed beats)."""
        next_at = self.clock()
        while True:
            await step()
            self.tracker.stats.last_runs[name] = self.clock()
            period = max(period_ms(), 1)
            now = self.clock()
            next_at += period
            if next_at <= now:
                next_at = now + period - (now - next_at) % period
            await sleep_until_ms(self.clock, next_at)

    async def _owned(self, name: str, loop: Callable[[], Awaitable[None]]) -> None:
        """Run `loop` here, or in a cluster whenever this process holds `tracker:<name>`
        (its writes check the lease; see the module comment)."""
        if self.cluster is None:
            await loop()
            return

        async def under(lease: Lease) -> None:
            token = FENCE.set(lease)
            try:
                await loop()
            finally:
                FENCE.reset(token)

        await self.cluster.run_owned(f"tracker:{name}", under)

    async def run_discovery(self) -> None:
        await self._owned(
            "discovery",
            lambda: self._every(
                "discovery",
                lambda: int(self.config.discovery_interval * 1000),
                self.tracker.discovery_pass,
            ),
        )

    async def run_ingest(self) -> None:
        await self._owned("ingest", self._ingest_loop)

    async def _ingest_loop(self) -> None:
        while True:
            handled = await self.tracker.ingest_pass()
            if handled:
                continue
            wake = self.tracker.ingest_wakeup = trio.Event()
            due = await self.tracker.next_ingest_ms()
            until = self.clock() + INGEST_IDLE_MS
            if due is not None:
                until = min(until, due)
            with trio.move_on_after(max(until - self.clock(), 0) / 1000):
                await wake.wait()

    async def run_classify(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                self._owned,
                "classify-sweep",
                lambda: self._every(
                    "classify_sweep", lambda: rules.CLASSIFY_RETRY_MS, self.tracker.classify_sweep
                ),
            )
            async for aid in self.tracker.classify_recv:
                await self.tracker.classify_one(aid)

    async def run_snapshot_tick(self) -> None:
        async with trio.open_nursery() as nursery:

            async def tick() -> None:
                await self.tracker.snapshot_tick(nursery)

            await self._every("snapshot_tick", lambda: int(self.config.snapshot_tick * 1000), tick)

    async def run_bulk_tick(self) -> None:
        limiter = trio.CapacityLimiter(BULK_CONCURRENCY)
        async with trio.open_nursery() as nursery:

            async def tick() -> None:
                await self.tracker.bulk_tick(nursery, limiter)

            await self._every("bulk_tick", lambda: int(self.config.bulk_tick * 1000), tick)

    async def _duty(self, name: str, every_ms: int, step: Callable[[], Awaitable[Any]]) -> None:
        await self._owned(name, lambda: self._every(name, lambda: every_ms, step))

    async def run_regular(self) -> None:
        await self._duty("regular", REGULAR_EVERY_MS, self.tracker.dispatch_regular)

    async def run_milestone(self) -> None:
        await self._duty("milestone", MILESTONE_EVERY_MS, self.tracker.dispatch_milestone)

    async def run_archive(self) -> None:
        await self._duty("archive", ARCHIVE_EVERY_MS, self.tracker.dispatch_archive)

    async def run_cleanup(self) -> None:
        await self._duty("cleanup", CLEANUP_EVERY_MS, self.tracker.cleanup)

    async def run_reclaim(self) -> None:
        """In a cluster: schedules of instances that stopped heartbeating run again (without
        one, `prepare` did it at start and nobody else claims)."""
        if self.cluster is None:
            return
        await self._duty("reclaim", RECLAIM_EVERY_MS, self.tracker.reclaim)

    async def run_limiter_state(self) -> None:
        async def save() -> None:
            await self.delegate.save_state(self.store)

        next_at = self.clock() + LIMITER_SAVE_EVERY_MS
        while True:
            await sleep_until_ms(self.clock, next_at)
            await save()
            next_at += LIMITER_SAVE_EVERY_MS

    def loops(self) -> dict[str, Callable[[], Awaitable[None]]]:
        """Every loop by component name."""
        return {
            "tracker-discovery": self.run_discovery,
            "tracker-ingest": self.run_ingest,
            "tracker-classify": self.run_classify,
            "tracker-snapshot-tick": self.run_snapshot_tick,
            "tracker-bulk-tick": self.run_bulk_tick,
            "tracker-regular": self.run_regular,
            "tracker-milestone": self.run_milestone,
            "tracker-archive": self.run_archive,
            "tracker-cleanup": self.run_cleanup,
            "tracker-reclaim": self.run_reclaim,
            "tracker-limiter-state": self.run_limiter_state,
        }

    async def run_all(self) -> None:
        """Every loop behind the gate in one nursery (tests; the daemon supervises each)."""
        async with trio.open_nursery() as nursery:
            for loop in self.loops().values():
                nursery.start_soon(self.gate.run, loop)

    # ---- reading ----------------------------------------------------------------------------

    async def status(self) -> dict[str, Any]:
        """The `tracker` section of /status."""
        stats = self.tracker.stats
        totals, claims = await self.store.read(lambda c: (ts.totals(c), ts.claims(c)))
        overview = await self.tracker.schedules_overview(windows=3)
        return {
            "enabled": self.gate.open,
            "base_url": self.config.base_url,
            "discovery": {
                "last_run_ms": stats.discovery_last_ms,
                "new_aids": stats.discovery_new,
                "pages": stats.discovery_pages,
                "error": stats.discovery_error,
                "discovered_total": stats.discovered_total,
            },
            **totals,
            "songs_tracked": totals["songs"],
            "videos_tracked": totals["videos"],
            "ingested": stats.ingested,
            "classified": stats.classified,
            "songs_added": stats.songs_added,
            "milestones_hit": stats.milestones_hit,
            "schedules": overview["counts"],
            "claimant": self.tracker.claimant,
            "processing_by_claimant": claims,
            "lag": overview["lag"],
            "last_runs_ms": dict(stats.last_runs),
            "proxies": self.delegate.status(),
        }
