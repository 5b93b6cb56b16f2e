# The crawl tables (migration 0005) as plain functions over an APSW connection, run inside the
# caller's transaction. A crawl's page is one transaction: its document and counters (through the
# jobs store), its frontier row marked done and the links it admits, so a kill -9 leaves either
# all of it or none of it, and a restarted crawl resumes from exactly what was stored.
#
# Cluster mode (migration 0010): every instance fetches pages of a running crawl. A frontier row
# is claimed by one process at a time (`claim`: one UPDATE … WHERE n IN (SELECT … LIMIT n) AND
# still claimable, which PostgreSQL re-checks on a row another transaction changed meanwhile);
# it stays 'queued' until the page commits, so "nothing queued" means nothing in flight anywhere
# either. Every page commit starts with `lock_job`, which serialises the commits of one crawl
# over every instance (their job counters and event numbers) and tells whether the crawl already
# ended; `conclude` decides the crawl's end exactly once, in the transaction that finds nothing
# left (or on a cancel).
#
# `admitted` on the job row counts the frontier rows that hold a slot of the crawl's `limit`
# (queued or done); a failed page gives its slot back, as Firecrawl does. It is also the job's
# `total` (completed + pending).
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from daemon.cluster import LIVE_CLAIMANTS
from daemon.store import Conn, one, wake


class FrontierEntry(msgspec.Struct, frozen=True, array_like=True):
    n: int
    url: str
    depth: int


class CrawlJobRow(msgspec.Struct, frozen=True):
    job_id: str
    kind: str
    url: str
    plan: bytes
    kicked_off: bool
    created_ms: int


def insert_job(conn: Conn, job_id: str, kind: str, url: str, plan: bytes) -> None:
    conn.execute(
        "INSERT INTO crawl_jobs(job_id, kind, url, plan) VALUES (?, ?, ?, ?)",
        (job_id, kind, url, plan),
    )
    wake.notify(conn, wake.CRAWLS)  # every instance joins it at once


def get_job(conn: Conn, job_id: str) -> CrawlJobRow | None:
    row = conn.execute(
        "SELECT c.job_id, c.kind, c.url, c.plan, c.kicked_off, j.created_ms"
        " FROM crawl_jobs c JOIN jobs j ON j.id = c.job_id WHERE c.job_id = ?",
        (job_id,),
    ).fetchone()
    return None if row is None else _job_row(row)


def _job_row(row: Any) -> CrawlJobRow:
    job_id, kind, url, plan, kicked_off, created = row
    return CrawlJobRow(job_id, kind, url, bytes(plan), bool(kicked_off), created)


def running_jobs(conn: Conn, kind: str | None = None) -> list[CrawlJobRow]:
    """Crawl and batch jobs still `scraping` (to work on, or list as active)."""
    rows: list[Any] = conn.execute(
        "SELECT c.job_id, c.kind, c.url, c.plan, c.kicked_off, j.created_ms"
        " FROM crawl_jobs c JOIN jobs j ON j.id = c.job_id"
        " WHERE j.status = 'scraping' AND (CAST(?1 AS TEXT) IS NULL OR c.kind = ?1)"
        " ORDER BY j.created_ms",
        (kind,),
    ).fetchall()
    return [_job_row(r) for r in rows]


def running_job_ids(conn: Conn) -> list[str]:
    """Ids of the crawl and batch jobs still `scraping`, oldest first (the service's scan)."""
    rows: list[Any] = conn.execute(
        "SELECT c.job_id FROM crawl_jobs c JOIN jobs j ON j.id = c.job_id"
        " WHERE j.status = 'scraping' ORDER BY j.created_ms"
    ).fetchall()
    return [str(r[0]) for r in rows]


def queued_pages(conn: Conn) -> int:
    """Frontier rows still to fetch (those being fetched included) over every running job."""
    sql = (
        "SELECT count(*) FROM crawl_frontier f JOIN jobs j ON j.id = f.job_id"
        " WHERE f.state = 'queued' AND j.status = 'scraping'"
    )
    return int(one(conn, sql)[0])


def set_kicked_off(conn: Conn, job_id: str) -> bool:
    """Mark the job kicked off; False when it already was (another instance did it)."""
    conn.execute("UPDATE crawl_jobs SET kicked_off = 1 WHERE job_id = ? AND kicked_off = 0",
                 (job_id,))  # fmt: skip
    return conn.changes() == 1


def _next_n(conn: Conn, job_id: str) -> int:
    (last,) = one(
        conn, "SELECT coalesce(max(n), 0) FROM crawl_frontier WHERE job_id = ?", (job_id,)
    )
    return int(last) + 1


def frontier_size(conn: Conn, job_id: str) -> int:
    (count,) = one(conn, "SELECT count(*) FROM crawl_frontier WHERE job_id = ?", (job_id,))
    return int(count)


def admitted(conn: Conn, job_id: str) -> int:
    """Frontier rows holding a slot of the limit: queued or done."""
    (count,) = one(conn, "SELECT admitted FROM crawl_jobs WHERE job_id = ?", (job_id,))
    return int(count)


def admit(
    conn: Conn,
    job_id: str,
    candidates: Iterable[tuple[str, str, int]],
    room: int,
) -> list[FrontierEntry]:
    """Queue (key, url, depth) candidates whose key the job has not seen, at most `room` of them;
    returns the rows queued, in order."""
    out: list[FrontierEntry] = []
    if room <= 0:
        return out
    n = _next_n(conn, job_id)
    for key, url, depth in candidates:
        conn.execute(
            "INSERT INTO crawl_frontier(job_id, n, key, url, depth, state)"
            " VALUES (?, ?, ?, ?, ?, 'queued') ON CONFLICT DO NOTHING",
            (job_id, n, key, url, depth),
        )
        if conn.changes():
            out.append(FrontierEntry(n, url, depth))
            n += 1
            if len(out) >= room:
                break
    _count(conn, job_id, len(out))
    if out:
        wake.notify(conn, wake.FRONTIER, job_id)
    return out


def _count(conn: Conn, job_id: str, change: int) -> None:
    if change:
        conn.execute(
            "UPDATE crawl_jobs SET admitted = admitted + ? WHERE job_id = ?", (change, job_id)
        )


def queued(conn: Conn, job_id: str, after_n: int, limit: int) -> list[FrontierEntry]:
    """Queued rows after position `after_n`, in discovery order."""
    rows: list[Any] = conn.execute(
        "SELECT n, url, depth FROM crawl_frontier WHERE job_id = ? AND state = 'queued' AND n > ?"
        " ORDER BY n LIMIT ?",
        (job_id, after_n, limit),
    ).fetchall()
    return [FrontierEntry(*r) for r in rows]


def set_state(conn: Conn, job_id: str, n: int, state: str) -> None:
    """Move a queued row to done, failed or skipped (the last two give its slot back)."""
    conn.execute(
        "UPDATE crawl_frontier SET state = ? WHERE job_id = ? AND n = ? AND state = 'queued'",
        (state, job_id, n),
    )
    if conn.changes() and state != "done":
        _count(conn, job_id, -1)


def claim_target(conn: Conn, job_id: str, key: str, url: str, depth: int) -> bool:
    """A page was redirected to a URL with dedupe key `key`: lock it for this page. False when
    another page already produced (or is producing) it; a queued duplicate is dropped."""
    row = conn.execute(
        "SELECT n, state FROM crawl_frontier WHERE job_id = ? AND key = ?", (job_id, key)
    ).fetchone()
    if row is None:
        conn.execute(
            "INSERT INTO crawl_frontier(job_id, n, key, url, depth, state)"
            " VALUES (?, ?, ?, ?, ?, 'skipped')",
            (job_id, _next_n(conn, job_id), key, url, depth),
        )
        return True
    n, state = row
    if state == "queued":
        set_state(conn, job_id, n, "skipped")
        return True
    return False


def state_of(conn: Conn, job_id: str, n: int) -> str | None:
    row = conn.execute(
        "SELECT state FROM crawl_frontier WHERE job_id = ? AND n = ?", (job_id, n)
    ).fetchone()
    return None if row is None else str(row[0])


def held_by(conn: Conn, job_id: str, n: int, claimant: str) -> bool:
    """Whether the row is still queued and claimed by `claimant` (a process that was paused
    past its membership finds its rows claimed again by another)."""
    row = conn.execute(
        "SELECT 1 FROM crawl_frontier WHERE job_id = ? AND n = ? AND state = 'queued'"
        " AND claimant = ?",
        (job_id, n, claimant),
    ).fetchone()
    return row is not None


_CLAIMABLE = (
    "state = 'queued' AND (claimant IS NULL OR (claimant <> ?1 AND (?4 = 1 OR claimant NOT IN"
    f" {LIVE_CLAIMANTS})))"
)


def claim(
    conn: Conn, job_id: str, claimant: str, limit: int, *, owner: bool = False
) -> list[FrontierEntry]:
    """Claim up to `limit` queued rows nobody live holds, in discovery order, for `claimant`.
    `owner`: the caller holds the crawl's lease (a paced crawl) and takes any queued row
    another process claimed.
    Nothing once the crawl ended or its job has a final status. Takes the crawl's row lock
    first, as every write of its frontier does, so claims and commits never deadlock."""
    if lock_job(conn, job_id) is not None:
        return []
    rows: list[Any] = conn.execute(
        f"UPDATE crawl_frontier SET claimant = ?1 WHERE job_id = ?2 AND {_CLAIMABLE}"
        f" AND n IN (SELECT n FROM crawl_frontier WHERE job_id = ?2 AND {_CLAIMABLE}"
        " ORDER BY n LIMIT ?3)"
        " AND EXISTS (SELECT 1 FROM jobs WHERE id = ?2 AND status = 'scraping')"
        " RETURNING n, url, depth",
        (claimant, job_id, limit, int(owner)),
    ).fetchall()
    return [FrontierEntry(*r) for r in sorted(rows)]


class Backlog(msgspec.Struct, frozen=True):
    queued: int
    """Rows not yet done: claimed (being fetched somewhere) or not."""
    claimable: int
    """Of those, rows `claimant` may claim now."""


def backlog(conn: Conn, job_id: str, claimant: str) -> Backlog:
    row = one(
        conn,
        "SELECT count(*), coalesce(sum(CASE WHEN claimant IS NULL OR (claimant <> ?1"
        f" AND claimant NOT IN {LIVE_CLAIMANTS}) THEN 1 ELSE 0 END), 0)"
        " FROM crawl_frontier WHERE job_id = ?2 AND state = 'queued'",
        (claimant, job_id),
    )
    return Backlog(int(row[0]), int(row[1]))


def release_claims(conn: Conn, job_id: str, claimant: str) -> None:
    """Give back the queued rows `claimant` holds (it stops working on the crawl)."""
    conn.execute(
        "UPDATE crawl_frontier SET claimant = NULL WHERE job_id = ? AND claimant = ?"
        " AND state = 'queued'",
        (job_id, claimant),
    )
    wake.notify(conn, wake.FRONTIER, job_id)


def lock_job(conn: Conn, job_id: str) -> str | None:
    """First statement of a crawl's page commit: lock the crawl's row until the commit (so
    commits of one crawl from every instance run one after the other) and return its `ending`:
    None while it runs; "gone" when the job was deleted."""
    row = conn.execute(
        "UPDATE crawl_jobs SET admitted = admitted WHERE job_id = ? RETURNING ending", (job_id,)
    ).fetchone()
    if row is None:
        return "gone"
    return None if row[0] is None else str(row[0])


def conclude(conn: Conn, job_id: str, claimant: str, ending: str) -> str | None:
    """Decide that the crawl ends (`completed` only when it was kicked off and nothing is
    queued; `cancelled` or `failed` at once) and that `claimant` gives the job its final
    status. Returns the ending `claimant` must apply: this one, or one decided earlier by a
    process that died before applying it; None when the crawl goes on or another live process
    applies its end."""
    row = conn.execute(
        "UPDATE crawl_jobs SET ending = coalesce(ending, ?2), ended_by = ?3 WHERE job_id = ?1"
        " AND CASE WHEN ending IS NOT NULL"
        f" THEN ended_by = ?3 OR ended_by NOT IN {LIVE_CLAIMANTS}"
        " ELSE ?2 <> 'completed' OR (kicked_off = 1 AND NOT EXISTS (SELECT 1 FROM"
        " crawl_frontier WHERE job_id = ?1 AND state = 'queued')) END"
        " RETURNING ending",
        (job_id, ending, claimant),
    ).fetchone()
    wake.notify(conn, wake.FRONTIER, job_id)  # its end is decided, or it goes on elsewhere
    return None if row is None else str(row[0])


def job_ending(conn: Conn, job_id: str) -> str | None:
    """The crawl's `ending`, "finished" when its job has a final status without one (cancelled
    by an instance that did not work on it), "gone" when deleted; None while it runs."""
    row = conn.execute(
        "SELECT c.ending, j.status FROM crawl_jobs c JOIN jobs j ON j.id = c.job_id"
        " WHERE c.job_id = ?",
        (job_id,),
    ).fetchone()
    if row is None:
        return "gone"
    if row[0] is not None:
        return str(row[0])
    return None if row[1] == "scraping" else "finished"


def kicked_off(conn: Conn, job_id: str) -> bool:
    row = conn.execute("SELECT kicked_off FROM crawl_jobs WHERE job_id = ?", (job_id,)).fetchone()
    return row is not None and bool(row[0])


def add_robots_blocked(conn: Conn, job_id: str, urls: Iterable[str]) -> list[str]:
    """Remember URLs robots.txt refused; returns those not seen before."""
    new = []
    for url in urls:
        conn.execute(
            "INSERT INTO crawl_robots_blocked(job_id, url) VALUES (?, ?) ON CONFLICT DO NOTHING",
            (job_id, url),
        )
        if conn.changes():
            new.append(url)
    return new


def robots_blocked(conn: Conn, job_id: str, limit: int = 10_000) -> list[str]:
    rows: list[Any] = conn.execute(
        "SELECT url FROM crawl_robots_blocked WHERE job_id = ? ORDER BY url LIMIT ?",
        (job_id, limit),
    ).fetchall()
    return [r[0] for r in rows]


def purge_frontier(conn: Conn, job_id: str, chunk: int) -> bool:
    """Delete up to `chunk` frontier rows of a finished job; True once none are left."""
    conn.execute(
        "DELETE FROM crawl_frontier WHERE job_id = ? AND n IN"
        " (SELECT n FROM crawl_frontier WHERE job_id = ? ORDER BY n LIMIT ?)",
        (job_id, job_id, chunk),
    )
    return conn.changes() < chunk


def idempotent_job(conn: Conn, key: str, since_ms: int) -> str | None:
    """The job a start request with this idempotency key created after `since_ms`."""
    row = conn.execute(
        "SELECT job_id FROM crawl_idempotency WHERE key = ? AND created_ms > ?", (key, since_ms)
    ).fetchone()
    return None if row is None else str(row[0])


def remember_idempotency(
    conn: Conn, key: str, job_id: str, at_ms: int, forget_before_ms: int
) -> None:
    conn.execute("DELETE FROM crawl_idempotency WHERE created_ms <= ?", (forget_before_ms,))
    conn.execute(
        "INSERT INTO crawl_idempotency(key, job_id, created_ms) VALUES (?, ?, ?)"
        " ON CONFLICT(key) DO UPDATE SET job_id = excluded.job_id,"
        " created_ms = excluded.created_ms",
        (key, job_id, at_ms),
    )
