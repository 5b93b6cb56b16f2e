# The tracker's tables (migration 0004) as plain functions over an APSW connection. They run
# inside a caller's transaction (the store's writer, or a reader's snapshot), so a snapshot, the
# schedule it completes and the schedule it chains always change together; nothing here knows
# about trio. (The limiter state is the network side's: daemon/tracker/limiter_store.py.)
#
# This module holds the schedule rows (planning, the due query, claims, completion, cleanup) and
# the bulk completion, and gathers the rest under one name (`ts.<function>`): the windows
# (window_store.py), the snapshots and ETAs (snapshot_store.py), the videos and the ingest queue
# (video_store.py), and their shared helpers (base_store.py).
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

from daemon.cluster import LIVE_CLAIMANTS
from daemon.store import Conn, in_list, one
from daemon.tracker import rules
from daemon.tracker.base_store import Due, _all, _first
from daemon.tracker.bilibili import Stat
from daemon.tracker.rules import Snap
from daemon.tracker.snapshot_store import (
    _ETA_UPSERT,
    _SNAPSHOT_INSERT,
    _snapshot_row,
    closest_to_milestone,
    count_snapshots,
    eta_of,
    insert_snapshot,
    latest,
    milestone_candidates,
    nearest_snapshot,
    regular_interval_hours,
    snapshot_after,
    snapshot_at_or_before,
    snapshots,
    upsert_eta,
)
from daemon.tracker.video_store import (
    VideoText,
    delay_ingest,
    due_ingest,
    enqueue_ingest,
    ingest_failed,
    is_song,
    known_aids,
    next_ingest_ms,
    next_schedule_ms,
    pending_schedules,
    published_ms,
    search_videos,
    set_video_status,
    statuses,
    store_gone_video,
    store_label,
    store_video,
    totals,
    unlabelled,
    video_info,
    video_status,
    video_text,
)
from daemon.tracker.window_store import (
    drop_empty_windows,
    full_windows,
    set_window_ms,
    window_fill,
    window_fill_at_least,
    window_ms,
)

__all__ = [  # the names callers use as `ts.<name>`, wherever they are defined
    "DUE_SQL", "Due", "Scheduled", "VideoText", "busy_aids", "claim", "claims", "cleanup",
    "closest_to_milestone", "complete_bulk", "count_snapshots", "delay_ingest",
    "drop_empty_windows", "due", "due_ingest", "enqueue_ingest", "eta_of", "finish",
    "full_windows", "ingest_failed", "insert_snapshot", "is_song", "known_aids", "latest",
    "milestone_candidates", "nearest_snapshot", "next_ingest_ms", "next_schedule_ms",
    "pending_schedules", "published_ms", "recover_processing", "regular_interval_hours",
    "release", "release_claims", "schedule_counts", "schedule_snapshot", "search_videos",
    "set_video_status", "set_window_ms", "snapshot_after", "snapshot_at_or_before",
    "snapshots", "statuses", "store_gone_video", "store_label", "store_video", "totals",
    "unlabelled", "upsert_eta", "video_info", "video_status", "video_text", "window_fill",
    "window_fill_at_least", "window_ms", "without_active",
]  # fmt: skip


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


# ---- the bulk tick's completion ----


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
            f"SELECT aid, at_ms, views FROM tracker_latest WHERE aid IN {in_list(len(aids))}", aids
        ):
            latest_of[aid] = Snap(at, views)
        stored = {
            r[0]
            for r in conn.execute(
                "SELECT aid FROM tracker_snapshots"
                f" WHERE aid IN {in_list(len(aids))} AND at_ms = ?",
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
