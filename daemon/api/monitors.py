# Firecrawl's /v2/monitor over HTTP, in the shapes firecrawl-py 4.55's monitor methods and
# firecrawl-mcp's monitor tools read: `{success, data}` answers, a check's pages paginated with a
# top-level `next` (firecrawl-py follows it), 400 naming the fields of a bad definition, 404 for
# an unknown monitor or check, 409 for a manual run on a paused monitor or while a check runs
# (with the running `checkId`). The work: daemon/crawl/monitors/.
from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec
from msgspec import Meta
from starlette.requests import Request
from starlette.responses import Response

from daemon.api.app import UUID_PARAM, ApiRoute, QueryParam, int_param, json, public_link
from daemon.api.crawl import bad_request, firecrawl_error, request_body
from daemon.config import WebhookSpec
from daemon.crawl.monitors import models as monitors
from daemon.crawl.monitors import notify
from daemon.crawl.monitors.service import MonitorNotFound, MonitorService, RunRefused
from daemon.crawl.options.models import CrawlRequest, PathPatterns, ScrapeOptions
from daemon.crawl.options.schemas import NOT_BLANK, HttpUrl, body_model, borrowed, with_schema
from daemon.crawl.problems import BadRequest, json_object
from daemon.jsonvalues import deployment_schema

LIMIT = int_param("limit", "Most items in this answer", 1, 1000)
OFFSET = int_param("offset", "Items to skip", 0, 2**31)
SKIP = int_param("skip", "Pages to skip (from the `next` link)", 0, 2**31)
CHECK_STATUSES = ("queued", "running", "completed", "failed", "partial", "skipped_overlap")
PAGE_STATUSES = ("same", "new", "changed", "removed", "error")
CHECK_STATUS = QueryParam("status", "Only checks with this status", enum=CHECK_STATUSES)
PAGE_STATUS = QueryParam("status", "Only pages with this status", enum=PAGE_STATUSES)


TargetId = Annotated[str, Meta(max_length=128)]
_OPTIONS = "scrape options (snake_case keys are taken too, as firecrawl-py sends them); markdown"
_OPTIONS += " is always taken and nothing is read from the cache"
if TYPE_CHECKING:
    CrawlOptions = dict[str, Any]
else:  # a model for msgspec (its annotations are read at run time), a dict for mypy
    CrawlOptions = body_model(
        "MonitorCrawlOptions",
        "A crawl target's crawl options (those of POST /v2/crawl).",
        borrowed(CrawlRequest, set(CrawlRequest.__struct_fields__) - {"url", "scrapeOptions"}),
        module=__name__,
    )


class ScrapeTarget(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, tag="scrape",
                   tag_field="type"):  # fmt: skip
    id: TargetId | None = None
    urls: Annotated[list[HttpUrl], Meta(min_length=1, max_length=monitors.MAX_URLS)]
    scrapeOptions: Annotated[ScrapeOptions | None, Meta(description=_OPTIONS)] = None
    ignorePatterns: PathPatterns | None = None


class CrawlTarget(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, tag="crawl",
                  tag_field="type"):  # fmt: skip
    id: TargetId | None = None
    url: HttpUrl
    crawlOptions: CrawlOptions | None = None
    scrapeOptions: Annotated[ScrapeOptions | None, Meta(description=_OPTIONS)] = None
    ignorePatterns: PathPatterns | None = None


class SearchTarget(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, tag="search",
                   tag_field="type"):  # fmt: skip
    id: TargetId | None = None
    queries: Annotated[
        list[Annotated[str, Meta(max_length=500, extra_json_schema=NOT_BLANK)]],
        Meta(min_length=1, max_length=monitors.MAX_QUERIES),
    ]
    searchWindow: Literal["5m", "15m", "1h", "6h", "24h", "7d"] | None = None
    includeDomains: list[Annotated[str, Meta(min_length=1)]] | None = None
    excludeDomains: list[Annotated[str, Meta(min_length=1)]] | None = None
    maxResults: Annotated[int, Meta(ge=1, le=monitors.MAX_RESULTS)] | None = None


class Schedule(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`{cron}` or `{text}` ("every 15 minutes", "hourly", "daily at 9am", ...), `timezone`
    (IANA, UTC by default); never more often than [monitors] min_interval."""

    cron: str | None = None
    text: str | None = None
    timezone: str | None = None


ONE_SCHEDULE = {"oneOf": [
    {"required": ["cron"], "properties": {"cron": {"type": "string"}, "text": {"type": "null"}}},
    {"required": ["text"], "properties": {"text": {"type": "string"}, "cron": {"type": "null"}}},
]}  # fmt: skip
_WEBHOOK = {"properties": {"events": {"items": {"enum": list(monitors.EVENTS)}}}}
Targets = Annotated[
    list[ScrapeTarget | CrawlTarget | SearchTarget],
    Meta(min_length=1, max_length=monitors.MAX_TARGETS),
]


class MonitorFields(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """POST /v2/monitor; PATCH /v2/monitor/{id} takes the same fields, all optional, and
    `status` (checked by daemon/crawl/monitors/models.py, declared here)."""

    name: Annotated[str, Meta(max_length=monitors.MAX_NAME, extra_json_schema=NOT_BLANK)]
    schedule: Annotated[Schedule, Meta(extra_json_schema=ONE_SCHEDULE)]
    targets: Targets
    webhook: Annotated[WebhookSpec | None, Meta(extra_json_schema=_WEBHOOK)] = None
    notification: Annotated[
        dict[str, Any] | None, Meta(extra_json_schema=deployment_schema("MonitorNotification"))
    ] = None
    retentionDays: Annotated[int, Meta(ge=1, le=monitors.MAX_RETENTION_DAYS)] | None = None
    goal: Annotated[str, Meta(max_length=2000)] | None = None
    judgeEnabled: bool | None = None
    origin: Any = None
    integration: Any = None


GOAL = {
    "if": {"required": ["targets"],
           "properties": {"targets": {"contains": {"properties": {"type": {"const": "search"}}}}}},
    "then": {"anyOf": [
        {"required": ["goal"], "properties": {"goal": {"type": "string", "minLength": 1}}},
        {"required": ["judgeEnabled"], "properties": {"judgeEnabled": {"const": False}}}]},
    "description": "a search target needs a goal (or judgeEnabled false); target ids unique",
}  # fmt: skip
MonitorBody = Annotated[MonitorFields, Meta(extra_json_schema=GOAL)]
MonitorPatch = with_schema(body_model(
    "MonitorPatch", "PATCH /v2/monitor/{id}: the fields given replace the stored ones.",
    borrowed(MonitorFields, set(MonitorFields.__struct_fields__),
             name=(Annotated[str, Meta(max_length=monitors.MAX_NAME,
                                       extra_json_schema=NOT_BLANK)] | None, None),
             schedule=(Annotated[Schedule | None, Meta(extra_json_schema={
                 "anyOf": [{"type": "null"}, ONE_SCHEDULE]})], None),
             targets=(Targets | None, None),
             status=(Literal["active", "paused"] | None, None)),
    module=__name__,
), GOAL)  # fmt: skip


class MonitorAnswer(msgspec.Struct, kw_only=True):
    success: bool
    data: dict[str, Any]


class MonitorList(msgspec.Struct, kw_only=True):
    success: bool
    data: list[dict[str, Any]]


class CheckDetail(msgspec.Struct, kw_only=True, omit_defaults=True):
    success: bool
    data: dict[str, Any]
    """The check and `pages` from `skip`."""
    next: str | None = None
    """Absolute URL of the next pages; present while more follow."""


class Deleted(msgspec.Struct, kw_only=True):
    success: bool


def _not_found(what: str) -> Response:
    return firecrawl_error(404, f"{what} not found", "NOT_FOUND")


def _status(request: Request, allowed: tuple[str, ...]) -> str | None:
    status = request.query_params.get("status")
    if status is not None and status not in allowed:
        raise BadRequest.at("status", f"one of {', '.join(allowed)}")
    return status


def _handlers(service: MonitorService) -> dict[str, Any]:
    async def create(request: Request) -> Response:
        try:
            data = await service.create(json_object(await request_body(request)))
        except BadRequest as exc:
            return bad_request(exc)
        return json({"success": True, "data": data})

    async def list_(request: Request) -> Response:
        limit, offset = LIMIT.read_int(request, 100), OFFSET.read_int(request, 0)
        return json({"success": True, "data": await service.listing(limit, offset)})

    async def get(request: Request) -> Response:
        try:
            return json({"success": True, "data": await service.get(request.path_params["id"])})
        except MonitorNotFound:
            return _not_found("Monitor")

    async def update(request: Request) -> Response:
        try:
            body = json_object(await request_body(request))
            data = await service.update(request.path_params["id"], body)
        except BadRequest as exc:
            return bad_request(exc)
        except MonitorNotFound:
            return _not_found("Monitor")
        return json({"success": True, "data": data})

    async def delete(request: Request) -> Response:
        try:
            await service.delete(request.path_params["id"])
        except MonitorNotFound:
            return _not_found("Monitor")
        return json({"success": True})

    async def run(request: Request) -> Response:
        try:
            data = await service.run_now(request.path_params["id"])
        except MonitorNotFound:
            return _not_found("Monitor")
        except RunRefused as exc:
            body: dict[str, Any] = {"success": False, "error": str(exc), "code": "CONFLICT"}
            if exc.check_id is not None:
                body["checkId"] = exc.check_id
            return json(body, 409)
        return json({"success": True, "data": data})

    async def checks(request: Request) -> Response:
        limit, offset = LIMIT.read_int(request, 20), OFFSET.read_int(request, 0)
        try:
            status = _status(request, CHECK_STATUSES)
            data = await service.checks(request.path_params["id"], limit, offset, status)
        except BadRequest as exc:
            return bad_request(exc)
        except MonitorNotFound:
            return _not_found("Monitor")
        return json({"success": True, "data": data})

    async def check(request: Request) -> Response:
        limit, skip = LIMIT.read_int(request, 100), SKIP.read_int(request, 0)
        try:
            status = _status(request, PAGE_STATUSES)
            data = await service.check(request.path_params["id"], request.path_params["checkId"],
                                       skip, limit, status)  # fmt: skip
        except BadRequest as exc:
            return bad_request(exc)
        except MonitorNotFound:
            return _not_found("Monitor check")
        more = data.pop("more")
        body: dict[str, Any] = {"success": True, "data": data}
        if more:
            body["next"] = public_link(request, skip=skip + len(data["pages"]), limit=limit)
        return json(body)

    return {"create": create, "list": list_, "get": get, "update": update, "delete": delete,
            "run": run, "checks": checks, "check": check}  # fmt: skip


def routes(service: MonitorService) -> list[ApiRoute]:
    h = _handlers(service)

    def schemas() -> dict[str, Any]:
        config = service.config
        return notify.schema(smtp_ready=config.smtp is not None,
                             targets=sorted(config.target_names()))  # fmt: skip

    one = {"id": UUID_PARAM}
    both = {"id": UUID_PARAM, "checkId": UUID_PARAM}
    return [
        ApiRoute("POST", "/v2/monitor", h["create"],
                 "Create a monitor: a schedule and targets whose pages each check compares with"
                 " their previous snapshot (same, new, changed, removed, error)",
                 body=MonitorBody, body_required=True, response=MonitorAnswer, deployment=schemas,
                 errors={400: "Bad Request: the field named (schedule below [monitors]"
                              " min_interval, unknown time zone, 0 or more than 50 targets, bad"
                              " target options, search targets, a notification this crawld"
                              " cannot send)"}),
        ApiRoute("GET", "/v2/monitor", h["list"], "The monitors, newest first",
                 response=MonitorList, query=[LIMIT, OFFSET], errors={400: "Bad Request"}),
        ApiRoute("GET", "/v2/monitor/{id}", h["get"], "A monitor", response=MonitorAnswer,
                 path_params=one, errors={404: "Monitor not found"}),
        ApiRoute("PATCH", "/v2/monitor/{id}", h["update"],
                 "Change a monitor (given fields replace the stored ones; `status` active or"
                 " paused)", body=MonitorPatch, response=MonitorAnswer, path_params=one,
                 deployment=schemas,
                 errors={400: "Bad Request: as POST /v2/monitor", 404: "Monitor not found"}),
        ApiRoute("DELETE", "/v2/monitor/{id}", h["delete"],
                 "Delete a monitor with its checks and snapshots", response=Deleted,
                 path_params=one, errors={404: "Monitor not found"}),
        ApiRoute("POST", "/v2/monitor/{id}/run", h["run"], "Start a check now (trigger manual)",
                 response=MonitorAnswer, path_params=one,
                 errors={404: "Monitor not found",
                         409: "The monitor is paused, or a check runs (its `checkId` given)"}),
        ApiRoute("GET", "/v2/monitor/{id}/checks", h["checks"], "A monitor's checks, newest first",
                 response=MonitorList, query=[LIMIT, OFFSET, CHECK_STATUS], path_params=one,
                 errors={400: "Bad Request", 404: "Monitor not found"}),
        ApiRoute("GET", "/v2/monitor/{id}/checks/{checkId}", h["check"],
                 "A check with its pages (paginated with `next`)", response=CheckDetail,
                 query=[LIMIT, SKIP, PAGE_STATUS], path_params=both,
                 errors={400: "Bad Request", 404: "Monitor check not found"}),
    ]  # fmt: skip
