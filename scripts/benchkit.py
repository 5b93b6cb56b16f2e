"""What the benchmark scripts share to drive crawld and the simulators as processes: a free
loopback port, and a wait until a URL answers. The standard library and httpx only, never
`daemon`, so a baseline's process may import it too."""

from __future__ import annotations

import socket
import time

import httpx


def free_port() -> int:
    """A loopback TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_up(url: str, timeout: float = 60) -> None:
    """Until `url` answers below 500 (a crawld that is starting answers /healthz 503);
    TimeoutError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url, timeout=2, trust_env=False).status_code < 500:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not answer within {timeout:g} s")
        time.sleep(0.05)
