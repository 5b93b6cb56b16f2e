# Routes every daemon has, whatever parts are enabled: liveness, one status document that explains
# what the process is doing, and Prometheus metrics.
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from daemon import metrics
from daemon.api.app import ApiRoute, json

if TYPE_CHECKING:
    from daemon.app import Daemon


class Health(msgspec.Struct):
    status: str


class ComponentStatus(msgspec.Struct):
    name: str
    state: str
    restarts: int
    last_error: str | None


class ReloadResult(msgspec.Struct):
    ok: bool
    at_ms: int
    message: str


class ConfigStatus(msgspec.Struct):
    source: str
    generation: int
    last_reload: ReloadResult | None


class StoreStatus(msgspec.Struct):
    path: str
    schema_version: int
    transactions: int
    write_jobs: int
    write_errors: int
    largest_group: int


class Status(msgspec.Struct, omit_defaults=True):
    state: str
    version: str
    pid: int
    uptime_s: float
    config: ConfigStatus
    components: list[ComponentStatus]
    store: StoreStatus | None = None
    broker: dict[str, Any] | None = None
    collector: dict[str, Any] | None = None
    webhooks: dict[str, Any] | None = None
    tracker: dict[str, Any] | None = None


def routes(daemon: Daemon) -> list[ApiRoute]:
    async def healthz(request: Request) -> Response:
        ok = daemon.state in ("running", "reloading")
        return json(Health(status="ok" if ok else daemon.state), 200 if ok else 503)

    async def status(request: Request) -> Response:
        return json(await daemon.status())

    async def metrics_text(request: Request) -> Response:
        for refresh in daemon.metric_refreshers:
            await refresh()
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return [
        ApiRoute("GET", "/healthz", healthz, "Liveness: 200 while running", response=Health,
                 errors={503: "starting or stopping"}),
        ApiRoute("GET", "/status", status, "What the daemon is doing, per part", response=Status),
        ApiRoute("GET", "/metrics", metrics_text, "Prometheus metrics",
                 content_type="text/plain"),
    ]  # fmt: skip
