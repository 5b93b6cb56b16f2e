"""The whole tracker lifecycle against the Bilibili simulator over real HTTP, under
autojump_clock: discovery → ingest → classify → new chain → regular (bulk) → milestone hit →
archive, with deleted videos and the simulator's -412 limits equal to the configured ones."""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import trio
import trio.testing

from daemon.clock import trio_epoch_clock
from daemon.config_types import Duration
from daemon.fakes.bilibili import BilibiliSim, Curve
from daemon.store import Store
from daemon.tracker import store as ts
from daemon.tracker.config import Limit, ProxyConfig, TrackerConfig
from daemon.tracker.rules import HOUR, MINUTE, SECOND, next_saturday_ms, next_week_range_ms
from daemon.tracker.service import TrackerService

# Thursday 2026-01-01 10:00 in Shanghai
T0 = int(datetime(2026, 1, 1, 10, 0, tzinfo=ZoneInfo("Asia/Shanghai")).timestamp() * 1000)
LIMITS = [Limit(requests=4, per=Duration(1)), Limit(requests=30, per=Duration(15))]


@contextlib.asynccontextmanager
async def running(sim: BilibiliSim, service_of: Any) -> AsyncIterator[TrackerService]:
    """The tracker's loops against `sim`. The simulator's ASGI app is called in-process (its
    HTTP wire format unchanged): with real sockets, autojump_clock would jump virtual time
    while the loopback is busy, so a request could take "minutes" on a loaded machine."""
    transport = httpx.ASGITransport(app=sim.app, client=("127.0.0.1", 40000))
    async with httpx.AsyncClient(transport=transport) as http, trio.open_nursery() as nursery:
        service: TrackerService = service_of("http://bilibili.sim", http)
        await service.activate()
        nursery.start_soon(service.run_all)
        try:
            yield service
        finally:
            await service.deactivate()
            await service.close()
            nursery.cancel_scope.cancel()


async def q(store: Store, sql: str, *args: Any) -> list[Any]:
    return await store.read(lambda c: c.execute(sql, args).fetchall())


async def test_lifecycle(
    inline_store: None, store: Store, autojump_clock: trio.testing.MockClock
) -> None:
    clock = trio_epoch_clock(T0)
    sim = BilibiliSim(clock, seed=11, limits=LIMITS)
    hit = sim.add_video(
        title="【洛天依原创】百万星河", tags=["洛天依", "VOCALOID中文曲"], song=True,
        published_ms=T0 - 10 * MINUTE, curve=Curve.linear(36_000, start=90_000),
    )  # fmt: skip
    doomed = sim.add_video(
        title="【初音未来】再见", tags=["初音未来", "VOCALOID"], song=True,
        published_ms=T0 - HOUR, curve=Curve.linear(500),
    )  # fmt: skip
    hidden = sim.add_video(song=False, published_ms=T0 - 30 * MINUTE)
    sim.delete(hidden, 62012)  # gone before ingest
    sim.publish(40, song_share=0.3)  # enough to hit the limits at ingest
    config = TrackerConfig(
        enabled=True,
        proxies=[ProxyConfig(name="direct", limits=LIMITS, bulk_limits=[])],
        window=Duration(60),
    )

    def service_of(base: str, http: httpx.AsyncClient) -> TrackerService:
        return TrackerService(
            msgspec_replace(config, base_url=base), store, clock=clock, http=http,
            rng=random.Random(5),
        )  # fmt: skip

    async with running(sim, service_of) as service:
        tracker = service.tracker
        await trio.sleep(60)
        # discovery found every visible video (newlist leaves out hidden ones)
        (videos,) = (await q(store, "SELECT count(*) FROM tracker_videos"))[0]
        assert videos == 42, tracker.stats
        # tracked by hand (POST /tracker/videos): stored with the code that hides it
        await tracker.track(hidden)
        await trio.sleep(5)
        assert await store.read(lambda c: ts.video_status(c, hidden)) == 62012
        assert await store.read(lambda c: ts.is_song(c, hit))
        assert await store.read(lambda c: ts.is_song(c, doomed))
        # ingest went faster than the limits allow: the delegate held back, the sim never said -412
        assert sim.rejected_412 == 0

        await trio.sleep(2 * 60 - 5)  # the first `new` snapshot ran
        sim.delete(doomed, -404)
        await trio.sleep(10 * 60)  # at 12 min
        rows = await q(store, "SELECT type, status FROM tracker_schedules WHERE aid = ?", doomed)
        assert ("new", "bili_error") in rows
        assert await store.read(lambda c: ts.video_status(c, doomed)) == -404
        (doomed_snaps,) = (
            await q(store, "SELECT count(*) FROM tracker_snapshots WHERE aid = ?", doomed)
        )[0]

        # the milestone: views reach 100k at T0 + 6 min 40 s
        crossing = T0 - 10 * MINUTE + 10_000 * HOUR // 36_000
        times = [
            t for (t,) in await q(store, "SELECT at_ms FROM tracker_snapshots WHERE aid = ?", hit)
        ]
        after = [t for t in times if t >= crossing]
        assert after and min(after) - crossing <= 5 * SECOND, [
            (t - crossing) / 1000 for t in sorted(times)
        ]
        assert tracker.stats.lag_summary(clock())["milestone"]["count"] > 0

        # regular: at 30 min the regular dispatcher gives each song a normal schedule after its
        # interval (6 h for a song this fast); jump to it: the bulk tick takes it and chains the
        # next one
        await trio.sleep(20 * 60)  # at 32 min
        (first_normal,) = (
            await q(store, "SELECT min(planned_ms) FROM tracker_schedules WHERE type = 'normal'")
        )[0]
        assert first_normal is not None and first_normal > clock() + HOUR
        autojump_clock.jump((first_normal - clock()) / 1000 - 30)
        await trio.sleep(60)
        counts = await store.read(ts.schedule_counts)
        assert counts["normal"].get("completed", 0) > 0, counts
        assert counts["normal"].get("pending", 0) > 0, counts
        assert counts["new"].get("completed", 0) >= 4
        assert counts["milestone"].get("completed", 0) > 0
        assert sim.requests["bulk"] > 0

        # the gone video was never snapshotted singly again, nor rescheduled
        assert (await q(store, "SELECT count(*) FROM tracker_snapshots WHERE aid = ?", doomed))[0][
            0
        ] == doomed_snaps
        active = await q(
            store,
            "SELECT type FROM tracker_schedules WHERE aid = ? AND status IN"
            " ('pending', 'processing')",
            doomed,
        )
        assert active == []

        # archive: the dispatcher (at start and every 2 h) gives songs next Saturday, same clock
        # time, and other videos a time in the next week (window-adjusted: 60 s windows)
        song_archive = await q(
            store,
            "SELECT planned_ms, created_ms FROM tracker_schedules WHERE aid = ? AND type = 'archive'",
            hit,
        )
        assert len(song_archive) == 1
        saturday = next_saturday_ms(song_archive[0][1], "Asia/Shanghai")
        assert song_archive[0][0] // MINUTE == saturday // MINUTE
        other_archive = await q(
            store,
            "SELECT planned_ms, created_ms FROM tracker_schedules WHERE type = 'archive'"
            " AND aid NOT IN (SELECT aid FROM tracker_songs)",
        )
        assert other_archive
        for planned, created in other_archive:
            monday, next_monday = next_week_range_ms(created, "Asia/Shanghai")
            assert monday // MINUTE <= planned // MINUTE < next_monday // MINUTE + 1
        # jump to just before the song's archive time (the tracker keeps running)
        autojump_clock.jump((song_archive[0][0] - clock()) / 1000 - 30)
        await trio.sleep(120)
        rows = await q(
            store,
            "SELECT status FROM tracker_schedules WHERE aid = ? AND type = 'archive'",
            hit,
        )
        assert ("completed",) in rows
        assert sim.rejected_412 == 0
        status = await service.status()
        assert status["songs_tracked"] >= 2 and status["discovery"]["last_run_ms"]
        proxy = status["proxies"][0]
        assert proxy["name"] == "direct"
        assert proxy["skipped_limited"] > 0  # the limits were reached, and held
        assert proxy["refused_412"] == 0


def msgspec_replace(config: TrackerConfig, **changes: Any) -> TrackerConfig:
    import msgspec

    return msgspec.structs.replace(config, **changes)
