"""A search target's new results are judged against the monitor's `goal` (Firecrawl judges new
search results as it judges changed pages): one model call per result seen for the first time,
none for results seen before; a result judged meaningful is `searchStatus` "alert", one judged
not meaningful "watching", and the page carries the judgment."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from firecrawl import Firecrawl

from daemon.fakes.openai_compat import OpenAICompatService
from daemon.fakes.searxng import SearxngSim
from tests.crawlapi.conftest import CONFIG
from tests.crawlapi.test_monitor_search import run_check, searxng  # noqa: F401 (fixture)
from tests.crawlapi.test_sdk_llm import llm_sim, sim  # noqa: F401 (fixtures)

Sdk = Callable[..., Awaitable[Any]]


@pytest.fixture
def crawl_config(searxng: SearxngSim, llm_sim: tuple[OpenAICompatService, str]) -> str:  # noqa: F811
    address = searxng.address  # type: ignore[attr-defined]
    return CONFIG + (
        f'[search]\nbase_url = "{address}"\nengines = ["fake"]\n'
        f'[llm]\nbase_url = "{llm_sim[1]}"\nmodel = "sim-model"\ntimeout = "2s"\nretries = 0\n'
    )


def verdict(meaningful: bool) -> str:
    return json.dumps({"meaningful": meaningful, "confidence": "medium", "reason": "because",
                       "meaningfulChanges": []})  # fmt: skip


async def test_new_results_are_judged_once(
    fc: Firecrawl,
    sdk: Sdk,
    searxng: SearxngSim,  # noqa: F811
    sim: OpenAICompatService,  # noqa: F811
) -> None:
    searxng.total = 2  # the shared simulator's index holds 3 results; two to begin with here
    target = {"type": "search", "queries": ["crawld release"], "maxResults": 5}
    monitor = await sdk(fc.create_monitor, name="news", schedule={"text": "hourly"},
                        targets=[target], goal="a new crawld release")  # fmt: skip
    sim.reply(verdict(True))
    sim.reply(verdict(False))
    first = await run_check(sdk, fc, monitor.id)
    assert first.status == "completed" and first.summary.new == 2
    assert len(sim.requests) == 2
    assert "a new crawld release" in str(sim.requests[0]["messages"])
    by_status = sorted((p.metadata["searchStatus"], p.judgment.meaningful) for p in first.pages)
    assert by_status == [("alert", True), ("watching", False)]

    searxng.total = 3  # one more result; the two seen are not asked about again
    sim.reply(verdict(True))
    second = await run_check(sdk, fc, monitor.id)
    assert [p.url for p in second.pages] == [searxng.result_url(2)]
    assert second.pages[0].metadata["searchStatus"] == "alert"
    assert len(sim.requests) == 3
