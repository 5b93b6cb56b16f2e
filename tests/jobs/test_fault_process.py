"""A webhook job against faults of its drainer's lease, with real crawld processes on PostgreSQL:

- the database cut for 10 s (a TCP proxy between crawld and its private server) or the server
  crashed and restarted, mid-stream: the same job id ends `completed`, its events arrive as seqs
  1..n in order with one terminal event last (at most the event in flight repeated per fault),
  and the job is never ended by the fault;
- an event failing at attempt 3, then kill -9 of the instance delivering it: whoever drains the
  job next (the same instance restarted, or another one of a 3-instance cluster) sends attempt 4
  at its stored time, not earlier, and the stored attempts show in /status.

The producer is tests/jobs/fault_daemon.py (a paced job on the first instance)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from daemon.fakes.receiver import WebhookReceiver
from daemon.jobs import store as jobstore
from daemon.store import open_store
from tests.cluster.harness import Instances, wait_for
from tests.conftest import pg_backend
from tests.jobs.conftest import SECRET, SECRET_ENV
from tests.pgfault import FaultyPg, faulty_instances, faulty_pg, pg_server  # noqa: F401

pytestmark = [pytest.mark.process, pytest.mark.postgres]


def webhooks(schedule: str) -> str:
    return f"""
[webhooks]
secret_env = "{SECRET_ENV}"
timeout = "2s"
retry_schedule = {schedule}
allow_cidrs = ["127.0.0.0/8"]
"""


def producer(
    rx: WebhookReceiver, pages: int, pace: float, id_file: Path, gate: Path | None
) -> tuple[str, ...]:
    extra = () if gate is None else (str(gate),)
    return ("-m", "tests.jobs.fault_daemon", "{config}", rx.url(), str(pages), str(pace),
            str(id_file), *extra)  # fmt: skip


def delivered(rx: WebhookReceiver, job: str) -> int:
    return len(set(rx.seqs(job)))


def notable(instances: Instances) -> str:
    """Every instance's log without its lines about delivered events."""
    return "\n".join(
        f"{key}: {line}"
        for key, inst in instances.by_key.items()
        for line in inst.stderr().splitlines()
        if "webhook event delivered" not in line
    )


def check_stream(rx: WebhookReceiver, job: str, events: int, repeats: int) -> None:
    rx.check()  # never a seq after a later one, nothing after the terminal, resends identical
    seqs = rx.seqs(job)
    first_time = [s for i, s in enumerate(seqs) if s not in seqs[:i]]
    assert first_time == list(range(1, events + 1))
    terminal = [r for r in rx.events(job) if r.type in ("crawl.completed", "crawl.failed")]
    assert {r.seq for r in terminal} == {events} and terminal[-1].type == "crawl.completed"
    assert len(seqs) - len(first_time) <= repeats, f"repeated: {rx.duplicates}"


async def job_status(instances: Instances, key: str, job: str) -> dict[str, Any]:
    response = await instances.get(key, f"/v2/crawl/{job}")
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


@pytest.mark.parametrize("fault", ["cut", "restart"])
async def test_a_webhook_job_survives_a_database_fault_with_its_id_and_stream(
    faulty_instances: Instances,  # noqa: F811
    faulty_pg: FaultyPg,  # noqa: F811
    rx: WebhookReceiver,
    tmp_path: Path,
    fault: str,
) -> None:
    instances = faulty_instances
    pages = 150
    events = pages + 2
    id_file, gate = tmp_path / "job", tmp_path / "finish"
    instances.env[SECRET_ENV] = SECRET
    instances.add("a", webhooks('["100ms", "200ms", "500ms", "1s", "2s"]'),
                  command=producer(rx, pages, 0.02, id_file, gate))  # fmt: skip
    rx.delay_next(10 * events, 0.01)
    await instances.start("a")
    await wait_for(lambda: id_file.exists(), 30)
    job = id_file.read_text().split()[0]
    await wait_for(lambda: delivered(rx, job) >= 30, 60)
    before = delivered(rx, job)
    if fault == "cut":
        await faulty_pg.outage(10)  # past the 2 s lease: the drainer's lease runs out
    else:
        await faulty_pg.restart("immediate", down_for=3)
    assert delivered(rx, job) < events, "the stream was over before the fault"
    print(f"{fault}: {before} events before it, {delivered(rx, job)} when it ended")
    assert instances["a"].running()
    # The fault ended nothing: the job goes on (its producer is still issuing pages).
    status = await wait_for(lambda: job_status(instances, "a", job), 30)
    assert status["status"] == "scraping", status
    await wait_for(lambda: delivered(rx, job) >= pages + 1, 90)
    gate.write_text("go\n")
    await wait_for(lambda: delivered(rx, job) == events, 60)
    status = await job_status(instances, "a", job)
    assert (status["status"], status["completed"]) == ("completed", pages), status
    try:
        check_stream(rx, job, events, repeats=1)
    except AssertionError:
        print(notable(instances))
        raise
    async with open_store(pg_backend(faulty_pg.direct_dsn, faulty_pg.schema)) as store:
        errors = await store.read(lambda c: jobstore.list_errors(c, job))
        jobs = await store.read(lambda c: jobstore.list_jobs(c, 10))
    assert errors == [] and [j.id for j in jobs] == [job]  # one job: the same id, no second one
    assert await instances.stop("a") == 0


async def stored_retry(instances: Instances, job: str) -> jobstore.RetryState | None:
    async with open_store(pg_backend(instances.dsn, instances.schema)) as store:
        return await store.read(lambda c: jobstore.retry_state(c, job))


@pytest.mark.parametrize("then", ["restart", "failover"])
async def test_a_retry_at_attempt_3_continues_at_attempt_4_after_kill_9(
    instances: Instances, rx: WebhookReceiver, tmp_path: Path, then: str
) -> None:
    pages = 10
    events = pages + 2
    hook = webhooks('["100ms", "200ms", "5s", "5s", "5s"]')
    instances.env[SECRET_ENV] = SECRET
    id_file = tmp_path / "job"
    if then == "failover":
        for key in ("b", "c"):
            instances.add(key, hook)
            await instances.start(key)
    # Event 4 (the third page) fails three times; everything else is answered at once.
    rx.delay_next(3, 0.001)
    rx.fail_next(3, 503)
    instances.add("a", hook, command=producer(rx, pages, 0.0, id_file, None))
    await instances.start("a")
    await wait_for(lambda: id_file.exists() and id_file.read_text().endswith("done\n"), 30)
    job = id_file.read_text().split()[0]
    state = await wait_for(lambda: _at_attempt(instances, job, 3), 30)
    assert (state.seq, state.attempts, state.last_status) == (4, 3, 503)
    shown = (await instances.status("c" if then == "failover" else "a"))["webhooks"]["retrying"]
    assert shown["events"] == 1 and shown["next"][0]["attempts"] == 3
    instances.kill9("a")
    killed_at_ms = trio.current_time()
    if then == "restart":
        await instances.start("a")
    await wait_for(lambda: delivered(rx, job) == events, 60)
    fourth = [r for r in rx.requests if r.seq == 4]
    assert [r.status for r in fourth] == [503, 503, 503, 200], "the schedule started again"
    arrived_ms = int(fourth[3].arrived * 1000)
    assert arrived_ms >= state.next_ms, "attempt 4 went out before its scheduled time"
    assert arrived_ms < state.next_ms + 3000, "attempt 4 went out long after its time"
    check_stream(rx, job, events, repeats=0)
    assert await stored_retry(instances, job) is None
    print(f"{then}: attempt 4 {arrived_ms - state.next_ms} ms after its time; "
          f"{trio.current_time() - killed_at_ms:.2f}s after the kill")  # fmt: skip
    for key in instances.by_key:
        if instances[key].running():
            assert await instances.stop(key) == 0


async def _at_attempt(instances: Instances, job: str, attempts: int) -> jobstore.RetryState | None:
    state = await stored_retry(instances, job)
    return state if state is not None and state.attempts >= attempts else None
