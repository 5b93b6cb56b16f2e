"""kill -9 of a real crawld process in the middle of a 500-page crawl: after a restart the crawl
resumes from its frontier and completes with every page exactly once in /v2/crawl/{id}, each URL
fetched at most twice (only those fetched but not yet committed at the kill), and the webhook
events in order."""

from __future__ import annotations

import functools
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from daemon.fakes.receiver import WebhookReceiver
from daemon.fakes.site import SiteSim, serve_site
from tests.conftest import Deployment

from .crawld_process import config_head, crawld, free_port, poll, running

pytestmark = pytest.mark.process

PAGES = 500
CONCURRENCY = 4


async def all_documents(client: httpx.AsyncClient, job_id: str) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    url: str | None = f"/v2/crawl/{job_id}"
    while url is not None:
        page = (await client.get(url)).json()
        docs += page["data"]
        url = page.get("next")
    return docs


async def test_kill_9_mid_crawl_then_restart_completes_exactly_once(
    tmp_path: Path, rx: WebhookReceiver, nursery: trio.Nursery, deployment: Deployment
) -> None:
    site = SiteSim(pages=PAGES, paragraphs=1)
    await nursery.start(functools.partial(serve_site, site))
    port = free_port()
    config_file = tmp_path / "crawld.toml"
    config_file.write_text(config_head(port) + f"concurrency = {CONCURRENCY}\n" + deployment.toml)
    command, env = crawld(config_file, deployment)
    base = f"http://127.0.0.1:{port}"
    start = f"http://127.0.0.1:{site.port}/pages/0"
    rx.delay_next(PAGES, 0.002)  # the receiver lags a little: events are pending at the kill

    def tree_hits() -> int:
        return sum(n for path, n in site.counts.items() if path.startswith("/pages/"))

    async with httpx.AsyncClient(base_url=base, trust_env=False, timeout=10) as client:
        async with running(command, env, client) as first:
            body = {"url": start, "sitemap": "skip", "crawlEntireDomain": True,
                    "includePaths": ["^/pages/"], "webhook": rx.url()}  # fmt: skip
            job_id = (await client.post("/v2/crawl", json=body)).json()["id"]
            await poll(lambda: tree_hits() >= 150, 30)
            first.kill()  # SIGKILL: no cleanup of any kind
            await first.wait()
        at_kill = tree_hits()
        assert at_kill < PAGES, "the crawl finished before the kill"

        async with running(command, env, client) as second:
            with trio.fail_after(60):
                while (await client.get(f"/v2/crawl/{job_id}?limit=1")).json()[
                    "status"
                ] == "scraping":
                    await trio.sleep(0.05)
            status = (await client.get(f"/v2/crawl/{job_id}?limit=1")).json()
            docs = await all_documents(client, job_id)
            await poll(lambda: any(e.type == "crawl.completed" for e in rx.events(job_id)), 30)
            second.send_signal(signal.SIGTERM)
            with trio.fail_after(30):
                assert await second.wait() == 0

    assert status["status"] == "completed"
    sources = [d["metadata"]["sourceURL"] for d in docs]
    expected = {f"http://127.0.0.1:{site.port}/pages/{i}" for i in range(PAGES)}
    assert len(sources) == len(set(sources)) == PAGES == status["completed"] == status["total"]
    assert set(sources) == expected
    fetched = Counter(p for p in site.counts.elements() if p.startswith("/pages/"))
    assert max(fetched.values()) <= 2
    refetched = [p for p, n in fetched.items() if n == 2]
    # only pages between fetch and commit at the kill: being fetched, waiting, being committed
    assert len(refetched) <= 3 * CONCURRENCY

    rx.check()  # in order, nothing after the terminal, resends identical
    events = rx.events(job_id)
    first_time = {}
    for event in events:
        first_time.setdefault(event.seq, event)
    seqs = sorted(first_time)
    assert seqs == list(range(1, PAGES + 3))
    types = [first_time[s].type for s in seqs]
    assert types[0] == "crawl.started" and types[-1] == "crawl.completed"
    pages = [first_time[s].event["data"][0]["metadata"]["sourceURL"] for s in seqs[1:-1]]
    assert pages == sources  # webhook order = the order of /v2/crawl/{id}
