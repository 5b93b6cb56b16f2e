# Every HTTP server in the project (the daemon's API and the bundled simulators) is an ASGI app
# served by hypercorn inside a trio nursery. One helper binds it, reports the bound address through
# task_status (port 0 in tests) and stops it gracefully when its shutdown event is set.
#
# hypercorn's own limits bound what reaches the app: the size of the request head, how long a
# connection may stay silent (read) or idle between requests (keep-alive), and the listen backlog.
# A client that goes away is normal traffic: hypercorn's error lines about it are kept at debug.
from __future__ import annotations

import functools
import logging
from typing import Any
from urllib.parse import urlsplit

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from starlette.requests import ClientDisconnect

from daemon.logs import get_logger

DISCONNECTS = (
    ClientDisconnect,
    ConnectionError,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
)


def is_disconnect(exc: BaseException | None) -> bool:
    """Whether `exc` (or every exception of a group) only says the client went away."""
    if isinstance(exc, BaseExceptionGroup):
        return all(is_disconnect(e) for e in exc.exceptions)
    return isinstance(exc, DISCONNECTS)


class DisconnectsAtDebug(logging.Filter):
    """Lowers a record about a client disconnect to debug (dropped unless debug is on)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not is_disconnect(exc):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        record.exc_info = None
        record.exc_text = None
        record.msg = f"{record.msg} (client disconnected: {type(exc).__name__})"
        return logging.getLogger().isEnabledFor(logging.DEBUG)


async def serve_app(
    app: Any,
    bind: str,
    *,
    shutdown: trio.Event | None = None,
    graceful_timeout: float = 3.0,
    name: str = "http",
    read_timeout: float | None = None,
    keep_alive_timeout: float = 5.0,
    max_header_bytes: int = 16 * 1024,
    backlog: int = 100,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `app` on `bind` ("host:port") until `shutdown` is set; started() gets (host, port)."""
    config = Config()
    config.bind = [bind]
    config.graceful_timeout = graceful_timeout
    config.accesslog = None
    config.read_timeout = read_timeout  # type: ignore[assignment]  # hypercorn says int, takes float
    config.keep_alive_timeout = keep_alive_timeout
    # A WebSocket client (the crawl watcher) sends nothing; hypercorn's pings make it answer, so
    # `read_timeout` closes only sockets whose client stopped reading. Clients send no messages
    # of their own worth more than a few bytes.
    config.websocket_ping_interval = read_timeout / 3 if read_timeout else None
    config.websocket_max_message_size = 64 * 1024
    config.h11_max_incomplete_size = max_header_bytes
    config.h2_max_header_list_size = max_header_bytes
    config.backlog = backlog
    errorlog = get_logger(f"{name}.server").logger
    if not any(isinstance(f, DisconnectsAtDebug) for f in errorlog.filters):
        errorlog.addFilter(DisconnectsAtDebug())
    config.errorlog = errorlog
    stop = shutdown if shutdown is not None else trio.Event()
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(
            functools.partial(serve, app, config, shutdown_trigger=stop.wait)
        )
        parts = urlsplit(urls[0])
        task_status.started((parts.hostname or "127.0.0.1", parts.port or 0))
