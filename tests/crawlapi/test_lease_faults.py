"""A crawl, a paced crawl (a `delay`) and a batch scrape outlive the leases and the database
connections that ran them, on PostgreSQL: through cuts of the connection (short ones, which land
on commits, and one of 10 s, past every lease), a crash and restart of PostgreSQL, a kill -9 of
the instance that owns them in a cluster of three and a SIGTERM of the last instance. Each time
the job the user holds an id for ends `completed`, with every page once in its results, and its
webhook stream is seqs 1..n in order: one `started` first, one terminal event last."""

from __future__ import annotations

import functools
import itertools
import random
from collections import Counter

import httpx
import pytest
import trio
from starlette.responses import Response

from daemon.fakes.receiver import WebhookReceiver
from daemon.fakes.site import SiteSim, serve_site
from tests.cluster.harness import DSN_ENV, Instances, wait_for
from tests.pgfault import FaultyPg

pytestmark = pytest.mark.process

LATENCY_S = 0.05
CRAWL_PAGES = 160
BATCH_URLS = 80
PACED_PAGES = 36
DELAY_S = 0.25
CRAWL_TOML = """
[crawl]
allow_cidrs = ["127.0.0.0/8"]
concurrency = 2
[webhooks]
allow_cidrs = ["127.0.0.0/8"]
timeout = "2s"
"""


class SlowSite(SiteSim):
    """Tree pages answer after LATENCY_S, so a crawl lasts long enough to break it mid-way."""

    async def _site(self, path: str, origin: str, host_header: str) -> Response:
        if path.startswith("/pages/"):
            await trio.sleep(LATENCY_S)
        return await super()._site(path, origin, host_header)


class Jobs:
    """The three jobs a test starts on an instance, what each must end with, and checks."""

    def __init__(self, site: SlowSite, rx: WebhookReceiver) -> None:
        self.site = site
        self.rx = rx
        origin = f"http://127.0.0.1:{site.port}"
        self.expected = {
            "crawl": {f"{origin}/pages/{i}" for i in range(CRAWL_PAGES)},
            "paced": {f"{origin}/chain/{d}" for d in range(PACED_PAGES)},
            "batch": {f"{origin}/pages/{i}?batch={i}" for i in range(BATCH_URLS)},
        }
        self.ids: dict[str, str] = {}

    async def start(self, client: httpx.AsyncClient) -> None:
        origin = f"http://127.0.0.1:{self.site.port}"
        crawl = {"url": f"{origin}/pages/0", "sitemap": "skip", "crawlEntireDomain": True,
                 "includePaths": ["^/pages/"], "webhook": {"url": self.rx.url()}}  # fmt: skip
        paced = {**crawl, "url": f"{origin}/chain/0", "includePaths": ["^/chain/"],
                 "delay": DELAY_S}  # fmt: skip
        batch = {"urls": sorted(self.expected["batch"]), "webhook": {"url": self.rx.url()}}
        for name, path, body in (("crawl", "/v2/crawl", crawl), ("paced", "/v2/crawl", paced),
                                 ("batch", "/v2/batch/scrape", batch)):  # fmt: skip
            answer = await client.post(path, json=body)
            assert answer.status_code == 200, answer.text
            self.ids[name] = answer.json()["id"]

    def path(self, name: str) -> str:
        kind = "batch/scrape" if name == "batch" else "crawl"
        return f"/v2/{kind}/{self.ids[name]}"

    async def status(self, client: httpx.AsyncClient, name: str) -> str:
        """The job's status, "" when the instance cannot answer now (its database is away)."""
        try:
            answer = await client.get(self.path(name), params={"limit": 1})
        except httpx.TransportError:
            return ""
        return str(answer.json().get("status", "")) if answer.status_code == 200 else ""

    async def all_finished(self, client: httpx.AsyncClient) -> bool:
        for name in self.ids:
            if await self.status(client, name) in ("", "scraping"):
                return False
        return True

    async def documents(self, client: httpx.AsyncClient, name: str) -> list[str]:
        urls: list[str] = []
        url: str | None = self.path(name)
        while url is not None:
            page = (await client.get(url)).json()
            urls += [d["metadata"]["sourceURL"] for d in page["data"]]
            url = page.get("next")
        return urls

    async def check(self, client: httpx.AsyncClient) -> None:
        """Every job `completed` under its first id, each page once in its results, its
        webhook stream whole and in order."""
        for name in self.ids:
            assert await self.status(client, name) == "completed", name
            docs = await self.documents(client, name)
            assert Counter(docs) == Counter(self.expected[name]), name
        for name in self.ids:
            with trio.fail_after(30):
                await self.rx.wait_until(functools.partial(self._ended, name))
        for name in self.ids:
            self.check_stream(name)
        # Last, so a failure here says the events all came, but not in seq order.
        assert self.rx.violations == [], f"webhook events out of order: {self.rx.violations}"

    def _ended(self, name: str) -> bool:
        return self.terminal(name) is not None

    def terminal(self, name: str) -> str | None:
        types = [e.type for e in self.rx.events(self.ids[name])]
        return next((t for t in types if t and t.endswith((".completed", ".failed"))), None)

    def check_stream(self, name: str) -> None:
        """Seqs 1..n delivered: one `started` (1), a `page` per page, one terminal (n)."""
        kind = "batch_scrape" if name == "batch" else "crawl"
        by_seq: dict[int, str | None] = {}
        for event in self.rx.events(self.ids[name]):
            assert event.seq is not None
            by_seq.setdefault(event.seq, event.type)
        seqs = sorted(by_seq)
        assert seqs == list(range(1, len(seqs) + 1)), (name, seqs)
        types = [by_seq[s] for s in seqs]
        assert types[0] == f"{kind}.started" and types.count(f"{kind}.started") == 1, name
        assert types[-1] == f"{kind}.completed", (name, types[-3:])
        ends = [t for t in types if t and t.endswith((".completed", ".failed"))]
        assert ends == [f"{kind}.completed"], (name, ends)
        assert types.count(f"{kind}.page") == len(self.expected[name]), name

    def hits(self, name: str) -> int:
        """Pages of job `name` the site answered so far."""
        prefix, batch = {"crawl": ("/pages/", False), "batch": ("/pages/", True),
                         "paced": ("/chain/", False)}[name]  # fmt: skip
        counts = self.site.counts.items()
        return sum(n for p, n in counts if p.startswith(prefix) and ("?batch=" in p) == batch)

    def check_pace(self) -> None:
        """The paced crawl ran in one place, one page at a time, `delay` apart (a page
        fetched again after an interruption included). Arrival times are taken by this busy
        test process (the site, the receiver and the proxy share its loop), so one arrival
        may be late and the next one on time: a couple of short gaps are jitter, while an
        unpaced chain would come milliseconds apart throughout."""
        times = sorted(h.at for h in self.site.hits if h.path.startswith("/chain/"))
        gaps = sorted(b - a for a, b in itertools.pairwise(times))
        assert gaps[len(gaps) // 2] >= DELAY_S * 0.9, gaps
        assert sum(g < DELAY_S / 2 for g in gaps) <= 2, gaps


async def _setup(nursery: trio.Nursery) -> tuple[SlowSite, WebhookReceiver]:
    site = SlowSite(pages=CRAWL_PAGES, chain_depth=PACED_PAGES, paragraphs=1)
    await nursery.start(functools.partial(serve_site, site))
    rx = WebhookReceiver()
    await nursery.start(rx.run)
    return site, rx


async def _one_instance(instances: Instances) -> httpx.AsyncClient:
    instances.add("a", CRAWL_TOML)
    await instances.start("a")
    return instances.client("a", timeout=15)


async def _mid_way(
    jobs: Jobs, client: httpx.AsyncClient, may_end: frozenset[str] = frozenset()
) -> None:
    """Wait until each job fetched some pages; check that none ended yet (but those in
    `may_end`: three instances may finish the batch before the others are mid-way)."""

    def started() -> bool:
        return jobs.hits("crawl") >= CRAWL_PAGES // 8 and jobs.hits("paced") >= PACED_PAGES // 4

    await wait_for(started, 30)
    for name in jobs.ids:
        if name not in may_end:
            assert await jobs.status(client, name) == "scraping", name


async def test_jobs_go_on_through_cuts_of_the_database_connection(
    faulty_pg: FaultyPg, faulty_instances: Instances, nursery: trio.Nursery
) -> None:
    site, rx = await _setup(nursery)
    client = await _one_instance(faulty_instances)
    jobs = Jobs(site, rx)
    await jobs.start(client)
    await _mid_way(jobs, client)
    # Short cuts land on commits (the connection lost while COMMIT is in flight: the outcome is
    # unknown and the caller gets the error), then one past every lease (2 s) and the readers'
    # wait for a connection.
    rng = random.Random(23)
    for _ in range(8):
        faulty_pg.cut()
        await trio.sleep(rng.uniform(0.02, 0.2))
        faulty_pg.resume()
        await trio.sleep(rng.uniform(0.05, 0.3))
    await faulty_pg.outage(10)
    await wait_for(lambda: jobs.all_finished(client), 40)
    await jobs.check(client)
    jobs.check_pace()
    await client.aclose()


async def test_jobs_go_on_through_a_postgres_crash_and_restart(
    faulty_pg: FaultyPg, faulty_instances: Instances, nursery: trio.Nursery
) -> None:
    site, rx = await _setup(nursery)
    client = await _one_instance(faulty_instances)
    jobs = Jobs(site, rx)
    await jobs.start(client)
    await _mid_way(jobs, client)
    await faulty_pg.restart("immediate", down_for=3)  # past the leases (2 s)
    await wait_for(lambda: jobs.all_finished(client), 40)
    await jobs.check(client)
    jobs.check_pace()
    await client.aclose()


async def test_kill9_of_the_owner_in_a_cluster_of_three(
    instances: Instances, nursery: trio.Nursery
) -> None:
    site, rx = await _setup(nursery)
    # Leases of 5 s: with several crawls committing on three instances, PostgreSQL's deadlock
    # detection (1 s) delays renewals past 2 s leases on a busy machine.
    for name in ("a", "b", "c"):
        instances.add(name, CRAWL_TOML, lease="5s")
        instances.spawn(name)
    for name in ("a", "b", "c"):
        await instances.wait_healthy(name)
    client = {n: instances.client(n, timeout=15)
              for n in ("a", "b", "c")}  # fmt: skip
    jobs = Jobs(site, rx)
    await jobs.start(client["a"])  # a, the creator, drains every job's webhook stream
    paced = f"crawl:{jobs.ids['paced']}"

    async def paced_owner() -> set[str]:
        view = await instances.cluster("a")
        return {m["instance"] for m in view["members"] if paced in m["holds"]}

    holders = await wait_for(paced_owner, 10)
    holds = (await instances.cluster("a"))["by_name"]["a"]["holds"]
    assert all(f"webhook:{job_id}" in holds for job_id in jobs.ids.values()), holds
    await _mid_way(jobs, client["a"], may_end=frozenset({"batch"}))
    killed = {"a", *holders}  # the owner of the drainers and the owner of the paced crawl
    for name in sorted(killed):
        instances.kill9(name)
    survivor = min({"a", "b", "c"} - killed)
    await wait_for(lambda: jobs.all_finished(client[survivor]), 40)
    await jobs.check(client[survivor])
    jobs.check_pace()
    for c in client.values():
        await c.aclose()


async def test_sigterm_of_the_last_instance_leaves_the_jobs_to_the_next_start(
    instances: Instances, nursery: trio.Nursery
) -> None:
    site, rx = await _setup(nursery)
    client = await _one_instance(instances)
    jobs = Jobs(site, rx)
    await jobs.start(client)
    await _mid_way(jobs, client)
    assert await instances.stop("a") == 0
    assert [jobs.terminal(name) for name in jobs.ids] == [None, None, None]
    await instances.start("a")
    await wait_for(lambda: jobs.all_finished(client), 40)
    await jobs.check(client)
    jobs.check_pace()
    await client.aclose()


async def test_a_paced_crawl_moves_on_from_an_owner_paused_past_its_lease(
    instances: Instances, nursery: trio.Nursery
) -> None:
    site, rx = await _setup(nursery)
    # A process paused inside a transaction must not hold its row locks for the whole pause.
    dsn = instances.env[DSN_ENV]
    sep = "&" if "?" in dsn else "?"
    instances.env[DSN_ENV] = f"{dsn}{sep}options=-c%20idle_in_transaction_session_timeout%3D1000"
    for name in ("a", "b"):
        instances.add(name, CRAWL_TOML)
        instances.spawn(name)
    for name in ("a", "b"):
        await instances.wait_healthy(name)
    client = {n: instances.client(n, timeout=15)
              for n in ("a", "b")}  # fmt: skip
    jobs = Jobs(site, rx)
    origin = f"http://127.0.0.1:{site.port}"
    body = {"url": f"{origin}/chain/0", "sitemap": "skip", "crawlEntireDomain": True,
            "includePaths": ["^/chain/"], "delay": DELAY_S,
            "webhook": {"url": rx.url()}}  # fmt: skip
    jobs.ids["paced"] = (await client["a"].post("/v2/crawl", json=body)).json()["id"]
    lease = f"crawl:{jobs.ids['paced']}"

    async def owner() -> str | None:
        view = await instances.cluster("a")
        return next((m["instance"] for m in view["members"] if lease in m["holds"]), None)

    paused = await wait_for(owner, 10)
    other = "b" if paused == "a" else "a"
    await wait_for(lambda: jobs.hits("paced") >= PACED_PAGES // 4, 30)
    instances.pause(paused)
    before = jobs.hits("paced")
    await wait_for(lambda: jobs.hits("paced") > before + 2, 20)  # the other one took over
    assert await jobs.status(client[other], "paced") == "scraping"
    instances.resume(paused)
    await wait_for(lambda: jobs.all_finished(client[other]), 40)
    await jobs.check(client[paused])
    jobs.check_pace()
    for c in client.values():
        await c.aclose()
