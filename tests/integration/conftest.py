# Integration tests talk to a real RabbitMQ. Locally a missing broker skips them; under CI=true it
# fails them, so a pipeline can never go green without having exercised the broker. The same holds
# for tests that drive the broker with `rabbitmqctl` (policies, forced closes): they use the node of
# the broker they were given, never some other local node.
from __future__ import annotations

import ipaddress
import os
import shlex
import shutil
import socket
import uuid
from collections.abc import AsyncIterator
from urllib.parse import unquote, urlsplit

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
        _skip_or_fail(
            f"RabbitMQ at {redact_url(url)} is not usable: {problem}; start a broker or set "
            "CRAWLD_TEST_AMQP_URL"
        )
    return url


def _skip_or_fail(message: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"required under CI=true: {message}", pytrace=False)
    pytest.skip(message)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class RabbitCtl:
    """`rabbitmqctl` aimed at the test broker's node and virtual host."""

    def __init__(self, command: list[str], vhost: str) -> None:
        self.command = command
        self.vhost = vhost

    async def __call__(self, *args: str, vhost: bool = False) -> str:
        argv = [*self.command, "-q", *args]
        if vhost:
            argv += ["-p", self.vhost]
        done = await trio.run_process(argv, capture_stdout=True)
        return done.stdout.decode()


def rabbitmqctl_for(url: str, environ: dict[str, str]) -> tuple[list[str] | None, str]:
    """The rabbitmqctl command for the broker at `url` (None: none can reach it) and why.

    $CRAWLD_TEST_RABBITMQCTL gives it explicitly (e.g. `rabbitmqctl -n rabbit@mq` or a
    `docker exec` line); otherwise the local `rabbitmqctl`, only when the broker is local."""
    explicit = environ.get("CRAWLD_TEST_RABBITMQCTL")
    if explicit:
        return shlex.split(explicit), "from CRAWLD_TEST_RABBITMQCTL"
    host = urlsplit(url).hostname or "127.0.0.1"
    if not _is_loopback(host):
        return None, (
            f"the test broker is on {host}; the local rabbitmqctl would change another node "
            "(set CRAWLD_TEST_RABBITMQCTL to a command that reaches it)"
        )
    if shutil.which("rabbitmqctl") is None:
        return None, "rabbitmqctl is not installed"
    return ["rabbitmqctl"], "local node"


@pytest.fixture(scope="session")
def rabbitmqctl(amqp_url: str) -> RabbitCtl:
    """rabbitmqctl for the test broker; skips without one (fails under CI=true)."""
    command, why = rabbitmqctl_for(amqp_url, dict(os.environ))
    if command is None:
        _skip_or_fail(f"needs rabbitmqctl for the test broker: {why}")
        raise AssertionError("unreachable")
    path = urlsplit(amqp_url).path
    return RabbitCtl(command, unquote(path[1:]) if len(path) > 1 else "/")


@pytest.fixture
async def queue_name(amqp_url: str) -> AsyncIterator[str]:
    """A queue name unique to this test; the queue is deleted afterwards."""
    name = f"crawld-test-{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        with trio.CancelScope(shield=True):
            await delete_queue(amqp_url, name)
