# The agent tables (migration 0016) as plain functions over a store connection, in the SQL both
# backends share. They run inside the caller's transaction: a step, the pages it changed and its
# webhook event commit together, so what a restarted run reads is exactly what its events said.
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from daemon.store import Conn, one, wake

_encode = msgspec.json.Encoder().encode

MAX_PAGES = 2000
"""Most pages one run knows of (candidates included): links beyond it are not kept."""


class AgentJobRow(msgspec.Struct, frozen=True):
    job_id: str
    plan: bytes
    kicked_off: bool
    result: bytes | None
    sources: bytes | None
    message: str | None
    created_ms: int


class PageRow(msgspec.Struct, frozen=True):
    n: int
    url: str
    origin: str
    root: int
    title: str
    snippet: str
    state: str
    """candidate | chosen | read | failed"""
    text: str | None
    error: str | None


class NewPage(msgspec.Struct, frozen=True):
    key: str
    url: str
    origin: str
    """request | search | link"""
    root: int = -1
    title: str = ""
    snippet: str = ""


class StepRow(msgspec.Struct, frozen=True):
    n: int
    action: str
    input: bytes
    output: bytes
    pages: int
    searches: int
    tokens: int
    credits: int
    at_ms: int
    ms: int


def _job(row: Any) -> AgentJobRow:
    job_id, plan, kicked, result, sources, message, created = row
    return AgentJobRow(
        job_id,
        bytes(plan),
        bool(kicked),
        None if result is None else bytes(result),
        None if sources is None else bytes(sources),
        message,
        int(created),
    )


def insert_job(conn: Conn, job_id: str, plan: bytes) -> None:
    conn.execute("INSERT INTO agent_jobs(job_id, plan) VALUES (?, ?)", (job_id, plan))
    wake.notify(conn, wake.CRAWLS)  # every instance's scan looks at once


def get_job(conn: Conn, job_id: str) -> AgentJobRow | None:
    row = conn.execute(
        "SELECT a.job_id, a.plan, a.kicked_off, a.result, a.sources, a.message, j.created_ms"
        " FROM agent_jobs a JOIN jobs j ON j.id = a.job_id WHERE a.job_id = ?",
        (job_id,),
    ).fetchone()
    return None if row is None else _job(row)


def running_job_ids(conn: Conn) -> list[str]:
    """Agent jobs still running, oldest first."""
    rows: list[Any] = conn.execute(
        "SELECT a.job_id FROM agent_jobs a JOIN jobs j ON j.id = a.job_id"
        " WHERE j.status = 'scraping' ORDER BY j.created_ms"
    ).fetchall()
    return [str(r[0]) for r in rows]


def set_kicked_off(conn: Conn, job_id: str) -> bool:
    """Mark the request's URLs and the search's results admitted; False when they were."""
    conn.execute(
        "UPDATE agent_jobs SET kicked_off = 1 WHERE job_id = ? AND kicked_off = 0", (job_id,)
    )
    return bool(conn.changes())


def admit(conn: Conn, job_id: str, pages: Iterable[NewPage], state: str) -> list[str]:
    """Add the pages whose key the job has not seen (within MAX_PAGES) in `state` (candidate
    or chosen); returns the URLs added."""
    (last, count) = one(
        conn, "SELECT coalesce(max(n), 0), count(*) FROM agent_pages WHERE job_id = ?", (job_id,)
    )
    n, room = int(last) + 1, MAX_PAGES - int(count)
    added: list[str] = []
    for page in pages:
        if room <= 0:
            break
        conn.execute(
            "INSERT INTO agent_pages(job_id, n, key, url, origin, root, title, snippet, state)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (job_id, n, page.key, page.url, page.origin, page.root, page.title[:500],
             page.snippet[:1000], state),
        )  # fmt: skip
        if conn.changes():
            added.append(page.url)
            n += 1
            room -= 1
    return added


def choose(conn: Conn, job_id: str, urls: list[str]) -> int:
    """Mark these candidates chosen; how many were."""
    chosen = 0
    for url in urls:
        conn.execute(
            "UPDATE agent_pages SET state = 'chosen'"
            " WHERE job_id = ? AND url = ? AND state = 'candidate'",
            (job_id, url),
        )
        chosen += conn.changes()
    return chosen


def finish_page(
    conn: Conn, job_id: str, n: int, *, title: str, text: str | None, error: str | None
) -> bool:
    """Store a chosen page's text (or, with `error`, its failure); False when it was no longer
    chosen (nothing stored)."""
    conn.execute(
        "UPDATE agent_pages SET state = ?, title = ?, text = ?, error = ?"
        " WHERE job_id = ? AND n = ? AND state = 'chosen'",
        ("failed" if error is not None else "read", title[:500], text, error, job_id, n),
    )
    return bool(conn.changes())


def pages(conn: Conn, job_id: str) -> list[PageRow]:
    """Every page the job knows of, in the order found."""
    rows: list[Any] = conn.execute(
        "SELECT n, url, origin, root, title, snippet, state, text, error FROM agent_pages"
        " WHERE job_id = ? ORDER BY n",
        (job_id,),
    ).fetchall()
    return [
        PageRow(int(n), url, origin, int(root), title, snippet, state, text, error)
        for n, url, origin, root, title, snippet, state, text, error in rows
    ]


def add_step(
    conn: Conn,
    job_id: str,
    action: str,
    input_: dict[str, Any],
    output: dict[str, Any],
    *,
    cost: tuple[int, int, int],
    credits: int,
    at_ms: int,
    ms: int = 0,
) -> int:
    """Record a step costing (pages, searches, tokens) whose work took `ms`; returns its
    number."""
    (last,) = one(conn, "SELECT coalesce(max(n), 0) FROM agent_steps WHERE job_id = ?", (job_id,))
    n = int(last) + 1
    conn.execute(
        "INSERT INTO agent_steps(job_id, n, action, input, output, pages, searches, tokens,"
        " credits, at_ms, ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (job_id, n, action, _encode(input_), _encode(output), *cost, credits, at_ms, ms),
    )
    return n


def steps(conn: Conn, job_id: str) -> list[StepRow]:
    rows: list[Any] = conn.execute(
        "SELECT n, action, input, output, pages, searches, tokens, credits, at_ms, ms"
        " FROM agent_steps WHERE job_id = ? ORDER BY n",
        (job_id,),
    ).fetchall()
    return [
        StepRow(int(r[0]), r[1], bytes(r[2]), bytes(r[3]), *(int(v) for v in r[4:])) for r in rows
    ]


def save_result(
    conn: Conn, job_id: str, result: Any, sources: list[str], message: str | None
) -> None:
    conn.execute(
        "UPDATE agent_jobs SET result = ?, sources = ?, message = ? WHERE job_id = ?",
        (_encode(result), _encode(sources), message, job_id),
    )
