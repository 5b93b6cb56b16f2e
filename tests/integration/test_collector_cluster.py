"""Collector tasks shared by crawld processes on one PostgreSQL schema (tests/cluster/harness.py),
publishing to RabbitMQ: a start sent to any instance runs on the task's owner, and when the owner
is killed (or paused past its lease) another continues the run from its last committed window.
Counted in RabbitMQ: every kept row arrives, duplicates stay within one confirm window, and the
outbox stream holds each row once (a stale owner appended nothing). SIGHUP moves a task."""

from __future__ import annotations

import os
import signal

import httpx
import pytest
import trio

from daemon.fakes.octoparse import DEMO_PASSWORD
from daemon.outbox import stream_state
from daemon.store import open_store
from tests.cluster.harness import Instances, wait_for
from tests.conftest import pg_backend
from tests.integration.test_collector_amqp import Setup, add_rows, setup

__all__ = ["setup"]
pytestmark = [pytest.mark.broker, pytest.mark.process, pytest.mark.postgres]
ROWS = 6000
WINDOW = 100  # confirm_window
TASK_LINE = 'date_field = "发布时间"\n'


def collector_toml(setup: Setup, amqp_url: str, queue: str, *, listed: bool = True) -> str:
    """The broker and collector sections every instance gets: one task ("jobs") read at 8
    requests/s (a 6000-row run takes some seconds), `listed=False`: the task disabled here."""
    text = setup.config_text(amqp_url, queue, window=WINDOW)
    text = "[broker]" + text.split("[broker]", 1)[1]  # the harness sets [daemon] and [http]
    text = text.replace("[collector]\n", "[collector]\nenabled = true\n")
    text = text.replace('username = "demo"', 'username = "demo"\nrate_limit = 8.0')
    return text if listed else text.replace(TASK_LINE, TASK_LINE + "enabled = false\n")


async def start(instances: Instances, extra: str, keys: str) -> None:
    instances.env.update(SIM_PW=DEMO_PASSWORD, TEST_AMQP_PW=os.environ["TEST_AMQP_PW"])
    for key in keys:
        instances.add(key, extra)
        instances.spawn(key)
    for key in keys:
        await instances.wait_healthy(key)


async def owner(instances: Instances, keys: list[str]) -> str | None:
    """The task's owner as those of `keys` listing it report it in /status (None until they
    agree)."""
    seen = set()
    for key in keys:
        try:
            tasks = (await instances.status(key))["collector"]["tasks"]
        except httpx.HTTPError:
            return None
        seen.update(t["owner"] for t in tasks)
    return seen.pop() if len(seen) == 1 else None


async def owner_is(instances: Instances, keys: list[str], wanted: set[str | None]) -> bool:
    return await owner(instances, keys) in wanted


async def queue_size(instances: Instances, key: str) -> int:
    try:
        return int((await instances.get(key, "/queue/size")).json().get("size", 0))
    except httpx.HTTPError:
        return 0


async def consume_all(instances: Instances, key: str) -> list[str]:
    url = instances.url(key) + "/consume"
    ids: list[str] = []
    with trio.fail_after(120):
        while len(set(ids)) < ROWS:
            r = await instances.http.post(url, json={"count": 1000})
            if r.status_code == 200:
                ids.extend(m["message_id"] for m in r.json()["messages"])
            await trio.sleep(0.05)
    await trio.sleep(1.0)  # anything still in flight would show up as an extra duplicate
    r = await instances.http.post(url, json={"count": 1000})
    ids.extend(m["message_id"] for m in r.json()["messages"])
    return ids


async def appended(pg_schema: tuple[str, str], queue: str) -> int:
    """Items ever appended to the queue's outbox stream (a stale window would add some)."""
    async with open_store(pg_backend(*pg_schema)) as store:
        state = await store.read(lambda c: stream_state(c, f"queue:{queue}"))
    return state.last_seq


async def start_run(
    instances: Instances, setup: Setup, amqp_url: str, queue: str, keys: str
) -> tuple[str, list[str]]:
    """Start the instances and a run through one that does not own the task (202, naming the
    owner); returns the owner and the others once 1000 rows reached RabbitMQ."""
    add_rows(setup.sim, setup.task_id, old=100, new=ROWS)
    await start(instances, collector_toml(setup, amqp_url, queue), keys)
    name = await wait_for(lambda: owner(instances, list(keys)), 60)
    others = [k for k in keys if k != name]
    r = await instances.http.post(
        instances.url(others[0]) + "/crawl/start", json={"task_id": "jobs"}
    )
    assert r.status_code == 202, r.text
    assert r.json()["requested"] == [{"task_id": "jobs", "instance": name}]
    with trio.fail_after(60):
        while await queue_size(instances, others[0]) < 1000:
            await trio.sleep(0.02)
    return name, others


async def test_kill_9_of_the_owner_mid_run_another_instance_finishes_it(
    instances: Instances, setup: Setup, amqp_url: str, queue_name: str, pg_schema: tuple[str, str]
) -> None:
    killed, rest = await start_run(instances, setup, amqp_url, queue_name, "abc")
    instances.kill9(killed)
    # lease 2 s: its expiry and one tick
    await wait_for(lambda: owner_is(instances, rest, set(rest)), 15)
    ids = await consume_all(instances, rest[0])
    assert len(set(ids)) == ROWS
    assert len(ids) - len(set(ids)) <= WINDOW, "more duplicates than one confirm window"
    assert await appended(pg_schema, queue_name) == ROWS  # each row committed once


async def test_an_owner_paused_past_its_lease_writes_and_publishes_nothing_stale(
    instances: Instances, setup: Setup, amqp_url: str, queue_name: str, pg_schema: tuple[str, str]
) -> None:
    paused, (other,) = await start_run(instances, setup, amqp_url, queue_name, "ab")
    instances.pause(paused)
    await wait_for(lambda: owner_is(instances, [other], {other}), 15)
    before = await queue_size(instances, other)
    with trio.fail_after(30):
        while await queue_size(instances, other) < before + 500:  # the new owner got going
            await trio.sleep(0.05)
    instances.resume(paused)
    ids = await consume_all(instances, other)
    assert await owner(instances, [paused, other]) == other  # the woken one did not take it back
    assert len(set(ids)) == ROWS
    assert len(ids) - len(set(ids)) <= WINDOW, "more duplicates than one confirm window"
    assert await appended(pg_schema, queue_name) == ROWS


async def test_sighup_removing_a_task_hands_it_over_and_adding_it_competes_again(
    instances: Instances, setup: Setup, amqp_url: str, queue_name: str
) -> None:
    listed = collector_toml(setup, amqp_url, queue_name)
    await start(instances, listed, "ab")
    first = await wait_for(lambda: owner(instances, ["a", "b"]), 60)
    second = "b" if first == "a" else "a"
    instances.add(first, collector_toml(setup, amqp_url, queue_name, listed=False))
    instances[first].proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
    # released at once: no wait for the lease to run out
    await wait_for(lambda: owner_is(instances, [first, second], {second}), 10, every=0.05)
    url = instances.url(first)
    r = await instances.http.post(url + "/crawl/stop", json={"task_id": "jobs"})
    assert r.status_code == 202, r.text  # disabled here, run by the other: handed over
    assert r.json()["requested"] == [{"task_id": "jobs", "instance": second}]
    assert await instances.stop(second) == 0  # a clean stop releases the lease
    r = await instances.http.post(url + "/crawl/start", json={"task_id": "jobs"})
    assert r.status_code == 404, r.text
    assert r.json()["error"] == "task 'jobs' is disabled here and no instance runs it"
    instances.add(first, listed)
    instances[first].proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
    # listed again: it competes for the lease and takes it
    await wait_for(lambda: owner_is(instances, [first], {first}), 10, every=0.05)
