# Cluster mode (`cluster` given): a job's drainer runs under the lease `webhook:<job id>` (the
# instance creating the job tries first); every instance scans each poll for jobs with undelivered
# events whose lease is free (the owner died or let go) and takes up to its fair share of them
# (spread.py), continuing after the ack cursor. The scan reads the jobs' backlog and the cluster's
# leases and members in one snapshot (the cluster's tables through daemon/cluster/queries.py).
from __future__ import annotations

import functools
import math
from typing import Any

import msgspec
import trio

from daemon.cluster import Cluster, queries
from daemon.cluster import rules as cluster_rules
from daemon.jobs import spread
from daemon.jobs import store as jobstore
from daemon.jobs.shared import ManagerState
from daemon.logs import get_logger
from daemon.store import DB_ERRORS, Conn, wake

log = get_logger("jobs")


class Scan(msgspec.Struct, frozen=True):
    backlog: dict[str, int]
    """Job id → events after its cursor."""
    held: list[str]
    """Jobs whose drainer lease is held now (by any instance)."""
    held_here: int
    """Of those, how many this instance holds."""
    members: int
    """Live instances."""
    holders: dict[str, str]
    """Job id → instance draining it."""


def read_scan(conn: Conn, instance: str, *, full: bool = True) -> Scan:
    """One read: the jobs with a backlog, who drains what, how many instances are alive
    (without `full`, nothing more when no job has a backlog: an idle cluster's scan)."""
    if not full and not (backlog := jobstore.undelivered(conn)):
        return Scan(backlog=backlog, held=[], held_here=0, members=0, holders={})
    holders = queries.lease_holders(conn, jobstore.STREAM_PREFIX)
    members = queries.live_members(conn)
    return Scan(
        backlog=jobstore.undelivered(conn),
        held=list(holders),
        held_here=sum(1 for h in holders.values() if h == instance),
        members=members,
        holders=holders,
    )


class ClusterScan(ManagerState):
    async def cluster_status(self, cluster: Cluster, top: int = 20) -> dict[str, Any]:
        """Every instance's view of the shared store: drainers per instance, the backlog, and
        the `top` jobs with the biggest backlog with the instance draining each (None: nobody
        yet; a scan takes it within a second)."""
        scan = await self.store.read(functools.partial(read_scan, instance=cluster.instance))
        biggest = sorted(scan.backlog, key=lambda j: (-scan.backlog[j], j))[:top]
        return {
            "drainers": spread.per_instance(scan.holders.values()),
            "backlog_events": sum(scan.backlog.values()),
            "backlog_jobs": len(scan.backlog),
            "jobs": [
                {"job": j, "backlog": scan.backlog[j], "instance": scan.holders.get(j)}
                for j in biggest
            ],
        }

    async def _scan_loop(self, cluster: Cluster) -> None:
        wakeups = self.store.wakeups
        while True:
            released = wakeups.event(wake.RELEASED)  # a drainer lease given back, by any member
            # While events wait somewhere their drainer's holder may die: look every tick, so
            # its lease moves within about lease + 1 s. Idle, only a release or the safety poll.
            with trio.move_on_after(
                cluster_rules.poll_every_s(cluster.lease_s) if self._backlog_seen else math.inf
            ):
                await wakeups.wait(released)
            try:
                await self.scan_once(cluster)
            except DB_ERRORS as exc:
                log.warning("webhook drainer scan failed", error=f"{type(exc).__name__}: {exc}")

    async def scan_once(self, cluster: Cluster) -> list[str]:
        """Take the drainer leases of jobs with undelivered events nobody drains (up to this
        instance's fair share) and start their drainers; returns the job ids taken."""

        scan = await self.store.read(
            functools.partial(read_scan, instance=cluster.instance, full=False)
        )
        self._backlog_seen = bool(scan.backlog)
        running = [j.id for j in self._active.values() if j.drainer]
        wanted = spread.to_take(
            spread.free_jobs(scan.backlog, scan.held, running),
            scan.held_here,
            len(scan.backlog),
            scan.members,
        )
        if not wanted:
            return []
        leases = await cluster.try_acquire([jobstore.stream_name(j) for j in wanted])
        if not leases:
            return []
        ids = [lease.name[len(jobstore.STREAM_PREFIX) :] for lease in leases]
        records = await self.store.read(lambda c: [jobstore.get_job(c, i) for i in ids])
        for lease, record in zip(leases, records, strict=True):
            job = self._active.get(record.id) if record is not None else None
            if record is None or record.webhook is None or (job is not None and job.drainer):
                await cluster.release(lease)
                continue
            if job is None:
                job = self._active[record.id] = self._state_from(record, scan.backlog[record.id])
            log.info("taking over a job's webhook delivery", job=record.id)
            self._spawn(job, lease)
        return ids
