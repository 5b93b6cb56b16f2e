from __future__ import annotations

import pytest
import trio
import trio.testing

from daemon.net.ratelimit import RateLimiter, Slot, conforms, gcra


@pytest.mark.parametrize(
    ("tat", "now", "rate", "burst", "expected"),
    [
        (0.0, 0.0, 10, 1, Slot(tat=0.1, wait=0.0)),
        (0.1, 0.0, 10, 1, Slot(tat=0.2, wait=0.1)),
        (0.1, 0.1, 10, 1, Slot(tat=0.2, wait=0.0)),
        (0.1, 5.0, 10, 1, Slot(tat=5.1, wait=0.0)),
        (0.1, 0.0, 10, 2, Slot(tat=0.2, wait=0.0)),
        (0.2, 0.0, 10, 2, Slot(tat=0.3, wait=0.1)),
        (float("-inf"), 3.0, 20, 1, Slot(tat=3.05, wait=0.0)),
    ],
)
def test_gcra_table(tat: float, now: float, rate: float, burst: int, expected: Slot) -> None:
    slot = gcra(tat, now, rate, burst)
    assert slot.tat == pytest.approx(expected.tat)
    assert slot.wait == pytest.approx(expected.wait)


@pytest.mark.parametrize("burst", [1, 3, 20])
def test_burst_requests_go_at_once_then_one_per_interval(burst: int) -> None:
    tat, waits = 0.0, []
    for _ in range(burst + 3):
        slot = gcra(tat, 0.0, 20, burst)
        tat = slot.tat
        waits.append(slot.wait)
    assert waits[:burst] == [0.0] * burst
    assert waits[burst:] == pytest.approx([0.05, 0.10, 0.15])


def test_never_more_than_rate_times_span_plus_burst() -> None:
    tat, now, sent = 0.0, 0.0, []
    for _ in range(200):
        slot = gcra(tat, now, 20, 4)
        tat = slot.tat
        now += slot.wait
        sent.append(now)
        now += 0.003
    for i, start in enumerate(sent):
        in_window = sum(1 for t in sent[i:] if t < start + 1.0)
        assert in_window <= 20 + 4


def test_conforms_does_not_reserve() -> None:
    assert conforms(0.0, 0.0, 10)
    assert not conforms(0.1, 0.0, 10)
    assert conforms(0.2, 0.0, 10, burst=3)


@pytest.mark.parametrize(("rate", "burst"), [(0, 1), (-1, 1), (10, 0)])
def test_bad_parameters(rate: float, burst: int) -> None:
    with pytest.raises(ValueError):
        gcra(0.0, 0.0, rate, burst)
    with pytest.raises(ValueError):
        RateLimiter(rate, burst)


async def test_limiter_spaces_requests_of_several_tasks(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limiter = RateLimiter(rate=20)
    times: list[float] = []
    start = trio.current_time()

    async def worker() -> None:
        for _ in range(10):
            await limiter.acquire()
            times.append(trio.current_time() - start)

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(worker)
    assert len(times) == 40
    assert sorted(times) == pytest.approx([i * 0.05 for i in range(40)], abs=1e-9)


async def test_limiter_lets_a_burst_through_without_waiting(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limiter = RateLimiter(rate=10, burst=5)
    start = trio.current_time()
    for _ in range(5):
        await limiter.acquire()
    assert trio.current_time() == start
    await limiter.acquire()
    assert trio.current_time() - start == pytest.approx(0.1)


async def test_idle_time_is_not_banked_beyond_the_burst(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limiter = RateLimiter(rate=10, burst=2)
    await trio.sleep(60)
    start = trio.current_time()
    for _ in range(4):
        await limiter.acquire()
    assert trio.current_time() - start == pytest.approx(0.2)


async def test_cancelled_waiter_only_wastes_its_slot(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limiter = RateLimiter(rate=10)
    await limiter.acquire()
    with trio.move_on_after(0.01):
        await limiter.acquire()
    start = trio.current_time()
    await limiter.acquire()
    assert trio.current_time() - start == pytest.approx(0.19)
