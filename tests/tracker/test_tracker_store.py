from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import apsw
import pytest

from daemon.store import migrate
from daemon.tracker import rules
from daemon.tracker import store as ts
from daemon.tracker.bilibili import Stat, Uploader, VideoDetail
from daemon.tracker.engine import LOCAL_CLAIMANT as C
from daemon.tracker.rules import DAY, HOUR, MINUTE, SECOND, Snap

T0 = 1_767_225_600_000
W = 5 * MINUTE


@pytest.fixture
def conn(tmp_path: Path) -> Iterator[apsw.Connection]:
    c = apsw.Connection(str(tmp_path / "t.db"))
    c.create_scalar_function("crawld_now_ms", lambda: T0, 0)
    migrate(c)
    yield c
    c.close()


def stat(views: int) -> Stat:
    return Stat(views=views, danmakus=1, replies=2, likes=3, coins=4, shares=5, favorites=6)


def detail(aid: int, views: int = 10, uid: int = 7, name: str = "up") -> VideoDetail:
    return VideoDetail(
        aid=aid, bvid=f"BV{aid}", title=f"t{aid}", description="d", tags=["VOCALOID"],
        duration=200, published_ms=T0 - HOUR, cover_url="http://c",
        uploader=Uploader(uid=uid, name=name, sign="s", fans=3, face="f"), stat=stat(views),
    )  # fmt: skip


def windows(conn: apsw.Connection) -> dict[int, int]:
    return {w: n for w, n in conn.execute("SELECT win, pending FROM tracker_windows WHERE pending")}


def recount(conn: apsw.Connection) -> dict[int, int]:
    size = ts.window_ms(conn)
    return {
        w: n
        for w, n in conn.execute(
            "SELECT planned_ms / ?, count(*) FROM tracker_schedules WHERE status = 'pending'"
            " GROUP BY 1",
            (size,),
        )
    }


def sched(conn: apsw.Connection, aid: int, type_: str, at: int, **kw: object) -> ts.Scheduled:
    args = {"now_ms": T0, "capacity": 3000, "rng": random.Random(1)} | kw
    return ts.schedule_snapshot(conn, aid, type_, at, **args)  # type: ignore[arg-type]


def test_exact_and_windowed_times(conn: apsw.Connection) -> None:
    new = sched(conn, 1, "new", T0 + 90 * SECOND)
    assert new.outcome == "inserted" and new.planned_ms == T0 + 90 * SECOND
    normal = sched(conn, 1, "normal", T0 + HOUR)
    assert normal.planned_ms // W == (T0 + HOUR) // W
    assert windows(conn) == recount(conn)


def test_active_schedule_kept_unless_forced(conn: apsw.Connection) -> None:
    first = sched(conn, 1, "new", T0 + MINUTE)
    assert sched(conn, 1, "new", T0 + 2 * MINUTE).outcome == "kept"
    forced = sched(conn, 1, "new", T0 + 3 * MINUTE, force=True)
    assert forced.outcome == "inserted" and forced.schedule_id != first.schedule_id
    assert sched(conn, 1, "normal", T0 + HOUR).outcome == "inserted"  # other type: independent
    assert sched(conn, 1, "normal", T0 + 2 * HOUR).outcome == "kept"
    # a finished schedule is not active
    ts.claim(conn, [first.schedule_id], T0, claimant=C)
    assert sched(conn, 1, "new", T0).outcome == "kept"  # processing is active
    ts.finish(conn, [first.schedule_id], "completed", T0, claimant=C)
    assert windows(conn) == recount(conn)


def test_milestone_only_moves_earlier(conn: apsw.Connection) -> None:
    first = sched(conn, 1, "milestone", T0 + HOUR)
    later = sched(conn, 1, "milestone", T0 + 2 * HOUR)
    assert later.outcome == "kept" and later.planned_ms == T0 + HOUR
    earlier = sched(conn, 1, "milestone", T0 + 10 * MINUTE)
    assert earlier == ts.Scheduled("moved", first.schedule_id, T0 + 10 * MINUTE)
    assert windows(conn) == recount(conn) == {(T0 + 10 * MINUTE) // W: 1}
    (n,) = conn.execute("SELECT count(*) FROM tracker_schedules").fetchone()
    assert n == 1


def test_window_capacity_pushes_to_next_window(conn: apsw.Connection) -> None:
    rng = random.Random(5)
    planned = [
        sched(conn, aid, "normal", T0, capacity=3, rng=rng).planned_ms for aid in range(1, 8)
    ]
    per_window: dict[int, int] = {}
    for at in planned:
        assert at >= T0
        per_window[at // W] = per_window.get(at // W, 0) + 1
    assert per_window == {T0 // W: 3, T0 // W + 1: 3, T0 // W + 2: 1}
    assert windows(conn) == recount(conn) == per_window


def test_window_counts_follow_every_change(conn: apsw.Connection) -> None:
    ids = [sched(conn, aid, "normal", T0 + aid * MINUTE).schedule_id for aid in range(1, 30)]
    ids.append(sched(conn, 99, "new", T0 + 90 * SECOND).schedule_id)
    ts.claim(conn, ids[:10], T0, claimant=C)
    assert windows(conn) == recount(conn)
    ts.finish(conn, ids[:5], "completed", T0, claimant=C)
    ts.finish(conn, ids[5:10], "no_proxy", T0, "none", claimant=C)
    assert windows(conn) == recount(conn)
    assert ts.cleanup(conn, T0 + 12 * MINUTE) > 0
    assert windows(conn) == recount(conn)
    claimed = ts.claim(conn, ids[20:], T0, claimant=C)  # the `new` one is gone (cleanup)
    assert ts.recover_processing(conn, T0 + 5 * HOUR) == len(claimed) == 9
    assert windows(conn) == recount(conn)
    assert ts.set_window_ms(conn, 60_000)
    assert windows(conn) == recount(conn)
    assert not ts.set_window_ms(conn, 60_000)


def test_schedule_counts_by_type_and_status(conn: apsw.Connection) -> None:
    a = sched(conn, 1, "new", T0).schedule_id
    sched(conn, 2, "new", T0)
    sched(conn, 1, "normal", T0 + HOUR)
    ts.claim(conn, [a], T0, claimant=C)
    ts.finish(conn, [a], "bili_error", T0, "-404", claimant=C)
    assert ts.schedule_counts(conn) == {
        "new": {"pending": 1, "bili_error": 1},
        "milestone": {},
        "normal": {"pending": 1},
        "archive": {},
    }


def test_due_and_claim(conn: apsw.Connection) -> None:
    ms = sched(conn, 1, "milestone", T0 + 500).schedule_id
    new = sched(conn, 2, "new", T0 - 30 * SECOND).schedule_id
    sched(conn, 3, "new", T0 - 2 * MINUTE)  # too old for the single tick
    sched(conn, 4, "new", T0 + 5 * SECOND)  # not yet
    normal = sched(conn, 5, "normal", T0, rng=random.Random(0)).planned_ms
    low, high = rules.due_range(T0, rules.SINGLE_LOOKBACK_MS, SECOND)
    types = [t for group in rules.SINGLE_TYPES_BY_PRIORITY for t in group]
    rows = ts.due(conn, types, low, high, 50)
    assert [r[0] for r in rows] == [ms, new]
    claimed = ts.claim(conn, [ms, ms], T0, claimant=C)
    assert [r[0] for r in claimed] == [ms]
    assert ts.busy_aids(conn, [1, 2]) == {1}
    assert [r[0] for r in ts.due(conn, types, low, high, 50)] == [new]
    bulk = ts.due(conn, ["normal", "archive"], normal - MINUTE, normal + MINUTE, 1000)
    assert [r[1] for r in bulk] == [5]


def test_due_query_is_index_only(conn: apsw.Connection) -> None:
    plan = " ".join(
        str(row[3])
        for row in conn.execute(
            "EXPLAIN QUERY PLAN SELECT id, aid, type, planned_ms FROM tracker_schedules"
            " INDEXED BY tracker_schedules_due WHERE status = 'pending' AND type = ?"
            " AND planned_ms BETWEEN ? AND ? ORDER BY planned_ms LIMIT ?",
            ("new", T0, T0 + 1, 10),
        )
    )
    assert "COVERING INDEX tracker_schedules_due (type=? AND planned_ms>? AND planned_ms<?)" in plan
    assert "TEMP B-TREE" not in plan


def test_cleanup_deletes_old_pending_and_processing(conn: apsw.Connection) -> None:
    old = sched(conn, 1, "new", T0 - 3 * MINUTE).schedule_id
    stuck = sched(conn, 2, "milestone", T0 - 5 * MINUTE).schedule_id
    ts.claim(conn, [stuck], T0 - 5 * MINUTE, claimant=C)
    fresh = sched(conn, 3, "new", T0 - MINUTE).schedule_id
    done = sched(conn, 4, "new", T0 - 10 * MINUTE).schedule_id
    ts.claim(conn, [done], T0, claimant=C)
    ts.finish(conn, [done], "completed", T0, claimant=C)
    assert ts.cleanup(conn, T0 - 2 * MINUTE) == 2
    left = {r[0] for r in conn.execute("SELECT id FROM tracker_schedules")}
    assert left == {fresh, done} and old not in left


def test_snapshots_latest_and_lookups(conn: apsw.Connection) -> None:
    assert ts.insert_snapshot(conn, 1, T0, stat(10))
    assert not ts.insert_snapshot(conn, 1, T0, stat(11))  # same instant: stored once
    ts.insert_snapshot(conn, 1, T0 + 2 * HOUR, stat(30))
    ts.insert_snapshot(conn, 1, T0 + HOUR, stat(20))  # late arrival does not win "latest"
    assert ts.latest(conn, 1) == Snap(T0 + 2 * HOUR, 30)
    assert ts.nearest_snapshot(conn, 1, T0 + 20 * MINUTE) == Snap(T0, 10)
    assert ts.nearest_snapshot(conn, 1, T0 + 40 * MINUTE) == Snap(T0 + HOUR, 20)
    assert ts.snapshots(conn, 1, T0 + 1, T0 + 3 * HOUR, 1) == [(T0 + HOUR, 20, 1, 2, 3, 4, 5, 6)]
    assert ts.regular_interval_hours(conn, 1, T0 + 2 * HOUR) == 12.0  # base: first (after)
    eta = ts.eta_of(conn, 1, T0 + 2 * HOUR)
    assert eta is not None and eta.target == 100_000 and eta.speed > 0


def test_ingest_queue_and_video(conn: apsw.Connection) -> None:
    assert ts.enqueue_ingest(conn, [5, 6, 5], "discovery", T0) == [5, 6]
    assert ts.enqueue_ingest(conn, [5, 7], "api", T0) == [7]
    assert ts.due_ingest(conn, T0, 10) == [(5, 0), (6, 0), (7, 0)]
    ts.ingest_failed(conn, 6, "timeout", T0 + 30 * SECOND)
    assert ts.due_ingest(conn, T0, 10) == [(5, 0), (7, 0)]
    ts.store_video(conn, detail(5, uid=7, name="a"), T0 + 1, T0)
    ts.store_video(conn, detail(8, uid=7, name="b"), T0 + 1, T0)  # same uploader: upsert
    ts.store_gone_video(conn, 7, -404, T0)
    ts.ingest_failed(conn, 6, "timeout", None)
    assert ts.due_ingest(conn, T0 + HOUR, 10) == []
    assert ts.known_aids(conn, [5, 6, 7, 8, 9]) == {5, 7, 8}
    assert list(conn.execute("SELECT uid, name FROM tracker_users")) == [(7, "b")]
    assert ts.latest(conn, 5) == Snap(T0 + 1, 10)
    assert ts.video_status(conn, 7) == -404
    assert [v.aid for v in ts.unlabelled(conn, 0, 10)] == [5, 8]
    assert not ts.store_label(conn, 5, 0, [0.9, 0.05, 0.05], "rules-1", T0)
    assert ts.store_label(conn, 8, 1, [0.1, 0.8, 0.1], "rules-1", T0)
    assert not ts.store_label(conn, 8, 1, [0.1, 0.8, 0.1], "rules-1", T0)  # already a song
    assert ts.unlabelled(conn, 0, 10) == []
    info = ts.video_info(conn, 8)
    assert info is not None and info["song"] and info["label"]["label"] == 1
    assert info["status"] == "ok" and info["uploader"]["name"] == "b"
    assert ts.video_info(conn, 7)["status"] == -404  # type: ignore[index]
    assert ts.video_info(conn, 12345) is None
    assert ts.totals(conn) == {"videos": 3, "songs": 1, "ingest_queued": 0, "videos_gone": 1}


def test_without_active_and_candidates(conn: apsw.Connection) -> None:
    for aid, views in ((1, 95_000), (2, 65_000), (3, 1_950_000), (4, 10)):
        ts.store_video(conn, detail(aid, views), T0, T0)
    ts.store_label(conn, 2, 1, [0, 1, 0], "v", T0)
    ts.store_label(conn, 4, 2, [0, 0, 1], "v", T0)
    assert ts.without_active(conn, "normal", songs=True, after_aid=0, limit=10) == [2, 4]
    sched(conn, 2, "normal", T0 + HOUR)
    assert ts.without_active(conn, "normal", songs=True, after_aid=0, limit=10) == [4]
    assert ts.without_active(conn, "archive", songs=False, after_aid=0, limit=10) == [1, 3]
    ts.upsert_eta(conn, 4, 100.0, 5.0, 10, T0)
    assert sorted(ts.milestone_candidates(conn)) == [1, 2, 3, 4]
    ts.set_video_status(conn, 3, 62002)
    assert sorted(ts.milestone_candidates(conn)) == [1, 2, 4]
    assert ts.without_active(conn, "archive", songs=False, after_aid=0, limit=10) == [1]


@pytest.mark.parametrize(
    ("views", "song"),
    [(v, s) for v in (59_999, 60_000, 89_999, 90_000, 99_999, 100_000, 899_999, 900_000,
                      999_999, 1_000_000, 1_000_001, 1_899_999, 1_900_000, 2_000_000)
     for s in (True, False)],
)  # fmt: skip
def test_candidate_sql_matches_rule(conn: apsw.Connection, views: int, song: bool) -> None:
    ts.store_video(conn, detail(1, views), T0, T0)
    if song:
        ts.store_label(conn, 1, 1, [0, 1, 0], "v", T0)
    expected = rules.is_milestone_candidate(views, song, None)
    assert (ts.milestone_candidates(conn) == [1]) is expected


def _complete_one_by_one(
    conn: apsw.Connection,
    group: list[ts.Due],
    stats: dict[int, Stat],
    at_ms: int,
    now: int,
    capacity: int,
    rng: random.Random,
) -> list[tuple[str, int]]:
    """The bulk completion as a loop of single-row calls: what complete_bulk must equal."""
    done = []
    for sid, aid, type_, planned in group:
        if aid not in stats:
            ts.finish(conn, [sid], "failed", now, "missing from the bulk answer", claimant=C)
            continue
        previous = ts.latest(conn, aid)
        current = Snap(at_ms, stats[aid].views)
        if ts.insert_snapshot(conn, aid, at_ms, stats[aid]):
            eta = rules.bulk_eta(previous, current)
            if eta is not None:
                ts.upsert_eta(conn, aid, eta[0], eta[1], stats[aid].views, now)
        ts.finish(conn, [sid], "completed", now, claimant=C)
        if type_ != "archive":
            newest = current if previous is None or current.at_ms >= previous.at_ms else previous
            hours = ts.regular_interval_hours(conn, aid, now, newest)
            at = now + int(hours * HOUR)
            ts.schedule_snapshot(conn, aid, "normal", at, now_ms=now, capacity=capacity, rng=rng)
        done.append((type_, max(at_ms - planned, 0)))
    return done


def _bulk_fixture(conn: apsw.Connection) -> tuple[list[ts.Due], dict[int, Stat]]:
    """40 aids with varied histories, a crowded window, and one claimed group of schedules."""
    rng = random.Random(11)
    for aid in range(1, 41):
        for back in (3 * 24 * HOUR, 30 * HOUR, 20 * HOUR, HOUR)[: aid % 5]:
            ts.insert_snapshot(conn, aid, T0 - back + aid, stat(aid * 1000 - back // HOUR * aid))
    for filler in range(100, 104):  # windows soon after now nearly full
        ts.schedule_snapshot(conn, filler, "normal", T0 + 6 * HOUR, now_ms=T0, capacity=10, rng=rng)
    ids = [sched(conn, aid, "archive" if aid % 7 == 0 else "normal", T0).schedule_id
           for aid in range(1, 41)]  # fmt: skip
    ids.append(sched(conn, 3, "archive", T0).schedule_id)  # the same aid twice in the group
    sched(conn, 41, "normal", T0 + DAY)  # an active normal schedule of aid 41 is kept
    ids.append(sched(conn, 41, "archive", T0).schedule_id)
    group = ts.claim(conn, ids, T0, claimant=C)
    ts.insert_snapshot(conn, 5, T0 + 2 * SECOND, stat(1))  # already stored at the answer's time
    stats = {aid: stat(aid * 1000 + aid * aid) for aid in range(1, 42) if aid != 9}  # 9: missing
    return group, stats


def _dump(conn: apsw.Connection) -> dict[str, list[tuple[object, ...]]]:
    tables = ["tracker_snapshots", "tracker_latest", "tracker_eta", "tracker_schedules",
              "tracker_windows", "tracker_schedule_counts"]  # fmt: skip
    return {t: conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall() for t in tables}


def test_complete_bulk_equals_one_by_one(tmp_path: Path) -> None:
    dumps, results = [], []
    for name, batched in (("loop", False), ("bulk", True)):
        c = apsw.Connection(str(tmp_path / f"{name}.db"))
        migrate(c)
        with c:
            group, stats = _bulk_fixture(c)
        now, at_ms, rng = T0 + 5 * SECOND, T0 + 2 * SECOND, random.Random(3)
        with c:
            if batched:
                done = ts.complete_bulk(
                    c, group, stats, at_ms, now, capacity=10, rng=rng, claimant=C
                )
            else:
                done = _complete_one_by_one(c, group, stats, at_ms, now, 10, rng)
        results.append(done)
        dumps.append(_dump(c))
        assert windows(c) == recount(c)
        counted = ts.schedule_counts(c)
        for type_, status, n in c.execute(
            "SELECT type, status, count(*) FROM tracker_schedules GROUP BY 1, 2"
        ):
            assert counted[type_][status] == n
        c.close()
    assert results[0] == results[1]
    assert len(results[1]) == 41  # every claimed schedule but the missing aid's
    assert dumps[0] == dumps[1]
    chained = [row for row in dumps[1]["tracker_schedules"] if row[5] == T0 + 5 * SECOND]
    assert len(chained) == 34  # normal ones: not 9 (missing), not 41 (kept its own)
    per_window = [n for _, n in dumps[1]["tracker_windows"]]
    assert max(per_window) == 10 and sum(per_window) == 34 + 4 + 1  # full windows pushed on


def test_complete_bulk_rolls_back_with_its_transaction(conn: apsw.Connection) -> None:
    with conn:
        group, stats = _bulk_fixture(conn)
    before = _dump(conn)
    with pytest.raises(ZeroDivisionError), conn:
        ts.complete_bulk(
            conn, group, stats, T0 + 2 * SECOND, T0, capacity=10, rng=random.Random(), claimant=C
        )
        raise ZeroDivisionError
    assert _dump(conn) == before
