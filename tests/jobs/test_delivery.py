from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
import trio

from daemon.config import Duration, JobsConfig, WebhookSpec
from daemon.fakes.receiver import WebhookReceiver
from daemon.jobs import store as jobstore
from daemon.jobs.delivery import Deliverer, DeliverySettings
from daemon.jobs.manager import JobManager
from daemon.outbox import Outbox
from daemon.store import Store, one
from tests.jobs.conftest import FakeResolver, fast_webhooks

StartManager = Callable[..., Any]


async def drained(manager: JobManager, job_id: str, timeout: float = 20) -> None:
    with trio.fail_after(timeout):
        await manager.wait_drained(job_id)


async def test_a_burst_of_1000_events_arrives_in_order_terminal_last(
    rx: WebhookReceiver, start_manager: StartManager, store: Store
) -> None:
    m = await start_manager()
    job = await m.create_job("crawl", webhook=WebhookSpec(url=rx.url()), source={})
    for i in range(998):
        await m.page(job, [{"i": i}])
    await m.finish(job, "completed")
    await drained(m, job)
    rx.check()
    got = rx.events(job)
    assert [r.seq for r in got] == list(range(1, 1001))
    assert got[-1].type == "crawl.completed"
    assert rx.duplicates == [] and rx.gaps(job) == []
    # The cursor moves per event, rows are deleted per batch: none are left.
    left = "SELECT count(*) FROM outbox_items WHERE stream = ?"
    assert await store.read(lambda c: one(c, left, (jobstore.stream_name(job),))[0]) == 0


async def test_many_jobs_drain_concurrently_within_the_per_host_cap(
    rx: WebhookReceiver, start_manager: StartManager, nursery: trio.Nursery
) -> None:
    m = await start_manager(webhooks=fast_webhooks(per_host_concurrency=3))
    jobs = [
        await m.create_job("crawl", webhook=WebhookSpec(url=rx.url()), source={}) for _ in range(12)
    ]
    most = 0

    async def watch() -> None:
        nonlocal most
        while True:
            borrowed = [lim.statistics().borrowed_tokens for lim in m.deliverer._limiters.values()]
            most = max(most, *borrowed, 0)
            await trio.sleep(0.001)

    nursery.start_soon(watch)
    # Answers slow enough that three deliveries overlap whatever the store's commit takes.
    rx.delay_next(60, 0.05)
    for round_ in range(4):
        for job in jobs:
            await m.page(job, [{"round": round_}])
    for job in jobs:
        await m.finish(job, "completed")
    for job in jobs:
        await drained(m, job)
    rx.check()
    assert all(rx.seqs(job) == list(range(1, 7)) for job in jobs)
    assert most == 3
    [held] = m.deliverer._clients.values()  # one connection per request in flight, kept alive
    assert held.transport.opened == 3 and held.transport.idle == 3
    m.configure(JobsConfig(), fast_webhooks(per_host_concurrency=2))
    [limiter] = m.deliverer._limiters.values()
    assert (limiter.total_tokens, held.transport.max_idle) == (2, 2)


async def test_500_then_200_resends_the_same_event_with_a_new_timestamp(
    rx: WebhookReceiver, start_manager: StartManager
) -> None:
    # A retry wait above one second, so the attempt timestamps (in seconds) must differ.
    m = await start_manager(webhooks=fast_webhooks(retry_schedule=[Duration(1.3)]))
    rx.fail_next(1, 500)
    job = await m.create_job("crawl", webhook=WebhookSpec(url=rx.url()), source={})
    await m.finish(job, "completed")
    await drained(m, job)
    rx.check()  # both attempts carry valid signatures
    first, second, third = rx.requests
    assert (first.status, second.status, third.status) == (500, 200, 200)
    assert (first.seq, second.seq, third.seq) == (1, 1, 2)
    assert first.webhook_id == second.webhook_id and first.body == second.body
    assert int(second.headers["webhook-timestamp"]) > int(first.headers["webhook-timestamp"])
    assert first.headers["webhook-signature"] != second.headers["webhook-signature"]
    assert await m.job_errors(job) == []


async def test_a_receiver_slower_than_the_timeout_gets_the_event_again(
    rx: WebhookReceiver, start_manager: StartManager, autojump_clock: trio.testing.MockClock
) -> None:
    # Virtual time: the first answer would come after an hour, the attempt gives up after 10 s.
    # Nothing here waits on a thread while a request is in flight (the receiver runs in this
    # loop), so the clock only jumps when both sides are really waiting for a timer.
    m = await start_manager(
        webhooks=fast_webhooks(timeout=Duration(10), retry_schedule=[Duration(1), Duration(1)])
    )
    rx.delay_next(1, 3600)
    job = await m.create_job("crawl", webhook=WebhookSpec(url=rx.url()), source={})
    await m.finish(job, "completed")
    await m.wait_drained(job)
    rx.check()
    assert [r.seq for r in rx.requests] == [1, 1, 2]
    assert rx.requests[0].webhook_id == rx.requests[1].webhook_id
    assert await m.job_errors(job) == []


async def test_a_receiver_down_past_the_schedule_dead_letters_and_moves_on(
    rx: WebhookReceiver, start_manager: StartManager, outbox: Outbox
) -> None:
    m = await start_manager()
    job = await m.create_job("crawl", webhook=WebhookSpec(url=rx.url()), source={})
    stream = jobstore.stream_name(job)
    with trio.fail_after(5):  # the drainer has its answer (not just the receiver its request)
        while (await outbox.state(stream)).ack_cursor < 1:
            await trio.sleep(0.005)
    await rx.die()
    await m.page(job, [{"lost": True}])
    with trio.fail_after(5):
        while not await m.job_errors(job):
            await trio.sleep(0.01)
    await rx.revive()
    await m.page(job, [{"kept": True}])
    await m.finish(job, "completed")
    await drained(m, job)

    rx.check()
    assert rx.seqs(job) == [1, 3, 4] and rx.gaps(job) == [(1, 3)]
    [error] = await m.job_errors(job)
    assert (error.code, error.url) == ("WEBHOOK_FAILED", rx.url())
    assert error.error == (
        f"webhook event {job}:2 (crawl.page) was not delivered: "
        "gave up after 3 attempts; last: connection failed"
    )
    state = await outbox.state(stream)
    assert (state.ack_cursor, state.pending) == (4, 0)
    assert (await m.status())["outcomes"] == {
        "delivered": 3,
        "failed": 1,
        "blocked": 0,
        "skipped": 0,
    }


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1:{port}/hook", "loopback address 127.0.0.1"),
        ("http://169.254.169.254/latest/meta-data", "link-local address 169.254.169.254"),
        ("http://[::ffff:127.0.0.1]:{port}/hook", "IPv4-mapped form of loopback address"),
        ("http://localhost:{port}/hook", "localhost resolves only to blocked addresses"),
    ],
)
async def test_blocked_addresses_are_final_and_recorded(
    rx: WebhookReceiver, start_manager: StartManager, url: str, reason: str
) -> None:
    m = await start_manager(webhooks=fast_webhooks(allow_cidrs=[]))
    target = url.format(port=rx.port)
    job = await m.create_job("crawl", webhook=WebhookSpec(url=target), source={})
    await m.page(job, [{"a": 1}])
    await m.finish(job, "completed")
    await drained(m, job)
    assert rx.requests == []
    errors = await m.job_errors(job)
    assert [e.error.split(": ", 1)[0] for e in errors] == [
        f"webhook event {job}:{seq} ({type_}) was not delivered"
        for seq, type_ in ((1, "crawl.started"), (2, "crawl.page"), (3, "crawl.completed"))
    ]
    assert all("address blocked" in e.error and reason in e.error for e in errors), errors
    assert all(e.url == target for e in errors)
    assert (await m.status())["outcomes"]["blocked"] == 3


# -- retry timing on trio's clock (no sockets: httpx's MockTransport answers) ------------------


class Script:
    """Answers attempts from a list of (status, headers) and records when each came."""

    def __init__(self, *answers: tuple[int, dict[str, str]]) -> None:
        self.answers = list(answers)
        self.times: list[float] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.times.append(trio.current_time())
        status, headers = self.answers.pop(0) if self.answers else (200, {})
        return httpx.Response(status, headers=headers, json={"ok": status < 300})

    @property
    def waits(self) -> list[float]:
        return [round(b - a, 3) for a, b in zip(self.times, self.times[1:], strict=False)]


async def run_one_event(
    store: Store,
    outbox: Outbox,
    script: Script,
    autojump_clock: trio.testing.MockClock,
    schedule: list[float],
) -> list[Any]:
    # Store work runs in threads; let the clock jump only after 20 ms of real idleness.
    autojump_clock.autojump_threshold = 0.02
    webhooks = fast_webhooks(retry_schedule=[Duration(s) for s in schedule], timeout=Duration(10))
    m = JobManager(store, outbox, JobsConfig(), webhooks, transport=httpx.MockTransport(script))
    async with trio.open_nursery() as nursery:
        await nursery.start(m.run)
        job = await m.create_job(
            "crawl", webhook=WebhookSpec(url="http://127.0.0.1/hook", events=["started"]), source={}
        )
        await m.finish(job, "completed")
        await m.wait_drained(job)
        nursery.cancel_scope.cancel()
    return await m.job_errors(job)


async def test_retry_after_is_a_floor_and_redirects_are_failures(
    store: Store, outbox: Outbox, autojump_clock: trio.testing.MockClock
) -> None:
    script = Script((429, {"Retry-After": "120"}), (302, {"Location": "http://10.0.0.1/"}))
    errors = await run_one_event(store, outbox, script, autojump_clock, [5, 60, 300])
    assert errors == []
    assert len(script.times) == 3
    first, second = script.waits
    assert first == pytest.approx(120, abs=0.1)  # 5 s ± 20 % raised to Retry-After
    assert 48 <= second <= 72  # the 3xx was not followed, just retried after 60 s ± 20 %


async def test_410_stops_at_once(
    store: Store, outbox: Outbox, autojump_clock: trio.testing.MockClock
) -> None:
    script = Script((410, {}))
    [error] = await run_one_event(store, outbox, script, autojump_clock, [5, 60])
    assert len(script.times) == 1
    assert error.error.endswith("(crawl.started: HTTP 410 Gone); 0 later events not sent")


async def test_the_schedule_runs_out(
    store: Store, outbox: Outbox, autojump_clock: trio.testing.MockClock
) -> None:
    script = Script(*[(503, {})] * 10)
    [error] = await run_one_event(store, outbox, script, autojump_clock, [5, 60, 300, 900, 3600])
    assert len(script.times) == 6
    for wait, planned in zip(script.waits, [5, 60, 300, 900, 3600], strict=True):
        assert 0.8 * planned <= wait <= 1.2 * planned
    assert error.error.endswith("gave up after 6 attempts; last: HTTP 503")


async def test_each_destination_host_has_its_own_client_closed_when_idle(
    rx: WebhookReceiver, store: Store, outbox: Outbox, resolver: FakeResolver
) -> None:
    resolver.table.update({"a.test": ["127.0.0.1"], "b.test": ["127.0.0.1"]})
    m = JobManager(store, outbox, JobsConfig(), fast_webhooks(timeout=Duration(10)))
    async with trio.open_nursery() as nursery:
        await nursery.start(m.run)
        jobs = [
            await m.create_job(
                "crawl", webhook=WebhookSpec(url=f"http://{host}:{rx.port}/hook"), source={}
            )
            for host in ("a.test", "b.test", "a.test")
        ]
        for job in jobs:
            await m.finish(job, "completed")
        for job in jobs:
            await drained(m, job)
        clients = m.deliverer._clients
        assert sorted(clients) == [f"http://a.test:{rx.port}", f"http://b.test:{rx.port}"]
        first, second = (held.transport for held in clients.values())
        assert first is not second  # one pool each: no connection or TLS session shared
        now = trio.current_time()
        assert await m.deliverer.close_idle(now) == 0  # just used
        assert await m.deliverer.close_idle(now + 60) == 2
        assert m.deliverer.host_clients == 0
        job = await m.create_job("crawl", webhook=WebhookSpec(url=rx.url()), source={})
        await m.finish(job, "completed")
        await drained(m, job)
        assert m.deliverer.host_clients == 1
        nursery.cancel_scope.cancel()
    assert m.deliverer.host_clients == 0  # closed at shutdown
    rx.check()
    hosts = sorted({r.headers["host"].split(":")[0] for r in rx.requests})
    assert hosts == ["127.0.0.1", "a.test", "b.test"]


async def test_concurrent_first_requests_to_a_host_share_one_pool() -> None:
    settings = DeliverySettings(secret=None, timeout=1.0, schedule=(), allow=(), per_host=2)
    deliverer = Deliverer(settings)
    got: list[Any] = []

    async def take(host_key: str) -> None:
        got.append(await deliverer._acquire(host_key))

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(take, "https://h.test:")  # built in a worker thread
        nursery.start_soon(take, "http://h.test:")
    assert deliverer.host_clients == 2
    https = [held for held in got if held is deliverer._clients["https://h.test:"]]
    assert len(https) == 3 and https[0].in_use == 3
    await deliverer.aclose()
    assert deliverer.host_clients == 0
