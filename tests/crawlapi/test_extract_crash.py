"""kill -9 of a real crawld process in the middle of an extract job over a `/*` URL: after a
restart the same id completes, and the model (the OpenAI-compatible simulator, its answer cache
off) is not asked again about any page whose answer had committed before the kill; only those
in flight at the kill are asked twice. The webhook events arrive in order, once each."""

from __future__ import annotations

import functools
from collections import Counter
from pathlib import Path

import httpx
import pytest
import trio

from daemon.fakes.openai_compat import OpenAICompatService, page_text, serve_openai_compat
from daemon.fakes.receiver import WebhookReceiver
from daemon.fakes.site import SiteSim, serve_site
from tests.conftest import Deployment

from .crawld_process import config_head, crawld, free_port, poll, running

pytestmark = pytest.mark.process

PAGES = 40
LLM_CONCURRENCY = 2
SCHEMA = {"type": "object", "properties": {"title": {"type": "string"},
          "items": {"type": "array", "items": {"type": "string"}}}}  # fmt: skip


def _page_of(request: dict[str, object]) -> str:
    first = page_text(request["messages"]).strip().splitlines()[0]  # type: ignore[arg-type]
    return first.lstrip("#").strip()


async def test_kill_9_mid_extract_then_the_same_id_completes_without_asking_again(
    tmp_path: Path, rx: WebhookReceiver, nursery: trio.Nursery, deployment: Deployment
) -> None:
    site = SiteSim(pages=PAGES, paragraphs=1)
    await nursery.start(functools.partial(serve_site, site))
    sim = OpenAICompatService(latency=(0.05, 0.1))
    host, llm_port = await nursery.start(functools.partial(serve_openai_compat, sim, "127.0.0.1:0"))
    port = free_port()
    config_file = tmp_path / "crawld.toml"
    config_file.write_text(
        config_head(port)
        + f"""concurrency = 4
[llm]
base_url = "http://{host}:{llm_port}/v1"
model = "sim"
cache_ttl = "0s"
max_concurrency = {LLM_CONCURRENCY}
"""
        + deployment.toml
    )
    command, env = crawld(config_file, deployment)
    base = f"http://127.0.0.1:{port}"

    async with httpx.AsyncClient(base_url=base, trust_env=False, timeout=10) as client:
        async with running(command, env, client) as first:
            body = {"urls": [f"http://127.0.0.1:{site.port}/pages/*"], "schema": SCHEMA,
                    "showSources": True, "webhook": rx.url(), "limit": PAGES + 1}  # fmt: skip
            job_id = (await client.post("/v2/extract", json=body)).json()["id"]
            # Kill once a third of the pages have their answer committed.
            done_before = 0

            def committed() -> bool:
                return done_before >= PAGES // 3

            with trio.fail_after(60):
                while not committed():
                    done_before = (await client.get(f"/v2/crawl/{job_id}?limit=1")).json()[
                        "completed"
                    ]
                    await trio.sleep(0.01)
            first.kill()  # SIGKILL: no cleanup of any kind
            await first.wait()
        asked_before = Counter(_page_of(r) for r in sim.requests)
        assert len(asked_before) < PAGES, "the extract finished before the kill"

        async with running(command, env, client) as second:
            with trio.fail_after(90):
                while (status := (await client.get(f"/v2/extract/{job_id}")).json())[
                    "status"
                ] == "processing":
                    await trio.sleep(0.05)
            await poll(lambda: any(e.type == "extract.completed" for e in rx.events(job_id)), 30)
            errors = (await client.get(f"/v2/crawl/{job_id}/errors")).json()["errors"]
            second.terminate()
            with trio.fail_after(30):
                await second.wait()

    assert status["status"] == "completed", status
    asked = Counter(_page_of(r) for r in sim.requests)
    titles = {f"Page {i}" for i in range(PAGES)}
    assert set(asked) == titles, sorted(set(asked) ^ titles)
    # Each page asked at most twice; twice only for those whose answer had not committed at the
    # kill: at most the model calls in flight then (and a few waiting to commit).
    again = [t for t, n in asked.items() if n > 1]
    assert max(asked.values()) <= 2
    assert len(again) <= 2 * LLM_CONCURRENCY, again
    assert len(sim.requests) <= PAGES + 2 * LLM_CONCURRENCY
    # Every page committed before the kill was not asked again after it.
    assert sum(asked_before.values()) >= done_before
    asked_after = len(sim.requests) - sum(asked_before.values())
    assert asked_after <= PAGES - done_before + 2 * LLM_CONCURRENCY
    assert asked_after >= PAGES - sum(asked_before.values())
    # The merged result has every page's title (first non-null wins) and every item once.
    assert status["data"]["title"] and status["sources"]["title"]
    assert status["tokensUsed"] > 0
    # /pages/ itself is no page of the site: its 404 is the one page error.
    assert [e["code"] for e in errors] == ["EXTRACT_HTTP_ERROR"]

    rx.check()  # in order, nothing after the terminal, resends identical
    types = [e.type for e in rx.events(job_id)]
    assert types[0] == "extract.started" and types[-1] == "extract.completed"
    assert types.count("extract.started") == 1
