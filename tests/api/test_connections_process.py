"""Many slow uploads against a crawld subprocess limited to 1024 descriptors (issue 7, finding 4):
the uploads beyond max_concurrent_requests are answered 503 and closed, so descriptors do not run
out and /healthz keeps answering."""

from __future__ import annotations

import os
import resource
import selectors
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.api.conftest import crawld_subprocess

pytestmark = pytest.mark.process

CONFIG = """
[daemon]
state_dir = "state"
[crawl.browser]
enabled = false
[http]
bind = "127.0.0.1:0"
body_timeout = "60s"
read_timeout = "60s"
"""
UPLOADS = 1100


def limit_descriptors() -> None:
    resource.setrlimit(
        resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    )


@pytest.fixture
def crawld(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """(pid, port) of a crawld with a soft limit of 1024 open files."""
    with crawld_subprocess(tmp_path, CONFIG, preexec_fn=limit_descriptors) as (proc, port):
        yield proc.pid, port


def test_slow_uploads_do_not_exhaust_descriptors(crawld: tuple[int, int]) -> None:
    pid, port = crawld
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < UPLOADS + 200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, UPLOADS + 500), hard))
    head = (
        f"POST /crawl/stop HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
    )
    uploads: list[socket.socket] = []
    try:
        for _ in range(UPLOADS):
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            sock.sendall(head.encode())
            uploads.append(sock)
        refused = 0
        with selectors.DefaultSelector() as selector:
            for sock in uploads:
                selector.register(sock, selectors.EVENT_READ)
            deadline = time.monotonic() + 60
            while refused < UPLOADS - 256 and time.monotonic() < deadline:
                for key, _ in selector.select(timeout=1):
                    selector.unregister(key.fileobj)
                    if key.fileobj.recv(4096).startswith(b"HTTP/1.1 503"):  # type: ignore[union-attr]
                        refused += 1
        health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=30, trust_env=False)
        assert health.status_code == 200 and health.json() == {"status": "ok"}
        assert refused >= UPLOADS - 256
        assert len(os.listdir(f"/proc/{pid}/fd")) < 1024
    finally:
        for sock in uploads:
            sock.close()
