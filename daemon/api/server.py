# Every HTTP server in the project (the daemon's API and the bundled simulators) is an ASGI app
# served by hypercorn inside a trio nursery. One helper binds it, reports the bound address through
# task_status (port 0 in tests) and stops it gracefully when its shutdown event is set.
from __future__ import annotations

import functools
from typing import Any
from urllib.parse import urlsplit

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from daemon.logs import get_logger


async def serve_app(
    app: Any,
    bind: str,
    *,
    shutdown: trio.Event | None = None,
    graceful_timeout: float = 3.0,
    name: str = "http",
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `app` on `bind` ("host:port") until `shutdown` is set; started() gets (host, port)."""
    config = Config()
    config.bind = [bind]
    config.graceful_timeout = graceful_timeout
    config.accesslog = None
    config.errorlog = get_logger(f"{name}.server").logger
    stop = shutdown if shutdown is not None else trio.Event()
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(
            functools.partial(serve, app, config, shutdown_trigger=stop.wait)
        )
        parts = urlsplit(urls[0])
        task_status.started((parts.hostname or "127.0.0.1", parts.port or 0))
