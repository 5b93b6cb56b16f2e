# Integration tests talk to a real RabbitMQ. Locally a missing broker skips them; under CI=true it
# fails them, so a pipeline can never go green without having exercised the broker.
from __future__ import annotations

import os
import socket
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest
import trio

from daemon.broker import BrokerUnavailable, delete_queue, probe, redact_url

DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"


def _unreachable(url: str) -> str | None:
    """Why the broker at `url` cannot be used, or None when it answers an AMQP login."""
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (5671 if parts.scheme == "amqps" else 5672)
    try:
        with socket.create_connection((host, port), timeout=1.0):
            pass
    except OSError as exc:
        return f"no TCP listener at {host}:{port} ({exc})"
    try:
        trio.run(lambda: probe(url, timeout=3.0))
    except BrokerUnavailable as exc:
        return f"AMQP connect failed: {exc}"
    return None


@pytest.fixture(scope="session")
def amqp_url() -> str:
    url = os.environ.get("CRAWLD_TEST_AMQP_URL") or DEFAULT_AMQP_URL
    problem = _unreachable(url)
    if problem is not None:
        message = f"RabbitMQ at {redact_url(url)} is not usable: {problem}"
        if os.environ.get("CI") == "true":
            pytest.fail(
                f"RabbitMQ is required under CI=true ({message}); start a broker or set "
                "CRAWLD_TEST_AMQP_URL",
                pytrace=False,
            )
        pytest.skip(message)
    return url


@pytest.fixture
async def queue_name(amqp_url: str) -> AsyncIterator[str]:
    """A queue name unique to this test; the queue is deleted afterwards."""
    name = f"crawld-test-{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        with trio.CancelScope(shield=True):
            await delete_queue(amqp_url, name)
