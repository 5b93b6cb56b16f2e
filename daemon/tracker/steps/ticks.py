# The two snapshot ticks: the 1 s tick sends one /view per due single schedule (new and
# milestone first), the 15 s tick one bulk request per group of normal and archive schedules.
# A tick claims what this process's proxies can send before the next one, and the snapshot is
# stored in the transaction that completes its schedule and chains the next (engine.py).
from __future__ import annotations

import functools
from collections.abc import Sequence

import trio

from daemon.store import Conn
from daemon.tracker import metrics, rules
from daemon.tracker import store as ts
from daemon.tracker.bilibili import BiliError, NoProxyAvailable, Stat, UpstreamError
from daemon.tracker.steps.base import TICK_ROOM_WAIT_MAX_MS, TrackerBase, log


class TickSteps(TrackerBase):
    """The single and the bulk snapshot ticks."""

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
        except (NoProxyAvailable, BiliError, UpstreamError) as exc:
            return await self._single_failed(row, exc)
        stat, at_ms = answer.value, answer.server_ms
        now = self.clock()
        stored, milestone = await self._write(
            lambda c: self._complete_single(c, row, stat, at_ms, now)
        )
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

    async def _single_failed(
        self, row: ts.Due, exc: NoProxyAvailable | BiliError | UpstreamError
    ) -> str:
        """A claimed single snapshot whose request failed: hand it back, retry it later or
        mark the video gone. Returns the schedule's status (as `run_single`)."""
        sid, aid, type_, _ = row
        if isinstance(exc, NoProxyAvailable):
            metrics.no_proxy.labels(exc.task).inc()
            if await self._released([row], rules.SINGLE_LOOKBACK_MS, self.snapshot_tick_ms):
                return "released"
            await self._finish_retry(row, "no_proxy", str(exc), rules.single_retry_ms(type_))
            return "no_proxy"
        if isinstance(exc, BiliError):
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
        metrics.upstream_errors.labels("network").inc()
        await self._finish_retry(row, "failed", str(exc), rules.single_retry_ms(type_))
        return "failed"

    def _complete_single(
        self, conn: Conn, row: ts.Due, stat: Stat, at_ms: int, now: int
    ) -> tuple[bool, int | None]:
        """In the writer: store a single snapshot, complete its schedule and chain the next.
        Whether it was stored (not when the schedule is no longer this process's), and the
        milestone passed if this snapshot crossed one (counted and logged once the write
        committed: the store may run a job twice)."""
        sid, aid, type_, _ = row
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
