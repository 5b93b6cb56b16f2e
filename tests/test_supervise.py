from __future__ import annotations

import random

import pytest
import trio

from daemon.supervise import (
    ComponentState,
    GaveUp,
    failures_in_window,
    restart_delay,
    supervise,
)


@pytest.mark.parametrize(
    ("failures", "lo", "hi"),
    [(1, 0.25, 0.5), (2, 0.5, 1.0), (3, 1.0, 2.0), (10, 15.0, 30.0), (50, 15.0, 30.0)],
)
def test_restart_delay_is_jittered_and_capped(failures: int, lo: float, hi: float) -> None:
    rng = random.Random(7)
    for _ in range(100):
        assert lo <= restart_delay(failures, 0.5, 30.0, rng) <= hi


def test_failures_in_window() -> None:
    assert failures_in_window([0.0, 50.0, 100.0], now=120.0, window=60.0) == [100.0]


async def test_restarts_failed_component_without_touching_siblings(autojump_clock: object) -> None:
    runs = 0
    sibling_ticks = 0

    async def flaky(*, task_status: trio.TaskStatus[str]) -> None:
        nonlocal runs
        runs += 1
        task_status.started("up")
        if runs < 3:
            raise RuntimeError(f"boom {runs}")
        await trio.sleep_forever()

    async def sibling() -> None:
        nonlocal sibling_ticks
        while True:
            await trio.sleep(1)
            sibling_ticks += 1

    state = ComponentState("flaky")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sibling)
        value = await nursery.start(
            lambda task_status: supervise(
                state, flaky, max_restarts=5, window=60, task_status=task_status
            )
        )
        assert value == "up"
        await trio.sleep(30)
        assert runs == 3
        assert state.restarts == 2
        assert state.state == "running"
        assert state.last_error == "RuntimeError: boom 2"
        assert sibling_ticks >= 29
        nursery.cancel_scope.cancel()


async def test_gives_up_after_too_many_failures_in_window(autojump_clock: object) -> None:
    async def broken(*, task_status: trio.TaskStatus[None]) -> None:
        raise OSError("disk gone")

    state = ComponentState("broken")
    with pytest.raises(GaveUp, match="broken failed 3 times"):
        await supervise(state, broken, max_restarts=3, window=600)
    assert state.state == "failed"
    assert state.restarts == 2


async def test_failures_outside_window_are_forgotten(autojump_clock: object) -> None:
    runs = 0

    async def slow_flaky(*, task_status: trio.TaskStatus[None]) -> None:
        nonlocal runs
        runs += 1
        task_status.started()
        if runs <= 6:
            await trio.sleep(100)  # healthy for a while, then fails
            raise RuntimeError("occasional")
        await trio.sleep_forever()

    state = ComponentState("occasional")
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: supervise(
                state, slow_flaky, max_restarts=3, window=60, task_status=task_status
            )
        )
        await trio.sleep(2000)
        assert runs == 7 and state.state == "running"
        nursery.cancel_scope.cancel()


async def test_cancellation_is_not_a_failure(autojump_clock: object) -> None:
    async def forever(*, task_status: trio.TaskStatus[None]) -> None:
        task_status.started()
        await trio.sleep_forever()

    state = ComponentState("forever")
    with trio.move_on_after(5):
        await supervise(state, forever, max_restarts=1, window=60)
    assert state.restarts == 0 and state.last_error is None
