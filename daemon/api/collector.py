# The collector's control API from the seed (section 8): task list, manual start/stop of runs,
# and reading the queue the rows went to (RabbitMQ or the embedded queue). In cluster mode a
# start or stop of a task another instance runs is left for that instance (202, naming it).
from __future__ import annotations

from typing import Annotated, Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from daemon.api.app import ApiRoute, QueryParam, int_param, json
from daemon.api.errors import HTTPError, read_json_body
from daemon.collector.contracts import AlreadyRunning, CrawlerStopped
from daemon.collector.messages import ConsumedMessage
from daemon.collector.octoparse import OctoparseError
from daemon.collector.queue import QueueUnavailable, RowQueue
from daemon.collector.service import Collector, CollectorNotRunning, UnknownAccount, UnknownTask
from daemon.config import HttpConfig, WebhookSpec, WebhookURL, check_webhook_url, is_loopback_host
from daemon.process import Daemon
from daemon.redact import redact_tree


class StartRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    task_id: str | None = None
    """Start this task only; all enabled tasks when absent."""
    webhook: WebhookURL | WebhookSpec | None = None
    """Firecrawl v2 webhook for the run's job (overrides the task's)."""

    def __post_init__(self) -> None:
        if isinstance(self.webhook, str):
            check_webhook_url(self.webhook)


class StopRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    task_id: str | None = None


class StartedRun(msgspec.Struct):
    task_id: str
    job_id: str | None


class HandedOver(msgspec.Struct):
    """A start or stop left for the instance that runs the task (cluster mode)."""

    task_id: str
    instance: str | None
    """The task's owner when the request was left (None: whoever takes the task next)."""


class StartResponse(msgspec.Struct, omit_defaults=True):
    success: bool
    started: list[StartedRun]
    already_running: list[str]
    requested: list[HandedOver] = []
    """Tasks another instance runs: the start was left for it (its job id is not known here)."""


class StopResponse(msgspec.Struct, omit_defaults=True):
    success: bool
    stopped: list[str]
    not_running: list[str]
    requested: list[HandedOver] = []
    """Tasks another instance runs: the stop was left for it."""


class TasksResponse(msgspec.Struct):
    tasks: list[dict[str, Any]]


class ConsumeResponse(msgspec.Struct):
    queue: str
    kind: str
    count: int
    messages: list[ConsumedMessage]


COUNT = int_param("count", "messages to take (default 1)", 1, 1000)


class ConsumeRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    count: Annotated[int, msgspec.Meta(ge=1, le=1000)] | None = None
    """Messages to take, 1..1000 (default: the `count` query parameter, else 1)."""


def get_consume_allowed(http: HttpConfig) -> bool:
    """GET /consume (the seed's form) deletes messages, so it is served only where a web page
    cannot reach it unauthenticated: on a loopback bind, or when every request needs a key."""
    return http.api_key_env is not None or is_loopback_host(http.bind.rpartition(":")[0])


class DiscoverResponse(msgspec.Struct):
    account: str
    groups: list[dict[str, Any]]


class QueueSizeResponse(msgspec.Struct):
    queue: str
    kind: str
    size: int


class CollectorHandlers:
    """The collector routes' handlers over one collector and the queue its rows go to."""

    def __init__(self, daemon: Daemon, collector: Collector, queue: RowQueue) -> None:
        self.daemon = daemon
        self.collector = collector
        self.queue = queue

    async def crawlers(self, task_id: str | None) -> list[str]:
        """The tasks a start or stop is for: every task listed here, or the one named (listed
        here, or run by another instance)."""
        if task_id is None:
            return list(self.collector.crawlers)
        if task_id in self.collector.crawlers:
            return [task_id]
        if self.collector.cluster is not None and await self.collector.owner(task_id) is not None:
            return [task_id]
        configured = {t.id for t in self.collector.config.collector.tasks}
        reason = "is disabled" if task_id in configured else "is not configured"
        if self.collector.cluster is not None and self.collector.cluster.multi:
            reason += " here and no instance runs it"
        raise HTTPError(404, f"task {task_id!r} {reason}", {"task_id": task_id})

    async def tasks(self, request: Request) -> Response:
        # Webhook URLs and headers in task settings may carry credentials.
        return json(TasksResponse(redact_tree(self.collector.tasks())))

    async def start(self, request: Request) -> Response:
        body = await read_json_body(request, StartRequest)
        started, busy, requested = [], [], []
        for task_id in await self.crawlers(body.task_id):
            if not self.collector.owns(task_id) and not await self.collector.take_now(task_id):
                webhook = msgspec.to_builtins(body.webhook)
                owner = await self.collector.hand_over(task_id, "start", {"webhook": webhook})
                requested.append(HandedOver(task_id, owner))
                continue
            try:
                job_id = await self.collector.crawler(task_id).start_now(body.webhook)
            except (AlreadyRunning, UnknownTask):
                busy.append(task_id)
                continue
            except CrawlerStopped as exc:
                message = f"task {task_id!r} stopped before its run began"
                raise HTTPError(503, message, str(exc)) from None
            started.append(StartedRun(task_id, job_id))
        if body.task_id is not None and busy:
            raise HTTPError(
                409, f"task {body.task_id!r} is already running", {"task_id": body.task_id}
            )
        return answer(StartResponse(True, started, busy, requested), body.task_id is not None)

    async def stop(self, request: Request) -> Response:
        body = await read_json_body(request, StopRequest)
        stopped: list[str] = []
        idle: list[str] = []
        requested: list[HandedOver] = []
        for task_id in await self.crawlers(body.task_id):
            if not self.collector.owns(task_id):
                owner = await self.collector.hand_over(task_id, "stop", {})
                requested.append(HandedOver(task_id, owner))
                continue
            (stopped if self.collector.crawler(task_id).request_stop() else idle).append(task_id)
        return answer(StopResponse(True, stopped, idle, requested), body.task_id is not None)

    async def consume(self, request: Request) -> Response:
        count = COUNT.read_int(request, 1)
        if request.method == "POST":
            body = await read_json_body(request, ConsumeRequest)
            if body.count is not None:
                count = body.count
        elif not get_consume_allowed(self.daemon.config.http):
            raise HTTPError(405, "GET /consume is refused here: use POST /consume", {
                "reason": "GET is served only on a loopback bind or with an API key"})  # fmt: skip
        try:
            messages = await self.queue.consume(count)
        except QueueUnavailable as exc:
            raise HTTPError(503, "queue unavailable", str(exc)) from None
        return json(ConsumeResponse(self.queue.name, self.queue.kind, len(messages), messages))

    async def queue_size(self, request: Request) -> Response:
        try:
            size = await self.queue.size()
        except QueueUnavailable as exc:
            raise HTTPError(503, "queue unavailable", str(exc)) from None
        return json(QueueSizeResponse(self.queue.name, self.queue.kind, size))

    async def discover(self, request: Request) -> Response:
        account = request.query_params.get("account")
        if account is None:
            raise HTTPError(400, "query parameter 'account' is required", {"account": None})
        if not account:
            raise HTTPError(400, "query parameter 'account' must not be empty", {"account": ""})
        try:
            groups = await self.collector.discover(account)
        except UnknownAccount:
            message = f"account {account!r} is not configured"
            raise HTTPError(404, message, {"account": account}) from None
        except CollectorNotRunning as exc:
            raise HTTPError(503, "collector not running", str(exc)) from None
        except OctoparseError as exc:
            detail = {"code": exc.code, "requestId": exc.request_id}
            raise HTTPError(502, f"Octoparse answered: {exc.message}", detail) from None
        return json(DiscoverResponse(account, groups))


def answer(struct: StartResponse | StopResponse, one_task: bool) -> Response:
    """202 when the one task asked for was left for another instance, else 200."""
    handed_over_only = one_task and bool(struct.requested)
    return json(struct, status=202) if handed_over_only else json(struct)


def routes(daemon: Daemon, collector: Collector, queue: RowQueue) -> list[ApiRoute]:
    h = CollectorHandlers(daemon, collector, queue)
    bad = {400: "invalid JSON", 422: "invalid field"}
    return [
        ApiRoute("GET", "/tasks", h.tasks, "Configured tasks, their settings and progress",
                 response=TasksResponse),
        ApiRoute("POST", "/crawl/start", h.start,
                 "Start a run now (one task or all enabled); 202: left for the instance that"
                 " runs the task",
                 body=StartRequest, response=StartResponse,
                 errors={**bad, 404: "unknown or disabled task (and no instance runs it)",
                         409: "already running",
                         503: "the task's crawler stopped (reload) before the run began"}),
        ApiRoute("POST", "/crawl/stop", h.stop,
                 "Stop runs after their current window; 202: left for the instance that runs"
                 " the task",
                 body=StopRequest, response=StopResponse,
                 errors={**bad, 404: "unknown or disabled task (and no instance runs it)"}),
        ApiRoute("POST", "/consume", h.consume,
                 "Take up to `count` messages off the queue: they are deleted from it",
                 body=ConsumeRequest, response=ConsumeResponse,
                 query=[COUNT],
                 errors={**bad, 503: "broker or storage unavailable", 507: "storage full"}),
        ApiRoute("GET", "/consume", h.consume,
                 "Seed-compatible form of POST /consume (loopback bind or API key only)",
                 response=ConsumeResponse,
                 query=[COUNT],
                 errors={400: "bad count", 405: "refused: use POST",
                         503: "broker or storage unavailable", 507: "storage full"}),
        ApiRoute("GET", "/discover", h.discover,
                 "An account's Octoparse task groups and tasks (to fill in task_id)",
                 response=DiscoverResponse,
                 query=[QueryParam("account", "a [[collector.accounts]] name", required=True,
                                   min_length=1)],
                 errors={400: "no account, or an empty one", 404: "unknown account",
                         502: "Octoparse error", 503: "collector not running"}),
        ApiRoute("GET", "/queue/size", h.queue_size, "Messages ready in the queue",
                 response=QueueSizeResponse, errors={503: "broker unavailable"}),
    ]  # fmt: skip
