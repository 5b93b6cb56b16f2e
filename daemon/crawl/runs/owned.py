# One job's run from its start to its final status, written once for the extract and agent runs
# (the crawl's JobRun ends its jobs by its frontier instead). The run's own work decides the
# outcome; around it this says what ends the job otherwise (a DELETE, the job's deadline, a
# failure) and what leaves it running for the service's next scan (the store failing, the
# daemon stopping, the job ended elsewhere). In cluster mode the work and its final status are
# done under the lease `<kind>:<job id>`, so an instance waiting for it finds the job finished.
from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from daemon.cluster import Cluster, Lease
from daemon.cluster import store as cluster_store
from daemon.jobs.manager import JobManager
from daemon.jobs.types import JobFinished, JobNotFound
from daemon.logs import get_logger
from daemon.store import DB_ERRORS, Store, StoreClosed

Outcome = tuple[str, str | None, list[Any] | None]
"""(status, error, the final event's data) a job ends with."""


async def work_on(
    kind: str,
    job_id: str,
    *,
    jobs: JobManager,
    store: Store,
    cluster: Cluster | None,
    work: Callable[[Lease | None], Awaitable[Outcome]],
    finish: Callable[[str, str | None, list[Any] | None], Awaitable[None]],
    end: Callable[[str, str | None], Awaitable[None]],
    deadline: Callable[[], float],
    failure: type[Exception],
    timed_out: str,
    cancelled: str,
) -> None:
    """Run `work(lease)` and `finish` its outcome until the job has its final status (given
    here, by another instance, or by a DELETE); returns early, the job left running, when the
    daemon stops or the store fails. A DELETE ends the job `cancelled` (`cancelled` its error),
    the trio time `deadline()` `failed` with `timed_out`, a `failure` raised by `work` `failed`
    with its text, any other exception `failed` as an internal error: each through
    `end(status, error)`."""
    log = get_logger(kind)
    try:
        cancel = jobs.cancel_requested(job_id)
    except JobNotFound:
        return
    outcome: tuple[str, str | None] | None = None
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            await cancel.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(watch)
        with trio.move_on_at(deadline()) as timed:
            try:
                await _owned(f"{kind}:{job_id}", cluster, work, finish)
            except (JobFinished, JobNotFound):
                jobs.detach(job_id)
            except DB_ERRORS as exc:
                log.warning(f"{kind} job paused by a store error", job=job_id,
                            error=f"{type(exc).__name__}: {exc}")  # fmt: skip
                nursery.cancel_scope.cancel()
                return
            except failure as exc:
                outcome = ("failed", str(exc))
            except Exception as exc:
                log.error(f"{kind} job failed", job=job_id, exc_info=exc)
                outcome = ("failed", f"internal error: {type(exc).__name__}")
        if timed.cancelled_caught:
            outcome = ("failed", timed_out)
        nursery.cancel_scope.cancel()
    if cancel.is_set():
        outcome = ("cancelled", cancelled)
    if outcome is not None:
        await end(*outcome)
    if cluster is not None and cluster.multi:
        with contextlib.suppress(*DB_ERRORS, StoreClosed):
            await store.write(lambda c: cluster_store.drop_leases(c, f"{kind}:{job_id}"))


async def _owned(
    lease_name: str,
    cluster: Cluster | None,
    work: Callable[[Lease | None], Awaitable[Outcome]],
    finish: Callable[[str, str | None, list[Any] | None], Awaitable[None]],
) -> None:
    if cluster is None or not cluster.multi:
        await finish(*await work(None))
        return

    async def owned(lease: Lease) -> None:
        await finish(*await work(lease))

    await cluster.run_owned(lease_name, owned)
