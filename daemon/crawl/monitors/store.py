# The monitor tables (migration 0017) as plain functions over a store connection, in the SQL both
# backends share. They run inside the caller's transaction: a page's status, its snapshot and its
# `monitor.page` event commit together, so a check resumed after a crash neither loses a page nor
# counts (or announces) one twice; the scheduler's claim of a due monitor is a compare-and-set on
# its next_run_ms, so one instance of a cluster creates each check.
from __future__ import annotations

from typing import Any

import msgspec

from daemon.store import Conn, one, wake

_encode = msgspec.json.Encoder().encode
OPEN = ("queued", "running")


def _b(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


class MonitorRow(msgspec.Struct, frozen=True):
    id: str
    name: str
    status: str
    spec: bytes
    due_ms: int | None
    next_run_ms: int | None
    last_run_ms: int | None
    current_check: str | None
    last_summary: bytes | None
    created_ms: int
    updated_ms: int


class CheckRow(msgspec.Struct, frozen=True):
    id: str
    monitor_id: str
    status: str
    trigger: str
    spec: bytes
    kicked_off: bool
    scheduled_ms: int | None
    started_ms: int | None
    finished_ms: int | None
    summary: bytes | None
    target_results: bytes | None
    error: str | None
    created_ms: int
    updated_ms: int

    @property
    def job_id(self) -> str:
        return self.id


class PageRow(msgspec.Struct, frozen=True):
    n: int
    target_id: str
    key: str
    url: str
    state: str
    status: str | None
    status_code: int | None
    previous_scrape: str | None
    current_scrape: str | None
    error: str | None
    diff: bytes | None
    created_ms: int
    metadata: bytes | None = None
    judgment: bytes | None = None
    snapshot: bytes | None = None
    """The page's current JSON extraction (a target asking for the json format)."""


class Snapshot(msgspec.Struct, frozen=True):
    key: str
    url: str
    scrape_id: str
    markdown: str
    gone: bool


_MONITOR = (
    "SELECT id, name, status, spec, due_ms, next_run_ms, last_run_ms, current_check,"
    " last_summary, created_ms, updated_ms FROM monitors"
)
_CHECK = (
    "SELECT id, monitor_id, status, trigger_kind, spec, kicked_off, scheduled_ms, started_ms,"
    " finished_ms, summary, target_results, error, created_ms, updated_ms FROM monitor_checks"
)
_PAGE = (
    "SELECT n, target_id, key, url, state, status, status_code, previous_scrape, current_scrape,"
    " error, diff, created_ms, metadata, judgment, snapshot FROM monitor_pages"
)


def _monitor(r: Any) -> MonitorRow:
    return MonitorRow(r[0], r[1], r[2], bytes(r[3]), r[4], r[5], r[6], r[7], _b(r[8]), r[9], r[10])


def _check(r: Any) -> CheckRow:
    return CheckRow(r[0], r[1], r[2], r[3], bytes(r[4]), bool(r[5]), r[6], r[7], r[8], _b(r[9]),
                    _b(r[10]), r[11], r[12], r[13])  # fmt: skip


def _page(r: Any) -> PageRow:
    return PageRow(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], _b(r[10]), r[11],
                   _b(r[12]), _b(r[13]), _b(r[14]))  # fmt: skip


# -- monitors ----------------------------------------------------------------------------------


def insert_monitor(conn: Conn, row: MonitorRow) -> None:
    conn.execute(
        "INSERT INTO monitors(id, name, status, spec, due_ms, next_run_ms, created_ms, updated_ms)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (row.id, row.name, row.status, row.spec, row.due_ms, row.next_run_ms, row.created_ms,
         row.updated_ms),
    )  # fmt: skip


def get_monitor(conn: Conn, monitor_id: str) -> MonitorRow | None:
    row = conn.execute(f"{_MONITOR} WHERE id = ?", (monitor_id,)).fetchone()
    return None if row is None else _monitor(row)


def list_monitors(conn: Conn, limit: int, offset: int) -> list[MonitorRow]:
    rows: list[Any] = conn.execute(
        f"{_MONITOR} ORDER BY created_ms DESC, id LIMIT ? OFFSET ?", (limit, offset)
    ).fetchall()
    return [_monitor(r) for r in rows]


def update_monitor(
    conn: Conn, monitor_id: str, *, name: str, status: str, spec: bytes,
    due_ms: int | None, next_run_ms: int | None, at_ms: int,
) -> None:  # fmt: skip
    conn.execute(
        "UPDATE monitors SET name = ?, status = ?, spec = ?, due_ms = ?, next_run_ms = ?,"
        " updated_ms = ? WHERE id = ?",
        (name, status, spec, due_ms, next_run_ms, at_ms, monitor_id),
    )


def delete_monitor(conn: Conn, monitor_id: str) -> bool:
    """The monitor, its checks (their pages and notifications) and its snapshots; False when
    there was none."""
    conn.execute(
        "DELETE FROM monitor_pages WHERE check_id IN"
        " (SELECT id FROM monitor_checks WHERE monitor_id = ?)",
        (monitor_id,),
    )
    conn.execute("DELETE FROM monitor_checks WHERE monitor_id = ?", (monitor_id,))
    conn.execute("DELETE FROM monitor_notifications WHERE monitor_id = ?", (monitor_id,))
    conn.execute("DELETE FROM monitor_snapshots WHERE monitor_id = ?", (monitor_id,))
    conn.execute("DELETE FROM monitors WHERE id = ?", (monitor_id,))
    return bool(conn.changes())


def due_monitors(conn: Conn, now_ms: int, limit: int) -> list[MonitorRow]:
    rows: list[Any] = conn.execute(
        f"{_MONITOR} WHERE status = 'active' AND next_run_ms <= ? ORDER BY next_run_ms LIMIT ?",
        (now_ms, limit),
    ).fetchall()
    return [_monitor(r) for r in rows]


def earliest_run_ms(conn: Conn) -> int | None:
    (at,) = one(conn, "SELECT min(next_run_ms) FROM monitors WHERE status = 'active'")
    return None if at is None else int(at)


def claim(
    conn: Conn, monitor_id: str, seen_next_run_ms: int, *, due_ms: int | None,
    next_run_ms: int | None, check_id: str | None, at_ms: int,
) -> bool:  # fmt: skip
    """Move a due monitor to its next time (and, with `check_id`, make that its current check)
    if its next_run_ms is still `seen_next_run_ms`; False when another instance (or an update)
    got there first."""
    if check_id is None:
        conn.execute(
            "UPDATE monitors SET due_ms = ?, next_run_ms = ? WHERE id = ? AND next_run_ms = ?",
            (due_ms, next_run_ms, monitor_id, seen_next_run_ms),
        )
    else:
        conn.execute(
            "UPDATE monitors SET due_ms = ?, next_run_ms = ?, current_check = ?, last_run_ms = ?"
            " WHERE id = ? AND next_run_ms = ? AND current_check IS NULL",
            (due_ms, next_run_ms, check_id, at_ms, monitor_id, seen_next_run_ms),
        )
    return bool(conn.changes())


def start_manual(conn: Conn, monitor_id: str, check_id: str, at_ms: int) -> bool:
    """Make `check_id` the monitor's current check unless one is; False when one is."""
    conn.execute(
        "UPDATE monitors SET current_check = ?, last_run_ms = ? WHERE id = ?"
        " AND current_check IS NULL AND status = 'active'",
        (check_id, at_ms, monitor_id),
    )
    return bool(conn.changes())


def release(conn: Conn, monitor_id: str, check_id: str, summary: dict[str, int] | None) -> None:
    """The check ended: the monitor has no current check; its last summary is this one's."""
    conn.execute(
        "UPDATE monitors SET current_check = NULL, last_summary = coalesce(?, last_summary)"
        " WHERE id = ? AND current_check = ?",
        (None if summary is None else _encode(summary), monitor_id, check_id),
    )


# -- checks ------------------------------------------------------------------------------------


def insert_check(conn: Conn, row: CheckRow) -> None:
    conn.execute(
        "INSERT INTO monitor_checks(id, monitor_id, status, trigger_kind, spec, scheduled_ms,"
        " finished_ms, summary, created_ms, updated_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (row.id, row.monitor_id, row.status, row.trigger, row.spec, row.scheduled_ms,
         row.finished_ms, row.summary, row.created_ms, row.updated_ms),
    )  # fmt: skip
    if row.status in OPEN:
        wake.notify(conn, wake.CRAWLS)


def get_check(conn: Conn, check_id: str) -> CheckRow | None:
    row = conn.execute(f"{_CHECK} WHERE id = ?", (check_id,)).fetchone()
    return None if row is None else _check(row)


def list_checks(
    conn: Conn, monitor_id: str, limit: int, offset: int, status: str | None
) -> list[CheckRow]:
    if status is None:
        rows: list[Any] = conn.execute(
            f"{_CHECK} WHERE monitor_id = ? ORDER BY created_ms DESC, id LIMIT ? OFFSET ?",
            (monitor_id, limit, offset),
        ).fetchall()
    else:
        rows = conn.execute(
            f"{_CHECK} WHERE monitor_id = ? AND status = ?"
            " ORDER BY created_ms DESC, id LIMIT ? OFFSET ?",
            (monitor_id, status, limit, offset),
        ).fetchall()
    return [_check(r) for r in rows]


def open_check_ids(conn: Conn) -> list[str]:
    """Checks queued or running, oldest first."""
    rows: list[Any] = conn.execute(
        "SELECT id FROM monitor_checks WHERE status IN ('queued', 'running') ORDER BY created_ms"
    ).fetchall()
    return [str(r[0]) for r in rows]


def orphaned_check_ids(conn: Conn) -> list[str]:
    """Open checks whose job is finished or gone."""
    rows: list[Any] = conn.execute(
        "SELECT c.id FROM monitor_checks c LEFT JOIN jobs j ON j.id = c.id"
        " WHERE c.status IN ('queued', 'running') AND (j.id IS NULL OR j.status <> 'scraping')"
        " ORDER BY c.created_ms"
    ).fetchall()
    return [str(r[0]) for r in rows]


def set_running(conn: Conn, check_id: str, at_ms: int) -> None:
    conn.execute(
        "UPDATE monitor_checks SET status = 'running', started_ms = ?, updated_ms = ?"
        " WHERE id = ? AND status = 'queued'",
        (at_ms, at_ms, check_id),
    )


def set_kicked_off(conn: Conn, check_id: str) -> bool:
    conn.execute(
        "UPDATE monitor_checks SET kicked_off = 1 WHERE id = ? AND kicked_off = 0", (check_id,)
    )
    return bool(conn.changes())


def set_target_results(conn: Conn, check_id: str, results: list[dict[str, Any]]) -> None:
    conn.execute(
        "UPDATE monitor_checks SET target_results = ? WHERE id = ?", (_encode(results), check_id)
    )


def finish_check(
    conn: Conn, check_id: str, status: str, summary: dict[str, int], error: str | None,
    at_ms: int,
) -> bool:  # fmt: skip
    """Give an open check its final status; False when it had one already."""
    conn.execute(
        "UPDATE monitor_checks SET status = ?, summary = ?, error = ?, finished_ms = ?,"
        " updated_ms = ? WHERE id = ? AND status IN ('queued', 'running')",
        (status, _encode(summary), error, at_ms, at_ms, check_id),
    )
    return bool(conn.changes())


def purge_checks(conn: Conn, monitor_id: str, before_ms: int, limit: int) -> int:
    """Delete up to `limit` finished checks of the monitor created before `before_ms`."""
    rows: list[Any] = conn.execute(
        "SELECT id FROM monitor_checks WHERE monitor_id = ? AND created_ms < ?"
        " AND status NOT IN ('queued', 'running') ORDER BY created_ms LIMIT ?",
        (monitor_id, before_ms, limit),
    ).fetchall()
    for (check_id,) in rows:
        conn.execute("DELETE FROM monitor_pages WHERE check_id = ?", (check_id,))
        conn.execute("DELETE FROM monitor_notifications WHERE check_id = ?", (check_id,))
        conn.execute("DELETE FROM monitor_checks WHERE id = ?", (check_id,))
    return len(rows)


# -- pages -------------------------------------------------------------------------------------


def _next_n(conn: Conn, check_id: str) -> int:
    (last,) = one(conn, "SELECT coalesce(max(n), 0) FROM monitor_pages WHERE check_id = ?",
                  (check_id,))  # fmt: skip
    return int(last) + 1


def queue_pages(conn: Conn, check_id: str, pages: list[tuple[str, str, str]], at_ms: int) -> None:
    """Queue (target id, key, url) pages not queued yet, in order."""
    n = _next_n(conn, check_id)
    for target_id, key, url in pages:
        conn.execute(
            "INSERT INTO monitor_pages(check_id, n, target_id, key, url, state, created_ms)"
            " VALUES (?, ?, ?, ?, ?, 'queued', ?) ON CONFLICT DO NOTHING",
            (check_id, n, target_id, key, url, at_ms),
        )
        n += 1 if conn.changes() else 0


def queued_pages(conn: Conn, check_id: str, after_n: int, limit: int) -> list[PageRow]:
    rows: list[Any] = conn.execute(
        f"{_PAGE} WHERE check_id = ? AND state = 'queued' AND n > ? ORDER BY n LIMIT ?",
        (check_id, after_n, limit),
    ).fetchall()
    return [_page(r) for r in rows]


def has_page(conn: Conn, check_id: str, target_id: str, key: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM monitor_pages WHERE check_id = ? AND target_id = ? AND key = ?",
        (check_id, target_id, key),
    ).fetchone()
    return row is not None


def record_page(conn: Conn, check_id: str, page: PageRow) -> bool:
    """Store a page's outcome: a queued page (same key) becomes done, or a new done page is
    added; False when the page was done already (nothing stored)."""
    values = (page.status, page.status_code, page.previous_scrape, page.current_scrape,
              page.error, page.diff, page.metadata, page.judgment, page.snapshot)  # fmt: skip
    conn.execute(
        "UPDATE monitor_pages SET state = 'done', status = ?, status_code = ?,"
        " previous_scrape = ?, current_scrape = ?, error = ?, diff = ?, metadata = ?,"
        " judgment = ?, snapshot = ?"
        " WHERE check_id = ? AND target_id = ? AND key = ? AND state = 'queued'",
        (*values, check_id, page.target_id, page.key),
    )
    if conn.changes():
        return True
    conn.execute(
        "INSERT INTO monitor_pages(check_id, n, target_id, key, url, state, status, status_code,"
        " previous_scrape, current_scrape, error, diff, metadata, judgment, snapshot, created_ms)"
        " VALUES (?, ?, ?, ?, ?, 'done', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
        (check_id, _next_n(conn, check_id), page.target_id, page.key, page.url, *values,
         page.created_ms),
    )  # fmt: skip
    return bool(conn.changes())


def pages(conn: Conn, check_id: str, skip: int, limit: int, status: str | None) -> list[PageRow]:
    """Done pages of a check in order."""
    if status is None:
        rows: list[Any] = conn.execute(
            f"{_PAGE} WHERE check_id = ? AND state = 'done' ORDER BY n LIMIT ? OFFSET ?",
            (check_id, limit, skip),
        ).fetchall()
    else:
        rows = conn.execute(
            f"{_PAGE} WHERE check_id = ? AND state = 'done' AND status = ?"
            " ORDER BY n LIMIT ? OFFSET ?",
            (check_id, status, limit, skip),
        ).fetchall()
    return [_page(r) for r in rows]


def page(conn: Conn, check_id: str, n: int) -> PageRow | None:
    """The check's done page number `n`, or None."""
    row = conn.execute(
        f"{_PAGE} WHERE check_id = ? AND n = ? AND state = 'done'", (check_id, n)
    ).fetchone()
    return None if row is None else _page(row)


def status_counts(conn: Conn, check_id: str) -> tuple[list[str], int]:
    """The statuses of the check's done pages, and how many pages are still queued."""
    rows: list[Any] = conn.execute(
        "SELECT state, status, count(*) FROM monitor_pages WHERE check_id = ?"
        " GROUP BY state, status",
        (check_id,),
    ).fetchall()
    statuses: list[str] = []
    queued = 0
    for state, status, count in rows:
        if state == "queued":
            queued += int(count)
        else:
            statuses += [str(status)] * int(count)
    return statuses, queued


def notable_pages(conn: Conn, check_id: str, limit: int) -> list[PageRow]:
    """Done pages of a check that a notification may tell (changed, new, removed, error)."""
    rows: list[Any] = conn.execute(
        f"{_PAGE} WHERE check_id = ? AND state = 'done'"
        " AND status IN ('changed', 'new', 'removed', 'error') ORDER BY n LIMIT ?",
        (check_id, limit),
    ).fetchall()
    return [_page(r) for r in rows]


# -- snapshots ---------------------------------------------------------------------------------


def snapshot(conn: Conn, monitor_id: str, target_id: str, key: str) -> Snapshot | None:
    row = conn.execute(
        "SELECT key, url, scrape_id, markdown, gone FROM monitor_snapshots"
        " WHERE monitor_id = ? AND target_id = ? AND key = ?",
        (monitor_id, target_id, key),
    ).fetchone()
    return None if row is None else Snapshot(row[0], row[1], row[2], row[3], bool(row[4]))


def keep_snapshot(
    conn: Conn, monitor_id: str, target_id: str, key: str, url: str, scrape_id: str,
    markdown: str | None, gone: bool, at_ms: int,
) -> None:  # fmt: skip
    """The page's snapshot becomes this fetch (`markdown`), or, `gone`, is marked removed."""
    if gone:
        conn.execute(
            "UPDATE monitor_snapshots SET gone = 1, seen_ms = ?"
            " WHERE monitor_id = ? AND target_id = ? AND key = ?",
            (at_ms, monitor_id, target_id, key),
        )
        return
    conn.execute(
        "INSERT INTO monitor_snapshots(monitor_id, target_id, key, url, scrape_id, markdown,"
        " gone, seen_ms) VALUES (?, ?, ?, ?, ?, ?, 0, ?) ON CONFLICT (monitor_id, target_id, key)"
        " DO UPDATE SET url = excluded.url, scrape_id = excluded.scrape_id,"
        " markdown = excluded.markdown, gone = 0, seen_ms = excluded.seen_ms",
        (monitor_id, target_id, key, url, scrape_id, markdown or "", at_ms),
    )


def unseen(conn: Conn, monitor_id: str, target_id: str, check_id: str) -> list[Snapshot]:
    """Snapshots of the target not gone and with no page in the check (a crawl no longer
    reached them)."""
    rows: list[Any] = conn.execute(
        "SELECT s.key, s.url, s.scrape_id, s.markdown, s.gone FROM monitor_snapshots s"
        " WHERE s.monitor_id = ? AND s.target_id = ? AND s.gone = 0 AND NOT EXISTS"
        " (SELECT 1 FROM monitor_pages p WHERE p.check_id = ? AND p.target_id = s.target_id"
        " AND p.key = s.key) ORDER BY s.key",
        (monitor_id, target_id, check_id),
    ).fetchall()
    return [Snapshot(r[0], r[1], r[2], r[3], bool(r[4])) for r in rows]
