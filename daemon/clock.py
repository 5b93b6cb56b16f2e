# Time is data: rules take instants as integer epoch milliseconds and the tasks around them get
# "now" from a clock function passed in. Production uses the wall clock; tests under trio's
# autojump_clock use `trio_epoch_clock`, whose epoch milliseconds advance with trio's virtual
# time, so a day of schedules runs in a fraction of a second without a real sleep.
from __future__ import annotations

import time
from collections.abc import Callable

import trio

EpochClock = Callable[[], int]
"""A function returning the current instant in epoch milliseconds (UTC)."""


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def trio_epoch_clock(start_ms: int) -> EpochClock:
    """Epoch ms that start at `start_ms` now and follow trio's clock (call inside trio.run)."""
    base = trio.current_time()
    return lambda: start_ms + int((trio.current_time() - base) * 1000)


async def sleep_until_ms(clock: EpochClock, at_ms: int) -> None:
    """Sleep until `clock()` reaches `at_ms` (returns at once, after a checkpoint, if it has)."""
    delay = (at_ms - clock()) / 1000
    if delay > 0:
        await trio.sleep(delay)
    else:
        await trio.lowlevel.checkpoint()
