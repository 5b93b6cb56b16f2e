# Firecrawl v2's /extract over HTTP: POST starts an extract job, GET /v2/extract/{id} answers its
# status in the shape firecrawl-py's `get_extract_status` and `extract` (which polls it) and
# firecrawl-js parse: `data` is `[]` until the job completed, then the merged object; `sources`
# only when the request asked for them. Errors use Firecrawl's bodies, as the crawl API does.
# The job itself (pages, model calls, merge, webhooks): daemon/crawl/extract/ (service.py,
# run.py).
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from daemon.api.app import UUID_PARAM, ApiRoute, json
from daemon.api.crawl import (
    bad_request,
    firecrawl_error,
    llm_providers,
    request_body,
    scrape_deployment,
)
from daemon.api.jobs import iso
from daemon.crawl.extract.models import (
    ExtractBody,
    ExtractStarted,
    ExtractStatus,
    V1ExtractBodyRules,
    extract_rules,
    parse_extract,
    v1_body,
)
from daemon.crawl.extract.service import ExtractService
from daemon.crawl.options.deployment import provider_schemas
from daemon.crawl.problems import BadRequest
from daemon.crawl.v1.models import v1_schemas

NO_LLM = (
    "/v2/extract needs an LLM and none is configured: add an [llm] section (base_url, model) to"
    " crawld's config.toml"
)
NOT_CONFIGURED = 501
"""Extract on a crawld without [llm]: the feature is missing here, the request is not bad
(Firecrawl's self-hosted server answers 501 for a service it is not configured with; the SDKs
raise their error with this message)."""
STATUS = {"scraping": "processing"}
"""The jobs part's status → Firecrawl's extract status (processing | completed | failed |
cancelled)."""

_decode = msgspec.json.Decoder().decode


def _no_llm(path: str, message: str) -> Response:
    return bad_request(BadRequest.at(path, message))


def extract_deployment(service: ExtractService) -> Callable[[], dict[str, Any]]:
    """The deployment schemas of extract bodies: the rules with or without [search], the
    `[llm]` providers, the scrape options' (v1's too)."""
    scrape = scrape_deployment(service.crawl)

    def schemas() -> dict[str, Any]:
        providers = llm_providers(service.crawl)
        return {**scrape(), **provider_schemas(providers),
                **v1_schemas(browser=service.crawl.browser is not None, providers=providers),
                **extract_rules(search=service.can_search),
                **extract_rules(search=service.can_search, v1=True)}  # fmt: skip

    return schemas


def routes(service: ExtractService) -> list[ApiRoute]:
    async def start(request: Request) -> Response:
        return await _start(request, v1=False)

    async def start_v1(request: Request) -> Response:
        return await _start(request, v1=True)

    async def _start(request: Request, *, v1: bool) -> Response:
        if not service.configured():
            return firecrawl_error(NOT_CONFIGURED, NO_LLM, "LLM_NOT_CONFIGURED")
        try:
            body = await request_body(request)
            plan = parse_extract(
                v1_body(body) if v1 else body,
                browser=service.crawl.browser is not None,
                search=service.can_search,
                llm=service,
                v1=v1,
            )
        except BadRequest as exc:
            return bad_request(exc)
        if plan.provider is not None and not service.configured(plan.provider):
            return _no_llm("$.provider", f"no [llm.providers] entry named {plan.provider[:64]!r}")
        job_id = await service.start(plan)
        return json(
            ExtractStarted(
                success=True,
                id=job_id,
                urlTrace=[],
                invalidURLs=plan.invalid_urls or None,
                warning=plan.warning or None,
            )
        )

    async def status(request: Request) -> Response:
        return await _status(service, request)

    errors = {
        400: "Bad Request: unknown keys, invalid values or schema, enableWebSearch without a"
        " search provider",
        501: "LLM_NOT_CONFIGURED: this crawld has no [llm] to extract with",
    }
    schemas = extract_deployment(service)
    return [
        ApiRoute("POST", "/v2/extract", start,
                 "Start an extract job: structured data from the pages of `urls` (a URL ending in"
                 " /* is expanded by crawling that part of the site, up to `limit` pages), one"
                 " model call per page, merged into one object; poll GET /v2/extract/{id}",
                 body=ExtractBody, body_required=True, response=ExtractStarted, errors=errors,
                 deployment=schemas),
        ApiRoute("GET", "/v2/extract/{id}", status,
                 "An extract job's status; `data` is the merged object once completed",
                 response=ExtractStatus, path_params={"id": UUID_PARAM},
                 errors={404: "Extract job not found"}),
        ApiRoute("POST", "/v1/extract", start_v1,
                 "v1 twin of POST /v2/extract (ignoreInvalidURLs false and onlyMainContent false"
                 " by default, v1 scrapeOptions)",
                 body=V1ExtractBodyRules, body_required=True, response=ExtractStarted,
                 errors=errors, deployment=schemas),
        ApiRoute("GET", "/v1/extract/{id}", status, "v1 twin of GET /v2/extract/{id}",
                 response=ExtractStatus, path_params={"id": UUID_PARAM},
                 errors={404: "Extract job not found"}),
    ]  # fmt: skip


async def _status(service: ExtractService, request: Request) -> Response:
    """GET /v2/extract/{id} (and v1's): the job's status; `data` once completed."""
    found = await service.get(request.path_params["id"])
    if found is None:
        return firecrawl_error(404, "Extract job not found")
    record, row = found
    status = STATUS.get(record.status, record.status)
    completed = status == "completed" and row.result is not None
    data: Any = _decode(row.result) if completed and row.result is not None else []
    plan_sources = None
    if completed and row.sources is not None and _shows_sources(row.plan):
        plan_sources = _decode(row.sources)
    return json(
        ExtractStatus(
            success=status != "failed",
            status=status,
            data=data,
            error=record.error if status in ("failed", "cancelled") else None,
            warning=row.warning if completed else None,
            expiresAt=iso(record.expires_ms),
            sources=plan_sources,
            tokensUsed=row.tokens if completed else None,
        )
    )


class _ShowSources(msgspec.Struct):
    show_sources: bool = False


_show_decoder = msgspec.json.Decoder(_ShowSources)


def _shows_sources(plan: bytes) -> bool:
    return _show_decoder.decode(plan).show_sources
