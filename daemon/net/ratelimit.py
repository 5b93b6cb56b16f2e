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


def gcra(tat: float, now: float, rate: float, burst: int = 1, cost: float = 1) -> Slot:
    """Reserve the next request slot under `rate` requests/s allowing `burst` at once; a request
    of `cost` units (tokens of a token budget) takes that many slots at once (at most `burst`)."""
    if rate <= 0:
        raise ValueError("rate must be positive")
    if burst < 1:
        raise ValueError("burst must be at least 1")
    if cost <= 0:
        raise ValueError("cost must be positive")
    interval = 1.0 / rate
    start = max(tat, now)
    allowed_at = start - (burst - min(cost, burst)) * interval
    wait = allowed_at - now
    return Slot(tat=start + cost * interval, wait=wait if wait > _EPSILON else 0.0)


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

    async def acquire(self, cost: float = 1) -> None:
        """Wait for the next slot (`cost` units of it)."""
        slot = gcra(self._tat, self._clock(), self.rate, self.burst, cost)
        self._tat = slot.tat
        if slot.wait > 0:
            await trio.sleep(slot.wait)
        else:
            await trio.lowlevel.checkpoint()

    def charge(self, cost: float) -> None:
        """Spend `cost` units now without waiting (what a request turned out to cost beyond
        what it reserved): later callers wait for it."""
        if cost > 0:
            self._tat = max(self._tat, self._clock()) + cost / self.rate


# ---- exact windows ----------------------------------------------------------------------------
#
# "N requests per T" as a GCRA limit with rate N/T and burst N (the go-redis/redis_rate reading the
# Bilibili reference uses). Floats at epoch-millisecond magnitudes round at each TAT step, and a
# peer enforcing the same limit (the simulator) must reach the same decisions, so these keep the
# TAT as an integer in units of 1/N ms: every step is exact.


class Window(msgspec.Struct, frozen=True):
    requests: int
    per_ms: int

    def __post_init__(self) -> None:
        if self.requests < 1 or self.per_ms < 1:
            raise ValueError("a window needs requests >= 1 and per_ms >= 1")

    def scaled(self, ms: int) -> int:
        """An instant in this window's TAT units."""
        return ms * self.requests

    def to_ms(self, tat: int) -> int:
        """A TAT as epoch ms, rounded up (a stored limit is never looser)."""
        return -(-tat // self.requests)


def _slack(window: Window, margin_ms: int) -> int:
    """`margin_ms` in TAT units, at most the burst less one request (a burst of 1 has none)."""
    return min(margin_ms * window.requests, (window.requests - 1) * window.per_ms)


def window_gcra(tat: int, now_ms: int, window: Window, margin_ms: int = 0) -> int | None:
    """The window's new TAT if a request at `now_ms` conforms, else None.

    With `margin_ms`, the request must also conform had it arrived that much later than an
    earlier one: a peer enforcing the same window sees requests after a variable transit delay,
    which can bring two of them closer together than they were sent."""
    now = window.scaled(now_ms)
    start = max(tat, now)
    if start - (window.requests - 1) * window.per_ms + _slack(window, margin_ms) > now:
        return None
    return start + window.per_ms


def reserve_all(
    tats: list[int], now_ms: int, windows: list[Window], margin_ms: int = 0
) -> list[int] | None:
    """The new TATs if a request at `now_ms` conforms to every window, else None (nothing is
    reserved: unlike a window-by-window check, a later denial never spends an earlier window)."""
    if len(tats) != len(windows):
        raise ValueError("one TAT per window")
    reserved = []
    for tat, window in zip(tats, windows, strict=True):
        new = window_gcra(tat, now_ms, window, margin_ms)
        if new is None:
            return None
        reserved.append(new)
    return reserved


def earliest_conforming(
    tats: list[int], now_ms: int, windows: list[Window], margin_ms: int = 0
) -> int:
    """The first ms >= `now_ms` at which a request conforms to every window."""
    at = now_ms
    for tat, window in zip(tats, windows, strict=True):
        allowed = (
            max(tat, window.scaled(now_ms))
            - (window.requests - 1) * window.per_ms
            + _slack(window, margin_ms)
        )
        at = max(at, window.to_ms(allowed))
    return at


def conservative_tat(now_ms: int, window: Window) -> int:
    """A TAT assuming the whole burst was just spent: after any conforming request the TAT is at
    most now + per, so this is safe whatever happened before `now_ms`."""
    return window.scaled(now_ms + window.per_ms)


def conforming_within(
    tats: list[int],
    now_ms: int,
    windows: list[Window],
    horizon_ms: int,
    limit: int,
    margin_ms: int = 0,
) -> int:
    """How many requests conform to every window before `now_ms + horizon_ms`, each made at its
    earliest conforming instant from `now_ms` on (at most `limit`): what can be done within the
    next `horizon_ms` without waiting past it. Nothing is reserved."""
    count, at, end = 0, now_ms, now_ms + horizon_ms
    tats = list(tats)
    while count < limit:
        at = earliest_conforming(tats, at, windows, margin_ms)
        if at >= end:
            break
        reserved = reserve_all(tats, at, windows, margin_ms)
        if reserved is None:  # earliest_conforming rounds up to whole ms: never expected
            at += 1
            continue
        tats = reserved
        count += 1
    return count
