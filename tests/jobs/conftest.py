from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import trio

from daemon.config import Duration, JobsConfig, WebhooksConfig
from daemon.fakes.receiver import WebhookReceiver, open_receiver
from daemon.jobs.manager import JobManager
from daemon.outbox import Outbox
from daemon.store import Store

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SECRET_ENV = "CRAWLD_TEST_WEBHOOK_SECRET"


def fast_webhooks(**changes: Any) -> WebhooksConfig:
    """Quick retries for real-socket tests (after 10 ms and 20 ms) and a 10 s timeout.

    The receiver answers from this process: on a loaded host an answer it already counted as
    delivered can reach the drainer late, and a short timeout would then (rightly) send the event
    again, which a test counting requests would read as a duplicate. Tests of the timeout set
    their own.
    """
    options: dict[str, Any] = {
        "secret_env": SECRET_ENV,
        "timeout": Duration(10),
        "retry_schedule": [Duration(0.01), Duration(0.02)],
        "allow_cidrs": ["127.0.0.0/8"],
    }
    options.update(changes)
    return WebhooksConfig(**options)


@pytest.fixture(autouse=True)
def webhook_secret(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(SECRET_ENV, SECRET)
    return SECRET


@pytest.fixture
async def rx() -> AsyncIterator[WebhookReceiver]:
    async with open_receiver(secret=SECRET) as receiver:
        yield receiver


@pytest.fixture
async def start_manager(store: Store, outbox: Outbox, nursery: trio.Nursery) -> Callable[..., Any]:
    """`await start_manager(jobs=…, webhooks=…)`: a JobManager with its drainers and cleanup
    running in the test's nursery."""

    async def start(
        jobs: JobsConfig | None = None, webhooks: WebhooksConfig | None = None, **kw: Any
    ) -> JobManager:
        manager = JobManager(store, outbox, jobs or JobsConfig(), webhooks or fast_webhooks(), **kw)
        await nursery.start(manager.run)
        return manager

    return start


class FakeResolver(trio.abc.HostnameResolver):
    """Answers from a table; a name outside it fails like NXDOMAIN."""

    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table
        self.asked: list[str] = []

    async def getaddrinfo(self, host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else host
        self.asked.append(name)
        if name not in self.table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [
            (
                socket.AF_INET6 if ":" in ip else socket.AF_INET,
                socket.SOCK_STREAM,
                socket.IPPROTO_TCP,
                "",
                (ip, port, 0, 0) if ":" in ip else (ip, port),
            )
            for ip in self.table[name]
        ]

    async def getnameinfo(self, sockaddr: Any, flags: int) -> Any:
        raise NotImplementedError


@pytest.fixture
async def resolver() -> AsyncIterator[FakeResolver]:
    fake = FakeResolver(
        {
            "hooks.test": ["127.0.0.1"],
            "public.test": ["93.184.216.34"],
            "mixed.test": ["10.0.0.7", "93.184.216.34"],
            "rebind.test": ["127.0.0.1", "::1"],
            "metadata.test": ["169.254.169.254"],
        }
    )
    previous = trio.socket.set_custom_hostname_resolver(fake)
    yield fake
    trio.socket.set_custom_hostname_resolver(previous)
