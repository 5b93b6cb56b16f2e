# The collector's tables (migration 0003) as plain functions over an APSW connection, run inside
# a caller's transaction: the store's writer for a window's commit (together with the outbox
# append and the job's page), or a reader's snapshot. One row per task holds its paging progress,
# the run and job in flight, and the last run's result; nothing here knows about trio.
from __future__ import annotations

import msgspec

from daemon.collector import paging
from daemon.collector.datefilter import DateCounts
from daemon.store import Conn


class RunStats(msgspec.Struct, kw_only=True):
    """Counters of one run, shown in /status while it runs and kept as its result after."""

    run_id: str
    job_id: str | None
    started_ms: int
    range_low: int | None = None
    range_high: int | None = None
    lowest_done: int | None = None
    resumed: bool = False
    reset: bool = False
    windows: int = 0
    fetched: int = 0
    kept: int = 0
    dropped: DateCounts = msgspec.field(default_factory=DateCounts)
    duplicates: int = 0
    published: int = 0
    continues: bool = False
    """This run continues the job an interrupted run left running (same job id)."""
    status: str = "running"
    """running | completed | failed | stopped (POST /crawl/stop) | cancelled (its job deleted) |
    removed (the task removed by a reload) | interrupted (its job continues) | ended (its job was
    given a final status elsewhere); see collector.runrules."""
    end: str | None = None
    error: str | None = None
    finished_ms: int | None = None
    interrupted: bool = False
    """Cut short by its instance (shutdown, reload, a lost lease, the store failing, the task
    removed) rather than ended by itself or a user."""


class TaskState(msgspec.Struct):
    """The persisted row of collector_tasks."""

    progress: paging.Progress | None
    run_id: str | None
    job_id: str | None
    last_result: RunStats | None


_stats_decoder = msgspec.json.Decoder(RunStats)


def load_task_state(conn: Conn, task: str) -> TaskState:
    row = conn.execute(
        "SELECT progress, run_id, job_id, last_result FROM collector_tasks WHERE task = ?", (task,)
    ).fetchone()
    if row is None:
        return TaskState(None, None, None, None)
    progress, run_id, job_id, last = row
    return TaskState(
        paging.decode_progress(progress) if progress else None,
        run_id,
        job_id,
        _stats_decoder.decode(last) if last else None,
    )


def save_progress(
    conn: Conn,
    task: str,
    progress: paging.Progress,
    run_id: str,
    job_id: str | None,
    at_ms: int,
) -> None:
    conn.execute(
        "INSERT INTO collector_tasks(task, progress, run_id, job_id, run_started_ms, updated_ms)"
        " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(task) DO UPDATE SET progress = excluded.progress,"
        " run_id = excluded.run_id, job_id = excluded.job_id, updated_ms = excluded.updated_ms",
        (task, paging.encode_progress(progress), run_id, job_id, at_ms, at_ms),
    )


def save_job(conn: Conn, task: str, job_id: str, at_ms: int) -> None:
    conn.execute(
        "INSERT INTO collector_tasks(task, job_id, updated_ms) VALUES (?, ?, ?)"
        " ON CONFLICT(task) DO UPDATE SET job_id = excluded.job_id,"
        " updated_ms = excluded.updated_ms",
        (task, job_id, at_ms),
    )


def save_result(conn: Conn, task: str, stats: RunStats, at_ms: int) -> None:
    conn.execute(
        "INSERT INTO collector_tasks(task, last_result, updated_ms) VALUES (?, ?, ?)"
        " ON CONFLICT(task) DO UPDATE SET last_result = excluded.last_result,"
        " updated_ms = excluded.updated_ms",
        (task, msgspec.json.encode(stats), at_ms),
    )
