from __future__ import annotations

from typing import Any

import trio

from daemon.tracker.service import Gate


async def test_gate_runs_only_while_open_and_cancels_on_close(autojump_clock: Any) -> None:
    gate = Gate()
    starts: list[float] = []
    ended: list[str] = []

    async def loop() -> None:
        starts.append(trio.current_time())
        try:
            await trio.sleep_forever()
        finally:
            ended.append("cancelled")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(gate.run, loop)
        await trio.sleep(5)
        assert starts == []  # closed: nothing runs
        gate.set(True)
        await trio.sleep(1)
        assert len(starts) == 1
        gate.set(False)
        await trio.sleep(1)
        assert ended == ["cancelled"]
        gate.set(False)  # no change
        gate.set(True)
        await trio.sleep(1)
        assert len(starts) == 2  # runs again after reopening
        nursery.cancel_scope.cancel()


async def test_a_loop_that_returns_waits_for_the_next_opening(autojump_clock: Any) -> None:
    gate = Gate()
    runs: list[int] = []

    async def once() -> None:
        runs.append(1)

    gate.set(True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(gate.run, once)
        await trio.sleep(10)
        assert runs == [1]  # no busy loop
        gate.set(False)
        gate.set(True)
        await trio.sleep(1)
        assert runs == [1, 1]
        nursery.cancel_scope.cancel()
