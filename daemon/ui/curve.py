# The view curve the console draws: a time range, and the snapshots in it thinned on the server
# to at most MAX_POINTS (the lowest and highest view count of each time bucket, in time order),
# so a video with 100,000 snapshots sends a page ~1000 points whatever the range. Pure functions
# over rows, tested with plain values; the route reads the rows through the tracker's own query.
from __future__ import annotations

from collections.abc import Sequence

HOUR_MS = 3600 * 1000
RANGES: dict[str, int | None] = {
    "6h": 6 * HOUR_MS,
    "24h": 24 * HOUR_MS,
    "7d": 7 * 24 * HOUR_MS,
    "30d": 30 * 24 * HOUR_MS,
    "all": None,
}
MAX_POINTS = 1000
MAX_MILESTONE_LINES = 12

Row = tuple[int, ...]
"""(at_ms, views, …) as `daemon.tracker.store.snapshots` returns it, oldest first."""


def window(range_name: str, now_ms: int) -> tuple[int, int]:
    """[since, until] in epoch ms of a range name (KeyError for an unknown one)."""
    span = RANGES[range_name]
    return (0 if span is None else max(0, now_ms - span)), now_ms


def decimate(rows: Sequence[Row], max_points: int = MAX_POINTS, value: int = 1) -> list[Row]:
    """`rows` (oldest first) thinned to at most `max_points`: the time span is cut into
    max_points // 2 equal buckets and each keeps its rows with the lowest and the highest
    `row[value]`, in time order, so peaks and dips survive. Fewer rows come back unchanged."""
    if max_points < 2:
        raise ValueError("max_points must be at least 2")
    if len(rows) <= max_points:
        return list(rows)
    buckets = max_points // 2
    first, last = rows[0][0], rows[-1][0]
    width = (last - first) / buckets or 1.0
    kept: list[Row] = []
    current = -1
    low: Row | None = None
    high: Row | None = None

    def flush() -> None:
        if low is None or high is None:
            return
        if low is high:
            kept.append(low)
        else:
            kept.extend(sorted((low, high), key=lambda r: r[0]))

    for row in rows:
        bucket = min(buckets - 1, int((row[0] - first) / width))
        if bucket != current:
            flush()
            current, low, high = bucket, row, row
            continue
        assert low is not None and high is not None
        if row[value] < low[value]:
            low = row
        if row[value] > high[value]:
            high = row
    flush()
    return kept


def milestone_lines(low: int, high: int) -> list[int]:
    """The view milestones (100k, 1M, then every million) from `low` up to the first one above
    `high`: the lines a chart of that value range shows, at most MAX_MILESTONE_LINES (the
    highest ones)."""
    found: list[int] = []
    target = 100_000
    while True:
        if target >= low:
            found.append(target)
        if target > high:
            break
        target = 1_000_000 if target < 1_000_000 else target + 1_000_000
    return found[-MAX_MILESTONE_LINES:]
