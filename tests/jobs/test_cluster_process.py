"""Webhook delivery across crawld processes on one PostgreSQL schema (tests/cluster/harness.py):
kill -9 of the instance draining the jobs, and SIGSTOP of it past its lease then SIGCONT. The
receiver counts every event, in order per job, at most the one in flight repeated, nothing
stale after the wake-up; /status `webhooks.cluster` says who drains what.

Each instance runs tests/jobs/crash_daemon.py: "a" creates the jobs, the others only run (their
marker file exists, so they produce nothing)."""

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
from tests.jobs.test_crash import poll

pytestmark = [pytest.mark.process, pytest.mark.postgres]

LEASE_S = 2.0
WEBHOOKS = f"""
[webhooks]
secret_env = "{SECRET_ENV}"
timeout = "2s"
retry_schedule = ["10ms", "20ms"]
allow_cidrs = ["127.0.0.0/8"]
"""


async def start(
    instances: Instances, key: str, rx: WebhookReceiver, *, jobs: int = 0, pages: int = 0
) -> Path:
    """Start instance `key`; with `jobs`, it creates that many jobs of `pages` pages and writes
    their ids to the returned marker file once all their events are committed."""
    marker = instances.root / f"{key}.jobs"
    if not jobs:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text("done\n")
    instances.env[SECRET_ENV] = SECRET
    command = ("-m", "tests.jobs.crash_daemon", "{config}", rx.url(), str(pages), str(marker),
               str(max(1, jobs)))  # fmt: skip
    instances.add(key, WEBHOOKS, command=command)
    await instances.start(key)
    return marker


async def drains(instances: Instances, key: str) -> dict[str, Any]:
    """/status `webhooks.cluster` as `key` sees it."""
    section: dict[str, Any] = (await instances.status(key))["webhooks"]["cluster"]
    return section


def delivered(rx: WebhookReceiver) -> int:
    return len({(r.job_id, r.seq) for r in rx.events() if r.seq is not None})


def check_every_event_once_in_order(rx: WebhookReceiver, ids: list[str], pages: int) -> None:
    rx.check()  # no event after a later one, resends identical, signatures valid
    for job in ids:
        seqs = rx.seqs(job)
        first_time = [s for i, s in enumerate(seqs) if s not in seqs[:i]]
        assert first_time == list(range(1, pages + 3)), job
        assert rx.events(job)[-1].type == "crawl.completed"
        assert len(seqs) - len(first_time) <= 1, f"job {job} repeated more than one event"


async def test_kill_9_of_the_draining_instance_others_continue_every_job(
    instances: Instances, rx: WebhookReceiver
) -> None:
    jobs, pages, kill_after = 6, 30, 40
    events = jobs * (pages + 2)
    await start(instances, "b", rx)
    await start(instances, "c", rx)
    # Quick answers first, then every answer stalls: the kill lands mid-stream.
    rx.delay_next(kill_after, 0.004)
    rx.delay_next(events, 60.0)
    marker = await start(instances, "a", rx, jobs=jobs, pages=pages)
    await poll(lambda: marker.exists() and delivered(rx) >= kill_after, 60)
    ids = marker.read_text().split()[:-1]
    view = await drains(instances, "b")
    assert view["drainers"] == {"a": jobs}  # the creator drains its jobs
    assert {j["instance"] for j in view["jobs"]} == {"a"} and view["backlog_jobs"] == jobs
    instances.kill9("a")
    killed_at = trio.current_time()
    before = delivered(rx)
    assert before < events, "the jobs were delivered before the kill"
    rx.clear_faults()
    rx.delay_next(events, 0.05)
    await poll(lambda: delivered(rx) > before, LEASE_S + 5)
    failover_s = trio.current_time() - killed_at
    takers: dict[str, str] = {}
    with trio.fail_after(60):
        while delivered(rx) < events:
            takers.update({j["job"]: j["instance"] for j in (await drains(instances, "c"))["jobs"]})
            await trio.sleep(0.1)
    spread = sorted(takers[job] for job in ids if job in takers)
    assert set(spread) == {"b", "c"}, spread  # the survivors share a's jobs
    check_every_event_once_in_order(rx, ids, pages)
    assert len(rx.duplicates) <= jobs, rx.duplicates
    print(f"failover {failover_s:.2f}s, {spread=}, repeated {len(rx.duplicates)} of {events}")

    async def released() -> bool:
        view = await drains(instances, "b")
        return (view["backlog_events"], view["drainers"]) == (0, {})

    await wait_for(released, 5)  # a drained job's lease is given back
    for key in ("b", "c"):
        assert await instances.stop(key) == 0


async def test_sigstop_past_the_lease_the_woken_drainer_delivers_nothing_stale(
    instances: Instances, rx: WebhookReceiver
) -> None:
    pages, stop_after = 60, 15
    events = pages + 2
    await start(instances, "b", rx)
    # Quick answers, then one held for 3 s: a is paused with that event in flight, and its
    # answer (200) waits in a's socket until it wakes.
    rx.delay_next(stop_after, 0.004)
    rx.delay_next(1, 3.0)
    marker = await start(instances, "a", rx, jobs=1, pages=pages)
    await poll(lambda: marker.exists() and delivered(rx) >= stop_after, 60)
    [job] = marker.read_text().split()[:-1]
    assert (await drains(instances, "b"))["drainers"] == {"a": 1}
    instances.pause("a")
    rx.clear_faults()
    await poll(lambda: delivered(rx) == events, LEASE_S + 30)
    requests = len(rx.requests)
    instances.resume("a")
    await trio.sleep(LEASE_S + 1.5)  # a wakes: its answer arrives, its lease is gone
    assert instances["a"].running(), "the woken instance died"
    assert len(rx.requests) == requests, "the woken instance sent again"
    check_every_event_once_in_order(rx, [job], pages)
    print(f"repeated after the pause: {rx.duplicates}")
    async with open_store(pg_backend(instances.dsn, instances.schema)) as store:
        backlog = await store.read(jobstore.undelivered)
        errors = await store.read(lambda c: jobstore.list_errors(c, job))
    assert backlog == {} and errors == []
    for key in ("a", "b"):
        assert await instances.stop(key) == 0
