"""`[crawl.browser] enabled = "auto"` (the default) in a whole crawld: what `/status` says it came
to, and the requests that need a browser when it is off (no Chromium on PATH, or one that does
not start) or on (a Chromium found, no config edit)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from daemon.fakes.site import SiteSim
from tests.crawl.conftest import need_chromium
from tests.crawlapi.conftest import CONFIG, NO_BROWSER

AUTO = CONFIG.replace(NO_BROWSER, "")
"""The tests' config with `[crawl.browser]` left out: its default."""


async def browser_status(client: httpx.AsyncClient) -> dict[str, Any]:
    status = (await client.get("/status")).json()
    browser: dict[str, Any] = status["crawl"]["browser"]
    return browser


async def assert_no_screenshots(client: httpx.AsyncClient, site: SiteSim) -> None:
    """Today's clear 400 on both API versions, and a warning for what is only ignored."""
    for path in ("/v2/scrape", "/v1/scrape"):
        body = {"url": site.url("/pages/1"), "formats": ["markdown", "screenshot"]}
        refused = await client.post(path, json=body)
        assert refused.status_code == 400, path
        assert "needs a browser; [crawl.browser] is off" in refused.text, path
    waited = await client.post("/v2/scrape", json={"url": site.url("/pages/1"), "waitFor": 100})
    assert waited.status_code == 200
    assert "[crawl.browser] is off" in waited.json()["warning"]


class TestNoChromiumOnPath:
    @pytest.fixture
    def crawl_config(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
        empty = tmp_path / "bin"
        empty.mkdir()
        monkeypatch.setenv("PATH", str(empty))
        return AUTO

    async def test_auto_is_off_with_the_reason(
        self, client: httpx.AsyncClient, site: SiteSim
    ) -> None:
        browser = await browser_status(client)
        assert browser["mode"] == "auto" and browser["enabled"] is False
        assert "binary" not in browser and "pid" not in browser
        assert browser["reason"].startswith("no browser found (none of chromium,")
        await assert_no_screenshots(client, site)


class TestChromiumThatDoesNotStart:
    @pytest.fixture
    def crawl_config(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
        """A `chromium` on PATH that exits at once (as under a unit that forbids its JIT)."""
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        fake = bin_dir / "chromium"
        fake.write_text("#!/bin/sh\necho 'cannot start here' >&2\nexit 1\n")
        fake.chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
        return AUTO + "[crawl.browser]\nsandbox = false\n"

    async def test_auto_turns_it_off_and_the_daemon_runs_on(
        self, client: httpx.AsyncClient, site: SiteSim, tmp_path: Path
    ) -> None:
        browser = await browser_status(client)
        assert browser["mode"] == "auto" and browser["enabled"] is False
        assert browser["binary"] == str(tmp_path / "bin" / "chromium")
        assert browser["reason"].startswith("the browser did not start: ")
        assert "cannot start here" in browser["reason"]
        assert (await client.get("/status")).json()["crawl"]["browser_proxy"] is None
        await assert_no_screenshots(client, site)


class TestDisabled:
    async def test_false_is_off(self, client: httpx.AsyncClient) -> None:
        assert await browser_status(client) == {
            "mode": "off", "enabled": False, "reason": "enabled = false"}  # fmt: skip


@pytest.mark.browser
class TestChromiumInstalled:
    @pytest.fixture
    def crawl_config(self) -> str:
        need_chromium()  # no [crawl.browser] line: the shipped defaults, as a user or as root
        return AUTO.replace('page_timeout = "5s"', 'page_timeout = "15s"')

    async def test_auto_uses_it_without_a_config_edit(
        self, client: httpx.AsyncClient, site: SiteSim
    ) -> None:
        browser = await browser_status(client)
        assert browser["mode"] == "auto" and browser["enabled"] is True
        assert browser["binary"] == need_chromium() and browser["pid"]
        assert "reason" not in browser
        assert browser["sandbox"] is (os.geteuid() != 0)
        body = {"url": site.url("/pages/1"), "formats": ["markdown", "screenshot"]}
        shot = await client.post("/v2/scrape", json=body)
        assert shot.status_code == 200, shot.text
        assert shot.json()["data"]["screenshot"].startswith("data:image/png;base64,")
