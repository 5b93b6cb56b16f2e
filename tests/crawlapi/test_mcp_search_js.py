"""Firecrawl's MCP server (firecrawl-mcp 3.26, tests/js/mcp_search.test.mjs) searching through
crawld over stdio, with and without an API key: with one it asks for Firecrawl's cloud catalogue
(`sources: ["web", "alexandria"]`, `domainTools: true`) on every search, which crawld ignores
with a warning instead of refusing the search (issue 32)."""

from __future__ import annotations

import os
import re

import pytest
import trio

from daemon.fakes.searxng import SearxngSim
from tests.crawlapi.conftest import CONFIG
from tests.crawlapi.test_sdk_js import JS, KEY, KEY_ENV, node_or_fail
from tests.crawlapi.test_search import searxng  # noqa: F401

pytestmark = pytest.mark.node  # drives Node: the SDKs' wire formats, not the store

TESTS = {"no-key": 2, "key": 3}
"""test() calls of mcp_search.test.mjs that run (the Alexandria-only one needs a key)."""


@pytest.fixture(params=["no-key", "key"])
def api_key(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str | None:
    if request.param == "no-key":
        return None
    monkeypatch.setenv(KEY_ENV, KEY)
    return KEY


@pytest.fixture
def crawl_config(searxng: SearxngSim, api_key: str | None) -> str:  # noqa: F811
    address = searxng.address  # type: ignore[attr-defined]
    config = CONFIG + f'[search]\nbase_url = "{address}"\nengines = ["fake"]\n'
    if api_key is None:
        return config
    return config.replace(
        'bind = "127.0.0.1:0"', f'bind = "127.0.0.1:0"\napi_key_env = "{KEY_ENV}"'
    )


async def test_firecrawl_mcp_searches_through_crawld(
    base_url: str,
    searxng: SearxngSim,  # noqa: F811
    api_key: str | None,
) -> None:
    node = node_or_fail()
    if not (JS / "node_modules" / "firecrawl-mcp").is_dir():
        pytest.fail("tests/js/node_modules has no firecrawl-mcp (cd tests/js && npm ci)")
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
        "CRAWLD_URL": base_url,
        "NODE_NO_WARNINGS": "1",
    }
    if api_key:
        env["CRAWLD_KEY"] = api_key
    command = [node, "--test", "--test-reporter=tap", str(JS / "mcp_search.test.mjs")]
    with trio.fail_after(120):
        done = await trio.run_process(command, cwd=JS, env=env, capture_stdout=True,
                                      capture_stderr=True, check=False)  # fmt: skip
    out = done.stdout.decode()
    summary = dict(re.findall(r"^# (pass|fail|cancelled|skipped|todo) (\d+)$", out, re.M))
    assert done.returncode == 0 and summary.get("fail") == "0", out[-6000:] + done.stderr.decode()
    assert summary["pass"] == str(TESTS["key" if api_key else "no-key"]), out[-3000:]
    searched = [r for r in searxng.requests if r.get("q") == "nurseries"]
    assert searched and {r["categories"] for r in searched} <= {"general", "general,it", "news"}
