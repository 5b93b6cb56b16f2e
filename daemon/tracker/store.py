# The tracker's tables (migration 0004) as plain functions over an APSW connection. They run
# inside a caller's transaction (the store's writer, or a reader's snapshot), so a snapshot, the
# schedule it completes and the schedule it chains always change together; nothing here knows
# about trio. (The limiter state is the network side's: daemon/tracker/limiter_store.py.)
#
# Counts that must never drift from the schedule rows (pending rows per window, rows per
# type × status) and the latest snapshot per video are kept by triggers in the migration, so
# they change in the very statement that changes the row. The due query of the ticks reads a
# partial covering index over pending rows only, one range scan per type, so its cost does not
# grow with the millions of finished rows behind it.
#
# The bulk path's completion (complete_bulk) is the writer's hottest transaction: it runs one
# statement or executemany per kind of row for the whole group of 30 rather than several calls
# per schedule, and places the chained schedules in their windows in Python (rules.
# place_in_windows) from one read of the window counts, so the cost per snapshot is mostly
# SQLite's own, not Python's or the GIL's.
from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from daemon.cluster import LIVE_CLAIMANTS
from daemon.store import Conn, one
from daemon.tracker import rules
from daemon.tracker.bilibili import Stat, VideoDetail
from daemon.tracker.rules import Snap

_encode_bytes = msgspec.json.encode


def _encode(value: Any) -> str:
    """JSON text for the TEXT columns (tags, probabilities)."""
    return _encode_bytes(value).decode()


_decode_list = msgspec.json.Decoder(list[Any]).decode


def _all(conn: Conn, sql: str, bindings: tuple[Any, ...] = ()) -> list[Any]:
    return conn.execute(sql, bindings).fetchall()


def _first(conn: Conn, sql: str, bindings: tuple[Any, ...] = ()) -> Any:
    return conn.execute(sql, bindings).fetchone()


Due = tuple[int, int, str, int]
"""A schedule row as the ticks see it: (id, aid, type, planned_ms)."""


# ---- settings and windows ---------------------------------------------------------------------


def set_window_ms(conn: Conn, window_ms: int) -> bool:
    """Use windows of `window_ms`; when it changed, recount pending rows per window (one
    transaction). True when it changed."""
    (current,) = one(conn, "SELECT window_ms FROM tracker_settings WHERE id = 1")
    if current == window_ms:
        return False
    conn.execute("UPDATE tracker_settings SET window_ms = ? WHERE id = 1", (window_ms,))
    conn.execute("DELETE FROM tracker_windows")
    conn.execute(
        "INSERT INTO tracker_windows(win, pending)"
        " SELECT planned_ms / ?, count(*) FROM tracker_schedules WHERE status = 'pending'"
        " GROUP BY 1",
        (window_ms,),
    )
    return True


def window_ms(conn: Conn) -> int:
    return int(one(conn, "SELECT window_ms FROM tracker_settings WHERE id = 1")[0])


def full_windows(conn: Conn, first: int, last: int, capacity: int) -> set[int]:
    """Indexes of windows in [first, last] already holding `capacity` pending schedules."""
    rows = _all(
        conn,
        "SELECT win FROM tracker_windows WHERE win BETWEEN ? AND ? AND pending >= ?",
        (first, last, capacity),
    )
    return {r[0] for r in rows}


def window_fill(conn: Conn, first: int, count: int) -> dict[int, int]:
    """Pending schedules of the windows [first, first + count) that have any."""
    rows = _all(
        conn,
        "SELECT win, pending FROM tracker_windows WHERE win >= ? AND win < ? AND pending > 0",
        (first, first + count),
    )
    return {w: n for w, n in rows}


def window_fill_at_least(conn: Conn, first: int, last: int, least: int) -> dict[int, int]:
    """Pending schedules of the windows in [first, last] holding at least `least` (≥ 1)."""
    rows = _all(
        conn,
        "SELECT win, pending FROM tracker_windows WHERE win BETWEEN ? AND ? AND pending >= ?",
        (first, last, max(least, 1)),
    )
    return {w: n for w, n in rows}


def drop_empty_windows(conn: Conn, before_window: int) -> None:
    conn.execute("DELETE FROM tracker_windows WHERE win < ? AND pending <= 0", (before_window,))


# ---- schedules ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scheduled:
    outcome: Literal["inserted", "moved", "kept"]
    """inserted: a new row; moved: an active milestone row moved earlier; kept: an active row
    of that type exists (nothing changed)."""
    schedule_id: int
    planned_ms: int


def schedule_snapshot(
    conn: Conn,
    aid: int,
    type_: str,
    at_ms: int,
    *,
    now_ms: int,
    force: bool = False,
    capacity: int,
    rng: random.Random,
    window: int | None = None,
) -> Scheduled:
    """Plan a snapshot of `aid` (specs/tracker.md; reference §3.3).

    With an active (pending or processing) schedule of the same type: a milestone one only moves
    earlier (to `at_ms`); others are kept unless `force`. new and milestone keep their exact time;
    normal and archive go to the first window from `at_ms` with room (`capacity` per window).
    `window` is the window length in ms if the caller knows it is the stored one.
    """
    if type_ not in rules.SCHEDULE_TYPES:
        raise ValueError(f"unknown schedule type {type_!r}")
    active = _first(
        conn,
        "SELECT id, planned_ms, status FROM tracker_schedules"
        " WHERE aid = ? AND type = ? AND status IN ('pending', 'processing')"
        " ORDER BY planned_ms DESC LIMIT 1",
        (aid, type_),
    )
    if active is not None:
        sid, planned, status = active
        if type_ == "milestone":
            if status == "pending" and planned > at_ms:
                conn.execute(
                    "UPDATE tracker_schedules SET planned_ms = ? WHERE id = ?", (at_ms, sid)
                )
                return Scheduled("moved", sid, at_ms)
            return Scheduled("kept", sid, planned)
        if not force:
            return Scheduled("kept", sid, planned)
    planned = at_ms
    if type_ not in rules.EXACT_TIME_TYPES:
        size = window or window_ms(conn)
        first = rules.window_of(at_ms, size)
        last = first + rules.WINDOW_HORIZON_MS // size
        full = full_windows(conn, first, last, capacity)
        planned = rules.windowed_time_ms(at_ms, now_ms, window_ms=size, full=full, rng=rng)
    (sid,) = one(
        conn,
        "INSERT INTO tracker_schedules(aid, type, planned_ms, created_ms) VALUES (?, ?, ?, ?)"
        " RETURNING id",
        (aid, type_, planned, now_ms),
    )
    return Scheduled("inserted", sid, planned)


DUE_SQL = (
    "SELECT id, aid, type, planned_ms FROM tracker_schedules INDEXED BY tracker_schedules_due"
    " WHERE status = 'pending' AND type = ? AND planned_ms BETWEEN ? AND ?"
    " ORDER BY planned_ms LIMIT ?"
)
"""The ticks' due-schedule select, one type at a time (index-only on tracker_schedules_due)."""


def due(conn: Conn, types: Sequence[str], low_ms: int, high_ms: int, limit: int) -> list[Due]:
    """Pending schedules of `types` planned in [low_ms, high_ms], in the order of `types`, then
    by planned time; at most `limit` (one index range scan per type)."""
    found: list[Due] = []
    for type_ in types:
        if len(found) >= limit:
            break
        rows = _all(
            conn,
            DUE_SQL,
            (type_, low_ms, high_ms, limit - len(found)),
        )
        found.extend(rows)
    return found


def busy_aids(conn: Conn, aids: Iterable[int]) -> set[int]:
    """The aids among `aids` with a schedule being processed."""
    busy = set()
    for aid in set(aids):
        row = _first(
            conn,
            "SELECT 1 FROM tracker_schedules WHERE aid = ? AND status = 'processing' LIMIT 1",
            (aid,),
        )
        if row is not None:
            busy.add(aid)
    return busy


def claim(conn: Conn, ids: Sequence[int], now_ms: int, *, claimant: str) -> list[Due]:
    """Mark pending schedules processing by `claimant` (by schedule id); returns the rows it
    claimed. Each row is claimed by one conditional UPDATE: on PostgreSQL a row another
    transaction claimed meanwhile is re-read after its commit and no longer pending, so two
    instances picking the same due rows claim disjoint sets (never one row twice)."""
    if not ids:
        return []
    rows = conn.executemany(
        "UPDATE tracker_schedules SET status = 'processing', started_ms = ?, claimant = ?"
        " WHERE id = ? AND status = 'pending' RETURNING id, aid, type, planned_ms",
        [(now_ms, claimant, sid) for sid in ids],
    )
    return [(sid, aid, type_, planned) for sid, aid, type_, planned in rows]


def finish(
    conn: Conn,
    ids: Sequence[int],
    status: str,
    now_ms: int,
    error: str | None = None,
    *,
    claimant: str,
) -> list[int]:
    """Give schedules still processing by `claimant` their final status; returns the ids that
    were (one reclaimed by another instance, or deleted by cleanup meanwhile, is left alone:
    the caller stores nothing for it)."""
    if status not in rules.SCHEDULE_STATUSES or status in rules.ACTIVE_STATUSES:
        raise ValueError(f"{status!r} is not a final schedule status")
    if not ids:
        return []
    changed = conn.executemany(
        "UPDATE tracker_schedules SET status = ?, finished_ms = ?, error = ?"
        " WHERE id = ? AND status = 'processing' AND claimant = ? RETURNING id",
        [(status, now_ms, error, sid, claimant) for sid in ids],
    )
    return [r[0] for r in changed]


def release(conn: Conn, ids: Sequence[int], *, claimant: str) -> list[int]:
    """Schedules still processing by `claimant` back to pending as they were (planned time
    kept, so they keep their place in the due order): a tick claimed them for a request that
    found no room after all. Returns the ids released."""
    if not ids:
        return []
    changed = conn.executemany(
        "UPDATE tracker_schedules SET status = 'pending', started_ms = NULL, claimant = NULL"
        " WHERE id = ? AND status = 'processing' AND claimant = ? RETURNING id",
        [(sid, claimant) for sid in ids],
    )
    return [r[0] for r in changed]


def recover_processing(conn: Conn, now_ms: int, also: str | None = None) -> int:
    """Schedules processing by a claimant that is no live member (a dead or paused process),
    and those of `also` (this process, when it stopped its own ticks), run again now
    (pending)."""
    conn.execute(
        "UPDATE tracker_schedules SET status = 'pending', started_ms = NULL, claimant = NULL,"
        " planned_ms = ? WHERE status = 'processing' AND (claimant IS NULL OR claimant = ?"
        f" OR claimant NOT IN {LIVE_CLAIMANTS})",
        (now_ms, also),
    )
    return conn.changes()


def release_claims(conn: Conn, claimant: str, now_ms: int) -> int:
    """This process's processing schedules back to pending, planned now (its ticks stopped)."""
    conn.execute(
        "UPDATE tracker_schedules SET status = 'pending', started_ms = NULL, claimant = NULL,"
        " planned_ms = ? WHERE status = 'processing' AND claimant = ?",
        (now_ms, claimant),
    )
    return conn.changes()


def claims(conn: Conn) -> dict[str, int]:
    """Processing schedules by claimant (what /status shows per instance)."""
    rows = _all(
        conn,
        "SELECT coalesce(claimant, ''), count(*) FROM tracker_schedules"
        " INDEXED BY tracker_schedules_processing WHERE status = 'processing' GROUP BY 1",
    )
    return {c: n for c, n in rows}


def cleanup(conn: Conn, before_ms: int) -> int:
    """Delete pending and processing schedules planned before `before_ms`."""
    ids = [
        r[0]
        for t in rules.SCHEDULE_TYPES
        for r in _all(
            conn,
            "SELECT id FROM tracker_schedules INDEXED BY tracker_schedules_due"
            " WHERE status = 'pending' AND type = ? AND planned_ms < ?",
            (t, before_ms),
        )
    ]
    ids += [
        r[0]
        for r in _all(
            conn,
            "SELECT id FROM tracker_schedules WHERE status = 'processing' AND planned_ms < ?",
            (before_ms,),
        )
    ]
    conn.executemany("DELETE FROM tracker_schedules WHERE id = ?", ((i,) for i in ids))
    return len(ids)


def schedule_counts(conn: Conn) -> dict[str, dict[str, int]]:
    """Schedule rows by type × status (kept by a trigger, so this never scans the schedules)."""
    counts: dict[str, dict[str, int]] = {t: {} for t in rules.SCHEDULE_TYPES}
    for type_, status, n in _all(
        conn, "SELECT type, status, n FROM tracker_schedule_counts WHERE n > 0"
    ):
        counts.setdefault(type_, {})[status] = n
    return counts


def pending_schedules(conn: Conn, aid: int) -> list[dict[str, Any]]:
    rows = _all(
        conn,
        "SELECT id, type, status, planned_ms, created_ms FROM tracker_schedules"
        " WHERE aid = ? AND status IN ('pending', 'processing') ORDER BY planned_ms",
        (aid,),
    )
    keys = ("id", "type", "status", "planned_ms", "created_ms")
    return [dict(zip(keys, r, strict=True)) for r in rows]


def next_schedule_ms(conn: Conn, aid: int) -> int | None:
    row = _first(
        conn,
        "SELECT min(planned_ms) FROM tracker_schedules"
        " WHERE aid = ? AND status IN ('pending', 'processing')",
        (aid,),
    )
    return None if row is None else row[0]


def without_active(conn: Conn, type_: str, *, songs: bool, after_aid: int, limit: int) -> list[int]:
    """Aids (songs, or videos that are not songs) in order after `after_aid` with no active
    schedule of `type_` and status 0 (a gone video is not scheduled again)."""
    source = (
        "tracker_songs v JOIN tracker_videos m ON m.aid = v.aid"
        if songs
        else "tracker_videos v LEFT JOIN tracker_songs s ON s.aid = v.aid"
    )
    extra = "" if songs else " AND s.aid IS NULL"
    rows = _all(
        conn,
        f"SELECT v.aid FROM {source} WHERE v.aid > ?{extra}"
        f" AND {'m' if songs else 'v'}.status = 0 AND NOT EXISTS (SELECT 1 FROM"
        " tracker_schedules x WHERE x.aid = v.aid AND x.type = ?"
        " AND x.status IN ('pending', 'processing')) ORDER BY v.aid LIMIT ?",
        (after_aid, type_, limit),
    )
    return [r[0] for r in rows]


# ---- snapshots --------------------------------------------------------------------------------


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


def _in(count: int) -> str:
    return "(" + ",".join("?" * count) + ")"


def complete_bulk(
    conn: Conn,
    group: Sequence[Due],
    stats: Mapping[int, Stat],
    at_ms: int,
    now_ms: int,
    *,
    capacity: int,
    rng: random.Random,
    window: int | None = None,
    claimant: str,
) -> list[tuple[str, int]]:
    """Store one bulk answer (taken at `at_ms`) for a group of schedules claimed by `claimant`,
    in the caller's transaction: per schedule still processing by it, the snapshot, the ETA
    row (from the previous snapshot), the schedule completed, and, unless it is an archive
    one, the next normal schedule at the regular interval placed in the first window with room
    (schedule_snapshot's rules; an aid with an active normal schedule keeps it). A schedule
    whose aid is missing from `stats` fails. Returns (type, lag ms) of each completed schedule.

    The work is set-based: one statement (or one executemany) per kind for the whole group, the
    per-row decisions made in Python over what those reads returned, in group order, exactly as
    if each schedule were completed by itself one after the other. A schedule no longer
    processing by `claimant` (reclaimed from a process that was paused too long) is skipped:
    its snapshot is another claimant's to store."""
    held = set(
        finish(
            conn,
            [sid for sid, aid, _, _ in group if aid in stats],
            "completed",
            now_ms,
            claimant=claimant,
        )
    )
    failed = [sid for sid, aid, _, _ in group if aid not in stats]
    finish(conn, failed, "failed", now_ms, "missing from the bulk answer", claimant=claimant)
    group = [row for row in group if row[0] in held]
    aids = list(dict.fromkeys(aid for _, aid, _, _ in group))
    latest_of: dict[int, Snap] = {}
    stored: set[int] = set()
    if aids:
        for aid, at, views in conn.execute(
            f"SELECT aid, at_ms, views FROM tracker_latest WHERE aid IN {_in(len(aids))}", aids
        ):
            latest_of[aid] = Snap(at, views)
        stored = {
            r[0]
            for r in conn.execute(
                f"SELECT aid FROM tracker_snapshots WHERE aid IN {_in(len(aids))} AND at_ms = ?",
                (*aids, at_ms),
            )
        }
    snapshot_rows: list[tuple[int, ...]] = []
    eta_rows: list[tuple[Any, ...]] = []
    chain: list[tuple[int, Snap]] = []
    done: list[tuple[str, int]] = []
    for _, aid, type_, planned in group:
        stat = stats[aid]
        previous = latest_of.get(aid)
        current = Snap(at_ms, stat.views)
        if aid not in stored:
            stored.add(aid)
            snapshot_rows.append(_snapshot_row(aid, at_ms, stat))
            if previous is None or at_ms >= previous.at_ms:
                latest_of[aid] = current
            eta = rules.bulk_eta(previous, current)
            if eta is not None:
                eta_rows.append((aid, min(eta[0], 1e300), eta[1], stat.views, now_ms))
        if type_ != "archive":
            newest = current if previous is None or current.at_ms >= previous.at_ms else previous
            chain.append((aid, newest))
        done.append((type_, max(at_ms - planned, 0)))
    if snapshot_rows:
        conn.executemany(_SNAPSHOT_INSERT, snapshot_rows)
    if eta_rows:
        conn.executemany(_ETA_UPSERT, eta_rows)
    if chain:
        _chain_normal(conn, chain, now_ms, capacity=capacity, rng=rng, window=window)
    return done


def _chain_normal(
    conn: Conn,
    chain: Sequence[tuple[int, Snap]],
    now_ms: int,
    *,
    capacity: int,
    rng: random.Random,
    window: int | None,
) -> None:
    """The next normal schedule of each (aid, its newest snapshot), at its regular interval."""
    cut = now_ms - rules.REGULAR_LOOKBACK_MS
    binds = [(aid, cut) for aid in dict.fromkeys(aid for aid, _ in chain)]
    before = {
        aid: Snap(at, views)
        for aid, at, views in conn.executemany(
            "SELECT ?1, at_ms, views FROM tracker_snapshots WHERE aid = ?1 AND at_ms <= ?2"
            " ORDER BY at_ms DESC LIMIT 1",
            binds,
        )
    }
    lacking = [(aid, at) for aid, at in binds if aid not in before]  # regular_base's fallback
    after = {
        aid: Snap(at, views)
        for aid, at, views in (
            conn.executemany(
                "SELECT ?1, at_ms, views FROM tracker_snapshots WHERE aid = ?1 AND at_ms > ?2"
                " ORDER BY at_ms LIMIT 1",
                lacking,
            )
            if lacking
            else ()
        )
    }
    active = {
        r[0]
        for r in conn.executemany(
            "SELECT ?1 FROM tracker_schedules WHERE aid = ?1 AND type = 'normal'"
            " AND status IN ('pending', 'processing') LIMIT 1",
            [(aid,) for aid, _ in binds],
        )
    }
    targets: list[tuple[int, int]] = []
    for aid, newest in chain:
        if aid in active:
            continue
        active.add(aid)
        base = rules.regular_base(before.get(aid), after.get(aid))
        hours = rules.regular_interval_hours(base, newest)
        targets.append((aid, now_ms + int(hours * rules.HOUR)))
    if not targets:
        return
    size = window or window_ms(conn)
    first = rules.window_of(min(t for _, t in targets), size)
    last = rules.window_of(max(t for _, t in targets), size) + rules.WINDOW_HORIZON_MS // size
    fill = window_fill_at_least(conn, first, last, capacity - len(targets))
    planned = rules.place_in_windows(
        [t for _, t in targets], now_ms, window_ms=size, fill=fill, capacity=capacity, rng=rng
    )
    conn.executemany(
        "INSERT INTO tracker_schedules(aid, type, planned_ms, created_ms)"
        " VALUES (?, 'normal', ?, ?)",
        [(aid, at, now_ms) for (aid, _), at in zip(targets, planned, strict=True)],
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


# ---- milestone candidates -----------------------------------------------------------------------


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


# ---- videos, users, ingest ------------------------------------------------------------------


def known_aids(conn: Conn, aids: Iterable[int]) -> set[int]:
    """The aids among `aids` already stored or waiting for ingest."""
    known = set()
    for aid in set(aids):
        if _first(
            conn,
            "SELECT 1 FROM tracker_videos WHERE aid = ? UNION ALL"
            " SELECT 1 FROM tracker_ingest WHERE aid = ? LIMIT 1",
            (aid, aid),
        ):
            known.add(aid)
    return known


def enqueue_ingest(conn: Conn, aids: Sequence[int], source: str, now_ms: int) -> list[int]:
    """Queue unseen aids for ingest; returns the ones queued."""
    known = known_aids(conn, aids)
    queued = []
    for aid in aids:
        if aid in known or aid in queued:
            continue
        conn.execute(
            "INSERT INTO tracker_ingest(aid, added_ms, next_ms, source) VALUES (?, ?, ?, ?)",
            (aid, now_ms, now_ms, source),
        )
        queued.append(aid)
    return queued


def due_ingest(conn: Conn, now_ms: int, limit: int) -> list[tuple[int, int]]:
    """(aid, attempts so far) of queued ingests due now, oldest first."""
    rows = _all(
        conn,
        "SELECT aid, attempts FROM tracker_ingest WHERE next_ms <= ? ORDER BY next_ms LIMIT ?",
        (now_ms, limit),
    )
    return [(a, n) for a, n in rows]


def next_ingest_ms(conn: Conn) -> int | None:
    row = _first(conn, "SELECT min(next_ms) FROM tracker_ingest")
    return None if row is None else row[0]


def ingest_failed(conn: Conn, aid: int, error: str, retry_at_ms: int | None) -> None:
    """Count a failed ingest; retry at `retry_at_ms`, or drop the aid (None)."""
    if retry_at_ms is None:
        conn.execute("DELETE FROM tracker_ingest WHERE aid = ?", (aid,))
        return
    conn.execute(
        "UPDATE tracker_ingest SET attempts = attempts + 1, next_ms = ?, last_error = ?"
        " WHERE aid = ?",
        (retry_at_ms, error[:500], aid),
    )


def delay_ingest(conn: Conn, aid: int, at_ms: int) -> None:
    """Try again at `at_ms` without counting an attempt (no proxy was free)."""
    conn.execute("UPDATE tracker_ingest SET next_ms = ? WHERE aid = ?", (at_ms, aid))


def store_video(conn: Conn, detail: VideoDetail, at_ms: int, now_ms: int) -> None:
    """Ingest: the metadata, the uploader (upserted by uid) and the first snapshot (taken at
    `at_ms`, the server time of the answer); the aid leaves the ingest queue."""
    conn.execute(
        "INSERT INTO tracker_videos(aid, bvid, title, description, tags, duration,"
        " published_ms, cover_url, uid, status, added_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?)"
        " ON CONFLICT(aid) DO UPDATE SET bvid = excluded.bvid, title = excluded.title,"
        " description = excluded.description, tags = excluded.tags,"
        " duration = excluded.duration, published_ms = excluded.published_ms,"
        " cover_url = excluded.cover_url, uid = excluded.uid, status = 0",
        (
            detail.aid,
            detail.bvid,
            detail.title,
            detail.description,
            _encode(detail.tags),
            detail.duration,
            detail.published_ms,
            detail.cover_url,
            detail.uploader.uid,
            now_ms,
        ),
    )
    up = detail.uploader
    conn.execute(
        "INSERT INTO tracker_users(uid, name, sign, fans, face, updated_ms)"
        " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(uid) DO UPDATE SET name = excluded.name,"
        " sign = excluded.sign, fans = excluded.fans, face = excluded.face,"
        " updated_ms = excluded.updated_ms",
        (up.uid, up.name, up.sign, up.fans, up.face, now_ms),
    )
    insert_snapshot(conn, detail.aid, at_ms, detail.stat)
    conn.execute("DELETE FROM tracker_ingest WHERE aid = ?", (detail.aid,))


def store_gone_video(conn: Conn, aid: int, code: int, now_ms: int) -> None:
    """Ingest answered with an error code: remember the aid with that status (seen, not
    tracked) and take it off the ingest queue."""
    conn.execute(
        "INSERT INTO tracker_videos(aid, status, added_ms) VALUES (?, ?, ?)"
        " ON CONFLICT(aid) DO UPDATE SET status = excluded.status",
        (aid, code, now_ms),
    )
    conn.execute("DELETE FROM tracker_ingest WHERE aid = ?", (aid,))


def set_video_status(conn: Conn, aid: int, code: int) -> None:
    conn.execute("UPDATE tracker_videos SET status = ? WHERE aid = ?", (code, aid))


def video_status(conn: Conn, aid: int) -> int | None:
    row = _first(conn, "SELECT status FROM tracker_videos WHERE aid = ?", (aid,))
    return None if row is None else row[0]


def statuses(conn: Conn, aids: Iterable[int]) -> dict[int, int]:
    found = {}
    for aid in set(aids):
        row = _first(conn, "SELECT status FROM tracker_videos WHERE aid = ?", (aid,))
        if row is not None:
            found[aid] = row[0]
    return found


def published_ms(conn: Conn, aid: int) -> int | None:
    row = _first(conn, "SELECT published_ms FROM tracker_videos WHERE aid = ?", (aid,))
    return None if row is None else row[0]


@dataclass(frozen=True)
class VideoText:
    aid: int
    title: str
    description: str
    tags: list[str]


def unlabelled(conn: Conn, after_aid: int, limit: int) -> list[VideoText]:
    """Ingested videos (status 0) without a label of any model version, by aid."""
    rows = _all(
        conn,
        "SELECT aid, title, description, tags FROM tracker_videos v INDEXED BY"
        " tracker_videos_unlabelled WHERE status = 0 AND title IS NOT NULL AND aid > ?"
        " AND NOT EXISTS (SELECT 1 FROM tracker_labels l WHERE l.aid = v.aid)"
        " ORDER BY aid LIMIT ?",
        (after_aid, limit),
    )
    return [VideoText(a, t or "", d or "", _decode_list(tags or "[]")) for a, t, d, tags in rows]


def video_text(conn: Conn, aid: int) -> VideoText | None:
    row = _first(
        conn,
        "SELECT title, description, tags FROM tracker_videos WHERE aid = ? AND title IS NOT NULL",
        (aid,),
    )
    if row is None:
        return None
    return VideoText(aid, row[0] or "", row[1] or "", _decode_list(row[2] or "[]"))


def store_label(
    conn: Conn,
    aid: int,
    label: int,
    probabilities: Sequence[float],
    model_version: str,
    now_ms: int,
) -> bool:
    """Store a labelling result (unique per aid and model version); a song (label ≠ 0) that is
    not in songs yet is added. True when the song was added now."""
    conn.execute(
        "INSERT INTO tracker_labels(aid, model_version, label, probabilities, created_ms)"
        " VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
        (aid, model_version, label, _encode(list(probabilities)), now_ms),
    )
    if label == 0:
        return False
    conn.execute(
        "INSERT INTO tracker_songs(aid, label, added_ms) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
        (aid, label, now_ms),
    )
    return conn.changes() == 1


def is_song(conn: Conn, aid: int) -> bool:
    return _first(conn, "SELECT 1 FROM tracker_songs WHERE aid = ?", (aid,)) is not None


def video_info(conn: Conn, aid: int) -> dict[str, Any] | None:
    """What `GET /tracker/videos/{aid}` shows, or None for an unknown aid."""
    row = _first(
        conn,
        "SELECT v.aid, v.bvid, v.title, v.description, v.tags, v.duration, v.published_ms,"
        " v.cover_url, v.status, v.added_ms, u.uid, u.name, u.sign, u.fans, u.face"
        " FROM tracker_videos v LEFT JOIN tracker_users u ON u.uid = v.uid WHERE v.aid = ?",
        (aid,),
    )
    if row is None:
        queued = _first(
            conn, "SELECT added_ms, attempts, last_error FROM tracker_ingest WHERE aid = ?", (aid,)
        )
        if queued is None:
            return None
        return {"aid": aid, "status": "queued", "ingest": {"added_ms": queued[0],
                "attempts": queued[1], "last_error": queued[2]}}  # fmt: skip
    (aid, bvid, title, desc, tags, duration, pub, cover, status, added, uid, name, sign, fans,
     face) = row  # fmt: skip
    label_row = _first(
        conn,
        "SELECT label, model_version, probabilities, created_ms FROM tracker_labels"
        " WHERE aid = ? ORDER BY created_ms DESC LIMIT 1",
        (aid,),
    )
    snap = _first(
        conn,
        "SELECT at_ms, views, danmakus, replies, likes, coins, shares, favorites"
        " FROM tracker_latest WHERE aid = ?",
        (aid,),
    )
    eta = _first(conn, "SELECT eta_hours, speed, updated_ms FROM tracker_eta WHERE aid = ?", (aid,))
    info: dict[str, Any] = {
        "aid": aid,
        "bvid": bvid,
        "title": title,
        "description": desc,
        "tags": _decode_list(tags) if tags else [],
        "duration": duration,
        "published_ms": pub,
        "cover_url": cover,
        "status": "ok" if status == 0 else status,
        "added_ms": added,
        "uploader": None
        if uid is None
        else {"uid": uid, "name": name, "sign": sign, "fans": fans, "face": face},
        "song": is_song(conn, aid),
        "label": None,
        "latest_snapshot": None,
        "schedules": pending_schedules(conn, aid),
        "milestone": None,
    }
    if label_row is not None:
        info["label"] = {
            "label": label_row[0],
            "model_version": label_row[1],
            "probabilities": _decode_list(label_row[2]),
            "at_ms": label_row[3],
        }
    if snap is not None:
        keys = ("at_ms", "views", "danmakus", "replies", "likes", "coins", "shares", "favorites")
        info["latest_snapshot"] = dict(zip(keys, snap, strict=True))
        target = rules.closest_milestone(snap[1])
        speed = eta[1] if eta is not None else None
        info["milestone"] = {
            "target": target,
            "views_to_go": target - snap[1],
            "speed_per_hour": speed,
            "eta_hours": (target - snap[1]) / speed if speed else None,
            "eta_row": None
            if eta is None
            else {
                "eta_hours": eta[0],
                "target": rules.closest_milestone(snap[1], strict=True),
                "updated_ms": eta[2],
            },
        }
    return info


def totals(conn: Conn) -> dict[str, int]:
    """Videos, songs and queued ingests (counted by their primary keys)."""
    (videos,) = one(conn, "SELECT count(*) FROM tracker_videos")
    (songs,) = one(conn, "SELECT count(*) FROM tracker_songs")
    (queued,) = one(conn, "SELECT count(*) FROM tracker_ingest")
    (gone,) = one(
        conn, "SELECT count(*) FROM tracker_videos INDEXED BY tracker_videos_gone WHERE status <> 0"
    )
    return {"videos": videos, "songs": songs, "ingest_queued": queued, "videos_gone": gone}


def search_videos(conn: Conn, query: str, limit: int) -> list[dict[str, Any]]:
    """Tracked videos matching `query` (an aid, avNNN, or words of the title or uploader name),
    newest first, with their latest views and whether they are songs (the console's search)."""
    text = query.strip()
    digits = text[2:] if text.lower().startswith("av") else text
    aid = int(digits) if digits.isascii() and digits.isdigit() and len(digits) < 19 else -1
    pattern = "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    rows = _all(
        conn,
        "SELECT v.aid, v.title, u.name, l.views, l.at_ms, v.status,"
        " EXISTS (SELECT 1 FROM tracker_songs s WHERE s.aid = v.aid)"
        " FROM tracker_videos v LEFT JOIN tracker_users u ON u.uid = v.uid"
        " LEFT JOIN tracker_latest l ON l.aid = v.aid"
        " WHERE ? = '' OR v.aid = ? OR lower(v.title) LIKE lower(?) ESCAPE '\\'"
        " OR lower(u.name) LIKE lower(?) ESCAPE '\\'"
        " ORDER BY v.added_ms DESC, v.aid DESC LIMIT ?",
        (text, aid, pattern, pattern, limit),
    )
    return [
        {"aid": a, "title": t, "uploader": n, "views": vw, "last_snapshot_ms": at,
         "status": st, "song": bool(song)}
        for a, t, n, vw, at, st, song in rows
    ]  # fmt: skip
