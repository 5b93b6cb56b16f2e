"""The tracker's cluster rules in the store, on both backends (and two stores on one PostgreSQL
schema where concurrency matters): claims are disjoint, a dead claimant's schedules are
reclaimed and a live one's are not, a stale finish stores nothing, and a shared proxy's windows
hold across every store reserving through it."""

from __future__ import annotations

import random
import threading
import time

import trio

from daemon.cluster import store as cs
from daemon.net.ratelimit import Window, window_gcra
from daemon.store import Conn, Store
from daemon.tracker import limiter_store as ls
from daemon.tracker import store as ts
from daemon.tracker.bilibili import Stat
from daemon.tracker.rules import HOUR, SECOND

"""Two instances' stores on one PostgreSQL schema."""
T0 = 1_767_225_600_000
A, B = "a/1", "b/1"


def stat(views: int) -> Stat:
    return Stat(views=views, danmakus=1, replies=2, likes=3, coins=4, shares=5, favorites=6)


def join(conn: Conn, claimant: str) -> None:
    instance = claimant.split("/")[0]
    cs.join(conn, instance=instance, claimant=claimant, host="h", pid=1, version="t",
            offers="{}", lease_ms=60_000)  # fmt: skip


def plan(conn: Conn, count: int, type_: str = "normal") -> list[int]:
    """`count` due schedules of videos 1..count (one snapshot each, an hour old)."""
    ids = []
    for aid in range(1, count + 1):
        conn.execute(
            "INSERT INTO tracker_videos(aid, title, status, added_ms) VALUES (?, 't', 0, ?)",
            (aid, T0 - 2 * HOUR),
        )
        ts.insert_snapshot(conn, aid, T0 - HOUR, stat(100))
        row = conn.execute(
            "INSERT INTO tracker_schedules(aid, type, planned_ms, created_ms) VALUES (?, ?, ?, ?)"
            " RETURNING id",
            (aid, type_, T0 + aid, T0),
        ).fetchone()
        ids.append(row[0])
    return ids


def claim_due(conn: Conn, claimant: str, limit: int) -> list[ts.Due]:
    due = ts.due(conn, ["normal"], T0 - HOUR, T0 + HOUR, limit)
    return ts.claim(conn, [r[0] for r in due], T0, claimant=claimant)


async def test_two_instances_claim_disjoint_sets(two_stores: tuple[Store, Store]) -> None:
    a, b = two_stores
    ids = await a.write(lambda c: plan(c, 100))
    a_claimed = threading.Event()

    def a_claims(conn: Conn) -> list[ts.Due]:
        claimed = claim_due(conn, A, 20)
        a_claimed.set()
        time.sleep(0.3)  # still uncommitted while B picks the same due rows
        return claimed

    def b_claims(conn: Conn) -> tuple[int, list[ts.Due]]:
        due = ts.due(conn, ["normal"], T0 - HOUR, T0 + HOUR, 20)
        return len(due), ts.claim(conn, [r[0] for r in due], T0, claimant=B)

    async with trio.open_nursery() as nursery:
        first: list[list[ts.Due]] = []

        async def run_a() -> None:
            first.append(await a.write(a_claims))

        nursery.start_soon(run_a)
        await trio.to_thread.run_sync(a_claimed.wait)
        seen, raced = await b.write(b_claims)
    assert seen == 20 and raced == []  # B waited for A's commit, then found them taken
    got = {A: [r[0] for r in first[0]], B: []}
    for turn in range(20):
        claimant, store = (A, a) if turn % 2 else (B, b)
        got[claimant] += [r[0] for r in await store.write(lambda c, w=claimant: claim_due(c, w, 7))]
    assert got[A] and got[B]
    assert not set(got[A]) & set(got[B])
    assert sorted(got[A] + got[B]) == ids  # each claimed once, none lost
    rows = await a.read(
        lambda c: c.execute(
            "SELECT claimant, count(*) FROM tracker_schedules WHERE status = 'processing'"
            " GROUP BY 1 ORDER BY 1"
        ).fetchall()
    )
    assert [tuple(r) for r in rows] == [(A, len(got[A])), (B, len(got[B]))]


async def test_claims_stamp_the_claimant_and_a_row_is_claimed_once(store: Store) -> None:
    ids = await store.write(lambda c: plan(c, 5))
    first = await store.write(lambda c: ts.claim(c, ids[:3], T0, claimant=A))
    second = await store.write(lambda c: ts.claim(c, ids, T0, claimant=B))
    assert [r[0] for r in first] == ids[:3] and [r[0] for r in second] == ids[3:]
    assert await store.read(ts.claims) == {A: 3, B: 2}


async def test_a_dead_claimants_schedules_are_reclaimed_and_a_live_ones_are_not(
    store: Store,
) -> None:
    ids = await store.write(lambda c: plan(c, 6))

    def setup(conn: Conn) -> None:
        join(conn, A)
        join(conn, B)
        ts.claim(conn, ids[:3], T0, claimant=A)
        ts.claim(conn, ids[3:5], T0, claimant=B)
        ts.claim(conn, ids[5:], T0, claimant="gone/1")  # never a member
        conn.execute("UPDATE cluster_members SET expires_ms = 0 WHERE instance = 'b'")  # died

    await store.write(setup)
    assert await store.write(lambda c: ts.recover_processing(c, T0 + SECOND)) == 3
    rows = await store.read(
        lambda c: c.execute(
            "SELECT id, status, claimant, planned_ms FROM tracker_schedules ORDER BY id"
        ).fetchall()
    )
    assert [tuple(r) for r in rows[:3]] == [(i, "processing", A, T0 + n + 1) for n, i in
                                            enumerate(ids[:3])]  # fmt: skip
    assert [tuple(r) for r in rows[3:]] == [(i, "pending", None, T0 + SECOND) for i in ids[3:]]
    # a live process gives its own back only when asked (its ticks stopped)
    assert await store.write(lambda c: ts.recover_processing(c, T0, also=A)) == 3
    assert await store.read(ts.claims) == {}


async def test_a_stale_finish_stores_nothing(store: Store) -> None:
    ids = await store.write(lambda c: plan(c, 4))
    group = await store.write(lambda c: ts.claim(c, ids, T0, claimant=B))

    def b_paused_then_a_took_two(conn: Conn) -> list[ts.Due]:
        join(conn, A)
        conn.execute(
            "UPDATE tracker_schedules SET status = 'pending', claimant = NULL WHERE id IN (?, ?)",
            (ids[0], ids[1]),
        )  # what the reclaim duty did while B was paused
        return ts.claim(conn, ids[:2], T0, claimant=A)

    taken = await store.write(b_paused_then_a_took_two)
    assert [r[0] for r in taken] == ids[:2]
    stats = {aid: stat(500) for aid in (1, 2, 3, 4)}

    def b_wakes(conn: Conn) -> list[tuple[str, int]]:
        return ts.complete_bulk(conn, group, stats, T0 + 5 * SECOND, T0 + 5 * SECOND,
                                capacity=100, rng=random.Random(1), claimant=B)  # fmt: skip

    done = await store.write(b_wakes)
    assert len(done) == 2  # only the two still B's
    snaps = await store.read(
        lambda c: c.execute(
            "SELECT aid FROM tracker_snapshots WHERE at_ms = ? ORDER BY aid", (T0 + 5 * SECOND,)
        ).fetchall()
    )
    assert [r[0] for r in snaps] == [3, 4]
    # A's single-path finish is A's; B's late one finds nothing
    assert await store.write(lambda c: ts.finish(c, ids[:2], "completed", T0, claimant=B)) == []
    assert (
        await store.write(lambda c: ts.finish(c, ids[:2], "completed", T0, claimant=A)) == ids[:2]
    )


WINDOWS = [("all:5/1000ms", Window(5, 1000)), ("bulk:2/1000ms", Window(2, 1000))]


def conforming(times: list[int], windows: list[Window]) -> bool:
    """Whether requests at `times` (sorted) pass every window, as the simulator decides."""
    tats = [w.scaled(times[0] - w.per_ms) for w in windows] if times else []  # idle before
    for at in times:
        for i, w in enumerate(windows):
            new = window_gcra(tats[i], at, w)
            if new is None:
                return False
            tats[i] = new
    return True


async def test_shared_reservations_follow_the_gcra_on_plain_values(store: Store) -> None:
    async def reserve(now: int, *, exhaust: bool = False) -> ls.Reservation:
        return await store.write(
            lambda c: ls.reserve(c, "relay1", WINDOWS, now_ms=now, exhaust=exhaust)
        )

    # a window never seen starts with its burst spent: one request per interval
    first = await reserve(T0)
    assert not first.granted and first.at_ms == T0 + 500  # the bulk window: 2/s
    assert (await reserve(T0 + 500)).granted
    assert not (await reserve(T0 + 600)).granted
    later = T0 + 10_000  # idle long enough: the full burst of the stricter window
    got = [(await reserve(later)).granted for _ in range(3)]
    assert got == [True, True, False]
    refused = await reserve(later + 5000, exhaust=True)
    assert not refused.granted and refused.at_ms == later + 5500
    rows = await store.read(
        lambda c: c.execute(
            "SELECT limit_key, tat_ms FROM tracker_limiter ORDER BY limit_key"
        ).fetchall()
    )
    assert [tuple(r) for r in rows] == [("all:5/1000ms", later + 6000),
                                        ("bulk:2/1000ms", later + 6000)]  # fmt: skip


async def test_a_shared_proxys_room_is_what_its_stored_windows_allow(store: Store) -> None:
    async def room(now: int, horizon: int = 1000) -> int | None:
        return await store.read(lambda c: ls.room(c, "relay1", WINDOWS, horizon, 10, now_ms=now))

    # never used: no room to count from until its windows are started (burst spent now), which
    # only a write does; a read-only count that started them at each read would never reach one
    assert await room(T0) is None
    started = await store.write(
        lambda c: ls.room(c, "relay1", WINDOWS, 1000, 10, now_ms=T0, create=True)
    )
    assert started == 1  # the bulk window: the next at T0 + 500
    assert await room(T0 + 400) == 2  # at T0 + 500 and T0 + 1000: counted from the start
    assert not (await store.write(lambda c: ls.reserve(c, "relay1", WINDOWS, now_ms=T0))).granted
    assert (await store.write(lambda c: ls.reserve(c, "relay1", WINDOWS, now_ms=T0 + 500))).granted
    assert await room(T0 + 500) == 1  # the next at T0 + 1000
    assert await room(T0 + 500, 500) == 0
    later = T0 + 10_000
    assert await room(later) == 3  # the bulk burst of 2, then one 500 ms later
    assert await room(later, 10_000) == 10  # at most the limit
    for _ in range(2):
        assert (await store.write(lambda c: ls.reserve(c, "relay1", WINDOWS, now_ms=later))).granted
    assert await room(later) == 1


async def test_two_instances_through_one_proxy_never_exceed_its_limits(
    two_stores: tuple[Store, Store],
) -> None:
    granted: list[int] = []
    denied = [0]
    await two_stores[0].write(lambda c: ls.reserve(c, "relay1", WINDOWS, now_ms=0))  # idle
    end = trio.current_time() + 1.5

    async def hammer(store: Store) -> None:
        while trio.current_time() < end:
            got = await store.write(lambda c: ls.reserve(c, "relay1", WINDOWS))  # database clock
            if got.granted:
                granted.append(got.now_ms)
            else:
                denied[0] += 1
                assert got.at_ms > got.now_ms

    async with trio.open_nursery() as nursery:
        for store in two_stores:
            nursery.start_soon(hammer, store)
    assert len(granted) >= 4 and denied[0]
    assert conforming(sorted(granted), [w for _, w in WINDOWS])
