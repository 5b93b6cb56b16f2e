"""The console in a real headless Chromium (Debian's), driven over the DevTools protocol, against
an in-process daemon: every page loads with no console error and no failed request, the key
prompt, the collector buttons, the curve's point count, a hostile title, 375 px without a
horizontal scroll. Screenshots go to the artifact folder (and docs/ with CRAWLD_UI_DOCS=1)."""

from __future__ import annotations

import functools
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from daemon.fakes.octoparse import DEMO_PASSWORD, OctoparseSim, serve_sim
from tests.ui.cdp import Browser, Page
from tests.ui.conftest import ARTIFACTS, DAY_MS, KEY, StartDaemon, add_video, base_url, keyed

PAGES = ["overview", "collector", "jobs", "tracker", "crawl"]
DOCS = {"console-overview", "console-video"}
"""The screenshots the README shows (CRAWLD_UI_DOCS=1 copies them to docs/)."""
HOSTILE = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'


async def run(fn: Any, *args: Any) -> Any:
    return await trio.to_thread.run_sync(functools.partial(fn, *args))


def loaded(page: Page, url: str, marker: str = "last updated") -> None:
    page.goto(url)
    page.wait(f"document.getElementById('updated').textContent.includes({json.dumps(marker)})")


def open_page(browser: Browser, url: str, width: int = 1200) -> Page:
    page = browser.new_page(width=width)
    loaded(page, url)
    return page


def close(browser: Browser, page: Page) -> None:
    target = page.call("Target.getTargetInfo")["targetInfo"]["targetId"]
    browser.send("Target.closeTarget", {"targetId": target})


def shot(page: Page, name: str) -> None:
    page.screenshot(ARTIFACTS / f"{name}.png")
    if os.environ.get("CRAWLD_UI_DOCS") == "1" and name in DOCS:
        docs = Path(__file__).resolve().parents[2] / "docs"
        docs.mkdir(exist_ok=True)
        shutil.copy(ARTIFACTS / f"{name}.png", docs / f"{name}.png")


async def test_every_page_loads_clean_and_fits_375px(
    start_daemon: StartDaemon, chromium: Browser
) -> None:
    daemon = await start_daemon()
    await add_video(
        daemon, 170001, title="【洛天依原创】十万星河", snapshots=500, span_ms=40 * DAY_MS
    )
    url = base_url(daemon) + "/ui"

    def check() -> None:
        page = chromium.new_page()
        for name in [*PAGES, "video/170001"]:
            loaded(page, f"{url}#/{name}")
            if name == "video/170001":
                page.wait("document.querySelector('svg.chart[data-points]')")
            time.sleep(0.2)  # let the page's own requests finish
            assert page.problems() == [], name
        loaded(page, f"{url}#/overview")
        time.sleep(0.3)
        shot(page, "console-overview")
        loaded(page, f"{url}#/video/170001")
        page.wait("document.querySelector('svg.chart[data-points]')")
        page.js("document.querySelector('[data-range=all]').click()")
        page.wait("document.querySelector('svg.chart').dataset.points === '500'")
        shot(page, "console-video")
        page.resize(375, 800)
        for name in [*PAGES, "video/170001"]:
            loaded(page, f"{url}#/{name}")
            time.sleep(0.2)
            wide = page.js("document.documentElement.scrollWidth")
            assert wide <= 375, (name, wide)
            shot(page, f"console-375-{name.replace('/', '-')}")
        # keyboard: every control can take the focus, and each form field has a label
        unlabelled = page.js(
            "[...document.querySelectorAll('input,select,textarea')]"
            ".filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label')).length"
        )
        assert unlabelled == 0
        assert page.problems() == []
        close(chromium, page)

    await run(check)


async def test_the_key_prompt(start_daemon: StartDaemon, chromium: Browser) -> None:
    daemon = await start_daemon(http=keyed())
    url = base_url(daemon) + "/ui#/overview"

    def check() -> None:
        page = chromium.new_page()
        page.goto(url)
        page.wait("!document.getElementById('login').hidden")
        assert page.js("document.getElementById('main').children.length") == 0
        page.js("document.getElementById('login-key').value = 'not-the-key-at-all'")
        page.js("document.querySelector('#login-form button').click()")
        page.wait("document.getElementById('login-error').textContent.includes('not valid')")
        assert not page.js("document.getElementById('login').hidden")
        problems = page.problems()
        assert problems and all("401" in p for p in problems), problems  # only the refusals
        page.mark = len(page.events())
        page.js(f"document.getElementById('login-key').value = {json.dumps(KEY)}")
        page.js("document.querySelector('#login-form button').click()")
        page.wait("document.getElementById('updated').textContent.includes('last updated')")
        assert page.js("document.getElementById('login').hidden")
        assert "crawld_session" not in page.js("document.cookie")  # HttpOnly
        # a reload keeps the session: no second prompt
        page.call("Page.reload")
        page.wait("document.getElementById('updated').textContent.includes('last updated')")
        assert page.js("document.getElementById('login').hidden")
        new = page.events()[page.mark :]
        assert not [e for e in new if e["method"] == "Network.responseReceived"
                    and e["params"]["response"]["status"] >= 400]  # fmt: skip
        close(chromium, page)

    await run(check)


async def test_collector_buttons_change_the_run(
    start_daemon: StartDaemon, chromium: Browser, nursery: trio.Nursery,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    sim = OctoparseSim()
    task_id = sim.add_task("ui", rows=600, days=3)
    host, port = await nursery.start(functools.partial(serve_sim, sim, "127.0.0.1:0"))
    monkeypatch.setenv("CRAWLD_TEST_UI_OCTOPARSE", DEMO_PASSWORD)
    extra = f"""
[broker]
kind = "embedded"
[collector]
auto_start = false
[[collector.accounts]]
name = "sim"
base_url = "http://{host}:{port}"
username = "demo"
password_env = "CRAWLD_TEST_UI_OCTOPARSE"
[[collector.tasks]]
id = "ui"
account = "sim"
task_id = "{task_id}"
date_field = "发布时间"
"""
    daemon = await start_daemon(http=keyed(), extra=extra)
    url = base_url(daemon) + "/ui#/collector"

    def check() -> None:
        page = chromium.new_page()
        page.goto(url)
        page.wait("!document.getElementById('login').hidden")
        page.js(f"document.getElementById('login-key').value = {json.dumps(KEY)}")
        page.js("document.querySelector('#login-form button').click()")
        page.wait("document.querySelector('[data-task=ui] [data-run]')")
        assert page.js("document.querySelector('[data-run]').dataset.runId") == ""
        page.js("document.querySelector('[data-action=start]').click()")
        run_id = page.wait("document.querySelector('[data-run]').dataset.runId")
        assert page.wait(
            "document.getElementById('collector-message').textContent.startsWith('start:')"
        )
        page.js("document.querySelector('[data-action=stop]').click()")
        page.wait("document.getElementById('collector-message').textContent.startsWith('stop:')")
        page.wait("document.querySelector('[data-run]').dataset.run === 'idle'")
        page.js("document.querySelector('[data-action=start]').click()")
        page.wait(f"document.querySelector('[data-run]').dataset.runId !== {json.dumps(run_id)}"
                  " && document.querySelector('[data-run]').dataset.runId !== ''")  # fmt: skip
        shot(page, "console-collector")
        assert [p for p in page.problems() if "409" not in p] == []
        close(chromium, page)

    await run(check)


@pytest.mark.parametrize(
    ("range_", "expected"), [("6h", 6), ("24h", 24), ("7d", 168), ("30d", 720), ("all", 720)]
)
async def test_curve_point_count_matches_the_range(
    start_daemon: StartDaemon, chromium: Browser, range_: str, expected: int
) -> None:
    daemon = await start_daemon()
    await add_video(daemon, 5, snapshots=720, span_ms=30 * DAY_MS)  # one an hour
    await add_video(daemon, 6, snapshots=50_000, span_ms=60 * DAY_MS)
    url = base_url(daemon) + "/ui#/video/5"

    def check() -> None:
        page = open_page(chromium, url)
        page.js(f"document.querySelector('[data-range=\"{range_}\"]').click()")
        page.wait(
            f"document.querySelector('svg.chart').getAttribute('aria-label').includes('{range_}')"
        )
        drawn = page.js("document.querySelector('svg.chart polyline.views').points.length")
        assert drawn == expected
        assert page.js("document.querySelector('svg.chart').dataset.points") == str(expected)
        loaded(page, url.replace("/5", "/6"))
        page.js(f"document.querySelector('[data-range=\"{range_}\"]').click()")
        page.wait(
            f"document.querySelector('svg.chart').getAttribute('aria-label').includes('{range_}')"
        )
        many = page.js("document.querySelector('svg.chart polyline.views').points.length")
        assert 0 < many <= 1000
        assert page.problems() == []
        close(chromium, page)

    await run(check)


async def test_a_hostile_title_is_text(start_daemon: StartDaemon, chromium: Browser) -> None:
    daemon = await start_daemon()
    await add_video(daemon, 66, title=HOSTILE, uploader=HOSTILE, snapshots=10)
    url = base_url(daemon) + "/ui"

    def check() -> None:
        page = open_page(chromium, f"{url}#/tracker")
        page.wait("document.querySelector('#video-results table')")
        cell = page.js("document.querySelector('#video-results tbody td:nth-child(2)').textContent")
        assert cell == HOSTILE
        loaded(page, f"{url}#/video/66")
        page.wait("document.getElementById('video-title')")
        assert page.js("document.getElementById('video-title').textContent") == HOSTILE
        assert page.js("document.querySelectorAll('main script, main img').length") == 0
        assert page.js("window.__pwned === undefined")
        assert page.problems() == []
        close(chromium, page)

    await run(check)
