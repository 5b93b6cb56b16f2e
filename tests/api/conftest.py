"""A whole daemon on 127.0.0.1:0 for the HTTP edge tests, started from a config text."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import httpx
import pytest
import trio

from daemon.app import Daemon
from daemon.collector.queue import stream_name
from daemon.net import tls
from daemon.outbox import NewItem
from tests.conftest import NotifySocket, serve_daemon

KEY = "k-0123456789abcdef-first"
OLD_KEY = "k-0123456789abcdef-older"
KEY_ENV = "CRAWLD_TEST_API_KEY"

BASE = """
[daemon]
state_dir = "state"
[crawl.browser]
enabled = false
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
        daemon = await serve_daemon(nursery, path)
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
    return httpx.AsyncClient(
        base_url=base_url(daemon),
        headers=headers,
        trust_env=False,
        timeout=30,
        verify=tls.verifying(trust_env=False),
    )


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


@contextlib.contextmanager
def crawld_subprocess(
    tmp: Path,
    config_text: str,
    env: dict[str, str] | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """`crawld run` in a subprocess with `config_text` (bind 127.0.0.1:0): (process, port) once
    READY=1 came; killed on exit, and its log must hold no traceback."""
    path = tmp / "crawld.toml"
    path.write_text(config_text)
    notify = NotifySocket()
    full_env = {**os.environ, "NOTIFY_SOCKET": notify.address, **(env or {})}
    for name in ("WATCHDOG_USEC", "WATCHDOG_PID", "JOURNAL_STREAM"):
        full_env.pop(name, None)
    with open(tmp / "stderr.log", "wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "daemon", "run", "--config", str(path)],
            env=full_env,
            stderr=stderr,
            preexec_fn=preexec_fn,
        )
    try:
        while "READY" not in (message := notify.receive(timeout=60)):
            pass
        match = re.search(r"http on 127\.0\.0\.1:(\d+)", message["STATUS"])
        assert match, message
        yield proc, int(match.group(1))
    finally:
        proc.kill()
        proc.wait(timeout=30)
        notify.close()
    log = (tmp / "stderr.log").read_text(errors="replace")
    assert "Traceback" not in log, log[-5000:]
