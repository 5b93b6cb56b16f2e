# The HTTP area: one hypercorn server for every route the other areas registered. It is
# installed last, and builds the ASGI app when it starts, so the route list is complete.
from __future__ import annotations

from typing import Any

import trio

from daemon.api.app import build_app, edge_policy
from daemon.api.edge import MIN_KEY_LENGTH, EdgeStats, parse_keys
from daemon.api.server import serve_app
from daemon.config import ConfigError, HttpConfig, resolve_secret
from daemon.logs import get_logger
from daemon.process import Daemon
from daemon.settings import Config

log = get_logger("http")


def install(daemon: Daemon) -> None:
    if daemon.config.http.enabled:
        daemon.add_component("http", serve_http)


def only_local_names(http: HttpConfig) -> bool:
    """Whether a wildcard bind meets the default Host list, which holds only local names."""
    return http.bind.rpartition(":")[0].strip("[]") in ("0.0.0.0", "::") and not http.hosts


def check_secrets(cfg: Config) -> None:
    """The API key variable, when named, must hold at least one key of a sensible length."""
    path = "$.http.api_key_env"
    value = resolve_secret(cfg.http.api_key_env, path)
    if value is None:
        return
    keys = parse_keys(value)
    if not keys:
        raise ConfigError(f"environment variable {cfg.http.api_key_env} (named at `{path}`) "
                          "holds no API key")  # fmt: skip
    if any(len(k) < MIN_KEY_LENGTH for k in keys):
        raise ConfigError(
            f"environment variable {cfg.http.api_key_env} (named at `{path}`) holds a key "
            f"shorter than {MIN_KEY_LENGTH} characters"
        )


async def serve_http(daemon: Daemon, *, task_status: trio.TaskStatus[Any]) -> None:
    policy = edge_policy(daemon)
    stats = EdgeStats()
    daemon.http_stats = stats
    http = daemon.config.http
    if only_local_names(http):
        log.warning(
            "bind is a wildcard address but [http] hosts is empty: only localhost names are "
            "accepted (421 otherwise); list the names clients use",
            bind=http.bind,
        )
    app = build_app(daemon, daemon.routes, policy, stats)

    async def http_section() -> dict[str, Any]:
        return {
            "address": None if daemon.http_address is None else list(daemon.http_address),
            "api_keys": len(policy.keys),
            "metrics_public": policy.metrics_public,
            "hosts": "any"
            if policy.hosts.any_host
            else [h if p is None else f"{h}:{p}" for h, p in policy.hosts.entries],
            "active_requests": stats.active,
            "websockets": stats.websockets,
            "max_concurrent_requests": policy.max_concurrent,
            "refused": dict(stats.refused),
        }

    daemon.status_sections["http"] = http_section

    async def serve(task_status: trio.TaskStatus[tuple[str, int]]) -> None:
        await serve_app(
            app,
            http.bind,
            shutdown=daemon.http_shutdown,
            read_timeout=float(http.read_timeout),
            keep_alive_timeout=float(http.keep_alive_timeout),
            max_header_bytes=http.max_header_bytes,
            backlog=http.backlog,
            task_status=task_status,
        )

    async with trio.open_nursery() as nursery:
        daemon.http_address = await nursery.start(serve)
        task_status.started(daemon.http_address)
