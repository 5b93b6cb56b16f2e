from __future__ import annotations

from collections.abc import Callable
from typing import Any

import apsw
import msgspec
import pytest
import trio

from daemon import metrics
from daemon import outbox as outbox_mod
from daemon.config import Duration, JobsConfig, WebhookSpec
from daemon.fakes.receiver import WebhookReceiver
from daemon.jobs import store as jobstore
from daemon.jobs.manager import JobManager
from daemon.jobs.store import JobFinished, JobNotFound
from daemon.jobs.types import JobRecord
from daemon.outbox import Outbox
from daemon.store import Store
from tests.jobs.conftest import fast_webhooks

StartManager = Callable[..., Any]


def hook(rx: WebhookReceiver, **kw: Any) -> WebhookSpec:
    return WebhookSpec(url=rx.url(), **kw)


async def drained(manager: JobManager, job_id: str, timeout: float = 10) -> None:
    with trio.fail_after(timeout):
        await manager.wait_drained(job_id)


async def test_events_arrive_in_order_in_firecrawl_shape(
    rx: WebhookReceiver, start_manager: StartManager
) -> None:
    m = await start_manager()
    spec = hook(rx, metadata={"team": "a"}, headers={"Authorization": "Bearer t"})
    job = await m.create_job("crawl", webhook=spec, source={"task_id": "t1"})
    await m.page(job, [{"title": "a"}, {"title": "b"}])
    await m.page(job, [{"title": "c"}])
    await m.finish(job, "completed")
    await drained(m, job)

    rx.check()  # order, resend consistency and every signature
    got = rx.events(job)
    assert [r.type for r in got] == ["crawl.started", "crawl.page", "crawl.page", "crawl.completed"]
    first_page = got[1]
    assert list(first_page.json) == [
        "success", "type", "id", "webhookId", "eventId", "seq", "data", "metadata",
    ]  # fmt: skip
    assert first_page.json["data"] == [{"title": "a"}, {"title": "b"}]
    assert first_page.json["metadata"] == {"team": "a"}
    assert first_page.event_id == f"{job}:2"
    assert first_page.headers["webhook-id"] == first_page.webhook_id
    assert first_page.headers["x-firecrawl-event"] == "crawl.page"
    assert first_page.headers["authorization"] == "Bearer t"
    assert first_page.headers["x-firecrawl-signature"].startswith("sha256=")
    assert len({r.webhook_id for r in got}) == 4

    record = await m.get_job(job)
    assert record is not None
    assert (record.status, record.completed, record.total, record.last_seq) == (
        "completed",
        3,
        3,
        4,
    )
    assert record.completed_ms is not None
    assert record.expires_ms == record.completed_ms + 86_400_000
    rows, more = await m.job_rows(job, 0, 100, 1 << 20)
    assert [msgspec.json.decode(r) for r in rows] == [{"title": t} for t in "abc"] and not more
    assert (await m.outbox.state(jobstore.stream_name(job))).pending == 0


async def test_filtered_events_take_no_seq(
    rx: WebhookReceiver, start_manager: StartManager
) -> None:
    m = await start_manager()
    job = await m.create_job("crawl", webhook=hook(rx, events=["page"]), source={})
    for i in range(3):
        await m.page(job, [{"i": i}])
    await m.finish(job, "failed", "upstream broke")
    await drained(m, job)  # the drainer ends although the terminal event was filtered out
    assert [(r.type, r.seq) for r in rx.events(job)] == [("crawl.page", n) for n in (1, 2, 3)]


async def test_failed_and_cancelled_send_one_failed_terminal(
    rx: WebhookReceiver, start_manager: StartManager
) -> None:
    m = await start_manager()
    failed = await m.create_job("crawl", webhook=hook(rx), source={})
    cancelled = await m.create_job("crawl", webhook=hook(rx), source={})
    await m.finish(failed, "failed", "upstream broke")
    await m.finish(cancelled, "cancelled")
    await drained(m, failed)
    await drained(m, cancelled)
    terminal = {r.job_id: r.json for r in rx.events() if r.type == "crawl.failed"}
    assert terminal[failed]["error"] == "upstream broke" and terminal[failed]["success"] is False
    assert terminal[cancelled]["error"] == "cancelled"
    assert [r.type for r in rx.events(cancelled)] == ["crawl.started", "crawl.failed"]
    record = await m.get_job(cancelled)
    assert record is not None and record.status == "cancelled"


async def test_a_job_without_webhook_stores_no_events(
    start_manager: StartManager, store: Store
) -> None:
    m = await start_manager()
    job = await m.create_job("crawl", webhook=None, source={"task_id": "t"})
    assert await m.page(job, [{"a": 1}])
    await m.finish(job, "completed")
    await m.wait_drained(job)
    assert await store.read(lambda c: outbox_mod.list_streams(c, "webhook:")) == []
    record = await m.get_job(job)
    assert record is not None and (record.completed, record.last_seq) == (1, 0)


async def test_page_in_tx_commits_and_rolls_back_with_the_caller(
    rx: WebhookReceiver, start_manager: StartManager, store: Store
) -> None:
    m = await start_manager()
    await store.write(lambda c: c.execute("CREATE TABLE progress(v INTEGER)"))
    job = await m.create_job("crawl", webhook=hook(rx), source={})

    def window_fails(conn: apsw.Connection) -> None:
        conn.execute("INSERT INTO progress VALUES (1)")
        m.page_in_tx(conn, job, [{"lost": True}])
        raise RuntimeError("publishing the window failed")

    with pytest.raises(RuntimeError):
        await store.write(window_fails)

    def window(conn: apsw.Connection) -> Any:
        conn.execute("INSERT INTO progress VALUES (2)")
        return m.page_in_tx(conn, job, [{"kept": True}])

    pending = await store.write(window)
    await m.after_commit(pending)
    await m.finish(job, "completed")
    await drained(m, job)
    assert await store.read(lambda c: c.execute("SELECT v FROM progress").fetchall()) == [(2,)]
    assert [(r.seq, r.json["data"]) for r in rx.events(job)] == [
        (1, []),
        (2, [{"kept": True}]),
        (3, []),
    ]  # fmt: skip  (the rolled-back window left no gap)


async def test_misuse_is_refused(rx: WebhookReceiver, start_manager: StartManager) -> None:
    m = await start_manager()
    with pytest.raises(ValueError, match="unknown job kind"):
        await m.create_job("scrape", webhook=None, source={})
    job = await m.create_job("crawl", webhook=hook(rx), source={})
    await m.finish(job, "completed")
    with pytest.raises(JobFinished, match="already completed"):
        await m.page(job, [{"late": 1}])
    with pytest.raises(JobFinished):
        await m.finish(job, "failed", "again")
    with pytest.raises(JobNotFound):
        await m.page("00000000-0000-0000-0000-000000000000", [])
    with pytest.raises(JobNotFound):
        await m.add_error("00000000-0000-0000-0000-000000000000", "X", "y")
    with pytest.raises(JobNotFound):
        m.cancel_requested("00000000-0000-0000-0000-000000000000")
    await drained(m, job)
    assert [r.type for r in rx.events(job)] == ["crawl.started", "crawl.completed"]


async def test_cancel_asks_an_attached_producer_and_cancels_an_orphan(
    rx: WebhookReceiver, start_manager: StartManager, store: Store
) -> None:
    m = await start_manager()
    job = await m.create_job("crawl", webhook=hook(rx), source={})
    stop = m.cancel_requested(job)
    await m.cancel(job)
    assert stop.is_set()
    record = await m.get_job(job)
    assert record is not None and record.status == "scraping"  # the producer finishes it
    await m.finish(job, "cancelled")
    with pytest.raises(JobFinished):
        await m.cancel(job)

    # A running job from an earlier process: nobody produces for it, so it is cancelled at once.
    orphan = "11111111-1111-4111-8111-111111111111"
    await store.write(
        lambda c: jobstore.insert_job(
            c, job_id=orphan, kind="crawl", webhook=hook(rx), source={}, at_ms=1, expires_ms=2
        )
    )
    await m.cancel(orphan)
    record = await m.get_job(orphan)
    assert record is not None and record.status == "cancelled"
    await drained(m, orphan)
    assert [(r.type, r.seq, r.json.get("error")) for r in rx.events(orphan)] == [
        ("crawl.failed", 1, "cancelled")
    ]
    with pytest.raises(JobNotFound):
        await m.cancel("22222222-2222-4222-8222-222222222222")


async def test_a_producers_canceller_ends_its_own_jobs_and_leaves_the_rest(
    rx: WebhookReceiver, start_manager: StartManager
) -> None:
    m = await start_manager()
    own = await m.create_job("crawl", webhook=None, source={})
    other = await m.create_job("crawl", webhook=None, source={})
    asked: list[str] = []

    async def cancel_own(record: JobRecord) -> bool:
        asked.append(record.id)
        if record.id != own:
            return False
        await m.finish(record.id, "cancelled")
        return True

    m.add_canceller(cancel_own)
    other_stop = m.cancel_requested(other)
    await m.cancel(own)
    await m.cancel(other)
    assert asked == [own, other]
    record = await m.get_job(own)
    assert record is not None and record.status == "cancelled"
    assert other_stop.is_set()  # the manager's own cancel: its attached producer is asked
    with pytest.raises(JobFinished):
        await m.cancel(own)
    with pytest.raises(JobNotFound):
        await m.cancel("22222222-2222-4222-8222-222222222222")


async def test_errors_are_listed_in_order(start_manager: StartManager) -> None:
    m = await start_manager()
    job = await m.create_job("crawl", webhook=None, source={})
    await m.add_error(job, "UPSTREAM", "page 3 failed", url="https://up/3")
    await m.add_error(job, "UPSTREAM", "page 4 failed")
    errors = await m.job_errors(job)
    assert [(e.code, e.error, e.url) for e in errors] == [
        ("UPSTREAM", "page 3 failed", "https://up/3"),
        ("UPSTREAM", "page 4 failed", None),
    ]


async def test_cleanup_deletes_expired_finished_jobs_only(
    store: Store, outbox: Outbox, nursery: trio.Nursery
) -> None:
    now = [1_000_000]
    m = JobManager(
        store, outbox, JobsConfig(ttl=Duration(60)), fast_webhooks(), clock_ms=lambda: now[0]
    )
    await nursery.start(m.run)
    done = await m.create_job("crawl", webhook=None, source={})
    running = await m.create_job("crawl", webhook=None, source={})
    await m.page(done, [{"i": i} for i in range(5000)])
    await m.finish(done, "completed")
    now[0] += 59_999
    assert await m.cleanup_once() == 0
    assert await m.get_job(done) is not None
    now[0] += 1
    assert await m.get_job(done) is None  # expired: not found even before the cleanup ran
    assert await m.cleanup_once() == 1
    assert await store.read(lambda c: jobstore.get_job(c, done)) is None
    assert await m.get_job(running) is not None  # running jobs never expire


async def test_memory_mode_applies_backpressure_and_loses_nothing(
    rx: WebhookReceiver, start_manager: StartManager, store: Store
) -> None:
    m = await start_manager(jobs=JobsConfig(store=False, memory_queue_size=2))
    job = await m.create_job("crawl", webhook=hook(rx), source={})
    with trio.fail_after(5):
        await rx.wait_delivered(1, job)
    rx.delay_next(12, 0.05)
    issued: list[int] = []

    async def producer() -> None:
        for i in range(10):
            await m.page(job, [{"i": i}])
            issued.append(i)
        await m.finish(job, "completed")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(producer)
        with trio.fail_after(5):
            while (status := await m.status())["memory_queued"] < 2:
                await trio.sleep(0.005)
        # The queue holds 2 and one is in flight: the producer is held back, not dropping.
        assert len(issued) <= len(rx.events(job)) + 3 < 10
        assert status["memory_queued"] == 2 and status["store"] is False
    await drained(m, job)
    rx.check()
    assert rx.seqs(job) == list(range(1, 13))
    assert await store.read(lambda c: outbox_mod.list_streams(c, "webhook:")) == []
    record = await m.get_job(job)
    assert record is not None and record.completed == 10 and record.last_seq == 12


async def test_restart_resumes_after_the_cursor_and_never_resends_acked_events(
    rx: WebhookReceiver, store: Store, outbox: Outbox
) -> None:
    first = JobManager(store, outbox, JobsConfig(), fast_webhooks(retry_schedule=[Duration(60)]))
    rx.fail_next(1, 500)
    async with trio.open_nursery() as nursery:
        await nursery.start(first.run)
        job = await first.create_job("crawl", webhook=hook(rx), source={})
        for i in range(4):
            await first.page(job, [{"i": i}])
        await first.finish(job, "completed")
        with trio.fail_after(5):
            await rx.wait_until(lambda: len(rx.requests) == 1)  # started failed; retry in ~60 s
        nursery.cancel_scope.cancel()  # "crash"

    # A crash between advancing the cursor and deleting: events at or below it are not sent.
    await store.write(
        lambda c: c.execute(
            "UPDATE outbox_streams SET ack_cursor = 2 WHERE stream = ?",
            (jobstore.stream_name(job),),
        )
    )
    second = JobManager(store, outbox, JobsConfig(), fast_webhooks())
    async with trio.open_nursery() as nursery:
        await nursery.start(second.run)
        await drained(second, job)
        nursery.cancel_scope.cancel()
    assert [(r.seq, r.status) for r in rx.requests] == [
        (1, 500), (3, 200), (4, 200), (5, 200), (6, 200),
    ]  # fmt: skip
    assert (await outbox.state(jobstore.stream_name(job))).pending == 0


async def test_status_section_and_metrics(rx: WebhookReceiver, start_manager: StartManager) -> None:
    m = await start_manager()
    job = await m.create_job("crawl", webhook=hook(rx), source={})
    with trio.fail_after(5):
        await rx.wait_delivered(1, job)
    rx.delay_next(1, 0.15)
    await m.page(job, [{"a": 1}])
    with trio.fail_after(5):
        await rx.wait_until(lambda: len(rx.requests) == 2)
    status = await m.status()
    assert status["drainers"] == 1 and status["pending_events"] == 1
    assert status["oldest_pending_s"] is not None
    text = metrics.render().decode()
    assert f'crawld_webhook_cursor_lag{{job="{job}"}} 1.0' in text
    assert "crawld_webhook_oldest_pending_seconds" in text
    await m.finish(job, "completed")
    await drained(m, job)
    status = await m.status()
    assert status["outcomes"] == {"delivered": 3, "failed": 0, "blocked": 0, "skipped": 0}
    assert status["pending_events"] == 0 and status["jobs_active"] == 0
    text = metrics.render().decode()
    assert 'crawld_webhook_events_total{outcome="delivered"}' in text
    assert 'crawld_webhook_attempts_total{result="2xx"}' in text
    assert "crawld_webhook_delivery_seconds_bucket" in text
    assert f'crawld_webhook_cursor_lag{{job="{job}"}}' not in text


async def test_shutdown_drops_memory_only_events_and_counts_them(
    rx: WebhookReceiver, store: Store, outbox: Outbox
) -> None:
    def dropped() -> float:
        value = metrics.REGISTRY.get_sample_value(
            "crawld_webhook_events_total", {"outcome": "dropped"}
        )
        return value or 0.0

    before = dropped()
    m = JobManager(store, outbox, JobsConfig(store=False), fast_webhooks())
    rx.delay_next(1, 0.15)
    async with trio.open_nursery() as nursery:
        await nursery.start(m.run)
        job = await m.create_job("crawl", webhook=hook(rx), source={})
        for i in range(3):
            await m.page(job, [{"i": i}])
        with trio.fail_after(30):
            await rx.wait_until(lambda: len(rx.requests) == 1)
        nursery.cancel_scope.cancel()  # the daemon stops while 4 events wait in memory
    assert dropped() - before == 4
    await m.finish(job, "completed")  # after shutdown: counted, never waits on a full queue
    assert dropped() - before == 5


async def test_detach_forgets_a_job_another_process_ends(
    rx: WebhookReceiver, start_manager: StartManager, store: Store
) -> None:
    m = await start_manager()
    # A crawl created elsewhere that this process worked on (attach), then ended elsewhere.
    other = "33333333-3333-4333-8333-333333333333"
    await store.write(
        lambda c: jobstore.insert_job(
            c, job_id=other, kind="crawl", webhook=None, source={}, at_ms=1, expires_ms=2
        )
    )
    await m.attach(other)
    assert (await m.status())["jobs_running"] == 1
    m.detach(other)
    m.detach(other)  # twice: nothing left to drop
    status = await m.status()
    assert status["jobs_active"] == 0 and status["jobs_running"] == 0
    with pytest.raises(JobNotFound):
        m.cancel_requested(other)

    # Its drainer runs here: the drainer keeps the state until the terminal event is delivered.
    job = await m.create_job("crawl", webhook=hook(rx), source={})
    await m.attach(job)
    with trio.fail_after(5):
        await rx.wait_delivered(1, job)
    m.detach(job)
    assert (await m.status())["jobs_active"] == 1
    await m.finish(job, "completed")
    await drained(m, job)
    assert (await m.status())["jobs_active"] == 0
    assert [r.type for r in rx.events(job)] == ["crawl.started", "crawl.completed"]
