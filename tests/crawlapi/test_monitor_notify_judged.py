"""With a judging goal, a check whose only change the model (the OpenAI-compatible simulator)
judged noise notifies nobody (`notificationStatus` says `skipped`), and a meaningful one is told
with the model's verdict."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from firecrawl import Firecrawl

from daemon.fakes.openai_compat import OpenAICompatService
from daemon.fakes.receiver import WebhookReceiver
from daemon.fakes.site import SiteSim
from tests.crawlapi.conftest import CONFIG
from tests.crawlapi.test_monitor_judge import run_check
from tests.crawlapi.test_monitor_notify import posts, settled
from tests.crawlapi.test_monitors import page
from tests.crawlapi.test_sdk_llm import llm_sim, sim  # noqa: F401 (fixtures)

Sdk = Callable[..., Awaitable[Any]]


@pytest.fixture
def crawl_config(llm_sim: tuple[OpenAICompatService, str], rx: WebhookReceiver) -> str:  # noqa: F811
    return CONFIG + (
        f'[llm]\nbase_url = "{llm_sim[1]}"\nmodel = "sim-model"\ntimeout = "2s"\nretries = 0\n'
        '[monitors]\nnotify_retry_schedule = ["50ms"]\n'
        f'[[monitors.notification_targets]]\nname = "ops"\nurl = "json://{rx.netloc}/notify"\n'
    )


async def test_a_change_judged_noise_is_not_told_and_a_meaningful_one_is(
    fc: Firecrawl, sdk: Sdk, site: SiteSim, sim: OpenAICompatService,  # noqa: F811
    rx: WebhookReceiver, client: httpx.AsyncClient,
) -> None:  # fmt: skip
    site.files["/price"] = page("Price", "Price: 10 EUR")
    body = {"name": "judged", "schedule": {"text": "hourly"}, "goal": "price drops",
            "notification": {"targets": ["ops"]},
            "targets": [{"type": "scrape", "urls": [site.url("/price")]}]}  # fmt: skip
    answer = await client.post("/v2/monitor", json=body)
    monitor_id = answer.json()["data"]["id"]
    first = await run_check(sdk, fc, monitor_id)
    assert await settled(sdk, fc, monitor_id, first.id) == {"targets": {"ops": "sent"}}

    site.files["/price"] = page("Price", "Price: 10 EUR, updated today")  # noise, says the model
    noise = await run_check(sdk, fc, monitor_id)
    assert noise.pages[0].status == "changed" and noise.pages[0].judgment is not None
    assert noise.pages[0].judgment.meaningful is False
    assert noise.notification_status == {"targets": {"ops": "skipped"}}

    site.files["/price"] = page("Price", "Price: 8 EUR, a meaningful drop")
    drop = await run_check(sdk, fc, monitor_id)
    assert await settled(sdk, fc, monitor_id, drop.id) == {"targets": {"ops": "sent"}}
    told = posts(rx)
    assert len(told) == 2 and drop.id in told[1].json["message"]
    assert "judged meaningful (high)" in told[1].json["message"]
