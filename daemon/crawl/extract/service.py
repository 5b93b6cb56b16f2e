# /v2/extract jobs: structured data from a list of URLs, a `/*` URL meaning "this part of the
# site". A job is a row of `jobs` (kind extract, so its webhook events, expiry and DELETE are the
# jobs part's) plus its plan and pages (daemon/crawl/extract/store.py). Pages are produced by the
# crawl engine every crawl uses (SSRF-guarded fetcher, per-host gate, global fetch slots, the
# browser when configured); a `/*` URL is expanded by crawling from its base, within its path,
# with its sitemap and robots.txt, up to the job's `limit`, links admitted as pages commit.
#
# Each page is turned into markdown and sent to the LLM service (daemon/llm/) with the schema
# and prompt; its answer (or its error) is stored with the page in one transaction with the
# links it admitted. So a kill -9 loses at most the pages whose answer had not committed, and a
# restarted job (same id: the service's scan picks up every running extract job) asks the model
# only about pages still queued. Once no page is queued, the stored answers are merged by the
# pure rules of merge.py and the job completes with `extract.completed` carrying the
# result; a job whose every page failed fails with the first page's error. A page that fails
# (fetch, empty page, model error) is an entry of the job's error list, never a stuck job.
#
# Cluster mode: one instance works on an extract job at a time, under the lease
# `extract:<job id>`; another takes over where the pages stand if it dies.
#
# This room creates the jobs and keeps one run per running job; the work on one job (kickoff,
# pages, merge) is daemon/crawl/extract/run.py.
from __future__ import annotations

import uuid
from typing import Any, Protocol

import msgspec
import trio

from daemon.clock import EpochClock, wall_ms
from daemon.cluster import Cluster
from daemon.crawl.extract import store as xstore
from daemon.crawl.extract.models import ExtractPlan
from daemon.crawl.extract.run import ExtractRun
from daemon.crawl.runs.runs import Runs
from daemon.crawl.runs.service import CrawlService
from daemon.crawl.search.service import SearchService
from daemon.jobs.store import JobRecord
from daemon.llm import LlmResult
from daemon.store import Conn

SCAN_S = 5.0
"""How often running extract jobs without a run here are looked for without a wake-up (a job's
creation wakes every instance's scan: daemon/store/wake.py CRAWLS); those of a restart are
found at start."""


class Llm(Protocol):
    """What an extract job needs of daemon.llm.LlmService."""

    def configured(self, provider: str | None = None) -> bool: ...

    async def extract_json(
        self, content: str, *, schema: dict[str, Any] | None, prompt: str | None,
        provider: str | None = None,
    ) -> LlmResult: ...  # fmt: skip


class ExtractService:
    """Creates extract jobs and runs one ExtractRun per running job."""

    def __init__(
        self,
        crawl: CrawlService,
        llm: Llm | None,
        search: SearchService | None = None,
        *,
        clock_ms: EpochClock = wall_ms,
    ) -> None:
        self.crawl = crawl
        self.llm = llm
        self.search = search
        self.store = crawl.store
        self.jobs = crawl.jobs
        self.cluster: Cluster | None = crawl.cluster
        self.clock_ms = clock_ms
        self._runs: Runs[xstore.ExtractJobRow, ExtractRun] = Runs(
            "extract",
            self.store,
            self.jobs,
            xstore.running_job_ids,
            xstore.get_job,
            lambda row: ExtractRun(self, row),
        )
        self.runs = self._runs.by_id
        """The extract jobs running here, by job id."""
        self.model_calls = 0
        """Model calls made by extract jobs since start (/status)."""

    def configured(self, provider: str | None = None) -> bool:
        return self.llm is not None and self.llm.configured(provider)

    @property
    def can_search(self) -> bool:
        """A web search provider is configured ([search])."""
        return self.search is not None and self.search.enabled

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Resume the running extract jobs, then run new ones until cancelled."""
        await self._runs.serve(SCAN_S, task_status)

    async def start(self, plan: ExtractPlan) -> str:
        """Create the job (emitting `extract.started`) and start working on it."""
        encoded = msgspec.json.encode(plan)

        def setup(conn: Conn, job_id: str) -> None:
            xstore.insert_job(conn, job_id, encoded)

        job_id = await self.jobs.create_job(
            "extract", webhook=plan.webhook, source={"urls": plan.urls}, setup=setup
        )
        row = await self.store.read(lambda c: xstore.get_job(c, job_id))
        if row is not None:
            self._runs.spawn(row)
        return job_id

    async def get(self, job_id: str) -> tuple[JobRecord, xstore.ExtractJobRow] | None:
        """The job and its extract row; None when no extract job has this id (or it expired)."""
        try:
            job_id = str(uuid.UUID(job_id))
        except ValueError:
            return None
        record = await self.jobs.get_job(job_id)
        if record is None or record.kind != "extract":
            return None
        row = await self.store.read(lambda c: xstore.get_job(c, job_id))
        return None if row is None else (record, row)

    def status(self) -> dict[str, Any]:
        return {
            "configured": self.configured(),
            "model_calls": self.model_calls,
            "jobs_running": len(self.runs),
            "jobs": {job_id: run.status() for job_id, run in list(self.runs.items())},
        }
