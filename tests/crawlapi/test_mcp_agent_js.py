"""Firecrawl's MCP server (firecrawl-mcp 3.26, tests/js/mcp_agent.test.mjs) running crawld's agent
(`firecrawl_agent`, then `firecrawl_agent_status` polled to completed, failed or cancelled) and a
prompted crawl (`firecrawl_crawl` with `prompt`) over stdio, with and without an API key. The MCP
drops answer keys its output schemas lack and its SDK client checks the rest against them: the
real check of what tests/crawlapi/test_agent.py's key lists only copy."""

from __future__ import annotations

import json
import os
import re

import pytest
import trio

from daemon.fakes.openai_compat import OpenAICompatService
from daemon.fakes.searxng import SearxngSim
from daemon.fakes.site import SiteSim
from tests.crawlapi.conftest import CONFIG
from tests.crawlapi.test_agent import AGENT, LLM, pages, searxng, sim  # noqa: F401
from tests.crawlapi.test_sdk_js import JS, KEY, KEY_ENV, node_or_fail

pytestmark = pytest.mark.node  # drives Node: the SDKs' wire formats, not the store

TESTS = 9
"""test() calls of mcp_agent.test.mjs: every one must pass."""
CRAWL_OPTIONS = {
    "includePaths": ["^/pages/\\d+$"], "excludePaths": None, "maxDiscoveryDepth": None,
    "crawlEntireDomain": True, "allowExternalLinks": None, "allowSubdomains": None,
    "sitemap": None, "ignoreQueryParameters": None, "deduplicateSimilarURLs": None,
    "delay": None, "limit": 3,
}  # fmt: skip
"""The model's scripted answer to the crawl prompt (the first model call of the run): without
crawlEntireDomain (which firecrawl-mcp does not send) a crawl from /pages/0 stays under it."""


@pytest.fixture(params=["no-key", "key"])
def api_key(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str | None:
    if request.param == "no-key":
        return None
    monkeypatch.setenv(KEY_ENV, KEY)
    return KEY


@pytest.fixture
def crawl_config(
    searxng: SearxngSim,  # noqa: F811
    llm: tuple[OpenAICompatService, str],
    api_key: str | None,
) -> str:
    config = (
        CONFIG
        + f'[search]\nbase_url = "{searxng.address}"\nengines = ["fake"]\nretries = 0\n'  # type: ignore[attr-defined]
        + f'[llm]\nbase_url = "{llm[1]}"\nmodel = "sim"\n{LLM}'
        + AGENT
    )
    if api_key is None:
        return config
    return config.replace(
        'bind = "127.0.0.1:0"', f'bind = "127.0.0.1:0"\napi_key_env = "{KEY_ENV}"'
    )


async def test_firecrawl_mcp_runs_agents_and_prompted_crawls_through_crawld(
    base_url: str,
    pages: SiteSim,  # noqa: F811
    searxng: SearxngSim,  # noqa: F811
    sim: OpenAICompatService,  # noqa: F811
    api_key: str | None,
) -> None:
    node = node_or_fail()
    if not (JS / "node_modules" / "firecrawl-mcp").is_dir():
        pytest.fail("tests/js/node_modules has no firecrawl-mcp (cd tests/js && npm ci)")
    sim.reply(json.dumps(CRAWL_OPTIONS))
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
        "CRAWLD_URL": base_url,
        "SITE_URL": pages.url("").rstrip("/"),
        "SEARXNG_URL": searxng.address,  # type: ignore[attr-defined]
        "NODE_NO_WARNINGS": "1",
    }
    if api_key:
        env["CRAWLD_KEY"] = api_key
    command = [node, "--test", "--test-reporter=tap", str(JS / "mcp_agent.test.mjs")]
    with trio.fail_after(120):
        done = await trio.run_process(command, cwd=JS, env=env, capture_stdout=True,
                                      capture_stderr=True, check=False)  # fmt: skip
    out = done.stdout.decode()
    summary = dict(re.findall(r"^# (pass|fail|cancelled|skipped|todo) (\d+)$", out, re.M))
    assert done.returncode == 0 and summary.get("fail") == "0", out[-6000:] + done.stderr.decode()
    assert summary["pass"] == str(TESTS), out[-3000:]
    # The crawl prompt reached the model first; the agents searched once (the others kept to
    # their URLs) and read the pages they were given.
    assert "three tree pages" in sim.requests[0]["messages"][-1]["content"]
    assert {r["q"] for r in searxng.requests} == {
        "The name of the widget company", "Who makes widgets"
    }  # fmt: skip
    assert pages.hits_for("/co/1") and pages.hits_for("/pages/0")
