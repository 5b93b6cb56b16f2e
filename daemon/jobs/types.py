# The jobs part's typed interface: the records, marks and errors its service hands to callers
# (the HTTP API, the console, the areas producing jobs). They live apart from the store module so
# a caller can name a job's type without importing SQL; `daemon.jobs.store` fills them in.
from __future__ import annotations

from typing import Any, Literal

import msgspec

from daemon.config import WebhookFields

Status = Literal["scraping", "completed", "failed", "cancelled"]
FINISHED: frozenset[str] = frozenset({"completed", "failed", "cancelled"})
KINDS: frozenset[str] = frozenset({"crawl", "batch_scrape", "extract", "agent", "monitor"})
ROBOTS_BLOCKED = "ROBOTS_BLOCKED"
"""The error code of a URL robots.txt kept a crawl from (listed as `robotsBlocked`)."""


class JobNotFound(LookupError):
    """No job has this id (or it expired and was deleted)."""


class JobFinished(Exception):
    """The job already has a final status; `status` is that status."""

    def __init__(self, job_id: str, status: str) -> None:
        super().__init__(f"job {job_id} is already {status}")
        self.job_id = job_id
        self.status = status


class JobRecord(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    kind: str
    status: str
    completed: int
    total: int
    created_ms: int
    completed_ms: int | None
    expires_ms: int
    webhook: WebhookFields | None
    source: dict[str, Any]
    last_seq: int
    terminated: bool
    error: str | None

    @property
    def finished(self) -> bool:
        return self.status in FINISHED


class JobError(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    at_ms: int
    url: str | None
    code: str | None
    error: str


class GoneMark(msgspec.Struct, frozen=True, kw_only=True):
    """The job's webhook endpoint answered 410 Gone: nothing more is sent to it."""

    event_id: str
    type: str
    error_id: str
    skipped: int


class Delivery(msgspec.Struct, frozen=True, kw_only=True):
    """Where a job's webhook events stand, for the console: `last_seq` events queued in its
    outbox stream, delivered or given up up to `cursor`, `pending` after it, `failed` events
    given up after their retries (each a WEBHOOK_FAILED error), and the 410 Gone mark."""

    cursor: int
    last_seq: int
    pending: int
    failed: int
    gone: GoneMark | None
