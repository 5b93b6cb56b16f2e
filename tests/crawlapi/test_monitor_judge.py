"""A monitor with a `goal` has its changed pages judged by the [llm] model (the
OpenAI-compatible simulator): one model call per `changed` page and none for `new` or `same`
ones; the judgment is on the page and in its `monitor.page` webhook; the same diff under the same
goal is answered from the LLM cache."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import trio
from firecrawl import Firecrawl
from firecrawl.v2.types import MonitorCheckDetail

from daemon.fakes.openai_compat import OpenAICompatService
from daemon.fakes.receiver import WebhookReceiver
from daemon.fakes.site import SiteSim
from tests.crawlapi.test_monitors import page
from tests.crawlapi.test_sdk_llm import crawl_config, llm_sim, sim  # noqa: F401 (fixtures)

Sdk = Callable[..., Awaitable[Any]]


async def run_check(sdk: Sdk, fc: Firecrawl, monitor_id: str) -> MonitorCheckDetail:
    check = await sdk(fc.run_monitor, monitor_id)
    with trio.fail_after(30):
        while True:
            detail: MonitorCheckDetail = await sdk(fc.get_monitor_check, monitor_id, check.id)
            if detail.status not in ("queued", "running"):
                return detail
            await trio.sleep(0.05)


async def test_changed_pages_are_judged_once_per_diff(
    fc: Firecrawl, sdk: Sdk, site: SiteSim, sim: OpenAICompatService,  # noqa: F811
    rx: WebhookReceiver,
) -> None:  # fmt: skip
    site.files["/price"] = page("Price", "Price: 10 EUR")
    site.files["/stable"] = page("Stable", "Nothing moves")
    monitor = await sdk(fc.create_monitor, name="judged", schedule={"text": "hourly"},
                        targets=[{"type": "scrape", "urls": [site.url("/price"),
                                                             site.url("/stable")]}],
                        goal="tell me when the price drops", webhook={"url": rx.url()})  # fmt: skip
    assert monitor.judge_enabled is True
    first = await run_check(sdk, fc, monitor.id)
    assert first.summary.new == 2 and sim.requests == []  # new pages never reach the model

    site.files["/price"] = page("Price", "Price: 8 EUR, a meaningful drop")
    second = await run_check(sdk, fc, monitor.id)
    changed = next(p for p in second.pages if p.status == "changed")
    assert changed.judgment is not None and changed.judgment.meaningful is True
    assert changed.judgment.confidence == "high"
    assert all(p.judgment is None for p in second.pages if p.status == "same")
    assert len(sim.requests) == 1
    sent = sim.requests[0]["messages"][-1]["content"]
    assert "+Price: 8 EUR, a meaningful drop" in sent and "-Price: 10 EUR" in sent
    assert "tell me when the price drops" in str(sim.requests[0]["messages"])

    await rx.wait_until(lambda: len(rx.events(second.id)) == 3)
    [event] = [e for e in rx.events(second.id) if e.event["data"][0]["status"] == "changed"]
    assert event.event["data"][0]["isMeaningful"] is True
    assert event.event["data"][0]["judgment"]["confidence"] == "high"

    site.files["/price"] = page("Price", "Price: 10 EUR")
    await run_check(sdk, fc, monitor.id)  # a different diff: asked
    site.files["/price"] = page("Price", "Price: 8 EUR, a meaningful drop")
    fourth = await run_check(sdk, fc, monitor.id)  # the diff of the second check: cached
    again = next(p for p in fourth.pages if p.status == "changed")
    assert again.judgment == changed.judgment
    assert len(sim.requests) == 2


async def test_json_mode_gives_a_field_diff_and_the_snapshot(
    fc: Firecrawl, sdk: Sdk, site: SiteSim, sim: OpenAICompatService,  # noqa: F811
    client: httpx.AsyncClient,
) -> None:  # fmt: skip
    schema = {"type": "object", "properties": {"price": {"type": "number"},
                                               "title": {"type": "string"}}}  # fmt: skip
    site.files["/offer"] = page("Offer", "price: 10")
    formats = [{"type": "json", "schema": schema},
               {"type": "changeTracking", "modes": ["json"], "schema": schema}]  # fmt: skip
    body = {"name": "offer", "schedule": {"text": "hourly"},
            "targets": [{"type": "scrape", "urls": [site.url("/offer")],
                         "scrapeOptions": {"formats": formats}}]}  # fmt: skip
    monitor_id = (await client.post("/v2/monitor", json=body)).json()["data"]["id"]
    first = await run_check(sdk, fc, monitor_id)
    assert [p.status for p in first.pages] == ["new"]
    assert first.pages[0].snapshot is not None
    assert first.pages[0].snapshot.model_dump()["json"] == {"price": 10, "title": "Offer"}

    site.files["/offer"] = page("Offer", "price: 12")
    second = await run_check(sdk, fc, monitor_id)
    [changed] = second.pages
    assert changed.status == "changed" and changed.diff is not None
    assert changed.diff.model_dump()["json"] == {"price": {"previous": 10, "current": 12}}
    assert changed.diff.text is None  # json mode only: no markdown diff
    assert changed.snapshot is not None and changed.snapshot.model_dump()["json"] == {
        "price": 12,
        "title": "Offer",
    }
