"""firecrawl-mcp 3.26 (tests/js/mcp_feedback.test.mjs) over stdio against crawld with an API key:
`firecrawl_search_feedback`, `firecrawl_feedback`, `firecrawl_developer_search` and
`firecrawl_credit_usage` (current and historical), each answer checked by the MCP SDK's client
against the tool's output schema; the feedback is then read back from crawld."""

from __future__ import annotations

import os
import re

import httpx
import pytest
import trio

from daemon.fakes.searxng import SearxngSim
from tests.crawlapi.conftest import CONFIG
from tests.crawlapi.test_sdk_js import JS, KEY, KEY_ENV, node_or_fail
from tests.crawlapi.test_search import searxng  # noqa: F401

pytestmark = pytest.mark.node

TESTS = 5
"""test() calls of mcp_feedback.test.mjs."""


@pytest.fixture
def crawl_config(searxng: SearxngSim, monkeypatch: pytest.MonkeyPatch) -> str:  # noqa: F811
    monkeypatch.setenv(KEY_ENV, KEY)
    address = searxng.address  # type: ignore[attr-defined]
    config = CONFIG + f'[search]\nbase_url = "{address}"\nengines = ["fake"]\n'
    return config.replace(
        'bind = "127.0.0.1:0"', f'bind = "127.0.0.1:0"\napi_key_env = "{KEY_ENV}"'
    )


async def test_firecrawl_mcp_feedback_developer_and_credit_tools(
    base_url: str, client: httpx.AsyncClient
) -> None:
    node = node_or_fail()
    if not (JS / "node_modules" / "firecrawl-mcp").is_dir():
        pytest.fail("tests/js/node_modules has no firecrawl-mcp (cd tests/js && npm ci)")
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"),
           "CRAWLD_URL": base_url, "CRAWLD_KEY": KEY, "NODE_NO_WARNINGS": "1"}  # fmt: skip
    command = [node, "--test", "--test-reporter=tap", str(JS / "mcp_feedback.test.mjs")]
    with trio.fail_after(120):
        done = await trio.run_process(command, cwd=JS, env=env, capture_stdout=True,
                                      capture_stderr=True, check=False)  # fmt: skip
    out = done.stdout.decode()
    summary = dict(re.findall(r"^# (pass|fail|cancelled|skipped|todo) (\d+)$", out, re.M))
    assert done.returncode == 0 and summary.get("fail") == "0", out[-6000:] + done.stderr.decode()
    assert summary["pass"] == str(TESTS), out[-3000:]
    listing = (await client.get("/v2/feedback", headers={"Authorization": f"Bearer {KEY}"})).json()
    assert sorted(item["endpoint"] for item in listing["data"]) == ["scrape", "search"]
    assert all(item["body"]["origin"].startswith("mcp-") for item in listing["data"])
