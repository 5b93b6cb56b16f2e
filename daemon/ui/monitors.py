# The monitors page's two routes the API has no equivalent for (issue 34): the monitors with
# their last checks in one answer (the page would otherwise ask /v2/monitor/{id}/checks once per
# monitor on every refresh), and one page of a check with its diff read into the rows the page
# draws (daemon/ui/diffview.py). Both read through the monitors' service; what the page changes
# (run now, pause, resume) goes through /v2/monitor itself, under the same session rules.
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from daemon.api.app import json
from daemon.api.errors import HTTPError, decode_query_int
from daemon.crawl.monitors.service import MonitorNotFound
from daemon.process import Daemon
from daemon.ui import diffview

if TYPE_CHECKING:
    from daemon.crawl.monitors.service import MonitorService

Secure = Callable[[Response], Response]
"""The console's `secured`: its security headers on an answer."""
MAX_PAGE_N = 2**31


def _service(daemon: Daemon) -> MonitorService | None:
    if not daemon.config.monitors.enabled:
        return None
    return daemon.parts.get("monitors")


def _page_number(request: Request) -> int:
    raw = request.path_params["n"]
    if not (raw.isascii() and raw.isdigit()) or int(raw) > MAX_PAGE_N:
        raise HTTPError(400, "n must be a page number (the part after ':' in a page id)",
                        {"field": "n", "n": raw[:40]})  # fmt: skip
    return int(raw)


def routes(daemon: Daemon, secured: Secure) -> list[Route]:
    async def listing(request: Request) -> Response:
        limit = decode_query_int(request, "limit", 100, 1, 500)
        per = decode_query_int(request, "checks", 5, 0, 20)
        service = _service(daemon)
        if service is None:
            return secured(json({"enabled": False, "count": 0, "monitors": []}))
        shown = []
        for monitor in await service.listing(limit, 0):
            try:
                monitor["checks"] = await service.checks(monitor["id"], per, 0, None) if per else []
            except MonitorNotFound:
                continue  # deleted meanwhile
            shown.append(monitor)
        return secured(json({"enabled": True, "count": len(shown), "monitors": shown}))

    async def page(request: Request) -> Response:
        n = _page_number(request)
        service = _service(daemon)
        if service is None:
            raise HTTPError(404, "monitors are not enabled ([monitors] enabled)")
        monitor_id, check_id = request.path_params["id"], request.path_params["checkId"]
        try:
            monitor = await service.get(monitor_id)
            check = await service.check(monitor_id, check_id, limit=0)
            found = await service.page(monitor_id, check_id, n)
        except MonitorNotFound as exc:
            raise HTTPError(404, "no such monitor, check or page", {"id": str(exc)[:120]}) from None
        for key in ("pages", "more"):
            check.pop(key, None)
        body = {"monitor": {"id": monitor["id"], "name": monitor["name"]}, "check": check,
                "page": found, "view": diffview.view(found.get("diff"))}  # fmt: skip
        return secured(json(body))

    return [
        Route("/ui/api/monitors", listing, methods=["GET"]),
        Route("/ui/api/monitors/{id}/checks/{checkId}/pages/{n}", page, methods=["GET"]),
    ]
