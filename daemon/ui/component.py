# The web console at /ui (issue 19): a page shell, its CSS and JS shipped in this package and
# served by crawld (no build step, no outside origin), and the few JSON routes the JSON API has no
# equivalent for (session, login, job list, video search, the decimated view curve, the monitors
# with their last checks and a changed page's diff view: daemon/ui/monitors.py). Everything
# else the page shows comes from the API's own routes (/status, /tasks, /tracker/…, /v2/crawl/…),
# which the browser calls with its session cookie: one set of rules, one set of answers.
#
# The routes are Starlette routes in `daemon.pages` (behind the same edge, not in /openapi.json:
# they are the console's, not the API's). They read the store through the areas' queries
# (the tracker's: daemon/tracker/queries.py).
# One component, "console", reads the queue's stream every few seconds into the last hour's
# per-minute history (daemon/ui/history.py), so the overview's chart needs no open page.
from __future__ import annotations

from importlib import resources
from typing import Annotated, Any

import msgspec
import trio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from daemon.api.app import json
from daemon.api.edge import bearer_matches, parse_keys
from daemon.api.errors import HTTPError, decode_query_int, error_response, read_json_body
from daemon.api.tracker import path_aid
from daemon.clock import wall_ms
from daemon.collector.queue import stream_name
from daemon.config import resolve_secret
from daemon.jobs.records import job_list
from daemon.jobs.types import KINDS as JOB_KINDS
from daemon.process import Daemon
from daemon.redact import redact_tree
from daemon.tracker.queries import TrackerQueries
from daemon.ui import curve
from daemon.ui import monitors as monitor_pages
from daemon.ui.history import QueueHistory
from daemon.ui.login_limit import LoginLimits
from daemon.ui.sessions import Sessions, clear_cookie, cookie_value, set_cookie

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
STATIC = {
    "app.js": "text/javascript; charset=utf-8",
    "monitors.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "index.html": "text/html; charset=utf-8",
}
SAMPLE_S = 10.0
"""How often the console component reads the queue's stream for the overview's history."""


class LoginRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    key: Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]


def load_assets() -> dict[str, bytes]:
    """The console's files from the package (read once at install)."""
    folder = resources.files("daemon.ui") / "static"
    return {name: (folder / name).read_bytes() for name in STATIC}


def secured(response: Response) -> Response:
    for name, value in SECURITY_HEADERS.items():
        response.headers[name] = value
    return response


def install(daemon: Daemon) -> None:
    http = daemon.config.http
    if not http.enabled:
        return
    keys = parse_keys(resolve_secret(http.api_key_env, "$.http.api_key_env"))
    secure = (http.public_url or "").lower().startswith("https://")
    sessions = Sessions()
    history = QueueHistory()
    daemon.sessions = sessions
    daemon.parts["ui"] = sessions
    daemon.parts["queue_history"] = history
    limits = LoginLimits(trio.current_time)
    daemon.pages.extend(routes(daemon, sessions, keys, secure, load_assets(), history, limits))

    async def sample(daemon: Daemon, *, task_status: trio.TaskStatus[None]) -> None:
        await read_queue(daemon, history)
        task_status.started()
        while True:
            await trio.sleep(SAMPLE_S)
            await read_queue(daemon, history)

    daemon.add_component("console", sample)


async def read_queue(daemon: Daemon, history: QueueHistory) -> None:
    """One reading of the configured queue's stream into `history`."""
    if daemon.outbox is None:
        return
    state = await daemon.outbox.state(stream_name(daemon.config.broker.queue))
    history.observe(wall_ms(), state.last_seq, state.ack_cursor)


def client_address(request: Request) -> str:
    return request.client.host if request.client else "unknown"


class ConsoleHandlers:
    """The console routes' handlers (all but the job list, which `routes` reads itself)."""

    def __init__(
        self, daemon: Daemon, sessions: Sessions, keys: tuple[bytes, ...], secure: bool,
        assets: dict[str, bytes], history: QueueHistory, limits: LoginLimits,
    ) -> None:  # fmt: skip
        self.daemon = daemon
        self.sessions = sessions
        self.keys = keys
        self.secure = secure
        self.assets = assets
        self.history = history
        self.limits = limits

    def store(self) -> Any:
        if self.daemon.store is None:
            raise HTTPError(503, "the store is not open")
        return self.daemon.store

    async def page(self, request: Request) -> Response:
        return secured(Response(self.assets["index.html"], media_type=STATIC["index.html"]))

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC or name == "index.html":
            raise HTTPError(404, "not found", {"path": request.url.path})
        response = Response(self.assets[name], media_type=STATIC[name])
        return secured(response)

    async def session(self, request: Request) -> Response:
        current = self.sessions.from_headers(request.headers)
        by_key = bool(self.keys) and bearer_matches(request.headers.get("authorization"), self.keys)
        return secured(json({
            "auth_required": bool(self.keys),
            "logged_in": not self.keys or current is not None or by_key,
            "csrf": None if current is None else current.csrf,
        }))  # fmt: skip

    async def login(self, request: Request) -> Response:
        body = await read_json_body(request, LoginRequest, empty_ok=False)
        if not self.keys:
            return secured(json({"auth_required": False, "logged_in": True, "csrf": None}))
        address = client_address(request)
        wait = self.limits.retry_after(address)
        if wait:
            if self.daemon.http_stats is not None:
                self.daemon.http_stats.refuse("login_rate")
            response = error_response(429, "too many wrong keys from this address; wait",
                                      {"retry_after_s": wait})  # fmt: skip
            response.headers["Retry-After"] = str(wait)
            return secured(response)
        if not bearer_matches(f"Bearer {body.key}", self.keys):
            self.limits.wrong_key(address)
            raise HTTPError(401, "the API key is not valid", {"field": "key"})
        self.sessions.drop(cookie_value(request.headers.get("cookie")))
        token, created = self.sessions.create()
        response = json({"auth_required": True, "logged_in": True, "csrf": created.csrf})
        response.headers["Set-Cookie"] = set_cookie(token, secure=self.secure)
        return secured(response)

    async def logout(self, request: Request) -> Response:
        self.sessions.drop(cookie_value(request.headers.get("cookie")))
        response = json({"logged_in": not self.keys})
        response.headers["Set-Cookie"] = clear_cookie(secure=self.secure)
        return secured(response)

    async def queue(self, request: Request) -> Response:
        await read_queue(self.daemon, self.history)
        minutes = self.history.series(wall_ms())
        published = sum(m["published"] or 0 for m in minutes)
        body = {"queue": self.daemon.config.broker.queue, "minutes": minutes,
                "published_last_hour": published}  # fmt: skip
        return secured(json(body))

    async def videos(self, request: Request) -> Response:
        query = request.query_params.get("q", "")
        if len(query) > 200:
            raise HTTPError(400, "q is longer than 200 characters", {"field": "q"})
        limit = decode_query_int(request, "limit", 50, 1, 500)
        found = await TrackerQueries(self.store()).search(query, limit)
        return secured(json({"count": len(found), "videos": found}))

    async def video_curve(self, request: Request) -> Response:
        aid = path_aid(request)
        name = request.query_params.get("range", "all")
        if name not in curve.RANGES:
            raise HTTPError(400, f"range must be one of {', '.join(curve.RANGES)}",
                            {"field": "range", "range": name[:20]})  # fmt: skip
        points = decode_query_int(request, "points", curve.MAX_POINTS, 2, curve.MAX_POINTS)
        now = wall_ms()
        since, until = curve.window(name, now)
        rows = await TrackerQueries(self.store()).snapshots(aid, since, until, 2**62)
        if rows is None:
            raise HTTPError(404, f"video {aid} is not tracked", {"aid": aid})
        kept = curve.decimate(rows, points)
        views = [r[1] for r in rows]
        lines = curve.milestone_lines(min(views), max(views)) if views else []
        # (at_ms, views, likes, coins): the columns the chart draws
        body = {"aid": aid, "range": name, "since_ms": since, "until_ms": until, "now_ms": now,
                "total": len(rows), "count": len(kept), "milestones": lines,
                "points": [[r[0], r[1], r[4], r[5]] for r in kept]}  # fmt: skip
        return secured(json(body))


def routes(
    daemon: Daemon, sessions: Sessions, keys: tuple[bytes, ...], secure: bool,
    assets: dict[str, bytes], history: QueueHistory, limits: LoginLimits,
) -> list[Route]:  # fmt: skip
    h = ConsoleHandlers(daemon, sessions, keys, secure, assets, history, limits)
    store = h.store

    async def jobs(request: Request) -> Response:
        limit = decode_query_int(request, "limit", 100, 1, 1000)
        kind = request.query_params.get("kind")
        if kind is not None and kind not in JOB_KINDS:
            raise HTTPError(400, f"kind must be one of {sorted(JOB_KINDS)}", {"kind": kind[:40]})
        records, delivery = await job_list(store(), limit, kind)
        items = [
            {"id": r.id, "kind": r.kind, "status": r.status, "completed": r.completed,
             "total": r.total, "created_ms": r.created_ms, "completed_ms": r.completed_ms,
             "webhook": r.webhook is not None, "source": redact_tree(r.source),
             "error": r.error, "delivery": delivery.get(r.id)}
            for r in records
        ]  # fmt: skip
        return secured(json({"count": len(items), "jobs": items}))

    return [
        Route("/ui", h.page, methods=["GET"]),
        Route("/ui/", h.page, methods=["GET"]),
        Route("/ui/static/{name}", h.static, methods=["GET"]),
        Route("/ui/api/session", h.session, methods=["GET"]),
        Route("/ui/api/login", h.login, methods=["POST"]),
        Route("/ui/api/logout", h.logout, methods=["POST"]),
        Route("/ui/api/jobs", jobs, methods=["GET"]),
        Route("/ui/api/queue", h.queue, methods=["GET"]),
        Route("/ui/api/videos", h.videos, methods=["GET"]),
        Route("/ui/api/videos/{aid}/curve", h.video_curve, methods=["GET"]),
        *monitor_pages.routes(daemon, secured),
    ]
