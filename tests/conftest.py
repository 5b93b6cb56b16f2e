from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import trio

from daemon import config
from daemon.app import Daemon, run_daemon
from daemon.outbox import Outbox
from daemon.store import Store, open_store
from daemon.systemd import Notifier


async def serve_daemon(nursery: trio.Nursery, path: Path) -> Daemon:
    """Load `path` and run the daemon in `nursery` (no systemd notifications); returns it once
    it serves."""
    cfg = config.load(path)
    daemon: Daemon = await nursery.start(
        functools.partial(run_daemon, cfg, notifier=Notifier(None))
    )
    return daemon


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with open_store(tmp_path / "crawld.db") as opened:
        yield opened


@pytest.fixture
async def outbox(store: Store) -> Outbox:
    return Outbox(store)


class NotifySocket:
    """An abstract AF_UNIX datagram socket standing in for systemd's NOTIFY_SOCKET."""

    def __init__(self) -> None:
        import os
        import socket

        self.address = f"@crawld-test-{os.getpid()}-{id(self)}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(b"\0" + self.address[1:].encode())

    def receive(self, timeout: float = 30.0) -> dict[str, str]:
        """The next datagram as a dict of fields (blocking, with a real-time timeout)."""
        self.sock.settimeout(timeout)
        data = self.sock.recv(4096).decode()
        return dict(line.split("=", 1) for line in data.split("\n") if line)

    async def areceive(self, timeout: float = 30.0) -> dict[str, str]:
        import trio

        return await trio.to_thread.run_sync(self.receive, timeout)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def notify_socket() -> Iterator[NotifySocket]:
    sock = NotifySocket()
    try:
        yield sock
    finally:
        sock.close()
