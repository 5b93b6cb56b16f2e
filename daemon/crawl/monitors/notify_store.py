# The monitor_notifications table (migration 0019) as plain functions over a store connection, in
# the SQL both backends share. A row is written in the transaction that finishes its check (a
# crash never loses it) and wakes the deliverers through the store's wake-ups (whichever cluster
# member commits it); a deliverer claims a due row by a compare-and-set on its next_ms, moving it
# past the attempt's longest time, so one instance sends it, and a deliverer that died is
# replaced once that time passes. An outcome is written only by the claim's holder (same next_ms):
# a row is never both sent and retried.
from __future__ import annotations

from typing import Any

import msgspec

from daemon.store import Conn, in_list, one, wake

WAKE_KEY = "monitor-notifications"
"""The key of the store wake-up (channel APPENDED) a new or retried row fires."""


class NotificationRow(msgspec.Struct, frozen=True):
    check_id: str
    channel: str
    monitor_id: str
    state: str
    attempts: int
    next_ms: int
    message: bytes
    error: str | None


_SELECT = ("SELECT check_id, channel, monitor_id, state, attempts, next_ms, message, error"
           " FROM monitor_notifications")  # fmt: skip


def _row(r: Any) -> NotificationRow:
    return NotificationRow(r[0], r[1], r[2], r[3], r[4], r[5], bytes(r[6]), r[7])


def insert(conn: Conn, check_id: str, monitor_id: str, channel: str, message: bytes,
           at_ms: int) -> None:  # fmt: skip
    """Record a pending notification, due now (once per check and channel)."""
    conn.execute(
        "INSERT INTO monitor_notifications(check_id, channel, monitor_id, state, attempts,"
        " next_ms, message, created_ms, updated_ms) VALUES (?, ?, ?, 'pending', 0, ?, ?, ?, ?)"
        " ON CONFLICT DO NOTHING",
        (check_id, channel, monitor_id, at_ms, message, at_ms, at_ms),
    )
    wake.notify(conn, wake.APPENDED, WAKE_KEY)


def due(conn: Conn, now_ms: int, limit: int) -> list[NotificationRow]:
    rows: list[Any] = conn.execute(
        f"{_SELECT} WHERE state = 'pending' AND next_ms <= ? ORDER BY next_ms LIMIT ?",
        (now_ms, limit),
    ).fetchall()
    return [_row(r) for r in rows]


def earliest(conn: Conn) -> int | None:
    (at,) = one(conn, "SELECT min(next_ms) FROM monitor_notifications WHERE state = 'pending'")
    return None if at is None else int(at)


def claim(conn: Conn, row: NotificationRow, until_ms: int) -> bool:
    """Hold the row until `until_ms` if nobody claimed it since it was read."""
    conn.execute(
        "UPDATE monitor_notifications SET next_ms = ? WHERE check_id = ? AND channel = ?"
        " AND state = 'pending' AND next_ms = ?",
        (until_ms, row.check_id, row.channel, row.next_ms),
    )
    return bool(conn.changes())


def outcome(conn: Conn, row: NotificationRow, held_until_ms: int, *, state: str, attempts: int,
            next_ms: int, error: str | None, at_ms: int) -> bool:  # fmt: skip
    """Write an attempt's outcome (state `sent`, `failed`, or `pending` with its next time) if
    the claim (`held_until_ms`) is still this one's."""
    conn.execute(
        "UPDATE monitor_notifications SET state = ?, attempts = ?, next_ms = ?, error = ?,"
        " updated_ms = ? WHERE check_id = ? AND channel = ? AND state = 'pending'"
        " AND next_ms = ?",
        (state, attempts, next_ms, error, at_ms, row.check_id, row.channel, held_until_ms),
    )
    changed = bool(conn.changes())
    if changed and state == "pending":
        wake.notify(conn, wake.APPENDED, WAKE_KEY)
    return changed


def states(conn: Conn, check_ids: list[str]) -> dict[str, dict[str, str]]:
    """{check id: {channel: state}} of the given checks."""
    found: dict[str, dict[str, str]] = {}
    if not check_ids:
        return found
    for start in range(0, len(check_ids), 100):
        chunk = check_ids[start : start + 100]
        rows: list[Any] = conn.execute(
            "SELECT check_id, channel, state FROM monitor_notifications"
            f" WHERE check_id IN {in_list(len(chunk))}",
            tuple(chunk),
        ).fetchall()
        for check_id, channel, state in rows:
            found.setdefault(str(check_id), {})[str(channel)] = str(state)
    return found
