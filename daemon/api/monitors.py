# Firecrawl's /v2/monitor over HTTP, in the shapes firecrawl-py 4.55's monitor methods and
# firecrawl-mcp's monitor tools read: `{success, data}` answers, a check's pages paginated with a
# top-level `next` (firecrawl-py follows it), 400 naming the fields of a bad definition, 404 for
# an unknown monitor or check, 409 for a manual run on a paused monitor or while a check runs
# (with the running `checkId`). The work: daemon/crawl/monitors/.
from __future__ import annotations

from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from daemon.api.app import UUID_PARAM, ApiRoute, QueryParam, int_param, json, public_link
from daemon.api.crawl import bad_request, firecrawl_error, request_body
from daemon.crawl.monitors.service import MonitorNotFound, MonitorService, RunRefused
from daemon.crawl.problems import BadRequest, json_object

LIMIT = int_param("limit", "Most items in this answer", 1, 1000)
OFFSET = int_param("offset", "Items to skip", 0, 2**31)
SKIP = int_param("skip", "Pages to skip (from the `next` link)", 0, 2**31)
CHECK_STATUSES = ("queued", "running", "completed", "failed", "partial", "skipped_overlap")
PAGE_STATUSES = ("same", "new", "changed", "removed", "error")
CHECK_STATUS = QueryParam("status", "Only checks with this status", enum=CHECK_STATUSES)
PAGE_STATUS = QueryParam("status", "Only pages with this status", enum=PAGE_STATUSES)


class MonitorBody(msgspec.Struct, kw_only=True):
    """POST /v2/monitor (PATCH takes the same fields, all optional, and `status`)."""

    name: str
    schedule: dict[str, Any]
    """`{cron}` or `{text}` ("every 15 minutes", "hourly", "daily at 9am", ...), `timezone`."""
    targets: list[dict[str, Any]]
    """1..50 of `{type: "scrape", urls, scrapeOptions?}` or `{type: "crawl", url,
    crawlOptions?, scrapeOptions?}`."""
    webhook: dict[str, Any] | None = None
    notification: dict[str, Any] | None = None
    retentionDays: int | None = None
    goal: str | None = None
    judgeEnabled: bool | None = None
    origin: str | None = None


class MonitorPatch(msgspec.Struct, kw_only=True):
    name: str | None = None
    status: str | None = None
    schedule: dict[str, Any] | None = None
    targets: list[dict[str, Any]] | None = None
    webhook: dict[str, Any] | None = None
    notification: dict[str, Any] | None = None
    retentionDays: int | None = None
    goal: str | None = None
    judgeEnabled: bool | None = None


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
    one = {"id": UUID_PARAM}
    both = {"id": UUID_PARAM, "checkId": UUID_PARAM}
    return [
        ApiRoute("POST", "/v2/monitor", h["create"],
                 "Create a monitor: a schedule and targets whose pages each check compares with"
                 " their previous snapshot (same, new, changed, removed, error)",
                 body=MonitorBody, response=MonitorAnswer,
                 errors={400: "Bad Request: the field named (schedule below [monitors]"
                              " min_interval, unknown time zone, 0 or more than 50 targets, bad"
                              " target options, search targets, email notifications)"}),
        ApiRoute("GET", "/v2/monitor", h["list"], "The monitors, newest first",
                 response=MonitorList, query=[LIMIT, OFFSET], errors={400: "Bad Request"}),
        ApiRoute("GET", "/v2/monitor/{id}", h["get"], "A monitor", response=MonitorAnswer,
                 path_params=one, errors={404: "Monitor not found"}),
        ApiRoute("PATCH", "/v2/monitor/{id}", h["update"],
                 "Change a monitor (given fields replace the stored ones; `status` active or"
                 " paused)", body=MonitorPatch, response=MonitorAnswer, path_params=one,
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
