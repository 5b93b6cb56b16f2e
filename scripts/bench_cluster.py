"""Cluster mode: one crawld instance against three on the same work, all on one PostgreSQL schema
(`tests/cluster/harness.py` runs them; a fresh schema per measurement). Interleaved rounds
(1 instance, then 3, each round), medians.

- Crawl: a latency-bound site (`daemon.fakes.site`, every tree page answering after 100-200 ms,
  served in this process) crawled from /pages/0 and its sitemap (every tenth page, so the
  frontier is wide from the start) with the same per-instance `[crawl] concurrency`; pages/s
  from the POST to status `completed`, 3 instances / 1 (goal >= 2.7x), and every page fetched
  once (the site counts its hits per path). Baseline: a plain trio + httpx crawler of the same
  pages in its own process (imports nothing from `daemon`) at the concurrency of one instance
  and of three: what the latency allows.
- Tracker: 600 tracked songs whose normal schedules fall due within 3 s (a backlog), one relay
  proxy per instance (`/_sim/relay/<instance>` of the Bilibili simulator, each a client of its
  own with the simulator's per-client limits, bulk requests at --bulk-rate/s over 2 s);
  snapshots/s from the first due instant until --measure songs (300) have their new snapshot,
  3 / 1 (goal >= 2.7x), and the simulator's -412 answers (goal 0). Baseline: what the proxies'
  bulk limits allow (rate x bulk size x proxies).
- Failover: three instances crawl a tree twice as large; at a third of it the busiest instance
  (most `crawld_crawl_pages_total`) is killed with SIGKILL; the seconds until a survivor's
  /v2/crawl/{id} shows the next completed page, until the pages the killed one had claimed are
  fetched again (goal <= lease + 2 s), until the crawl completes, and the pages fetched twice.

Scaling needs the crawl frontier and the tracker's schedules to be claimable by every instance;
before that the three-instance figures show what one instance does.

Usage: .venv/bin/python scripts/bench_cluster.py [--pages 200] [--concurrency 4] [--rounds 2]
       [--bulk-rate 1] [--lease 2s] [--measure 300] [--only crawl|tracker|failover ...]
Needs PostgreSQL at CRAWLD_TEST_PG_DSN (default postgresql://postgres@127.0.0.1:5432/postgres).
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import statistics
import sys
import tempfile
import textwrap
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from daemon.config_types import Duration, parse_duration  # noqa: E402
from daemon.fakes.bilibili import BilibiliSim, serve_sim  # noqa: E402
from daemon.fakes.site import SiteSim, serve_site  # noqa: E402
from daemon.tracker.config import Limit  # noqa: E402
from tests.cluster.harness import Instances, wait_for  # noqa: E402
from tests.conftest import PG_DSN, pg_backend  # noqa: E402
from tests.tracker.test_tracker_process import HOUR, SONGS, read, seed  # noqa: E402

NAMES = ("a", "b", "c")
LATENCY = (0.1, 0.2)
BULK_SIZE = 30
FAILOVER_WAIT_S = 30
BURST_S = 2
"""Bulk limits are `rate x 2` per 2 s: a small burst absorbs uneven transit (one per 1 s exactly
would answer -412 to a request that arrives a little early after one that came late), small
next to the 300 songs timed."""

BASELINE = textwrap.dedent(
    r"""
    import json, math, re, sys, time
    import httpx, trio

    start, concurrency = sys.argv[1], int(sys.argv[2])
    base = start.split("/pages/")[0]

    async def main():
        limits = httpx.Limits(max_connections=concurrency)
        async with httpx.AsyncClient(limits=limits, trust_env=False, timeout=30) as client:
            sitemap = (await client.get(base + "/sitemap-pages.xml")).text
            listed = re.findall(r"<loc>[^<]*?(/pages/\d+)</loc>", sitemap)
            seen = {start} | {base + path for path in listed}
            pages, outstanding = 0, len(seen)
            send, recv = trio.open_memory_channel(math.inf)
            for url in seen:
                send.send_nowait(url)

            async def worker():
                nonlocal outstanding, pages
                async for url in recv:
                    response = await client.get(url)
                    pages += 1
                    for href in re.findall(r'href="(/pages/\d+)"', response.text):
                        if base + href not in seen:
                            seen.add(base + href)
                            outstanding += 1
                            send.send_nowait(base + href)
                    outstanding -= 1
                    if outstanding == 0:
                        send.close()

            t0 = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for _ in range(concurrency):
                    nursery.start_soon(worker)
            return pages, time.perf_counter() - t0

    pages, seconds = trio.run(main)
    print(json.dumps({"pages": pages, "seconds": seconds}))
    """
)


@asynccontextmanager
async def cluster(root: Path, base: str, lease: str) -> AsyncIterator[Instances]:
    """Instances on a fresh schema, dropped afterwards."""
    schema = f"crawld_bench_{uuid.uuid4().hex[:12]}"
    instances = Instances(root / schema, PG_DSN, schema, base=base, lease=lease)
    try:
        yield instances
    finally:
        await instances.aclose()
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


async def start_all(instances: Instances, names: tuple[str, ...]) -> None:
    async with trio.open_nursery() as nursery:
        for name in names:
            nursery.start_soon(instances.start, name, 60)


def crawl_base(concurrency: int) -> str:
    return f'[crawl]\nallow_cidrs = ["127.0.0.0/8"]\nconcurrency = {concurrency}\n'


def tree_hits(site: SiteSim) -> Counter[str]:
    """Requests per tree page (not the sitemap probes under /pages/0/)."""
    return Counter({p: n for p, n in site.counts.items() if re.fullmatch(r"/pages/\d+", p)})


async def post_crawl(instances: Instances, key: str, site: SiteSim) -> str:
    body = {
        "url": f"http://127.0.0.1:{site.port}/pages/0",
        "sitemap": "include",
        "crawlEntireDomain": True,
        "includePaths": ["^/pages/"],
    }
    response = await instances.http.post(instances.url(key) + "/v2/crawl", json=body)
    response.raise_for_status()
    return str(response.json()["id"])


async def crawl_status(instances: Instances, key: str, job: str) -> dict[str, Any]:
    response = await instances.get(key, f"/v2/crawl/{job}?limit=1")
    result: dict[str, Any] = response.json()
    return result


async def crawl_once(
    n: int, args: argparse.Namespace, root: Path, nursery: trio.Nursery
) -> dict[str, Any]:
    site = SiteSim(pages=args.pages, paragraphs=1, latency=LATENCY)
    stop = trio.Event()
    await nursery.start(functools.partial(serve_site, site, shutdown=stop))
    try:
        async with cluster(root, crawl_base(args.concurrency), args.lease) as instances:
            await start_all(instances, NAMES[:n])
            job = await post_crawl(instances, "a", site)
            t0 = time.perf_counter()
            status = await wait_for(lambda: finished(instances, "a", job), 600, every=0.05)
            seconds = time.perf_counter() - t0
            cpu = sum(instances[k].cpu_seconds() for k in NAMES[:n])
    finally:
        stop.set()
    hits = tree_hits(site)
    expected = {f"/pages/{i}" for i in range(args.pages)}
    return {
        "pages_per_s": status["completed"] / seconds,
        "completed": status["completed"],
        "status": status["status"],
        "missing": len(expected - set(hits)),
        "cpu_ms_per_page": 1000 * cpu / max(1, status["completed"]),
        "repeated": repeats(site),
    }


def repeats(site: SiteSim) -> int:
    """Tree pages fetched more than once (each extra fetch counted)."""
    return sum(k - 1 for k in tree_hits(site).values())


async def finished(instances: Instances, key: str, job: str) -> dict[str, Any] | None:
    status = await crawl_status(instances, key, job)
    return None if status["status"] == "scraping" else status


async def baseline_crawl(
    concurrency: int, args: argparse.Namespace, nursery: trio.Nursery
) -> float:
    site = SiteSim(pages=args.pages, paragraphs=1, latency=LATENCY)
    stop = trio.Event()
    await nursery.start(functools.partial(serve_site, site, shutdown=stop))
    try:
        done = await trio.run_process(
            [sys.executable, "-c", BASELINE, f"http://127.0.0.1:{site.port}/pages/0",
             str(concurrency)],
            capture_stdout=True,
        )  # fmt: skip
    finally:
        stop.set()
    result = json.loads(done.stdout)
    return float(result["pages"] / result["seconds"])


def tracker_base(sim_url: str) -> str:
    return textwrap.dedent(
        f"""
        [tracker]
        enabled = true
        base_url = "{sim_url}"
        bulk_tick = "1s"
        window = "5s"
        """
    )


def relay(name: str, sim_url: str, rate: int) -> str:
    return textwrap.dedent(
        f"""
        [[tracker.proxies]]
        name = "relay-{name}"
        kind = "relay"
        url = "{sim_url}/_sim/relay/{name}"
        bulk_limits = [{{ requests = {rate * BURST_S}, per = "{BURST_S}s" }}]
        """
    )


async def tracker_once(
    n: int, args: argparse.Namespace, root: Path, nursery: trio.Nursery
) -> dict[str, Any]:
    bulk = Limit(requests=args.bulk_rate * BURST_S, per=Duration(BURST_S))
    sim = BilibiliSim(seed=1, bulk_limits=[bulk])
    stop = trio.Event()
    host, port = await nursery.start(
        functools.partial(serve_sim, sim, "127.0.0.1:0", shutdown=stop)
    )
    sim_url = f"http://{host}:{port}"
    try:
        async with cluster(root, tracker_base(sim_url), args.lease) as instances:
            for name in NAMES[:n]:
                instances.add(name, relay(name, sim_url, args.bulk_rate))
            await start_all(instances, NAMES[:n])
            db = pg_backend(PG_DSN, instances.schema)
            now = int(time.time() * 1000)
            await seed(db, sim, now)
            due_at = now / 1000 + 2.0

            async def stored() -> int:
                rows = await read(
                    db,
                    "SELECT count(DISTINCT aid) FROM tracker_snapshots WHERE at_ms > ?",
                    now - HOUR,
                )
                return int(rows[0][0])

            await wait_for(lambda: enough_stored(stored, args.measure), 300, every=0.1)
            seconds = time.time() - due_at
    finally:
        stop.set()
    clients = {c: k for c, k in sim.requests_by_client.items() if c.startswith("relay:")}
    return {
        "snapshots_per_s": args.measure / seconds,
        "rejected_412": sim.rejected_412,
        "rejected_by_client": dict(sim.rejected_by_client),
        "by_endpoint": dict(sim.requests),
        "by_relay": clients,
    }


async def enough_stored(stored: Any, songs: int) -> bool:
    return bool(await stored() >= songs)


async def failover(args: argparse.Namespace, root: Path, nursery: trio.Nursery) -> dict[str, Any]:
    pages = args.pages * 2
    site = SiteSim(pages=pages, paragraphs=1, latency=LATENCY)
    stop = trio.Event()
    await nursery.start(functools.partial(serve_site, site, shutdown=stop))
    try:
        async with cluster(root, crawl_base(args.concurrency), args.lease) as instances:
            await start_all(instances, NAMES)
            job = await post_crawl(instances, "a", site)
            await wait_for(lambda: sum(tree_hits(site).values()) >= pages // 3, 300, every=0.02)
            done_by = {k: await pages_done(instances, k) for k in NAMES}
            busiest = max(NAMES, key=lambda k: done_by[k])
            survivor = next(k for k in NAMES if k != busiest)
            before = (await crawl_status(instances, survivor, job))["completed"]
            instances.kill9(busiest)
            t_kill = time.perf_counter()
            next_s: float | None = None
            complete_s: float | None = None
            reclaim_s: float | None = None
            with trio.move_on_after(FAILOVER_WAIT_S):
                while True:
                    status = await crawl_status(instances, survivor, job)
                    if next_s is None and status["completed"] > before:
                        next_s = time.perf_counter() - t_kill
                    if reclaim_s is None and repeats(site) > 0:
                        reclaim_s = time.perf_counter() - t_kill
                    if status["status"] != "scraping":
                        complete_s = time.perf_counter() - t_kill
                        break
                    await trio.sleep(0.02)
    finally:
        stop.set()
    return {
        "busiest": busiest,
        "pages_done_before": done_by,
        "next_progress_s": next_s,
        "complete_s": complete_s,
        "reclaim_s": reclaim_s,
        "status": status["status"],
        "completed": status["completed"],
        "pages": pages,
        "repeated": repeats(site),
    }


async def pages_done(instances: Instances, key: str) -> float:
    text = await instances.metrics(key)
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("crawld_crawl_pages_total"))  # fmt: skip


def ratio(many: list[float], one: list[float]) -> str:
    return f"{statistics.median(many) / statistics.median(one):.2f}x"


async def run(args: argparse.Namespace) -> None:
    only = set(args.only or ["crawl", "tracker", "failover"])
    lease_s = float(parse_duration(args.lease))
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        root = Path(tmp)
        async with trio.open_nursery() as nursery:
            crawl: dict[int, list[dict[str, Any]]] = {1: [], 3: []}
            tracker: dict[int, list[dict[str, Any]]] = {1: [], 3: []}
            baseline: dict[int, list[float]] = {1: [], 3: []}
            for r in range(args.rounds):
                for n in (1, 3):
                    if "crawl" in only:
                        baseline[n].append(
                            await baseline_crawl(n * args.concurrency, args, nursery)
                        )
                        crawl[n].append(await crawl_once(n, args, root, nursery))
                        print(f"round {r + 1}: crawl, {n} instance(s): {crawl[n][-1]}", flush=True)
                    if "tracker" in only:
                        tracker[n].append(await tracker_once(n, args, root, nursery))
                        print(f"round {r + 1}: tracker, {n} instance(s): {tracker[n][-1]}",
                              flush=True)  # fmt: skip
            fail = await failover(args, root, nursery) if "failover" in only else None
            nursery.cancel_scope.cancel()

    print()
    print(
        f"medians of {args.rounds} interleaved rounds; lease {args.lease}; PostgreSQL schema per"
        " measurement"
    )
    if "crawl" in only:
        rate = {n: [m["pages_per_s"] for m in crawl[n]] for n in (1, 3)}
        print(
            f"crawl: {args.pages} pages answering in {LATENCY[0]:g}-{LATENCY[1]:g} s,"
            f" concurrency {args.concurrency} per instance"
        )
        for n in (1, 3):
            print(
                f"  {n} instance(s) {statistics.median(rate[n]):8.1f} pages/s   plain crawler at"
                f" concurrency {n * args.concurrency} (baseline)"
                f" {statistics.median(baseline[n]):8.1f} pages/s"
                f" ({ratio(rate[n], baseline[n])})"
            )
        repeated = [m["repeated"] for n in (1, 3) for m in crawl[n]]
        missing = [m["missing"] for n in (1, 3) for m in crawl[n]]
        print(
            f"  3 vs 1: {ratio(rate[3], rate[1])} (goal >= 2.7x); pages fetched twice: max"
            f" {max(repeated)}, never fetched: max {max(missing)}"
        )
    if "tracker" in only:
        rate = {n: [m["snapshots_per_s"] for m in tracker[n]] for n in (1, 3)}
        print(
            f"tracker: the first {args.measure} of {SONGS} due songs, one relay per instance at"
            f" {args.bulk_rate} bulk request/s"
            f" of {BULK_SIZE}"
        )
        for n in (1, 3):
            ceiling = n * args.bulk_rate * BULK_SIZE
            print(
                f"  {n} instance(s) {statistics.median(rate[n]):8.1f} snapshots/s   the proxies'"
                f" limits allow (baseline) {ceiling:8.1f} snapshots/s"
                f" ({statistics.median(rate[n]) / ceiling:.2f}x)"
            )
        rejected = max(m["rejected_412"] for n in (1, 3) for m in tracker[n])
        by_relay = [m["by_relay"] for m in tracker[3]]
        print(
            f"  3 vs 1: {ratio(rate[3], rate[1])} (goal >= 2.7x); -412 answers: max {rejected}"
            f" (goal 0); requests per relay with 3:"
            f" {by_relay}"
        )
    if fail is not None:
        goal = f" (goal <= {lease_s + 2:g} s)"
        print(
            f"failover: kill -9 of the busiest of 3 ({fail['busiest']}, pages done per"
            f" instance {fail['pages_done_before']}) a third into {fail['pages']} pages"
        )
        print(
            f"  next progress seen by a survivor: {_seconds(fail['next_progress_s'])}{goal};"
            f" crawl {fail['status']} ({fail['completed']} pages)"
            f" {_seconds(fail['complete_s'])} after the kill; its in-flight pages fetched again"
            f" from {_seconds(fail['reclaim_s'])} after it (goal <= {lease_s + 2:g} s); pages"
            " fetched twice:"
            f" {fail['repeated']}"
        )


def _seconds(value: float | None) -> str:
    return f"none within {FAILOVER_WAIT_S} s" if value is None else f"{value:.2f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--bulk-rate", type=int, default=1)
    parser.add_argument("--lease", default="2s")
    parser.add_argument(
        "--measure", type=int, default=SONGS // 2, help="tracker: songs timed (of the 600 due)"
    )
    parser.add_argument("--only", action="append", choices=["crawl", "tracker", "failover"])
    args = parser.parse_args()
    trio.run(run, args)


if __name__ == "__main__":
    main()
