# The HTTP area: one hypercorn server for every route the other areas registered. It is
# installed last, and builds the ASGI app when it starts, so the route list is complete.
from __future__ import annotations

from typing import Any

import trio

from daemon.api.app import build_app
from daemon.api.server import serve_app
from daemon.runtime import Daemon


def install(daemon: Daemon) -> None:
    if daemon.config.http.enabled:
        daemon.add_component("http", serve_http)


async def serve_http(daemon: Daemon, *, task_status: trio.TaskStatus[Any]) -> None:
    app = build_app(daemon, daemon.routes)

    async def serve(task_status: trio.TaskStatus[tuple[str, int]]) -> None:
        await serve_app(
            app, daemon.config.http.bind, shutdown=daemon.http_shutdown, task_status=task_status
        )

    async with trio.open_nursery() as nursery:
        daemon.http_address = await nursery.start(serve)
        task_status.started(daemon.http_address)
