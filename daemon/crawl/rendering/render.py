# Rendering one page in a tab of the supervised browser: set the device, languages and headers,
# navigate, wait for the load and a quiet network, `waitFor`, run the actions in order, take the
# screenshot, and read the DOM as HTML. The result is a FetchResult (the rendered HTML as its
# body) so the same document conversion as plain HTTP turns it into a Firecrawl document.
#
# Everything runs under the page's one deadline (`timeout`), counted from the moment the page has
# a clean tab: the wait for one (pages ahead of it, a reset ending, the browser starting) is the
# pool's queue, as the wait for an HTTP slot is not part of a fetch's timeout. When the deadline
# passes, the render is cancelled and the tab's browser context is disposed, which kills
# whatever the page was doing.
# A failed action raises RenderError("SCRAPE_ACTION_ERROR") naming the action; a browser that
# dies mid-page raises RenderError("SCRAPE_BROWSER_ERROR" family, see `BROWSER_GONE`).
# Extra request headers are added only to requests for the page's own origin (the Fetch domain),
# never to third-party hosts the page references.
from __future__ import annotations

import base64
import contextlib
import math
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import msgspec
import trio

from daemon.crawl.fetching.fetch import FetchResult
from daemon.crawl.rendering import render_rules as rr
from daemon.crawl.rendering.browser import BrowserPool, BrowserUnavailable, Tab
from daemon.crawl.rendering.cdp import CdpClosed, CdpError, Session

__all__ = ["NotRenderable", "RenderError", "RenderSpec", "Rendered", "render"]

BROWSER_GONE = "SCRAPE_ALL_ENGINES_FAILED"
"""Firecrawl's code when no engine could produce the page: the browser crashed or is down."""
QUIET_MS = 100
QUIET_CAP_MS = 2000
POLL_SECONDS = 0.1


class RenderError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class NotRenderable(Exception):
    """The URL answered with something that is not a web page (a PDF, a download)."""

    def __init__(self, content_type: str) -> None:
        super().__init__(content_type)
        self.content_type = content_type


class RenderSpec(msgspec.Struct, frozen=True):
    timeout: float
    wait_for_ms: int = 0
    actions: tuple[rr.Action, ...] = ()
    screenshot: rr.ScreenshotSpec | None = None
    mobile: bool = False
    headers: dict[str, str] = {}
    skip_tls_verification: bool = False
    languages: tuple[str, ...] = ()
    max_screenshot_height: int = 16384
    stealth: bool = False
    """Through the stealth proxy pool (BrowserPool.tab)."""


@dataclass
class Rendered:
    result: FetchResult
    screenshot: str | None = None
    actions: dict[str, list[Any]] | None = None
    warnings: list[str] = field(default_factory=list)


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


class _Network:
    """Requests in flight and the main document's response, from Network events."""

    def __init__(self, frame_id: str) -> None:
        self.frame_id = frame_id
        self.in_flight: set[str] = set()
        self.quiet_since = trio.current_time()
        self.status = 0
        self.headers: dict[str, str] = {}
        self.mime = ""
        self.changed = trio.Event()

    def feed(self, event: dict[str, Any]) -> None:
        method, params = event["method"], event.get("params", {})
        request_id = params.get("requestId", "")
        if method == "Network.requestWillBeSent":
            self.in_flight.add(request_id)
        elif method in ("Network.loadingFinished", "Network.loadingFailed"):
            self.in_flight.discard(request_id)
            if not self.in_flight:
                self.quiet_since = trio.current_time()
        elif method == "Network.responseReceived":
            response = params.get("response", {})
            if params.get("type") == "Document" and params.get("frameId") == self.frame_id:
                self.status = int(response.get("status", 0))
                self.headers = {
                    str(k).lower(): str(v) for k, v in response.get("headers", {}).items()
                }
                self.mime = str(response.get("mimeType", ""))
        self.changed.set()
        self.changed = trio.Event()

    async def quiet(self, quiet_ms: int = QUIET_MS, cap_ms: int = QUIET_CAP_MS) -> None:
        """Until no request has been in flight for `quiet_ms`, at most `cap_ms`."""
        with trio.move_on_after(cap_ms / 1000):
            while True:
                if not self.in_flight:
                    left = self.quiet_since + quiet_ms / 1000 - trio.current_time()
                    if left <= 0:
                        return
                    with trio.move_on_after(left):
                        await self.changed.wait()
                else:
                    await self.changed.wait()


async def _evaluate(session: Session, expression: str, *, user_gesture: bool = False) -> Any:
    answer = await session.call(
        "Runtime.evaluate",
        expression=expression,
        awaitPromise=True,
        returnByValue=True,
        userGesture=user_gesture,
    )
    if "exceptionDetails" in answer:
        details = answer["exceptionDetails"]
        text = details.get("exception", {}).get("description") or details.get("text", "error")
        raise _ScriptFailed(str(text).splitlines()[0][:300])
    return answer.get("result", {}).get("value")


class _ScriptFailed(Exception):
    pass


def _js(value: Any) -> str:
    return msgspec.json.encode(value).decode()


async def render(pool: BrowserPool, url: str, spec: RenderSpec) -> Rendered:
    """Render `url`; RenderError with Firecrawl's code, NotRenderable for non-pages."""
    try:
        async with pool.tab(stealth=spec.stealth) as tab:
            with trio.fail_after(spec.timeout):
                return await _render(tab, url, spec)
    except trio.TooSlowError:
        raise RenderError(
            "SCRAPE_TIMEOUT", f"the page did not finish rendering within {spec.timeout:g} s"
        ) from None
    except BrowserUnavailable as exc:
        raise RenderError(BROWSER_GONE, f"the browser is not available: {exc}") from None
    except CdpClosed:
        raise RenderError(BROWSER_GONE, "the browser crashed while rendering the page") from None
    except CdpError as exc:
        raise RenderError("SCRAPE_SITE_ERROR", f"the browser refused: {exc.message}") from None


async def _render(tab: Tab, url: str, spec: RenderSpec) -> Rendered:
    session = tab.session
    desktop_ua = tab.browser.user_agent
    width, height = rr.MOBILE_VIEWPORT if spec.mobile else rr.DESKTOP_VIEWPORT
    if spec.screenshot is not None and spec.screenshot.viewport is not None:
        width, height = spec.screenshot.viewport
    scale = rr.MOBILE_SCALE if spec.mobile else 1.0
    # A reused tab keeps these (and the TLS check) from its last page: sent only when they differ.
    metrics = {"width": width, "height": height, "deviceScaleFactor": scale, "mobile": spec.mobile}
    if tab.applied.get("metrics") != metrics:
        await session.call("Emulation.setDeviceMetricsOverride", **metrics)
        tab.applied["metrics"] = metrics
    if any(isinstance(a, rr.Screenshot) and a.viewport for a in spec.actions):
        del tab.applied["metrics"]  # an action will change them
    if spec.mobile:
        tab.changed.add("touch")
        await session.call("Emulation.setTouchEmulationEnabled", enabled=True, maxTouchPoints=5)
    agent: dict[str, Any] = {
        "userAgent": rr.mobile_user_agent(desktop_ua) if spec.mobile else desktop_ua
    }
    if spec.languages:
        agent["acceptLanguage"] = rr.accept_language(list(spec.languages))
        tab.changed.add("locale")
        await session.call("Emulation.setLocaleOverride", locale=spec.languages[0])
    if tab.applied.get("agent") != agent:
        await session.call("Emulation.setUserAgentOverride", **agent)
        tab.applied["agent"] = agent
    if tab.applied.get("tls", False) != spec.skip_tls_verification:
        await session.call("Security.setIgnoreCertificateErrors", ignore=spec.skip_tls_verification)
        tab.applied["tls"] = spec.skip_tls_verification
    if spec.headers:
        tab.changed.add("fetch")
    network = _Network(session.target_id)
    failure: Exception | None = None
    async with trio.open_nursery() as nursery:
        with session.subscribe(
            "Network.requestWillBeSent", "Network.loadingFinished", "Network.loadingFailed",
            "Network.responseReceived", "Page.loadEventFired", "Fetch.requestPaused",
        ) as events:  # fmt: skip
            loaded = trio.Event()

            async def pump() -> None:
                async for event in events:
                    if event["method"] == "Page.loadEventFired":
                        loaded.set()
                    elif event["method"] == "Fetch.requestPaused":
                        nursery.start_soon(_add_headers, session, event["params"], spec.headers)
                    else:
                        network.feed(event)

            nursery.start_soon(pump)

            async def browser_gone() -> None:
                # A page waiting for an event (not a call) would not notice the crash.
                nonlocal failure
                await session.conn.closed.wait()
                failure = CdpClosed("the browser exited")
                nursery.cancel_scope.cancel()

            nursery.start_soon(browser_gone)
            try:
                html, final_url, screenshot, results = await _load_and_act(
                    session, url, spec, network, loaded
                )
            except Exception as exc:  # raised below, outside the nursery (no exception group)
                failure = failure or exc
            nursery.cancel_scope.cancel()
    if failure is not None:
        raise failure
    content_type = network.headers.get("content-type") or "text/html; charset=utf-8"
    result = FetchResult(
        requested_url=url,
        url=str(final_url),
        status_code=network.status or 200,
        content_type=content_type,
        headers=network.headers,
        body=str(html).encode("utf-8"),
        proxy_used="stealth" if spec.stealth else "basic",
    )
    return Rendered(result, screenshot, results if spec.actions else None)


async def _load_and_act(
    session: Session, url: str, spec: RenderSpec, network: _Network, loaded: trio.Event
) -> tuple[Any, Any, str | None, dict[str, list[Any]]]:
    """Navigate, wait, act, shoot and read the page: (html, final URL, screenshot, results)."""
    if spec.headers:
        pattern = _origin(url) + "/*"
        await session.call(
            "Fetch.enable", patterns=[{"urlPattern": pattern, "requestStage": "Request"}]
        )
    navigation = await session.call("Page.navigate", url=url)
    if navigation.get("isDownload"):
        raise NotRenderable(network.mime or "application/octet-stream")
    error = navigation.get("errorText")
    if error:
        raise RenderError(
            rr.navigation_error_code(error), f"the browser could not load the page: {error}"
        )
    await loaded.wait()
    await network.quiet()
    if network.mime and (
        network.mime == "application/pdf"
        or not network.mime.startswith(("text/", "application/xhtml"))
    ):
        raise NotRenderable(network.mime)
    if spec.wait_for_ms:
        await trio.sleep(spec.wait_for_ms / 1000)
    results: dict[str, list[Any]] = {
        "screenshots": [], "scrapes": [], "javascriptReturns": [], "pdfs": [],
    }  # fmt: skip
    deadline = trio.current_effective_deadline()
    for index, action in enumerate(spec.actions):
        try:
            await _act(session, network, action, results, spec, deadline)
        except (_ScriptFailed, _ActionFailed) as exc:
            name = action.__struct_config__.tag
            raise RenderError(
                "SCRAPE_ACTION_ERROR", f"action {index} ({name}) failed: {exc}"
            ) from None
    screenshot = None
    if spec.screenshot is not None:
        screenshot = await _screenshot(
            session, spec.screenshot.full_page, spec.screenshot.quality,
            spec.max_screenshot_height,
        )  # fmt: skip
    html, final_url = await _evaluate(session, _HTML_AND_URL)
    return html, final_url, screenshot, results


_HTML = (
    "(document.doctype ? new XMLSerializer().serializeToString(document.doctype) : '')"
    " + document.documentElement.outerHTML"
)
_HTML_AND_URL = f"[{_HTML}, location.href]"


async def _add_headers(session: Session, paused: dict[str, Any], extra: dict[str, str]) -> None:
    request = paused.get("request", {})
    headers = {str(k): str(v) for k, v in request.get("headers", {}).items()}
    lowered = {k.lower() for k in extra}
    merged = [{"name": k, "value": v} for k, v in headers.items() if k.lower() not in lowered]
    merged += [{"name": k, "value": v} for k, v in extra.items()]
    with contextlib.suppress(CdpError, CdpClosed):
        await session.call("Fetch.continueRequest", requestId=paused["requestId"], headers=merged)


class _ActionFailed(Exception):
    pass


async def _screenshot(
    session: Session, full_page: bool, quality: int | None, max_height: int
) -> str:
    params: dict[str, Any] = {"format": "png"}
    kind = "png"
    if quality is not None:
        params = {"format": "jpeg", "quality": quality}
        kind = "jpeg"
    if full_page:
        metrics = await session.call("Page.getLayoutMetrics")
        content = metrics.get("cssContentSize") or metrics.get("contentSize", {})
        view = metrics.get("cssLayoutViewport") or metrics.get("layoutViewport", {})
        width = math.ceil(max(float(view.get("clientWidth", 0)), 1.0))
        height = math.ceil(min(float(content.get("height", 0)), float(max_height)))
        params["clip"] = {"x": 0, "y": 0, "width": width, "height": max(height, 1), "scale": 1}
        params["captureBeyondViewport"] = True
    shot = await session.call("Page.captureScreenshot", **params)
    return f"data:image/{kind};base64,{shot['data']}"


async def _wait_selector(session: Session, selector: str, deadline: float) -> None:
    # Give up a moment before the page's deadline, however slowly the browser answers a probe
    # (a busy machine), so that the failure is the action's error, not the page's timeout.
    until = min(deadline - 0.5, trio.current_time() + 30.0)
    probe = f"document.querySelector({_js(selector)}) !== null"
    with trio.move_on_at(until):
        while not await _evaluate(session, probe):
            await trio.sleep(POLL_SECONDS)
        return
    raise _ActionFailed(f"no element matches {selector!r}")


_POINTS = """(() => {
  const all = Array.from(document.querySelectorAll(%s));
  return all.slice(0, %d).map((el) => {
    el.scrollIntoView({block: 'center', inline: 'center'});
    const r = el.getBoundingClientRect();
    return [r.left + r.width / 2, r.top + r.height / 2];
  });
})()"""


async def _click(session: Session, selector: str, every: bool) -> None:
    points = await _evaluate(session, _POINTS % (_js(selector), 1000 if every else 1))
    if not points:
        raise _ActionFailed(f"no element matches {selector!r}")
    for x, y in points:
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            extra = {} if kind == "mouseMoved" else {"button": "left", "clickCount": 1}
            await session.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, **extra)


async def _press(session: Session, key: str) -> None:
    if key in rr.KEYS:
        code, vk, text = rr.KEYS[key]
        name = "Space" if key == " " else key
    else:
        code, vk, text, name = "", ord(key.upper()), key, key
    name = " " if name == "Space" else name
    down: dict[str, Any] = {
        "type": "keyDown",
        "key": name,
        "code": code,
        "windowsVirtualKeyCode": vk,
    }
    if text:
        down["text"] = text
        down["unmodifiedText"] = text
    await session.call("Input.dispatchKeyEvent", **down)
    await session.call(
        "Input.dispatchKeyEvent", type="keyUp", key=name, code=code, windowsVirtualKeyCode=vk
    )


_SCROLL = """(() => {
  const sel = %s;
  const el = sel === null ? (document.scrollingElement || document.documentElement)
                          : document.querySelector(sel);
  if (!el) return false;
  const step = sel === null ? window.innerHeight : el.clientHeight;
  el.scrollBy(0, %s * step);
  return true;
})()"""


async def _act(
    session: Session,
    network: _Network,
    action: rr.Action,
    results: dict[str, list[Any]],
    spec: RenderSpec,
    deadline: float,
) -> None:
    if isinstance(action, rr.Wait):
        if action.milliseconds is not None:
            await trio.sleep(action.milliseconds / 1000)
        else:
            assert action.selector is not None
            await _wait_selector(session, action.selector, deadline)
    elif isinstance(action, rr.Click):
        await _click(session, action.selector, action.all)
        await network.quiet(cap_ms=1000)
    elif isinstance(action, rr.Write):
        await session.call("Input.insertText", text=action.text)
    elif isinstance(action, rr.Press):
        await _press(session, action.key)
        await network.quiet(cap_ms=1000)
    elif isinstance(action, rr.Scroll):
        sign = "-1" if action.direction == "up" else "1"
        if not await _evaluate(session, _SCROLL % (_js(action.selector), sign)):
            raise _ActionFailed(f"no element matches {action.selector!r}")
        await network.quiet(cap_ms=1000)
    elif isinstance(action, rr.Screenshot):
        if action.viewport is not None:
            await session.call(
                "Emulation.setDeviceMetricsOverride",
                width=action.viewport["width"], height=action.viewport["height"],
                deviceScaleFactor=rr.MOBILE_SCALE if spec.mobile else 1.0, mobile=spec.mobile,
            )  # fmt: skip
        results["screenshots"].append(
            await _screenshot(session, action.fullPage, action.quality, spec.max_screenshot_height)
        )
    elif isinstance(action, rr.Scrape):
        html = await _evaluate(session, _HTML)
        results["scrapes"].append({"url": await _evaluate(session, "location.href"), "html": html})
    elif isinstance(action, rr.ExecuteJavascript):
        answer = await session.call(
            "Runtime.evaluate", expression=action.script, awaitPromise=True,
            returnByValue=True, userGesture=True,
        )  # fmt: skip
        if "exceptionDetails" in answer:
            details = answer["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text", "")
            raise _ScriptFailed(str(text).splitlines()[0][:300] if text else "script error")
        value = answer.get("result", {})
        results["javascriptReturns"].append(
            {"type": value.get("type", "undefined"), "value": value.get("value")}
        )
    elif isinstance(action, rr.Pdf):
        width, height = rr.PAPER_INCHES[action.format]
        printed = await session.call(
            "Page.printToPDF", landscape=action.landscape, scale=action.scale,
            paperWidth=width, paperHeight=height, printBackground=True,
        )  # fmt: skip
        results["pdfs"].append(f"data:application/pdf;base64,{printed['data']}")
    else:  # pragma: no cover - the union is closed
        raise _ActionFailed("unknown action")


def decode_data_uri(uri: str) -> bytes:
    """The bytes of a `data:...;base64,` URI (tests and benchmarks)."""
    return base64.b64decode(uri.split(",", 1)[1])
