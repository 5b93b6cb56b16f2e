"""A whole crawld (default installers, real HTTP) with loopback allowed for crawls, the generated
site on 127.0.0.1 answering for site.test names, and firecrawl-py clients pointed at crawld."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import trio
from firecrawl import Firecrawl

from daemon.app import Daemon
from daemon.crawl.runs.service import CrawlService
from daemon.fakes.openai_compat import OpenAICompatService, serve_openai_compat
from daemon.fakes.receiver import WebhookReceiver, open_receiver
from daemon.fakes.site import SiteSim, host_map_resolver, serve_site
from daemon.net import tls
from tests.conftest import serve_daemon

T = TypeVar("T")

NO_BROWSER = "[crawl.browser]\nenabled = false\n"
"""In CONFIG: no browser, though `enabled = "auto"` would start one wherever Chromium is
installed (the tests that render take it out and add their own)."""
CONFIG = """
[daemon]
state_dir = "state"
[http]
bind = "127.0.0.1:0"
[crawl.browser]
enabled = false
[collector]
enabled = false
[webhooks]
timeout = "10s"
retry_schedule = ["10ms", "20ms"]
allow_cidrs = ["127.0.0.0/8"]
[crawl]
allow_cidrs = ["127.0.0.0/8"]
page_timeout = "5s"
concurrency = 8
"""


@pytest.fixture
async def site(nursery: trio.Nursery) -> AsyncIterator[SiteSim]:
    sim = SiteSim(pages=150, slow_seconds=0.2, large_bytes=64 * 1024)
    stop = trio.Event()
    await nursery.start(functools.partial(serve_site, sim, shutdown=stop))
    yield sim
    stop.set()


@pytest.fixture
async def llm(nursery: trio.Nursery) -> AsyncIterator[tuple[OpenAICompatService, str]]:
    """The OpenAI-compatible model simulator: (the simulator, its base URL for `[llm]`)."""
    service = OpenAICompatService()
    shutdown = trio.Event()
    host, port = await nursery.start(
        functools.partial(serve_openai_compat, service, "127.0.0.1:0", shutdown=shutdown)
    )
    yield service, f"http://{host}:{port}/v1"
    shutdown.set()


@pytest.fixture
def crawl_config() -> str:
    return CONFIG


@pytest.fixture
async def daemon(tmp_path: Path, nursery: trio.Nursery, crawl_config: str) -> AsyncIterator[Daemon]:
    path = tmp_path / "crawld.toml"
    path.write_text(crawl_config)
    running = await serve_daemon(nursery, path)
    service: CrawlService = running.parts["crawl"]
    service.configure(service.config, resolver=host_map_resolver())
    yield running
    running.request_stop()


@pytest.fixture
def base_url(daemon: Daemon) -> str:
    assert daemon.http_address is not None
    host, port = daemon.http_address
    return f"http://{host}:{port}"


@pytest.fixture
async def client(base_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=base_url, trust_env=False, timeout=30, verify=tls.verifying(trust_env=False)
    ) as c:
        yield c


@pytest.fixture
def fc(base_url: str) -> Firecrawl:
    return Firecrawl(api_url=base_url)


@pytest.fixture
async def rx() -> AsyncIterator[WebhookReceiver]:
    async with open_receiver() as receiver:
        yield receiver


async def wait_finished(client: httpx.AsyncClient, job_id: str, kind: str = "crawl") -> str:
    """Poll the job's status until it is final; returns it."""
    path = f"/v2/crawl/{job_id}" if kind == "crawl" else f"/v2/batch/scrape/{job_id}"
    with trio.fail_after(30):
        while True:
            body = (await client.get(path, params={"limit": 1})).json()
            if body["status"] != "scraping":
                return str(body["status"])
            await trio.sleep(0.02)


@pytest.fixture
def sdk() -> Callable[..., Awaitable[Any]]:
    """`await sdk(fc.method, *args, **kw)`: a blocking SDK call in a worker thread."""

    async def call(fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        return await trio.to_thread.run_sync(functools.partial(fn, *args, **kw))

    return call
