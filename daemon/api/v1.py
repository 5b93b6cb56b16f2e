# Firecrawl's v1 routes, for integrations and SDKs that still call them (firecrawl-py 1.x and
# 2.x, loaders pinned to v1, older n8n and Dify nodes). Each body is rewritten by
# daemon/crawl/v1/translate.py into the v2 body it means and served by the same engine and jobs;
# answers take v1's shapes (map links as strings, search data as a list, `extract` under its own
# key, job links under /v1). Status, errors, cancel and the WebSocket watcher are the v2 handlers
# mounted again under /v1/crawl/{id} and /v1/batch/scrape/{id}: firecrawl-py 1.x polls a batch
# through /v1/crawl/{id}, which answers for any crawl or batch job.
from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from daemon.api.app import ApiRoute, json
from daemon.api.crawl import (
    SCRAPE_ERRORS,
    bad_request,
    batch_started,
    check_job_id,
    crawl_started,
    firecrawl_error,
    idempotency_key,
    job_routes,
    llm_providers,
    mapped,
    request_body,
    scrape_deployment,
    scraped,
)
from daemon.api.crawl import routes as v2_routes
from daemon.api.search import SEARCH_ERRORS
from daemon.crawl.options import models, responses
from daemon.crawl.problems import BadRequest, json_object
from daemon.crawl.runs.service import CrawlService
from daemon.crawl.search.service import SearchService, V1SearchBody, parse_search
from daemon.crawl.v1 import models as v1_models
from daemon.crawl.v1 import translate as v1
from daemon.search import SearchError


class V1MapResponse(msgspec.Struct, kw_only=True):
    success: bool
    links: list[str]


class V1SearchResponse(msgspec.Struct, kw_only=True, omit_defaults=True):
    success: bool
    data: list[dict[str, Any]]
    warning: str | None = None


async def _v1_body(request: Request) -> dict[str, Any]:
    return json_object(await request_body(request))


def _encode(body: dict[str, Any]) -> bytes:
    return msgspec.json.encode(body)


def _check(problems: list[dict[str, Any]]) -> None:
    if problems:
        raise BadRequest(problems)


class V1Handlers:
    """The handlers of the v1 routes: each reads v1's body, rewrites it into v2's and answers
    through the v2 routes' helpers."""

    def __init__(self, service: CrawlService, search: SearchService) -> None:
        self.service = service
        self.search = search
        self.stealth = service.stealth_proxies

    @property
    def browser(self) -> bool:
        """A browser is running (with [crawl.browser] "auto" it may turn off at start)."""
        return self.service.browser is not None

    async def scrape(self, request: Request) -> Response:
        try:
            raw = await _v1_body(request)
            body, problems = v1.scrape_body(raw)
            _check(problems)
            parsed = models.parse_scrape(
                _encode(body), browser=self.browser, llm=self.service.llm, stealth=self.stealth
            )
        except BadRequest as exc:
            return bad_request(exc)
        formats = raw.get("formats") or []
        return await scraped(self.service, parsed, lambda doc: v1.v1_document(doc, formats))

    async def start_crawl(self, request: Request) -> Response:
        try:
            body, depth, problems = v1.crawl_body(await _v1_body(request))
            _check(problems)
            plan = models.parse_crawl(
                _encode(body), default_limit=self.service.config.default_limit,
                browser=self.browser, llm=self.service.llm, stealth=self.stealth,
            )  # fmt: skip
            plan.max_url_depth = depth
            key = idempotency_key(request)
        except BadRequest as exc:
            return bad_request(exc)
        return await crawl_started(self.service, request, plan, key, "/v1/crawl")

    async def start_batch(self, request: Request) -> Response:
        try:
            body, problems = v1.batch_body(await _v1_body(request))
            _check(problems)
            plan = models.parse_batch(
                _encode(body), browser=self.browser, llm=self.service.llm, stealth=self.stealth
            )
            key = idempotency_key(request)
            if plan.append_to is not None:
                check_job_id(plan.append_to, "$.appendToId")
        except BadRequest as exc:
            return bad_request(exc)
        return await batch_started(self.service, request, plan, key, "/v1/batch/scrape")

    async def map_(self, request: Request) -> Response:
        try:
            body, problems = v1.map_body(await _v1_body(request))
            _check(problems)
            parsed = models.parse_map(_encode(body))
        except BadRequest as exc:
            return bad_request(exc)
        return await mapped(
            self.service,
            parsed,
            lambda links: V1MapResponse(success=True, links=[link.url for link in links]),
        )

    async def search_(self, request: Request) -> Response:
        try:
            body, problems = v1.search_body(await _v1_body(request))
            _check(problems)
            parsed = parse_search(
                _encode(body), browser=self.browser, llm=self.service.llm, stealth=self.stealth
            )
        except BadRequest as exc:
            return bad_request(exc)
        try:
            answer = await self.search.search(parsed)
        except SearchError as exc:
            return firecrawl_error(exc.status, exc.message, exc.code)
        return json(V1SearchResponse(success=True, data=answer["data"].get("web", []),
                                     warning=answer.get("warning")))  # fmt: skip


def routes(service: CrawlService, search: SearchService) -> list[ApiRoute]:
    h = V1Handlers(service, search)
    v2 = {(r.method, r.path): r for r in v2_routes(service)}
    active = v2[("GET", "/v2/crawl/active")]
    jobs = job_routes(service)
    mounted = [
        dataclasses.replace(
            r, path=r.path.replace("/v2/crawl/", prefix), summary=f"v1: {r.summary}"
        )
        for prefix in ("/v1/crawl/", "/v1/batch/scrape/")
        for r in jobs
        if r.path.startswith("/v2/crawl/{id}")
    ]
    errors = {400: "Bad Request: unknown keys, invalid values, unsupported options"}
    scrape = scrape_deployment(service)

    def schemas() -> dict[str, Any]:
        return {**scrape(), **v1_models.v1_schemas(browser=service.browser is not None,
                                                   providers=llm_providers(service))}  # fmt: skip

    return [
        ApiRoute("POST", "/v1/scrape", h.scrape, "v1: scrape one URL (formats as v1 strings)",
                 body=v1_models.with_rules(v1_models.V1ScrapeBody), body_required=True,
                 response=responses.ScrapeResponse, ok_also=responses.FirecrawlError,
                 errors=SCRAPE_ERRORS, deployment=schemas),
        dataclasses.replace(active, path="/v1/crawl/active", summary="v1: running crawls"),
        dataclasses.replace(active, path="/v1/crawl/ongoing", summary="v1: alias of active"),
        ApiRoute("POST", "/v1/crawl", h.start_crawl,
                 "v1: start a crawl (maxDepth, allowBackwardLinks, ignoreSitemap); poll GET"
                 " /v1/crawl/{id}", body=v1_models.V1CrawlBody, body_required=True,
                 response=models.StartResponse, errors=errors, deployment=schemas),
        ApiRoute("POST", "/v1/batch/scrape", h.start_batch, "v1: start a batch scrape",
                 body=v1_models.with_rules(v1_models.V1BatchBody, **models.BATCH_RULES),
                 body_required=True, response=models.StartResponse,
                 errors={**errors, 404: "appendToId: Job not found",
                         409: "appendToId: the job already finished"}, deployment=schemas),
        ApiRoute("POST", "/v1/map", h.map_, "v1: the URLs of a site, as strings",
                 body=v1_models.V1MapBody, body_required=True, response=V1MapResponse,
                 errors={**errors, 408: "MAP_TIMEOUT"}),
        ApiRoute("POST", "/v1/search", h.search_, "v1: web search ([search]); data is a list",
                 body=V1SearchBody, body_required=True, response=V1SearchResponse,
                 errors=SEARCH_ERRORS, deployment=schemas),
        *mounted,
    ]  # fmt: skip
