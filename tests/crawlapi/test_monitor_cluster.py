"""Two crawld processes on one PostgreSQL schema and monitors: each due monitor gets one
scheduled check (whichever instance claims it), and a check runs on one instance at a time
(lease `monitor:<check id>`); kill -9 of the one working on it: the other completes the same
check id with every page once."""

from __future__ import annotations

import functools
import time
from typing import Any

import pytest
import trio

from daemon.fakes.site import SiteSim, serve_site
from tests.cluster.harness import Instances, wait_for

pytestmark = pytest.mark.process

PAGES = 30
EVERY_MINUTE = 3


async def test_checks_are_created_once_and_move_to_the_other_instance_after_a_kill(
    instances: Instances, nursery: trio.Nursery
) -> None:
    site = SiteSim(pages=PAGES, paragraphs=1, latency=(0.1, 0.2))
    await nursery.start(functools.partial(serve_site, site))
    extra = ('[crawl]\nallow_cidrs = ["127.0.0.0/8"]\nconcurrency = 2\n'
             '[monitors]\nmin_interval = "1m"\ntick = "1s"\ncheck_concurrency = 2\n')  # fmt: skip
    for name in ("a", "b"):
        instances.add(name, extra)
        await instances.start(name)
    clients = {n: instances.client(n, timeout=10) for n in ("a", "b")}
    page = f"http://127.0.0.1:{site.port}/about"
    ticking = []
    for i in range(EVERY_MINUTE):
        body = {"name": f"tick{i}", "schedule": {"cron": "* * * * *"},
                "targets": [{"type": "scrape", "urls": [page]}]}  # fmt: skip
        ticking.append((await clients["a"].post("/v2/monitor", json=body)).json()["data"]["id"])

    async def checks(monitor_id: str, client: str = "b") -> list[dict[str, Any]]:
        path = f"/v2/monitor/{monitor_id}/checks"
        return list((await clients[client].get(path)).json()["data"])

    # Both instances look for due monitors every second: each due time gets one check.
    async def all_ran() -> bool:
        for m in ticking:
            made = await checks(m)
            if not made or any(c["status"] != "completed" for c in made):
                return False
        return True

    await wait_for(all_ran, 75)
    made = [c for m in ticking for c in await checks(m)]
    minutes = {c["scheduledFor"] for c in made}
    per_monitor = {m: len(await checks(m)) for m in ticking}
    assert all(c["trigger"] == "scheduled" for c in made), made
    assert set(per_monitor.values()) <= {1, 2} and len(minutes) <= 2, made  # a minute may pass
    for m in ticking:
        assert len({c["scheduledFor"] for c in await checks(m)}) == per_monitor[m]
        await clients["a"].patch(f"/v2/monitor/{m}", json={"status": "paused"})

    # A slow check, killed on the instance working on it.
    urls = [f"http://127.0.0.1:{site.port}/pages/{i}" for i in range(PAGES)]
    body = {"name": "slow", "schedule": {"cron": "0 9 * * *"},
            "targets": [{"type": "scrape", "urls": urls}]}  # fmt: skip
    monitor_id = (await clients["a"].post("/v2/monitor", json=body)).json()["data"]["id"]
    check_id = (await clients["a"].post(f"/v2/monitor/{monitor_id}/run")).json()["data"]["id"]
    path = f"/v2/monitor/{monitor_id}/checks/{check_id}?limit=1000"

    async def a_third() -> bool:
        return len((await clients["b"].get(path)).json()["data"]["pages"]) >= PAGES // 3

    await wait_for(a_third, 60)

    async def working(name: str) -> bool:
        status = (await clients[name].get("/status")).json()
        run = status["crawl"]["monitors"]["checks"].get(check_id)
        return run is not None and run["pages_done"] > 0

    owners = [n for n in ("a", "b") if await working(n)]
    assert len(owners) == 1, owners  # one instance at a time
    [owner] = owners
    other = "b" if owner == "a" else "a"
    instances.kill9(owner)
    started = time.monotonic()

    async def completed() -> bool:
        return bool((await clients[other].get(path)).json()["data"]["status"] == "completed")

    await wait_for(completed, 90)
    check = (await clients[other].get(path)).json()["data"]
    assert sorted(p["url"] for p in check["pages"]) == sorted(urls), time.monotonic() - started
    assert check["summary"]["new"] == PAGES and check["summary"]["totalPages"] == PAGES
    monitor = (await clients[other].get(f"/v2/monitor/{monitor_id}")).json()["data"]
    assert monitor["currentCheckId"] is None
    for client in clients.values():
        await client.aclose()
