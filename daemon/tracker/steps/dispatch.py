# The dispatchers (regular, milestone, archive), which plan the schedules of videos that have
# none of a type, cleanup of overdue schedules, and the schedule overview the API and /status
# read. Each plans in one write transaction per batch of aids, under its lease (FENCE).
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from daemon.store import Conn
from daemon.tracker import rules
from daemon.tracker import store as ts
from daemon.tracker.steps.base import DISPATCH_BATCH, TrackerBase, log


class DispatchSteps(TrackerBase):
    """The dispatchers, cleanup and the schedule overview."""

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
