# Jobs over HTTP in Firecrawl v2's shapes, so Firecrawl clients can poll a collector run like a
# crawl: status with paginated data, the error list, cancel. Not-found/conflict answers use
# Firecrawl's `{success: false, error}`; malformed ids and parameters get the daemon's usual 400.
from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from daemon.api.app import UUID_PARAM, ApiRoute, int_param, json, public_link
from daemon.api.errors import HTTPError
from daemon.jobs.types import ROBOTS_BLOCKED, JobFinished, JobNotFound
from daemon.redact import redact_text, redact_url

if TYPE_CHECKING:
    from daemon.jobs.manager import JobManager
    from daemon.jobs.types import JobRecord

PAGE_BYTES = 10 * 1024 * 1024
"""A status page stops adding rows at about this much JSON (Firecrawl cuts at 10 MiB)."""
ROBOTS_WARNING = (
    "One or more pages were unable to be crawled because the robots.txt file prevented this."
    " Please use the /scrape endpoint instead."
)
"""Firecrawl's `warning` on a finished crawl that had robots-blocked pages, in its words."""
DEFAULT_LIMIT = 100
MAX_LIMIT = 2**62
"""Any positive `limit` is taken, as Firecrawl does: PAGE_BYTES is what bounds an answer."""


SKIP = int_param("skip", "Rows to skip (from the `next` link)", 0, 2**31)
LIMIT = int_param(
    "limit",
    "Most rows in this page (any positive number; a page stops at about 10 MiB of rows, `next`"
    " carries on)",
    1,
    MAX_LIMIT,
)


class CrawlStatus(msgspec.Struct, kw_only=True, omit_defaults=True):
    success: bool
    status: str
    completed: int
    total: int
    creditsUsed: int
    createdAt: str
    completedAt: str | None = None
    """Once the job finished (completed, failed or cancelled)."""
    duration: float | None = None
    """Seconds from createdAt to completedAt, once finished (as Firecrawl's status objects)."""
    expiresAt: str
    data: list[Any]
    next: str | None = None
    """Absolute URL of the next page; present while more rows follow."""
    warning: str | None = None


class CrawlError(msgspec.Struct):
    id: str
    timestamp: str
    url: str
    code: str | None
    error: str


class CrawlErrors(msgspec.Struct):
    errors: list[CrawlError]
    robotsBlocked: list[str]


class CancelResult(msgspec.Struct):
    status: str


def iso(ms: int) -> str:
    """Epoch milliseconds as ISO 8601 UTC with milliseconds (`2026-01-02T03:04:05.678Z`)."""
    text = datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


def _not_found() -> Response:
    return json({"success": False, "error": "Job not found"}, 404)


def _job_id(request: Request) -> str:
    raw = request.path_params["id"]
    try:
        return str(uuid.UUID(raw))
    except ValueError:
        raise HTTPError(400, "invalid job id: expected a UUID", {"id": raw}) from None


async def job_status(
    manager: JobManager, record: JobRecord, rows: list[bytes], next_url: str | None = None
) -> CrawlStatus:
    """The status object of a job with `rows` as its `data` (the HTTP answer and the WebSocket
    watcher's catchup)."""
    warning = None
    if record.finished and await manager.has_error_code(record.id, ROBOTS_BLOCKED):
        warning = ROBOTS_WARNING
    return CrawlStatus(
        success=True,
        status=record.status,
        completed=record.completed,
        total=record.total,
        creditsUsed=record.completed,
        createdAt=iso(record.created_ms),
        completedAt=None if record.completed_ms is None else iso(record.completed_ms),
        duration=None
        if record.completed_ms is None
        else round((record.completed_ms - record.created_ms) / 1000, 3),
        expiresAt=iso(record.expires_ms),
        data=[msgspec.Raw(r) for r in rows],
        next=next_url,
        warning=warning,
    )


def routes(manager: JobManager) -> list[ApiRoute]:
    from daemon.api.watch import watcher  # it imports this module

    async def crawl_status(request: Request) -> Response:
        job_id = _job_id(request)
        skip = SKIP.read_int(request, 0)
        limit = LIMIT.read_int(request, DEFAULT_LIMIT)
        record = await manager.get_job(job_id)
        if record is None:
            return _not_found()
        rows, more = await manager.job_rows(job_id, skip, limit, PAGE_BYTES)
        next_url = None
        if more:
            next_url = public_link(request, skip=skip + len(rows))
        return json(await job_status(manager, record, rows, next_url))

    async def crawl_errors(request: Request) -> Response:
        job_id = _job_id(request)
        if await manager.get_job(job_id) is None:
            return _not_found()
        errors = await manager.job_errors(job_id)
        return json(
            CrawlErrors(
                errors=[
                    CrawlError(
                        e.id, iso(e.at_ms), redact_url(e.url or ""), e.code, redact_text(e.error)
                    )
                    for e in errors
                    if e.code != ROBOTS_BLOCKED
                ],
                robotsBlocked=[e.url or "" for e in errors if e.code == ROBOTS_BLOCKED],
            )
        )

    async def crawl_cancel(request: Request) -> Response:
        job_id = _job_id(request)
        try:
            await manager.cancel(job_id)
        except JobNotFound:
            return _not_found()
        except JobFinished as exc:
            return json({"success": False, "error": f"Job is already {exc.status}"}, 409)
        return json(CancelResult(status="cancelled"))

    ids = {"id": UUID_PARAM}
    return [
        ApiRoute("GET", "/v2/crawl/{id}", crawl_status,
                 "A job's status, counters and produced rows (paginated with `next`); opened as"
                 " a WebSocket, the watcher: `catchup`, `document` messages, close 1000"
                 " `{\"type\":\"done\"}`",
                 response=CrawlStatus, query=[SKIP, LIMIT], websocket=watcher(manager),
                 path_params=ids,
                 errors={400: "malformed id or parameter", 404: "Job not found"}),
        ApiRoute("GET", "/v2/crawl/{id}/errors", crawl_errors,
                 "A job's errors, undelivered webhook events included (code WEBHOOK_FAILED)",
                 response=CrawlErrors, path_params=ids,
                 errors={400: "malformed id", 404: "Job not found"}),
        ApiRoute("DELETE", "/v2/crawl/{id}", crawl_cancel,
                 "Cancel a running job (its producer stops between windows)",
                 response=CancelResult, path_params=ids,
                 errors={400: "malformed id", 404: "Job not found",
                         409: "the job already has a final status"}),
    ]  # fmt: skip
