# What a task's crawler and those around it agree on: the jobs part as the crawler sees it
# (JobSink), the errors a start or a window raises, how long a run's end waits for the store,
# and the job an interrupted run left running (Continuation, shown in /status). Kept apart from
# daemon/collector/crawler.py so the service and the API name them without the crawler's loop.
from __future__ import annotations

from typing import Any, Literal, Protocol

import msgspec
import trio

from daemon.config import WebhookSpec
from daemon.store import DB_ERRORS, Conn, StoreUnavailable


class PageWritten(Protocol):
    first_row: int | None
    """`n` of the page's first job row (its queue items point there); None: rows not kept."""


class JobSink(Protocol):
    """What the crawler needs from the jobs part (daemon.jobs.manager.JobManager)."""

    async def create_job(
        self, kind: str, *, webhook: WebhookSpec | None, source: dict[str, Any]
    ) -> str: ...
    def page_in_tx(self, conn: Conn, job_id: str, rows: list[Any]) -> PageWritten: ...
    async def after_commit(self, pending: Any) -> None: ...
    async def finish(
        self,
        job_id: str,
        status: Literal["completed", "failed", "cancelled"],
        error: str | None = None,
    ) -> None: ...
    def cancel_requested(self, job_id: str) -> trio.Event: ...
    async def attach(self, job_id: str) -> None: ...
    def detach(self, job_id: str) -> None: ...


class AlreadyRunning(Exception):
    pass


class CrawlerStopped(Exception):
    """A manual start was refused because the crawler stopped before serving it."""


class EmptyPage(Exception):
    """Upstream answered an empty page where its total says rows exist."""


STORE_FAILURES: tuple[type[BaseException], ...] = (*DB_ERRORS, StoreUnavailable)
STORE_WAIT_S = 10.0
"""How long a run's end waits for the store to record it (the database may be unreachable)."""


class Continuation(msgspec.Struct, kw_only=True):
    """A job an interrupted run left running, which this crawler continues (shown in /status)."""

    job_id: str | None
    why: str
    """Why the run it continues was cut short."""
    since_ms: int
    attempts: int = 0
    """Runs in a row the store failed under while this instance kept the task."""
    next_try_ms: int | None = None
