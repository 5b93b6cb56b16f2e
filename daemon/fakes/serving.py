# How the bundled fakes run: inside a test's or the demo's nursery (`serve_fake`, reporting the
# bound address), or alone from the command line (`run_standalone`, printing where it listens).
from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import trio

from daemon.api.server import serve_app


async def serve_fake(
    app: Any,
    bind: str,
    name: str,
    *,
    shutdown: trio.Event | None = None,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve a fake's app on `bind` until `shutdown` is set; started() gets (host, port)."""
    await serve_app(
        app, bind, shutdown=shutdown, graceful_timeout=1.0, name=name, task_status=task_status
    )


def run_standalone(app: Any, bind: str, name: str, banner: Callable[[str, int], str]) -> None:
    """Serve until Ctrl-C, printing `banner(host, port)` once listening."""

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            host, port = await nursery.start(functools.partial(serve_fake, app, bind, name))
            print(banner(host, port), flush=True)

    try:
        trio.run(run)
    except KeyboardInterrupt:
        sys.exit(0)
