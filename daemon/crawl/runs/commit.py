# Storing what a crawl job's workers produced: a finished page (a document and the links it
# admits) or a failed one, a batch of them in one transaction, in the committer task of the run
# (daemon/crawl/runs/crawler.py). Only the rows this process still holds are stored, after the job's
# row is locked (which orders the commits of one crawl over every instance and says whether the
# crawl ended); the links admitted are counted against the crawl's `limit` inside the same
# transaction.
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from daemon.cluster import Lease, fenced
from daemon.crawl.options import rules
from daemon.crawl.runs import store as crawlstore
from daemon.crawl.runs.ending import CrawlEnded
from daemon.jobs import store as jobstore
from daemon.jobs.manager import JobManager, PendingEvents
from daemon.store import Conn


@dataclass
class Page:
    """A fetched page, turned into a document."""

    entry: crawlstore.FrontierEntry
    document: dict[str, Any]
    links: rules.Admission
    final_key: str | None = None
    """Dedupe key of the URL a redirect ended at, when it differs from the requested one."""
    refused: tuple[str, str] | None = None
    """(code, reason) when the start URL itself breaks a rule: an error, its links still used."""


@dataclass
class Failed:
    entry: crawlstore.FrontierEntry
    code: str
    error: str


Outcome = Page | Failed


def commit_tx(
    conn: Conn,
    batch: list[Outcome],
    at: int,
    *,
    job_id: str,
    claimant: str,
    lease: Lease | None,
    jobs: JobManager,
    keep: bool,
    limit: float,
) -> list[PendingEvents]:
    """Store `batch` (pages finished at `at`) for `job_id`; CrawlEnded when the crawl's end was
    decided. `keep`: the documents are kept (no zeroDataRetention). Returns the events to hand
    to the JobManager after the commit."""
    fenced.check(conn, lease)
    if (ending := crawlstore.lock_job(conn, job_id)) is not None:
        raise CrawlEnded(ending)
    pendings: list[PendingEvents] = []
    for outcome in batch:
        entry = outcome.entry
        if not crawlstore.held_by(conn, job_id, entry.n, claimant):
            continue  # a redirect target of another page, or claimed again by another
        if isinstance(outcome, Failed):
            jobstore.add_error(conn, job_id, code=outcome.code, error=outcome.error,
                               url=entry.url, at_ms=at)  # fmt: skip
            crawlstore.set_state(conn, job_id, entry.n, "failed")
            continue
        if outcome.final_key is not None and not crawlstore.claim_target(
            conn, job_id, outcome.final_key, outcome.document["metadata"]["url"], entry.depth
        ):
            crawlstore.set_state(conn, job_id, entry.n, "skipped")
            continue
        if outcome.refused is not None:
            code, reason = outcome.refused
            jobstore.add_error(conn, job_id, code=code, error=reason, url=entry.url, at_ms=at)
            crawlstore.set_state(conn, job_id, entry.n, "failed")
        else:
            pendings.append(jobs.page_in_tx(conn, job_id, [outcome.document], keep=keep))
            crawlstore.set_state(conn, job_id, entry.n, "done")
        if outcome.links.candidates:
            room = limit - crawlstore.admitted(conn, job_id)
            crawlstore.admit(conn, job_id, outcome.links.candidates, int(min(room, 2**62)))
        blocked_in_tx(conn, job_id, outcome.links.robots_blocked, at)
    jobstore.set_total(conn, job_id, crawlstore.admitted(conn, job_id))
    return pendings


def blocked_in_tx(conn: Conn, job_id: str, urls: list[str], at: int) -> None:
    """Record the URLs robots.txt refused (each once per job) as ROBOTS_BLOCKED errors."""
    for url in crawlstore.add_robots_blocked(conn, job_id, urls):
        jobstore.add_error(conn, job_id, code=jobstore.ROBOTS_BLOCKED,
                           error="URL blocked by robots.txt", url=url, at_ms=at)  # fmt: skip
