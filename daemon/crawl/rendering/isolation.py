# Isolated tabs, reused. A fresh browser context per page is isolation by construction, but it
# costs a new tab and a new renderer process per page: several times the time of navigating a tab
# that exists (scripts/bench_render.py prints both floors next to crawld). So a tab (the one page
# target of a browser context of its own) renders up to `pages_per_context` pages, and between two
# pages it is reset, and the reset checked, before it may take the next one:
#
#   the page replaces itself by about:blank (its scripts, timers and requests end; the blank
#   page keeps its origin and renderer process) and, in one call inside that blank page, the
#   origin's local and session storage are cleared (session storage is the tab's own, not the
#   context's, and only a frame of its origin reaches it) and window.name emptied; its history
#   is dropped; the context's cookies and HTTP cache are cleared and its permissions reset; the
#   origins of the documents and workers that ran get Storage's "all" clear (IndexedDB, Cache
#   Storage, service workers, ...) where they use any; the page settings a render changed
#   (touch, locale, request interception) are undone (the others, viewport, user agent and the
#   TLS check, every render sets when they differ from what it needs). Then the
#   context must hold no cookie and no target but the tab, and no origin any quota usage.
#
# What cannot be cleared that way makes the tab "foreign" and its context is disposed instead
# (the per-page guarantee): documents of more than one origin (session storage can only be
# cleared through a live frame), a frame of another host (its storage is partitioned under the
# page's site), a popup or any other page-like target in the context, a document of an unexpected
# scheme, a page that ended in an error or a timeout, a reset call that fails or stalls, a check
# that finds anything left. Resets and disposals run in the background, off the page's critical
# path: the next page takes a tab that is already clean, or opens a new one. Documents and targets
# are seen through `Connection.observe` (every event, none dropped). Not reset: kept-alive
# connections of the context (the next page of the same server may reuse one, as crawld's HTTP
# fetcher does), Chromium's in-memory TLS session and HTTP authentication caches, and the renderer
# process: the context's next page of the same site runs in the last one's (browser_args).
from __future__ import annotations

import contextlib
import functools
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import trio

from daemon.crawl.rendering.cdp import CdpClosed, CdpError, Connection, Session
from daemon.logs import get_logger

log = get_logger("crawl.browser")

__all__ = ["Slot", "Slots", "document_seen", "origin_of", "target_seen"]

RESET_SECONDS = 5.0
ALL = "all"
_OWN_ORIGIN_SCHEMES = ("about", "data", "blob", "javascript")
"""Documents without an origin of their own: opaque (data:) or their creator's (about:blank,
blob:, javascript:), whose origin is counted already."""
_WORKERS = ("service_worker", "shared_worker", "worker")
_BROWSER_OWN = "browser_ui"
"""The browser's own WebUI (chrome:// pages such as the omnibox popup) that Chromium opens in
every context; no page can reach it."""
UNDO: dict[str, tuple[str, dict[str, Any]]] = {
    "touch": ("Emulation.setTouchEmulationEnabled", {"enabled": False}),
    "locale": ("Emulation.setLocaleOverride", {}),
    "fetch": ("Fetch.disable", {}),
}
"""Page settings a render may change (the keys it adds to `Slot.changed`), and their undoing."""


def origin_of(url: str) -> str | None:
    """ "scheme://host[:port]" of an http(s) URL (as `self.origin` says it: no default port);
    None for anything else."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    host = parts.netloc.rsplit("@", 1)[-1].lower()
    default = ":80" if parts.scheme == "http" else ":443"
    return f"{parts.scheme}://{host.removesuffix(default)}"


@dataclass(eq=False)
class Slot:
    """A reusable tab: the page target of a browser context of its own."""

    context_id: str
    target_id: str
    session: Session
    port: int
    """The proxy port its context sends connections to (vetting or stealth)."""
    uses: int = 0
    hosts: set[str] = field(default_factory=set)
    """Hosts of its main-frame documents since the last reset (frames of others are foreign)."""
    origins: set[str] = field(default_factory=set)
    """Origins whose documents or workers ran in it since the last reset."""
    foreign: str = ""
    """Why it cannot be reset ("" while it can)."""
    changed: set[str] = field(default_factory=set)
    """Page settings the last render changed (keys of UNDO)."""
    applied: dict[str, Any] = field(default_factory=dict)
    """Settings every render makes (device metrics, user agent), as last made."""


def document_seen(slot: Slot, event: dict[str, Any]) -> None:
    """Note a `Page.frameNavigated` of the tab's own session: the origin of the committed
    document, or `foreign` for a frame of another host or a document of an unexpected scheme."""
    if event.get("method") != "Page.frameNavigated":
        return
    frame = event.get("params", {}).get("frame", {})
    url = str(frame.get("url", ""))
    origin = origin_of(url)
    if origin is None:
        if urlsplit(url).scheme not in _OWN_ORIGIN_SCHEMES:
            slot.foreign = slot.foreign or f"a document of scheme {urlsplit(url).scheme!r}"
        return
    host = urlsplit(url).hostname or ""
    if not frame.get("parentId"):
        slot.hosts.add(host)
    elif host not in slot.hosts:
        slot.foreign = slot.foreign or f"a frame of {host}"
    slot.origins.add(origin)


def target_seen(slots: dict[str, Slot], event: dict[str, Any]) -> None:
    """Note a browser-level `Target.targetCreated`/`targetInfoChanged`: in a tab's context, a
    worker's origin, or `foreign` for any other target than the tab itself."""
    if event.get("method") not in ("Target.targetCreated", "Target.targetInfoChanged"):
        return
    info = event.get("params", {}).get("targetInfo", {})
    slot = slots.get(str(info.get("browserContextId", "")))
    kind = str(info.get("type", ""))
    if slot is None or info.get("targetId") == slot.target_id or kind == _BROWSER_OWN:
        return
    origin = origin_of(str(info.get("url", "")))
    if kind in _WORKERS and origin is not None:
        slot.origins.add(origin)
    elif kind not in _WORKERS or info.get("url"):
        slot.foreign = slot.foreign or f"a {kind} target"


class Slots:
    """One browser's tabs: idle ones, clean and ready for a page, and every live one."""

    def __init__(self, conn: Connection, *, keep: int, pages_per_context: int) -> None:
        self.conn = conn
        self.keep = keep
        """Most contexts at once (pages, idle tabs and tabs being reset)."""
        self.pages_per_context = pages_per_context
        self.idle: list[Slot] = []
        self.live: dict[str, Slot] = {}
        self.counts: Counter[str] = Counter()
        self.last_disposed = ""
        """Why the last context was disposed rather than reset."""
        self._back = trio.Event()
        self._opening = 0

    async def watch(self) -> None:
        """Start seeing the browser's targets (call once, before the first `take`)."""
        self.conn.observe(None, functools.partial(target_seen, self.live))
        await self.conn.call("Target.setDiscoverTargets", {"discover": True})

    async def prewarm(self, port: int, count: int) -> None:
        """Open `count` tabs ahead of demand (a browser's first pages then skip the renderer's
        start); a failure leaves it to `take`."""

        async def one() -> None:
            try:
                self.idle.append(await self.open(port))
            except (CdpClosed, CdpError):
                pass
            finally:
                self._returned()

        async with trio.open_nursery() as nursery:
            for _ in range(min(count, self.keep)):
                nursery.start_soon(one)

    async def take(self, port: int) -> Slot:
        """A clean tab whose context uses proxy `port`: an idle one, a new one while there are
        fewer than `keep`, else the next one whose reset ends."""
        while True:
            if self.conn.closed.is_set():
                raise CdpClosed("the browser is not running")
            for slot in reversed(self.idle):  # the last given back first: it is warm
                if slot.port == port and not self.conn.is_detached(slot.session.id):
                    self.idle.remove(slot)
                    self.counts["reused" if slot.uses else "prewarmed"] += 1
                    return slot
            if len(self.live) + self._opening < self.keep:
                return await self.open(port)
            if self.idle:  # idle, but for the other proxy (or crashed): make room
                await self.dispose(self.idle[0], lambda: None)
                continue
            with trio.move_on_after(RESET_SECONDS):  # also sees a browser that closed
                await self._back.wait()

    def _returned(self) -> None:
        self._back.set()
        self._back = trio.Event()

    async def open(self, port: int) -> Slot:
        self._opening += 1
        try:
            return await self._open(port)
        finally:
            self._opening -= 1

    async def _open(self, port: int) -> Slot:
        conn = self.conn
        context_id = (
            await conn.call(
                "Target.createBrowserContext",
                {
                    "disposeOnDetach": True,
                    "proxyServer": f"socks5://127.0.0.1:{port}",
                    "proxyBypassList": "<-loopback>",
                },
            )
        )["browserContextId"]
        try:
            target = await conn.call(
                "Target.createTarget", {"url": "about:blank", "browserContextId": context_id}
            )
            attached = await conn.call(
                "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
            )
            session = Session(conn, attached["sessionId"], target["targetId"])
            slot = Slot(context_id, session.target_id, session, port)
            self.live[context_id] = slot
            conn.observe(session.id, functools.partial(document_seen, slot))
            await session.call("Page.enable")
            await session.call("Network.enable")
        except BaseException:
            with (
                trio.CancelScope(shield=True),
                trio.move_on_after(RESET_SECONDS),
                contextlib.suppress(CdpClosed, CdpError),
            ):
                await self._dispose_context(context_id)
            raise
        self.counts["opened"] += 1
        return slot

    async def give_back(self, slot: Slot, ok: bool, on_stall: Callable[[], None]) -> None:
        """After a page: reset the tab and keep it idle, or dispose of its context (`ok`: the
        page ended without an error). Runs in the background; `on_stall` when the browser
        does not answer in time (it is then killed)."""
        slot.uses += 1
        why = "" if ok else "the page failed"
        if not why and slot.uses >= self.pages_per_context:
            why = "pages_per_context"
        if not why:
            with trio.move_on_after(RESET_SECONDS):
                try:
                    why = await reset(self.conn, slot) or ""
                except CdpError as exc:
                    why = f"reset failed: {exc.method}: {exc.message}"
                except (CdpClosed, trio.EndOfChannel):
                    why = "the tab or the browser is gone"
                else:
                    if not why:
                        self.idle.append(slot)
                        self.counts["reset"] += 1
                        self._returned()
                        return
            why = why or "reset stalled"
        self.counts["disposed"] += 1
        self.last_disposed = why
        log.debug("tab context disposed", why=why, uses=slot.uses)
        await self.dispose(slot, on_stall)

    async def dispose(self, slot: Slot, on_stall: Callable[[], None]) -> None:
        self.live.pop(slot.context_id, None)
        if slot in self.idle:
            self.idle.remove(slot)
        self.conn.forget(slot.session.id)
        self._returned()
        if self.conn.closed.is_set():
            return
        with trio.CancelScope(shield=True):
            with trio.move_on_after(RESET_SECONDS) as scope:
                with contextlib.suppress(CdpClosed, CdpError):
                    await self._dispose_context(slot.context_id)
            if scope.cancelled_caught:
                on_stall()

    async def _dispose_context(self, context_id: str) -> None:
        await self.conn.call("Target.disposeBrowserContext", {"browserContextId": context_id})


async def _all(*calls: Callable[[], Awaitable[Any]]) -> list[Any]:
    """Run `calls` at once (the browser answers them in turn without waiting for each)."""
    results: list[Any] = [None] * len(calls)
    failed: list[CdpError | CdpClosed] = []

    async def one(index: int) -> None:
        try:
            results[index] = await calls[index]()
        except (CdpError, CdpClosed) as exc:
            failed.append(exc)

    async with trio.open_nursery() as nursery:
        for index in range(len(calls)):
            nursery.start_soon(one, index)
    if failed:
        raise failed[0]
    return results


async def reset(conn: Connection, slot: Slot) -> str | None:
    """Clear what the last page left in the tab's context and check it is gone: None when
    clean, else why not (the context must then be disposed)."""
    if slot.foreign:
        return slot.foreign
    if len(slot.origins) > 1:  # session storage is cleared through a live frame of its origin
        return "documents of several origins"
    call = slot.session.call
    origins = sorted(slot.origins)
    with slot.session.subscribe("Page.frameNavigated", "Page.loadEventFired") as events:
        # Replaced from inside: the blank page keeps the origin (and the renderer process; a
        # navigation from the browser would swap both), so its frame reaches the storage. The
        # load awaited is the blank page's (a navigation of the page's own still loading could
        # fire one first), so that what runs below runs there and not in a page's script.
        await call("Runtime.evaluate", expression="location.replace('about:blank')")
        blank = False
        async for event in events:
            if event["method"] == "Page.frameNavigated":
                frame = event.get("params", {}).get("frame", {})
                if not frame.get("parentId"):
                    blank = frame.get("url") == "about:blank"
            elif blank:
                break
    # One call for the blank page's own storage (its origin's, no other script runs in it) and
    # window.name; a page that denied itself storage (an opaque origin) throws: disposed.
    answer = await call(
        "Runtime.evaluate", expression=_CLEAR % ("true" if origins else "false"),
        returnByValue=True,
    )  # fmt: skip
    if "exceptionDetails" in answer:
        return "web storage not reachable"
    left = answer.get("result", {}).get("value")
    if left != [origins[0] if origins else None, 0]:
        return f"web storage or window.name left: {left!r}"
    context = {"browserContextId": slot.context_id}
    cookies, *usages = await _all(
        functools.partial(conn.call, "Storage.getCookies", context),
        *(functools.partial(call, "Storage.getUsageAndQuota", origin=o) for o in origins),
    )
    used = [o for o, usage in zip(origins, usages, strict=True) if usage.get("usage")]
    clears: list[Callable[[], Awaitable[Any]]] = [
        functools.partial(call, "Network.clearBrowserCache"),
        functools.partial(conn.call, "Browser.resetPermissions", context),
        functools.partial(call, "Page.resetNavigationHistory"),
        *(functools.partial(call, UNDO[key][0], **UNDO[key][1]) for key in sorted(slot.changed)),
        *(
            functools.partial(call, "Storage.clearDataForOrigin", origin=origin, storageTypes=ALL)
            for origin in used
        ),
    ]
    if cookies.get("cookies"):
        clears.append(functools.partial(call, "Network.clearBrowserCookies"))
    await _all(*clears)
    if slot.foreign:  # something ran until the page was replaced
        return slot.foreign
    return await _check(conn, slot, used, bool(cookies.get("cookies")))


_CLEAR = """(() => {
  window.name = '';
  if (!%s) return [null, window.name.length];
  localStorage.clear();
  sessionStorage.clear();
  return [self.origin, localStorage.length + sessionStorage.length + window.name.length];
})()"""
"""(has the page an origin) -> [the blank page's origin, what is left]."""


async def _check(conn: Connection, slot: Slot, cleared: list[str], cookies: bool) -> str | None:
    """After the clears: no target but the tab (a worker could write anew), and what was
    cleared (`cleared` origins' storage, the `cookies`) gone."""
    checks: list[Callable[[], Awaitable[Any]]] = [
        functools.partial(conn.call, "Target.getTargets"),
        functools.partial(conn.call, "Storage.getCookies", {"browserContextId": slot.context_id}),
        *(
            functools.partial(slot.session.call, "Storage.getUsageAndQuota", origin=origin)
            for origin in cleared
        ),
    ]
    if not cookies and not cleared:
        checks = checks[:1]
    targets, *rest = await _all(*checks)
    others = [
        t for t in targets.get("targetInfos", [])
        if t.get("browserContextId") == slot.context_id
        and t.get("targetId") != slot.target_id
        and t.get("type") != _BROWSER_OWN
    ]  # fmt: skip
    if others:
        return f"a {others[0].get('type', '?')} target left"
    if rest and rest[0].get("cookies"):
        return "cookies left"
    for origin, usage in zip(cleared, rest[1:], strict=True):
        if usage.get("usage"):
            return f"storage of {origin} left"
    slot.origins.clear()
    slot.hosts.clear()
    slot.changed.clear()
    return None
