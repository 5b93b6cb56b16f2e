"""Collector tasks shared by crawld processes on one PostgreSQL schema, publishing to RabbitMQ:
a start sent to any instance runs on the task's owner, and when the owner is killed (or paused
past its lease) another continues the run from its last committed window. Counted in RabbitMQ:
every kept row arrives, duplicates stay within one confirm window, and the outbox stream holds
each row once (a stale owner appended nothing)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from daemon.outbox import stream_state
from daemon.store import open_store
from tests.conftest import pg_backend
from tests.integration.test_collector_amqp import Setup, add_rows, free_port, setup

__all__ = ["setup"]
pytestmark = [pytest.mark.broker, pytest.mark.process, pytest.mark.postgres]
ROWS = 6000
WINDOW = 100  # confirm_window
TASK_LINE = 'date_field = "发布时间"\n'


@dataclass
class Instance:
    name: str
    base: str
    proc: subprocess.Popen[bytes]

    async def get(self, http: httpx.AsyncClient, path: str, **params: Any) -> Any:
        return (await http.get(self.base + path, params=params)).json()


@contextmanager
def instances(
    setup: Setup, amqp_url: str, queue: str, pg_schema: tuple[str, str], tmp: Path, names: str
) -> Iterator[list[Instance]]:
    """One crawld process per letter of `names`, each with its own port, state and config, all
    on one schema and one queue; every process is killed on the way out."""
    dsn, schema = pg_schema
    started: list[Instance] = []
    try:
        for name in names:
            port = free_port()
            text = setup.config_text(amqp_url, queue, window=WINDOW, http_port=port)
            text = text.replace('username = "demo"', 'username = "demo"\nrate_limit = 8.0')
            text += (
                f'[store]\nkind = "postgres"\ndsn_env = "CRAWLD_TEST_STORE_DSN"\n'
                f'schema = "{schema}"\n[cluster]\ninstance = "{name}"\nlease = "2s"\n'
            )
            (tmp / name).mkdir()
            path = tmp / name / "crawld.toml"
            path.write_text(text)
            env = {**os.environ, "CRAWLD_TEST_STORE_DSN": dsn}  # config_text set the password
            argv = [sys.executable, "-m", "daemon", "run", "--config", str(path)]
            with (tmp / name / "log").open("wb") as log:  # read when a test fails
                proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
            started.append(Instance(name, f"http://127.0.0.1:{port}", proc))
        yield started
    finally:
        for inst in started:
            if inst.proc.poll() is None:
                inst.proc.send_signal(signal.SIGCONT)
                inst.proc.kill()
            inst.proc.wait()


async def owner(http: httpx.AsyncClient, live: list[Instance]) -> str | None:
    """The task's owner as those of the live instances listing it report it in /status (None
    until they agree)."""
    seen = set()
    for inst in live:
        try:
            tasks = (await inst.get(http, "/status"))["collector"]["tasks"]
        except (httpx.HTTPError, KeyError):
            return None
        seen.update(t["owner"] for t in tasks)
    return seen.pop() if len(seen) == 1 else None


async def wait_owner(http: httpx.AsyncClient, live: list[Instance]) -> str:
    with trio.fail_after(60):
        while (name := await owner(http, live)) is None:
            await trio.sleep(0.1)
    return name


async def queue_size(http: httpx.AsyncClient, inst: Instance) -> int:
    try:
        return int((await inst.get(http, "/queue/size")).get("size", 0))
    except httpx.HTTPError:
        return 0


async def consume_all(http: httpx.AsyncClient, inst: Instance) -> list[str]:
    ids: list[str] = []
    with trio.fail_after(120):
        while len(set(ids)) < ROWS:
            r = await http.post(inst.base + "/consume", json={"count": 1000})
            if r.status_code == 200:
                ids.extend(m["message_id"] for m in r.json()["messages"])
            await trio.sleep(0.05)
    await trio.sleep(1.0)  # anything still in flight would show up as an extra duplicate
    r = await http.post(inst.base + "/consume", json={"count": 1000})
    ids.extend(m["message_id"] for m in r.json()["messages"])
    return ids


async def appended(pg_schema: tuple[str, str], queue: str) -> int:
    """Items ever appended to the queue's outbox stream (a stale window would add some)."""
    async with open_store(pg_backend(*pg_schema)) as store:
        state = await store.read(lambda c: stream_state(c, f"queue:{queue}"))
    return state.last_seq


@asynccontextmanager
async def started_run(
    setup: Setup, amqp_url: str, queue: str, pg_schema: tuple[str, str], tmp: Path, names: str
) -> AsyncIterator[tuple[httpx.AsyncClient, list[Instance], Instance]]:
    """The instances, with the run started through one that does not own the task (202, naming
    the owner), once 1000 rows reached RabbitMQ; yields the owner."""
    add_rows(setup.sim, setup.task_id, old=100, new=ROWS)
    with instances(setup, amqp_url, queue, pg_schema, tmp, names) as live:
        async with httpx.AsyncClient(timeout=10) as http:
            name = await wait_owner(http, live)
            other = next(i for i in live if i.name != name)
            r = await http.post(other.base + "/crawl/start", json={"task_id": "jobs"})
            assert r.status_code == 202, r.text
            assert r.json()["requested"] == [{"task_id": "jobs", "instance": name}]
            with trio.fail_after(60):
                while await queue_size(http, other) < 1000:
                    await trio.sleep(0.02)
            yield http, live, next(i for i in live if i.name == name)


async def test_kill_9_of_the_owner_mid_run_another_instance_finishes_it(
    setup: Setup, amqp_url: str, queue_name: str, pg_schema: tuple[str, str], tmp_path: Path
) -> None:
    async with started_run(setup, amqp_url, queue_name, pg_schema, tmp_path, "abc") as (
        http,
        live,
        killed,
    ):
        killed.proc.send_signal(signal.SIGKILL)
        killed.proc.wait()
        rest = [i for i in live if i is not killed]
        with trio.fail_after(15):  # lease 2 s: its expiry and one tick
            while await owner(http, rest) in (None, killed.name):
                await trio.sleep(0.1)
        ids = await consume_all(http, rest[0])
    assert len(set(ids)) == ROWS
    assert len(ids) - len(set(ids)) <= WINDOW, "more duplicates than one confirm window"
    assert await appended(pg_schema, queue_name) == ROWS  # each row committed once


async def test_an_owner_paused_past_its_lease_writes_and_publishes_nothing_stale(
    setup: Setup, amqp_url: str, queue_name: str, pg_schema: tuple[str, str], tmp_path: Path
) -> None:
    async with started_run(setup, amqp_url, queue_name, pg_schema, tmp_path, "ab") as (
        http,
        live,
        paused,
    ):
        paused.proc.send_signal(signal.SIGSTOP)
        (other,) = [i for i in live if i is not paused]
        with trio.fail_after(15):
            while await owner(http, [other]) != other.name:
                await trio.sleep(0.1)
        before = await queue_size(http, other)
        with trio.fail_after(30):
            while await queue_size(http, other) < before + 500:  # the new owner got going
                await trio.sleep(0.05)
        paused.proc.send_signal(signal.SIGCONT)
        ids = await consume_all(http, other)
        assert await owner(http, live) == other.name  # the woken one did not take it back
    assert len(set(ids)) == ROWS
    assert len(ids) - len(set(ids)) <= WINDOW, "more duplicates than one confirm window"
    assert await appended(pg_schema, queue_name) == ROWS


async def test_sighup_removing_a_task_hands_it_over_and_adding_it_competes_again(
    setup: Setup, amqp_url: str, queue_name: str, pg_schema: tuple[str, str], tmp_path: Path
) -> None:
    with instances(setup, amqp_url, queue_name, pg_schema, tmp_path, "ab") as live:
        async with httpx.AsyncClient(timeout=10) as http:
            name = await wait_owner(http, live)
            first = next(i for i in live if i.name == name)
            (second,) = [i for i in live if i is not first]
            path = tmp_path / first.name / "crawld.toml"
            listed = path.read_text()
            path.write_text(listed.replace(TASK_LINE, TASK_LINE + "enabled = false\n"))
            first.proc.send_signal(signal.SIGHUP)
            with trio.fail_after(10):  # released at once: no wait for the lease to run out
                while await owner(http, live) != second.name:
                    await trio.sleep(0.05)
            r = await http.post(first.base + "/crawl/stop", json={"task_id": "jobs"})
            assert r.status_code == 202, r.text  # disabled here, run by the other: handed over
            assert r.json()["requested"] == [{"task_id": "jobs", "instance": second.name}]
            second.proc.send_signal(signal.SIGTERM)  # a clean stop releases the lease
            second.proc.wait()
            r = await http.post(first.base + "/crawl/start", json={"task_id": "jobs"})
            assert r.status_code == 404, r.text
            assert r.json()["error"] == "task 'jobs' is disabled here and no instance runs it"
            path.write_text(listed)
            first.proc.send_signal(signal.SIGHUP)
            with trio.fail_after(10):  # listed again: it competes for the lease and takes it
                while await owner(http, [first]) != first.name:
                    await trio.sleep(0.05)
