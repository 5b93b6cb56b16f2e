from __future__ import annotations

import random
from collections.abc import AsyncIterator
from typing import Any

import apsw
import pytest
import trio

from daemon.clock import trio_epoch_clock
from daemon.cluster import Cluster, LeaseLost
from daemon.config_types import Duration
from daemon.store import Store
from daemon.tracker import rules
from daemon.tracker import store as ts
from daemon.tracker.bilibili import BiliError, NoProxyAvailable, UpstreamError
from daemon.tracker.config import TrackerConfig
from daemon.tracker.engine import FENCE, AlreadyTracked, Tracker
from daemon.tracker.rules import MINUTE, SECOND
from tests.tracker.fakes import ClassifierDown, FakeClassifier, FakeClient

T0 = 1_767_225_600_000


class Env:
    def __init__(self, store: Store) -> None:
        self.clock = trio_epoch_clock(T0)
        self.client = FakeClient(self.clock)
        self.classifier = FakeClassifier()
        self.tracker = Tracker(
            TrackerConfig(enabled=True, window=Duration(10)), store, self.client, self.classifier,
            clock=self.clock, rng=random.Random(3), classifier_errors=(ClassifierDown,),
        )  # fmt: skip
        self.store = store

    async def q(self, sql: str, *args: Any) -> list[Any]:
        return await self.store.read(lambda c: c.execute(sql, args).fetchall())

    async def schedules(self, aid: int) -> list[tuple[str, str]]:
        return [
            (t, s)
            for t, s in await self.q(
                "SELECT type, status FROM tracker_schedules WHERE aid = ? ORDER BY id", aid
            )
        ]

    async def ingest_and_classify(self) -> None:
        await self.tracker.discovery_pass()
        await self.tracker.ingest_pass()
        await self.tracker.classify_sweep()


@pytest.fixture
async def env(inline_store: None, store: Store) -> AsyncIterator[Env]:
    env = Env(store)
    await env.tracker.prepare()  # 10 s windows: throttled rows land within a bulk tick
    yield env


async def test_discovery_pages_until_no_unseen(env: Env) -> None:
    for aid in range(1, 76):
        env.client.add(aid, lambda now: 10)
    assert await env.tracker.discovery_pass() == 75
    assert env.client.requests["newlist"] == 4  # 30 + 30 + 15 + an empty page
    for aid in range(76, 81):
        env.client.add(aid, lambda now: 10)
    assert await env.tracker.discovery_pass() == 5
    assert env.client.requests["newlist"] == 6  # page 1 had the five, page 2 nothing new
    assert env.tracker.stats.discovery_new == 5


async def test_ingest_classify_and_new_chain(env: Env, autojump_clock: Any) -> None:
    env.client.add(1, lambda now: 2000 + (now - T0) // 1000)  # a song, ~3600 views/h
    env.client.add(2, lambda now: 5, title="vlog")
    await env.ingest_and_classify()
    assert await env.schedules(1) == [("new", "pending")] * 4
    assert await env.schedules(2) == []
    assert (await env.q("SELECT count(*) FROM tracker_snapshots"))[0][0] == 2
    # run the single tick for 11 minutes: the four new snapshots, then one chain
    async with trio.open_nursery() as nursery:
        for _ in range(11 * 60):
            await env.tracker.snapshot_tick(nursery)
            await trio.sleep(1)
    statuses = await env.schedules(1)
    assert statuses[:4] == [("new", "completed")] * 4
    assert statuses[4:] == [("new", "pending")]  # one chain, 15 min ahead (> 1000 views/h)
    (planned,) = (await env.q("SELECT max(planned_ms) FROM tracker_schedules WHERE aid = 1"))[0]
    (done,) = (await env.q("SELECT max(finished_ms) FROM tracker_schedules WHERE aid = 1"))[0]
    assert planned - done == 15 * MINUTE
    assert env.tracker.stats.lag_summary(env.clock())["new"]["count"] == 4


async def test_track_and_conflict(env: Env) -> None:
    env.client.add(9, lambda now: 1)
    await env.tracker.track(9)
    with pytest.raises(AlreadyTracked):
        await env.tracker.track(9)
    await env.tracker.ingest_pass()
    with pytest.raises(AlreadyTracked):
        await env.tracker.track(9)


async def test_classifier_down_is_retried_by_sweep(env: Env) -> None:
    env.client.add(1, lambda now: 1)
    env.classifier.down = True
    await env.ingest_and_classify()
    assert await env.schedules(1) == []
    env.classifier.down = False
    assert await env.tracker.classify_sweep() == 1
    assert len(await env.schedules(1)) == 4


async def test_ingest_errors(env: Env, autojump_clock: Any) -> None:
    env.client.add(2, lambda now: 1)
    env.client.add(1, lambda now: 1).gone = 62002
    env.client.fail["view_detail"] = [UpstreamError("boom")]  # hits aid 1 (first by aid)
    await env.tracker.discovery_pass()
    await env.tracker.ingest_pass()
    rows = await env.q("SELECT aid, attempts, next_ms - ? FROM tracker_ingest", env.clock())
    assert rows == [(1, 1, 30 * SECOND)]
    assert await env.store.read(lambda c: ts.video_status(c, 2)) == 0
    await trio.sleep(30)
    await env.tracker.ingest_pass()
    assert await env.store.read(lambda c: ts.video_status(c, 1)) == 62002


async def test_single_bili_error_is_final(env: Env, autojump_clock: Any) -> None:
    video = env.client.add(1, lambda now: 95_000)
    await env.ingest_and_classify()
    video.gone = -404
    await trio.sleep(90)
    async with trio.open_nursery() as nursery:
        assert await env.tracker.snapshot_tick(nursery) == 1
    assert (await env.schedules(1))[0] == ("new", "bili_error")
    assert await env.store.read(lambda c: ts.video_status(c, 1)) == -404
    before = env.client.requests["view"]
    await env.tracker.schedule(1, "milestone", env.clock())
    for _ in range(600):
        async with trio.open_nursery() as nursery:
            await env.tracker.snapshot_tick(nursery)
        await trio.sleep(1)
    assert env.client.requests["view"] == before  # never asked singly again
    assert {s for _, s in await env.schedules(1)} == {"bili_error"}
    assert await env.tracker.dispatch_milestone() == 0


@pytest.mark.parametrize(
    ("error", "status", "retry_ms"),
    [
        (NoProxyAvailable("snapshot"), "no_proxy", 5 * SECOND),
        (UpstreamError("reset"), "failed", 5 * SECOND),
        (BiliError(-412, "rate"), "failed", 5 * SECOND),
    ],
)
async def test_single_retries(
    env: Env, error: Exception, status: str, retry_ms: int, autojump_clock: Any
) -> None:
    env.client.add(1, lambda now: 10)
    await env.ingest_and_classify()
    await env.store.write(lambda c: c.execute("DELETE FROM tracker_schedules"))
    sid = (await env.tracker.schedule(1, "milestone", env.clock())).schedule_id
    env.client.fail["view"] = [error]
    async with trio.open_nursery() as nursery:
        await env.tracker.snapshot_tick(nursery)
    rows = await env.q("SELECT id, status, planned_ms - ? FROM tracker_schedules", env.clock())
    assert rows[0][:2] == (sid, status)
    assert rows[1][1:] == ("pending", retry_ms)
    assert await env.store.read(lambda c: ts.video_status(c, 1)) == 0


async def test_milestone_hit_stops_chain(env: Env, autojump_clock: Any) -> None:
    env.client.add(1, lambda now: 99_000 + (now - T0) // 100)  # 36k views/h: 100k in 100 s
    await env.ingest_and_classify()
    await env.store.write(lambda c: c.execute("DELETE FROM tracker_schedules"))
    await trio.sleep(3 * 60)  # a second point to compute speed from
    await env.tracker.schedule(1, "milestone", env.clock())
    async with trio.open_nursery() as nursery:
        for _ in range(5 * 60):
            await env.tracker.snapshot_tick(nursery)
            await trio.sleep(1)
    assert env.tracker.stats.milestones_hit == 1
    assert await env.schedules(1) == [("milestone", "completed")] * len(await env.schedules(1))


async def test_milestone_snapshot_within_seconds_of_crossing(env: Env, autojump_clock: Any) -> None:
    env.client.add(1, lambda now: 90_000 + (now - T0) // 1000)  # 3600 views/h
    await env.ingest_and_classify()
    await env.store.write(lambda c: c.execute("DELETE FROM tracker_schedules"))
    crossing = T0 + 10_000 * SECOND  # views reach 100k here
    limiter = trio.CapacityLimiter(4)
    async with trio.open_nursery() as nursery:
        while env.clock() < crossing + 10 * MINUTE:
            elapsed = env.clock() - T0
            if elapsed % (30 * MINUTE) < SECOND:
                await env.tracker.dispatch_regular()
            if elapsed % (5 * MINUTE) < SECOND:
                await env.tracker.dispatch_milestone()
            if elapsed % (15 * SECOND) < SECOND:
                await env.tracker.bulk_tick(nursery, limiter)
            await env.tracker.snapshot_tick(nursery)
            await trio.sleep(1)
    times = [
        t for (t,) in await env.q("SELECT at_ms FROM tracker_snapshots WHERE aid = 1 ORDER BY 1")
    ]
    after = [t for t in times if t >= crossing]
    assert after and after[0] - crossing <= 5 * SECOND
    assert len(times) < 200  # dense only close to the milestone


async def test_bulk_tick_groups_completes_and_chains(env: Env, autojump_clock: Any) -> None:
    for aid in range(1, 66):
        env.client.add(aid, lambda now, a=aid: a * 10)
    await env.tracker.discovery_pass()
    await env.tracker.ingest_pass(limit=100)
    env.client.videos[65].gone = -404  # missing from the bulk answer
    await trio.sleep(60)
    now = env.clock()
    for aid in range(1, 66):
        await env.tracker.schedule(aid, "archive" if aid == 1 else "normal", now)
    limiter = trio.CapacityLimiter(4)
    async with trio.open_nursery() as nursery:
        assert await env.tracker.bulk_tick(nursery, limiter) == 65
    assert env.client.requests["bulk"] == 3  # 30 + 30 + 5
    counts = await env.store.read(ts.schedule_counts)
    assert counts["normal"] == {"completed": 63, "failed": 1, "pending": 63}
    assert counts["archive"] == {"completed": 1}  # not chained
    assert (await env.q("SELECT count(*) FROM tracker_eta"))[0][0] == 64
    # the missing one was asked singly once: gone, so no dispatcher plans it again
    assert env.client.requests["view"] == 1
    assert await env.store.read(lambda c: ts.video_status(c, 65)) == -404
    assert 65 not in await env.store.read(
        lambda c: ts.without_active(c, "normal", songs=False, after_aid=0, limit=100)
    )


async def test_bulk_errors_reschedule(env: Env, autojump_clock: Any) -> None:
    env.client.add(1, lambda now: 1)
    await env.tracker.discovery_pass()
    await env.tracker.ingest_pass()
    await env.tracker.schedule(1, "normal", env.clock())
    limiter = trio.CapacityLimiter(1)
    env.client.fail["bulk"] = [BiliError(-352, "risk"), NoProxyAvailable("bulk")]
    async with trio.open_nursery() as nursery:
        await env.tracker.bulk_tick(nursery, limiter)
    rows = await env.q(
        "SELECT status, planned_ms - ? FROM tracker_schedules ORDER BY id", env.clock()
    )
    assert rows[0][0] == "failed"
    # the retry lands in the window of now + 15 s (window throttling applies)
    assert rows[1][0] == "pending"
    assert (env.clock() + rows[1][1]) // 10_000 == (env.clock() + 15 * SECOND) // 10_000
    await trio.sleep(20)
    async with trio.open_nursery() as nursery:
        await env.tracker.bulk_tick(nursery, limiter)
    assert (await env.schedules(1))[:2] == [("normal", "failed"), ("normal", "no_proxy")]


async def test_crash_between_claim_and_complete(env: Env, autojump_clock: Any) -> None:
    env.client.add(1, lambda now: 10)
    await env.tracker.discovery_pass()
    await env.tracker.ingest_pass()
    await env.tracker.schedule(1, "milestone", env.clock())
    claimed = await env.tracker.claim_single()
    assert len(claimed) == 1
    # the process dies here: the request is never answered, nothing is stored
    await trio.sleep(10 * 60)
    assert await env.tracker.prepare() == 1
    async with trio.open_nursery() as nursery:
        assert await env.tracker.snapshot_tick(nursery) == 1
    assert await env.schedules(1) == [("milestone", "completed")] + [("milestone", "pending")] * 0
    (n,) = (await env.q("SELECT count(*) FROM tracker_snapshots WHERE aid = 1"))[0]
    assert n == 2  # the first (ingest) and exactly one from the schedule


async def test_a_schedule_taken_by_another_instance_meanwhile_stores_nothing(
    env: Env, autojump_clock: Any
) -> None:
    env.client.add(1, lambda now: 10)
    await env.tracker.discovery_pass()
    await env.tracker.ingest_pass()
    await env.tracker.schedule(1, "milestone", env.clock())
    (row,) = await env.tracker.claim_single()
    # paused past its lease: the reclaim duty gave the row back and another instance took it
    await env.store.write(
        lambda c: c.execute(
            "UPDATE tracker_schedules SET claimant = 'other/1' WHERE id = ?", (row[0],)
        )
    )
    assert await env.tracker.run_single(row) == "stale"
    (n,) = (await env.q("SELECT count(*) FROM tracker_snapshots WHERE aid = 1"))[0]
    assert n == 1  # the ingest one only
    assert await env.schedules(1) == [("milestone", "processing")]


async def test_a_singleton_step_whose_lease_was_taken_writes_nothing(
    env: Env, autojump_clock: Any
) -> None:
    env.client.add(1, lambda now: 10)
    cluster = Cluster(env.store, instance="a", lease_s=2.0, multi=False)
    (lease,) = await cluster.try_acquire(["tracker:discovery"])
    await env.store.write(  # another instance took it over
        lambda c: c.execute("UPDATE cluster_leases SET holder = 'b', token = token + 1")
    )
    token = FENCE.set(lease)
    try:
        with pytest.raises(LeaseLost):
            await env.tracker.discovery_pass()
    finally:
        FENCE.reset(token)
    assert await env.q("SELECT aid FROM tracker_ingest") == []
    await env.tracker.discovery_pass()  # not under a lease: queued
    assert [tuple(r) for r in await env.q("SELECT aid FROM tracker_ingest")] == [(1,)]


async def test_dispatchers_and_cleanup(env: Env, autojump_clock: Any) -> None:
    env.client.add(1, lambda now: 10 + (now - T0) // 60_000)
    env.client.add(2, lambda now: 5, title="vlog")
    await env.ingest_and_classify()
    assert await env.tracker.dispatch_regular() == 1
    assert await env.tracker.dispatch_regular() == 0  # active normal exists
    assert await env.tracker.dispatch_archive() == 2
    types = {t for t, _ in await env.schedules(1)}
    assert types == {"new", "normal", "archive"}
    assert await env.schedules(2) == [("archive", "pending")]
    await trio.sleep(13 * 60)
    assert await env.tracker.cleanup() == 4 + 1  # the four new ones and the overdue normal
    overview = await env.tracker.schedules_overview()
    assert overview["counts"]["archive"] == {"pending": 2}


async def test_window_counts_match_rows_after_a_busy_run(env: Env, autojump_clock: Any) -> None:
    for aid in range(1, 40):
        env.client.add(aid, lambda now, a=aid: a * 1000 + (now - T0) // 1000)
    await env.ingest_and_classify()
    await env.tracker.dispatch_regular()
    limiter = trio.CapacityLimiter(4)
    async with trio.open_nursery() as nursery:
        for second in range(30 * 60):
            await env.tracker.snapshot_tick(nursery)
            if second % 15 == 0:
                await env.tracker.bulk_tick(nursery, limiter)
            if second % 120 == 0:
                await env.tracker.cleanup()
            await trio.sleep(1)

    def check(conn: apsw.Connection) -> tuple[dict[int, int], dict[int, int]]:
        size = ts.window_ms(conn)
        kept = dict(conn.execute("SELECT win, pending FROM tracker_windows WHERE pending > 0"))
        real = dict(
            conn.execute(
                "SELECT planned_ms / ?, count(*) FROM tracker_schedules WHERE status = 'pending'"
                " GROUP BY 1",
                (size,),
            )
        )
        return kept, real

    kept, real = await env.store.read(check)
    assert kept == real and real
    assert rules.SCHEDULE_TYPES  # every type ran
    assert env.client.requests["bulk"] > 0 and env.client.requests["view"] > 0


async def test_discovered_aids_survive_a_crash_before_ingest(
    env: Env, store: Store, autojump_clock: Any
) -> None:
    for aid in range(1, 6):
        env.client.add(aid, lambda now: 10)
    env.client.fail["view_detail"] = [UpstreamError("reset")] * 2
    await env.tracker.discovery_pass()
    await env.tracker.ingest_pass()  # two fail and wait 30 s, three are stored
    # the process dies; a new one starts on the same database
    fresh = Env(store)
    fresh.client = env.client
    fresh.tracker.client = env.client
    await fresh.tracker.prepare()
    await trio.sleep(31)
    assert await fresh.tracker.ingest_pass() == 2
    assert await fresh.tracker.discovery_pass() == 0  # nothing is queued twice
    (videos,) = (await env.q("SELECT count(*) FROM tracker_videos"))[0]
    (queued,) = (await env.q("SELECT count(*) FROM tracker_ingest"))[0]
    assert (videos, queued) == (5, 0)


async def test_failed_completion_stores_nothing_and_is_recovered(
    env: Env, monkeypatch: pytest.MonkeyPatch, autojump_clock: Any
) -> None:
    for aid in (1, 2):
        env.client.add(aid, lambda now: 10)
    await env.tracker.discovery_pass()
    await env.tracker.ingest_pass()
    await trio.sleep(60)
    for aid in (1, 2):
        await env.tracker.schedule(aid, "normal", env.clock())
    real_finish = ts.finish

    def broken(conn: apsw.Connection, ids: Any, status: str, *args: Any, **kw: Any) -> list[int]:
        if status == "completed":
            raise apsw.IOError("disk I/O error")
        return real_finish(conn, ids, status, *args, **kw)

    monkeypatch.setattr(ts, "finish", broken)
    failed = []
    try:
        async with trio.open_nursery() as nursery:
            await env.tracker.bulk_tick(nursery, trio.CapacityLimiter(1))
    except* apsw.IOError as group:
        failed.append(group)
    assert failed
    (after_ingest,) = (await env.q("SELECT count(*) FROM tracker_snapshots"))[0]
    assert after_ingest == 2  # the snapshots rolled back with the completion
    assert {s for _, s in await env.schedules(1)} == {"processing"}
    monkeypatch.setattr(ts, "finish", real_finish)
    assert await env.tracker.prepare() == 2
    async with trio.open_nursery() as nursery:
        await env.tracker.bulk_tick(nursery, trio.CapacityLimiter(1))
    (snaps,) = (await env.q("SELECT count(*) FROM tracker_snapshots"))[0]
    assert snaps == 4
    assert await env.schedules(1) == [("normal", "completed"), ("normal", "pending")]


class Room:
    """A fake `Tracker.room`: a fixed number of requests per task within any horizon."""

    def __init__(self, **free: int) -> None:
        self.free = free
        self.asked: list[tuple[str, int, int]] = []

    async def __call__(self, task: str, horizon_ms: int, limit: int) -> int:
        self.asked.append((task, horizon_ms, limit))
        return min(self.free.get(task, 0), limit)


async def songs_due(env: Env, count: int, type_: str = "normal") -> None:
    """`count` ingested videos, each with one schedule of `type_` due in aid order."""
    for aid in range(1, count + 1):
        env.client.add(aid, lambda now, a=aid: a * 10)
    await env.tracker.discovery_pass()
    await env.tracker.ingest_pass(limit=count + 10)
    await env.store.write(lambda c: c.execute("DELETE FROM tracker_schedules"))
    now = env.clock()
    for aid in range(1, count + 1):
        await env.tracker.schedule(aid, type_, now + aid, force=True)


async def statuses(env: Env) -> dict[int, str]:
    """The status of each video's first schedule (the one `songs_due` planned)."""
    out: dict[int, str] = {}
    for aid, status in await env.q("SELECT aid, status FROM tracker_schedules ORDER BY id"):
        out.setdefault(aid, status)
    return out


async def due_order(env: Env) -> list[tuple[int, int]]:
    """(aid, planned_ms) of the pending schedules in the order the ticks take them."""
    return [
        (aid, planned)
        for aid, planned in await env.q(
            "SELECT aid, planned_ms FROM tracker_schedules WHERE status = 'pending'"
            " ORDER BY planned_ms, id"
        )
    ]


async def test_bulk_tick_claims_only_what_its_proxies_can_send_this_tick(
    env: Env, autojump_clock: Any
) -> None:
    await songs_due(env, 65)
    order = await due_order(env)  # window throttling spread the planned times
    env.tracker.room = room = Room(bulk=1)
    sent = trio.Event()
    original = env.client.bulk_stats

    async def held(aids: Any) -> Any:
        await sent.wait()
        return await original(aids)

    env.client.bulk_stats = held  # type: ignore[method-assign]
    limiter = trio.CapacityLimiter(4)
    await sleep_until(env, order[-1][1])
    async with trio.open_nursery() as nursery:
        assert await env.tracker.bulk_tick(nursery, limiter) == 30  # one group: the first 30
        assert await env.tracker.bulk_tick(nursery, limiter) == 0  # claimed, not sent yet
        sent.set()
    assert room.asked[0] == ("bulk", 15 * SECOND, rules.BULK_LIMIT)
    assert room.asked[1] == ("bulk", 15 * SECOND, rules.BULK_LIMIT + 1)
    first = await statuses(env)
    assert [a for a, s in first.items() if s == "completed"] == sorted(a for a, _ in order[:30])
    assert [a for a, _ in await due_order(env)][:35] == [a for a, _ in order[30:]]
    async with trio.open_nursery() as nursery:
        assert await env.tracker.bulk_tick(nursery, limiter) == 30  # the next 30, in order
    # the last 5 stay pending (no room), with their planned times, until one would leave the
    # tick's lookback before the next tick: then its group is claimed anyway
    room.free["bulk"] = 0
    last = order[60:]
    await sleep_until(env, min(p for _, p in last) + rules.BULK_LOOKBACK_MS - 15 * SECOND)
    async with trio.open_nursery() as nursery:
        assert await env.tracker.bulk_tick(nursery, limiter) == 0
    assert [r for r in await due_order(env) if r[0] in dict(last)] == last
    await trio.sleep(0.001)
    async with trio.open_nursery() as nursery:
        assert await env.tracker.bulk_tick(nursery, limiter) == 5
    assert env.client.requests["bulk"] == 3
    assert env.tracker.stats.lag_summary(env.clock())["normal"]["count"] == 65


async def sleep_until(env: Env, at_ms: int) -> None:
    await trio.sleep(max(at_ms - env.clock(), 0) / 1000)


async def test_single_tick_claims_only_what_its_proxies_can_send_this_tick(
    env: Env, autojump_clock: Any
) -> None:
    await songs_due(env, 5, "milestone")
    env.tracker.room = Room(snapshot=2)
    async with trio.open_nursery() as nursery:
        assert await env.tracker.snapshot_tick(nursery) == 2
    first = await statuses(env)
    assert [a for a, s in first.items() if s == "completed"] == [1, 2]
    await trio.sleep(1)
    async with trio.open_nursery() as nursery:
        assert await env.tracker.snapshot_tick(nursery) == 2
    assert env.client.requests["view"] == 4


async def test_two_instances_each_claim_what_their_own_proxies_can_send(
    env: Env, autojump_clock: Any
) -> None:
    """The bug this rule fixes: the first instance's tick claimed every due group and waited on
    its own proxy while the other found nothing to claim."""
    await songs_due(env, 90)
    order = await due_order(env)
    await sleep_until(env, order[-1][1])
    other = Tracker(
        env.tracker.config, env.store, env.client, env.classifier, clock=env.clock,
        rng=random.Random(4), claimant="b/1", room=Room(bulk=1),
    )  # fmt: skip
    env.tracker.room = Room(bulk=1)
    limiter = trio.CapacityLimiter(4)
    async with trio.open_nursery() as nursery:
        assert await env.tracker.bulk_tick(nursery, limiter) == 30
        assert await other.bulk_tick(nursery, limiter) == 30
    done = await env.q(
        "SELECT claimant, aid FROM tracker_schedules WHERE status = 'completed' ORDER BY id"
    )
    assert {a for c, a in done if c == "local"} == {a for a, _ in order[:30]}
    assert {a for c, a in done if c == "b/1"} == {a for a, _ in order[30:60]}


async def test_a_claimed_request_that_finds_no_room_hands_its_rows_back_in_place(
    env: Env, autojump_clock: Any
) -> None:
    await songs_due(env, 40)
    order = await due_order(env)
    await sleep_until(env, order[-1][1])
    env.tracker.room = Room(bulk=1, snapshot=1)
    env.client.fail["bulk"] = [NoProxyAvailable("bulk")]  # another task took the room meanwhile
    limiter = trio.CapacityLimiter(4)
    async with trio.open_nursery() as nursery:
        assert await env.tracker.bulk_tick(nursery, limiter) == 30
    assert await due_order(env) == order  # all pending again, planned as before
    assert (await env.q("SELECT count(*) FROM tracker_schedules WHERE claimant IS NOT NULL")) == [
        (0,)
    ]
    async with trio.open_nursery() as nursery:
        assert await env.tracker.bulk_tick(nursery, limiter) == 30  # the same first 30
    assert [a for a, s in (await statuses(env)).items() if s == "completed"] == sorted(
        a for a, _ in order[:30]
    )
    # about to leave the lookback: the spec's no_proxy retry, not handed back
    await sleep_until(env, order[30][1] + rules.BULK_LOOKBACK_MS - 15 * SECOND + 1)
    env.client.fail["bulk"] = [NoProxyAvailable("bulk")]
    async with trio.open_nursery() as nursery:
        assert await env.tracker.bulk_tick(nursery, limiter) == 10
    last = await statuses(env)
    assert {last[a] for a, _ in order[30:]} == {"no_proxy"}
    # a single snapshot likewise
    await env.tracker.schedule(1, "milestone", env.clock() + 10, force=True)
    await trio.sleep(0.01)
    env.client.fail["view"] = [NoProxyAvailable("snapshot")]
    async with trio.open_nursery() as nursery:
        assert await env.tracker.snapshot_tick(nursery) == 1
    assert await env.q(
        "SELECT status, claimant FROM tracker_schedules WHERE type = 'milestone'"
    ) == [("pending", None)]
