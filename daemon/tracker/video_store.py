# Videos, their uploaders and labels, and the ingest queue discovered aids wait in: what ingest
# and classification write, and what a video's page, the totals and the console's search read
# (with the video's pending schedules). Functions over a connection inside a caller's
# transaction, like the rest of the tracker's store (daemon/tracker/store.py).
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from daemon.store import Conn, one
from daemon.tracker import rules
from daemon.tracker.base_store import _all, _decode_list, _encode, _first
from daemon.tracker.bilibili import VideoDetail
from daemon.tracker.snapshot_store import insert_snapshot

# ---- videos, users, ingest ----


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


# ---- a video's schedules ----


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
