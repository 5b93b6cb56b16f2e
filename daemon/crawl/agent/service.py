# /v2/agent jobs: a prompt (and optionally URLs and a schema) answered by a bounded loop of web
# search, page reads and model choices (daemon/crawl/agent/run.py, decided by loop.py). A job is
# a row of `jobs` (kind agent, so its webhook events, expiry and the jobs API's DELETE are the
# jobs part's) plus its plan, pages and steps (store.py). Pages are read by the crawl engine every
# crawl uses (SSRF-guarded fetcher, per-host gate, global fetch slots, the document cache, the
# browser when configured); the model is the LLM service's (daemon/llm/), its limits included.
#
# Cluster mode: one instance works on an agent job at a time, under the lease `agent:<job id>`;
# another takes over from the last committed step if it dies. A DELETE reaches the run where it
# runs (the jobs part's cancel event); a job no instance works on is cancelled at once.
#
# This room creates the jobs and keeps one run per running job.
from __future__ import annotations

import uuid
from typing import Any, Protocol

import msgspec
import trio

from daemon.clock import EpochClock, wall_ms
from daemon.cluster import Cluster
from daemon.crawl.agent import store as astore
from daemon.crawl.agent.config import AgentConfig
from daemon.crawl.agent.models import AgentPlan, AgentStep
from daemon.crawl.agent.run import CANCELLED, AgentRun
from daemon.crawl.runs.runs import Runs
from daemon.crawl.runs.service import CrawlService
from daemon.crawl.search.service import SearchService
from daemon.jobs.records import iso_ms
from daemon.jobs.store import JobRecord
from daemon.llm import LlmResult
from daemon.store import Conn

SCAN_S = 5.0
"""How often running agent jobs without a run here are looked for without a wake-up (a job's
creation wakes every instance's scan); those of a restart are found at start."""
DEFAULT_LIMITS = (16_000, 2048)
"""(max_input_tokens, max_output_tokens) when the provider's settings cannot be read."""

_decode = msgspec.json.Decoder().decode


class Llm(Protocol):
    """What an agent job needs of daemon.llm.LlmService."""

    def configured(self, provider: str | None = None) -> bool: ...

    def provider_names(self) -> list[str]: ...

    async def extract_json(
        self, content: str, *, schema: dict[str, Any] | None, prompt: str | None,
        provider: str | None = None,
    ) -> LlmResult: ...  # fmt: skip


class AgentService:
    """Creates agent jobs and runs one AgentRun per running job."""

    def __init__(
        self,
        crawl: CrawlService,
        llm: Llm | None,
        search: SearchService | None,
        config: AgentConfig,
        *,
        clock_ms: EpochClock = wall_ms,
    ) -> None:
        self.crawl = crawl
        self.llm = llm
        self.search = search
        self.config = config
        self.store = crawl.store
        self.jobs = crawl.jobs
        self.cluster: Cluster | None = crawl.cluster
        self.clock_ms = clock_ms
        self._runs: Runs[astore.AgentJobRow, AgentRun] = Runs(
            "agent",
            self.store,
            self.jobs,
            astore.running_job_ids,
            astore.get_job,
            lambda row: AgentRun(self, row),
        )
        self.runs = self._runs.by_id
        """The agent jobs running here, by job id."""
        self.model_calls = 0
        """Model calls made by agent runs since start (/status)."""

    def configure(self, config: AgentConfig) -> None:
        """A reload: runs started from now on keep to `config`."""
        self.config = config

    def configured(self, provider: str | None = None) -> bool:
        return self.llm is not None and self.llm.configured(provider)

    def providers(self) -> frozenset[str]:
        """The configured `[llm.providers]` names (and "default")."""
        return frozenset(self.llm.provider_names()) if self.llm is not None else frozenset()

    @property
    def can_search(self) -> bool:
        """A web search provider is configured ([search])."""
        return self.search is not None and self.search.enabled

    def model_limits(self, provider: str | None) -> tuple[int, int]:
        """(max_input_tokens, max_output_tokens) of the provider a run uses."""
        config = getattr(self.llm, "config", None)
        settings = config.provider(provider) if config is not None else None
        if settings is None:
            return DEFAULT_LIMITS
        return settings.max_input_tokens, settings.max_output_tokens

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Resume the running agent jobs, then run new ones until cancelled."""
        await self._runs.serve(SCAN_S, task_status)

    async def start(self, plan: AgentPlan) -> str:
        """Create the job (emitting `agent.started`) and start working on it."""
        encoded = msgspec.json.encode(plan)

        def setup(conn: Conn, job_id: str) -> None:
            astore.insert_job(conn, job_id, encoded)

        source = {"prompt": plan.prompt[:200], "urls": plan.urls}
        job_id = await self.jobs.create_job("agent", webhook=plan.webhook, source=source,
                                            setup=setup)  # fmt: skip
        row = await self.store.read(lambda c: astore.get_job(c, job_id))
        if row is not None:
            self._runs.spawn(row)
        return job_id

    async def get(self, job_id: str) -> tuple[JobRecord, astore.AgentJobRow, int] | None:
        """The job, its agent row and the credits it used; None when no agent job has this id
        (or it expired)."""
        try:
            job_id = str(uuid.UUID(job_id))
        except ValueError:
            return None
        record = await self.jobs.get_job(job_id)
        if record is None or record.kind != "agent":
            return None

        def read(conn: Conn) -> tuple[astore.AgentJobRow | None, list[astore.StepRow]]:
            return astore.get_job(conn, job_id), astore.steps(conn, job_id)

        row, steps = await self.store.read(read)
        if row is None:
            return None
        return record, row, steps[-1].credits if steps else 0

    async def steps(self, job_id: str) -> list[AgentStep]:
        """Every step the job recorded, in order."""
        rows = await self.store.read(lambda c: astore.steps(c, job_id))
        return [
            AgentStep(step=r.n, action=r.action, input=_decode(r.input), output=_decode(r.output),
                      creditsUsed=r.credits, at=iso_ms(r.at_ms), ms=r.ms,
                      tokens=r.tokens)
            for r in rows
        ]  # fmt: skip

    async def cancel(self, record: JobRecord) -> bool:
        """DELETE of an agent job no run here works on (the JobManager's canceller): ended
        `cancelled` at once, its credits in the event. A job with a run here (or a job of
        another kind) is left to the manager, which asks the run to stop."""
        if record.kind != "agent" or record.id in self.runs:
            return False
        credits = 0
        found = await self.get(record.id)
        if found is not None:
            credits = found[2]
        await self.jobs.finish(record.id, "cancelled", CANCELLED, data=[{"creditsUsed": credits}])
        return True

    def status(self) -> dict[str, Any]:
        return {
            "configured": self.configured(),
            "search": self.can_search,
            "model_calls": self.model_calls,
            "jobs_running": len(self.runs),
            "jobs": {job_id: run.status() for job_id, run in list(self.runs.items())},
        }
