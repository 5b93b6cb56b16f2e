# Routes every daemon has, whatever parts are enabled: liveness, one status document that explains
# what the process is doing (its sections read together, within a bound: daemon/api/sections.py),
# and Prometheus metrics.
from __future__ import annotations

import os
import time
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from daemon import __version__, metrics
from daemon.api import sections as sections_api
from daemon.api.app import ApiRoute, json
from daemon.process import Daemon
from daemon.redact import cap, redact_text, redact_tree
from daemon.runtime import ReloadResult


class Health(msgspec.Struct, omit_defaults=True):
    status: str
    """ok, degraded (the store cannot write), starting, stopping."""
    reason: str | None = None
    since_ms: int | None = None
    backend: str | None = None
    """While degraded: the store backend that cannot write (sqlite, postgres)."""


class ComponentStatus(msgspec.Struct):
    name: str
    state: str
    restarts: int
    last_error: str | None


class ConfigStatus(msgspec.Struct):
    source: str
    generation: int
    last_reload: ReloadResult | None


class StoreStatus(msgspec.Struct, omit_defaults=True):
    path: str
    """The SQLite file, or host:port/database schema NAME (never a password)."""
    schema_version: int
    transactions: int
    write_jobs: int
    write_errors: int
    largest_group: int
    writable: bool
    """False while writes fail (disk full, I/O error); `reason` and `since_ms` say why and when."""
    reason: str | None = None
    since_ms: int | None = None
    backend: str = "sqlite"
    """sqlite or postgres."""
    reads: int = 0
    """Reader transactions since start (with `write_jobs`: how often the daemon asks its
    store, e.g. while idle)."""


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
    crawl: dict[str, Any] | None = None
    llm: dict[str, Any] | None = None
    """The [llm] endpoints: model, structured-output modes refused, requests and tokens so far,
    requests in flight, cache hits (docs/how-to/llm-formats.md)."""
    cluster: dict[str, Any] | None = None
    """This instance's name, the members (alive, last heartbeat, the leases each holds) and what
    this instance's config says differently from theirs (docs/how-to/cluster.md)."""
    http: dict[str, Any] | None = None
    """The HTTP edge: keys configured (how many), accepted hosts, requests in progress, refusals."""


async def build_status(daemon: Daemon) -> Status:
    store = None
    if daemon.store is not None:
        s = daemon.store.stats
        health = daemon.store.health()
        store = StoreStatus(
            path=str(daemon.store.path),
            schema_version=daemon.store.schema_version,
            transactions=s.transactions,
            write_jobs=s.write_jobs,
            write_errors=s.write_errors,
            largest_group=s.largest_group,
            writable=health.writable,
            reason=health.reason,
            since_ms=health.since_ms,
            backend=daemon.store.backend.name,
            reads=s.reads,
        )
    # Sections come from every area; URLs (broker, webhooks, upstreams) and headers are redacted
    # here, once, so no area can leak a credential through /status.
    answers = await sections_api.read_all(daemon.status_sections)
    sections = {name: redact_tree(answer) for name, answer in answers.items()}
    return Status(
        state=daemon.state,
        version=__version__,
        pid=os.getpid(),
        uptime_s=round(time.monotonic() - daemon.started_monotonic, 3),
        config=ConfigStatus(
            source=daemon.config.source,
            generation=daemon.generation,
            last_reload=daemon.last_reload,
        ),
        components=[
            ComponentStatus(
                c.name,
                c.state,
                c.restarts,
                None if c.last_error is None else redact_text(c.last_error),
            )
            for c in daemon.component_states.values()
        ],
        store=store,
        **sections,
    )


def install(daemon: Daemon) -> None:
    daemon.routes.extend(routes(daemon))


def routes(daemon: Daemon) -> list[ApiRoute]:
    async def healthz(request: Request) -> Response:
        if daemon.state not in ("running", "reloading"):
            return json(Health(status=daemon.state), 503)
        health = daemon.store.health() if daemon.store is not None else None
        if health is not None and not health.writable:
            reason = cap(health.reason or "")
            backend = daemon.store.backend.name if daemon.store is not None else None
            return json(Health("degraded", reason, health.since_ms, backend), 503)
        return json(Health(status="ok"))

    async def status(request: Request) -> Response:
        return json(await build_status(daemon))

    async def metrics_text(request: Request) -> Response:
        for refresh in daemon.metric_refreshers:
            await refresh()
        cluster = daemon.cluster
        instance = cluster.instance if cluster is not None and cluster.multi else None
        return Response(
            metrics.render(instance), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    return [
        ApiRoute("GET", "/healthz", healthz, "Liveness: 200 while running (never needs a key)",
                 response=Health,
                 errors={503: "starting, stopping, or degraded: the store cannot write"}),
        ApiRoute("GET", "/status", status, "What the daemon is doing, per part", response=Status),
        ApiRoute("GET", "/metrics", metrics_text, "Prometheus metrics",
                 content_type="text/plain"),
    ]  # fmt: skip
