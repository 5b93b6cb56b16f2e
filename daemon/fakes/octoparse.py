# An Octoparse OpenAPI simulator: a real HTTP server speaking the documented wire format, so the
# client and the collector are tested (and demonstrated) over real sockets, not with mocks.
#
# Rows are held in a list per task; row i is the i-th oldest, so `/data/all` offsets are row
# indexes (offset <= 0 means from the start) and the answer's `offset` is the next index. Dates
# are generated relative to a `now` function the test controls, newest last. Every awkward
# behaviour the collector must survive can be switched on from Python (`OctoparseSim`) or over
# HTTP (`/_sim/...`): growth while paging, shrinking totals, short pages, 429s (with or without
# `Retry-After`), error bodies with any code under any status (200 included), tokens expiring.
# All state changes happen in async handlers without awaiting, so they are atomic under trio.
#
#   python -m daemon.fakes.octoparse --bind 127.0.0.1:8701 --rows 5000 --days 10
from __future__ import annotations

import argparse
import collections
import functools
import itertools
import secrets
import sys
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any
from zoneinfo import ZoneInfo

import msgspec
import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from daemon import outbox
from daemon.api.errors import (
    HTTPError,
    JSONResponse,
    decode_query_int,
    handle_http_error,
    read_json_body,
)
from daemon.api.server import serve_app

DAY_MS = 86_400_000
DEMO_USERNAME = "demo"
DEMO_PASSWORD = "demo-password"
DEMO_API_KEY = "op_sk_demo"


class SimTask(msgspec.Struct, kw_only=True):
    task_id: str
    name: str
    group_id: int
    date_field: str
    date_format: str
    """strftime pattern for the date field; "ms" / "s" write unix milliseconds / seconds."""
    rows: list[dict[str, str]] = msgspec.field(default_factory=list)
    grow_per_request: int = 0
    serial: int = 0


class _Fault(msgspec.Struct, kw_only=True):
    status: int
    code: str
    message: str
    remaining: int = 0
    every: int = 0
    path: str | None = None
    retry_after: str | None = None
    """A `Retry-After` header value sent with the fault (delta-seconds or an HTTP date)."""
    seen: int = 0

    def fires(self, path: str) -> bool:
        if self.path is not None and self.path != path:
            return False
        self.seen += 1
        if self.remaining > 0:
            self.remaining -= 1
            return True
        return self.every > 0 and self.seen % self.every == 0

    @property
    def spent(self) -> bool:
        return self.remaining <= 0 and self.every <= 0


class _Token(msgspec.Struct):
    username: str
    expires_at: float


class OctoparseSim:
    """State and controls of one simulated Octoparse account; `app` serves it."""

    def __init__(
        self,
        *,
        username: str = DEMO_USERNAME,
        password: str = DEMO_PASSWORD,
        api_key: str | None = DEMO_API_KEY,
        token_lifetime: float = 86_400.0,
        expired_token_status: int = 401,
        now_ms: Callable[[], int] = outbox.now_ms,
        clock: Callable[[], float] = time.monotonic,
        timezone: str = "Asia/Shanghai",
    ) -> None:
        self.username = username
        self.password = password
        self.api_key = api_key
        self.token_lifetime = token_lifetime
        self.expired_token_status = expired_token_status
        """Status for an expired or unknown token: 401, or 400 with Invalid.Token."""
        self.now_ms = now_ms
        self.clock = clock
        self.zone = ZoneInfo(timezone)
        self.page_cap: int | None = None
        """Most rows in one page, whatever `size` asks (simulates the 4/8 MB payload cap)."""
        self.groups: dict[int, str] = {}
        self.tasks: dict[str, SimTask] = {}
        self.requests: collections.Counter[str] = collections.Counter()
        self.grants: collections.Counter[str] = collections.Counter()
        self.faults_served: collections.Counter[str] = collections.Counter()
        """Injected faults answered, by "status code" (e.g. "429 TooManyRequests")."""
        self.log: collections.deque[tuple[str, str, dict[str, str]]] = collections.deque(
            maxlen=10_000
        )
        """(method, path, query) of recent requests, oldest first."""
        self.issued_tokens: list[str] = []
        """Every access and refresh token handed out (to check they never reach a log)."""
        self._faults: list[_Fault] = []
        self._access: dict[str, _Token] = {}
        self._refresh: dict[str, str] = {}
        self._group_ids = itertools.count(1)
        self._request_ids = itertools.count(1)
        self.app = self._build_app()

    # ---- controls -------------------------------------------------------------------------

    def add_group(self, name: str) -> int:
        group_id = next(self._group_ids)
        self.groups[group_id] = name
        return group_id

    def add_task(
        self,
        name: str = "demo",
        *,
        rows: int = 0,
        days: float = 7.0,
        task_id: str | None = None,
        group_id: int | None = None,
        date_field: str = "发布时间",
        date_format: str = "%Y-%m-%d %H:%M:%S",
    ) -> str:
        """A task with `rows` rows dated evenly over the last `days` days, newest last."""
        if group_id is None:
            group_id = next(iter(self.groups), None) or self.add_group("默认分组")
        elif group_id not in self.groups:
            raise KeyError(f"unknown group {group_id}")
        task_id = task_id or str(uuid.uuid5(uuid.NAMESPACE_URL, f"crawld-sim:{name}"))
        if task_id in self.tasks:
            raise ValueError(f"task {task_id} exists")
        self.tasks[task_id] = SimTask(
            task_id=task_id,
            name=name,
            group_id=group_id,
            date_field=date_field,
            date_format=date_format,
        )
        self.append_rows(task_id, rows, days=days)
        return task_id

    def append_rows(self, task_id: str, count: int, *, days: float = 0.0) -> None:
        """Append `count` rows dated evenly over the last `days` days up to now, newest last."""
        task = self.task(task_id)
        now = self.now_ms()
        span = round(days * DAY_MS)
        for i in range(count):
            age = span * (count - 1 - i) // count if count > 1 else 0
            self._append(task, now - age)

    def append_dated(self, task_id: str, record_ms: list[int]) -> None:
        """Append one row per given record time (epoch ms), in that order."""
        task = self.task(task_id)
        for ms in record_ms:
            self._append(task, ms)

    def grow(self, task_id: str, per_request: int) -> None:
        """Append `per_request` fresh rows before answering each `/data/all` of this task."""
        self.task(task_id).grow_per_request = per_request

    def truncate(self, task_id: str, total: int = 0) -> None:
        """Keep only the oldest `total` rows (0 clears the task, like `/data/remove`)."""
        task = self.task(task_id)
        del task.rows[max(total, 0) :]

    def throttle(
        self,
        *,
        next: int = 0,
        every: int = 0,
        path: str | None = None,
        retry_after: str | None = None,
    ) -> None:
        """Answer 429 to the next `next` requests and/or to every `every`-th one, with a
        `Retry-After: <retry_after>` header when given."""
        self._faults.append(
            _Fault(
                status=429,
                code="TooManyRequests",
                message="Too many requests",
                remaining=next,
                every=every,
                path=path,
                retry_after=retry_after,
            )
        )

    def fail(
        self,
        count: int = 1,
        *,
        code: str = "ServerError",
        message: str = "Internal Server Error",
        status: int = 200,
        every: int = 0,
        path: str | None = None,
        retry_after: str | None = None,
    ) -> None:
        """Answer `{error:{code, message}}` with `status` (default 200) to the next requests
        (any code: `SystemBusy` under 200 is how upstream reports a transient fault)."""
        self._faults.append(
            _Fault(
                status=status,
                code=code,
                message=message,
                remaining=count,
                every=every,
                path=path,
                retry_after=retry_after,
            )
        )

    def clear_faults(self) -> None:
        self._faults.clear()

    def expire_tokens(self, *, refresh: bool = False) -> None:
        """Every access token issued so far stops working; with `refresh`, refresh tokens too."""
        for token in self._access.values():
            token.expires_at = float("-inf")
        if refresh:
            self._refresh.clear()

    def task(self, task_id: str) -> SimTask:
        try:
            return self.tasks[task_id]
        except KeyError:
            raise KeyError(f"unknown task {task_id}") from None

    def request_count(self, path: str | None = None) -> int:
        return self.requests[path] if path is not None else sum(self.requests.values())

    def data_offsets(self, task_id: str | None = None) -> list[tuple[int, int]]:
        """(offset, size) of each `/data/all` request so far, oldest first."""
        return [
            (int(q.get("offset", "0")), int(q.get("size", "0")))
            for method, path, q in self.log
            if path == "/data/all" and (task_id is None or q.get("taskId") == task_id)
        ]

    def stats(self) -> dict[str, Any]:
        return {
            "requests": dict(self.requests),
            "grants": dict(self.grants),
            "faults_served": dict(self.faults_served),
            "page_cap": self.page_cap,
            "tasks": {
                t.task_id: {"name": t.name, "total": len(t.rows), "grow": t.grow_per_request}
                for t in self.tasks.values()
            },
        }

    def _append(self, task: SimTask, record_ms: int) -> None:
        serial = task.serial
        task.serial += 1
        task.rows.append(
            {
                "标题": f"{task.name} #{serial}",
                task.date_field: self._format_date(task.date_format, record_ms),
                "序号": str(serial),
                "链接": f"https://example.com/{task.name}/{serial}",
            }
        )

    def _format_date(self, pattern: str, record_ms: int) -> str:
        if pattern == "ms":
            return str(record_ms)
        if pattern == "s":
            return str(record_ms // 1000)
        return datetime.fromtimestamp(record_ms / 1000, self.zone).strftime(pattern)

    # ---- wire format ----------------------------------------------------------------------

    def _request_id(self) -> str:
        return f"sim-{next(self._request_ids):08d}"

    def _ok(self, data: Any) -> JSONResponse:
        return JSONResponse({"data": data, "requestId": self._request_id()})

    def _error(
        self, status: int, code: str, message: str, retry_after: str | None = None
    ) -> JSONResponse:
        return JSONResponse(
            {"error": {"code": code, "message": message}, "requestId": self._request_id()},
            status_code=status,
            headers={"Retry-After": retry_after} if retry_after is not None else None,
        )

    def _arrive(self, request: Request) -> JSONResponse | None:
        path = request.url.path
        self.requests[path] += 1
        self.log.append((request.method, path, dict(request.query_params)))
        for fault in self._faults:
            if fault.fires(path):
                self.faults_served[f"{fault.status} {fault.code}"] += 1
                response = self._error(fault.status, fault.code, fault.message, fault.retry_after)
                self._faults = [f for f in self._faults if not f.spent]
                return response
        self._faults = [f for f in self._faults if not f.spent]
        return None

    def _authorize(self, request: Request) -> JSONResponse | None:
        key = request.headers.get("x-api-key")
        bearer = request.headers.get("authorization")
        if key is not None and bearer is not None:
            return self._error(400, "InvalidParameter", "Use either x-api-key or Authorization")
        if key is not None:
            if self.api_key is not None and secrets.compare_digest(key, self.api_key):
                return None
            return self._error(401, "Invalid.ApiKey", "Invalid api key")
        if bearer is None or not bearer.lower().startswith("bearer "):
            return self._error(401, "Unauthorized", "Authorization required")
        token = self._access.get(bearer[7:].strip())
        if token is None or self.clock() >= token.expires_at:
            return self._error(self.expired_token_status, "Invalid.Token", "Token is invalid")
        return None

    async def _token(self, request: Request) -> Response:
        if (fault := self._arrive(request)) is not None:
            return fault
        try:
            body = msgspec.json.decode(await request.body())
        except msgspec.DecodeError:
            return self._error(400, "InvalidParameter", "Body must be JSON")
        if not isinstance(body, dict):
            return self._error(400, "InvalidParameter", "Body must be a JSON object")
        grant = body.get("grant_type")
        if grant == "password":
            good = body.get("username") == self.username and body.get("password") == self.password
            if not good:
                return self._error(400, "Invalid.Grant", "Incorrect username or password.")
            username = self.username
        elif grant == "refresh_token":
            found = self._refresh.pop(str(body.get("refresh_token")), None)
            if found is None:
                return self._error(400, "Invalid.Grant", "Invalid refresh token.")
            username = found
        else:
            return self._error(400, "InvalidParameter", "Invalid grant_type")
        self.grants[grant] += 1
        access, refresh = secrets.token_hex(16), secrets.token_hex(16)
        self._access[access] = _Token(username, self.clock() + self.token_lifetime)
        self._refresh[refresh] = username
        self.issued_tokens.extend((access, refresh))
        return self._ok(
            {
                "access_token": access,
                "expires_in": str(int(self.token_lifetime)),
                "token_type": "Bearer",
                "refresh_token": refresh,
            }
        )

    async def _data_all(self, request: Request) -> Response:
        if (refused := self._arrive(request) or self._authorize(request)) is not None:
            return refused
        try:
            offset = int(request.query_params.get("offset", "0"))
            size = int(request.query_params.get("size", "0"))
        except ValueError:
            return self._error(400, "InvalidParameter", "Invalid field")
        if not 1 <= size <= 1000:
            return self._error(400, "InvalidParameter", "Invalid field: size")
        task = self.tasks.get(request.query_params.get("taskId", ""))
        if task is None:
            return self._error(400, "InvalidTaskId", "Invalid task ID")
        if task.grow_per_request:
            self.append_rows(task.task_id, task.grow_per_request)
        start = max(offset, 0)
        take = min(size, self.page_cap) if self.page_cap is not None else size
        rows = task.rows[start : start + take]
        total = len(task.rows)
        following = start + len(rows)
        return self._ok(
            {
                "offset": following,
                "total": total,
                "restTotal": max(total - following, 0),
                "data": rows,
            }
        )

    async def _task_groups(self, request: Request) -> Response:
        if (refused := self._arrive(request) or self._authorize(request)) is not None:
            return refused
        return self._ok(
            [{"taskGroupId": gid, "taskGroupName": name} for gid, name in self.groups.items()]
        )

    async def _task_search(self, request: Request) -> Response:
        if (refused := self._arrive(request) or self._authorize(request)) is not None:
            return refused
        try:
            group_id = int(request.query_params.get("taskGroupId", ""))
        except ValueError:
            return self._error(400, "InvalidParameter", "Invalid field")
        if group_id not in self.groups:
            return self._error(400, "GroupNotFound", "Task group not found")
        return self._ok(
            [
                {"taskId": t.task_id, "taskName": t.name}
                for t in self.tasks.values()
                if t.group_id == group_id
            ]
        )

    # ---- /_sim control API ----------------------------------------------------------------

    async def _sim_stats(self, request: Request) -> Response:
        return JSONResponse(self.stats())

    async def _sim_add_task(self, request: Request) -> Response:
        spec = await read_json_body(request, _AddTask)
        try:
            task_id = self.add_task(
                spec.name,
                rows=spec.rows,
                days=spec.days,
                task_id=spec.task_id,
                group_id=spec.group_id,
                date_field=spec.date_field,
                date_format=spec.date_format,
            )
        except (KeyError, ValueError) as exc:
            raise HTTPError(409, str(exc.args[0])) from None
        return JSONResponse({"taskId": task_id, "total": len(self.tasks[task_id].rows)})

    def _sim_task(self, request: Request) -> SimTask:
        task = self.tasks.get(request.path_params["task_id"])
        if task is None:
            raise HTTPError(404, "unknown task", request.path_params["task_id"])
        return task

    async def _sim_append(self, request: Request) -> Response:
        task = self._sim_task(request)
        spec = await read_json_body(request, _Append)
        self.append_rows(task.task_id, spec.rows, days=spec.days)
        return JSONResponse({"taskId": task.task_id, "total": len(task.rows)})

    async def _sim_grow(self, request: Request) -> Response:
        task = self._sim_task(request)
        spec = await read_json_body(request, _Grow)
        self.grow(task.task_id, spec.per_request)
        return JSONResponse({"taskId": task.task_id, "grow": task.grow_per_request})

    async def _sim_truncate(self, request: Request) -> Response:
        task = self._sim_task(request)
        spec = await read_json_body(request, _Truncate)
        self.truncate(task.task_id, spec.total)
        return JSONResponse({"taskId": task.task_id, "total": len(task.rows)})

    async def _sim_page_cap(self, request: Request) -> Response:
        spec = await read_json_body(request, _PageCap)
        self.page_cap = spec.rows
        return JSONResponse({"page_cap": self.page_cap})

    async def _sim_throttle(self, request: Request) -> Response:
        spec = await read_json_body(request, _Throttle)
        self.throttle(
            next=spec.next, every=spec.every, path=spec.path, retry_after=spec.retry_after
        )
        return JSONResponse({"faults": len(self._faults)})

    async def _sim_fail(self, request: Request) -> Response:
        spec = await read_json_body(request, _Fail)
        self.fail(
            spec.count,
            code=spec.code,
            message=spec.message,
            status=spec.status,
            every=spec.every,
            path=spec.path,
            retry_after=spec.retry_after,
        )
        return JSONResponse({"faults": len(self._faults)})

    async def _sim_clear_faults(self, request: Request) -> Response:
        self.clear_faults()
        return JSONResponse({"faults": 0})

    async def _sim_expire_tokens(self, request: Request) -> Response:
        spec = await read_json_body(request, _Expire)
        self.expire_tokens(refresh=spec.refresh)
        return JSONResponse({"expired": len(self._access)})

    async def _sim_rows(self, request: Request) -> Response:
        task = self._sim_task(request)
        offset = decode_query_int(request, "offset", 0, 0, 1 << 40)
        count = decode_query_int(request, "count", 100, 1, 10_000)
        return JSONResponse({"total": len(task.rows), "rows": task.rows[offset : offset + count]})

    def _build_app(self) -> Starlette:
        routes = [
            Route("/token", self._token, methods=["POST"]),
            Route("/data/all", self._data_all, methods=["GET"]),
            Route("/taskGroup", self._task_groups, methods=["GET"]),
            Route("/task/search", self._task_search, methods=["GET"]),
            Route("/_sim/stats", self._sim_stats, methods=["GET"]),
            Route("/_sim/tasks", self._sim_add_task, methods=["POST"]),
            Route("/_sim/tasks/{task_id}/rows", self._sim_rows, methods=["GET"]),
            Route("/_sim/tasks/{task_id}/append", self._sim_append, methods=["POST"]),
            Route("/_sim/tasks/{task_id}/grow", self._sim_grow, methods=["POST"]),
            Route("/_sim/tasks/{task_id}/truncate", self._sim_truncate, methods=["POST"]),
            Route("/_sim/page_cap", self._sim_page_cap, methods=["POST"]),
            Route("/_sim/throttle", self._sim_throttle, methods=["POST"]),
            Route("/_sim/fail", self._sim_fail, methods=["POST"]),
            Route("/_sim/faults/clear", self._sim_clear_faults, methods=["POST"]),
            Route("/_sim/tokens/expire", self._sim_expire_tokens, methods=["POST"]),
        ]
        return Starlette(routes=routes, exception_handlers={HTTPError: handle_http_error})


HeaderValue = Annotated[str, msgspec.Meta(pattern=r"^[ -~]{1,64}$")]
"""A printable-ASCII header value (a `Retry-After` the control API will send back)."""


class _AddTask(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    name: str = "demo"
    rows: int = 0
    days: float = 7.0
    task_id: str | None = None
    group_id: int | None = None
    date_field: str = "发布时间"
    date_format: str = "%Y-%m-%d %H:%M:%S"


class _Append(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    rows: int
    days: float = 0.0


class _Grow(msgspec.Struct, forbid_unknown_fields=True):
    per_request: int


class _Truncate(msgspec.Struct, forbid_unknown_fields=True):
    total: int = 0


class _PageCap(msgspec.Struct, forbid_unknown_fields=True):
    rows: int | None = None


class _Throttle(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    next: int = 0
    every: int = 0
    path: str | None = None
    retry_after: HeaderValue | None = None


class _Fail(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    count: int = 1
    code: str = "ServerError"
    message: str = "Internal Server Error"
    status: int = 200
    every: int = 0
    path: str | None = None
    retry_after: HeaderValue | None = None


class _Expire(msgspec.Struct, forbid_unknown_fields=True):
    refresh: bool = False


async def serve_sim(
    sim: OctoparseSim,
    bind: str,
    *,
    shutdown: trio.Event | None = None,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `sim` on `bind` until `shutdown` is set; started() gets the bound (host, port)."""
    await serve_app(
        sim.app,
        bind,
        shutdown=shutdown,
        graceful_timeout=1.0,
        name="sim.octoparse",
        task_status=task_status,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m daemon.fakes.octoparse", description="Serve a simulated Octoparse account."
    )
    parser.add_argument("--bind", default="127.0.0.1:8701")
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--days", type=float, default=10.0)
    parser.add_argument("--grow", type=int, default=0, help="rows appended per data request")
    parser.add_argument("--page-cap", type=int, default=None, help="most rows in one page")
    parser.add_argument("--token-lifetime", type=float, default=86_400.0)
    args = parser.parse_args(argv)

    sim = OctoparseSim(token_lifetime=args.token_lifetime)
    sim.page_cap = args.page_cap
    task_id = sim.add_task("demo", rows=args.rows, days=args.days)
    if args.grow:
        sim.grow(task_id, args.grow)

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            host, port = await nursery.start(functools.partial(serve_sim, sim, args.bind))
            print(
                f"Octoparse simulator on http://{host}:{port}\n"
                f"  username={sim.username} password={sim.password} "
                f"(export OCTOPARSE_PASSWORD={sim.password}) api key={sim.api_key}\n"
                f"  task {task_id} 'demo': {args.rows} rows over {args.days} days, "
                f"date_field=发布时间, grow={args.grow}/request, page cap={args.page_cap}\n"
                f'  controls: GET /_sim/stats, POST /_sim/tasks/{task_id}/append {{"rows": 10}}',
                flush=True,
            )

    try:
        trio.run(run)
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
