# Reading jobs: what the HTTP API and the console ask of the jobs service. Each read runs in one
# store snapshot through the store module's functions, so a surface gets typed records
# (daemon/jobs/types.py) and never writes SQL of its own; a final status the store has not
# saved yet (degraded mode) is shown as the job's status.
from __future__ import annotations

import datetime
from typing import Any

import msgspec

from daemon.jobs import events
from daemon.jobs import store as jobstore
from daemon.jobs.shared import ManagerState
from daemon.jobs.types import Delivery, JobError, JobRecord
from daemon.store import Conn, Store


async def job_list(
    store: Store, limit: int, kind: str | None = None
) -> tuple[list[JobRecord], dict[str, Delivery]]:
    """The newest `limit` jobs (all kinds, or `kind`), and where each one's webhook delivery
    stands (jobs with a webhook only), read in one snapshot: the console's job list."""

    def read(conn: Conn) -> tuple[list[JobRecord], dict[str, Delivery]]:
        records = jobstore.list_jobs(conn, limit, kind)
        return records, jobstore.deliveries(conn, [r.id for r in records])

    return await store.read(read)


def iso_ms(ms: int) -> str:
    """Epoch milliseconds as ISO 8601 UTC (`2026-01-02T03:04:05.678Z`)."""
    when = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JobReads(ManagerState):
    async def get_job(self, job_id: str) -> JobRecord | None:
        """The job as stored (with a final status not yet saved), or None (unknown or expired)."""
        return self._as_seen(await self.store.read(lambda c: jobstore.get_job(c, job_id)))

    async def job_rows_after(
        self, job_id: str, after: int, limit: int, max_bytes: int
    ) -> tuple[JobRecord | None, list[tuple[int, bytes]], bool]:
        """The job (as `get_job` sees it) and its rows numbered after `after` (see
        `jobstore.read_rows_after`), read in ONE snapshot: rows commit before the job's end, so
        a job finished here has no rows but these and those before `after`."""

        def read(c: Conn) -> tuple[JobRecord | None, list[tuple[int, bytes]], bool]:
            record = jobstore.get_job(c, job_id)
            if record is None:
                return None, [], False
            return record, *jobstore.read_rows_after(c, job_id, after, limit, max_bytes)

        record, rows, more = await self.store.read(read)
        return self._as_seen(record), rows, more

    def _as_seen(self, record: JobRecord | None) -> JobRecord | None:
        if record is None:
            return None
        job_id = record.id
        unsaved = self._unsaved.get(job_id)
        if unsaved is not None and not record.finished:
            record = msgspec.structs.replace(
                record,
                status=unsaved.status,
                error=unsaved.error,
                completed_ms=unsaved.at_ms,
                expires_ms=unsaved.expires_ms,
                terminated=True,
            )
        if record.finished and record.expires_ms <= self.clock_ms():
            return None
        return record

    async def job_rows(
        self, job_id: str, skip: int, limit: int, max_bytes: int
    ) -> tuple[list[bytes], bool]:
        return await self.store.read(
            lambda c: jobstore.read_rows(c, job_id, skip, limit, max_bytes)
        )

    async def has_error_code(self, job_id: str, code: str) -> bool:
        return await self.store.read(lambda c: jobstore.has_error_code(c, job_id, code))

    async def job_errors(self, job_id: str) -> list[JobError]:
        return await self.store.read(lambda c: jobstore.list_errors(c, job_id))

    async def retrying(self, top: int = 20) -> dict[str, Any]:
        """Webhook events waiting for a retry, as stored (whichever instance drains them): how
        many, and the `top` due soonest with the attempts made and when the next is due."""
        count, states = await self.store.read(lambda c: jobstore.retrying(c, top))
        return {
            "events": count,
            "next": [
                {
                    "job": s.job_id,
                    "event": events.event_id(s.job_id, s.seq),
                    "attempts": s.attempts,
                    "next_attempt_at": iso_ms(s.next_ms),
                    "last_status": s.last_status,
                    "last_error": s.last_error,
                }
                for s in states
            ],
        }
