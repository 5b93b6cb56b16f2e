"""A daemon on 127.0.0.1:0 for the console tests (optionally with an API key and a collector on
the Octoparse simulator), tracker rows written straight into its store, and a headless Chromium
(fails under CI=true when absent, else skips)."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from daemon import outbox
from daemon.app import Daemon
from daemon.config import WebhookSpec
from daemon.jobs import store as js
from daemon.jobs.events import WEBHOOK_FAILED
from daemon.net import tls
from daemon.outbox import NewItem
from tests.conftest import serve_daemon
from tests.ui import cdp

KEY = "k-console-0123456789abcdef"
KEY_ENV = "CRAWLD_TEST_UI_KEY"
ARTIFACTS = Path(os.environ.get("CRAWLD_TEST_ARTIFACTS", "test-artifacts")) / "ui"
DAY_MS = 86_400_000

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
async def start_daemon(
    tmp_path: Path, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[StartDaemon]:
    started: list[Daemon] = []
    monkeypatch.setenv(KEY_ENV, KEY)

    async def start(http: str = "", extra: str = "") -> Daemon:
        path = tmp_path / "crawld.toml"
        path.write_text(BASE.format(http=http, extra=extra))
        daemon = await serve_daemon(nursery, path)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.request_stop()


def keyed() -> str:
    return f'api_key_env = "{KEY_ENV}"'


def base_url(daemon: Daemon) -> str:
    assert daemon.http_address is not None
    host, port = daemon.http_address
    return f"http://{host}:{port}"


def client(daemon: Daemon, **kwargs: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=base_url(daemon), trust_env=False, verify=tls.verifying(trust_env=False), **kwargs
    )


async def add_video(
    daemon: Daemon,
    aid: int,
    *,
    title: str = "a song",
    snapshots: int = 0,
    span_ms: int = 10 * DAY_MS,
    song: bool = True,
    uploader: str = "uploader",
    now_ms: int | None = None,
) -> int:
    """A tracked video with `snapshots` evenly spread over the `span_ms` before now (views rising
    by 100 a step, likes and coins with them); returns the time of the last one."""
    assert daemon.store is not None
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    step = span_ms // max(1, snapshots)
    rows = [(aid, now - span_ms + (i + 1) * step, 90_000 + 100 * i, i, i, 3 * i, 2 * i, i, i)
            for i in range(snapshots)]  # fmt: skip

    def write(conn: Any) -> None:
        conn.execute(
            "INSERT INTO tracker_users(uid, name, sign, fans, face, updated_ms) VALUES (?, ?, '', 0, '', ?)"
            " ON CONFLICT DO NOTHING",
            (aid, uploader, now),
        )
        conn.execute(
            "INSERT INTO tracker_videos(aid, bvid, title, description, tags, uid, status, added_ms)"
            " VALUES (?, ?, ?, '', '[]', ?, 0, ?)",
            (aid, f"BV{aid}", title, aid, now),
        )
        if song:
            conn.execute(
                "INSERT INTO tracker_songs(aid, label, added_ms) VALUES (?, 1, ?)", (aid, now)
            )
        for start in range(0, len(rows), 10_000):
            conn.executemany(
                "INSERT INTO tracker_snapshots(aid, at_ms, views, danmakus, replies, likes, coins,"
                " shares, favorites) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows[start : start + 10_000],
            )

    await daemon.store.write(write)
    return now


STUCK_JOB = "00000000-0000-4000-8000-00000000a001"
GONE_JOB = "00000000-0000-4000-8000-00000000a002"
PLAIN_JOB = "00000000-0000-4000-8000-00000000a003"


SILENT_HOOK = """
[webhooks]
allow_cidrs = ["127.0.0.0/8"]
timeout = "5m"
"""
"""The `extra` config of a daemon given `silent_hook`'s jobs: its drainers may reach the hook,
and wait on it for longer than any test."""


@pytest.fixture
def silent_hook() -> Iterator[str]:
    """The URL of a webhook endpoint that takes connections and never answers: a job's drainer
    (the daemon's scan starts one for any job with events left, whoever stored them) stays on
    its first event, so what the test stored is what the console shows."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        host, port = listener.getsockname()
        yield f"http://{host}:{port}/hook"


async def add_webhook_jobs(daemon: Daemon, hook_url: str) -> None:
    """Three crawl jobs: STUCK_JOB with 3 webhook events queued, none sent and one given up;
    GONE_JOB whose endpoint answered 410 at its first event (the other 2 skipped); PLAIN_JOB
    without a webhook. `hook_url`: `silent_hook` (in a daemon started with SILENT_HOOK)."""
    assert daemon.store is not None
    hook = WebhookSpec(url=hook_url)
    now = int(time.time() * 1000)

    def write(conn: Any) -> None:
        for job_id in (STUCK_JOB, GONE_JOB, PLAIN_JOB):
            js.insert_job(conn, job_id=job_id, kind="crawl",
                          webhook=None if job_id == PLAIN_JOB else hook,
                          source={"url": "http://127.0.0.1:9/"}, at_ms=now,
                          expires_ms=now + DAY_MS)  # fmt: skip
        for job_id in (STUCK_JOB, GONE_JOB):
            items = [NewItem(f"k{i}", b"{}") for i in range(3)]
            outbox.append(conn, js.stream_name(job_id), items, 0)
        js.add_error(conn, STUCK_JOB, code=WEBHOOK_FAILED, error="gave up", url=None, at_ms=1)
        js.mark_gone(conn, GONE_JOB, event_id=f"{GONE_JOB}:1", type_="crawl.page", url="u",
                     at_ms=1, stream=js.stream_name(GONE_JOB), seq=1)  # fmt: skip

    await daemon.store.write(write)


@pytest.fixture(scope="session")
def chromium() -> Iterator[cdp.Browser]:
    if cdp.chromium_path() is None:
        message = "chromium is not installed (apt-get install chromium)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    with cdp.browser() as opened:
        yield opened
