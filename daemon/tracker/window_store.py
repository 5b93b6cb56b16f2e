# The time windows the schedules are spread over (tracker_settings, tracker_windows): the
# window size and the pending rows per window, which a trigger keeps in step with the schedule
# rows and the placement of new schedules reads. Functions over a connection inside a caller's
# transaction, like the rest of the tracker's store (daemon/tracker/store.py).
from __future__ import annotations

from daemon.store import Conn, one
from daemon.tracker.base_store import _all


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
