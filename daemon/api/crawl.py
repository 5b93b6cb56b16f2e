# The Firecrawl v2 crawl API over HTTP: /v2/scrape, /v2/crawl, /v2/batch/scrape, /v2/map, in the
# shapes firecrawl-py sends and validates. Errors use Firecrawl's bodies (`success: false`, its
# `code`s, `details` for validation) so the SDK raises the exception its users expect; the daemon's
# usual `detail` is added to validation errors. Job status, errors and cancel are the jobs API's
# handlers (daemon/api/jobs.py), mounted again under /v2/batch/scrape.
from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from daemon.api import jobs as jobs_api
from daemon.api.app import ApiRoute, QueryParam, json, public_base_url
from daemon.clock import wall_ms
from daemon.crawl.fetching.fetch import FetchError
from daemon.crawl.metrics import maps, scrapes
from daemon.crawl.options import deployment, models, responses
from daemon.crawl.problems import BadRequest
from daemon.crawl.prompts.service import NOT_CONFIGURED, PROMPT_ERRORS, CrawlPrompts, PromptError
from daemon.crawl.runs.mapper import MapTimeout
from daemon.crawl.runs.service import CrawlService
from daemon.jobs.types import JobFinished, JobNotFound

MAX_BODY = 16 * 1024 * 1024
MAX_IDEMPOTENCY_KEY = 256
TEAM_ID = "crawld"
"""The `teamId` of active crawls: crawld has one team."""

STATUS_BY_CODE = {"SCRAPE_TIMEOUT": 408, "CRAWL_DENIAL": 403, "SCRAPE_NO_CACHED_DATA": 404,
                  "SCRAPE_LOCKDOWN_CACHE_MISS": 404, "SCRAPE_PDF_OCR_REQUIRED": 422,
                  "SCRAPE_DNS_RESOLUTION_ERROR": 200}  # fmt: skip
"""HTTP status of a failed scrape by Firecrawl code; any other code is a 500. A host that does
not resolve is Firecrawl's 200 with `success: false` (its v2 scrape controller): the SDKs raise
their DNS error from the code, whatever the status."""


def firecrawl_error(status: int, error: str, code: str | None = None, **extra: Any) -> Response:
    """Firecrawl's error body (`success: false`, `error`, its `code`) with `status`."""
    return json(responses.FirecrawlError(error=error, code=code, **extra), status)


def bad_request(exc: BadRequest) -> Response:
    """Firecrawl's 400 for `exc`: every problem in `details`, and in the daemon's `detail`."""
    return firecrawl_error(
        400, "Bad Request", "BAD_REQUEST", details=exc.details, detail=exc.details
    )


async def request_body(request: Request) -> bytes:
    """The request's body; BadRequest past MAX_BODY bytes."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY:
            raise BadRequest.at("$", f"request body larger than {MAX_BODY} bytes")
    return body


def idempotency_key(request: Request) -> str | None:
    """The `x-idempotency-key` header; BadRequest when empty or too long."""
    key = request.headers.get("x-idempotency-key")
    if key is None:
        return None
    if not key or len(key) > MAX_IDEMPOTENCY_KEY:
        raise BadRequest.at("x-idempotency-key", f"1..{MAX_IDEMPOTENCY_KEY} characters")
    return key


def job_url(request: Request, path: str) -> str:
    """Absolute URL of `path` on the API's public base (never the client's Host header)."""
    return public_base_url(request.app.state.daemon) + path


def scrape_failure(exc: FetchError) -> Response:
    status = STATUS_BY_CODE.get(exc.code, 500)
    if status == 403:
        return firecrawl_error(403, exc.message)
    return firecrawl_error(status, exc.message, exc.code)


async def scraped(
    service: CrawlService,
    parsed: models.ScrapeRequest,
    shape: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> Response:
    """Scrape `parsed` and answer Firecrawl's body (counted in `scrapes`); `shape` rewrites the
    document first (the v1 routes' `extract` key)."""
    try:
        document = await service.scrape(parsed)
    except FetchError as exc:
        scrapes.labels(exc.code).inc()
        return scrape_failure(exc)
    scrapes.labels("ok").inc()
    data = shape(document) if shape is not None else document
    return json(responses.ScrapeResponse(success=True, data=data, warning=parsed.warning or None))


async def crawl_started(
    service: CrawlService,
    request: Request,
    plan: models.CrawlPlan,
    key: str | None,
    path: str,
    **extra: Any,
) -> Response:
    """Start `plan` and answer `{success, id, url}` (and `extra`: a prompt's options); its
    status is read at `path/{id}`."""
    job_id = await service.start_crawl(plan, key)
    return json(models.StartResponse(success=True, id=job_id,
                                     url=job_url(request, f"{path}/{job_id}"),
                                     warning=plan.warning or None, **extra))  # fmt: skip


async def batch_started(
    service: CrawlService, request: Request, plan: models.BatchPlan, key: str | None, path: str
) -> Response:
    """Start (or append to) a batch and answer `{success, id, url, invalidURLs}`; its status is
    read at `path/{id}`. 404 / 409 for an `appendToId` unknown or finished."""
    try:
        job_id = await service.start_batch(plan, key)
    except JobNotFound:
        return firecrawl_error(404, "Job not found")
    except JobFinished as exc:
        return firecrawl_error(409, f"Batch scrape job is already {exc.status}")
    return json(models.StartResponse(success=True, id=job_id,
                                     url=job_url(request, f"{path}/{job_id}"),
                                     invalidURLs=plan.invalid_urls,
                                     warning=plan.warning or None))  # fmt: skip


async def mapped(
    service: CrawlService,
    parsed: models.MapRequest,
    answer: Callable[[list[responses.MapLink]], Any],
) -> Response:
    """Map a site (counted in `maps`) and answer `answer(links)`; 408 MAP_TIMEOUT."""
    try:
        urls = await service.map(parsed)
    except MapTimeout as exc:
        maps.labels("timeout").inc()
        return firecrawl_error(408, str(exc), "MAP_TIMEOUT")
    maps.labels("ok").inc()
    return json(answer(urls))


class CrawlHandlers:
    """The handlers of the v2 crawl routes, over one CrawlService (and the crawl prompts)."""

    def __init__(self, service: CrawlService, prompts: CrawlPrompts | None = None) -> None:
        self.service = service
        self.prompts = prompts

    async def scrape(self, request: Request) -> Response:
        try:
            parsed = models.parse_scrape(
                await request_body(request),
                browser=self.service.browser is not None,
                llm=self.service.llm,
                stealth=self.service.stealth_proxies,
            )
        except BadRequest as exc:
            return bad_request(exc)
        return await scraped(self.service, parsed)

    def _parse_crawl(self, body: bytes) -> models.CrawlPlan:
        return models.parse_crawl(
            body,
            default_limit=self.service.config.default_limit,
            browser=self.service.browser is not None,
            llm=self.service.llm,
            stealth=self.service.stealth_proxies,
        )

    async def start_crawl(self, request: Request) -> Response:
        try:
            body = await request_body(request)
            plan = self._parse_crawl(body)
            key = idempotency_key(request)
        except BadRequest as exc:
            return bad_request(exc)
        if not plan.request.prompt:
            return await crawl_started(self.service, request, plan, key, "/v2/crawl")
        if self.prompts is None:
            return firecrawl_error(501, NOT_CONFIGURED, "LLM_NOT_CONFIGURED")
        try:
            plan, generated = await self.prompts.plan(body, plan, self._parse_crawl)
        except PromptError as exc:
            return firecrawl_error(exc.status, exc.message, exc.code)
        return await crawl_started(self.service, request, plan, key, "/v2/crawl",
                                   promptGeneratedOptions=generated,
                                   finalCrawlerOptions=models.public_options(plan))  # fmt: skip

    async def start_batch(self, request: Request) -> Response:
        try:
            plan = models.parse_batch(
                await request_body(request),
                browser=self.service.browser is not None,
                llm=self.service.llm,
                stealth=self.service.stealth_proxies,
            )
            key = idempotency_key(request)
            if plan.append_to is not None:
                check_job_id(plan.append_to, "$.appendToId")
        except BadRequest as exc:
            return bad_request(exc)
        return await batch_started(self.service, request, plan, key, "/v2/batch/scrape")

    async def map(self, request: Request) -> Response:
        try:
            parsed = models.parse_map(await request_body(request))
        except BadRequest as exc:
            return bad_request(exc)
        return await mapped(
            self.service, parsed, lambda links: responses.MapResponse(success=True, links=links)
        )

    async def active(self, request: Request) -> Response:
        rows = await self.service.active_crawls()
        crawls = []
        for row in rows:
            plan = models.crawl_plan(row.plan)
            crawls.append(
                responses.ActiveCrawl(
                    id=row.job_id,
                    teamId=TEAM_ID,
                    url=row.url,
                    created_at=jobs_api.iso(row.created_ms),
                    options=models.public_options(plan),
                )
            )
        return json(responses.ActiveCrawls(success=True, crawls=crawls))

    async def credit_usage(self, request: Request) -> Response:
        data = responses.CreditUsageData(remainingCredits=responses.SELF_HOSTED_CREDITS)
        return json(responses.CreditUsage(success=True, data=data))

    async def credit_history(self, request: Request) -> Response:
        by_key = request.query_params.get("byApiKey", "false")
        if by_key not in ("true", "false"):
            return bad_request(BadRequest.at("byApiKey", "true or false"))
        daemon = request.app.state.daemon
        started_ms = wall_ms() - int((time.monotonic() - daemon.started_monotonic) * 1000)
        period = responses.CreditPeriod(startDate=jobs_api.iso(started_ms), endDate=None,
                                        creditsUsed=0)  # fmt: skip
        return json(responses.CreditUsageHistorical(success=True, periods=[period]))

    async def token_usage(self, request: Request) -> Response:
        daemon = request.app.state.daemon
        llm = self.service.llm
        usage = llm.usage() if llm is not None else {}
        providers = {
            name: responses.ProviderTokens(model=llm.providers[name].config.model, **counts)
            for name, counts in usage.items()
        }
        started_ms = wall_ms() - int((time.monotonic() - daemon.started_monotonic) * 1000)
        data = responses.TokenUsageData(
            remainingTokens=responses.SELF_HOSTED_CREDITS,
            billingPeriodStart=jobs_api.iso(started_ms),
            tokensUsed=sum(p.totalTokens for p in providers.values()),
            providers=providers,
        )
        return json(responses.TokenUsage(success=True, data=data))

    async def queue_status(self, request: Request) -> Response:
        queue = await self.service.queue()
        last = queue["last_success_ms"]
        return json(
            responses.QueueStatus(
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

    async def concurrency_check(self, request: Request) -> Response:
        service = self.service
        return json(responses.ConcurrencyCheck(
            success=True, concurrency=service.fetching(), maxConcurrency=service.config.concurrency
        ))  # fmt: skip


def llm_providers(service: CrawlService) -> list[str]:
    """The `[llm]` providers the service can call now (none: no [llm])."""
    return list(service.llm.provider_names()) if service.llm is not None else []


def scrape_deployment(service: CrawlService) -> Callable[[], dict[str, Any]]:
    """The deployment schemas of the scrape options (formats, actions) for `service`'s config."""

    def schemas() -> dict[str, Any]:
        return deployment.format_schemas(browser=service.browser is not None,
                                         providers=llm_providers(service))  # fmt: skip

    return schemas


SCRAPE_ERRORS = {
    400: "Bad Request: unknown keys, invalid values, unsupported options",
    403: "address refused (SSRF guard: loopback, private and other non-public addresses)",
    404: "SCRAPE_NO_CACHED_DATA (minAge) or SCRAPE_LOCKDOWN_CACHE_MISS (lockdown): no cached"
    " copy, nothing was fetched",
    408: "SCRAPE_TIMEOUT",
    422: "SCRAPE_PDF_OCR_REQUIRED: a scanned PDF with mode fast, or OCR off",
    500: "the page could not be fetched (code: SCRAPE_SITE_ERROR, SCRAPE_SSL_ERROR, ...)",
}
"""What a scrape may answer besides 200; a host that does not resolve is a 200 with `success:
false` and code SCRAPE_DNS_RESOLUTION_ERROR, as Firecrawl answers it."""


def routes(service: CrawlService, prompts: CrawlPrompts | None = None) -> list[ApiRoute]:
    h = CrawlHandlers(service, prompts)
    crawl_errors = {400: "Bad Request: unknown keys, invalid values, unsupported options"}
    schemas = scrape_deployment(service)
    return [
        ApiRoute("POST", "/v2/scrape", h.scrape,
                 "Scrape one URL into a document (markdown, html, rawHtml, links, images)",
                 body=models.ScrapeBody, body_required=True, response=responses.ScrapeResponse,
                 ok_also=responses.FirecrawlError, errors=SCRAPE_ERRORS, deployment=schemas),
        ApiRoute("GET", "/v2/crawl/active", h.active, "Running crawls (batches are not listed)",
                 response=responses.ActiveCrawls),
        ApiRoute("GET", "/v2/crawl/ongoing", h.active, "Alias of /v2/crawl/active",
                 response=responses.ActiveCrawls),
        ApiRoute("POST", "/v2/crawl", h.start_crawl,
                 "Start a crawl; poll GET /v2/crawl/{id} (header x-idempotency-key honoured);"
                 " with `prompt`, options generated from it ([llm]) under the request's own",
                 body=models.CrawlRequest, body_required=True, response=models.StartResponse,
                 errors={**PROMPT_ERRORS,
                         400: f"{crawl_errors[400]}; with `prompt`, {PROMPT_ERRORS[400]}"},
                 deployment=schemas),
        ApiRoute("POST", "/v2/batch/scrape", h.start_batch,
                 "Start a batch scrape, or add URLs to one (appendToId)",
                 body=models.BatchBody, body_required=True, response=models.StartResponse,
                 errors={**crawl_errors, 404: "appendToId: Job not found",
                         409: "appendToId: the job already finished"}, deployment=schemas),
        ApiRoute("POST", "/v2/map", h.map, "The URLs of a site (sitemaps and links)",
                 body=models.MapRequest, body_required=True, response=responses.MapResponse,
                 errors={**crawl_errors, 408: "MAP_TIMEOUT"}),
        ApiRoute("GET", "/v2/team/credit-usage", h.credit_usage,
                 "Remaining credits: crawld counts none, so it answers what a self-hosted"
                 " Firecrawl answers (99999999)", response=responses.CreditUsage),
        ApiRoute("GET", "/v2/team/credit-usage/historical", h.credit_history,
                 "Credits used per period: crawld counts none, so one period since this"
                 " instance started with creditsUsed 0 (byApiKey accepted: crawld has one key)",
                 response=responses.CreditUsageHistorical,
                 query=[QueryParam("byApiKey", "Per API key (crawld has one)",
                                   enum=("true", "false"))],
                 errors={400: "byApiKey is not true or false"}),
        ApiRoute("GET", "/v2/team/token-usage", h.token_usage,
                 "Remaining tokens (as a self-hosted Firecrawl: 99999999) and the tokens the"
                 " [llm] endpoints counted since start (billingPeriodStart), per provider",
                 response=responses.TokenUsage),
        ApiRoute("GET", "/v2/team/queue-status", h.queue_status,
                 "Pages fetching and waiting over all running crawls and batches, the page"
                 " concurrency limit, the last success, crawl jobs running and waiting",
                 response=responses.QueueStatus),
        ApiRoute("GET", "/v2/concurrency-check", h.concurrency_check,
                 "Pages being fetched now and [crawl] concurrency",
                 response=responses.ConcurrencyCheck),
        *[dataclasses.replace(r, path=r.path.replace("/v2/crawl/", "/v2/batch/scrape/"),
                              summary=r.summary.replace("A job", "A batch scrape job"))
          for r in job_routes(service)],
    ]  # fmt: skip


def job_routes(service: CrawlService) -> list[ApiRoute]:
    """The jobs API's routes of one job (`/v2/crawl/{id}`: status, errors, cancel), mounted again
    by the batch and v1 routes under their own paths. A DELETE of a crawl or batch reaches the
    crawl service through the JobManager's canceller (daemon/crawl/component.py)."""
    return jobs_api.routes(service.jobs)


def check_job_id(value: str, path: str) -> None:
    """BadRequest at `path` unless `value` is a job id (a UUID)."""
    try:
        uuid.UUID(value)
    except ValueError:
        raise BadRequest.at(path, "not a job id") from None
