"""The console's monitors pages against a daemon whose monitor checked the fake site twice (one
page changed in between, its new text carrying markup): over HTTP, the list with next runs and
the last checks' counts, a changed page's diff view, the errors naming the field and the
session rules; in Chromium, the list, run now, pause and resume with a 409 shown as a message,
the check's pages, the diff unified and side by side with its lines and words marked, and the
page's markup shown as text."""

from __future__ import annotations

import functools
import html
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import trio

from daemon.app import Daemon
from daemon.crawl.runs.service import CrawlService
from daemon.fakes.site import SiteSim, host_map_resolver, serve_site
from tests.ui.cdp import Browser
from tests.ui.conftest import KEY, StartDaemon, base_url, client, keyed
from tests.ui.test_console_browser import close, loaded, run, shot

MONITORS = """
[crawl]
allow_cidrs = ["127.0.0.0/8"]
page_timeout = "60s"
[monitors]
min_interval = "1m"
"""
HOSTILE = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'
BEARER = {"Authorization": f"Bearer {KEY}"}


def page(title: str, *paragraphs: str) -> tuple[bytes, str]:
    body = "".join(f"<p>{p}</p>" for p in paragraphs)
    html = f"<html><head><title>{title}</title></head><body><h1>{title}</h1>{body}</body></html>"
    return html.encode(), "text/html"


@pytest.fixture
async def site(nursery: trio.Nursery) -> AsyncIterator[SiteSim]:
    sim = SiteSim(pages=5, slow_seconds=60)  # /slow: a check that runs until the test ends
    stop = trio.Event()
    await nursery.start(functools.partial(serve_site, sim, shutdown=stop))
    yield sim
    stop.set()


@dataclass
class Checked:
    daemon: Daemon
    monitor_id: str
    first: str
    second: str
    changed_n: str
    """The number of the changed page in the second check (the part after ':' of its id)."""


async def start(start_daemon: StartDaemon, http: str = "") -> Daemon:
    daemon = await start_daemon(http=http, extra=MONITORS)
    service: CrawlService = daemon.parts["crawl"]
    service.configure(service.config, resolver=host_map_resolver())
    return daemon


async def finished(http: httpx.AsyncClient, monitor_id: str, check_id: str) -> dict[str, Any]:
    with trio.fail_after(30):
        while True:
            answer = (await http.get(f"/v2/monitor/{monitor_id}/checks/{check_id}")).json()
            if answer["data"]["status"] not in ("queued", "running"):
                return dict(answer["data"])
            await trio.sleep(0.05)


async def checked_twice(daemon: Daemon, site: SiteSim) -> Checked:
    """A monitor "prices" over /price and /stable, checked, then /price changed (its new text
    carrying HOSTILE as text, so its markdown has the markup) and checked again."""
    site.files["/price"] = page("Price", "Price: 10 EUR", "Delivery in 3 days")
    site.files["/stable"] = page("Stable", "Nothing moves here")
    body = {"name": "prices", "schedule": {"cron": "0 9 * * *", "timezone": "Europe/Paris"},
            "targets": [{"type": "scrape", "urls": [site.url("/price"), site.url("/stable")]}]}  # fmt: skip
    async with client(daemon, headers=BEARER) as http:
        created = await http.post("/v2/monitor", json=body)
        assert created.status_code == 200, created.text
        monitor_id = created.json()["data"]["id"]
        first = (await http.post(f"/v2/monitor/{monitor_id}/run", json={})).json()["data"]["id"]
        assert (await finished(http, monitor_id, first))["status"] == "completed"
        site.files["/price"] = page("Price", "Price: 12 EUR", "Delivery in 3 days",
                                   html.escape(HOSTILE))  # fmt: skip
        second = (await http.post(f"/v2/monitor/{monitor_id}/run", json={})).json()["data"]["id"]
        done = await finished(http, monitor_id, second)
        assert done["summary"]["changed"] == 1, done
        [changed] = [p for p in done["pages"] if p["status"] == "changed"]
    return Checked(daemon, monitor_id, first, second, changed["id"].rsplit(":", 1)[1])


async def test_the_list_and_a_changed_pages_diff_view(
    start_daemon: StartDaemon, site: SiteSim
) -> None:
    c = await checked_twice(await start(start_daemon), site)
    async with client(c.daemon) as http:
        listing = (await http.get("/ui/api/monitors")).json()
        assert listing["enabled"] is True and listing["count"] == 1
        [m] = listing["monitors"]
        assert m["name"] == "prices" and m["status"] == "active" and m["nextRunAt"]
        assert m["schedule"] == {"cron": "0 9 * * *", "timezone": "Europe/Paris"}
        assert [x["id"] for x in m["checks"]] == [c.second, c.first]
        assert m["checks"][0]["summary"] == {"totalPages": 2, "same": 1, "changed": 1, "new": 0,
                                             "removed": 0, "error": 0}  # fmt: skip
        assert m["checks"][1]["summary"]["new"] == 2
        fewer = (await http.get("/ui/api/monitors", params={"checks": 1})).json()
        assert [x["id"] for x in fewer["monitors"][0]["checks"]] == [c.second]

        url = f"/ui/api/monitors/{c.monitor_id}/checks/{c.second}/pages/{c.changed_n}"
        shown = (await http.get(url)).json()
        assert shown["monitor"] == {"id": c.monitor_id, "name": "prices"}
        assert shown["check"]["id"] == c.second and "pages" not in shown["check"]
        assert shown["page"]["status"] == "changed" and shown["page"]["url"].endswith("/price")
        view = shown["view"]
        assert (view["added"], view["removed"], view["cut"]) == (3, 1, 0)
        dels = [r for r in view["unified"] if r["kind"] == "del"]
        adds = [r for r in view["unified"] if r["kind"] == "add"]
        assert dels[0]["parts"] == [["Price: ", False], ["10", True], [" EUR", False]]
        assert adds[0]["parts"] == [["Price: ", False], ["12", True], [" EUR", False]]
        assert "".join(p[0] for p in adds[2]["parts"]) == HOSTILE
        assert any(r["kind"] == "line" and r["left"] and r["left"]["kind"] == "del"
                   for r in view["split"])  # fmt: skip

        base = f"/ui/api/monitors/{c.monitor_id}/checks"
        bad = await http.get(f"{base}/{c.second}/pages/x1")
        assert bad.status_code == 400 and bad.json()["detail"]["field"] == "n"
        assert (await http.get(f"{base}/{c.second}/pages/999")).status_code == 404
        assert (await http.get(f"{base}/{c.monitor_id}/pages/1")).status_code == 404
        unknown = "00000000-0000-4000-8000-000000000000"
        assert (await http.get(f"/ui/api/monitors/{unknown}/checks/{c.second}/pages/1")
                ).status_code == 404  # fmt: skip
        assert (await http.get("/ui/api/monitors", params={"limit": 0})).status_code == 400
        assert (await http.get("/ui/api/monitors", params={"checks": 21})).status_code == 400


async def test_monitor_routes_need_a_session_like_the_rest(
    start_daemon: StartDaemon, site: SiteSim
) -> None:
    c = await checked_twice(await start(start_daemon, keyed()), site)
    page_url = f"/ui/api/monitors/{c.monitor_id}/checks/{c.second}/pages/{c.changed_n}"
    async with client(c.daemon) as http:
        assert (await http.get("/ui/api/monitors")).status_code == 401
        assert (await http.get(page_url)).status_code == 401
        assert (await http.get("/v2/monitor")).status_code == 401
        csrf = (await http.post("/ui/api/login", json={"key": KEY})).json()["csrf"]
        assert (await http.get("/ui/api/monitors")).json()["count"] == 1
        assert (await http.get(page_url)).status_code == 200
        run_url = f"/v2/monitor/{c.monitor_id}/run"
        assert (await http.post(run_url, json={})).status_code == 403  # no CSRF token
        paused = await http.patch(f"/v2/monitor/{c.monitor_id}", json={"status": "paused"},
                                  headers={"X-CSRF-Token": csrf})  # fmt: skip
        assert paused.status_code == 200
        refused = await http.post(run_url, json={}, headers={"X-CSRF-Token": csrf})
        assert refused.status_code == 409 and refused.json()["error"] == "Monitor is paused"


async def test_monitors_off(start_daemon: StartDaemon) -> None:
    daemon = await start_daemon(extra="[monitors]\nenabled = false\n")
    async with client(daemon) as http:
        assert (await http.get("/ui/api/monitors")).json() == {
            "enabled": False, "count": 0, "monitors": []}  # fmt: skip
        missing = await http.get(f"/ui/api/monitors/{'0' * 8}/checks/x/pages/1")
        assert missing.status_code == 404


async def test_the_monitors_pages_in_a_browser(
    start_daemon: StartDaemon, site: SiteSim, chromium: Browser
) -> None:
    c = await checked_twice(await start(start_daemon), site)
    async with client(c.daemon) as http:  # a second monitor, paused and never checked
        body = {"name": "blog", "schedule": {"text": "every 15 minutes"},
                "targets": [{"type": "crawl", "url": site.url("/")}]}  # fmt: skip
        other = (await http.post("/v2/monitor", json=body)).json()["data"]["id"]
        await http.patch(f"/v2/monitor/{other}", json={"status": "paused"})
        body = {"name": "slow", "schedule": {"text": "hourly"},
                "targets": [{"type": "scrape", "urls": [site.url("/slow")]}]}  # fmt: skip
        slow = (await http.post("/v2/monitor", json=body)).json()["data"]["id"]
        running = (await http.post(f"/v2/monitor/{slow}/run", json={})).json()["data"]["id"]
    url = base_url(c.daemon) + "/ui"
    row = f"document.querySelector('[data-monitor={json.dumps(c.monitor_id)}]').parentElement"
    message = "document.getElementById('monitor-message')"

    def check() -> None:
        tab = chromium.new_page()
        loaded(tab, f"{url}#/monitors")
        assert tab.js(f"{row}.querySelector('[data-status]').dataset.status") == "active"
        assert "(in " in tab.js(f"{row}.querySelector('[data-next]').textContent")
        assert tab.js(f"{row}.querySelectorAll('li[data-check]').length") == 2
        counts = tab.js(f"{row}.querySelector('li[data-check]').textContent")
        assert "2 pages: 1 changed · 1 same" in counts, counts
        assert "0 9 * * * (Europe/Paris)" in tab.js(f"{row}.textContent")
        slow_row = f"document.querySelector('[data-monitor={json.dumps(slow)}]').parentElement"
        assert tab.js(f"{slow_row}.querySelector('[data-status]').textContent") == "running"
        shot(tab, "console-monitors")
        assert tab.problems() == []

        tab.js(f"{slow_row}.querySelector('[data-action=run]').click()")
        tab.wait(f"{message}.textContent.includes('not started')")
        assert tab.js(f"{message}.textContent") == (
            "slow: not started. A check of this monitor is already running. See the running check."
        )
        link = tab.js(f"{message}.querySelector('a').getAttribute('href')")
        assert link == f"#/check/{slow}/{running}"

        tab.js(f"{row}.querySelector('[data-action=pause]').click()")
        tab.wait(f"{row}.querySelector('[data-status]').dataset.status === 'paused'")
        assert "paused" in tab.js(f"{message}.textContent")
        tab.js(f"{row}.querySelector('[data-action=run]').click()")
        tab.wait(f"{message}.textContent.includes('not started')")
        assert tab.js(f"{message}.textContent") == (
            "prices: not started. Monitor is paused. Resume it to run a check."
        )
        assert tab.js(f"{message}.className") == "warn"
        tab.js(f"{row}.querySelector('[data-action=resume]').click()")
        tab.wait(f"{row}.querySelector('[data-status]').dataset.status === 'active'")

        loaded(tab, f"{url}#/check/{c.monitor_id}/{c.second}")
        tab.wait("document.querySelectorAll('[data-page-status]').length === 2")
        statuses = tab.js("[...document.querySelectorAll('[data-page-status]')]"
                          ".map(e => e.dataset.pageStatus)")  # fmt: skip
        assert sorted(statuses) == ["changed", "same"]
        shot(tab, "console-monitor-check")
        tab.js("document.querySelector('a[data-diff]').click()")
        tab.wait("document.querySelector('table.diff')")
        tab.wait("document.getElementById('updated').textContent.includes('last updated')")
        if tab.js("document.querySelector('table.diff').dataset.mode") == "split":
            tab.js("document.querySelector('button[data-mode=unified]').click()")
        unified = "document.querySelector('table.diff-unified')"
        assert tab.js(f"{unified}.querySelectorAll('tr.diff-del').length") == 1
        assert tab.js(f"{unified}.querySelectorAll('tr.diff-add').length") == 3
        assert tab.js(f"{unified}.querySelector('tr.diff-del del.hl').textContent") == "10"
        assert tab.js(f"{unified}.querySelector('tr.diff-add ins.hl').textContent") == "12"
        assert HOSTILE in tab.js(f"{unified}.textContent")
        assert tab.js("document.querySelectorAll('#diff-body script, #diff-body img').length") == 0
        assert tab.js("window.__pwned === undefined")
        shot(tab, "console-monitor-diff")
        tab.js("document.querySelector('button[data-mode=split]').click()")
        split = "document.querySelector('table.diff-split')"
        tab.wait(split)
        assert tab.js(f"{split}.querySelectorAll('td.code.diff-del').length") == 1
        assert tab.js(f"{split}.querySelectorAll('td.code.diff-add').length") == 3
        assert tab.js(f"{split}.querySelector('td.diff-del del.hl').textContent") == "10"
        assert tab.js(f"{split}.querySelector('td.diff-add ins.hl').textContent") == "12"
        assert tab.js(f"{split}.querySelectorAll('td.code.diff-empty').length") == 2
        assert tab.js("document.querySelector('button[data-mode=split]').ariaPressed") == "true"
        assert tab.js("window.__pwned === undefined")
        shot(tab, "console-monitor-diff-split")
        tab.resize(375, 800)
        for name, marker in (("monitors", "li[data-check]"),
                             (f"check/{c.monitor_id}/{c.second}", "[data-page-status]"),
                             (f"diff/{c.monitor_id}/{c.second}/{c.changed_n}", "table.diff")):  # fmt: skip
            loaded(tab, f"{url}#/{name}")
            tab.wait(f"document.querySelector('#main {marker}')")
            assert tab.js("document.documentElement.scrollWidth") <= 375, name
        assert [p for p in tab.problems() if "409" not in p] == []  # the refused run only
        close(chromium, tab)

    await run(check)
