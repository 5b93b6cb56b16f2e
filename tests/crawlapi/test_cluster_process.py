"""Three crawld processes on one PostgreSQL schema share a crawl started on one of them: every
page fetched once and the pages spread over the three; kill -9 of the creator mid-crawl: the
others finish it, every page once in the results, only pages it had in flight fetched again;
DELETE sent to an instance that did not create the crawl stops it everywhere; a paced crawl
runs on one instance; an instance paused past its membership stores nothing stale."""

from __future__ import annotations

import functools
import os
import signal
import socket
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from starlette.responses import Response

from daemon.fakes.site import SiteSim, serve_site

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]
PAGES = 240
CONCURRENCY = 2
DSN_ENV = "CRAWLD_TEST_STORE_DSN"
LATENCY_S = 0.03


class SlowSite(SiteSim):
    """Tree pages answer after LATENCY_S, so a crawl lasts long enough for every instance to
    take part and for a kill or a pause in the middle of it."""

    async def _site(self, path: str, origin: str, host_header: str) -> Response:
        if path.startswith("/pages/"):
            await trio.sleep(LATENCY_S)
        return await super()._site(path, origin, host_header)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Instances:
    """crawld processes, one folder and port each, on one schema (a local stand-in for
    tests/cluster/harness.py)."""

    def __init__(self, tmp_path: Path, dsn: str, schema: str) -> None:
        self.tmp_path = tmp_path
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "STATE_DIRECTORY")}  # fmt: skip
        # A process paused inside a transaction must not hold its row locks (and with them the
        # other instances' writers and heartbeats) for the length of the pause.
        sep = "&" if "?" in dsn else "?"
        self.env[DSN_ENV] = f"{dsn}{sep}options=-c%20idle_in_transaction_session_timeout%3D1000"
        self.schema = schema
        self.ports: dict[str, int] = {}
        self.procs: dict[str, trio.Process] = {}

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    async def start(self, name: str) -> None:
        folder = self.tmp_path / name
        folder.mkdir(exist_ok=True)
        port = self.ports.setdefault(name, free_port())
        (folder / "crawld.toml").write_text(f"""
[daemon]
state_dir = "state"
[http]
bind = "127.0.0.1:{port}"
[collector]
enabled = false
[crawl]
allow_cidrs = ["127.0.0.0/8"]
concurrency = {CONCURRENCY}
[cluster]
instance = "{name}"
lease = "2s"
[store]
kind = "postgres"
dsn_env = "{DSN_ENV}"
schema = "{self.schema}"
""")
        command = [sys.executable, "-m", "daemon", "run", "--config", str(folder / "crawld.toml")]
        self.procs[name] = await trio.lowlevel.open_process(
            command, env=self.env, cwd=ROOT, stderr=(folder / "stderr.log").open("wb")
        )
        async with httpx.AsyncClient(trust_env=False, timeout=2) as client:
            with trio.fail_after(30):
                while True:
                    try:
                        if (await client.get(f"{self.url(name)}/healthz")).status_code == 200:
                            return
                    except httpx.TransportError:
                        pass
                    await trio.sleep(0.05)

    def kill9(self, name: str) -> None:
        self.procs[name].kill()

    def signal(self, name: str, signum: int) -> None:
        self.procs[name].send_signal(signum)

    async def aclose(self) -> None:
        for proc in self.procs.values():
            if proc.returncode is None:
                proc.kill()
            await proc.wait()


@pytest.fixture
async def instances(tmp_path: Path, pg_schema: tuple[str, str]) -> AsyncIterator[Instances]:
    group = Instances(tmp_path, *pg_schema)
    try:
        yield group
    finally:
        with trio.CancelScope(shield=True):
            await group.aclose()


async def poll(predicate: Any, timeout: float) -> None:
    with trio.fail_after(timeout):
        while not await predicate():
            await trio.sleep(0.05)


async def documents(client: httpx.AsyncClient, job_id: str) -> list[str]:
    urls: list[str] = []
    url: str | None = f"/v2/crawl/{job_id}"
    while url is not None:
        page = (await client.get(url)).json()
        urls += [d["metadata"]["sourceURL"] for d in page["data"]]
        url = page.get("next")
    return urls


async def test_three_instances_share_a_crawl_survive_a_kill_and_cancel_from_anywhere(
    instances: Instances, nursery: trio.Nursery
) -> None:
    site = SlowSite(pages=PAGES, paragraphs=1)
    await nursery.start(functools.partial(serve_site, site))
    for name in ("a", "b", "c"):
        await instances.start(name)
    clients = {
        n: httpx.AsyncClient(base_url=instances.url(n), trust_env=False, timeout=10)
        for n in ("a", "b", "c")
    }
    expected = {f"http://127.0.0.1:{site.port}/pages/{i}" for i in range(PAGES)}
    body = {"url": f"http://127.0.0.1:{site.port}/pages/0", "sitemap": "skip",
            "crawlEntireDomain": True, "includePaths": ["^/pages/"]}  # fmt: skip

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
    await poll(lambda: _done(status("c", job)), 90)
    assert await status("b", job) == "completed"
    docs = await documents(clients["b"], job)
    assert len(docs) == len(set(docs)) == PAGES and set(docs) == expected
    assert max(tree_hits().values()) == 1 and len(tree_hits()) == PAGES
    shares = {n: await fetched_by(n) for n in ("a", "b", "c")}
    assert sum(shares.values()) == PAGES and min(shares.values()) > 0, shares

    # 2. kill -9 of the creator mid-crawl: b and c finish it.
    site.counts.clear()
    job = (await clients["a"].post("/v2/crawl", json=body)).json()["id"]

    async def a_third() -> bool:
        return sum(tree_hits().values()) >= PAGES // 3

    await poll(a_third, 60)
    instances.kill9("a")
    at_kill = sum(tree_hits().values())
    assert at_kill < PAGES, "the crawl finished before the kill"
    await poll(lambda: _done(status("b", job)), 90)
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

    await poll(started, 60)
    answer = await clients["c"].delete(f"/v2/crawl/{job}")
    assert answer.status_code == 200, answer.text
    await poll(lambda: _cancelled(status("b", job)), 10)
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
    await poll(lambda: _done(status("b", job)), 60)
    assert await status("c", job) == "completed"
    gained = sorted([await fetched_by(n) - before[n] for n in ("b", "c")])
    assert gained == [0, site.chain_depth], gained

    # 5. c paused past its membership mid-crawl: b claims c's rows again; c wakes up and stores
    # nothing of what it had in flight.
    site.counts.clear()
    job = (await clients["b"].post("/v2/crawl", json=body)).json()["id"]
    await poll(a_third, 60)
    instances.signal("c", signal.SIGSTOP)
    await trio.sleep(4.0)  # lease 2 s: c's membership runs out, b takes its rows
    instances.signal("c", signal.SIGCONT)
    await poll(lambda: _done(status("c", job)), 90)
    assert await status("b", job) == "completed"
    docs = await documents(clients["c"], job)
    assert len(docs) == len(set(docs)) == PAGES and set(docs) == expected
    hits = tree_hits()
    assert len(hits) == PAGES and max(hits.values()) <= 2
    for client in clients.values():
        await client.aclose()


async def _done(answer: Any) -> bool:
    return await answer != "scraping"


async def _cancelled(answer: Any) -> bool:
    return await answer == "cancelled"
