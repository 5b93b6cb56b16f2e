"""firecrawl-js with the json and summary formats against crawld and the OpenAI-compatible
simulator (tests/js/llm.test.mjs): scrape, crawl and batch, a schema error, token usage."""

from __future__ import annotations

import os
import re

import pytest
import trio

from daemon.fakes.openai_compat import OpenAICompatService
from daemon.fakes.site import SiteSim
from tests.crawlapi.test_sdk_js import JS, node_or_fail
from tests.crawlapi.test_sdk_llm import crawl_config, llm_sim, sim  # noqa: F401

pytestmark = pytest.mark.node  # drives Node: the SDKs' wire formats, not the store

TESTS = 5


async def test_the_js_sdk_gets_json_and_summaries(
    base_url: str,
    site: SiteSim,
    sim: OpenAICompatService,  # noqa: F811
) -> None:
    node = node_or_fail()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
        "CRAWLD_URL": base_url,
        "SITE_URL": site.url("").rstrip("/"),
        "NODE_NO_WARNINGS": "1",
    }
    command = [node, "--test", "--test-reporter=tap", str(JS / "llm.test.mjs")]
    with trio.fail_after(120):
        done = await trio.run_process(command, cwd=JS, env=env, capture_stdout=True,
                                      capture_stderr=True, check=False)  # fmt: skip
    out = done.stdout.decode()
    summary = dict(re.findall(r"^# (pass|fail|cancelled|skipped|todo) (\d+)$", out, re.M))
    assert done.returncode == 0 and summary.get("fail") == "0", out[-6000:] + done.stderr.decode()
    assert summary["pass"] == str(TESTS), out[-3000:]
    assert len(sim.requests) == 2 + 5 * 2 + 2 * 2  # scrape, crawl and batch: json + summary each
