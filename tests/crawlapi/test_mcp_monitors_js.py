"""Firecrawl's MCP server (firecrawl-mcp 3.26, tests/js/mcp_monitors.test.mjs) driving crawld's
monitors with its eight monitor tools over stdio, with and without an API key: create (the
shorthand with a page and a goal), list, get, update (pause, resume), run (refused while
paused), check and checks, delete. Each answer passes the tools' output schemas."""

from __future__ import annotations

import os
import re

import pytest
import trio

from daemon.fakes.site import SiteSim
from tests.crawlapi.conftest import CONFIG
from tests.crawlapi.test_sdk_js import JS, KEY, KEY_ENV, node_or_fail

pytestmark = pytest.mark.node

TESTS = 6
"""test() calls of mcp_monitors.test.mjs: every one must pass."""


@pytest.fixture(params=["no-key", "key"])
def api_key(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str | None:
    if request.param == "no-key":
        return None
    monkeypatch.setenv(KEY_ENV, KEY)
    return KEY


@pytest.fixture
def crawl_config(api_key: str | None) -> str:
    if api_key is None:
        return CONFIG
    return CONFIG.replace(
        'bind = "127.0.0.1:0"', f'bind = "127.0.0.1:0"\napi_key_env = "{KEY_ENV}"'
    )


async def test_firecrawl_mcp_drives_monitors_through_crawld(
    base_url: str, site: SiteSim, api_key: str | None
) -> None:
    node = node_or_fail()
    if not (JS / "node_modules" / "firecrawl-mcp").is_dir():
        pytest.fail("tests/js/node_modules has no firecrawl-mcp (cd tests/js && npm ci)")
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
        "CRAWLD_URL": base_url,
        "SITE_URL": site.url("").rstrip("/"),
        "NODE_NO_WARNINGS": "1",
    }
    if api_key:
        env["CRAWLD_KEY"] = api_key
    command = [node, "--test", "--test-reporter=tap", str(JS / "mcp_monitors.test.mjs")]
    with trio.fail_after(120):
        done = await trio.run_process(command, cwd=JS, env=env, capture_stdout=True,
                                      capture_stderr=True, check=False)  # fmt: skip
    out = done.stdout.decode()
    summary = dict(re.findall(r"^# (pass|fail|cancelled|skipped|todo) (\d+)$", out, re.M))
    assert done.returncode == 0 and summary.get("fail") == "0", out[-6000:] + done.stderr.decode()
    assert summary["pass"] == str(TESTS), out[-3000:]
    assert site.hits_for("/about")
