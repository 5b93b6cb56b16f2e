"""A collector run's job outlives what cuts its run short (issue: faults never end a job).

crawld processes on PostgreSQL (tests/cluster/harness.py), the Octoparse simulator and a webhook
receiver served by the test: the database cut for 10 s then PostgreSQL crashed and restarted
mid-run (a private server behind a cuttable proxy, tests/pgfault.py), SIGTERM of the lone
instance then a restart, kill -9 of the owner of the task in a cluster of three. Each time the
job the user started keeps its id and ends `completed` once; every row is in the queue once
(RabbitMQ: duplicates within one confirm window), and the receiver got seqs 1..n in order, one
`crawl.started`, and exactly one terminal event, last."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import trio

from daemon.api import sections
from daemon.fakes.octoparse import DEMO_PASSWORD, OctoparseSim, serve_sim
from daemon.fakes.receiver import WebhookReceiver, open_receiver
from daemon.jobs import store as jobstore
from daemon.outbox import stream_state
from daemon.store import open_store
from tests.cluster.harness import Instances, wait_for
from tests.conftest import pg_backend
from tests.jobs.conftest import SECRET, SECRET_ENV
from tests.pgfault import FaultyPg

pytestmark = [pytest.mark.process, pytest.mark.postgres]

DAY = 86_400_000
QUEUE = "rows"
TEMPLATE = """
[broker]
kind = "embedded"
queue = "{queue}"
[collector]
enabled = true
auto_start = false
batch_size = 100
interval = "1h"
[[collector.accounts]]
name = "main"
base_url = "{base}"
username = "demo"
password_env = "SIM_PW"
rate_limit = {rate}
[[collector.tasks]]
id = "jobs"
account = "main"
task_id = "{task_id}"
date_field = "发布时间"
webhook = "{hook}"
[webhooks]
secret_env = "{secret_env}"
timeout = "2s"
retry_schedule = ["100ms", "200ms", "500ms", "1s", "2s", "5s"]
allow_cidrs = ["127.0.0.0/8"]
"""


class Sim:
    def __init__(self, sim: OctoparseSim, task_id: str, base: str) -> None:
        self.sim, self.task_id, self.base = sim, task_id, base

    def add_rows(self, count: int) -> None:
        now = int(time.time() * 1000)
        self.sim.append_dated(self.task_id, [now - DAY + i for i in range(count)])

    def toml(self, rx: WebhookReceiver, *, rate: float, queue: str = QUEUE) -> str:
        return TEMPLATE.format(queue=queue, base=self.base, rate=rate, task_id=self.task_id,
                               hook=rx.url(), secret_env=SECRET_ENV)  # fmt: skip


@pytest.fixture
async def sim() -> AsyncIterator[Sim]:
    simulator = OctoparseSim()
    task_id = simulator.add_task("jobs")
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        host, port = await nursery.start(
            lambda task_status: serve_sim(
                simulator, "127.0.0.1:0", shutdown=stop, task_status=task_status
            )
        )
        yield Sim(simulator, task_id, f"http://{host}:{port}")
        stop.set()


@pytest.fixture
async def rx() -> AsyncIterator[WebhookReceiver]:
    async with open_receiver(secret=SECRET) as receiver:
        yield receiver


def environment(instances: Instances) -> None:
    instances.env.update({"SIM_PW": DEMO_PASSWORD, SECRET_ENV: SECRET})


async def owned_here(instances: Instances, key: str) -> bool:
    try:
        tasks = (await instances.status(key))["collector"]["tasks"]
    except httpx.HTTPError:
        return False
    return bool(tasks) and bool(tasks[0].get("owned"))


async def start_run(instances: Instances, key: str) -> str:
    """POST /crawl/start on `key` (which owns the task): the job id."""
    r = await instances.http.post(instances.url(key) + "/crawl/start", json={"task_id": "jobs"})
    assert r.status_code == 200, r.text
    [started] = r.json()["started"]
    job_id: str = started["job_id"]
    return job_id


def pages(rx: WebhookReceiver, job_id: str) -> int:
    return sum(1 for r in rx.events(job_id) if r.type == "crawl.page")


async def wait_pages(rx: WebhookReceiver, job_id: str, count: int, timeout: float) -> None:
    with trio.fail_after(timeout):
        await rx.wait_until(lambda: pages(rx, job_id) >= count)


async def wait_terminal(rx: WebhookReceiver, job_id: str, timeout: float) -> None:
    terminal = ("crawl.completed", "crawl.failed")
    with trio.fail_after(timeout):
        await rx.wait_until(lambda: any(r.type in terminal for r in rx.events(job_id)))


def check_stream(rx: WebhookReceiver, job_id: str, windows: int) -> None:
    """Seqs 1..n in order (a resend of the one in flight allowed), one started, one terminal
    (`crawl.completed`) and it is the last; nothing for any other job."""
    rx.check()  # order per job, signatures
    assert {r.job_id for r in rx.events()} == {job_id}, "events of a second job"
    seqs = rx.seqs(job_id)
    first_time = [s for i, s in enumerate(seqs) if s not in seqs[:i]]
    assert first_time == list(range(1, windows + 3)), seqs
    kinds = [r.type for r in rx.events(job_id)]
    assert kinds.count("crawl.started") == 1 or len(set(seqs)) < len(seqs)
    unique = {r.seq: r.type for r in rx.events(job_id)}
    assert list(unique.values()).count("crawl.started") == 1
    assert [t for t in unique.values() if t in ("crawl.completed", "crawl.failed")] == [
        "crawl.completed"
    ]
    assert unique[max(unique)] == "crawl.completed"


async def job_record(dsn: str, schema: str, job_id: str) -> jobstore.JobRecord:
    async with open_store(pg_backend(dsn, schema)) as store:
        record = await store.read(lambda c: jobstore.get_job(c, job_id))
    assert record is not None
    return record


async def appended(dsn: str, schema: str, queue: str = QUEUE) -> int:
    """Items ever appended to the queue's outbox stream (a window committed twice adds some)."""
    async with open_store(pg_backend(dsn, schema)) as store:
        state = await store.read(lambda c: stream_state(c, f"queue:{queue}"))
    return state.last_seq


async def consume_all(instances: Instances, key: str, rows: int) -> list[str]:
    url = instances.url(key) + "/consume"
    ids: list[str] = []
    with trio.fail_after(60):
        while True:
            r = await instances.http.post(url, json={"count": 1000})
            assert r.status_code == 200, r.text
            got = [m["message_id"] for m in r.json()["messages"]]
            ids.extend(got)
            if not got:
                return ids


async def job_status(instances: Instances, key: str, job_id: str) -> dict[str, Any]:
    r = await instances.get(key, f"/v2/crawl/{job_id}?limit=1")
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def continuing_task(instances: Instances, key: str) -> dict[str, Any] | None:
    """The task's /status entry on `key` while its current run continues an interrupted run's
    job (and has read where that run stopped)."""
    try:
        [task] = (await instances.status(key))["collector"]["tasks"]
    except (httpx.HTTPError, KeyError, ValueError):
        return None
    run = task.get("current_run")
    return task if run is not None and run.get("continues") and run.get("resumed") else None


async def job_record_running(faulty_pg: FaultyPg, job_id: str) -> bool:
    record = await job_record(faulty_pg.direct_dsn, faulty_pg.schema, job_id)
    return (record.status, record.error) == ("scraping", None)


async def test_a_database_cut_then_a_postgres_restart_mid_run_the_same_job_completes(
    faulty_instances: Instances, faulty_pg: FaultyPg, sim: Sim, rx: WebhookReceiver
) -> None:
    rows, windows = 4000, 40
    instances = faulty_instances
    environment(instances)
    sim.add_rows(rows)
    instances.add("a", sim.toml(rx, rate=6.0))
    await instances.start("a")
    await wait_for(lambda: owned_here(instances, "a"), 20)
    job_id = await start_run(instances, "a")
    await wait_pages(rx, job_id, 5, 30)

    faulty_pg.cut()  # for 10 s: the lease (2 s) runs out well within it
    cut_at = trio.current_time()
    try:
        await trio.sleep(4.0)
        # /status explains the cut while it lasts, within its bound (sections still reading the
        # store are shown missing rather than holding the document)
        with trio.fail_after(sections.WAIT_S + 3):
            during = await instances.status("a")
        assert during["store"]["writable"] is False, during["store"]
        await trio.sleep_until(cut_at + 10.0)
        assert await job_record_running(faulty_pg, job_id)  # read straight from the server
    finally:
        faulty_pg.resume()
    task = await wait_for(lambda: continuing_task(instances, "a"), 30)
    # /status tells the truth: the run was cut short by the lost lease (or, when a write of the
    # run failed before the lease ran out, by the store), a run continues the job
    assert task["current_run"]["job_id"] == job_id, task
    cut = task["last_run"]
    assert (cut["job_id"], cut["status"]) == (job_id, "interrupted"), cut
    assert "lease" in cut["error"] or cut["error"].startswith("the store failed"), cut
    after_cut = pages(rx, job_id)
    await wait_pages(rx, job_id, after_cut + 3, 30)

    await faulty_pg.restart("immediate", down_for=1.0)  # a crash: every connection dies
    await wait_terminal(rx, job_id, 60)

    status = await job_status(instances, "a", job_id)
    assert status["status"] == "completed" and status["total"] == rows, status
    check_stream(rx, job_id, windows)
    ids = await consume_all(instances, "a", rows)
    assert len(ids) == len(set(ids)) == rows  # the embedded queue hands each row out once
    assert await appended(faulty_pg.direct_dsn, faulty_pg.schema) == rows
    record = await job_record(faulty_pg.direct_dsn, faulty_pg.schema, job_id)
    assert (record.status, record.error) == ("completed", None)


async def test_sigterm_of_the_lone_instance_then_a_start_continues_the_same_job(
    instances: Instances, pg_schema: tuple[str, str], sim: Sim, rx: WebhookReceiver
) -> None:
    rows, windows = 3000, 30
    environment(instances)
    sim.add_rows(rows)
    instances.add("a", sim.toml(rx, rate=6.0))
    await instances.start("a")
    await wait_for(lambda: owned_here(instances, "a"), 20)
    job_id = await start_run(instances, "a")
    await wait_pages(rx, job_id, 5, 30)
    assert await instances.stop("a") == 0  # SIGTERM: a clean stop mid-run
    record = await job_record(*pg_schema, job_id)
    assert (record.status, record.error) == ("scraping", None)  # not cancelled: it goes on
    assert not any(r.type in ("crawl.completed", "crawl.failed") for r in rx.events(job_id))
    stopped_at = pages(rx, job_id)

    await instances.start("a")  # the next start continues the job at once (no auto_start)
    task = await wait_for(lambda: continuing_task(instances, "a"), 20)
    assert task["current_run"]["job_id"] == job_id
    cut = task["last_run"]  # SIGTERM cut the last run short; its job goes on
    assert (cut["job_id"], cut["status"]) == (job_id, "interrupted") and "shutdown" in cut["error"]
    await wait_terminal(rx, job_id, 60)
    assert pages(rx, job_id) > stopped_at
    status = await job_status(instances, "a", job_id)
    assert status["status"] == "completed" and status["total"] == rows, status
    check_stream(rx, job_id, windows)
    ids = await consume_all(instances, "a", rows)
    assert len(ids) == len(set(ids)) == rows
    assert await appended(*pg_schema) == rows


async def test_kill_9_of_the_owner_in_a_cluster_of_three_another_continues_the_same_job(
    instances: Instances, pg_schema: tuple[str, str], sim: Sim, rx: WebhookReceiver
) -> None:
    rows, windows = 3000, 30
    environment(instances)
    sim.add_rows(rows)
    for key in "abc":
        instances.add(key, sim.toml(rx, rate=6.0))
        instances.spawn(key)
    for key in "abc":
        await instances.wait_healthy(key)

    async def owner_key() -> str | None:
        for key in "abc":
            if await owned_here(instances, key):
                return key
        return None

    owner = await wait_for(owner_key, 30)
    job_id = await start_run(instances, owner)
    await wait_pages(rx, job_id, 5, 30)
    instances.kill9(owner)
    rest = [k for k in "abc" if k != owner]
    await wait_terminal(rx, job_id, 60)  # lease 2 s: another instance takes the task over

    status = await job_status(instances, rest[0], job_id)
    assert status["status"] == "completed" and status["total"] == rows, status
    check_stream(rx, job_id, windows)
    seqs = rx.seqs(job_id)
    assert len(seqs) - len(set(seqs)) <= 1, "more than the event in flight was sent again"
    ids = await consume_all(instances, rest[0], rows)
    assert len(ids) == len(set(ids)) == rows
    assert await appended(*pg_schema) == rows  # no window committed twice
    ended = [(await instances.status(k))["collector"]["tasks"][0]["last_run"] for k in rest]
    [run] = [r for r in ended if r is not None]  # the survivor that took the task over
    assert (run["job_id"], run["continues"], run["status"]) == (job_id, True, "completed")
