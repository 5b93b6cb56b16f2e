"""A real crawld process for the kill -9 tests (test_crash.py, test_extract_crash.py,
test_agent_crash.py, tests/llm/test_crash.py): a free port, its config's common head, its
environment and command, starting it and waiting for it to answer, and polling for what it
did."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import trio

from tests.conftest import Deployment

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def poll(predicate: Any, timeout: float) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.01)


def config_head(port: int) -> str:
    """The config every crash test starts from: no browser, no collector, webhooks retried at
    once, the local simulators reachable; it ends in `[crawl]` for the test's own crawl keys."""
    return f"""
[daemon]
state_dir = "state"
[crawl.browser]
enabled = false
[http]
bind = "127.0.0.1:{port}"
[collector]
enabled = false
[webhooks]
timeout = "2s"
retry_schedule = ["10ms", "20ms"]
allow_cidrs = ["127.0.0.0/8"]
[crawl]
allow_cidrs = ["127.0.0.0/8"]
"""


def crawld(config_file: Path, deployment: Deployment) -> tuple[list[str], dict[str, str]]:
    """(command, environment) of a crawld process with `config_file` on the test's deployment,
    out of reach of a systemd the tests may run under."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "STATE_DIRECTORY")}  # fmt: skip
    env.update(deployment.env)
    return [sys.executable, "-m", "daemon", "run", "--config", str(config_file)], env


async def wait_up(client: httpx.AsyncClient) -> None:
    """Until the process at `client`'s base URL answers (90 s at most: a start on a loaded
    machine, its store's migrations included)."""
    with trio.fail_after(90):
        while True:
            try:
                await client.get("/healthz")
                return
            except httpx.TransportError:
                await trio.sleep(0.05)


@contextlib.asynccontextmanager
async def running(
    command: list[str], env: dict[str, str], client: httpx.AsyncClient
) -> AsyncIterator[trio.Process]:
    """The crawld process of `command`, once it answers at `client`'s base URL; killed on the
    way out unless the test ended it."""
    process = await trio.lowlevel.open_process(command, env=env, cwd=ROOT)
    try:
        await wait_up(client)
        yield process
    finally:
        if process.returncode is None:
            process.kill()
