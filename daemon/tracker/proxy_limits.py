# One proxy's Bilibili limits as pure state: a GCRA TAT per window, keyed by what the window is.
#
# Every request through a proxy must conform to all of its `limits`; a bulk request also to its
# `bulk_limits`. The check reserves every window or none (`reserve_all`), so a denial by one
# window never spends another (the reference's limiter leaks tokens that way). Time is passed in
# as epoch ms, so the rules are tested with tables; the delegate supplies its clock. TATs are
# exact integers (`ratelimit.Window` units) and stored as epoch ms rounded up.
#
# The key of a window names its scope and size ("all:20/1000ms"), so a SIGHUP that keeps a
# window keeps its state and one that changes it starts that window conservatively. Unknown
# history (first start, a crash, a new window) is assumed to be a full burst spent just now,
# the worst case after any conforming request: limits are never exceeded across a restart.
from __future__ import annotations

from typing import Any

from daemon.net.ratelimit import (
    Window,
    conforming_within,
    conservative_tat,
    earliest_conforming,
    reserve_all,
)
from daemon.tracker.config import Limit


def window_key(scope: str, limit: Limit) -> str:
    return f"{scope}:{limit.requests}/{round(limit.per * 1000)}ms"


def _windows(scope: str, limits: list[Limit]) -> list[tuple[str, Window]]:
    return [(window_key(scope, lim), Window(lim.requests, round(lim.per * 1000))) for lim in limits]


class ProxyLimiter:
    """The GCRA windows of one proxy; `now` is epoch ms on the delegate's clock. A window with
    no known history starts conservatively (its burst spent at `now`)."""

    def __init__(
        self, limits: list[Limit], bulk_limits: list[Limit], now: int, margin_ms: int = 0
    ) -> None:
        self.margin_ms = margin_ms
        """Slack kept in every window against transit jitter (see `ratelimit.window_gcra`)."""
        self.common = _windows("all", limits)
        self.bulk = _windows("bulk", bulk_limits)
        self.windows = dict(self.common + self.bulk)
        self.tats: dict[str, int] = {
            key: conservative_tat(now, window) for key, window in self.windows.items()
        }

    def applicable(self, bulk: bool) -> list[tuple[str, Window]]:
        """(key, window) a request must conform to."""
        return self.common + self.bulk if bulk else self.common

    def try_acquire(self, now: int, *, bulk: bool) -> bool:
        """Reserve one request at `now` in every applicable window, or nothing and False."""
        windows = self.applicable(bulk)
        reserved = reserve_all(
            [self.tats[key] for key, _ in windows], now, [w for _, w in windows], self.margin_ms
        )
        if reserved is None:
            return False
        for (key, _), tat in zip(windows, reserved, strict=True):
            self.tats[key] = tat
        return True

    def available_at(self, now: int, *, bulk: bool) -> int:
        """The first ms >= now when a request would be allowed."""
        windows = self.applicable(bulk)
        return earliest_conforming(
            [self.tats[key] for key, _ in windows], now, [w for _, w in windows], self.margin_ms
        )

    def room(self, now: int, horizon_ms: int, *, bulk: bool, limit: int) -> int:
        """How many requests (at most `limit`) conform before `now + horizon_ms`."""
        windows = self.applicable(bulk)
        return conforming_within(
            [self.tats[key] for key, _ in windows],
            now,
            [w for _, w in windows],
            horizon_ms,
            limit,
            self.margin_ms,
        )

    def exhaust(self, now: int) -> None:
        """Treat every window as fully spent now (upstream said we went too fast)."""
        for key, window in self.windows.items():
            self.tats[key] = max(self.tats[key], conservative_tat(now, window))

    def restore(self, tats_ms: dict[str, int]) -> None:
        """Take stored TATs (epoch ms) for the windows that still exist; others keep theirs."""
        for key, window in self.windows.items():
            if key in tats_ms:
                self.tats[key] = window.scaled(tats_ms[key])

    def take_over(self, other: ProxyLimiter) -> None:
        """Keep the exact state of every window `other` has too (SIGHUP)."""
        for key in self.tats:
            if key in other.tats:
                self.tats[key] = other.tats[key]

    def tats_ms(self) -> dict[str, int]:
        """Each window's TAT as epoch ms, rounded up (what is stored)."""
        return {key: self.windows[key].to_ms(tat) for key, tat in self.tats.items()}

    def fill(self, now: int) -> list[dict[str, Any]]:
        """Each window's share of its burst in use right now (0: idle, 1: limited)."""
        out = []
        for key, window in self.windows.items():
            used = max(0, self.tats[key] - window.scaled(now)) / window.per_ms
            out.append(
                {
                    "window": key,
                    "requests": window.requests,
                    "per_ms": window.per_ms,
                    "fill": round(min(1.0, used / window.requests), 4),
                }
            )
        return out
