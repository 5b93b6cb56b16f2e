"""firecrawl-js `search` against crawld and the SearXNG simulator (tests/js/search.test.mjs)."""

from __future__ import annotations

import os
import re

import pytest
import trio

from daemon.fakes.site import SiteSim
from tests.crawlapi.test_sdk_js import JS, node_or_fail
from tests.crawlapi.test_search import crawl_config, searxng  # noqa: F401

pytestmark = pytest.mark.node  # drives Node: the SDKs' wire formats, not the store

TESTS = 3


async def test_the_js_sdk_searches_through_crawld(base_url: str, site: SiteSim) -> None:
    node = node_or_fail()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
        "CRAWLD_URL": base_url,
        "SITE_HOST": f"site.test:{site.port}",
        "NODE_NO_WARNINGS": "1",
    }
    command = [node, "--test", "--test-reporter=tap", str(JS / "search.test.mjs")]
    with trio.fail_after(120):
        done = await trio.run_process(command, cwd=JS, env=env, capture_stdout=True,
                                      capture_stderr=True, check=False)  # fmt: skip
    out = done.stdout.decode()
    summary = dict(re.findall(r"^# (pass|fail|cancelled|skipped|todo) (\d+)$", out, re.M))
    assert done.returncode == 0 and summary.get("fail") == "0", out[-6000:] + done.stderr.decode()
    assert summary["pass"] == str(TESTS), out[-3000:]
