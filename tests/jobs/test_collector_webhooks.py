"""A collector run through the whole daemon: its rows, counters and webhook events come from
`page_in_tx` inside the collector's own window transactions."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from daemon.app import Daemon
from daemon.fakes.octoparse import DEMO_PASSWORD, OctoparseSim, serve_sim
from daemon.fakes.receiver import WebhookReceiver
from daemon.jobs.manager import JobManager
from daemon.outbox import now_ms
from daemon.store import one
from tests.conftest import serve_daemon
from tests.jobs.conftest import SECRET_ENV

CONFIG = f"""
[daemon]
state_dir = "state"
[crawl.browser]
enabled = false
[http]
bind = "127.0.0.1:0"
[collector]
auto_start = false
batch_size = 50
[[collector.accounts]]
name = "main"
base_url = "{{base}}"
username = "demo"
password_env = "SIM_PW"
[[collector.tasks]]
id = "alpha"
account = "main"
task_id = "{{task_id}}"
date_field = "发布时间"
webhook = {{{{ url = "{{hook}}", metadata = {{{{ source = "octoparse" }}}} }}}}
[webhooks]
secret_env = "{SECRET_ENV}"
timeout = "1s"
retry_schedule = ["10ms"]
allow_cidrs = ["127.0.0.0/8"]
"""


@contextlib.asynccontextmanager
async def collector_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hook: str, extra_config: str = ""
) -> AsyncIterator[tuple[OctoparseSim, Daemon, httpx.AsyncClient, str]]:
    """The simulator (task "alpha", 120 rows of the last hour), the daemon of CONFIG (plus
    `extra_config`), an HTTP client and the API's base URL; all stopped on exit."""
    monkeypatch.setenv("SIM_PW", DEMO_PASSWORD)
    sim = OctoparseSim()
    task_id = sim.add_task("alpha")
    sim.append_dated(task_id, [now_ms() - 3_600_000 + i for i in range(120)])
    stop = trio.Event()
    async with trio.open_nursery() as nursery, httpx.AsyncClient(trust_env=False) as http:
        host, port = await nursery.start(
            lambda task_status: serve_sim(
                sim, "127.0.0.1:0", shutdown=stop, task_status=task_status
            )
        )
        path = tmp_path / "crawld.toml"
        base = f"http://{host}:{port}"
        path.write_text(CONFIG.format(base=base, task_id=task_id, hook=hook) + extra_config)
        daemon = await serve_daemon(nursery, path)
        assert daemon.http_address is not None
        try:
            yield sim, daemon, http, "http://{}:{}".format(*daemon.http_address)
        finally:
            daemon.request_stop()
            stop.set()


async def test_a_collector_run_is_a_job_with_ordered_webhooks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rx: WebhookReceiver
) -> None:
    async with collector_daemon(tmp_path, monkeypatch, rx.url()) as (sim, daemon, http, api):
        answer = await http.post(f"{api}/crawl/start", json={"task_id": "alpha"})
        assert answer.status_code == 200, answer.text
        job = answer.json()["started"][0]["job_id"]
        jobs: JobManager = daemon.jobs
        with trio.fail_after(20):
            await jobs.wait_drained(job)
        status = (await http.get(f"{api}/v2/crawl/{job}?limit=1000")).json()
        queued = await daemon.store.read(
            lambda c: c.execute(
                "SELECT body, row_job, row_n FROM outbox_items"
                " WHERE stream LIKE 'queue:%' ORDER BY seq"
            ).fetchall()
        )
        consumed = (await http.post(f"{api}/consume", json={"count": 1000})).json()["messages"]

        # A webhook given with the request replaces the task's, with its own event filter.
        [task_id] = sim.tasks
        sim.append_dated(task_id, [now_ms() + i for i in range(30)])
        answer = await http.post(
            f"{api}/crawl/start",
            json={
                "task_id": "alpha",
                "webhook": {"url": rx.url("/other"), "events": ["completed"]},
            },
        )
        assert answer.status_code == 200, answer.text
        second = answer.json()["started"][0]["job_id"]
        with trio.fail_after(20):
            await jobs.wait_drained(second)

    rx.check()
    events = rx.events(job)
    types = [r.type for r in events]
    assert types[0] == "crawl.started" and types[-1] == "crawl.completed"
    assert set(types[1:-1]) == {"crawl.page"}
    assert [r.seq for r in events] == list(range(1, len(events) + 1))
    assert all(r.json["metadata"] == {"source": "octoparse"} for r in events)
    pages = [row for r in events[1:-1] for row in r.json["data"]]
    assert len(pages) == 120
    assert (status["status"], status["completed"]) == ("completed", 120)
    assert status["data"] == pages  # GET shows the rows the page events carried, in order
    # Each row is stored once, as the job's row; its queue item points there and reads it back.
    assert queued == [(b"", job, n) for n in range(1, 121)]
    assert [m["body"] for m in consumed] == pages
    [only] = rx.events(second)
    assert (only.type, only.seq, only.path) == ("crawl.completed", 1, "/other")
    assert "metadata" in only.json and only.json["metadata"] == {}


async def test_rows_waiting_for_the_queue_outlive_their_expired_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rx: WebhookReceiver
) -> None:
    # Nobody consumes while the run's job expires (jobs.ttl 1 ms): the job answers 404 like any
    # expired job, yet the cleanup keeps it, because its rows are the bodies of the queued
    # messages; once they are taken, the next cleanup deletes it and its rows.
    extra = '[jobs]\nttl = "1ms"\n'
    async with collector_daemon(tmp_path, monkeypatch, rx.url(), extra) as (_, daemon, http, api):
        answer = await http.post(f"{api}/crawl/start", json={"task_id": "alpha"})
        job = answer.json()["started"][0]["job_id"]
        jobs: JobManager = daemon.jobs
        with trio.fail_after(20):
            await jobs.wait_drained(job)
        while (await http.get(f"{api}/v2/crawl/{job}")).status_code != 404:
            await trio.sleep(0.005)  # the 1 ms ttl passes after the run completed
        assert await jobs.cleanup_once() == 0
        consumed = (await http.post(f"{api}/consume", json={"count": 1000})).json()["messages"]
        assert await jobs.cleanup_once() == 1

        def left(conn: Any) -> tuple[int, int]:
            return one(conn, "SELECT (SELECT count(*) FROM jobs), (SELECT count(*) FROM job_rows)")

        remaining = await daemon.store.read(left)

    assert sorted(int(m["body"]["序号"]) for m in consumed) == list(range(120))
    assert remaining == (0, 0)
