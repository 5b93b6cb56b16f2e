# Faults in one delivery stay in that delivery: bad settings stored by an older crawld, an
# unexpected exception, 410 Gone, and what leaves the process about them (redacted URLs only).
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
import trio

from daemon.config import JobsConfig, WebhookSpec
from daemon.fakes.receiver import WebhookReceiver
from daemon.jobs import signing
from daemon.jobs import store as jobstore
from daemon.jobs.manager import JobManager
from daemon.logs import JournalFormatter
from daemon.outbox import Outbox
from daemon.store import Store
from tests.jobs.conftest import fast_webhooks

StartManager = Callable[..., Any]


async def drained(manager: JobManager, job_id: str, timeout: float = 20) -> None:
    with trio.fail_after(timeout):
        await manager.wait_drained(job_id)


def idle_manager(store: Store, outbox: Outbox) -> JobManager:
    """A manager whose drainers do not run: it only issues events (as a crawl would)."""
    return JobManager(store, outbox, JobsConfig(), fast_webhooks())


async def test_a_header_stored_by_an_older_crawld_dead_letters_instead_of_crash_looping(
    rx: WebhookReceiver, store: Store, outbox: Outbox, start_manager: StartManager
) -> None:
    producer = idle_manager(store, outbox)
    job = await producer.create_job("crawl", webhook=WebhookSpec(url=rx.url()), source={})
    await producer.page(job, [{"a": 1}])
    await producer.finish(job, "completed")
    old = msgspec.json.encode({"url": rx.url(), "headers": {"X-Team": "caf\u00e9 \u2603"}})
    await store.write(lambda c: c.execute("UPDATE jobs SET webhook = ? WHERE id = ?", (old, job)))

    m = await start_manager()
    await drained(m, job)
    assert rx.requests == []
    errors = await m.job_errors(job)
    assert [e.error for e in errors] == [
        f"webhook event {job}:{seq} ({type_}) was not delivered: invalid webhook settings:"
        " headers: the value of 'X-Team' contains a character outside ASCII (header values are sent as ASCII)"
        " (position 3)"
        for seq, type_ in ((1, "crawl.started"), (2, "crawl.page"), (3, "crawl.completed"))
    ]
    state = await outbox.state(jobstore.stream_name(job))
    assert (state.ack_cursor, state.pending) == (3, 0)
    assert (await m.status())["outcomes"]["failed"] == 3
    record = await m.get_job(job)
    assert record is not None and record.status == "completed"


async def test_an_unexpected_error_building_one_request_fails_only_that_event(
    rx: WebhookReceiver, start_manager: StartManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = signing.attempt_headers
    calls = 0

    def flaky(body: bytes, **kw: Any) -> dict[str, str]:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise UnicodeEncodeError("latin-1", "\u2603", 0, 1, "ordinal not in range(256)")
        return real(body, **kw)

    monkeypatch.setattr(signing, "attempt_headers", flaky)
    m = await start_manager()
    job = await m.create_job("crawl", webhook=WebhookSpec(url=rx.url()), source={})
    await m.page(job, [{"a": 1}])
    await m.finish(job, "completed")
    await drained(m, job)
    rx.check()
    assert rx.seqs(job) == [1, 3]
    [error] = await m.job_errors(job)
    assert error.error == (
        f"webhook event {job}:2 (crawl.page) was not delivered: the request could not be built"
        " or sent (UnicodeEncodeError)"
    )


def crawld_lines(caplog: pytest.LogCaptureFixture) -> str:
    """crawld's own log lines as journald gets them (httpx's are silenced by setup_logging)."""
    return "\n".join(
        JournalFormatter().format(r) for r in caplog.records if r.name.startswith("crawld.")
    )


def secret_url(rx: WebhookReceiver) -> tuple[str, str]:
    """A webhook URL with credentials and a token, and what may be shown of it."""
    return (
        f"http://hookuser:hookpass@127.0.0.1:{rx.port}/hook?token=tok3n",
        f"http://hookuser:***@127.0.0.1:{rx.port}/hook?token=***",
    )


async def test_410_disables_the_endpoint_for_the_job_with_one_error(
    rx: WebhookReceiver,
    store: Store,
    outbox: Outbox,
    start_manager: StartManager,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    url, shown = secret_url(rx)
    producer = idle_manager(store, outbox)
    job = await producer.create_job(
        "crawl",
        webhook=WebhookSpec(url=url, headers={"Authorization": "Bearer hdrsecret"}),
        source={},
    )
    await producer.page(job, [{"a": 1}])
    await producer.page(job, [{"a": 2}])  # events 1-3 wait in the outbox

    rx.fail_next(1, 410)
    m = await start_manager()
    stream = jobstore.stream_name(job)
    with trio.fail_after(10):
        while (await outbox.state(stream)).ack_cursor < 3:
            await trio.sleep(0.005)
    [error] = await m.job_errors(job)
    assert (error.code, error.url) == ("WEBHOOK_FAILED", shown)
    assert error.error == (
        f"webhook endpoint gone at eventId {job}:1 (crawl.started: HTTP 410 Gone);"
        " 2 later events not sent"
    )
    # Events issued afterwards are not sent either; the one error counts them.
    await m.page(job, [{"a": 3}])
    await m.page(job, [{"a": 4}])
    await m.finish(job, "completed")
    await drained(m, job)

    assert [r.status for r in rx.requests] == [410]
    [error] = await m.job_errors(job)
    assert error.error.endswith("(crawl.started: HTTP 410 Gone); 5 later events not sent")
    state = await outbox.state(stream)
    assert (state.ack_cursor, state.pending) == (6, 0)
    record = await m.get_job(job)
    assert record is not None and (record.status, record.completed) == ("completed", 4)
    outcomes = (await m.status())["outcomes"]
    assert (outcomes["failed"], outcomes["skipped"], outcomes["delivered"]) == (1, 5, 0)

    lines = crawld_lines(caplog)
    assert "webhook endpoint gone" in lines
    for secret in ("hookpass", "tok3n", "hdrsecret"):
        assert secret not in lines


async def test_a_gone_endpoint_stays_gone_after_a_restart(
    rx: WebhookReceiver, store: Store, outbox: Outbox
) -> None:
    rx.fail_next(1, 410)
    first = JobManager(store, outbox, JobsConfig(), fast_webhooks())
    async with trio.open_nursery() as nursery:
        await nursery.start(first.run)
        job = await first.create_job("crawl", webhook=WebhookSpec(url=rx.url()), source={})
        with trio.fail_after(10):
            while not await first.job_errors(job):
                await trio.sleep(0.005)
        nursery.cancel_scope.cancel()

    second = JobManager(store, outbox, JobsConfig(), fast_webhooks())
    async with trio.open_nursery() as nursery:
        await nursery.start(second.run)
        await second.page(job, [{"after": "restart"}])
        await second.finish(job, "failed", "boom")
        await drained(second, job)
        nursery.cancel_scope.cancel()

    assert [r.status for r in rx.requests] == [410]
    [error] = await second.job_errors(job)
    assert error.error.endswith("(crawl.started: HTTP 410 Gone); 2 later events not sent")
    mark = await store.read(lambda c: jobstore.webhook_gone(c, job))
    assert mark is not None and (mark.event_id, mark.skipped) == (f"{job}:1", 2)
    record = await second.get_job(job)
    assert record is not None and (record.status, record.error) == ("failed", "boom")


async def test_errors_keep_only_the_redacted_url(
    rx: WebhookReceiver, start_manager: StartManager, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    url, shown = secret_url(rx)
    m = await start_manager()
    await rx.die()
    job = await m.create_job(
        "crawl", webhook=WebhookSpec(url=url, headers={"X-Key": "hdrsecret"}), source={}
    )
    await m.finish(job, "completed")
    await drained(m, job)
    errors = await m.job_errors(job)
    assert len(errors) == 2 and all(e.url == shown for e in errors)
    lines = crawld_lines(caplog)
    for secret in ("hookpass", "tok3n", "hdrsecret"):
        assert secret not in lines


async def test_410_without_the_store_skips_the_memory_queue_too(
    rx: WebhookReceiver, start_manager: StartManager
) -> None:
    rx.fail_next(1, 410)
    m = await start_manager(jobs=JobsConfig(store=False))
    job = await m.create_job("crawl", webhook=WebhookSpec(url=rx.url()), source={})
    for i in range(3):
        await m.page(job, [{"i": i}])
    await m.finish(job, "cancelled")
    await drained(m, job)
    assert [r.status for r in rx.requests] == [410]
    [error] = await m.job_errors(job)
    assert error.error.endswith("(crawl.started: HTTP 410 Gone); 4 later events not sent")
    record = await m.get_job(job)
    assert record is not None and record.status == "cancelled"
    assert (await m.status())["pending_events"] == 0
