"""No state of one scrape reaches the next, whether the tab is reused after a reset or its
context is new: a page of a loopback site plants a cookie (from the server and from script),
local and session storage, an IndexedDB database, a Cache Storage entry, a service worker,
window.name, a script's global, a granted permission and an HTTP-cached script; the next scrape
of the same origin looks for each (the browser keeps a same-site page's frame from document to
document, its RenderDocument feature being off: browser_args). The reset and its checks: daemon/crawl/rendering/isolation.py."""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import pytest
import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from daemon.api.server import serve_app
from daemon.crawl.rendering import render_rules as rr
from daemon.crawl.rendering.browser import BrowserPool, Tab
from daemon.crawl.rendering.isolation import Slot, document_seen, origin_of, target_seen
from daemon.crawl.rendering.render import RenderSpec, render
from tests.crawl.conftest import start_browser

PLANT = """(async () => {
  document.cookie = 'js=planted; max-age=3600; path=/';
  localStorage.setItem('planted', '1');
  sessionStorage.setItem('planted', '1');
  await new Promise((ok, bad) => {
    const open = indexedDB.open('planted', 1);
    open.onupgradeneeded = () => open.result.createObjectStore('things');
    open.onsuccess = () => { open.result.close(); ok(); };
    open.onerror = () => bad(open.error);
  });
  await (await caches.open('planted')).put('/planted', new Response('x'));
  await navigator.serviceWorker.register('/sw.js');
  await navigator.serviceWorker.ready;
  window.name = 'planted';
  window.plantedGlobal = 'planted';
  return 'planted';
})()"""

STATE = """(async () => ({
  cookie: document.cookie,
  local: localStorage.getItem('planted'),
  session: sessionStorage.getItem('planted'),
  indexedDB: (await indexedDB.databases()).some((d) => d.name === 'planted'),
  caches: await caches.has('planted'),
  serviceWorkers: (await navigator.serviceWorker.getRegistrations()).length,
  geolocation: (await navigator.permissions.query({name: 'geolocation'})).state,
  windowName: window.name,
  cachedScriptRan: window.cachedScriptRan === true,
  global: window.plantedGlobal ?? null,
}))()"""

NOTHING = {
    "cookie": "",
    "local": None,
    "session": None,
    "indexedDB": False,
    "caches": False,
    "serviceWorkers": 0,
    "geolocation": "prompt",
    "windowName": "",
    "cachedScriptRan": True,
    "global": None,
}
PAGE = '<!doctype html><title>{0}</title><h1>{0}</h1><script src="/cached.js"></script>'


class StatefulSite:
    """/plant and /look (both load /cached.js, cacheable for an hour), /sw.js, and /late (its
    answer, which sets a cookie, held until `release` is set); counts requests and keeps the
    Cookie header of each."""

    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()
        self.cookies: dict[str, str] = {}
        self.release = trio.Event()
        self.answered = 0

    async def handle(self, request: Request) -> Response:
        path = request.url.path
        self.hits[path] += 1
        self.cookies[path] = request.headers.get("cookie", "")
        if path == "/late":
            await self.release.wait()
            self.answered += 1
            return Response("late", headers={"set-cookie": "late=1; Max-Age=3600; Path=/"})
        if path == "/cached.js":
            return Response(
                "window.cachedScriptRan = true;", media_type="text/javascript",
                headers={"cache-control": "public, max-age=3600"},
            )  # fmt: skip
        if path == "/sw.js":
            return Response(
                "self.addEventListener('fetch', () => {});", media_type="text/javascript"
            )
        if path in ("/plant", "/look"):
            headers = (
                {"set-cookie": "srv=planted; Max-Age=3600; Path=/"} if path == "/plant" else {}
            )
            return Response(PAGE.format(path[1:]), media_type="text/html", headers=headers)
        return Response("no", status_code=404)

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/{path:path}", self.handle)])


async def _evaluate(tab: Tab, expression: str) -> Any:
    answer = await tab.session.call(
        "Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True
    )
    assert "exceptionDetails" not in answer, answer["exceptionDetails"]
    return answer["result"]["value"]


async def _plant(pool: BrowserPool, origin: str) -> tuple[str, dict[str, Any]]:
    """Plant everything from a tab of `pool`: (the tab's target id, what the tab sees)."""
    async with pool.tab() as tab:
        with tab.session.subscribe("Page.loadEventFired") as loaded:
            await tab.session.call("Page.navigate", url=origin + "/plant")
            await loaded.receive()
        assert await _evaluate(tab, PLANT) == "planted"
        await tab.browser.conn.call(
            "Browser.grantPermissions",
            {"permissions": ["geolocation"], "origin": origin, "browserContextId": tab.context_id},
        )
        planted = await _evaluate(tab, STATE)
        return tab.session.target_id, planted


async def _settled(pool: BrowserPool) -> None:
    """Until the given-back tab is idle again or its context gone (both in the background)."""
    with trio.fail_after(15):
        while True:
            slots = pool._current.slots  # type: ignore[union-attr]
            assert slots is not None
            if len(slots.live) == len(slots.idle):
                return
            await trio.sleep(0.05)


@pytest.mark.browser
@pytest.mark.parametrize("pages_per_context", [50, 1])
async def test_no_state_of_one_scrape_reaches_the_next(
    nursery: trio.Nursery, pages_per_context: int
) -> None:
    site = StatefulSite()
    _, port = await nursery.start(functools.partial(serve_app, site.app(), "127.0.0.1:0"))
    origin = f"http://127.0.0.1:{port}"
    running = await start_browser(nursery, tabs=1, pages_per_context=pages_per_context)
    pool = running.pool
    first, planted = await _plant(pool, origin)
    assert planted == {  # what the next scrape must not see was there
        "cookie": "srv=planted; js=planted", "local": "1", "session": "1", "indexedDB": True,
        "caches": True, "serviceWorkers": 1, "geolocation": "granted", "windowName": "planted",
        "cachedScriptRan": True, "global": "planted",
    }  # fmt: skip
    assert site.hits["/cached.js"] == 1
    await _settled(pool)
    slots = pool._current.slots  # type: ignore[union-attr]
    assert slots is not None
    assert slots.last_disposed == ("" if pages_per_context > 1 else "pages_per_context")
    assert (first in [s.target_id for s in slots.idle]) is (pages_per_context > 1)

    spec = RenderSpec(timeout=20, actions=(rr.ExecuteJavascript(script=STATE),))
    rendered = await render(pool, origin + "/look", spec)
    assert rendered.actions is not None
    assert rendered.actions["javascriptReturns"][0]["value"] == NOTHING
    assert site.hits["/look"] == 1 and site.cookies["/look"] == ""
    assert site.hits["/cached.js"] == 2  # fetched again: the HTTP cache was not shared
    assert slots.counts["reused"] == (1 if pages_per_context > 1 else 0)
    nursery.cancel_scope.cancel()


# -- the rules, with plain values -------------------------------------------------------------


def _slot() -> Slot:
    return Slot("ctx", "main", None, 1)  # type: ignore[arg-type]


def _document(url: str, parent: str = "") -> dict[str, Any]:
    frame = {"id": "f", "url": url, **({"parentId": parent} if parent else {})}
    return {"method": "Page.frameNavigated", "params": {"frame": frame}}


def test_origins_of_documents_are_noted_and_frames_of_other_hosts_are_foreign() -> None:
    slot = _slot()
    document_seen(slot, _document("http://a.test:81/x?y"))
    document_seen(slot, _document("https://b.test/moved"))
    document_seen(slot, _document("http://a.test:82/frame", parent="main"))
    document_seen(slot, _document("about:blank", parent="main"))
    document_seen(slot, _document("data:text/html,x", parent="main"))
    document_seen(slot, {"method": "Page.loadEventFired", "params": {}})
    assert slot.origins == {"http://a.test:81", "https://b.test", "http://a.test:82"}
    assert slot.foreign == ""
    document_seen(slot, _document("http://c.test/ad", parent="main"))
    assert slot.foreign == "a frame of c.test"
    other = _slot()
    document_seen(other, _document("ftp://a.test/"))
    assert other.foreign == "a document of scheme 'ftp'"


def test_other_targets_of_a_tabs_context() -> None:
    slot = _slot()
    slots = {"ctx": slot}

    def created(kind: str, url: str, context: str = "ctx", target: str = "t2") -> dict[str, Any]:
        info = {"targetId": target, "type": kind, "url": url, "browserContextId": context}
        return {"method": "Target.targetCreated", "params": {"targetInfo": info}}

    target_seen(slots, created("page", "http://a.test/", target="main"))  # the tab itself
    target_seen(slots, created("page", "http://x.test/", context="other"))
    target_seen(slots, created("service_worker", "http://a.test/sw.js"))
    target_seen(slots, created("shared_worker", ""))
    assert slot.origins == {"http://a.test"} and slot.foreign == ""
    target_seen(slots, created("page", "about:blank"))
    assert slot.foreign == "a page target"


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        ("http://A.test/x", "http://a.test"),
        ("https://u:p@a.test:8443/", "https://a.test:8443"),
        ("http://a.test:80/x", "http://a.test"),
        ("https://a.test:443", "https://a.test"),
        ("http://a.test:443/", "http://a.test:443"),
        ("about:blank", None),
        ("http:///x", None),
    ],
)
def test_origin_of(url: str, origin: str | None) -> None:
    assert origin_of(url) == origin


PROBE = """({
  width: innerWidth,
  touch: navigator.maxTouchPoints,
  language: navigator.language,
  mobile: navigator.userAgent.includes('Mobile'),
})"""


@pytest.mark.browser
async def test_page_settings_do_not_carry_over_to_the_next_page(nursery: trio.Nursery) -> None:
    """A reused tab: the phone, locale and viewport of one render are not the next one's."""
    site = StatefulSite()
    _, port = await nursery.start(functools.partial(serve_app, site.app(), "127.0.0.1:0"))
    pool = (await start_browser(nursery, tabs=1, pages_per_context=50)).pool
    url = f"http://127.0.0.1:{port}/look"
    actions = (rr.ExecuteJavascript(script=PROBE),)

    async def probe(**spec: Any) -> Any:
        rendered = await render(pool, url, RenderSpec(timeout=20, actions=actions, **spec))
        assert rendered.actions is not None
        await _settled(pool)
        return rendered.actions["javascriptReturns"][0]["value"]

    desktop = await probe()
    phone = await probe(mobile=True, languages=("de-DE",))
    assert (phone["touch"], phone["language"], phone["mobile"]) == (5, "de-DE", True)
    assert phone["width"] != desktop["width"]
    assert await probe() == desktop
    assert desktop["width"] == rr.DESKTOP_VIEWPORT[0] and desktop["touch"] == 0
    assert desktop["language"] != "de-DE" and not desktop["mobile"]
    assert pool._current.slots.counts["reused"] == 2  # type: ignore[union-attr]
    nursery.cancel_scope.cancel()


BUSY = """(() => {
  const late = (what) => {
    localStorage.setItem(what, '1');
    sessionStorage.setItem(what, '1');
    document.cookie = what + '=1; max-age=3600; path=/';
  };
  setInterval(() => late('timer'), 0);
  for (const name of ['pagehide', 'unload', 'beforeunload', 'visibilitychange', 'freeze']) {
    addEventListener(name, () => late(name));
  }
  (async () => { for (;;) { try { await fetch('/late'); } catch (e) {} late('fetched'); } })();
  return 'busy';
})()"""
LEFT = """(async () => ({
  cookie: document.cookie,
  local: Object.keys(localStorage),
  session: Object.keys(sessionStorage),
}))()"""


@pytest.mark.browser
async def test_a_page_still_writing_state_when_it_ends_leaves_none(nursery: trio.Nursery) -> None:
    """The page's timers, its requests in flight (answered only after the reset, with a
    cookie) and its pagehide/unload handlers keep writing storage and cookies: nothing of it
    reaches the next page of the same origin in the reused tab."""
    site = StatefulSite()
    _, port = await nursery.start(functools.partial(serve_app, site.app(), "127.0.0.1:0"))
    origin = f"http://127.0.0.1:{port}"
    pool = (await start_browser(nursery, tabs=1, pages_per_context=50)).pool
    async with pool.tab() as tab:
        with tab.session.subscribe("Page.loadEventFired") as loaded:
            await tab.session.call("Page.navigate", url=origin + "/plant")
            await loaded.receive()
        assert await _evaluate(tab, BUSY) == "busy"
        with trio.fail_after(10):
            while site.hits["/late"] == 0:
                await trio.sleep(0.01)
        assert "timer" in await _evaluate(tab, "document.cookie")
    await _settled(pool)
    started = site.hits["/late"]
    site.release.set()
    with trio.fail_after(10):
        while site.answered < started:
            await trio.sleep(0.01)
    spec = RenderSpec(timeout=20, actions=(rr.ExecuteJavascript(script=LEFT),))
    rendered = await render(pool, origin + "/look", spec)
    assert rendered.actions is not None
    assert rendered.actions["javascriptReturns"][0]["value"] == {
        "cookie": "", "local": [], "session": [],
    }  # fmt: skip
    assert site.cookies["/look"] == ""
    slots = pool._current.slots  # type: ignore[union-attr]
    assert slots is not None
    assert slots.counts["reused"] == 1, slots.last_disposed
    nursery.cancel_scope.cancel()
