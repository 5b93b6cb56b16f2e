"""A webhook retry schedule outlives the drainer: attempts made and the next attempt's time are
stored, so a new JobManager on the same store (a restart) continues at the next attempt number,
at its scheduled time, and a final failure counts every attempt. Virtual time: the drainer's
clock and the receiver's follow trio's mock clock, and the store runs its SQLite calls on the
trio thread (a task waiting for a thread looks idle to autojump_clock, which would jump ahead);
so on SQLite only (the statements are tested on both backends in test_jobs_store.py, and across
real processes on PostgreSQL in test_fault_process.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import trio
import trio.testing

from daemon.config import Duration, JobsConfig, WebhookSpec
from daemon.fakes.receiver import WebhookReceiver, open_receiver
from daemon.jobs import store as jobstore
from daemon.jobs.manager import JobManager
from daemon.outbox import Outbox
from daemon.store import Store
from tests.jobs.conftest import fast_webhooks

pytestmark = pytest.mark.parametrize("store_target", ["sqlite"], indirect=True)

EPOCH_MS = 1_800_000_000_000
CLOCK: list[trio.testing.MockClock] = []


def clock_ms() -> int:
    """Epoch ms on trio's mock clock (callable from the store's threads too)."""
    return EPOCH_MS + int(CLOCK[-1].current_time() * 1000)


class NoJitter:
    def random(self) -> float:
        return 0.5


@pytest.fixture(autouse=True)
def inline_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Store, "inline", True)


@pytest.fixture
async def vrx(autojump_clock: trio.testing.MockClock) -> AsyncIterator[WebhookReceiver]:
    """A receiver stamping arrivals with trio's (virtual) clock; no signature checks (they use
    wall-clock timestamps). The test must take `autojump_clock` too (pytest-trio runs a test on
    a clock among its own arguments)."""
    CLOCK.append(autojump_clock)
    try:
        async with open_receiver(clock=autojump_clock.current_time) as receiver:
            yield receiver
    finally:
        CLOCK.pop()


def arrived_ms(rx: WebhookReceiver, index: int) -> int:
    return EPOCH_MS + int(rx.requests[index].arrived * 1000)


async def run_manager(
    store: Store, outbox: Outbox, schedule: list[float], body: Callable[[JobManager], Any]
) -> Any:
    """A JobManager (one process's life) running while `body(manager)` runs."""
    webhooks = fast_webhooks(timeout=Duration(5), retry_schedule=[Duration(s) for s in schedule])
    manager = JobManager(
        store,
        outbox,
        JobsConfig(),
        webhooks,
        clock_ms=clock_ms,
        rng=NoJitter(),  # type: ignore[arg-type]
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.run)
        result = await body(manager)
        nursery.cancel_scope.cancel()
    return result


async def stored(store: Store, job: str) -> jobstore.RetryState | None:
    return await store.read(lambda c: jobstore.retry_state(c, job))


async def wait_stored(store: Store, job: str, attempts: int) -> jobstore.RetryState:
    with trio.fail_after(600):
        while (state := await stored(store, job)) is None or state.attempts < attempts:
            await trio.sleep(0.05)
    return state


async def test_an_event_failing_at_attempt_3_continues_at_attempt_4_after_a_restart(
    vrx: WebhookReceiver,
    store: Store,
    outbox: Outbox,
    autojump_clock: trio.testing.MockClock,
) -> None:
    schedule = [1.0, 2.0, 60.0, 90.0, 120.0]
    vrx.fail_next(4, 503)  # attempts 1-3 before the restart, attempt 4 after it

    async def first_life(m: JobManager) -> tuple[str, jobstore.RetryState, dict[str, Any]]:
        job = await m.create_job("crawl", webhook=WebhookSpec(url=vrx.url()), source={})
        await m.finish(job, "completed")
        state = await wait_stored(store, job, 3)
        return job, state, await m.status()

    job, third, status = await run_manager(store, outbox, schedule, first_life)
    assert [(r.seq, r.status) for r in vrx.requests] == [(1, 503)] * 3
    assert (third.seq, third.attempts, third.last_status, third.last_error) == (
        1, 3, 503, "HTTP 503",
    )  # fmt: skip
    assert third.next_ms == third.at_ms + 60_000  # the third wait of the schedule, no jitter
    [shown] = status["retrying"]["next"]
    assert (shown["event"], shown["attempts"], shown["last_status"]) == (f"{job}:1", 3, 503)
    assert status["retrying"]["events"] == 1

    await trio.sleep(20)  # down for 20 s of the 60 s wait

    async def second_life(m: JobManager) -> jobstore.RetryState:
        fourth = await wait_stored(store, job, 4)
        with trio.fail_after(300):
            await m.wait_drained(job)
        return fourth

    fourth = await run_manager(store, outbox, schedule, second_life)
    assert [(r.seq, r.status) for r in vrx.requests] == [(1, 503)] * 4 + [(1, 200), (2, 200)]
    sent = arrived_ms(vrx, 3)
    assert sent >= third.next_ms, "attempt 4 went out before its scheduled time"
    assert sent < third.next_ms + 1000, "attempt 4 did not go out at its scheduled time"
    # It was attempt 4 (the schedule's fourth wait followed it), and attempt 5 kept its time.
    assert (fourth.attempts, fourth.next_ms - fourth.at_ms) == (4, 90_000)
    assert fourth.next_ms <= arrived_ms(vrx, 4) < fourth.next_ms + 1000
    assert vrx.requests[3].webhook_id == vrx.requests[0].webhook_id
    assert await stored(store, job) is None  # delivered: the row went with the ack
    assert await store.read(lambda c: jobstore.list_errors(c, job)) == []


async def test_a_schedule_exhausted_across_a_restart_counts_every_attempt(
    vrx: WebhookReceiver,
    store: Store,
    outbox: Outbox,
    autojump_clock: trio.testing.MockClock,
) -> None:
    schedule = [1.0, 30.0]
    vrx.fail_next(10, 500)

    async def first_life(m: JobManager) -> str:
        job = await m.create_job("crawl", webhook=WebhookSpec(url=vrx.url()), source={})
        await wait_stored(store, job, 2)
        return job

    job = await run_manager(store, outbox, schedule, first_life)
    assert len(vrx.requests) == 2

    async def second_life(m: JobManager) -> list[jobstore.JobError]:
        with trio.fail_after(60):
            while not (errors := await m.job_errors(job)):
                await trio.sleep(0.1)
        return errors

    [error] = await run_manager(store, outbox, schedule, second_life)
    assert len(vrx.requests) == 3  # attempts 1 and 2, then the last one: 3, not 1..3 again
    assert error.code == "WEBHOOK_FAILED"
    assert error.error == (
        f"webhook event {job}:1 (crawl.started) was not delivered: gave up after 3 attempts;"
        " last: HTTP 500"
    )
    assert await stored(store, job) is None


async def test_a_stale_row_for_an_acked_event_is_ignored_and_cleared(
    vrx: WebhookReceiver,
    store: Store,
    outbox: Outbox,
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def life(m: JobManager) -> str:
        job = await m.create_job("crawl", webhook=WebhookSpec(url=vrx.url()), source={})
        with trio.fail_after(10):
            await vrx.wait_delivered(1, job)

        def stale(conn: Any) -> None:
            jobstore.save_retry(
                conn,
                jobstore.RetryState(
                    job_id=job, seq=1, attempts=4, next_ms=clock_ms() + 3_600_000,
                    last_status=500, last_error="HTTP 500", at_ms=clock_ms(),
                ),
            )  # fmt: skip

        await store.write(stale)  # about event 1, already delivered
        await m.finish(job, "completed")
        with trio.fail_after(10):
            await m.wait_drained(job)
        return job

    job = await run_manager(store, outbox, [60.0], life)
    assert vrx.seqs(job) == [1, 2]  # event 2 went out at once, as a first attempt
    assert await stored(store, job) is None
