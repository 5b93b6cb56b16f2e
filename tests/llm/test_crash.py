"""kill -9 of a real crawld in the middle of a batch with the json format: after a restart the
batch completes with every page's json derived from that page, a page's question is asked again
only if its answer was in flight at the kill (answers are cached in the store before the page
commits), and the same batch once more is answered from the store without a model call."""

from __future__ import annotations

import functools
import signal
from collections import Counter
from pathlib import Path

import httpx
import pytest
import trio

from daemon.fakes.openai_compat import OpenAICompatService, page_text, serve_openai_compat
from daemon.fakes.site import SiteSim, serve_site
from daemon.store import Store
from tests.conftest import Deployment
from tests.crawlapi.crawld_process import crawld, free_port, poll, running
from tests.crawlapi.test_crash import all_documents

pytestmark = pytest.mark.process

PAGES = 60
MODEL_CONCURRENCY = 4
SCHEMA = {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}


async def test_kill_9_mid_batch_pays_each_question_once(
    tmp_path: Path, nursery: trio.Nursery, deployment: Deployment
) -> None:
    site = SiteSim(pages=PAGES + 1, paragraphs=1)
    await nursery.start(functools.partial(serve_site, site))
    model = OpenAICompatService(latency=(0.05, 0.15))
    host, llm_port = await nursery.start(
        functools.partial(serve_openai_compat, model, "127.0.0.1:0")
    )
    port = free_port()
    config_file = tmp_path / "crawld.toml"
    config_file.write_text(
        f"""
[daemon]
state_dir = "state"
[crawl.browser]
enabled = false
[http]
bind = "127.0.0.1:{port}"
[collector]
enabled = false
[crawl]
allow_cidrs = ["127.0.0.0/8"]
concurrency = 8
[llm]
base_url = "http://{host}:{llm_port}/v1"
model = "sim"
max_concurrency = {MODEL_CONCURRENCY}
"""
        + deployment.toml
    )
    command, env = crawld(config_file, deployment)
    urls = [f"http://127.0.0.1:{site.port}/pages/{i}" for i in range(1, PAGES + 1)]

    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False,
                                 timeout=10) as client:  # fmt: skip
        async with running(command, env, client) as first:
            body = {"urls": urls, "formats": ["markdown", {"type": "json", "schema": SCHEMA}]}
            job_id = (await client.post("/v2/batch/scrape", json=body)).json()["id"]
            await poll(lambda: len(model.delays) >= PAGES // 3, 30)
            first.kill()  # SIGKILL: no cleanup of any kind
            await first.wait()
        asked_before = len(model.requests)
        assert asked_before < PAGES, "the batch finished before the kill"
        # answers in the store at the kill: asked, answered and committed (each asked once)
        store = Store(deployment.target(tmp_path / "state"), readers=1)
        store.backend.open_readers()
        try:
            kept = await store.read(
                lambda c: c.execute("SELECT count(*) FROM llm_cache WHERE kind = 'json'").fetchone()
            )
        finally:
            store.close()
        cached_at_kill = kept[0]

        async with running(command, env, client) as second:
            with trio.fail_after(60):
                while (await client.get(f"/v2/batch/scrape/{job_id}?limit=1")).json()[
                    "status"
                ] == "scraping":
                    await trio.sleep(0.05)
            status = (await client.get(f"/v2/batch/scrape/{job_id}?limit=1")).json()
            docs = await all_documents(client, job_id)
            usage = (await client.get("/v2/team/token-usage")).json()["data"]
            # the same pages and question again: every answer comes from the store
            asked_total = len(model.requests)
            again = (await client.post("/v2/batch/scrape", json=body)).json()["id"]
            with trio.fail_after(60):
                while (await client.get(f"/v2/batch/scrape/{again}?limit=1")).json()[
                    "status"
                ] == "scraping":
                    await trio.sleep(0.05)
            repeat = await all_documents(client, again)
            second.send_signal(signal.SIGTERM)
            with trio.fail_after(30):
                assert await second.wait() == 0

    assert status["status"] == "completed" and len(docs) == PAGES
    for doc in docs:
        assert doc["json"] == {"title": doc["markdown"].splitlines()[0].lstrip("# ")}, doc
    asked = Counter(page_text(r["messages"]).splitlines()[0] for r in model.requests)
    assert set(asked) == {f"# Page {i}" for i in range(1, PAGES + 1)}
    twice = [page for page, n in asked.items() if n > 1]
    assert max(asked.values()) <= 2
    # only answers in flight at the kill (sent and not yet back, or back and not yet committed)
    # are asked again: every question asked before the kill whose answer the store kept is not
    assert 0 < cached_at_kill <= asked_before
    assert len(twice) == asked_before - cached_at_kill, (twice, asked_before, cached_at_kill)
    # the second process counts only what it asked
    assert usage["providers"]["default"]["requests"] == asked_total - asked_before
    assert len(model.requests) == asked_total
    assert sorted(d["json"]["title"] for d in repeat) == sorted(d["json"]["title"] for d in docs)
