"""The console in a real headless Chromium (Debian's), driven over the DevTools protocol, against
an in-process daemon: every page loads with no console error and no failed request, the key
prompt, the collector buttons, the curve's point count, a hostile title, 375 px without a
horizontal scroll, the queue's last hour and cluster members on the overview, webhook delivery
on the jobs, schedules with lag on the tracker. Screenshots go to the artifact folder (and docs/
with CRAWLD_UI_DOCS=1)."""

from __future__ import annotations

import functools
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from daemon.api import control
from daemon.fakes.octoparse import DEMO_PASSWORD, OctoparseSim, serve_sim
from daemon.outbox import NewItem
from tests.ui import conftest as ui
from tests.ui.cdp import Browser, Page
from tests.ui.conftest import ARTIFACTS, DAY_MS, KEY, StartDaemon, add_video, base_url, keyed

PAGES = ["overview", "collector", "jobs", "tracker", "crawl", "monitors"]
DOCS = {
    "console-overview",
    "console-video",
    "console-monitors",
    "console-monitor-diff",
    "console-monitor-diff-split",
}
"""The screenshots the console docs show (CRAWLD_UI_DOCS=1 copies them to docs/)."""
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
    assert daemon.outbox is not None
    await daemon.outbox.append("queue:job_data", [NewItem(f"r{i}", b"{}") for i in range(40)])
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


async def test_overview_draws_the_queue_hour_and_cluster_members(
    start_daemon: StartDaemon, chromium: Browser, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon = await start_daemon(extra='[broker]\nkind = "embedded"')
    assert daemon.outbox is not None
    await daemon.outbox.append("queue:job_data", [NewItem(f"a{i}", b"{}") for i in range(3)])
    members = [
        {"instance": HOSTILE, "host": HOSTILE, "pid": 41, "http": "javascript:alert(1)",
         "started_ms": 1, "heartbeat_ms": 2, "expires_ms": 3, "alive": True, "holds": [HOSTILE]},
        {"instance": "b", "host": "h2", "pid": 42, "http": None, "started_ms": 1, "self": True,
         "heartbeat_ms": 2, "expires_ms": 3, "alive": False, "holds": [], "version": "0.1.0"},
    ]  # fmt: skip
    cluster: list[dict[str, Any] | None] = [None]
    plain_status = control.build_status

    async def status_as(daemon: Any) -> dict[str, Any]:
        # /status without a cluster section (before cluster mode), then as cluster mode shapes it
        status: dict[str, Any] = msgspec.to_builtins(await plain_status(daemon))
        status.pop("cluster", None)
        if cluster[0] is not None:
            status["cluster"] = cluster[0]
        return status

    monkeypatch.setattr(control, "build_status", status_as)
    url = base_url(daemon) + "/ui#/overview"

    def first() -> Page:
        page = open_page(chromium, url)
        page.wait("document.querySelector('svg.queue-chart').dataset.published === '3'")
        assert page.js("document.querySelectorAll('svg.queue-chart rect.bar').length") >= 1
        assert page.js("document.getElementById('cluster')") is None
        return page

    page = await run(first)
    await daemon.outbox.append("queue:job_data", [NewItem(f"b{i}", b"{}") for i in range(2)])
    cluster[0] = {"enabled": False, "instance": "solo", "lease_s": 15.0, "members": members[1:]}

    def alone() -> None:
        page.wait("document.querySelector('svg.queue-chart').dataset.published === '5'")
        assert page.js("document.getElementById('cluster')") is None  # not in cluster mode

    await run(alone)
    cluster[0] = {"enabled": True, "instance": HOSTILE, "lease_s": 15.0, "members": members,
                  "leases": []}  # fmt: skip

    def second() -> None:
        page.wait("document.getElementById('cluster')")
        cells = page.js(
            "[...document.querySelectorAll('#cluster tbody tr:first-child td')]"
            ".map(td => td.textContent)"
        )
        assert cells[0] == cells[1] == HOSTILE and cells[4] == "javascript:alert(1)"
        assert cells[-1] == HOSTILE and cells[-2] == "alive"
        mine = page.js("document.querySelector('#cluster tbody tr:nth-child(2) td').textContent")
        assert mine == "b (this one)"
        assert page.js("document.querySelectorAll('#cluster a, main script, main img').length") == 0
        assert page.js("window.__pwned === undefined")
        summary = page.js("document.querySelector('section.cards').textContent")
        assert "1/2 members alive" in summary
        assert page.problems() == []
        shot(page, "console-overview-cluster")
        close(chromium, page)

    await run(second)


async def test_jobs_show_webhook_delivery(
    start_daemon: StartDaemon, chromium: Browser, silent_hook: str
) -> None:
    daemon = await start_daemon(extra=ui.SILENT_HOOK)
    await ui.add_webhook_jobs(daemon, silent_hook)
    url = base_url(daemon) + "/ui"

    def check() -> None:
        page = open_page(chromium, f"{url}#/jobs")
        cell = page.wait(
            f"document.querySelector('[data-delivery=\"{ui.STUCK_JOB}\"]').textContent"
        )
        assert cell == "cursor 0/3 · pending 3 · failed 1"
        gone = page.js(f"document.querySelector('[data-delivery=\"{ui.GONE_JOB}\"]').textContent")
        assert (
            gone == f"cursor 3/3 · pending 0 · failed 0 · gone (410 at {ui.GONE_JOB}:1, 2 skipped)"
        )
        plain = page.js(f"document.querySelector('[data-delivery=\"{ui.PLAIN_JOB}\"]').textContent")
        assert plain == "no webhook"
        loaded(page, f"{url}#/job/{ui.GONE_JOB}")
        cards = page.wait("document.getElementById('job-delivery').textContent")
        assert "410 at" in cards and "2 skipped" in cards
        assert page.problems() == []
        shot(page, "console-job-delivery")
        close(chromium, page)

    await run(check)


async def test_tracker_shows_schedules_by_type_and_status_with_lag(
    start_daemon: StartDaemon, chromium: Browser
) -> None:
    daemon = await start_daemon()
    assert daemon.store is not None
    now = int(time.time() * 1000)

    def write(conn: Any) -> None:
        rows = [(1, "new", "pending"), (2, "new", "pending"), (3, "normal", "completed"),
                (4, "archive", "failed")]  # fmt: skip
        for aid, type_, status in rows:
            conn.execute(
                "INSERT INTO tracker_schedules(aid, type, status, planned_ms, created_ms)"
                " VALUES (?, ?, ?, ?, ?)",
                (aid, type_, status, now, now),
            )

    await daemon.store.write(write)
    daemon.parts["tracker"].tracker.stats.record_lags("new", now, [1000, 2000, 3000])
    url = base_url(daemon) + "/ui#/tracker"

    def check() -> None:
        page = open_page(chromium, url)
        page.wait("document.querySelector('#schedules [data-type=new]')")
        rows = page.js(
            "Object.fromEntries([...document.querySelectorAll('#schedules tbody tr')].map(tr =>"
            " [tr.cells[0].textContent, [...tr.cells].slice(1).map(td => td.textContent)]))"
        )
        headers = page.js("[...document.querySelectorAll('#schedules th')].map(t => t.textContent)")
        assert headers[:3] == ["type", "pending", "processing"] and headers[-3] == "lag p50"
        assert set(rows) == {"new", "milestone", "normal", "archive"}
        assert rows["new"][0] == "2" and rows["normal"][2] == "1" and rows["archive"][3] == "1"
        assert rows["new"][-3:] == ["2.0 s", "3.0 s", "3"]
        assert rows["milestone"][-3:] == ["–", "–", "0"]
        assert page.problems() == []
        shot(page, "console-tracker-schedules")
        close(chromium, page)

    await run(check)


async def test_the_crawl_page_shows_feedback_as_text(
    start_daemon: StartDaemon, chromium: Browser
) -> None:
    daemon = await start_daemon()
    feedback = daemon.parts["feedback"]
    search_id = "5b0c8f64-1d1e-4a57-9a53-0d5b1c2f3e4a"
    await feedback.record_search(search_id, {
        "rating": "partial", "missingContent": [{"topic": HOSTILE}],
        "valuableSources": [{"url": "https://example.org/a", "reason": "on topic"}]})  # fmt: skip
    url = base_url(daemon) + "/ui"

    def check() -> None:
        page = open_page(chromium, f"{url}#/crawl")
        text = page.wait("document.getElementById('feedback').textContent")
        assert "partial" in text and search_id[:8] in text
        assert "valuable: https://example.org/a (on topic)" in text
        assert f"missing: {HOSTILE}" in text
        assert page.js("window.__pwned") is None
        assert page.problems() == []
        close(chromium, page)

    await run(check)
