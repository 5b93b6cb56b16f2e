# The overview's last hour of the queue, kept by the server so the chart covers the hour whether
# or not a page was open. The source is the queue's outbox stream (daemon/outbox.py): `last_seq`
# counts every row the collector published into the queue and the ack cursor every row that left
# it (confirmed by RabbitMQ, or consumed from the embedded queue), both only ever growing, and
# their difference is the depth. A sampler reads that one row every few seconds; this ring turns
# the readings into per-minute counts. Pure: times are passed in, tested with plain values.
from __future__ import annotations

from dataclasses import dataclass, field

MINUTE_MS = 60_000
MINUTES = 60


@dataclass
class Minute:
    published: int = 0
    delivered: int = 0
    depth: int = 0


@dataclass
class QueueHistory:
    """Per-minute rows published into and delivered from the queue, and its depth at the last
    reading of each minute, for the last `minutes` minutes."""

    minutes: int = MINUTES
    _by_minute: dict[int, Minute] = field(default_factory=dict)
    _last: tuple[int, int] | None = None

    def observe(self, at_ms: int, last_seq: int, cursor: int) -> None:
        """A reading of the stream; growth since the previous one counts in `at_ms`'s minute. A
        stream that went back (dropped and made again) starts over from this reading."""
        before = self._last
        if before is None or last_seq < before[0] or cursor < before[1]:
            before = (last_seq, cursor)
        self._last = (last_seq, cursor)
        minute = at_ms // MINUTE_MS
        row = self._by_minute.setdefault(minute, Minute())
        row.published += last_seq - before[0]
        row.delivered += cursor - before[1]
        row.depth = max(0, last_seq - cursor)
        for old in [m for m in self._by_minute if m <= minute - self.minutes]:
            del self._by_minute[old]

    def series(self, now_ms: int) -> list[dict[str, int | None]]:
        """One entry per minute of the last `minutes`, oldest first; a minute without a reading
        has None counts."""
        last = now_ms // MINUTE_MS
        out: list[dict[str, int | None]] = []
        for minute in range(last - self.minutes + 1, last + 1):
            row = self._by_minute.get(minute)
            out.append({
                "minute_ms": minute * MINUTE_MS,
                "published": None if row is None else row.published,
                "delivered": None if row is None else row.delivered,
                "depth": None if row is None else row.depth,
            })  # fmt: skip
        return out
