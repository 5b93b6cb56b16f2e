"""A collector run's job inside a running daemon (SQLite, the embedded queue): only a user or the
configuration ends it `cancelled`, with an error saying which; a reload changing the task or a
restart of the daemon leaves it running and the next run continues the same job id."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from daemon.app import Daemon
from daemon.collector import runrules
from daemon.collector.crawler import TaskCrawler
from daemon.fakes.octoparse import DEMO_PASSWORD, OctoparseSim, serve_sim
from daemon.jobs import store as jobstore
from daemon.store import open_store
from tests.conftest import serve_daemon

DAY = 86_400_000
ROWS = 600

TEMPLATE = """
[daemon]
state_dir = "state"
[crawl.browser]
enabled = false
[http]
bind = "127.0.0.1:0"
[collector]
auto_start = false
batch_size = {batch}
[[collector.accounts]]
name = "main"
base_url = "{base}"
username = "demo"
password_env = "SIM_PW"
rate_limit = 20.0
{tasks}
"""

TASK = """
[[collector.tasks]]
id = "alpha"
account = "main"
task_id = "{task_id}"
date_field = "发布时间"
"""


@dataclass
class Env:
    sim: OctoparseSim
    task_id: str
    base: str
    path: Path
    http: httpx.AsyncClient
    nursery: trio.Nursery
    daemon: Daemon | None = None

    def write(self, *, listed: bool = True, batch: int = 50) -> None:
        tasks = TASK.format(task_id=self.task_id) if listed else ""
        self.path.write_text(TEMPLATE.format(base=self.base, tasks=tasks, batch=batch))

    async def start(self) -> Daemon:
        self.daemon = await serve_daemon(self.nursery, self.path)
        return self.daemon

    async def stop(self) -> None:
        assert self.daemon is not None
        self.daemon.request_stop()
        await self.daemon.stopped.wait()

    def url(self, path: str) -> str:
        assert self.daemon is not None and self.daemon.http_address is not None
        host, port = self.daemon.http_address
        return f"http://{host}:{port}{path}"

    def crawler(self) -> TaskCrawler:
        assert self.daemon is not None
        crawler: TaskCrawler = self.daemon.parts["collector"].crawler("alpha")
        return crawler

    async def start_run(self) -> str:
        r = await self.http.post(self.url("/crawl/start"), json={"task_id": "alpha"})
        assert r.status_code == 200, r.text
        job_id: str = r.json()["started"][0]["job_id"]
        return job_id

    async def mid_run(self, windows: int = 2) -> None:
        with trio.fail_after(30):
            while (run := self.crawler().current) is None or run.windows < windows:
                await trio.sleep(0.005)

    async def job(self, job_id: str) -> Any:
        assert self.daemon is not None
        return await self.daemon.parts["jobs"].get_job(job_id)

    async def wait_finished(self, job_id: str) -> Any:
        with trio.fail_after(30):
            while not (record := await self.job(job_id)).finished:
                await trio.sleep(0.01)
        return record

    async def queued(self) -> list[str]:
        r = await self.http.post(self.url("/consume"), json={"count": 1000})
        return [m["message_id"] for m in r.json()["messages"]]


@pytest.fixture
async def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Env]:
    monkeypatch.setenv("SIM_PW", DEMO_PASSWORD)
    sim = OctoparseSim()
    task_id = sim.add_task("alpha")
    now = int(time.time() * 1000)
    sim.append_dated(task_id, [now - DAY + i for i in range(ROWS)])
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        host, port = await nursery.start(
            lambda task_status: serve_sim(
                sim, "127.0.0.1:0", shutdown=stop, task_status=task_status
            )
        )
        async with httpx.AsyncClient(timeout=30) as http:
            env = Env(
                sim, task_id, f"http://{host}:{port}", tmp_path / "crawld.toml", http, nursery
            )
            env.write()
            await env.start()
            yield env
            if env.daemon is not None and not env.daemon.stopped.is_set():
                await env.stop()
        stop.set()


async def test_a_restart_mid_run_continues_the_same_job(env: Env) -> None:
    job_id = await env.start_run()
    await env.mid_run()
    assert env.daemon is not None and env.daemon.store is not None
    path = env.daemon.store.path
    await env.stop()  # SIGTERM: the run is cut short, its job stays running
    async with open_store(path) as store:
        record = await store.read(lambda c: jobstore.get_job(c, job_id))
    assert record is not None and (record.status, record.error) == ("scraping", None)
    await env.start()  # no auto_start: the job left running continues at once
    record = await env.wait_finished(job_id)
    assert (record.status, record.error, record.completed) == ("completed", None, ROWS)
    last = env.crawler().last_result
    assert last is not None and last.continues and last.job_id == job_id
    ids = await env.queued()
    assert len(ids) == len(set(ids)) == ROWS


async def test_a_reload_changing_the_task_continues_the_same_job(env: Env) -> None:
    job_id = await env.start_run()
    await env.mid_run()
    env.write(batch=100)
    assert env.daemon is not None and await env.daemon.reload()
    record = await env.wait_finished(job_id)
    assert (record.status, record.error, record.completed) == ("completed", None, ROWS)
    assert len(set(await env.queued())) == ROWS


async def test_a_reload_removing_the_task_cancels_its_job_saying_so(env: Env) -> None:
    job_id = await env.start_run()
    await env.mid_run()
    env.write(listed=False)
    assert env.daemon is not None and await env.daemon.reload()
    record = await env.wait_finished(job_id)
    assert (record.status, record.error) == ("cancelled", runrules.TASK_REMOVED)


async def test_a_user_stop_cancels_the_job_saying_so(env: Env) -> None:
    job_id = await env.start_run()
    await env.mid_run()
    r = await env.http.post(env.url("/crawl/stop"), json={"task_id": "alpha"})
    assert r.status_code == 200 and r.json()["stopped"] == ["alpha"], r.text
    record = await env.wait_finished(job_id)
    assert (record.status, record.error) == ("cancelled", "stopped by a user (POST /crawl/stop)")
    assert env.crawler().last_result is not None
    assert env.crawler().last_result.status == "stopped"


async def test_a_delete_of_the_job_cancels_it_saying_so(env: Env) -> None:
    job_id = await env.start_run()
    await env.mid_run()
    r = await env.http.delete(env.url(f"/v2/crawl/{job_id}"))
    assert r.status_code == 200, r.text
    record = await env.wait_finished(job_id)
    assert (record.status, record.error) == (
        "cancelled",
        "cancelled by a user (DELETE /v2/crawl/{id})",
    )
    body = (await env.http.get(env.url(f"/v2/crawl/{job_id}"))).json()
    assert body["status"] == "cancelled"
