# One /v2/agent job being worked on by this process (service.py creates the jobs and runs one
# AgentRun per running job). The run is a loop around the pure decisions of loop.py: before every
# step it reads the job's pages and steps from the store and asks `next_step` what to do, then
# does it — the kickoff (the request's URLs and one web search for the prompt), reading chosen
# pages through the crawl engine (its SSRF guard, host gate, fetch slots and document cache), a
# structured model call choosing what to read next, or the answer — and commits the step, the
# pages it changed and its `agent.action` event in one transaction. A kill -9 so loses at most
# the steps in flight; the restarted run (same id: the service's scan finds every running agent
# job) decides again from what had committed.
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec
import trio
from prometheus_client import Counter

from daemon.cluster import Lease, LeaseLost, fenced
from daemon.crawl.agent import loop, prompts
from daemon.crawl.agent import store as astore
from daemon.crawl.agent.models import decode_plan, wildcard_base
from daemon.crawl.discovery.robots import Robots, fetch_scope_robots
from daemon.crawl.fetching.fetch import FetchError
from daemon.crawl.fetching.urls import CrawlScope, dedupe_key, parse_http_url
from daemon.crawl.options import rules
from daemon.crawl.runs.owned import work_on
from daemon.jobs import store as jobstore
from daemon.jobs.store import JobFinished, JobNotFound
from daemon.llm import LlmError, LlmResult
from daemon.logs import get_logger
from daemon.metrics import REGISTRY
from daemon.redact import redact_url
from daemon.search import SearchError, SearchQuery
from daemon.store import DB_ERRORS, Conn

if TYPE_CHECKING:
    from daemon.crawl.agent.service import AgentService

log = get_logger("agent")

CANCELLED = "cancelled by a user (DELETE /v2/agent/{id})"
SEARCH_RESULTS = 10
LINKS_PER_PAGE = 100
SEARCH_FAILED = "SEARCH_FAILED"
NOT_READ = "AGENT_PAGE_NOT_READ"
_STOP: tuple[type[BaseException], ...] = (JobFinished, JobNotFound, LeaseLost, *DB_ERRORS)
_decode = msgspec.json.Decoder().decode

agent_runs = Counter(
    "crawld_agent_runs", "Finished /v2/agent runs by status", ["status"], registry=REGISTRY
)
agent_steps = Counter(
    "crawld_agent_steps",
    "Steps of /v2/agent runs by action (search, scrape, choose, answer)",
    ["action"],
    registry=REGISTRY,
)


class AgentFailed(Exception):
    """The run cannot go on: it fails with this text."""


def _tokens(result: LlmResult) -> int:
    return 0 if result.cached else result.usage.prompt_tokens + result.usage.completion_tokens


class AgentRun:
    """One agent job being worked on by this process."""

    def __init__(self, service: AgentService, row: astore.AgentJobRow) -> None:
        self.service = service
        self.store = service.store
        self.jobs = service.jobs
        self.job_id = row.job_id
        self.row = row
        self.plan = decode_plan(row.plan)
        self.config = service.config
        self.engine = service.crawl.engine
        self.page_plan = self.engine.plan(self.plan.options)
        self.scopes: dict[int, CrawlScope] = {}
        for i, url in enumerate(self.plan.urls):
            if (base := wildcard_base(url)) is not None:
                self.scopes[i] = CrawlScope(start_url=base)
        self.robots: dict[int, Robots] = {}
        self.lease: Lease | None = None
        self.commit_lock = trio.Lock()
        self.doing = "starting"
        self.steps = 0
        self.stopped: BaseException | None = None

    def status(self) -> dict[str, Any]:
        return {"doing": self.doing, "steps": self.steps}

    # -- lifecycle -------------------------------------------------------------------------

    async def run(self) -> None:
        """Work on the job until it has its final status; returns early, the job left running,
        when the daemon stops or the store fails (the service's scan starts it again)."""
        seconds = f"{float(self.config.timeout):g}"
        await work_on(
            "agent", self.job_id, jobs=self.jobs, store=self.store, cluster=self.service.cluster,
            work=self._work, finish=self._finish, end=self._end, deadline=self._deadline,
            failure=AgentFailed, timed_out=f"Agent timed out after {seconds} s ([agent] timeout)",
            cancelled=CANCELLED,
        )  # fmt: skip

    async def _end(self, status: str, error: str | None) -> None:
        await self._finish(status, error, [{"creditsUsed": await self._credits()}])

    def _deadline(self) -> float:
        left_ms = self.row.created_ms + float(self.config.timeout) * 1000 - self.service.clock_ms()
        return trio.current_time() + max(0.0, left_ms / 1000)

    async def _credits(self) -> int:
        steps = await self.store.read(lambda c: astore.steps(c, self.job_id))
        return steps[-1].credits if steps else 0

    async def _finish(self, status: str, error: str | None, data: list[Any] | None) -> None:
        try:
            await self.jobs.finish(self.job_id, status, error, data=data)  # type: ignore[arg-type]
        except (JobFinished, JobNotFound):
            return
        agent_runs.labels(status).inc()
        log.info("agent job finished", job=self.job_id, status=status, steps=self.steps,
                 error=error)  # fmt: skip

    def _check(self, conn: Conn) -> None:
        fenced.check(conn, self.lease)
        jobstore.require_running(conn, self.job_id)

    # -- the loop --------------------------------------------------------------------------

    async def _work(self, lease: Lease | None) -> tuple[str, str | None, list[Any]]:
        self.lease = lease
        record = await self.jobs.get_job(self.job_id)
        if record is None or record.finished:
            raise JobFinished(self.job_id, record.status if record else "gone")
        if self.service.llm is None or not self.service.llm.configured(self.plan.provider):
            raise AgentFailed("no LLM is configured ([llm]) for this agent's model")
        await fetch_scope_robots(self.engine.fetcher, self.scopes, self.robots)
        while True:
            row, pages, steps = await self.store.read(self._load)
            if row is None:
                raise JobNotFound(self.job_id)
            if row.result is not None:  # answered before a restart: only its end is left
                return self._completed(steps[-1].credits, row)
            self.steps = len(steps)
            state = _state(row, pages, steps)
            step = loop.next_step(state, self._limits(state.candidates))
            self.doing = step.action
            if step.action == "kickoff":
                await self._kickoff()
            elif step.action == "read":
                await self._read([p for p in pages if p.state == "chosen"][: step.count])
            elif step.action == "choose":
                await self._choose(step.count, pages)
            elif step.action == "answer":
                return await self._answer(step.reason, pages, state)
            else:
                raise AgentFailed(self._failure(step.reason, pages, steps, state))

    def _load(self, conn: Conn) -> tuple[Any, list[astore.PageRow], list[astore.StepRow]]:
        return (astore.get_job(conn, self.job_id), astore.pages(conn, self.job_id),
                astore.steps(conn, self.job_id))  # fmt: skip

    def _limits(self, candidates: int) -> loop.Limits:
        cfg, plan = self.config, self.plan
        max_input, max_output = self.service.model_limits(plan.provider)
        shown = min(candidates, cfg.candidates) * (prompts.SNIPPET + 160)
        schema_chars = len(msgspec.json.encode(prompts.answer_schema(plan.schema)))
        return loop.Limits(
            max_steps=loop.step_cap(cfg.max_steps, plan.effort),
            max_credits=plan.max_credits,
            tokens_per_credit=cfg.tokens_per_credit,
            per_step=cfg.pages_per_step,
            choice_tokens=prompts.tokens_of(len(plan.prompt) + shown + 1500) + 300,
            answer_base=prompts.tokens_of(len(plan.prompt) + schema_chars + 600) + max_output,
            page_tokens=prompts.tokens_of(cfg.page_chars + 200),
            answer_cap=max_input,
        )

    def _failure(
        self,
        reason: loop.Reason,
        pages: list[astore.PageRow],
        steps: list[astore.StepRow],
        state: loop.LoopState,
    ) -> str:
        first = None
        searches = [_decode(s.output) for s in steps if s.action == "search"]
        if searches and searches[0].get("error"):
            first = str(searches[0]["error"])
        failed = [p for p in pages if p.state == "failed"]
        if first is None and failed:
            first = f"{redact_url(failed[0].url)}: {failed[0].error}"
        return loop.failure(
            reason, used=loop.credits(state.spend, self.config.tokens_per_credit),
            max_credits=self.plan.max_credits, first_error=first, searched=self.plan.search,
        )  # fmt: skip

    # -- steps -----------------------------------------------------------------------------

    async def _step(
        self,
        action: str,
        input_: dict[str, Any],
        output: dict[str, Any],
        cost: loop.Spend,
        apply: Callable[[Conn], bool] | None = None,
        started: float | None = None,
    ) -> int | None:
        """Commit one step with `apply` (which says False when there is nothing to store) and
        its `agent.action` event; returns the run's credits after it (None: not stored).
        `started`: time.monotonic() when its work began (its duration is recorded)."""
        at = self.service.clock_ms()
        ms = 0 if started is None else int((time.monotonic() - started) * 1000)
        tpc = self.config.tokens_per_credit

        def tx(conn: Conn) -> tuple[Any, int] | None:
            self._check(conn)
            if apply is not None and not apply(conn):
                return None
            spent = sum((loop.Spend(s.pages, s.searches, s.tokens)
                         for s in astore.steps(conn, self.job_id)), cost)  # fmt: skip
            credits = loop.credits(spent, tpc)
            n = astore.add_step(
                conn, self.job_id, action, input_, output, credits=credits,
                cost=(cost.pages, cost.searches, cost.tokens), at_ms=at, ms=ms,
            )  # fmt: skip
            event = {"creditsUsed": credits, "action": action, "input": input_,
                     "output": output, "step": n}  # fmt: skip
            return self.jobs.event_in_tx(conn, self.job_id, "action", [event]), credits

        async with self.commit_lock:
            done = await self.store.write(tx)
            if done is None:
                return None
            await self.jobs.after_commit(done[0])
        agent_steps.labels(action).inc()
        self.steps += 1
        return done[1]

    async def _kickoff(self) -> None:
        """Admit the request's URLs (a `/*` URL as its base) to read first, and the results of
        a web search for the prompt (unless strictConstrainToURLs) as candidates."""
        given = []
        for i, url in enumerate(self.plan.urls):
            base = wildcard_base(url) or url
            given.append(astore.NewPage(_key(base), base, "request", i if i in self.scopes else -1))
        found: list[astore.NewPage] = []
        error = None
        started = time.monotonic()
        if self.plan.search:
            found, error = await self._search()
        at = self.service.clock_ms()

        def apply(conn: Conn) -> bool:
            if not astore.set_kicked_off(conn, self.job_id):
                return False
            if error is not None:
                jobstore.add_error(conn, self.job_id, code=SEARCH_FAILED, error=error,
                                   url=None, at_ms=at)  # fmt: skip
            astore.admit(conn, self.job_id, given, "chosen")
            astore.admit(conn, self.job_id, found, "candidate")
            return True

        if not self.plan.search:  # no step to record: the pages are admitted alone

            def tx(conn: Conn) -> None:
                self._check(conn)
                apply(conn)

            await self.store.write(tx)
            return
        output: dict[str, Any] = {"results": len(found)}
        if error is not None:
            output = {"results": 0, "error": error}
        query = {"query": prompts.search_query(self.plan.prompt)}
        await self._step("search", query, output, loop.Spend(searches=1), apply, started)

    async def _search(self) -> tuple[list[astore.NewPage], str | None]:
        search = self.service.search
        if search is None or search.client is None:
            return [], "web search is not configured ([search])"
        query = SearchQuery(query=prompts.search_query(self.plan.prompt), limit=SEARCH_RESULTS,
                            country=self.plan.country)  # fmt: skip
        try:
            data = await search.client.search(query, timeout_s=float(search.config.timeout))
        except SearchError as exc:
            log.warning("agent web search failed", job=self.job_id, error=exc.message)
            return [], f"Web search failed: {exc.message}"
        found = []
        for item in data.get("web", []):
            url = str(item.get("url") or "")
            if parse_http_url(url) is not None:
                title, snippet = str(item.get("title") or ""), str(item.get("description") or "")
                found.append(astore.NewPage(_key(url), url, "search", -1, title, snippet))
        return found, None

    async def _read(self, chosen: list[astore.PageRow]) -> None:
        self.stopped = None
        async with trio.open_nursery() as nursery:
            for page in chosen:
                nursery.start_soon(self._read_one, page, nursery.cancel_scope)
        if self.stopped is not None:
            raise self.stopped

    async def _read_one(self, page: astore.PageRow, readers: trio.CancelScope) -> None:
        try:
            started = time.monotonic()
            title, text, error, links = await self._fetch(page)

            def apply(conn: Conn) -> bool:
                if not astore.finish_page(conn, self.job_id, page.n, title=title, text=text,
                                          error=error):  # fmt: skip
                    return False
                if error is not None:
                    jobstore.add_error(conn, self.job_id, code=NOT_READ, error=error,
                                       url=page.url, at_ms=self.service.clock_ms())  # fmt: skip
                astore.admit(conn, self.job_id, links, "candidate")
                return True

            output: dict[str, Any] = {"title": title, "chars": len(text or "")}
            if error is not None:
                output = {"error": error}
            cost = loop.Spend(pages=1)
            await self._step("scrape", {"url": page.url}, output, cost, apply, started)
        except _STOP as exc:
            if self.stopped is None:
                self.stopped = exc
            readers.cancel()

    async def _fetch(
        self, page: astore.PageRow
    ) -> tuple[str, str | None, str | None, list[astore.NewPage]]:
        """(title, text, error, links to admit) of one page."""
        engine = self.engine
        try:
            produced = await engine.maker.produce(page.url, self.page_plan, slot=engine.fetch_slots,
                                                  check_hop=self._check_hop(page))  # fmt: skip
        except FetchError as exc:
            return page.title, None, f"could not fetch the page: {exc.message}", []
        except Exception as exc:
            log.warning("page could not be turned into a document", url=redact_url(page.url),
                        exc_info=exc)  # fmt: skip
            return page.title, None, f"{type(exc).__name__} while parsing the page", []
        metadata = produced.document.get("metadata") or {}
        title = str(metadata.get("title") or page.title or "")
        links = self._links(page, produced.links)
        status = metadata.get("statusCode")
        if isinstance(status, int) and status >= 400:
            return title, None, f"the page answered HTTP {status}", links
        markdown = str(produced.document.get("markdown") or "").strip()
        if not markdown:
            return title, None, "the page has no text", links
        return title, markdown[: self.config.page_chars], None, links

    def _check_hop(self, page: astore.PageRow) -> Callable[[str], str | None] | None:
        """Redirects a strict run may follow: within a `/*` scope, or to the same host."""
        if not self.plan.strict:
            return None
        scope = self.scopes.get(page.root)
        if scope is not None:
            return lambda url: None if url == page.url else scope.refusal(url)
        host = _host(page.url)

        def same_host(url: str) -> str | None:
            if _host(url) == host:
                return None
            return "a redirect away from the given URL (strictConstrainToURLs)"

        return same_host

    def _links(self, page: astore.PageRow, links: list[str]) -> list[astore.NewPage]:
        """The links of a page the agent may read later: under its `/*` scope with robots.txt's
        leave in a strict run, any http(s) link otherwise."""
        scope = self.scopes.get(page.root)
        if self.plan.strict and scope is None:
            return []
        refusal: Callable[[str], str | None] = _http_only
        allowed: Callable[[str], bool] = _yes
        if scope is not None:
            refusal, allowed = scope.refusal, self.robots[page.root].allowed
        admission = rules.admit_links(links, 0, rules.LinkPolicy(), refusal, allowed)
        root = page.root if scope is not None else -1
        return [astore.NewPage(key, url, "link", root)
                for key, url, _ in admission.candidates[:LINKS_PER_PAGE]]  # fmt: skip

    async def _choose(self, most: int, pages: list[astore.PageRow]) -> None:
        candidates = [prompts.Candidate(p.url, p.title, p.snippet)
                      for p in pages if p.state == "candidate"]  # fmt: skip
        shown = prompts.ranked(candidates, self.plan.prompt, self.config.candidates)
        content = prompts.choice_content(_texts(pages), shown)
        tokens, chosen, output = 0, list[str](), dict[str, Any]()
        started = time.monotonic()
        try:
            instruction = prompts.choice_instruction(self.plan.prompt, most)
            result = await self._ask(content, prompts.CHOICE_SCHEMA, instruction)
        except LlmError as exc:  # no choice: the run answers from what it read
            output["error"] = f"{exc.code}: {exc.message}"[:500]
        else:
            tokens = _tokens(result)
            chosen = prompts.chosen_urls(result.value, shown, most)
        output["chosen"] = chosen

        def apply(conn: Conn) -> bool:
            astore.choose(conn, self.job_id, chosen)
            return True

        await self._step("choose", {"candidates": len(shown)}, output, loop.Spend(tokens=tokens),
                         apply, started)  # fmt: skip

    async def _ask(self, content: str, schema: dict[str, Any], instruction: str) -> LlmResult:
        llm = self.service.llm
        assert llm is not None
        self.service.model_calls += 1
        return await llm.extract_json(content, schema=schema, prompt=instruction,
                                      provider=self.plan.provider)  # fmt: skip

    async def _answer(
        self, reason: loop.Reason, pages: list[astore.PageRow], state: loop.LoopState
    ) -> tuple[str, str | None, list[Any]]:
        texts = _texts(pages)
        max_input, _ = self.service.model_limits(self.plan.provider)
        budget = int((max_input - prompts.tokens_of(len(self.plan.prompt) + 2000)) * 3.5)
        content = prompts.answer_content(texts, max(budget, 2000))
        instruction = prompts.answer_instruction(self.plan.prompt, self.plan.schema is not None)
        started = time.monotonic()
        try:
            result = await self._ask(content, prompts.answer_schema(self.plan.schema), instruction)
        except LlmError as exc:
            error = f"The model could not answer: {exc.code}: {exc.message}"[:2000]
            await self._step("answer", {"pages": len(texts)}, {"error": error}, loop.Spend(),
                             started=started)  # fmt: skip
            raise AgentFailed(error) from None
        answer = prompts.read_answer(result.value, texts)
        cap = loop.step_cap(self.config.max_steps, self.plan.effort)
        message = loop.stop_note(reason, read=state.read, max_credits=self.plan.max_credits,
                                 max_steps=cap)  # fmt: skip

        def apply(conn: Conn) -> bool:
            astore.save_result(conn, self.job_id, answer.data, answer.sources, message)
            return True

        credits = await self._step("answer", {"pages": len(texts)}, {"sources": answer.sources},
                                   loop.Spend(tokens=_tokens(result)), apply, started)  # fmt: skip
        return "completed", None, [{"creditsUsed": credits, "data": answer.data,
                                    "sources": answer.sources}]  # fmt: skip

    def _completed(self, credits: int, row: astore.AgentJobRow) -> tuple[str, None, list[Any]]:
        data = _decode(row.result) if row.result is not None else None
        sources = _decode(row.sources) if row.sources is not None else []
        return "completed", None, [{"creditsUsed": credits, "data": data, "sources": sources}]


def _state(
    row: astore.AgentJobRow, pages: list[astore.PageRow], steps: list[astore.StepRow]
) -> loop.LoopState:
    last = _decode(steps[-1].output) if steps and steps[-1].action == "choose" else None
    return loop.LoopState(
        kicked_off=row.kicked_off,
        steps=len(steps),
        chosen=sum(1 for p in pages if p.state == "chosen"),
        candidates=sum(1 for p in pages if p.state == "candidate"),
        read=sum(1 for p in pages if p.state == "read"),
        last_choice_empty=last is not None and not last.get("chosen"),
        spend=sum((loop.Spend(s.pages, s.searches, s.tokens) for s in steps), loop.Spend()),
    )


def _texts(pages: list[astore.PageRow]) -> list[prompts.PageText]:
    return [prompts.PageText(p.url, p.title, p.text or "") for p in pages if p.state == "read"]


def _host(url: str) -> str | None:
    parsed = parse_http_url(url)
    return None if parsed is None else parsed.host


def _key(url: str) -> str:
    return dedupe_key(url, ignore_query=False, similar=True)


def _yes(url: str) -> bool:
    return True


def _http_only(url: str) -> str | None:
    return None if parse_http_url(url) is not None else "not an http(s) URL"
