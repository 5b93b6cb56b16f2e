"""firecrawl-py against a crawld with [crawl.browser] enabled: screenshots, actions and their
results in Firecrawl's shapes, a failed action as Firecrawl's error, a 400 naming a bad action,
and engine metadata."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from firecrawl import Firecrawl
from firecrawl.v2.types import (
    ClickAction,
    ExecuteJavascriptAction,
    Location,
    PDFAction,
    PressAction,
    ScrapeAction,
    ScreenshotAction,
    ScreenshotFormat,
    ScrollAction,
    WaitAction,
    WriteAction,
)
from firecrawl.v2.utils.error_handler import BadRequestError

from daemon.crawl.rendering.render import decode_data_uri
from daemon.fakes import js_site
from daemon.fakes.site import SiteSim
from tests.crawl.conftest import need_chromium
from tests.crawlapi.conftest import CONFIG, NO_BROWSER

pytestmark = pytest.mark.browser
Sdk = Callable[..., Awaitable[Any]]


@pytest.fixture
def crawl_config() -> str:
    need_chromium()
    sandbox = "true" if os.geteuid() != 0 else "false"
    config = CONFIG.replace(NO_BROWSER, "").replace('page_timeout = "5s"', 'page_timeout = "15s"')
    return config + f"\n[crawl.browser]\nenabled = true\nsandbox = {sandbox}\ntabs = 1\n"


async def test_sdk_screenshot_and_actions(fc: Firecrawl, sdk: Sdk, site: SiteSim) -> None:
    doc = await sdk(
        fc.scrape, site.url("/js/form"),
        formats=["markdown", ScreenshotFormat(full_page=True, viewport={"width": 800, "height": 600})],
        actions=[
            WaitAction(selector="#q"), ClickAction(selector="#q"), WriteAction(text="sdk"),
            PressAction(key="Enter"), WaitAction(milliseconds=50),
            ScrollAction(direction="down"), ScreenshotAction(full_page=False),
            ExecuteJavascriptAction(script="document.getElementById('results').textContent"),
            ScrapeAction(), PDFAction(format="A4"),
        ],
        location=Location(languages=["en-GB"]), mobile=False,
    )  # fmt: skip
    assert "Results for sdk" in doc.markdown
    assert doc.screenshot.startswith("data:image/png;base64,")
    assert decode_data_uri(doc.screenshot)[:4] == b"\x89PNG"
    assert doc.actions["javascriptReturns"] == [{"type": "string", "value": "Results for sdk"}]
    assert len(doc.actions["screenshots"]) == 1 and len(doc.actions["pdfs"]) == 1
    assert "Results for sdk" in doc.actions["scrapes"][0]["html"]
    assert (
        doc.metadata.model_extra.get("engine") == "browser"
        or getattr(doc.metadata, "engine", None) == "browser"
    )


async def test_sdk_auto_render_and_wait_for(fc: Firecrawl, sdk: Sdk, site: SiteSim) -> None:
    doc = await sdk(fc.scrape, site.url("/js/fetch"), formats=["markdown"])
    assert js_site.FETCHED_ITEMS[1] in doc.markdown
    doc = await sdk(fc.scrape, site.url("/js/delayed"), formats=["markdown"], wait_for=800)
    assert js_site.DELAYED_TEXT in doc.markdown


async def test_failed_action_is_firecrawls_error(client: httpx.AsyncClient, site: SiteSim) -> None:
    body = {"url": site.url("/js/button"), "timeout": 20000,
            "actions": [{"type": "click", "selector": "#nowhere"}]}  # fmt: skip
    answer = await client.post("/v2/scrape", json=body)
    assert answer.status_code == 500
    got = answer.json()
    assert got["success"] is False and got["code"] == "SCRAPE_ACTION_ERROR"
    assert "action 0 (click)" in got["error"]


async def test_hung_page_times_out_with_408(client: httpx.AsyncClient, site: SiteSim) -> None:
    answer = await client.post(
        "/v2/scrape", json={"url": site.url("/js/hang"), "timeout": 2000, "waitFor": 1}
    )
    assert answer.status_code == 408 and answer.json()["code"] == "SCRAPE_TIMEOUT"


async def test_bad_action_is_a_400_naming_it(fc: Firecrawl, sdk: Sdk, client: httpx.AsyncClient,
                                             site: SiteSim) -> None:  # fmt: skip
    answer = await client.post("/v2/scrape", json={"url": site.url("/"), "actions": [
        {"type": "wait", "milliseconds": 10}, {"type": "wait"}]})  # fmt: skip
    assert answer.status_code == 400
    details = answer.json()["details"]
    assert details[0]["path"] == "$.actions[1]" and "milliseconds" in details[0]["message"]
    with pytest.raises(BadRequestError):  # the SDK passes a bad wait through; crawld names it
        await sdk(fc.scrape, site.url("/"), actions=[WaitAction()])


async def test_crawl_renders_its_pages(fc: Firecrawl, sdk: Sdk, site: SiteSim) -> None:
    job = await sdk(fc.batch_scrape, [site.url("/js/fetch"), site.url("/about"), site.url("/js/noscript")],
                    formats=["markdown"], poll_interval=1)  # fmt: skip
    by_url = {d.metadata.source_url: d for d in job.data}
    assert js_site.FETCHED_ITEMS[0] in by_url[site.url("/js/fetch")].markdown
    engines = {u: (d.metadata.model_extra or {}).get("engine") for u, d in by_url.items()}
    assert engines == {site.url("/js/fetch"): "browser", site.url("/about"): "http",
                       site.url("/js/noscript"): "browser"}  # fmt: skip
