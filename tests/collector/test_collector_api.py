"""The collector inside a running daemon: control API, embedded queue and reload."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import trio

from daemon.app import Daemon
from daemon.fakes.octoparse import DEMO_PASSWORD, OctoparseSim, serve_sim
from tests.conftest import serve_daemon

DAY = 86_400_000

TEMPLATE = """
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
base_url = "{base}"
username = "demo"
password_env = "SIM_PW"
{tasks}
{store}
"""

TASK = """
[[collector.tasks]]
id = "{id}"
account = "main"
task_id = "{task_id}"
date_field = "发布时间"
"""


@dataclass
class Running:
    daemon: Daemon
    sim: OctoparseSim
    path: Path
    base: str
    http: httpx.AsyncClient
    store: str = ""
    """The config's `[store]` section (the SQLite default when empty)."""

    def url(self, path: str) -> str:
        assert self.daemon.http_address is not None
        host, port = self.daemon.http_address
        return f"http://{host}:{port}{path}"

    def write(self, *task_ids: str) -> None:
        tasks = "".join(TASK.format(id=t, task_id=self.sim_task(t)) for t in task_ids)
        self.path.write_text(TEMPLATE.format(base=self.base, tasks=tasks, store=self.store))

    def sim_task(self, name: str) -> str:
        for task in self.sim.tasks.values():
            if task.name == name:
                return task.task_id
        now = int(time.time() * 1000)
        task_id = self.sim.add_task(name)
        self.sim.append_dated(task_id, [now - DAY + i for i in range(120)])
        return task_id

    async def wait_idle(self, task_id: str) -> None:
        crawler = self.daemon.parts["collector"].crawler(task_id)
        with trio.fail_after(30):
            while crawler.running:
                await trio.sleep(0.01)


@contextlib.asynccontextmanager
async def daemon_with_sim(tmp_path: Path, store: str = "") -> AsyncIterator[Running]:
    """A daemon listing tasks alpha and beta of a fresh Octoparse simulator; `store`: its
    `[store]` section (the SQLite default when empty)."""
    sim = OctoparseSim()
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        host, port = await nursery.start(
            lambda task_status: serve_sim(
                sim, "127.0.0.1:0", shutdown=stop, task_status=task_status
            )
        )
        path = tmp_path / "crawld.toml"
        async with httpx.AsyncClient() as http:
            base = f"http://{host}:{port}"
            r = Running(None, sim, path, base, http, store)  # type: ignore[arg-type]
            r.write("alpha", "beta")
            r.daemon = await serve_daemon(nursery, path)
            yield r
            r.daemon.request_stop()
        stop.set()


@pytest.fixture
async def running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Running]:
    monkeypatch.setenv("SIM_PW", DEMO_PASSWORD)
    async with daemon_with_sim(tmp_path) as opened:
        yield opened


@contextlib.contextmanager
def lease_row_locked(dsn: str, schema: str, name: str) -> Iterator[psycopg.Connection[Any]]:
    """A free lease row `name` that another session holds locked until its transaction ends
    (`.rollback()`): a take of the lease waits for it, as a busy database would make it wait."""
    with psycopg.connect(dsn) as conn:
        conn.execute(
            f'INSERT INTO "{schema}".cluster_leases(name, holder, token, acquired_ms, expires_ms)'
            " VALUES (%s, 'gone', 1, 0, 0)",
            (name,),
        )
        conn.commit()
        conn.execute(f'SELECT 1 FROM "{schema}".cluster_leases WHERE name = %s FOR UPDATE', (name,))
        yield conn


async def test_start_consume_and_queue_size(running: Running) -> None:
    http = running.http
    answer = await http.post(running.url("/crawl/start"), json={"task_id": "alpha"})
    assert answer.status_code == 200, answer.text
    assert [s["task_id"] for s in answer.json()["started"]] == ["alpha"]
    await running.wait_idle("alpha")

    size = (await http.get(running.url("/queue/size"))).json()
    assert size == {"queue": "job_data", "kind": "embedded", "size": 120}
    taken = (await http.get(running.url("/consume"), params={"count": 100})).json()
    assert taken["count"] == 100
    first = taken["messages"][0]
    assert first["body"]["序号"] == "70"  # the newest window comes first
    assert len(first["message_id"]) == 32
    assert first["headers"]["task_id"] == "alpha"
    assert 604_700_000 < int(first["expiration"]) <= 604_800_000
    assert (await http.get(running.url("/queue/size"))).json()["size"] == 20

    status = (await http.get(running.url("/status"))).json()
    alpha = next(t for t in status["collector"]["tasks"] if t["id"] == "alpha")
    assert alpha["last_run"]["status"] == "completed"
    assert alpha["last_run"]["published"] == 120
    assert status["broker"]["kind"] == "embedded"
    metrics = (await http.get(running.url("/metrics"))).text
    published = re.search(
        r'crawld_collector_rows_total\{outcome="published",task="alpha"\} (\S+)', metrics
    )
    assert published is not None and float(published.group(1)) >= 120  # the registry is per process
    assert 'crawld_collector_runs_total{status="completed",task="alpha"}' in metrics
    assert 'crawld_outbox_pending{stream="queue:job_data"} 20.0' in metrics


@pytest.mark.postgres
async def test_a_lone_instance_on_postgresql_answers_a_start_with_its_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pg_clean_schema: tuple[str, str]
) -> None:
    """A daemon alone on PostgreSQL whose first take of the task's lease is slow (the row is
    locked a moment): a start sent as soon as it serves runs there, and answers with the job as
    on SQLite, rather than a 202 leaving the start for no instance."""
    dsn, schema = pg_clean_schema
    monkeypatch.setenv("SIM_PW", DEMO_PASSWORD)
    monkeypatch.setenv("CRAWLD_TEST_STORE_DSN", dsn)
    store = f'[store]\nkind = "postgres"\ndsn_env = "CRAWLD_TEST_STORE_DSN"\nschema = "{schema}"\n'
    with lease_row_locked(dsn, schema, "collector:alpha") as lock:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: unlock_after(lock, 0.5))
            async with daemon_with_sim(tmp_path, store) as running:
                answer = await running.http.post(
                    running.url("/crawl/start"), json={"task_id": "alpha"}
                )
                assert answer.status_code == 200, answer.text
                body = answer.json()
                [started] = body["started"]
                assert started["task_id"] == "alpha" and started["job_id"], body
                assert "requested" not in body
                job_url = running.url(f"/v2/crawl/{started['job_id']}")
                with trio.fail_after(30):
                    while (job := (await running.http.get(job_url)).json())[
                        "status"
                    ] != "completed":
                        await trio.sleep(0.05)
                assert job["total"] == 120


async def unlock_after(lock: psycopg.Connection[Any], seconds: float) -> None:
    await trio.sleep(seconds)
    lock.rollback()


async def test_start_errors(running: Running) -> None:
    http = running.http
    unknown = await http.post(running.url("/crawl/start"), json={"task_id": "nope"})
    assert unknown.status_code == 404
    assert unknown.json() == {
        "error": "task 'nope' is not configured",
        "detail": {"task_id": "nope"},
    }
    bad = await http.post(running.url("/crawl/start"), json={"task": "alpha"})
    assert bad.status_code == 422 and "task" in bad.json()["detail"]
    bad_hook = await http.post(running.url("/crawl/start"), json={"webhook": "ftp://x"})
    assert bad_hook.status_code == 422 and "webhook" in bad_hook.json()["detail"]
    bad_header = await http.post(
        running.url("/crawl/start"),
        json={
            "task_id": "alpha",
            "webhook": {"url": "https://h/", "headers": {"X-A": "a\r\nB: c"}},
        },
    )
    assert bad_header.status_code == 422, bad_header.text
    assert "headers: the value of 'X-A' contains CR, LF" in bad_header.json()["detail"]
    assert "$.webhook" in bad_header.json()["detail"]
    not_json = await http.post(
        running.url("/crawl/start"), content=b"{", headers={"Content-Type": "application/json"}
    )
    assert not_json.status_code == 400
    for count in ("0", "1001", "x"):
        r = await http.get(running.url("/consume"), params={"count": count})
        assert r.status_code == 400 and r.json()["detail"] == {
            "count": int(count) if count.isdigit() else count
        }
    assert (await http.get(running.url("/queue/size"))).json()["size"] == 0  # nothing changed


async def test_already_running_and_stop(running: Running) -> None:
    http = running.http
    running.sim.throttle(every=1)  # every request answers 429: the run stays busy retrying
    assert (
        await http.post(running.url("/crawl/start"), json={"task_id": "beta"})
    ).status_code == 200
    again = await http.post(running.url("/crawl/start"), json={"task_id": "beta"})
    assert again.status_code == 409
    stopped = (await http.post(running.url("/crawl/stop"), json={})).json()
    assert stopped["stopped"] == ["beta"] and stopped["not_running"] == ["alpha"]
    running.sim.clear_faults()
    await running.wait_idle("beta")


async def test_tasks_lists_settings(running: Running) -> None:
    tasks = (await running.http.get(running.url("/tasks"))).json()["tasks"]
    assert [t["settings"]["id"] for t in tasks] == ["alpha", "beta"]
    assert tasks[0]["settings"]["account"] == "main" and tasks[0]["active"]


async def test_reload_adds_and_removes_tasks(running: Running) -> None:
    running.write("alpha", "gamma")
    os.kill(os.getpid(), signal.SIGHUP)  # the daemon's own signal receiver picks it up
    with trio.fail_after(10):
        while running.daemon.generation < 2:
            await trio.sleep(0.01)
    assert running.daemon.last_reload is not None
    assert "tasks added: gamma" in running.daemon.last_reload.message
    assert "tasks removed: beta" in running.daemon.last_reload.message
    http = running.http
    assert (
        await http.post(running.url("/crawl/start"), json={"task_id": "beta"})
    ).status_code == 404
    assert (
        await http.post(running.url("/crawl/start"), json={"task_id": "gamma"})
    ).status_code == 200
    await running.wait_idle("gamma")
    assert (await http.get(running.url("/queue/size"))).json()["size"] == 120


async def test_openapi_lists_collector_routes(running: Running) -> None:
    spec = (await running.http.get(running.url("/openapi.json"))).json()
    for path in ("/tasks", "/crawl/start", "/crawl/stop", "/consume", "/queue/size"):
        assert path in spec["paths"]
    assert "409" in spec["paths"]["/crawl/start"]["post"]["responses"]


async def test_discover_lists_groups_and_tasks(running: Running) -> None:
    http = running.http
    found = (await http.get(running.url("/discover"), params={"account": "main"})).json()
    assert found["account"] == "main"
    tasks = {t["taskName"]: t["taskId"] for g in found["groups"] for t in g["tasks"]}
    assert tasks == {"alpha": running.sim_task("alpha"), "beta": running.sim_task("beta")}
    assert (await http.get(running.url("/discover"))).status_code == 400
    # an empty name: refused, as /openapi.json says (minLength 1)
    empty = await http.get(running.url("/discover"), params={"account": ""})
    assert empty.status_code == 400 and empty.json()["detail"] == {"account": ""}
    spec = (await http.get(running.url("/openapi.json"))).json()
    (account,) = spec["paths"]["/discover"]["get"]["parameters"]
    assert account["required"] and account["schema"] == {"type": "string", "minLength": 1}
    missing = await http.get(running.url("/discover"), params={"account": "nope"})
    assert missing.status_code == 404 and missing.json()["detail"] == {"account": "nope"}
    running.sim.fail(1, code="GroupNotFound", status=400)  # not retryable: answered at once
    broken = await http.get(running.url("/discover"), params={"account": "main"})
    assert broken.status_code == 502, broken.text
    assert broken.json()["detail"]["code"] == "GroupNotFound"
    running.sim.clear_faults()


async def test_rows_left_for_a_renamed_queue_are_reported_at_start(
    running: Running, caplog: pytest.LogCaptureFixture
) -> None:
    answer = await running.http.post(running.url("/crawl/start"), json={"task_id": "alpha"})
    assert answer.status_code == 200
    await running.wait_idle("alpha")
    running.daemon.request_stop()
    await running.daemon.stopped.wait()

    text = running.path.read_text() + '\n[broker]\nqueue = "renamed"\n'
    running.path.write_text(text)
    async with trio.open_nursery() as nursery:
        second = await serve_daemon(nursery, running.path)
        size = (
            await running.http.get(
                "http://{}:{}/queue/size".format(*second.http_address)  # type: ignore[str-format]
            )
        ).json()
        assert size == {"queue": "renamed", "kind": "embedded", "size": 0}
        second.request_stop()
    [warning] = [r for r in caplog.records if "undelivered rows wait" in r.getMessage()]
    assert warning.ctx == {"stream": "queue:job_data", "rows": 120}  # type: ignore[attr-defined]


@pytest.mark.postgres
async def test_a_start_after_the_owner_left_runs_here_not_for_nobody(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pg_clean_schema: tuple[str, str]
) -> None:
    """Mid-life: the task's lease was another instance's, which died (its lease runs out and
    this instance's cluster tick is far off, the lease being a minute). Once it has run out, a
    start takes the lease then and there and answers with the job, never a 202 for no
    instance."""
    dsn, schema = pg_clean_schema
    monkeypatch.setenv("SIM_PW", DEMO_PASSWORD)
    monkeypatch.setenv("CRAWLD_TEST_STORE_DSN", dsn)
    store = (
        f'[store]\nkind = "postgres"\ndsn_env = "CRAWLD_TEST_STORE_DSN"\nschema = "{schema}"\n'
        '[cluster]\ninstance = "here"\nlease = "60s"\n'
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f'INSERT INTO "{schema}".cluster_leases(name, holder, token, acquired_ms, expires_ms)'
            " VALUES ('collector:alpha', 'gone', 1, 0,"
            " (extract(epoch FROM clock_timestamp()) * 1000)::bigint + 4000)"
        )
    async with daemon_with_sim(tmp_path, store) as running:
        start = running.url("/crawl/start")
        # until the dead owner's lease ran out (or this instance's own tick took it already)
        with psycopg.connect(dsn, autocommit=True) as conn, trio.fail_after(30):
            while conn.execute(
                f'SELECT holder FROM "{schema}".cluster_leases WHERE name = %s'
                f" AND holder = 'gone' AND expires_ms >= \"{schema}\".crawld_now_ms()",
                ("collector:alpha",),
            ).fetchone():
                await trio.sleep(0.05)
        answer = await running.http.post(start, json={"task_id": "alpha"})
        assert answer.status_code == 200, answer.text
        [started] = answer.json()["started"]
        assert started["task_id"] == "alpha" and started["job_id"]
