# Per-host concurrency and politeness delay, shared by every job of the process (the Fetcher
# takes a slot for each hop). Its own room because it is pure trio scheduling: no connection, a
# clock on trio's timeline, so tests drive it under autojump_clock.
from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import trio

_GATE_PRUNE_AT = 1024
_GATE_PRUNE_EVERY = 60.0


class _HostState:
    __slots__ = ("active", "lot", "next_start", "users")

    def __init__(self) -> None:
        self.active = 0
        self.users = 0
        self.next_start = -math.inf
        self.lot = trio.lowlevel.ParkingLot()


class HostGate:
    """Per-host concurrency and politeness delay, shared by every job of the process.

    `slot(host)` admits at most `per_host` holders at once (fewer if the caller asks for a
    lower `concurrency`), and with `delay` starts holders at least `delay` seconds apart.
    `clock` returns seconds on trio's timeline (trio.current_time by default, so tests run it
    under autojump_clock)."""

    def __init__(self, per_host: int, clock: Callable[[], float] = trio.current_time) -> None:
        if per_host < 1:
            raise ValueError("per_host must be at least 1")
        self.per_host = per_host
        self._clock = clock
        self._hosts: dict[str, _HostState] = {}
        self._prune_at = _GATE_PRUNE_AT
        self._next_prune = -math.inf

    def active(self, host: str) -> int:
        state = self._hosts.get(host)
        return state.active if state else 0

    @asynccontextmanager
    async def slot(
        self, host: str, *, concurrency: int | None = None, delay: float | None = None
    ) -> AsyncIterator[None]:
        limit = min(self.per_host, concurrency or self.per_host)
        state = self._hosts.get(host)
        if state is None:
            state = self._hosts[host] = _HostState()
        state.users += 1
        try:
            while state.active >= limit:
                await state.lot.park()
            state.active += 1
            try:
                if delay:
                    start = max(self._clock(), state.next_start)
                    state.next_start = start + delay
                    wait = start - self._clock()
                    if wait > 0:
                        await trio.sleep(wait)
                yield
            finally:
                state.active -= 1
                state.lot.unpark_all()
        finally:
            state.users -= 1
            now = self._clock()
            if state.users == 0 and state.next_start <= now:
                del self._hosts[host]
            kept = len(self._hosts)
            if kept > self._prune_at or (kept > _GATE_PRUNE_AT and now >= self._next_prune):
                self._prune(now)

    def _prune(self, now: float) -> None:
        """Forget idle hosts whose politeness delay has passed (a broad crawl with a delay
        would otherwise keep one entry per host ever visited)."""
        for name in [n for n, s in self._hosts.items() if s.users == 0 and s.next_start <= now]:
            del self._hosts[name]
        self._prune_at = max(_GATE_PRUNE_AT, 2 * len(self._hosts))
        self._next_prune = now + _GATE_PRUNE_EVERY

    def __len__(self) -> int:
        """Hosts the gate currently keeps state for."""
        return len(self._hosts)
