"""A whole daemon on 127.0.0.1:0 for the HTTP edge tests, started from a config text."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import pytest
import trio

from daemon import config
from daemon.app import Daemon, run_daemon
from daemon.collector.queue import stream_name
from daemon.outbox import NewItem
from daemon.systemd import Notifier

KEY = "k-0123456789abcdef-first"
OLD_KEY = "k-0123456789abcdef-older"
KEY_ENV = "CRAWLD_TEST_API_KEY"

BASE = """
[daemon]
state_dir = "state"
[http]
bind = "127.0.0.1:0"
{http}
{extra}
"""

StartDaemon = Callable[..., Awaitable[Daemon]]


@pytest.fixture
async def start_daemon(tmp_path: Path, nursery: trio.Nursery) -> AsyncIterator[StartDaemon]:
    started: list[Daemon] = []

    async def start(http: str = "", extra: str = "") -> Daemon:
        path = tmp_path / "crawld.toml"
        path.write_text(BASE.format(http=http, extra=extra))
        cfg = config.load(path)

        async def runner(task_status: trio.TaskStatus[Daemon]) -> None:
            await run_daemon(cfg, notifier=Notifier(None), task_status=task_status)

        daemon: Daemon = await nursery.start(runner)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.request_stop()


def base_url(daemon: Daemon) -> str:
    assert daemon.http_address is not None
    host, port = daemon.http_address
    return f"http://{host}:{port}"


def client(daemon: Daemon, key: str | None = None) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.AsyncClient(base_url=base_url(daemon), headers=headers, trust_env=False)


async def queue_rows(daemon: Daemon, count: int, queue: str = "job_data") -> None:
    """Put `count` rows in the embedded queue, as the collector would."""
    assert daemon.outbox is not None
    items = [
        NewItem(key=f"m{i}", body=b'{"n": %d}' % i, meta={"task_id": "t"}) for i in range(count)
    ]
    await daemon.outbox.append(stream_name(queue), items)


async def queue_size(daemon: Daemon, queue: str = "job_data") -> int:
    assert daemon.outbox is not None
    return (await daemon.outbox.state(stream_name(queue))).pending
