from __future__ import annotations

import functools
from collections.abc import AsyncIterator

import pytest
import trio

from daemon.crawl.fetch import Fetcher, FetchPolicy
from daemon.fakes.site import SiteSim, host_map_resolver, serve_site


@pytest.fixture
async def site(nursery: trio.Nursery) -> AsyncIterator[SiteSim]:
    sim = SiteSim(pages=150, slow_seconds=30.0, large_bytes=64 * 1024)
    stop = trio.Event()
    await nursery.start(functools.partial(serve_site, sim, shutdown=stop))
    yield sim
    stop.set()


def policy(**overrides: object) -> FetchPolicy:
    fields: dict[str, object] = {
        "user_agent": "crawld-test FirecrawlAgent",
        "connect_timeout": 5.0,
        "timeout": 10.0,
        "max_bytes": 32 * 1024,
        "allow_cidrs": ("127.0.0.0/8",),
    }
    fields.update(overrides)
    return FetchPolicy(**fields)  # type: ignore[arg-type]


@pytest.fixture
async def fetcher() -> AsyncIterator[Fetcher]:
    async with Fetcher(policy(), resolver=host_map_resolver()) as opened:
        yield opened
