"""The collector's cluster rules: which runs count as interrupted, fenced window and ack writes on
both backends, and the embedded queue read from two instances at once."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

import msgspec
import pytest
import trio

from daemon.cluster import Cluster, Lease, LeaseLost
from daemon.cluster import store as cs
from daemon.collector import paging
from daemon.collector.crawler import interrupted, load_task_state
from daemon.collector.octoparse import Page
from daemon.collector.service import request_webhook
from daemon.collector.store import RunStats, TaskState
from daemon.config import WebhookSpec
from daemon.fakes.octoparse import DEMO_PASSWORD
from daemon.outbox import NewItem, Outbox, stream_state
from daemon.store import Conn, Store, open_store
from tests.collector.test_crawler import STREAM, Env, sim_env
from tests.conftest import pg_backend

LEASE = "collector:t1"


def stats(run_id: str, *, cut_short: bool = False) -> RunStats:
    return RunStats(run_id=run_id, job_id=None, started_ms=0, interrupted=cut_short)


def test_a_run_is_interrupted_when_its_result_is_missing_or_cut_short() -> None:
    assert not interrupted(TaskState(None, None, None, None))
    assert interrupted(TaskState(None, "r2", None, None))
    assert interrupted(TaskState(None, "r2", None, stats("r1")))
    assert not interrupted(TaskState(None, "r2", None, stats("r2")))
    assert interrupted(TaskState(None, "r2", None, stats("r2", cut_short=True)))


def test_a_start_request_carries_its_webhook_as_json() -> None:
    spec = WebhookSpec(url="https://example.com/hook", events=["page"])
    assert request_webhook(msgspec.to_builtins(spec)) == spec
    assert request_webhook("https://example.com/h") == "https://example.com/h"
    assert request_webhook(None) is None


@pytest.fixture
async def env(store: Store, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Env]:
    monkeypatch.setenv("SIM_PW", DEMO_PASSWORD)
    async with sim_env(store) as opened:
        yield opened


async def take_over(store: Store, lease: Lease) -> None:
    """Another instance ("b") takes the lease: its token moves on."""

    def tx(conn: Conn) -> None:
        cs.release(conn, lease.name, lease.token)
        assert cs.acquire(conn, [lease.name], "b", 60_000) == {lease.name: lease.token + 1}

    await store.write(tx)


async def held_lease(store: Store) -> Lease:
    cluster = Cluster(store, instance="a", lease_s=60.0, multi=False)
    await cluster.join()
    (lease,) = await cluster.try_acquire([LEASE])
    return lease


async def test_a_window_written_with_a_stale_token_is_refused_and_changes_nothing(
    env: Env,
) -> None:
    env.add_rows(new=500)
    crawler = env.crawler()
    lease = crawler.lease = await held_lease(env.store)
    pages = 0
    real_page = env.client.data_page
    before: tuple[Any, ...] = ()

    async def snapshot() -> tuple[Any, ...]:
        def read(conn: Conn) -> tuple[Any, ...]:
            return stream_state(conn, STREAM), load_task_state(conn, "t1")

        return await env.store.read(read)

    async def page_then_lose_the_lease(task_id: str, offset: int, size: int) -> Page:
        nonlocal pages, before
        page = await real_page(task_id, offset, size)
        pages += 1
        if pages == 4:  # the total, two committed windows, then the lease moves
            await take_over(env.store, lease)
            before = await snapshot()
        return page

    env.client.data_page = page_then_lose_the_lease  # type: ignore[method-assign]
    with pytest.raises(LeaseLost):
        await crawler.run_once()
    assert await snapshot() == before
    state, progress = before[0], before[1].progress
    assert state.last_seq == 200 and isinstance(progress, paging.BackwardProgress)
    assert progress.lowest_done == 300  # the new owner resumes below the two committed windows
    assert before[1].last_result is None  # the stale run's result was refused too


async def test_an_ack_with_a_stale_token_is_refused(store: Store) -> None:
    outbox = Outbox(store)
    lease = await held_lease(store)
    await outbox.append(STREAM, [NewItem(key=str(i), body=b"x") for i in range(10)])
    await outbox.ack(STREAM, 4, also=lease.check)
    await take_over(store, lease)
    with pytest.raises(LeaseLost):
        await outbox.ack(STREAM, 10, also=lease.check)
    state = await outbox.state(STREAM)
    assert (state.ack_cursor, state.pending) == (4, 6)


async def test_consume_from_two_instances_hands_out_each_message_once(
    pg_schema: tuple[str, str],
) -> None:
    total = 3000
    async with AsyncExitStack() as stack:
        stores = [
            await stack.enter_async_context(open_store(pg_backend(*pg_schema))) for _ in range(2)
        ]
        outboxes = [Outbox(s) for s in stores]
        for chunk in range(0, total, 500):
            items = [NewItem(key=str(i), body=b"x") for i in range(chunk, chunk + 500)]
            await outboxes[0].append(STREAM, items)
        got: list[list[str]] = [[] for _ in range(6)]

        async def consumer(n: int) -> None:
            while True:
                items, _ = await outboxes[n % 2].take(STREAM, 37)
                if not items:
                    return
                got[n].extend(i.key for i in items)

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for n in range(len(got)):
                    nursery.start_soon(consumer, n)
    keys = [k for taken in got for k in taken]
    assert len(keys) == total and set(keys) == {str(i) for i in range(total)}
    assert all(taken for taken in got[:2])  # both instances served some
    for taken in got:
        assert [int(k) for k in taken] == sorted(int(k) for k in taken)  # each in order
