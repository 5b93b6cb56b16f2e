"""The crawl area inside the daemon: /status, /metrics, reload of [crawl], job slots, routes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import trio

from daemon.app import Daemon
from daemon.crawl.runs import store as crawlstore
from daemon.crawl.runs.service import CrawlService
from daemon.fakes.site import SiteSim
from tests.conftest import unlabelled

from .conftest import CONFIG, wait_finished


async def test_status_and_metrics(client: httpx.AsyncClient, site: SiteSim) -> None:
    body = {"url": site.url("/chain/0"), "sitemap": "skip", "crawlEntireDomain": True,
            "includePaths": ["^/chain/"]}  # fmt: skip
    job_id = (await client.post("/v2/crawl", json=body)).json()["id"]
    assert await wait_finished(client, job_id) == "completed"
    with trio.fail_after(10):  # the run leaves the service just after the job's end is stored
        while (section := (await client.get("/status")).json()["crawl"])["jobs_running"]:
            await trio.sleep(0.05)
    assert section["pages_fetched"] >= 6 and section["jobs_running"] == 0
    metrics = unlabelled((await client.get("/metrics")).text)
    assert 'crawld_crawl_pages_total{outcome="fetched"}' in metrics
    assert 'crawld_crawl_jobs_total{kind="crawl",status="completed"}' in metrics
    openapi = (await client.get("/openapi.json")).json()
    assert {"/v2/scrape", "/v2/crawl", "/v2/crawl/active", "/v2/batch/scrape", "/v2/map",
            "/v2/batch/scrape/{id}", "/v2/batch/scrape/{id}/errors"} <= set(openapi["paths"])  # fmt: skip


async def test_reload_applies_limits_to_new_jobs(
    daemon: Daemon, client: httpx.AsyncClient, site: SiteSim, tmp_path: Path
) -> None:
    service: CrawlService = daemon.parts["crawl"]
    old = service.engine
    (tmp_path / "crawld.toml").write_text(CONFIG.replace("concurrency = 8", "concurrency = 3")
                                          + "max_running_jobs = 1\n")  # fmt: skip
    assert await daemon.reload()
    assert service.engine is not old and service.engine.fetch_slots.total_tokens == 3
    site.slow_seconds = 30
    slow = (await client.post("/v2/crawl", json={"url": site.url("/slow")})).json()["id"]
    waiting = (await client.post("/v2/crawl", json={"url": site.url("/about")})).json()["id"]
    with trio.fail_after(5):
        while (await client.get("/status")).json()["crawl"]["jobs_queued"] != 1:
            await trio.sleep(0.01)
    assert (await client.get(f"/v2/crawl/{waiting}")).json()["status"] == "scraping"
    assert (await client.delete(f"/v2/crawl/{waiting}")).status_code == 200  # cancel while waiting
    assert await wait_finished(client, waiting) == "cancelled"
    assert (await client.delete(f"/v2/crawl/{slow}")).status_code == 200
    assert await wait_finished(client, slow) == "cancelled"


async def test_batch_ids_are_not_crawls(client: httpx.AsyncClient, site: SiteSim, sdk: Any) -> None:
    batch = (await client.post("/v2/batch/scrape", json={"urls": [site.url("/about")]})).json()
    assert await wait_finished(client, batch["id"], "batch") == "completed"
    active = (await client.get("/v2/crawl/active")).json()
    assert active == {"success": True, "crawls": []}


async def test_a_job_whose_plan_cannot_be_read_fails_instead_of_stopping_the_area(
    daemon: Daemon, client: httpx.AsyncClient
) -> None:
    service: CrawlService = daemon.parts["crawl"]
    job_id = await service.jobs.create_job(
        "crawl", webhook=None, source={},
        setup=lambda c, j: crawlstore.insert_job(c, j, "crawl", "http://s.test/", b"{}"),
    )  # fmt: skip
    row = await service.store.read(lambda c: crawlstore.get_job(c, job_id))
    assert row is not None
    service._spawn(row)
    assert await wait_finished(client, job_id) == "failed"
    assert daemon.component_states["crawl"].state == "running"
