"""Rendering through the engine (PageMaker) against the local site's script-built pages
(daemon/fakes/js_site.py), with a real Chromium behind the vetting proxy."""

from __future__ import annotations

import contextlib
import functools
import io
import struct
import zlib
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
import trio

from daemon.crawl.config import CrawlConfig
from daemon.crawl.fetching.fetch import FetchError
from daemon.crawl.options.models import ScrapeOptions, check_scrape_options
from daemon.crawl.rendering.render import decode_data_uri
from daemon.crawl.runs.engine import Engine, new_engine
from daemon.fakes import js_site
from daemon.fakes.site import SiteSim, host_map_resolver, serve_site
from tests.crawl.conftest import RunningBrowser, browser_config, start_browser

pytestmark = pytest.mark.browser


@pytest.fixture
async def site(nursery: trio.Nursery) -> AsyncIterator[SiteSim]:
    sim = SiteSim(pages=20, slow_seconds=30.0)
    stop = trio.Event()
    await nursery.start(functools.partial(serve_site, sim, shutdown=stop))
    yield sim
    stop.set()


@pytest.fixture
async def running(nursery: trio.Nursery) -> RunningBrowser:
    return await start_browser(nursery)


def make_engine(running: RunningBrowser, **overrides: Any) -> Engine:
    from daemon.config_types import Duration

    fields: dict[str, Any] = {
        "allow_cidrs": ["127.0.0.0/8"],
        "page_timeout": Duration(15),
        "browser": browser_config(),
    }
    fields.update(overrides)
    config = CrawlConfig(**fields)
    return new_engine(config, host_map_resolver(), running.pool)


@pytest.fixture
def engine(running: RunningBrowser) -> Engine:
    return make_engine(running)


async def scrape(engine: Engine, url: str, **options: Any) -> dict[str, Any]:
    opts = msgspec.convert(options, ScrapeOptions)
    problems, _ = check_scrape_options(opts, "$", browser=True)
    assert problems == []
    produced = await engine.maker.produce(url, engine.plan(opts))
    return produced.document


# -- engine choice ----------------------------------------------------------------------------


async def test_plain_page_stays_on_http(site: SiteSim, engine: Engine) -> None:
    doc = await scrape(engine, site.url("/about"))
    assert doc["metadata"]["engine"] == "http" and "About this site" in doc["markdown"]
    assert engine.maker.renders["auto"] == 0


async def test_auto_renders_an_app_shell_filled_by_fetch(site: SiteSim, engine: Engine) -> None:
    doc = await scrape(engine, site.url("/js/fetch"))
    assert doc["metadata"]["engine"] == "browser"
    assert doc["metadata"]["renderReason"] == "app-root"
    for item in js_site.FETCHED_ITEMS:
        assert item in doc["markdown"]
    assert site.counts["/js/data.json"] == 1


async def test_auto_renders_a_noscript_page(site: SiteSim, engine: Engine) -> None:
    doc = await scrape(engine, site.url("/js/noscript"))
    assert doc["metadata"]["renderReason"] == "noscript"
    assert "Made by a script." in doc["markdown"]


async def test_render_never_leaves_script_pages_as_served(
    site: SiteSim, running: RunningBrowser
) -> None:
    engine = make_engine(running, render="never")
    doc = await scrape(engine, site.url("/js/fetch"))
    assert doc["metadata"]["engine"] == "http"
    assert js_site.FETCHED_ITEMS[0] not in doc["markdown"]


async def test_render_always_renders_plain_pages(site: SiteSim, running: RunningBrowser) -> None:
    engine = make_engine(running, render="always")
    doc = await scrape(engine, site.url("/about"))
    assert doc["metadata"]["engine"] == "browser" and "About this site" in doc["markdown"]


async def test_client_routed_page(site: SiteSim, engine: Engine) -> None:
    doc = await scrape(engine, site.url("/js/app/pricing"))
    assert "Route: /pricing" in doc["markdown"]
    doc = await scrape(
        engine, site.url("/js/app"), actions=[{"type": "click", "selector": "#to-about"}]
    )
    assert "Route: /about" in doc["markdown"]
    assert doc["metadata"]["url"].endswith("/js/app/about")


# -- waits and actions -------------------------------------------------------------------------


async def test_wait_for_sees_content_inserted_after_a_delay(site: SiteSim, engine: Engine) -> None:
    doc = await scrape(engine, site.url("/js/delayed"), waitFor=1000)
    assert js_site.DELAYED_TEXT in doc["markdown"]
    doc = await scrape(
        engine, site.url("/js/delayed"), actions=[{"type": "wait", "selector": "#late"}]
    )
    assert js_site.DELAYED_TEXT in doc["markdown"]


async def test_click_reveals_text(site: SiteSim, engine: Engine) -> None:
    before = await scrape(engine, site.url("/js/button"), waitFor=1)
    assert js_site.REVEALED_TEXT not in before["markdown"]
    doc = await scrape(
        engine, site.url("/js/button"), actions=[{"type": "click", "selector": "#reveal"}]
    )
    assert js_site.REVEALED_TEXT in doc["markdown"]


async def test_infinite_list_needs_scrolling(site: SiteSim, engine: Engine) -> None:
    doc = await scrape(engine, site.url("/js/infinite"), waitFor=1)
    assert "Item 9" in doc["markdown"] and "Item 10" not in doc["markdown"]
    scrolls = [{"type": "scroll", "direction": "down"}, {"type": "wait", "milliseconds": 100}] * 6
    doc = await scrape(engine, site.url("/js/infinite"), actions=scrolls)
    assert "Item 29" in doc["markdown"]


async def test_form_needs_write_and_press(site: SiteSim, engine: Engine) -> None:
    actions = [
        {"type": "click", "selector": "#q"},
        {"type": "write", "text": "chromium"},
        {"type": "press", "key": "Enter"},
        {"type": "wait", "selector": "#results:not(:empty)"},
    ]
    doc = await scrape(engine, site.url("/js/form"), actions=actions)
    assert "Results for chromium" in doc["markdown"]


async def test_lazy_images_load_when_scrolled_into_view(site: SiteSim, engine: Engine) -> None:
    doc = await scrape(engine, site.url("/js/lazy"), waitFor=1, formats=["html"])
    assert f'src="{site.url("/files/image.png?k=2")}"' not in doc["html"]
    assert site.counts["/files/image.png?k=2"] == 0
    actions = [{"type": "scroll"}, {"type": "wait", "milliseconds": 100}] * 5
    doc = await scrape(engine, site.url("/js/lazy"), actions=actions, formats=["html"])
    for k in range(3):
        assert f'src="{site.url(f"/files/image.png?k={k}")}"' in doc["html"]
    assert site.counts["/files/image.png?k=2"] == 1


async def test_action_results_in_firecrawl_shape(site: SiteSim, engine: Engine) -> None:
    actions = [
        {"type": "executeJavascript", "script": "document.title + ' ' + (6 * 7)"},
        {"type": "executeJavascript", "script": "Promise.resolve({a: [1, 2]})"},
        {"type": "scrape"},
        {"type": "screenshot"},
        {"type": "pdf", "format": "A4"},
    ]
    doc = await scrape(engine, site.url("/js/fetch"), actions=actions)
    results = doc["actions"]
    assert results["javascriptReturns"] == [
        {"type": "string", "value": "Fetched 42"},
        {"type": "object", "value": {"a": [1, 2]}},
    ]
    assert results["scrapes"][0]["url"] == site.url("/js/fetch")
    assert js_site.FETCHED_ITEMS[0] in results["scrapes"][0]["html"]
    assert results["screenshots"][0].startswith("data:image/png;base64,")
    assert decode_data_uri(results["pdfs"][0]).startswith(b"%PDF-")


async def test_failed_action_fails_the_page_with_firecrawl_code(
    site: SiteSim, engine: Engine
) -> None:
    with pytest.raises(FetchError) as info:
        await scrape(
            engine, site.url("/js/button"), timeout=3000,
            actions=[{"type": "wait", "selector": "#never"}],
        )  # fmt: skip
    assert info.value.code == "SCRAPE_ACTION_ERROR"
    assert "action 0 (wait)" in info.value.message
    with pytest.raises(FetchError) as info:
        await scrape(engine, site.url("/js/button"), actions=[{"type": "click", "selector": "#x"}])
    assert info.value.code == "SCRAPE_ACTION_ERROR" and "click" in info.value.message
    with pytest.raises(FetchError) as info:
        await scrape(
            engine, site.url("/js/button"),
            actions=[{"type": "executeJavascript", "script": "throw new Error('boom')"}],
        )  # fmt: skip
    assert info.value.code == "SCRAPE_ACTION_ERROR" and "boom" in info.value.message


async def test_hung_page_is_killed_at_its_deadline(
    site: SiteSim, engine: Engine, running: RunningBrowser
) -> None:
    start = trio.current_time()
    with pytest.raises(FetchError) as info:
        await scrape(engine, site.url("/js/hang"), timeout=2000, waitFor=1)
    assert info.value.code == "SCRAPE_TIMEOUT"
    assert trio.current_time() - start < 8
    doc = await scrape(engine, site.url("/js/button"), waitFor=1)  # the browser still serves
    assert "Show more" in doc["markdown"]
    assert running.pool.status()["tabs_busy"] == 0


# -- devices, languages, headers ----------------------------------------------------------------


async def test_mobile_languages_and_headers(site: SiteSim, engine: Engine) -> None:
    script = "JSON.stringify([screen.width, navigator.userAgent, navigator.languages, 'ontouchstart' in window])"
    doc = await scrape(
        engine, site.url("/js/button"), mobile=True,
        location={"languages": ["de-DE", "fr"]},
        actions=[{"type": "executeJavascript", "script": script}],
    )  # fmt: skip
    width, agent, languages, touch = msgspec.json.decode(
        doc["actions"]["javascriptReturns"][0]["value"]
    )
    assert width == 412 and "Mobile" in agent and "Headless" not in agent and touch
    assert languages[0] == "de-DE"


async def test_headers_reach_only_the_pages_origin(site: SiteSim, engine: Engine) -> None:
    other = site.url("/files/image.png?third-party", host="blog.site.test")
    site.files["/js/xorigin"] = (
        (
            f'<html><body><div id="root"></div><img src="{other}"><script>'
            "fetch('/js/data.json').then(r => r.json()).then(d =>"
            " { document.getElementById('root').textContent = d.items[0]; });</script></body></html>"
        ).encode(),
        "text/html",
    )
    doc = await scrape(engine, site.url("/js/xorigin"), headers={"X-Token": "t0k"}, waitFor=1)
    assert js_site.FETCHED_ITEMS[0] in doc["markdown"]
    assert site.headers_by_path["site.test /js/xorigin"]["x-token"] == "t0k"
    assert site.headers_by_path["site.test /js/data.json"]["x-token"] == "t0k"
    assert "x-token" not in site.headers_by_path["blog.site.test /files/image.png?third-party"]


# -- screenshots ----------------------------------------------------------------------------


def png_size_and_pixel(data: bytes, x: int, y: int) -> tuple[int, int, tuple[int, int, int]]:
    """(width, height, RGB at x, y) of a PNG (8-bit RGB/RGBA, what Chromium writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, []
    width = height = 0
    color_type = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color_type = struct.unpack(">IIBB", body[:10])
            assert depth == 8
        elif kind == b"IDAT":
            chunks.append(body)
        pos += 12 + length
    channels = {2: 3, 6: 4}[color_type]
    raw = io.BytesIO(zlib.decompress(b"".join(chunks)))
    stride = width * channels
    previous = bytearray(stride)
    for _row in range(y + 1):
        kind = raw.read(1)[0]
        line = bytearray(raw.read(stride))
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            corner = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                pred = left if pa <= pb and pa <= pc else up if pb <= pc else corner
                line[i] = (line[i] + pred) & 0xFF
        previous = line
    px = previous[x * channels : x * channels + 3]
    return width, height, (px[0], px[1], px[2])


async def test_screenshots_are_images_of_the_page(site: SiteSim, engine: Engine) -> None:
    doc = await scrape(engine, site.url("/js/colors"), formats=["screenshot"])
    assert doc["screenshot"].startswith("data:image/png;base64,")
    width, height, red = png_size_and_pixel(decode_data_uri(doc["screenshot"]), 50, 50)
    assert (width, height) == (1920, 1080) and red == (255, 0, 0)
    _, _, blue = png_size_and_pixel(decode_data_uri(doc["screenshot"]), 500, 500)
    assert blue == (0, 0, 255)
    doc = await scrape(
        engine, site.url("/js/colors"),
        formats=[{"type": "screenshot", "fullPage": True, "viewport": {"width": 800, "height": 600}}],
    )  # fmt: skip
    width, height, red = png_size_and_pixel(decode_data_uri(doc["screenshot"]), 10, 10)
    assert width == 800 and height >= 3000 > 600 and red == (255, 0, 0)
    doc = await scrape(engine, site.url("/js/colors"), formats=["screenshot@fullPage", "markdown"])
    assert decode_data_uri(doc["screenshot"])[:8] == b"\x89PNG\r\n\x1a\n"
    jpeg = await scrape(
        engine, site.url("/js/colors"), formats=[{"type": "screenshot", "quality": 50}]
    )
    assert decode_data_uri(jpeg["screenshot"])[:2] == b"\xff\xd8"


async def test_browser_crash_fails_its_pages_with_a_code(
    site: SiteSim, engine: Engine, running: RunningBrowser
) -> None:
    import os
    import signal

    failures: list[FetchError] = []

    async def hung() -> None:
        try:
            await scrape(engine, site.url("/js/hang"), timeout=60000, waitFor=1)
        except FetchError as exc:
            failures.append(exc)

    async with trio.open_nursery() as pages:
        pages.start_soon(hung)
        with trio.fail_after(20):
            while site.counts["/js/hang"] == 0 or running.pool.status()["tabs_busy"] == 0:
                await trio.sleep(0.05)
        crashed = running.pool.status()["pid"]
        os.kill(crashed, signal.SIGKILL)
    assert [f.code for f in failures] == ["SCRAPE_ALL_ENGINES_FAILED"]
    assert "crashed" in failures[0].message
    with trio.fail_after(30):
        while running.pool.status()["pid"] in (None, crashed):
            await trio.sleep(0.05)
    doc = await scrape(engine, site.url("/js/fetch"))  # the restarted browser serves again
    assert js_site.FETCHED_ITEMS[0] in doc["markdown"]
    assert running.pool.counts["crashed"] == 1


async def test_auto_keeps_the_http_document_when_rendering_fails(
    site: SiteSim, engine: Engine
) -> None:
    site.files["/js/shell-that-hangs"] = (
        b'<html><body><div id="root">Server text</div><script>while (true) {}</script></body></html>',
        "text/html",
    )
    doc = await scrape(engine, site.url("/js/shell-that-hangs"), timeout=2000)
    assert doc["metadata"]["engine"] == "http" and "Server text" in doc["markdown"]
    assert "looks script-built (app-root)" in doc["warning"] and "SCRAPE_TIMEOUT" in doc["warning"]
    assert engine.maker.renders["fallback"] == 1


async def serve_tls_page(nursery: trio.Nursery, tmp: Any, body: bytes) -> int:
    """A one-page HTTPS server with a self-signed certificate for tls.test; its port."""
    import shutil
    import ssl

    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")

    cert, key = tmp / "cert.pem", tmp / "key.pem"
    await trio.run_process(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=tls.test",
         "-addext", "subjectAltName=DNS:tls.test"],
        capture_stdout=True, capture_stderr=True,
    )  # fmt: skip
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(cert), str(key))
    answer = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nConnection: close\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )

    async def handle(stream: trio.SSLStream[trio.SocketStream]) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            async with stream:
                await stream.receive_some(65536)
                await stream.send_all(answer)

    listeners = await nursery.start(
        functools.partial(trio.serve_ssl_over_tcp, handle, 0, context, host="127.0.0.1")
    )
    return int(listeners[0].transport_listener.socket.getsockname()[1])


async def test_skip_tls_verification(nursery: trio.Nursery, tmp_path: Any) -> None:
    page = (b'<html><body><div id="root"></div><script>document.getElementById("root")'
            b'.textContent = "Rendered over TLS"</script></body></html>')  # fmt: skip
    port = await serve_tls_page(nursery, tmp_path, page)
    resolver = host_map_resolver({"tls.test": "127.0.0.1"})
    running = await start_browser(nursery, resolver=resolver)
    engine = new_engine(
        CrawlConfig(allow_cidrs=["127.0.0.0/8"], browser=browser_config()), resolver, running.pool
    )
    url = f"https://tls.test:{port}/"
    with pytest.raises(FetchError) as info:
        await scrape(engine, url, waitFor=1, skipTlsVerification=False)
    assert info.value.code == "SCRAPE_SSL_ERROR" and "CERT" in info.value.message
    doc = await scrape(engine, url, waitFor=1, skipTlsVerification=True)
    assert "Rendered over TLS" in doc["markdown"] and doc["metadata"]["engine"] == "browser"
    with pytest.raises(FetchError) as info:  # the exception stayed with that page's tab
        await scrape(engine, url, waitFor=1, skipTlsVerification=False)
    assert info.value.code == "SCRAPE_SSL_ERROR"
