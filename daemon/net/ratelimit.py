# Client-side rate limits for upstreams that answer 429 beyond a fixed rate (Octoparse: 20 req/s
# per IP, shared by every task of an account).
#
# GCRA keeps one number per limit, the theoretical arrival time (TAT), so the rule is a pure
# function over (tat, now, rate, burst), tested with tables of values. The trio limiter only
# reserves the next slot and sleeps until it: callers are served in arrival order, and a caller
# cancelled while waiting merely leaves its slot unused (the rate can only be undershot).
from __future__ import annotations

from collections.abc import Callable

import msgspec
import trio

_EPSILON = 1e-9
"""Waits shorter than this are float rounding in the TAT sum, not a real limit."""


class Slot(msgspec.Struct, frozen=True):
    tat: float
    """The limit's new theoretical arrival time, to store for the next call."""
    wait: float
    """Seconds from `now` until the reserved request may go (0: at once)."""


def gcra(tat: float, now: float, rate: float, burst: int = 1) -> Slot:
    """Reserve the next request slot under `rate` requests/s allowing `burst` at once."""
    if rate <= 0:
        raise ValueError("rate must be positive")
    if burst < 1:
        raise ValueError("burst must be at least 1")
    interval = 1.0 / rate
    start = max(tat, now)
    allowed_at = start - (burst - 1) * interval
    wait = allowed_at - now
    return Slot(tat=start + interval, wait=wait if wait > _EPSILON else 0.0)


def conforms(tat: float, now: float, rate: float, burst: int = 1) -> bool:
    """Whether a request at `now` is within the limit, without reserving anything."""
    return gcra(tat, now, rate, burst).wait == 0.0


class RateLimiter:
    """One limit shared by several trio tasks: `await limiter.acquire()` before each request."""

    def __init__(
        self,
        rate: float = 20.0,
        burst: int = 1,
        *,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        gcra(0.0, 0.0, rate, burst)
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tat = float("-inf")

    async def acquire(self) -> None:
        slot = gcra(self._tat, self._clock(), self.rate, self.burst)
        self._tat = slot.tat
        if slot.wait > 0:
            await trio.sleep(slot.wait)
        else:
            await trio.lowlevel.checkpoint()
