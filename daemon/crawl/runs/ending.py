# How a crawl job's work ends or is interrupted: an exception (often a group, from the nursery of
# workers and committer) is classified by its leaves; a store failure or a lost lease interrupts
# the work without ending the job, and the end decided once in the store (`crawlstore.conclude`)
# is applied by `apply_end`, here, for the run (daemon/crawl/runs/crawler.py) and for a DELETE
# (daemon/crawl/runs/service.py) alike.
from __future__ import annotations

import functools

from daemon.cluster import LeaseLost
from daemon.cluster import store as cluster_store
from daemon.crawl.metrics import crawl_jobs
from daemon.crawl.runs import store as crawlstore
from daemon.jobs import events
from daemon.jobs.manager import JobManager
from daemon.jobs.store import JobFinished, JobNotFound
from daemon.logs import get_logger
from daemon.store import DB_ERRORS, Store, StoreClosed

_STORE_FAILURES: tuple[type[BaseException], ...] = (*DB_ERRORS, StoreClosed)
log = get_logger("crawl")

INTERRUPTIONS: tuple[type[BaseException], ...] = (*DB_ERRORS, LeaseLost)
"""What interrupts a job's work without ending it: the store failed (unreachable, a commit
whose outcome is unknown, a reader timing out) or the crawl's lease was lost."""


class CrawlEnded(Exception):
    """The crawl's end was decided (by any instance): nothing more is stored for it here."""


def leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in leaves(sub)]
    return [exc]


def any_of(exc: BaseException, kinds: type[BaseException]) -> bool:
    """Whether `exc` is, or (an exception group) holds, one of `kinds`."""
    return any(isinstance(leaf, kinds) for leaf in leaves(exc))


def all_of(exc: BaseException, kinds: tuple[type[BaseException], ...]) -> bool:
    """Whether `exc` and every exception a group of it holds is one of `kinds`."""
    return all(isinstance(leaf, kinds) for leaf in leaves(exc))


def summary(exc: BaseException) -> str:
    return "; ".join(f"{type(leaf).__name__}: {leaf}".splitlines()[0] for leaf in leaves(exc))


async def apply_end(
    store: Store, jobs: JobManager, kind: str, job_id: str, status: str, error: str | None
) -> bool:
    """Give a crawl whose end this process decided (`crawlstore.conclude`) its final status and
    terminal event, then drop its frontier and lease row (documents and errors stay). False
    when the job already had a final status. A crawl is only ever `cancelled` by a DELETE: its
    stored error says so."""
    if status == "cancelled" and error is None:
        error = events.CANCELLED_BY_USER
    try:
        await jobs.finish(job_id, status, error)  # type: ignore[arg-type]
    except (JobFinished, JobNotFound):
        return False
    crawl_jobs.labels(kind, status).inc()
    step = functools.partial(crawlstore.purge_frontier, job_id=job_id, chunk=2000)
    try:
        while not await store.write(step):
            pass
        await store.write(lambda c: cluster_store.drop_leases(c, f"crawl:{job_id}"))
    except _STORE_FAILURES as exc:
        log.warning("frontier not purged", job=job_id, error=str(exc))
    return True
