# The runs one service works on in this process, one per running job, written once for the crawl,
# extract and agent services: the loop that resumes the running jobs at start and then looks
# again at each job creation (any instance's) and every few seconds, and what one look does. Each
# run is made from the job's stored row; a row whose plan no longer
# decodes fails its job at once (else the job would sit `scraping` forever, retried by every scan).
# A run returns when its job has its final status, or early when the store fails under it or the
# daemon's shutdown closes the store: the job stays running, and the service's next scan that
# reaches the store starts a run for it again (on this instance or another).
from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar

import msgspec
import trio

from daemon.jobs.manager import JobManager
from daemon.jobs.types import JobFinished, JobNotFound
from daemon.logs import get_logger
from daemon.store import DB_ERRORS, Conn, Store, StoreClosed, wake
from daemon.supervise import describe


class Run(Protocol):
    @property
    def job_id(self) -> str: ...

    async def run(self) -> None: ...


class Row(Protocol):
    @property
    def job_id(self) -> str: ...


RunT = TypeVar("RunT", bound=Run)
RowT = TypeVar("RowT", bound=Row)


class Runs(Generic[RowT, RunT]):
    """The `kind` jobs' runs in this process by job id (`by_id`), started in `nursery` (set by
    `serve` while it runs) with `make(row)`. `running(conn)` reads the ids of the kind's jobs
    still running, `get(conn, job_id)` one job's row (None: gone)."""

    def __init__(
        self,
        kind: str,
        store: Store,
        jobs: JobManager,
        running: Callable[[Conn], list[str]],
        get: Callable[[Conn, str], RowT | None],
        make: Callable[[RowT], RunT],
    ) -> None:
        self.kind = kind
        self.log = get_logger(kind)
        self.store = store
        self.jobs = jobs
        self.running = running
        self.get = get
        self.make = make
        self.by_id: dict[str, RunT] = {}
        self.nursery: trio.Nursery | None = None

    async def serve(
        self,
        every_s: float,
        task_status: trio.TaskStatus[None],
        first: Callable[[trio.Nursery], Awaitable[None]] | None = None,
    ) -> None:
        """Resume the running jobs (after `first(nursery)`, when given), report started, then
        start those created since (woken by a creation in any process, and at least every
        `every_s`) until cancelled."""
        try:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                if first is not None:
                    await first(nursery)
                wakeups = self.store.wakeups
                created = wakeups.event(wake.CRAWLS)  # taken before the first look
                if found := await self.scan():
                    self.log.info(f"working on running {self.kind} jobs", jobs=found)
                task_status.started()
                await wake.rescan(wakeups, wake.CRAWLS, every_s, self.scan, DB_ERRORS, created)
        finally:
            self.stopped()

    async def scan(self) -> int:
        """Start a run for each running job without one here; returns how many started."""
        ids = await self.store.read(self.running)
        new = [job_id for job_id in ids if job_id not in self.by_id]
        if not new:
            return 0
        rows = await self.store.read(lambda c: [self.get(c, job_id) for job_id in new])
        started = 0
        for row in rows:
            if row is None or row.job_id in self.by_id:
                continue
            with contextlib.suppress(JobNotFound, JobFinished):
                await self.jobs.attach(row.job_id)
                self.spawn(row)
                started += 1
        return started

    def spawn(self, row: RowT) -> None:
        """Start a run for the job of `row`, unless one runs here already or the service does
        not run; a plan that no longer decodes fails the job instead."""
        if self.nursery is None or row.job_id in self.by_id:
            return
        try:
            run = self.make(row)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self.log.error(f"{self.kind} job plan unreadable; failing the job", job=row.job_id,
                      error=str(exc))  # fmt: skip
            self.nursery.start_soon(self._fail, row.job_id, "internal error: unreadable plan")
            return
        self.by_id[row.job_id] = run
        self.nursery.start_soon(self._run, run)

    def stopped(self) -> None:
        """The service's nursery closed: no run is left."""
        self.nursery = None
        self.by_id.clear()

    async def _fail(self, job_id: str, error: str) -> None:
        with contextlib.suppress(JobFinished, JobNotFound):
            await self.jobs.finish(job_id, "failed", error)

    async def _run(self, run: RunT) -> None:
        try:
            await run.run()
        except StoreClosed:
            pass
        except DB_ERRORS as exc:
            self.log.warning(f"{self.kind} job interrupted by the store; the next scan resumes it",
                             job=run.job_id, error=describe(exc))  # fmt: skip
        finally:
            self.by_id.pop(run.job_id, None)
