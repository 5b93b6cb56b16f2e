"""Three crawld processes on one PostgreSQL schema share a crawl started on one of them: every
page fetched once and the pages spread over the three; kill -9 of the creator mid-crawl: the
others finish it, every page once in the results, only pages it had in flight fetched again;
DELETE sent to an instance that did not create the crawl stops it everywhere; a paced crawl
runs on one instance; an instance paused past its membership stores nothing stale."""

from __future__ import annotations

import functools
import json
from collections import Counter
from typing import Any

import httpx
import pytest
import trio
from starlette.responses import Response
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from daemon.fakes.site import SiteSim, serve_site
from tests.cluster.harness import DSN_ENV, Instances, wait_for

pytestmark = pytest.mark.process

PAGES = 240
CONCURRENCY = 2
LATENCY_S = 0.03


class SlowSite(SiteSim):
    """Tree pages answer after LATENCY_S, so a crawl lasts long enough for every instance to
    take part and for a kill or a pause in the middle of it."""

    async def _site(self, path: str, origin: str, host_header: str) -> Response:
        if path.startswith("/pages/"):
            await trio.sleep(LATENCY_S)
        return await super()._site(path, origin, host_header)


async def documents(client: httpx.AsyncClient, job_id: str) -> list[str]:
    urls: list[str] = []
    url: str | None = f"/v2/crawl/{job_id}"
    while url is not None:
        page = (await client.get(url)).json()
        urls += [d["metadata"]["sourceURL"] for d in page["data"]]
        url = page.get("next")
    return urls


async def watch(base: str, job_id: str, into: dict[str, list[str]], key: str) -> None:
    """Read the crawl's WebSocket watcher to its close: the sourceURL of every document."""

    def run() -> list[str]:
        docs: list[dict[str, Any]] = []
        with connect(f"ws{base.removeprefix('http')}/v2/crawl/{job_id}", open_timeout=10) as ws:
            try:
                while True:
                    message = json.loads(ws.recv(timeout=60))
                    if message["type"] == "catchup":
                        docs += message["data"]["data"]
                    elif message["type"] == "document":
                        docs.append(message["data"])
            except ConnectionClosed:
                pass
        return [d["metadata"]["sourceURL"] for d in docs]

    into[key] = await trio.to_thread.run_sync(run)


async def test_three_instances_share_a_crawl_survive_a_kill_and_cancel_from_anywhere(
    instances: Instances, nursery: trio.Nursery
) -> None:
    site = SlowSite(pages=PAGES, paragraphs=1)
    await nursery.start(functools.partial(serve_site, site))
    # A process paused inside a transaction must not hold its row locks (and with them the
    # other instances' writers and heartbeats) for the length of the pause.
    dsn = instances.env[DSN_ENV]
    sep = "&" if "?" in dsn else "?"
    instances.env[DSN_ENV] = f"{dsn}{sep}options=-c%20idle_in_transaction_session_timeout%3D1000"
    for name in ("a", "b", "c"):
        instances.add(
            name, f'[crawl]\nallow_cidrs = ["127.0.0.0/8"]\nconcurrency = {CONCURRENCY}\n'
        )
        await instances.start(name)
    clients = {n: instances.client(n, timeout=10) for n in ("a", "b", "c")}
    expected = {f"http://127.0.0.1:{site.port}/pages/{i}" for i in range(PAGES)}
    body = {"url": f"http://127.0.0.1:{site.port}/pages/0", "sitemap": "skip",
            "crawlEntireDomain": True, "includePaths": ["^/pages/"],
            "scrapeOptions": {"maxAge": 0}}  # fmt: skip  # the same pages are crawled again

    def tree_hits() -> Counter[str]:
        return Counter({p: n for p, n in site.counts.items() if p.startswith("/pages/")})

    async def fetched_by(name: str) -> int:
        return int((await clients[name].get("/status")).json()["crawl"]["pages_fetched"])

    async def status(name: str, job_id: str) -> str:
        return str((await clients[name].get(f"/v2/crawl/{job_id}?limit=1")).json()["status"])

    # 1. One crawl, created on a: every page fetched once, by all three.
    job = (await clients["a"].post("/v2/crawl", json=body)).json()["id"]
    for name in ("b", "c"):  # every instance answers for it
        assert (await clients[name].get(f"/v2/crawl/{job}?limit=1")).status_code == 200
    await wait_for(lambda: _done(status("c", job)), 90)
    assert await status("b", job) == "completed"
    docs = await documents(clients["b"], job)
    assert len(docs) == len(set(docs)) == PAGES and set(docs) == expected
    assert max(tree_hits().values()) == 1 and len(tree_hits()) == PAGES
    shares = {n: await fetched_by(n) for n in ("a", "b", "c")}
    assert sum(shares.values()) == PAGES and min(shares.values()) > 0, shares

    async def no_job_running() -> bool:  # the two that did not apply the end dropped the job
        states = [(await clients[n].get("/status")).json()["webhooks"] for n in ("a", "b", "c")]
        return all(s["jobs_running"] == 0 for s in states)

    await wait_for(no_job_running, 10)

    # 2. kill -9 of the creator mid-crawl: b and c finish it.
    site.counts.clear()
    job = (await clients["a"].post("/v2/crawl", json=body)).json()["id"]

    async def a_third() -> bool:
        return sum(tree_hits().values()) >= PAGES // 3

    await wait_for(a_third, 60)
    instances.kill9("a")
    at_kill = sum(tree_hits().values())
    assert at_kill < PAGES, "the crawl finished before the kill"
    await wait_for(lambda: _done(status("b", job)), 90)
    assert await status("c", job) == "completed"
    docs = await documents(clients["c"], job)
    assert len(docs) == len(set(docs)) == PAGES and set(docs) == expected
    hits = tree_hits()
    assert len(hits) == PAGES and max(hits.values()) <= 2
    # only what a had claimed: being fetched, waiting for its committer, being committed
    assert sum(1 for n in hits.values() if n == 2) <= 3 * CONCURRENCY

    # 3. A crawl created on b, DELETE sent to c: stopped everywhere.
    site.counts.clear()
    job = (await clients["b"].post("/v2/crawl", json=body)).json()["id"]

    async def started() -> bool:
        return sum(tree_hits().values()) >= 20

    await wait_for(started, 60)
    answer = await clients["c"].delete(f"/v2/crawl/{job}")
    assert answer.status_code == 200, answer.text
    await wait_for(lambda: _cancelled(status("b", job)), 10)
    await trio.sleep(1.0)  # in-flight pages end
    settled = sum(tree_hits().values())
    await trio.sleep(2.0)
    assert sum(tree_hits().values()) == settled < PAGES
    active = [(await clients[n].get("/v2/crawl/active")).json()["crawls"] for n in ("b", "c")]
    assert active == [[], []]

    # 4. A paced crawl (delay) runs in one place: one instance fetches all its pages.
    before = {n: await fetched_by(n) for n in ("b", "c")}
    paced = {"url": f"http://127.0.0.1:{site.port}/chain/0", "sitemap": "skip", "delay": 0.1,
             "crawlEntireDomain": True,
             "includePaths": ["^/chain/"]}  # fmt: skip
    job = (await clients["c"].post("/v2/crawl", json=paced)).json()["id"]
    watched: dict[str, list[str]] = {}
    async with trio.open_nursery() as watchers:  # the one not fetching sees every page too
        for name in ("b", "c"):
            watchers.start_soon(watch, instances.url(name), job, watched, name)
    assert await status("b", job) == "completed"
    gained = sorted([await fetched_by(n) - before[n] for n in ("b", "c")])
    assert gained == [0, site.chain_depth], gained
    chain = sorted(f"http://127.0.0.1:{site.port}/chain/{d}" for d in range(site.chain_depth))
    assert sorted(watched["b"]) == sorted(watched["c"]) == chain

    # 5. c paused past its membership mid-crawl: b claims c's rows again; c wakes up and stores
    # nothing of what it had in flight.
    site.counts.clear()
    job = (await clients["b"].post("/v2/crawl", json=body)).json()["id"]
    await wait_for(a_third, 60)
    instances.pause("c")
    await trio.sleep(4.0)  # lease 2 s: c's membership runs out, b takes its rows
    instances.resume("c")
    await wait_for(lambda: _done(status("c", job)), 90)
    assert await status("b", job) == "completed"
    docs = await documents(clients["c"], job)
    errors = (await clients["c"].get(f"/v2/crawl/{job}/errors")).json()
    assert len(docs) == len(set(docs)) == PAGES and set(docs) == expected, (
        sorted(expected - set(docs)),
        errors,
    )
    # Every page fetched, but no bound on repeats here: while PostgreSQL has not yet dropped a
    # transaction c left open, the others' writers (and heartbeats) wait for its row lock, so
    # they too may look dead for a moment and lose rows they were fetching.
    assert len(tree_hits()) == PAGES
    for client in clients.values():
        await client.aclose()


async def _done(answer: Any) -> bool:
    return await answer != "scraping"


async def _cancelled(answer: Any) -> bool:
    return await answer == "cancelled"
