# The asyncio loop thread that hosts aiormq: a stock loop, results and errors handed back to trio,
# trio cancellation forwarded and waited for, and a clean close.
from __future__ import annotations

import asyncio
import threading

import pytest
import trio

from daemon.broker.asyncio_thread import LoopClosed, open_asyncio_thread


async def where() -> tuple[type[asyncio.AbstractEventLoop], str]:
    return type(asyncio.get_running_loop()), threading.current_thread().name


async def add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


async def fail(message: str) -> None:
    raise KeyError(message)


async def test_calls_run_on_a_stock_loop_in_its_own_thread() -> None:
    async with open_asyncio_thread("test-loop") as thread:
        loop_type, name = await thread.run(where)
        assert await thread.run(add, 2, 3) == 5
        calls = [thread.submit(add, i, i) for i in range(50)]
        assert [await call.outcome() for call in calls] == [2 * i for i in range(50)]
        with pytest.raises(KeyError, match="boom"):
            await thread.run(fail, "boom")
    assert loop_type is asyncio.SelectorEventLoop
    assert name == "test-loop" and name != threading.current_thread().name
    assert thread.closed
    with pytest.raises(LoopClosed):
        thread.submit(add, 1, 1)


async def test_a_trio_cancel_cancels_the_task_and_waits_until_it_ended() -> None:
    token = trio.lowlevel.current_trio_token()
    started = trio.Event()
    ended = threading.Event()

    async def forever() -> None:
        token.run_sync_soon(started.set)
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0.01)  # cleanup that itself awaits
            ended.set()

    async with open_asyncio_thread() as thread, trio.open_nursery() as nursery:
        scope = trio.CancelScope()

        async def waiter() -> None:
            with scope:
                await thread.run(forever)

        nursery.start_soon(waiter)
        await started.wait()
        scope.cancel()
    assert scope.cancelled_caught
    assert ended.is_set()  # the asyncio side finished its cleanup before trio moved on


async def test_a_call_cancelled_from_trio_raises_cancelled_error() -> None:
    async with open_asyncio_thread() as thread:
        call = thread.submit(asyncio.sleep, 30)
        call.cancel()  # before or after it started: either way it ends cancelled
        with pytest.raises(asyncio.CancelledError):
            await call.outcome()
        assert call.done
        call.cancel()  # cancelling a finished call changes nothing


async def test_closing_cancels_what_still_runs() -> None:
    token = trio.lowlevel.current_trio_token()
    started = trio.Event()
    cancelled = threading.Event()

    async def lingering() -> None:
        token.run_sync_soon(started.set)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with open_asyncio_thread() as thread:
        call = thread.submit(lingering)
        await started.wait()
    assert cancelled.is_set()
    with pytest.raises(asyncio.CancelledError):
        await call.outcome()
