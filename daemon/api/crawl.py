# The Firecrawl v2 crawl API over HTTP: /v2/scrape, /v2/crawl, /v2/batch/scrape, /v2/map, in the
# shapes firecrawl-py sends and validates. Errors use Firecrawl's bodies (`success: false`, its
# `code`s, `details` for validation) so the SDK raises the exception its users expect; the daemon's
# usual `detail` is added to validation errors. Job status, errors and cancel are the jobs API's
# handlers (daemon/api/jobs.py), mounted again under /v2/batch/scrape.
from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from daemon.api import jobs as jobs_api
from daemon.api.app import ApiRoute, json, public_base_url
from daemon.crawl import models
from daemon.crawl.fetch import FetchError
from daemon.crawl.mapper import MapTimeout
from daemon.crawl.metrics import maps, scrapes
from daemon.crawl.service import CrawlService
from daemon.jobs.store import JobFinished, JobNotFound

MAX_BODY = 16 * 1024 * 1024
MAX_IDEMPOTENCY_KEY = 256
TEAM_ID = "crawld"
"""The `teamId` of active crawls: crawld has one team."""

STATUS_BY_CODE = {"SCRAPE_TIMEOUT": 408, "CRAWL_DENIAL": 403}
"""HTTP status of a failed scrape by Firecrawl code; any other code is a 500."""


def _error(status: int, error: str, code: str | None = None, **extra: Any) -> Response:
    return json(models.FirecrawlError(error=error, code=code, **extra), status)


def bad_request(exc: models.BadRequest) -> Response:
    return _error(400, "Bad Request", "BAD_REQUEST", details=exc.details, detail=exc.details)


async def _body(request: Request) -> bytes:
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY:
            raise models.BadRequest(
                [{"path": "$", "message": f"request body larger than {MAX_BODY} bytes"}]
            )
    return body


def _idempotency_key(request: Request) -> str | None:
    key = request.headers.get("x-idempotency-key")
    if key is None:
        return None
    if not key or len(key) > MAX_IDEMPOTENCY_KEY:
        raise models.BadRequest(
            [{"path": "x-idempotency-key", "message": f"1..{MAX_IDEMPOTENCY_KEY} characters"}]
        )
    return key


def job_url(request: Request, path: str) -> str:
    """Absolute URL of `path` on the API's public base (never the client's Host header)."""
    return public_base_url(request.app.state.daemon) + path


def scrape_failure(exc: FetchError) -> Response:
    status = STATUS_BY_CODE.get(exc.code, 500)
    if status == 403:
        return _error(403, exc.message)
    return _error(status, exc.message, exc.code)


def routes(service: CrawlService) -> list[ApiRoute]:
    async def scrape(request: Request) -> Response:
        try:
            parsed = models.parse_scrape(await _body(request), browser=service.browser is not None)
        except models.BadRequest as exc:
            return bad_request(exc)
        try:
            document = await service.scrape(parsed)
        except FetchError as exc:
            scrapes.labels(exc.code).inc()
            return scrape_failure(exc)
        scrapes.labels("ok").inc()
        return json(models.ScrapeResponse(success=True, data=document,
                                          warning=parsed.warning or None))  # fmt: skip

    async def start_crawl(request: Request) -> Response:
        try:
            plan = models.parse_crawl(
                await _body(request),
                default_limit=service.config.default_limit,
                browser=service.browser is not None,
            )
            key = _idempotency_key(request)
        except models.BadRequest as exc:
            return bad_request(exc)
        job_id = await service.start_crawl(plan, key)
        return json(
            models.StartResponse(
                success=True,
                id=job_id,
                url=job_url(request, f"/v2/crawl/{job_id}"),
                warning=plan.warning or None,
            )
        )

    async def start_batch(request: Request) -> Response:
        try:
            plan = models.parse_batch(await _body(request), browser=service.browser is not None)
            key = _idempotency_key(request)
            if plan.append_to is not None:
                _uuid(plan.append_to, "$.appendToId")
        except models.BadRequest as exc:
            return bad_request(exc)
        try:
            job_id = await service.start_batch(plan, key)
        except JobNotFound:
            return _error(404, "Job not found")
        except JobFinished as exc:
            return _error(409, f"Batch scrape job is already {exc.status}")
        return json(
            models.StartResponse(
                success=True,
                id=job_id,
                url=job_url(request, f"/v2/batch/scrape/{job_id}"),
                invalidURLs=plan.invalid_urls,
                warning=plan.warning or None,
            )
        )

    async def map_(request: Request) -> Response:
        try:
            parsed = models.parse_map(await _body(request))
        except models.BadRequest as exc:
            return bad_request(exc)
        try:
            urls = await service.map(parsed)
        except MapTimeout as exc:
            maps.labels("timeout").inc()
            return _error(408, str(exc), "MAP_TIMEOUT")
        maps.labels("ok").inc()
        return json(models.MapResponse(success=True, links=[models.MapLink(url=u) for u in urls]))

    async def active(request: Request) -> Response:
        rows = await service.active_crawls()
        crawls = []
        for row in rows:
            plan = models.crawl_plan(row.plan)
            crawls.append(
                models.ActiveCrawl(
                    id=row.job_id,
                    teamId=TEAM_ID,
                    url=row.url,
                    created_at=jobs_api.iso(row.created_ms),
                    options=models.public_options(plan),
                )
            )
        return json(models.ActiveCrawls(success=True, crawls=crawls))

    async def credit_usage(request: Request) -> Response:
        data = models.CreditUsageData(remainingCredits=models.SELF_HOSTED_CREDITS)
        return json(models.CreditUsage(success=True, data=data))

    async def token_usage(request: Request) -> Response:
        data = models.TokenUsageData(remainingTokens=models.SELF_HOSTED_CREDITS)
        return json(models.TokenUsage(success=True, data=data))

    async def queue_status(request: Request) -> Response:
        queue = await service.queue()
        last = queue["last_success_ms"]
        return json(
            models.QueueStatus(
                success=True,
                jobsInQueue=queue["fetching"] + queue["waiting"],
                activeJobsInQueue=queue["fetching"],
                waitingJobsInQueue=queue["waiting"],
                maxConcurrency=queue["max_concurrency"],
                mostRecentSuccess=None if last is None else jobs_api.iso(last),
                runningCrawls=queue["jobs_running"],
                waitingCrawls=queue["jobs_waiting"],
            )
        )

    async def concurrency_check(request: Request) -> Response:
        return json(models.ConcurrencyCheck(success=True, concurrency=service.fetching(),
                                            maxConcurrency=service.config.concurrency))  # fmt: skip

    status_routes = [
        dataclasses.replace(
            cancel_anywhere(r, service),
            path=r.path.replace("/v2/crawl/", "/v2/batch/scrape/"),
            summary=r.summary.replace("A job", "A batch scrape job"),
        )
        for r in jobs_api.routes(service.jobs)
    ]
    crawl_errors = {400: "Bad Request: unknown keys, invalid values, unsupported options"}
    return [
        ApiRoute("POST", "/v2/scrape", scrape,
                 "Scrape one URL into a document (markdown, html, rawHtml, links, images)",
                 body=models.ScrapeOptions, response=models.ScrapeResponse,
                 errors={**crawl_errors, 403: "address refused (SSRF guard)",
                         408: "SCRAPE_TIMEOUT", 500: "the page could not be fetched (code)"}),
        ApiRoute("GET", "/v2/crawl/active", active, "Running crawls (batches are not listed)",
                 response=models.ActiveCrawls),
        ApiRoute("GET", "/v2/crawl/ongoing", active, "Alias of /v2/crawl/active",
                 response=models.ActiveCrawls),
        ApiRoute("POST", "/v2/crawl", start_crawl,
                 "Start a crawl; poll GET /v2/crawl/{id} (header x-idempotency-key honoured)",
                 body=models.CrawlRequest, response=models.StartResponse, errors=crawl_errors),
        ApiRoute("POST", "/v2/batch/scrape", start_batch,
                 "Start a batch scrape, or add URLs to one (appendToId)",
                 response=models.StartResponse,
                 errors={**crawl_errors, 404: "appendToId: Job not found",
                         409: "appendToId: the job already finished"}),
        ApiRoute("POST", "/v2/map", map_, "The URLs of a site (sitemaps and links)",
                 body=models.MapRequest, response=models.MapResponse,
                 errors={**crawl_errors, 408: "MAP_TIMEOUT"}),
        ApiRoute("GET", "/v2/team/credit-usage", credit_usage,
                 "Remaining credits: crawld counts none, so it answers what a self-hosted"
                 " Firecrawl answers (99999999)", response=models.CreditUsage),
        ApiRoute("GET", "/v2/team/token-usage", token_usage,
                 "Remaining tokens: as credit-usage (crawld runs no LLM)",
                 response=models.TokenUsage),
        ApiRoute("GET", "/v2/team/queue-status", queue_status,
                 "Pages fetching and waiting over all running crawls and batches, the page"
                 " concurrency limit, the last success, crawl jobs running and waiting",
                 response=models.QueueStatus),
        ApiRoute("GET", "/v2/concurrency-check", concurrency_check,
                 "Pages being fetched now and [crawl] concurrency",
                 response=models.ConcurrencyCheck),
        *status_routes,
    ]  # fmt: skip


def cancel_anywhere(route: ApiRoute, service: CrawlService) -> ApiRoute:
    """The jobs API's DELETE route, cancelling a crawl or batch through the store first (so
    every instance working on it stops, whichever instance took the call); other jobs, unknown
    and finished ones are the jobs API's answer. Other routes are returned as they are."""
    if route.method != "DELETE":
        return route
    jobs_cancel = route.handler

    async def cancel(request: Request) -> Response:
        if await service.cancel(request.path_params["id"]):
            return json(jobs_api.CancelResult(status="cancelled"))
        return await jobs_cancel(request)

    return dataclasses.replace(route, handler=cancel)


def _uuid(value: str, path: str) -> None:
    try:
        uuid.UUID(value)
    except ValueError:
        raise models.BadRequest([{"path": path, "message": "not a job id"}]) from None
