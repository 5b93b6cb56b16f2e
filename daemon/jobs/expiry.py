# Expiry: finished jobs are deleted (with their rows, errors and events) once their ttl has run
# out; in cluster mode on one instance at a time (the lease `jobs:expiry`), each delete checking
# the lease, while every instance keeps retrying to save its own unsaved final statuses (degraded
# mode). A job still active in this process is left for a later pass.
from __future__ import annotations

import functools

import trio

from daemon.cluster import Lease, fenced
from daemon.cluster import store as cluster_store
from daemon.jobs import store as jobstore
from daemon.jobs.shared import ManagerState
from daemon.logs import get_logger
from daemon.store import DB_ERRORS, Conn

log = get_logger("jobs")

DELETE_CHUNK = 2000
EXPIRY_LEASE = "jobs:expiry"


def delete_step(conn: Conn, job_id: str, lease: Lease | None) -> bool:
    """One transaction of deleting an expired job (checking the expiry lease); the job's
    drainer lease row goes with the job."""
    fenced.check(conn, lease)
    done = jobstore.delete_job(conn, job_id, DELETE_CHUNK)
    if done:
        cluster_store.drop_leases(conn, jobstore.stream_name(job_id))
    return done


class Expiry(ManagerState):
    async def run_cleanup(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Delete expired finished jobs (and their rows, errors and events) periodically; in
        cluster mode on one instance at a time (the lease `jobs:expiry`), while every instance
        retries saving its own unsaved final statuses."""
        task_status.started()
        if self.cluster is None:
            await self._cleanup_loop(None)
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._cleanup_loop, None, True)
            await self.cluster.run_owned(EXPIRY_LEASE, self._cleanup_loop)

    async def _cleanup_loop(self, lease: Lease | None, unsaved_only: bool = False) -> None:
        while True:
            try:
                if unsaved_only:
                    await self._save_unsaved()
                else:
                    await self.cleanup_once(lease)
            except DB_ERRORS as exc:
                log.error(
                    "jobs cleanup failed; retrying later", error=f"{type(exc).__name__}: {exc}"
                )
            await trio.sleep(max(1.0, min(60.0, self.jobs_cfg.ttl / 10)))

    async def cleanup_once(self, lease: Lease | None = None) -> int:
        """One cleanup pass; returns the number of jobs deleted. With `lease` (cluster mode)
        each delete checks it, and the finished job's drainer lease row goes with the job."""
        await self._save_unsaved()
        now = self.clock_ms()
        removed = 0
        while ids := [
            i
            for i in await self.store.read(lambda c: jobstore.expired(c, now, 100))
            if i not in self._active
        ]:
            for job_id in ids:
                step = functools.partial(delete_step, job_id=job_id, lease=lease)
                while not await self.store.write(step):
                    pass
                removed += 1
            if len(ids) < 100:
                break
        if removed:
            log.info("expired jobs deleted", jobs=removed)
        return removed
