# A video's snapshots and what is read from them: the latest one (kept by a trigger), the one
# nearest a moment, the short-term ETA and the regular interval, the candidates near a
# milestone and the songs closest to one. Functions over a connection inside a caller's
# transaction, like the rest of the tracker's store (daemon/tracker/store.py).
from __future__ import annotations

from typing import Any

from daemon.store import Conn, one
from daemon.tracker import rules
from daemon.tracker.base_store import _all, _first
from daemon.tracker.bilibili import Stat
from daemon.tracker.rules import Snap

_SNAPSHOT_INSERT = (
    "INSERT INTO tracker_snapshots(aid, at_ms, views, danmakus, replies, likes,"
    " coins, shares, favorites) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
)


def _snapshot_row(aid: int, at_ms: int, s: Stat) -> tuple[int, ...]:
    return (aid, at_ms, s.views, s.danmakus, s.replies, s.likes, s.coins, s.shares, s.favorites)


def insert_snapshot(conn: Conn, aid: int, at_ms: int, stat: Stat) -> bool:
    """Store a snapshot (the latest one follows by trigger); False if one exists at that ms."""
    conn.execute(_SNAPSHOT_INSERT, _snapshot_row(aid, at_ms, stat))
    return conn.changes() == 1


def latest(conn: Conn, aid: int) -> Snap | None:
    row = _first(conn, "SELECT at_ms, views FROM tracker_latest WHERE aid = ?", (aid,))
    return None if row is None else Snap(row[0], row[1])


def snapshot_at_or_before(conn: Conn, aid: int, at_ms: int) -> Snap | None:
    row = _first(
        conn,
        "SELECT at_ms, views FROM tracker_snapshots WHERE aid = ? AND at_ms <= ?"
        " ORDER BY at_ms DESC LIMIT 1",
        (aid, at_ms),
    )
    return None if row is None else Snap(row[0], row[1])


def snapshot_after(conn: Conn, aid: int, at_ms: int) -> Snap | None:
    row = _first(
        conn,
        "SELECT at_ms, views FROM tracker_snapshots WHERE aid = ? AND at_ms > ?"
        " ORDER BY at_ms LIMIT 1",
        (aid, at_ms),
    )
    return None if row is None else Snap(row[0], row[1])


def nearest_snapshot(conn: Conn, aid: int, at_ms: int) -> Snap | None:
    return rules.nearest(
        at_ms, snapshot_at_or_before(conn, aid, at_ms), snapshot_after(conn, aid, at_ms)
    )


def eta_of(conn: Conn, aid: int, now_ms: int) -> rules.Eta | None:
    """The short-term ETA from the snapshots nearest each look-back (None: no snapshot)."""
    last = latest(conn, aid)
    if last is None:
        return None
    snaps = [nearest_snapshot(conn, aid, now_ms - back) for back in rules.ETA_LOOKBACKS_MS]
    return rules.short_term_eta(last, snaps)


def regular_interval_hours(conn: Conn, aid: int, now_ms: int, last: Snap | None = None) -> float:
    """The regular interval of `aid` from its snapshots (`last`: its latest, if known)."""
    cut = now_ms - rules.REGULAR_LOOKBACK_MS
    base = rules.regular_base(snapshot_at_or_before(conn, aid, cut), snapshot_after(conn, aid, cut))
    return rules.regular_interval_hours(base, last or latest(conn, aid))


def upsert_eta(
    conn: Conn, aid: int, eta_hours: float, speed: float, views: int, now_ms: int
) -> None:
    conn.execute(_ETA_UPSERT, (aid, min(eta_hours, 1e300), speed, views, now_ms))


_ETA_UPSERT = (
    "INSERT INTO tracker_eta(aid, eta_hours, speed, views, updated_ms) VALUES (?, ?, ?, ?, ?)"
    " ON CONFLICT(aid) DO UPDATE SET eta_hours = excluded.eta_hours,"
    " speed = excluded.speed, views = excluded.views, updated_ms = excluded.updated_ms"
)


def snapshots(
    conn: Conn, aid: int, since_ms: int, until_ms: int, limit: int
) -> list[tuple[int, ...]]:
    """(at_ms, views, danmakus, replies, likes, coins, shares, favorites), oldest first, in
    [since_ms, until_ms]; up to `limit`."""
    rows: list[tuple[int, ...]] = _all(
        conn,
        "SELECT at_ms, views, danmakus, replies, likes, coins, shares, favorites"
        " FROM tracker_snapshots WHERE aid = ? AND at_ms BETWEEN ? AND ? ORDER BY at_ms LIMIT ?",
        (aid, since_ms, until_ms, limit),
    )
    return rows


def count_snapshots(conn: Conn) -> int:
    return int(one(conn, "SELECT count(*) FROM tracker_snapshots")[0])


# ---- milestone candidates ----


def milestone_candidates(conn: Conn) -> list[int]:
    """Aids near a milestone (rules.is_milestone_candidate), status 0 only."""
    song_ranges = " OR ".join(
        f"(l.views >= {low}" + ("" if high is None else f" AND l.views < {high}") + ")"
        for low, high in rules.SONG_CANDIDATE_RANGES
    )
    video_ranges = " OR ".join(
        f"(l.views >= {low} AND l.views < {high})" for low, high in rules.VIDEO_CANDIDATE_RANGES
    )
    near = rules.MILLION - rules.NEAR_MILLION
    rows = _all(
        conn,
        "SELECT l.aid FROM tracker_latest l JOIN tracker_songs s ON s.aid = l.aid"
        f" WHERE {song_ranges}"
        f" UNION SELECT l.aid FROM tracker_latest l WHERE {video_ranges}"
        f" OR (l.views >= {near} AND l.views % {rules.MILLION} >= {near})"
        " UNION SELECT aid FROM tracker_eta WHERE eta_hours < ?",
        (rules.CANDIDATE_ETA_HOURS,),
    )
    aids = [r[0] for r in rows]
    gone = {
        r[0]
        for r in _all(
            conn, "SELECT aid FROM tracker_videos INDEXED BY tracker_videos_gone WHERE status <> 0"
        )
    }
    return [a for a in aids if a not in gone]


def closest_to_milestone(conn: Conn, limit: int) -> list[dict[str, Any]]:
    """Songs with their views and ETA, soonest first (songs without a finite ETA last, by how
    few views they lack)."""
    rows = _all(
        conn,
        "SELECT s.aid, v.title, l.views, l.at_ms, e.eta_hours, e.speed,"
        " (SELECT min(planned_ms) FROM tracker_schedules x WHERE x.aid = s.aid"
        "  AND x.status IN ('pending', 'processing'))"
        " FROM tracker_songs s JOIN tracker_latest l ON l.aid = s.aid"
        " LEFT JOIN tracker_videos v ON v.aid = s.aid LEFT JOIN tracker_eta e ON e.aid = s.aid"
        " WHERE coalesce(v.status, 0) = 0",
    )
    found = []
    for aid, title, views, at_ms, _eta, speed, next_ms in rows:
        target = rules.closest_milestone(views)
        to_go = target - views
        hours = None
        if speed is not None and speed > 0:
            hours = to_go / speed
        found.append(
            {
                "aid": aid,
                "title": title,
                "views": views,
                "target": target,
                "views_to_go": to_go,
                "eta_hours": hours,
                "speed_per_hour": speed,
                "last_snapshot_ms": at_ms,
                "next_check_ms": next_ms,
            }
        )
    found.sort(key=lambda r: (r["eta_hours"] is None, r["eta_hours"] or 0.0, r["views_to_go"]))
    return found[:limit]
