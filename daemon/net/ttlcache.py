# A bounded cache whose entries expire a fixed time after they were stored, on a clock the caller
# passes in (tests drive it with plain numbers, the daemon with trio's or a monotonic clock). The
# SSRF guard keeps vetted addresses in one and the crawl fetcher its DNS answers: both trade a
# short, documented staleness for a lookup per request, and neither may grow without bound.
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TtlCache(Generic[K, V]):
    """Values for `ttl` seconds after `put`; at most `max_entries`, the least recently used go
    first."""

    def __init__(self, ttl: float, max_entries: int) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def get(self, key: K, now: float) -> V | None:
        found = self._entries.get(key)
        if found is None:
            return None
        if found[0] <= now:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return found[1]

    def put(self, key: K, value: V, now: float) -> None:
        self._entries[key] = (now + self.ttl, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
