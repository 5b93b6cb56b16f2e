# Which rows of an Octoparse task to request next, as pure functions over one persisted value.
#
# The seed pages backwards from the newest rows so a run publishes fresh data first. Made safe:
# - A run snapshots `total` once (T0) and covers [low, T0), low = the previous run's T0 (the
#   high-water mark). Rows appended during a run belong to the next run; nothing is re-read at the
#   boundary (the seed re-published one batch per run).
# - Windows are [max(low, hi - size), hi) for hi = T0, T0 - size, ..., so the last one is clamped
#   at low and never reaches below 0 (upstream reads offset <= 0 as "from the start").
# - Only the rows actually returned count. A short page (payload cap, rows removed upstream) leaves
#   a `Partial`: the next request reads the remainder of that window before going lower. An empty
#   page where rows should be ends the run ("empty") instead of looping.
# - Progress is persisted after each window; a crashed or stopped run resumes its unfinished part
#   before a new run starts (the seed skipped that part forever).
# - First run (and after a reset): low = 0, but stop after `max_expired_batches` consecutive pages
#   whose rows are all outside the filter window.
# - `total` below the high-water mark means the task was cleared or deduplicated upstream: reset
#   and rescan; message ids make the repeats harmless.
#
# Offsets may be server cursors rather than row indexes on some accounts, so `paging = "forward"`
# walks the documented way: start at the saved cursor, feed each returned `offset` back, stop at
# restTotal == 0, an empty page or a non-advancing offset.
#
# Interface (both strategies; the crawler persists the `Progress` value after each window):
#   run = start_run(saved, total, paging)     # RunStart(progress, resumed, reset)
#   while (window := next_window(progress, size)) is not None:
#       page = fetch(window.offset, window.size)
#       progress = after_window(progress, window, WindowResult(...), max_expired_batches=3)
#   progress.end says why the run ended; stopping between windows simply leaves `end` None.
# A finished backward Progress is the high-water mark (its t0); a forward one holds the cursor.
from __future__ import annotations

from typing import Literal

import msgspec

Paging = Literal["backward", "forward"]

EndReason = Literal["done", "expired", "empty", "stuck"]
"""done: range read (or restTotal 0 / empty page going forward) · expired: first-run stop on
consecutive all-expired pages · empty: no rows where the range says there are some (backward) ·
stuck: the returned offset did not advance (forward)."""


class Window(msgspec.Struct, frozen=True):
    """One request: `GET /data/all?offset=<offset>&size=<size>`."""

    offset: int
    size: int


class WindowResult(msgspec.Struct, frozen=True, kw_only=True):
    """What a page said, plus the date filter's verdict on it."""

    rows: int
    """Rows the page returned (well-formed or not): the only measure of what was read."""
    next_offset: int = 0
    rest_total: int = 0
    all_expired: bool = False
    """Every row returned lies outside the filter window (only meaningful when rows > 0)."""


class Partial(msgspec.Struct, frozen=True):
    """The window [start, lowest_done) was answered short: [start, start + read) is done."""

    start: int
    read: int


class BackwardProgress(msgspec.Struct, frozen=True, kw_only=True, tag="backward"):
    low: int
    t0: int
    lowest_done: int
    """Every row in [lowest_done, t0) is done."""
    partial: Partial | None = None
    stop_when_expired: bool = False
    expired_streak: int = 0
    end: EndReason | None = None


class ForwardProgress(msgspec.Struct, frozen=True, kw_only=True, tag="forward"):
    start: int
    """The cursor this run began at."""
    cursor: int
    """Next offset to request; everything before it is done."""
    total: int
    """`total` when the run began, to detect a shrinking task next time."""
    end: EndReason | None = None


Progress = BackwardProgress | ForwardProgress


class RunStart(msgspec.Struct, frozen=True):
    progress: Progress
    resumed: bool
    """An unfinished run is being continued."""
    reset: bool
    """`total` fell below what earlier runs saw; everything in the filter window is rescanned."""


def start_run(saved: Progress | None, total: int, paging: Paging = "backward") -> RunStart:
    """The run to do now, given the last persisted progress and the current `total`."""
    total = max(total, 0)
    if paging == "forward":
        return _start_forward(saved, total)
    return _start_backward(saved, total)


def _start_backward(saved: Progress | None, total: int) -> RunStart:
    if saved is None:
        return RunStart(_backward(0, total, first=True), resumed=False, reset=False)
    done = high_water(saved) or 0
    seen = saved.total if isinstance(saved, ForwardProgress) else saved.t0
    if total < max(seen, done):
        return RunStart(_backward(0, total, first=True), resumed=False, reset=True)
    if isinstance(saved, BackwardProgress) and saved.end is None:
        return RunStart(saved, resumed=True, reset=False)
    return RunStart(_backward(done, total, first=False), resumed=False, reset=False)


def _backward(low: int, t0: int, *, first: bool) -> BackwardProgress:
    return BackwardProgress(
        low=low,
        t0=t0,
        lowest_done=t0,
        stop_when_expired=first,
        end="done" if t0 <= low else None,
    )


def _start_forward(saved: Progress | None, total: int) -> RunStart:
    if saved is None:
        return RunStart(ForwardProgress(start=0, cursor=0, total=total), resumed=False, reset=False)
    cursor = high_water(saved) or 0
    seen = saved.total if isinstance(saved, ForwardProgress) else saved.t0
    if total < seen:
        return RunStart(ForwardProgress(start=0, cursor=0, total=total), resumed=False, reset=True)
    if isinstance(saved, ForwardProgress) and saved.end is None:
        return RunStart(saved, resumed=True, reset=False)
    progress = ForwardProgress(start=cursor, cursor=cursor, total=total)
    return RunStart(progress, resumed=False, reset=False)


def next_window(progress: Progress, size: int) -> Window | None:
    """The next request of this run, or None when the run has ended."""
    if size < 1:
        raise ValueError("size must be at least 1")
    if progress.end is not None:
        return None
    if isinstance(progress, ForwardProgress):
        return Window(progress.cursor, size)
    if progress.partial is not None:
        start = progress.partial.start + progress.partial.read
        return Window(start, min(size, progress.lowest_done - start))
    low = max(progress.low, 0)
    if progress.lowest_done <= low:
        return None
    offset = max(low, progress.lowest_done - size)
    return Window(offset, progress.lowest_done - offset)


def after_window(
    progress: Progress,
    window: Window,
    result: WindowResult,
    *,
    max_expired_batches: int = 3,
) -> Progress:
    """Progress once the rows of `window` are safely handed on (in the outbox)."""
    if isinstance(progress, ForwardProgress):
        return _after_forward(progress, window, result)
    return _after_backward(progress, window, result, max_expired_batches)


def _after_backward(
    progress: BackwardProgress, window: Window, result: WindowResult, max_expired: int
) -> BackwardProgress:
    rows = min(max(result.rows, 0), window.size)
    if rows == 0:
        return msgspec.structs.replace(progress, end="empty")
    if progress.partial is not None:
        partial = Partial(progress.partial.start, progress.partial.read + rows)
    else:
        partial = Partial(window.offset, rows)
    lowest_done = progress.lowest_done
    if partial.start + partial.read >= lowest_done:
        lowest_done, partial_left = partial.start, None
    else:
        partial_left = partial
    streak = progress.expired_streak + 1 if result.all_expired else 0
    end: EndReason | None = None
    if lowest_done <= max(progress.low, 0) and partial_left is None:
        end = "done"
    elif progress.stop_when_expired and streak >= max_expired:
        end = "expired"
    return msgspec.structs.replace(
        progress, lowest_done=lowest_done, partial=partial_left, expired_streak=streak, end=end
    )


def _after_forward(
    progress: ForwardProgress, window: Window, result: WindowResult
) -> ForwardProgress:
    if result.rows <= 0:
        return msgspec.structs.replace(progress, end="done")
    if result.next_offset <= window.offset:
        return msgspec.structs.replace(progress, end="stuck")
    end: EndReason | None = "done" if result.rest_total <= 0 else None
    return msgspec.structs.replace(progress, cursor=result.next_offset, end=end)


def high_water(progress: Progress | None) -> int | None:
    """Rows known to be done for good: the next run starts above this (None before any run)."""
    if progress is None:
        return None
    if isinstance(progress, ForwardProgress):
        return progress.cursor
    return progress.t0 if progress.end is not None else progress.low


def remaining(progress: Progress) -> int | None:
    """Rows this run still has to read (None going forward, where only restTotal knows)."""
    if isinstance(progress, ForwardProgress):
        return None
    if progress.end is not None:
        return 0
    todo = progress.lowest_done - max(progress.low, 0)
    if progress.partial is not None:
        todo -= progress.partial.read
    return max(todo, 0)


_progress_decoder = msgspec.json.Decoder(Progress)


def encode_progress(progress: Progress) -> bytes:
    """JSON for the store (tagged with the strategy)."""
    return msgspec.json.encode(progress)


def decode_progress(data: bytes | str) -> Progress:
    return _progress_decoder.decode(data)
