"""Search targets of /v2/monitor through firecrawl-py against the SearXNG simulator: a result is
`new` (with `metadata.searchStatus` "alert") the first time a check of the target sees it, and
no page after that; a search target needs a `goal` unless judgeEnabled is false."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
import trio
from firecrawl import Firecrawl
from firecrawl.v2.types import MonitorCheckDetail

from daemon.fakes.searxng import SearxngSim, serve_searxng
from daemon.fakes.site import SiteSim
from tests.crawlapi.conftest import CONFIG

Sdk = Callable[..., Awaitable[Any]]


@pytest.fixture
async def searxng(nursery: trio.Nursery, site: SiteSim) -> SearxngSim:
    sim = SearxngSim(site_base=f"http://site.test:{site.port}", total=3)
    host, port = await nursery.start(functools.partial(serve_searxng, sim))
    sim.address = f"http://{host}:{port}"  # type: ignore[attr-defined]
    return sim


@pytest.fixture
def crawl_config(searxng: SearxngSim) -> str:
    address = searxng.address  # type: ignore[attr-defined]
    return CONFIG + f'[search]\nbase_url = "{address}"\nengines = ["fake"]\n'


async def run_check(sdk: Sdk, fc: Firecrawl, monitor_id: str) -> MonitorCheckDetail:
    check = await sdk(fc.run_monitor, monitor_id)
    with trio.fail_after(30):
        while True:
            detail: MonitorCheckDetail = await sdk(fc.get_monitor_check, monitor_id, check.id)
            if detail.status not in ("queued", "running"):
                return detail
            await trio.sleep(0.05)


async def test_search_results_are_new_once(
    fc: Firecrawl, sdk: Sdk, searxng: SearxngSim, client: httpx.AsyncClient
) -> None:
    target = {"type": "search", "queries": ["crawld release"], "maxResults": 5,
              "searchWindow": "24h"}  # fmt: skip
    body = {"name": "news", "schedule": {"text": "hourly"}, "targets": [target]}
    refused = await client.post("/v2/monitor", json=body)
    assert refused.status_code == 400
    assert [d["path"] for d in refused.json()["details"]] == ["$.goal"]

    monitor = await sdk(fc.create_monitor, name="news", schedule={"text": "hourly"},
                        targets=[target], goal="a new crawld release")  # fmt: skip
    assert monitor.judge_enabled is True
    first = await run_check(sdk, fc, monitor.id)
    assert first.status == "completed" and first.summary.new == 3
    assert sorted(p.url for p in first.pages) == sorted(searxng.result_url(i) for i in range(3))
    assert all(p.metadata["searchStatus"] == "alert" for p in first.pages)
    assert first.pages[0].metadata["query"] == "crawld release"
    assert searxng.requests[-1]["time_range"] == "day"

    searxng.total = 5  # two more results appear
    second = await run_check(sdk, fc, monitor.id)
    assert sorted(p.url for p in second.pages) == [searxng.result_url(3), searxng.result_url(4)]
    assert second.summary.total_pages == 2 and second.summary.new == 2
    third = await run_check(sdk, fc, monitor.id)
    assert third.pages == [] and third.status == "completed"
