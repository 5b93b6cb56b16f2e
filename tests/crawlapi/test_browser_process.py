"""kill -9 of a real crawld while its browser renders a (hung) page leaves no Chromium behind:
the browser's main process dies with its parent (PR_SET_PDEATHSIG) and its helpers with it."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
from pathlib import Path

import httpx
import pytest
import trio

from daemon.crawl.rendering.browser import DIR_PREFIX
from daemon.fakes.site import SiteSim, serve_site
from tests.crawl.conftest import live_browser_processes, need_chromium
from tests.crawlapi.crawld_process import free_port, poll

pytestmark = [pytest.mark.process, pytest.mark.browser]
ROOT = Path(__file__).resolve().parents[2]


async def test_kill_9_mid_render_leaves_no_chromium(tmp_path: Path, nursery: trio.Nursery) -> None:
    need_chromium()
    site = SiteSim(pages=1)
    await nursery.start(functools.partial(serve_site, site))
    port = free_port()
    sandbox = "true" if os.geteuid() != 0 else "false"
    config_file = tmp_path / "crawld.toml"
    config_file.write_text(f"""
[daemon]
state_dir = "state"
[http]
bind = "127.0.0.1:{port}"
[collector]
enabled = false
[crawl]
allow_cidrs = ["127.0.0.0/8"]
[crawl.browser]
enabled = true
sandbox = {sandbox}
tabs = 1
""")
    env = {k: v for k, v in os.environ.items()
           if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "STATE_DIRECTORY")}  # fmt: skip
    command = [sys.executable, "-m", "daemon", "run", "--config", str(config_file)]
    process = await trio.lowlevel.open_process(command, cwd=ROOT, env=env)
    marker = f"{DIR_PREFIX}{process.pid}-"
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:

            async def healthy() -> bool:
                try:
                    return (await client.get("/healthz")).status_code == 200
                except httpx.HTTPError:
                    return False

            with trio.fail_after(30):
                while not await healthy():
                    await trio.sleep(0.05)
            assert live_browser_processes(marker)

            async def hung_scrape() -> None:
                url = f"http://127.0.0.1:{site.port}/js/hang"
                with contextlib.suppress(httpx.HTTPError):  # the daemon is killed under it
                    await client.post(
                        "/v2/scrape", json={"url": url, "timeout": 60000, "waitFor": 1}
                    )

            nursery.start_soon(hung_scrape)

            async def rendering() -> bool:
                # (a section /status could not make in time is an error in its place)
                status = (await client.get("/status")).json()
                return bool(status["crawl"].get("browser", {}).get("tabs_busy"))

            with trio.fail_after(20):
                while not await rendering():
                    await trio.sleep(0.05)
            await poll(lambda: site.counts["/js/hang"] >= 1, 10)
            os.kill(process.pid, signal.SIGKILL)
            await process.wait()
        await poll(lambda: not live_browser_processes(marker), 15)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
