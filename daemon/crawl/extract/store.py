# The extract tables (migration 0014) as plain functions over a store connection, in the SQL both
# backends share. They run inside the caller's transaction: a page's extraction, its state and
# the links its crawl admitted commit together, so a restarted job neither loses a paid answer
# nor asks the model about a page twice.
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from daemon.store import Conn, one, wake

_encode = msgspec.json.Encoder().encode


class ExtractJobRow(msgspec.Struct, frozen=True):
    job_id: str
    plan: bytes
    kicked_off: bool
    result: bytes | None
    sources: bytes | None
    tokens: int
    warning: str | None
    created_ms: int


class PageEntry(msgspec.Struct, frozen=True):
    n: int
    url: str
    root: int
    depth: int


class PageResult(msgspec.Struct, frozen=True):
    n: int
    url: str
    state: str
    value: bytes | None
    tokens: int
    error: str | None


_JOB = (
    "SELECT e.job_id, e.plan, e.kicked_off, e.result, e.sources, e.tokens, e.warning, j.created_ms"
    " FROM extract_jobs e JOIN jobs j ON j.id = e.job_id"
)


def _job(row: Any) -> ExtractJobRow:
    job_id, plan, kicked, result, sources, tokens, warning, created = row
    return ExtractJobRow(
        job_id,
        bytes(plan),
        bool(kicked),
        None if result is None else bytes(result),
        None if sources is None else bytes(sources),
        int(tokens),
        warning,
        int(created),
    )


def insert_job(conn: Conn, job_id: str, plan: bytes) -> None:
    conn.execute("INSERT INTO extract_jobs(job_id, plan) VALUES (?, ?)", (job_id, plan))
    wake.notify(conn, wake.CRAWLS)  # every instance's scan looks at once


def get_job(conn: Conn, job_id: str) -> ExtractJobRow | None:
    row = conn.execute(f"{_JOB} WHERE e.job_id = ?", (job_id,)).fetchone()
    return None if row is None else _job(row)


def running_job_ids(conn: Conn) -> list[str]:
    """Extract jobs still running, oldest first."""
    rows: list[Any] = conn.execute(
        "SELECT e.job_id FROM extract_jobs e JOIN jobs j ON j.id = e.job_id"
        " WHERE j.status = 'scraping' ORDER BY j.created_ms"
    ).fetchall()
    return [str(r[0]) for r in rows]


def set_kicked_off(conn: Conn, job_id: str) -> bool:
    """Mark the job's request URLs admitted; False when they already were."""
    conn.execute(
        "UPDATE extract_jobs SET kicked_off = 1 WHERE job_id = ? AND kicked_off = 0", (job_id,)
    )
    return bool(conn.changes())


def kicked_off(conn: Conn, job_id: str) -> bool:
    row = conn.execute("SELECT kicked_off FROM extract_jobs WHERE job_id = ?", (job_id,)).fetchone()
    return row is not None and bool(row[0])


def page_count(conn: Conn, job_id: str) -> int:
    (count,) = one(conn, "SELECT count(*) FROM extract_pages WHERE job_id = ?", (job_id,))
    return int(count)


def admit(
    conn: Conn, job_id: str, candidates: Iterable[tuple[str, str, int, int]], room: int
) -> list[PageEntry]:
    """Queue (key, url, root, depth) candidates whose key the job has not seen, at most `room`
    of them; returns those queued, in order."""
    out: list[PageEntry] = []
    if room <= 0:
        return out
    (last,) = one(conn, "SELECT coalesce(max(n), 0) FROM extract_pages WHERE job_id = ?", (job_id,))
    n = int(last) + 1
    for key, url, root, depth in candidates:
        conn.execute(
            "INSERT INTO extract_pages(job_id, n, key, url, root, depth, state)"
            " VALUES (?, ?, ?, ?, ?, ?, 'queued') ON CONFLICT DO NOTHING",
            (job_id, n, key, url, root, depth),
        )
        if conn.changes():
            out.append(PageEntry(n, url, root, depth))
            n += 1
            if len(out) >= room:
                break
    return out


def queued(conn: Conn, job_id: str, after_n: int, limit: int) -> list[PageEntry]:
    """Queued pages after position `after_n`, in order."""
    rows: list[Any] = conn.execute(
        "SELECT n, url, root, depth FROM extract_pages"
        " WHERE job_id = ? AND state = 'queued' AND n > ? ORDER BY n LIMIT ?",
        (job_id, after_n, limit),
    ).fetchall()
    return [PageEntry(int(n), url, int(root), int(depth)) for n, url, root, depth in rows]


def page_state(conn: Conn, job_id: str, n: int) -> str | None:
    row = conn.execute(
        "SELECT state FROM extract_pages WHERE job_id = ? AND n = ?", (job_id, n)
    ).fetchone()
    return None if row is None else str(row[0])


def finish_page(
    conn: Conn,
    job_id: str,
    n: int,
    *,
    value: Any = None,
    tokens: int = 0,
    error: str | None = None,
) -> bool:
    """Store a queued page's extraction (or, with `error`, its failure); False when the page
    was no longer queued (nothing stored)."""
    conn.execute(
        "UPDATE extract_pages SET state = ?, value = ?, tokens = ?, error = ?"
        " WHERE job_id = ? AND n = ? AND state = 'queued'",
        (
            "failed" if error is not None else "done",
            None if error is not None else _encode(value),
            tokens,
            error,
            job_id,
            n,
        ),
    )
    return bool(conn.changes())


def results(conn: Conn, job_id: str) -> list[PageResult]:
    """Every page's outcome so far, in page order."""
    rows: list[Any] = conn.execute(
        "SELECT n, url, state, value, tokens, error FROM extract_pages WHERE job_id = ? ORDER BY n",
        (job_id,),
    ).fetchall()
    return [
        PageResult(int(n), url, state, None if v is None else bytes(v), int(t), e)
        for n, url, state, v, t, e in rows
    ]


def counts(conn: Conn, job_id: str) -> dict[str, int]:
    rows: list[Any] = conn.execute(
        "SELECT state, count(*) FROM extract_pages WHERE job_id = ? GROUP BY state", (job_id,)
    ).fetchall()
    return {str(state): int(count) for state, count in rows}


def save_result(
    conn: Conn, job_id: str, result: Any, sources: Any, tokens: int, warning: str | None
) -> None:
    conn.execute(
        "UPDATE extract_jobs SET result = ?, sources = ?, tokens = ?, warning = ? WHERE job_id = ?",
        (_encode(result), _encode(sources), tokens, warning, job_id),
    )
