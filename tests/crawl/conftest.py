from __future__ import annotations

import functools
from collections.abc import AsyncIterator

import pytest
import trio

from daemon.crawl.config import BrowserConfig
from daemon.crawl.fetching.fetch import Fetcher, FetchPolicy
from daemon.crawl.fetching.proxy import VettingProxy
from daemon.crawl.rendering.browser import BrowserPool
from daemon.fakes.site import SiteSim, host_map_resolver, serve_site


@pytest.fixture
async def site(nursery: trio.Nursery) -> AsyncIterator[SiteSim]:
    sim = SiteSim(pages=150, slow_seconds=30.0, large_bytes=64 * 1024)
    stop = trio.Event()
    await nursery.start(functools.partial(serve_site, sim, shutdown=stop))
    yield sim
    stop.set()


def policy(**overrides: object) -> FetchPolicy:
    fields: dict[str, object] = {
        "user_agent": "crawld-test FirecrawlAgent",
        "connect_timeout": 5.0,
        "timeout": 10.0,
        "max_bytes": 32 * 1024,
        "allow_cidrs": ("127.0.0.0/8",),
    }
    fields.update(overrides)
    return FetchPolicy(**fields)  # type: ignore[arg-type]


@pytest.fixture
async def fetcher() -> AsyncIterator[Fetcher]:
    async with Fetcher(policy(), resolver=host_map_resolver()) as opened:
        yield opened


# -- the OCR engine --------------------------------------------------------------------------


def need_tesseract() -> str:
    """The OCR engine's path; without one the test fails under CI=true and is skipped otherwise."""
    import os

    from daemon.crawl.config import find_ocr_engine

    found = find_ocr_engine("")
    if found is None:
        message = "tesseract is not installed (apt-get install tesseract-ocr tesseract-ocr-eng)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"required under CI=true: {message}", pytrace=False)
        pytest.skip(message)
    return found


# -- the browser -----------------------------------------------------------------------------


def need_chromium() -> str:
    """The browser's path; without one the test fails under CI=true and is skipped otherwise."""
    import os

    from daemon.crawl.config import find_browser

    found = find_browser("")
    if found is None:
        message = "Chromium is not installed (apt-get install chromium)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"required under CI=true: {message}", pytrace=False)
        pytest.skip(message)
    return found


def browser_config(**overrides: object) -> BrowserConfig:
    """The browser on, with one tab unless a test asks for more: a pool opens a browser context
    for each tab (and a spare) at its start, each a window with a renderer of its own, which
    would be most of the CPU of a test that renders a page or two."""
    import os

    need_chromium()
    fields: dict[str, object] = {"enabled": True, "sandbox": os.geteuid() != 0, "tabs": 1}
    fields.update(overrides)
    return BrowserConfig(**fields)  # type: ignore[arg-type]


class RunningBrowser:
    def __init__(self, pool: BrowserPool, proxy: VettingProxy) -> None:
        self.pool = pool
        self.proxy = proxy


async def start_browser(
    nursery: trio.Nursery,
    *,
    allow_cidrs: tuple[str, ...] = ("127.0.0.0/8",),
    resolver: object = None,
    **overrides: object,
) -> RunningBrowser:
    proxy = VettingProxy(allow_cidrs=allow_cidrs, resolver=resolver or host_map_resolver())  # type: ignore[arg-type]
    await nursery.start(proxy.run)
    pool = BrowserPool(browser_config(**overrides), lambda: proxy.port, lambda: proxy.closed_port)
    await nursery.start(pool.run)
    return RunningBrowser(pool, proxy)


def live_browser_processes(marker: str = "crawld-browser-") -> list[int]:
    """Pids of running (not zombie) processes with `marker` in an argument."""
    from pathlib import Path

    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        state = stat[stat.rindex(")") + 2 :].split()[0]
        if marker.encode() in cmdline and state not in ("Z", "X"):
            found.append(int(entry.name))
    return found
