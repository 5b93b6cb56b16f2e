# Firecrawl v2's /agent over HTTP: POST starts an agent job, GET /v2/agent/{id} answers its
# status as firecrawl-py's `get_agent_status` / `agent` (which polls it) and firecrawl-mcp's
# `firecrawl_agent_status` read it, DELETE cancels it (firecrawl-py's `cancel_agent` reads only
# `success`). The answers keep to the keys firecrawl-mcp's output schemas allow; the run's trace
# is crawld's own GET /v2/agent/{id}/steps. The job itself: daemon/crawl/agent/.
from __future__ import annotations

from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from daemon.api.app import UUID_PARAM, ApiRoute, json
from daemon.api.crawl import bad_request, firecrawl_error, request_body
from daemon.api.jobs import iso
from daemon.crawl.agent.models import (
    AgentBody,
    AgentCancelled,
    AgentStarted,
    AgentStatus,
    AgentSteps,
    agent_schemas,
    parse_agent,
)
from daemon.crawl.agent.service import AgentService
from daemon.crawl.problems import BadRequest
from daemon.jobs.types import JobFinished, JobNotFound

NO_LLM = (
    "/v2/agent needs an LLM and none is configured: add an [llm] section (base_url, model) to"
    " crawld's config.toml"
)
NO_SEARCH = (
    "an agent without urls searches the web, and no search provider is configured: add a"
    " [search] section (base_url of a SearXNG instance) to crawld's config.toml, or give urls"
)
NOT_FOUND = "Agent job not found"
STATUS = {"scraping": "processing"}
"""The jobs part's status → the agent's (processing | completed | failed | cancelled)."""

_decode = msgspec.json.Decoder().decode


def not_configured(path: str, message: str) -> Response:
    """What the request asks that this config does not give (a model, urls without [search]):
    Firecrawl's 400 naming the field and the section to add."""
    return bad_request(BadRequest.at(path, message))


class _Handlers:
    def __init__(self, service: AgentService) -> None:
        self.service = service

    async def start(self, request: Request) -> Response:
        service = self.service
        if not service.configured():  # the feature is missing here: 501, as /v2/extract
            return firecrawl_error(501, NO_LLM, "LLM_NOT_CONFIGURED")
        try:
            plan = parse_agent(
                await request_body(request),
                search=service.can_search,
                default_credits=service.config.max_credits,
                models=service.config.models,
                providers=service.providers(),
            )
        except BadRequest as exc:
            return bad_request(exc)
        if not service.configured(plan.provider):
            return not_configured("$.model", f"[agent] models maps {plan.model[:64]!r} to"
                                  f" {plan.provider!r}, and no such [llm.providers] entry is"
                                  " configured")  # fmt: skip
        if not plan.urls and not service.can_search:
            return not_configured("$.urls", NO_SEARCH)
        return json(AgentStarted(success=True, id=await service.start(plan)))

    async def status(self, request: Request) -> Response:
        found = await self.service.get(request.path_params["id"])
        if found is None:
            return firecrawl_error(404, NOT_FOUND)
        record, row, credits = found
        state = STATUS.get(record.status, record.status)
        answered = state == "completed" and row.result is not None
        data: Any = _decode(row.result) if answered and row.result is not None else None
        sources = _decode(row.sources) if answered and row.sources is not None else None
        return json(
            AgentStatus(
                success=True,
                id=record.id,
                status=state,
                model=_model(row.plan),
                expiresAt=iso(record.expires_ms),
                creditsUsed=credits,
                data=data,
                sources=sources,
                error=record.error if state in ("failed", "cancelled") else None,
                message=row.message if answered else None,
            )
        )

    async def cancel(self, request: Request) -> Response:
        found = await self.service.get(request.path_params["id"])
        if found is None:
            return firecrawl_error(404, NOT_FOUND)
        try:
            await self.service.jobs.cancel(found[0].id)
        except JobNotFound:
            return firecrawl_error(404, NOT_FOUND)
        except JobFinished as exc:
            status = STATUS.get(exc.status, exc.status)
            return firecrawl_error(409, f"Agent job is already {status}")
        return json(AgentCancelled(success=True))

    async def steps(self, request: Request) -> Response:
        found = await self.service.get(request.path_params["id"])
        if found is None:
            return firecrawl_error(404, NOT_FOUND)
        record, _, credits = found
        status = STATUS.get(record.status, record.status)
        steps = await self.service.steps(record.id)
        return json(AgentSteps(success=True, id=record.id, status=status, creditsUsed=credits,
                               steps=steps))  # fmt: skip


def routes(service: AgentService) -> list[ApiRoute]:
    h = _Handlers(service)
    return [
        ApiRoute("POST", "/v2/agent", h.start,
                 "Start an agent: a web search for the prompt (unless strictConstrainToURLs),"
                 " the request's URLs read first, the model choosing what to read next, then"
                 " the answer (the schema, or {answer}) with its sources; poll GET"
                 " /v2/agent/{id}",
                 body=AgentBody, response=AgentStarted, body_required=True,
                 errors={400: "Bad Request: unknown keys, invalid values or schema; a model no"
                              " [llm.providers] entry runs; no urls and no [search] configured",
                         501: "LLM_NOT_CONFIGURED: this crawld has no [llm]"},
                 deployment=lambda: agent_schemas(search=service.can_search,
                                                  models=service.config.models,
                                                  providers=service.providers())),
        ApiRoute("GET", "/v2/agent/{id}", h.status,
                 "An agent's status; `data` and `sources` once completed",
                 response=AgentStatus, path_params={"id": UUID_PARAM},
                 errors={404: NOT_FOUND}),
        ApiRoute("DELETE", "/v2/agent/{id}", h.cancel,
                 "Cancel a running agent (the model call in flight is abandoned); its status"
                 " becomes `cancelled`",
                 response=AgentCancelled, path_params={"id": UUID_PARAM},
                 errors={404: NOT_FOUND, 409: "the agent already has a final status"}),
        ApiRoute("GET", "/v2/agent/{id}/steps", h.steps,
                 "crawld's own: every step the agent recorded (search, scrape, choose, answer)"
                 " with its input, output and the credits used after it",
                 response=AgentSteps, path_params={"id": UUID_PARAM},
                 errors={404: NOT_FOUND}),
    ]  # fmt: skip


class _Model(msgspec.Struct):
    model: str = ""


_model_decoder = msgspec.json.Decoder(_Model)


def _model(plan: bytes) -> str:
    return _model_decoder.decode(plan).model
