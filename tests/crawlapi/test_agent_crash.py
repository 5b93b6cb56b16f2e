"""kill -9 of a real crawld process in the middle of an agent run (a web search through the
SearXNG simulator, pages of the generated site, the model simulator choosing what to read): after
a restart the same id completes; every step is recorded once (numbered without a gap, no page
read twice), each step's `agent.action` event arrives once and in order, `agent.started` first
and `agent.completed` last and once; the model is asked again only about the call in flight."""

from __future__ import annotations

import functools
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from daemon.fakes.openai_compat import OpenAICompatService, serve_openai_compat
from daemon.fakes.receiver import WebhookReceiver
from daemon.fakes.searxng import SearxngSim, serve_searxng
from daemon.fakes.site import SiteSim, serve_site
from tests.conftest import Deployment

from .crawld_process import config_head, crawld, free_port, poll, running

pytestmark = pytest.mark.process

SCHEMA = {"type": "object", "properties": {"title": {"type": "string"},
          "items": {"type": "array", "items": {"type": "string"}}}}  # fmt: skip
KILL_AFTER = 5
"""Steps committed before the kill."""


def _config(port: int, llm: str, searxng: str, deployment: Deployment) -> str:
    return (
        config_head(port)
        + f"""[search]
base_url = "{searxng}"
retries = 0
[llm]
base_url = "{llm}"
model = "sim"
cache_ttl = "0s"
retries = 0
max_output_tokens = 256
[agent]
max_steps = 14
page_chars = 1500
"""
        + deployment.toml
    )


async def test_kill_9_mid_agent_then_the_same_id_completes_with_each_step_once(
    tmp_path: Path, rx: WebhookReceiver, nursery: trio.Nursery, deployment: Deployment
) -> None:
    site = SiteSim(pages=60, paragraphs=1)
    await nursery.start(functools.partial(serve_site, site))
    searxng = SearxngSim(total=10)
    searxng.result_url = lambda i: f"http://127.0.0.1:{site.port}/pages/{i}"  # type: ignore[method-assign]
    host, search_port = await nursery.start(functools.partial(serve_searxng, searxng))
    sim = OpenAICompatService(latency=(0.2, 0.3))
    host, llm_port = await nursery.start(functools.partial(serve_openai_compat, sim, "127.0.0.1:0"))
    port = free_port()
    config_file = tmp_path / "crawld.toml"
    config_file.write_text(_config(port, f"http://{host}:{llm_port}/v1",
                                   f"http://{host}:{search_port}", deployment))  # fmt: skip
    command, env = crawld(config_file, deployment)

    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False,
                                 timeout=10) as client:  # fmt: skip
        async with running(command, env, client) as first:
            body = {"prompt": "Page titles of the tree", "schema": SCHEMA, "webhook": rx.url()}
            job_id = (await client.post("/v2/agent", json=body)).json()["id"]
            with trio.fail_after(60):
                while len(before := await _steps(client, job_id)) < KILL_AFTER:
                    await trio.sleep(0.01)
            first.kill()  # SIGKILL: no cleanup of any kind
            await first.wait()
        asked_before = len(sim.requests)

        async with running(command, env, client) as second:
            with trio.fail_after(90):
                while (status := (await client.get(f"/v2/agent/{job_id}")).json())[
                    "status"
                ] == "processing":
                    await trio.sleep(0.05)
            await poll(lambda: any(e.type == "agent.completed" for e in rx.events(job_id)), 30)
            steps = await _steps(client, job_id)
            second.terminate()
            with trio.fail_after(30):
                await second.wait()

    assert status["status"] == "completed", status
    assert status["data"]["title"] and status["sources"]
    assert [s["step"] for s in steps] == list(range(1, len(steps) + 1))
    assert steps[: len(before)] == before  # what had committed stayed as it was
    assert len(steps) > len(before) and steps[-1]["action"] == "answer"
    read = Counter(s["input"]["url"] for s in steps if s["action"] == "scrape")
    assert max(read.values()) == 1, read
    assert steps[-1]["creditsUsed"] == status["creditsUsed"]
    # The model was asked once per choice and the answer, and again at most for the one call in
    # flight at the kill (the loop makes one call at a time).
    calls = sum(1 for s in steps if s["action"] in ("choose", "answer"))
    assert calls <= len(sim.requests) <= calls + 1
    assert asked_before >= sum(1 for s in before if s["action"] == "choose")

    rx.check()  # in order, nothing after the terminal, resends identical
    # An event delivered but not yet acknowledged at the kill is sent again, with the same
    # eventId and bytes (a receiver deduplicates on it): each counts once.
    events = list({e.event_id: e for e in rx.events(job_id)}.values())
    types = [e.type for e in events]
    assert types[0] == "agent.started" and types[-1] == "agent.completed"
    assert types.count("agent.started") == 1 and types.count("agent.completed") == 1
    actions = [e.event["data"][0] for e in events if e.type == "agent.action"]
    assert [a["step"] for a in actions] == [s["step"] for s in steps]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert events[-1].event["data"][0]["creditsUsed"] == status["creditsUsed"]


async def _steps(client: httpx.AsyncClient, job_id: str) -> list[dict[str, Any]]:
    answer = await client.get(f"/v2/agent/{job_id}/steps")
    steps: list[dict[str, Any]] = answer.json()["steps"]
    return steps
