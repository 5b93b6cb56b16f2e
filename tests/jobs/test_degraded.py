"""Store failures: a job whose writes fail degrades to its memory queue and keeps delivering."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import apsw
import psycopg
import pytest
import trio

from daemon import metrics
from daemon.config import JobsConfig, WebhookSpec
from daemon.fakes.receiver import WebhookReceiver
from daemon.jobs import store as jobstore
from daemon.jobs.manager import JobManager
from daemon.jobs.store import JobFinished
from daemon.outbox import Outbox
from daemon.store import Store
from tests.jobs.conftest import fast_webhooks

StartManager = Callable[..., Any]


class FailingWrites:
    """Makes `store.write` raise apsw.IOError while `on` (the write never reaches SQLite)."""

    def __init__(self, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
        self.on = False
        self.failed = 0
        real = store.write

        async def write(fn: Any, **kwargs: Any) -> Any:
            if self.on:
                self.failed += 1
                raise apsw.IOError("disk I/O error (injected)")
            return await real(fn, **kwargs)

        monkeypatch.setattr(store, "write", write)


def degraded_count() -> float:
    for family in metrics.REGISTRY.collect():
        for sample in family.samples:
            if sample.name == "crawld_webhook_events_total" and sample.labels == {
                "outcome": "degraded"
            }:
                return sample.value
    return 0.0


async def until(predicate: Callable[[], bool]) -> None:
    with trio.fail_after(5):
        while not predicate():
            await trio.sleep(0.002)


async def acked(outbox: Outbox, job: str, seq: int) -> None:
    with trio.fail_after(5):
        while (await outbox.state(jobstore.stream_name(job))).ack_cursor < seq:
            await trio.sleep(0.005)


async def test_store_errors_degrade_the_job_and_the_rest_is_delivered(
    rx: WebhookReceiver,
    start_manager: StartManager,
    store: Store,
    outbox: Outbox,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    m = await start_manager()
    faults = FailingWrites(store, monkeypatch)
    before = degraded_count()
    job = await m.create_job("crawl", webhook=WebhookSpec(url=rx.url()), source={})
    for i in range(5):
        assert await m.page(job, [{"i": i}])
    await acked(outbox, job, 6)

    faults.on = True
    for i in range(5, 10):
        assert not await m.page(job, [{"i": i}])  # rows lost, events kept (in memory)
    faults.on = False
    for i in range(10, 15):
        assert await m.page(job, [{"i": i}])  # stored again; events stay in memory
    await m.finish(job, "completed")
    with trio.fail_after(10):
        await m.wait_drained(job)

    rx.check()
    assert rx.seqs(job) == list(range(1, 18))
    assert rx.events(job)[-1].type == "crawl.completed"
    assert faults.failed == 5
    assert degraded_count() - before == 11  # 5 pages during the fault, 5 after, the terminal
    record = await m.get_job(job)
    assert record is not None and (record.status, record.completed, record.last_seq) == (
        "completed", 10, 17,
    )  # fmt: skip
    assert (await outbox.state(jobstore.stream_name(job))).pending == 0


async def test_a_final_status_that_could_not_be_saved_is_saved_later(
    rx: WebhookReceiver,
    start_manager: StartManager,
    store: Store,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    m = await start_manager()
    faults = FailingWrites(store, monkeypatch)
    job = await m.create_job("crawl", webhook=WebhookSpec(url=rx.url()), source={})
    faults.on = True
    await m.finish(job, "failed", "upstream broke")
    with trio.fail_after(5):
        await m.wait_drained(job)
    assert [r.type for r in rx.events(job)] == ["crawl.started", "crawl.failed"]
    record = await m.get_job(job)  # the API already tells the truth
    assert record is not None and (record.status, record.error) == ("failed", "upstream broke")
    assert (await m.status())["unsaved_finishes"] == 1
    faults.on = False
    with pytest.raises(JobFinished):  # no event can follow the terminal one
        await m.page(job, [{"late": True}])
    faults.on = True
    await m.cleanup_once()  # still failing: logged, kept for the next pass
    assert (await m.status())["unsaved_finishes"] == 1
    faults.on = False
    await m.cleanup_once()
    stored = await store.read(lambda c: jobstore.get_job(c, job))
    assert stored is not None and stored.status == "failed"
    assert (await m.status())["unsaved_finishes"] == 0


async def test_a_failed_ack_degrades_and_the_event_goes_out_again_after_restart(
    rx: WebhookReceiver, store: Store, outbox: Outbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    faults = FailingWrites(store, monkeypatch)
    first = JobManager(store, outbox, JobsConfig(), fast_webhooks())
    rx.delay_next(1, 0.1)
    async with trio.open_nursery() as nursery:
        await nursery.start(first.run)
        job = await first.create_job("crawl", webhook=WebhookSpec(url=rx.url()), source={})
        with trio.fail_after(5):
            await rx.wait_until(lambda: len(rx.requests) == 1)
        faults.on = True  # the drainer cannot record the outcome of event 1
        await until(lambda: first._active[job].degraded)
        faults.on = False
        await first.page(job, [{"a": 1}])  # degraded: through memory
        await first.finish(job, "completed")
        with trio.fail_after(5):
            await first.wait_drained(job)
        nursery.cancel_scope.cancel()
    assert [(r.seq, r.delivered) for r in rx.requests] == [(1, True), (2, True), (3, True)]

    # Event 1 is still on disk, after a cursor that never moved: a restart sends it again,
    # with the same webhookId and bytes (the receiver's resend check passes; only its order
    # check notices it came after 3, which is the documented cost of degrading).
    second = JobManager(store, outbox, JobsConfig(), fast_webhooks())
    async with trio.open_nursery() as nursery:
        await nursery.start(second.run)
        with trio.fail_after(5):
            await second.wait_drained(job)
        nursery.cancel_scope.cancel()
    assert [r.seq for r in rx.requests] == [1, 2, 3, 1]
    assert rx.duplicates == [f"{job}:1"]
    assert rx.violations == [f"job {job} seq 1: arrived after seq 3"]
    assert (await outbox.state(jobstore.stream_name(job))).pending == 0


async def test_unreadable_events_stay_on_disk_until_a_restart(
    rx: WebhookReceiver, store: Store, outbox: Outbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_read = store.read
    reads_fail = False

    async def read(fn: Any) -> Any:
        if reads_fail:
            raise apsw.IOError("disk I/O error (injected)")
        return await real_read(fn)

    monkeypatch.setattr(store, "read", read)
    first = JobManager(store, outbox, JobsConfig(), fast_webhooks())
    async with trio.open_nursery() as nursery:
        await nursery.start(first.run)
        reads_fail = True
        job = await first.create_job("crawl", webhook=WebhookSpec(url=rx.url()), source={})
        await until(lambda: first._active[job].disk_closed)
        await first.page(job, [{"a": 1}])  # degraded: memory
        with trio.fail_after(5):
            await rx.wait_delivered(1, job)
        nursery.cancel_scope.cancel()
    assert rx.seqs(job) == [2]

    reads_fail = False
    second = JobManager(store, outbox, JobsConfig(), fast_webhooks())
    async with trio.open_nursery() as nursery:
        await nursery.start(second.run)
        with trio.fail_after(5):
            await rx.wait_delivered(2, job)
        nursery.cancel_scope.cancel()
    assert [(r.seq, r.type) for r in rx.events(job)] == [(2, "crawl.page"), (1, "crawl.started")]


class LostCommits:
    """Makes chosen `store.write` calls of the task that made it fail like a connection lost
    around COMMIT: `after` ones commit and then raise (the caller cannot know), `before` ones
    raise without running. Other tasks' writes (the job's drainer acking events meanwhile) go
    through: which write a fault hits does not depend on how fast the drainer is."""

    def __init__(self, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
        self.after = 0
        self.before = 0
        real = store.write
        owner = trio.lowlevel.current_task()

        async def write(fn: Any, **kwargs: Any) -> Any:
            if trio.lowlevel.current_task() is not owner:
                return await real(fn, **kwargs)
            if self.before:
                self.before -= 1
                raise psycopg.OperationalError("server closed the connection (injected)")
            result = await real(fn, **kwargs)
            if self.after:
                self.after -= 1
                raise psycopg.OperationalError("server closed the connection (injected)")
            return result

        monkeypatch.setattr(store, "write", write)


@pytest.mark.parametrize("store_target", ["postgres"], indirect=True)
async def test_a_shared_store_settles_a_failed_write_instead_of_numbering_again(
    rx: WebhookReceiver,
    start_manager: StartManager,
    store: Store,
    outbox: Outbox,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    m = await start_manager()
    faults = LostCommits(store, monkeypatch)
    before = degraded_count()
    job = await m.create_job("crawl", webhook=WebhookSpec(url=rx.url()), source={})
    faults.after = 1  # page 0 commits, its caller hears an error
    assert await m.page(job, [{"i": 0}])
    faults.before = 1  # page 1 never reaches the database: it runs again
    assert await m.page(job, [{"i": 1}])
    faults.after = 1  # so does the final status
    await m.finish(job, "completed")
    with trio.fail_after(10):
        await m.wait_drained(job)
    assert faults.after == faults.before == 0  # each fault hit the write it was set for
    rx.check()  # one webhookId per seq: no event was numbered twice
    assert rx.seqs(job) == [1, 2, 3, 4] and rx.duplicates == []
    assert rx.events(job)[-1].type == "crawl.completed"
    record = await m.get_job(job)
    assert record is not None and (record.status, record.completed, record.last_seq) == (
        "completed", 2, 4,
    )  # fmt: skip
    assert degraded_count() == before and not m._unsaved  # nothing went through memory
