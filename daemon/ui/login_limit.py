# How often one client address may send a wrong key to the console login. API keys are long
# random strings, so this is not what keeps them safe; it keeps a login form from being a free
# oracle at the edge's full request rate, and makes a guessing client visible in
# crawld_http_refused_total{reason="login_rate"}. GCRA (daemon/net/ratelimit.py) keeps one
# number per address; only wrong keys spend it, and an address over its limit is refused before
# its key is even compared, so a 429 tells it nothing about the key. Pure: the clock is passed in.
from __future__ import annotations

import math
from collections.abc import Callable

from daemon.net.ratelimit import gcra

BURST = 5
"""Wrong keys an address may send back to back."""
RATE = 1 / 12
"""Then one wrong key per 12 seconds (5 a minute)."""
MAX_ADDRESSES = 10_000
"""Addresses remembered at once; the oldest goes first (a spent limit costs ~100 bytes)."""


class LoginLimits:
    """Wrong-key limits by client address over `clock` (seconds)."""

    def __init__(
        self,
        clock: Callable[[], float],
        *,
        rate: float = RATE,
        burst: int = BURST,
        max_addresses: int = MAX_ADDRESSES,
    ) -> None:
        gcra(0.0, 0.0, rate, burst)
        self.clock = clock
        self.rate = rate
        self.burst = burst
        self.max_addresses = max_addresses
        self._tat: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self._tat)

    def retry_after(self, address: str) -> int:
        """Whole seconds until `address` may try a key again (0: now)."""
        tat = self._tat.get(address)
        if tat is None:
            return 0
        wait = gcra(tat, self.clock(), self.rate, self.burst).wait
        return math.ceil(wait) if wait > 0 else 0

    def wrong_key(self, address: str) -> None:
        """Spend one of `address`'s attempts."""
        now = self.clock()
        tat = self._tat.pop(address, now)
        self._tat[address] = gcra(tat, now, self.rate, self.burst).tat
        if len(self._tat) > self.max_addresses:
            for stale in [a for a, t in self._tat.items() if t <= now]:
                del self._tat[stale]
        while len(self._tat) > self.max_addresses:
            del self._tat[next(iter(self._tat))]  # dicts keep insertion order
