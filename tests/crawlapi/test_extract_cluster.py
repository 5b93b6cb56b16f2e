"""Two crawld processes on one PostgreSQL schema and an extract job: one instance works on it at a
time (lease `extract:<id>`), either answers its status; kill -9 of the one working on it: the
other takes it over where the pages stand and completes the same id, asking the model again only
about pages in flight at the kill; DELETE on the other instance cancels a job everywhere."""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import pytest
import trio

from daemon.fakes.openai_compat import OpenAICompatService, page_text, serve_openai_compat
from daemon.fakes.site import SiteSim, serve_site
from tests.cluster.harness import Instances, wait_for

pytestmark = pytest.mark.process

PAGES = 40
LLM_CONCURRENCY = 2
SCHEMA = {"type": "object", "properties": {"title": {"type": "string"}}}


def _title(request: dict[str, Any]) -> str:
    return str(page_text(request["messages"]).strip().splitlines()[0].lstrip("#").strip())


async def test_an_extract_job_moves_to_the_other_instance_after_a_kill(
    instances: Instances, nursery: trio.Nursery
) -> None:
    site = SiteSim(pages=PAGES, paragraphs=1)
    await nursery.start(functools.partial(serve_site, site))
    sim = OpenAICompatService(latency=(0.05, 0.1))
    host, port = await nursery.start(functools.partial(serve_openai_compat, sim, "127.0.0.1:0"))
    extra = (
        '[crawl]\nallow_cidrs = ["127.0.0.0/8"]\n'
        f'[llm]\nbase_url = "http://{host}:{port}/v1"\nmodel = "sim"\ncache_ttl = "0s"\n'
        f"max_concurrency = {LLM_CONCURRENCY}\n"
    )
    for name in ("a", "b"):
        instances.add(name, extra)
        await instances.start(name)
    clients = {n: instances.client(n, timeout=10) for n in ("a", "b")}
    body = {"urls": [f"http://127.0.0.1:{site.port}/pages/*"], "schema": SCHEMA,
            "limit": PAGES + 1}  # fmt: skip

    async def working(name: str, job_id: str) -> dict[str, Any] | None:
        status = (await clients[name].get("/status")).json()
        job: dict[str, Any] | None = status["crawl"]["extract"]["jobs"].get(job_id)
        return job if job is not None and (job["done"] or job["in_flight"]) else None

    job_id = (await clients["a"].post("/v2/extract", json=body)).json()["id"]
    assert (await clients["b"].get(f"/v2/extract/{job_id}")).json()["status"] == "processing"

    async def a_third() -> bool:
        done = (await clients["b"].get(f"/v2/crawl/{job_id}?limit=1")).json()["completed"]
        return int(done) >= PAGES // 3

    await wait_for(a_third, 60)
    owners = [n for n in ("a", "b") if await working(n, job_id)]
    assert len(owners) == 1, owners  # one instance at a time
    [owner] = owners
    other = "b" if owner == "a" else "a"
    instances.kill9(owner)
    asked_before = len(sim.requests)

    async def completed() -> bool:
        answer = (await clients[other].get(f"/v2/extract/{job_id}")).json()
        return bool(answer["status"] == "completed")

    await wait_for(completed, 90)
    final = (await clients[other].get(f"/v2/extract/{job_id}")).json()
    asked = Counter(_title(r) for r in sim.requests)
    errors = (await clients[other].get(f"/v2/crawl/{job_id}/errors")).json()["errors"]
    seen = (final, asked, asked_before, errors)
    assert final["data"]["title"], seen
    assert set(asked) == {f"Page {i}" for i in range(PAGES)}, seen
    assert max(asked.values()) <= 2, seen
    assert sum(1 for n in asked.values() if n == 2) <= 2 * LLM_CONCURRENCY, seen
    assert len(sim.requests) - asked_before <= PAGES - PAGES // 3 + 2 * LLM_CONCURRENCY, seen

    # DELETE on the instance that is not working on a job cancels it everywhere.
    await instances.start(owner)
    sim.latency = (0.3, 0.4)
    job_id = (await clients[other].post("/v2/extract", json=body)).json()["id"]
    busy: list[str] = []  # whichever instance took the job (the restarted one may)

    async def taken() -> bool:
        busy[:] = [n for n in ("a", "b") if await working(n, job_id)]
        return bool(busy)

    await wait_for(taken, 30)
    idle = "b" if busy[0] == "a" else "a"
    answer = await clients[idle].delete(f"/v2/crawl/{job_id}")
    assert answer.status_code == 200, answer.text

    async def cancelled() -> bool:
        answer = (await clients[busy[0]].get(f"/v2/extract/{job_id}")).json()
        return bool(answer["status"] == "cancelled")

    await wait_for(cancelled, 30)
    await trio.sleep(1.0)  # in-flight calls end
    settled = len(sim.requests)
    await trio.sleep(1.5)
    assert len(sim.requests) == settled, "the cancelled job still asks the model"
    for client in clients.values():
        await client.aclose()
