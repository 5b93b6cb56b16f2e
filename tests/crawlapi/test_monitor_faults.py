"""A monitor check against faults of its store and its lease, with real crawld processes on
PostgreSQL (the kill -9 cases are test_monitor_crash.py and test_monitor_cluster.py):

- the database cut mid-check for 10 s (a TCP proxy between crawld and a private server, past
  the 2 s lease): the same check id resumes and completes;
- the instance working on the check paused (SIGSTOP) past its lease: the other instance takes
  the check over and completes it; the paused one, woken with fetches in flight, stores nothing.

Either way, read from the store afterwards: one check (the same id) `completed`, every page
exactly once with status `new` and the snapshot its page recorded, the summary counting each
once, and one `monitor.page` event per page before `monitor.check.completed`."""

from __future__ import annotations

import functools
from typing import Any

import msgspec
import pytest
import trio

from daemon.crawl.monitors import store as mstore
from daemon.fakes.receiver import WebhookReceiver
from daemon.fakes.site import SiteSim, serve_site
from daemon.store import open_store
from tests.cluster.harness import Instances, wait_for
from tests.conftest import pg_backend
from tests.pgfault import FaultyPg

pytestmark = [pytest.mark.process, pytest.mark.postgres]

PAGES = 30
EXTRA = """
[crawl]
allow_cidrs = ["127.0.0.0/8"]
concurrency = 2
[monitors]
check_concurrency = 2
[webhooks]
timeout = "2s"
retry_schedule = ["10ms", "20ms", "50ms", "100ms", "500ms", "1s"]
allow_cidrs = ["127.0.0.0/8"]
"""


async def start_check(instances: Instances, key: str, site: SiteSim, rx: WebhookReceiver
                      ) -> tuple[str, str, list[str]]:  # fmt: skip
    """A monitor of PAGES pages created on `key` and a manual run of it, a third of its pages
    done: (monitor id, check id, urls)."""
    urls = [f"http://127.0.0.1:{site.port}/pages/{i}" for i in range(PAGES)]
    body = {"name": "fault", "schedule": {"cron": "0 9 * * *"},
            "targets": [{"type": "scrape", "urls": urls}], "webhook": {"url": rx.url()}}  # fmt: skip
    base = instances.url(key)
    monitor_id = (await instances.http.post(f"{base}/v2/monitor", json=body)).json()["data"]["id"]
    run = await instances.http.post(f"{base}/v2/monitor/{monitor_id}/run")
    check_id = run.json()["data"]["id"]

    async def a_third() -> bool:
        return len(await done_pages(instances, key, monitor_id, check_id)) >= PAGES // 3

    await wait_for(a_third, 60)
    return monitor_id, check_id, urls


async def done_pages(instances: Instances, key: str, monitor_id: str, check_id: str
                     ) -> list[dict[str, Any]]:  # fmt: skip
    answer = await instances.get(key, f"/v2/monitor/{monitor_id}/checks/{check_id}?limit=1000")
    return list(answer.json()["data"]["pages"])


async def completed(instances: Instances, key: str, monitor_id: str, check_id: str) -> bool:
    answer = await instances.get(key, f"/v2/monitor/{monitor_id}/checks/{check_id}")
    return bool(answer.json()["data"]["status"] == "completed")


async def assert_whole(dsn: str, schema: str, monitor_id: str, check_id: str, urls: list[str],
                       rx: WebhookReceiver) -> None:  # fmt: skip
    """The check as the store has it: see the module docstring."""
    async with open_store(pg_backend(dsn, schema)) as store:
        checks = await store.read(lambda c: mstore.list_checks(c, monitor_id, 10, 0, None))
        pages = await store.read(lambda c: mstore.pages(c, check_id, 0, 1000, None))
        statuses, queued = await store.read(lambda c: mstore.status_counts(c, check_id))
        snapshots = await store.read(
            lambda c: {p.key: mstore.snapshot(c, monitor_id, p.target_id, p.key) for p in pages}
        )
    assert [(c.id, c.status) for c in checks] == [(check_id, "completed")]
    assert sorted(p.url for p in pages) == sorted(urls)  # every page, each once
    assert (statuses, queued) == (["new"] * PAGES, 0)
    for page in pages:  # the snapshot is the one its page recorded: nothing stored after
        snap = snapshots[page.key]
        assert snap is not None and snap.scrape_id == page.current_scrape, page.url
    assert msgspec.json.decode(checks[0].summary or b"{}") == {
        "totalPages": PAGES, "same": 0, "changed": 0, "new": PAGES, "removed": 0, "error": 0}  # fmt: skip
    await wait_for(lambda: any(e.type == "monitor.check.completed"
                               for e in rx.events(check_id)), 30)  # fmt: skip
    rx.check()  # in order, nothing after the terminal, a resend identical
    events = list({e.event_id: e for e in rx.events(check_id)}.values())
    kinds = [e.type for e in sorted(events, key=lambda e: e.seq or 0)]
    assert kinds == ["monitor.page"] * PAGES + ["monitor.check.completed"], kinds
    assert sorted(e.event["data"][0]["url"] for e in events if e.type == "monitor.page") == sorted(
        urls
    )


async def test_a_database_cut_mid_check_then_the_same_check_completes_with_every_page_once(
    faulty_instances: Instances, faulty_pg: FaultyPg, rx: WebhookReceiver, nursery: trio.Nursery
) -> None:
    site = SiteSim(pages=PAGES, paragraphs=1, latency=(0.1, 0.2))
    await nursery.start(functools.partial(serve_site, site))
    instances = faulty_instances
    instances.add("a", EXTRA)
    await instances.start("a")
    monitor_id, check_id, urls = await start_check(instances, "a", site, rx)
    await faulty_pg.outage(10)  # past the 2 s lease: the check's lease runs out
    assert len(await done_pages(instances, "a", monitor_id, check_id)) < PAGES, "over before"
    await wait_for(lambda: completed(instances, "a", monitor_id, check_id), 90)
    await assert_whole(faulty_pg.direct_dsn, faulty_pg.schema, monitor_id, check_id, urls, rx)
    assert await instances.stop("a") == 0


async def stored_pages(instances: Instances, check_id: str) -> int:
    async with open_store(pg_backend(instances.dsn, instances.schema)) as store:
        statuses, _ = await store.read(lambda c: mstore.status_counts(c, check_id))
    return len(statuses)


async def pages_counted(instances: Instances, key: str) -> int:
    """The pages of monitor checks `key` stored since it started (its /metrics)."""
    text = (await instances.get(key, "/metrics")).text
    lines = [ln for ln in text.splitlines() if ln.startswith("crawld_monitor_pages_total{")]
    return sum(int(float(ln.rsplit(" ", 1)[1])) for ln in lines)


async def working(instances: Instances, key: str, check_id: str) -> bool:
    """`key` runs the check and has stored a page of it."""
    run = (await instances.status(key))["crawl"]["monitors"]["checks"].get(check_id)
    return run is not None and run["pages_done"] > 0


async def test_a_lost_lease_mid_check_the_other_instance_completes_it_the_paused_one_stores_nothing(
    instances: Instances, rx: WebhookReceiver, nursery: trio.Nursery
) -> None:
    site = SiteSim(pages=PAGES, paragraphs=1, latency=(0.1, 0.2))
    await nursery.start(functools.partial(serve_site, site))
    for key in ("a", "b"):
        instances.add(key, EXTRA)
        await instances.start(key)
    monitor_id, check_id, urls = await start_check(instances, "a", site, rx)
    owners = [k for k in ("a", "b") if await working(instances, k, check_id)]
    assert len(owners) == 1, owners
    [owner] = owners
    other = "b" if owner == "a" else "a"
    instances.pause(owner)  # its fetches in flight finish once it is woken, after the takeover
    try:
        await trio.sleep(0.2)  # a commit the signal caught on its way lands (the lease is 2 s)
        stored_before = await stored_pages(instances, check_id)
        await wait_for(lambda: working(instances, other, check_id), 60)
        assert len(await done_pages(instances, other, monitor_id, check_id)) < PAGES
    finally:
        instances.resume(owner)

    async def let_go() -> bool:
        run = (await instances.status(owner))["crawl"]["monitors"]["checks"].get(check_id)
        return run is None

    await wait_for(let_go, 30)
    await wait_for(lambda: completed(instances, other, monitor_id, check_id), 90)
    await assert_whole(instances.dsn, instances.schema, monitor_id, check_id, urls, rx)
    # Woken, the paused instance stored no page: its count stayed where the pause left it.
    assert await pages_counted(instances, owner) == stored_before
    counted = {k: await pages_counted(instances, k) for k in (owner, other)}
    assert counted[other] == PAGES - stored_before, (counted, stored_before)
    for key in ("a", "b"):
        assert await instances.stop(key) == 0
