from __future__ import annotations

import random

import pytest

from daemon.collector.paging import (
    BackwardProgress,
    ForwardProgress,
    Partial,
    Progress,
    Window,
    WindowResult,
    after_window,
    decode_progress,
    encode_progress,
    high_water,
    next_window,
    remaining,
    start_run,
)


def walk(
    progress: Progress,
    total: int,
    size: int,
    *,
    cap: int | None = None,
    expired_below: int = -1,
    max_expired_batches: int = 3,
) -> tuple[Progress, list[Window], list[int]]:
    """Run to the end against rows 0..total-1 (row index semantics); rows below
    `expired_below` are outside the filter window."""
    windows: list[Window] = []
    read: list[int] = []
    while (window := next_window(progress, size)) is not None:
        windows.append(window)
        start = max(window.offset, 0)
        take = min(window.size, cap) if cap else window.size
        rows = list(range(start, min(start + take, total)))
        read.extend(rows)
        result = WindowResult(
            rows=len(rows),
            next_offset=start + len(rows),
            rest_total=max(total - start - len(rows), 0),
            all_expired=bool(rows) and all(r < expired_below for r in rows),
        )
        progress = after_window(progress, window, result, max_expired_batches=max_expired_batches)
        assert len(windows) < 10_000, "paging does not terminate"
    return progress, windows, read


def test_first_run_walks_back_from_total_to_zero() -> None:
    run = start_run(None, 250)
    assert (run.resumed, run.reset) == (False, False)
    progress, windows, read = walk(run.progress, 250, 100)
    assert windows == [Window(150, 100), Window(50, 100), Window(0, 50)]
    assert sorted(read) == list(range(250))
    assert progress.end == "done"
    assert high_water(progress) == 250


@pytest.mark.parametrize(
    ("low", "total", "size", "expected"),
    [
        (250, 480, 100, [Window(380, 100), Window(280, 100), Window(250, 30)]),
        (250, 350, 100, [Window(250, 100)]),
        (250, 251, 100, [Window(250, 1)]),
        (250, 250, 100, []),
        (0, 30, 100, [Window(0, 30)]),
        (0, 0, 100, []),
        (0, 3, 1, [Window(2, 1), Window(1, 1), Window(0, 1)]),
    ],
)
def test_windows_cover_exactly_the_new_range(
    low: int, total: int, size: int, expected: list[Window]
) -> None:
    saved = BackwardProgress(low=0, t0=low, lowest_done=0, end="done") if low else None
    run = start_run(saved, total)
    progress, windows, read = walk(run.progress, total, size)
    assert windows == expected
    assert sorted(read) == list(range(low, total))
    assert progress.end == "done"
    assert high_water(progress) == total


def test_incremental_run_does_not_reread_the_previous_start_window() -> None:
    first, _, _ = walk(start_run(None, 270_000).progress, 270_000, 100, expired_below=269_700)
    assert first.end == "expired"
    second = start_run(first, 270_500).progress
    assert isinstance(second, BackwardProgress)
    assert (second.low, second.t0, second.stop_when_expired) == (270_000, 270_500, False)
    _, windows, read = walk(second, 270_500, 100)
    assert windows[0] == Window(270_400, 100)
    assert windows[-1] == Window(270_000, 100)
    assert sorted(read) == list(range(270_000, 270_500))


def test_short_page_reads_the_remainder_before_going_lower() -> None:
    progress = start_run(None, 250).progress
    window = next_window(progress, 100)
    assert window == Window(150, 100)
    progress = after_window(progress, window, WindowResult(rows=40))
    assert isinstance(progress, BackwardProgress)
    assert (progress.lowest_done, progress.partial) == (250, Partial(150, 40))
    assert remaining(progress) == 210
    window = next_window(progress, 100)
    assert window == Window(190, 60)
    progress = after_window(progress, window, WindowResult(rows=25))
    assert isinstance(progress, BackwardProgress)
    assert progress.partial == Partial(150, 65)
    window = next_window(progress, 100)
    assert window == Window(215, 35)
    progress = after_window(progress, window, WindowResult(rows=35))
    assert isinstance(progress, BackwardProgress)
    assert (progress.lowest_done, progress.partial, progress.end) == (150, None, None)
    assert next_window(progress, 100) == Window(50, 100)


@pytest.mark.parametrize("cap", [1, 7, 33, 99, 100, 1000])
def test_short_pages_never_skip_a_row(cap: int) -> None:
    progress, windows, read = walk(start_run(None, 1234).progress, 1234, 100, cap=cap)
    assert progress.end == "done"
    assert sorted(read) == list(range(1234))
    assert all(w.offset >= 0 and w.size >= 1 for w in windows)


def test_more_rows_than_asked_count_as_the_window() -> None:
    progress = start_run(None, 100).progress
    window = next_window(progress, 100)
    assert window is not None
    progress = after_window(progress, window, WindowResult(rows=500))
    assert progress.end == "done"


def test_empty_page_inside_the_range_ends_the_run() -> None:
    progress = start_run(None, 250).progress
    window = next_window(progress, 100)
    assert window is not None
    progress = after_window(progress, window, WindowResult(rows=0))
    assert progress.end == "empty"
    assert next_window(progress, 100) is None
    assert high_water(progress) == 250


def test_first_run_stops_after_consecutive_all_expired_windows() -> None:
    progress, windows, _ = walk(start_run(None, 1000).progress, 1000, 100, expired_below=600)
    assert progress.end == "expired"
    assert [w.offset for w in windows] == [900, 800, 700, 600, 500, 400, 300]
    assert high_water(progress) == 1000


def test_expired_streak_resets_on_a_window_with_recent_rows() -> None:
    progress = start_run(None, 1000).progress
    pattern = [True, True, False, True, True, True]
    for all_expired in pattern:
        window = next_window(progress, 100)
        assert window is not None
        progress = after_window(progress, window, WindowResult(rows=100, all_expired=all_expired))
    assert progress.end == "expired"
    assert isinstance(progress, BackwardProgress)
    assert progress.lowest_done == 400


@pytest.mark.parametrize("max_expired", [1, 2, 5])
def test_max_expired_batches_is_honoured(max_expired: int) -> None:
    progress, windows, _ = walk(
        start_run(None, 1000).progress,
        1000,
        100,
        expired_below=900,
        max_expired_batches=max_expired,
    )
    assert progress.end == "expired"
    assert len(windows) == 1 + max_expired


def test_incremental_run_reads_old_rows_to_its_low_end() -> None:
    saved = BackwardProgress(low=0, t0=500, lowest_done=0, end="done")
    progress, windows, _ = walk(start_run(saved, 1000).progress, 1000, 100, expired_below=10_000)
    assert progress.end == "done"
    assert len(windows) == 5


def test_stopped_run_resumes_its_unfinished_part_first() -> None:
    progress = start_run(None, 1000).progress
    for _ in range(3):
        window = next_window(progress, 100)
        assert window is not None
        progress = after_window(progress, window, WindowResult(rows=100))
    saved = decode_progress(encode_progress(progress))
    assert saved == progress
    run = start_run(saved, 1500)
    assert (run.resumed, run.reset) == (True, False)
    assert next_window(run.progress, 100) == Window(600, 100)
    finished, _, read = walk(run.progress, 1500, 100)
    assert sorted(read) == list(range(700))
    assert high_water(finished) == 1000
    after = start_run(finished, 1500)
    assert not after.resumed
    _, _, read = walk(after.progress, 1500, 100)
    assert sorted(read) == list(range(1000, 1500))


def test_resume_keeps_a_half_read_window() -> None:
    progress = start_run(None, 300).progress
    window = next_window(progress, 100)
    assert window is not None
    progress = after_window(progress, window, WindowResult(rows=30))
    run = start_run(decode_progress(encode_progress(progress)), 300)
    assert run.resumed
    assert next_window(run.progress, 100) == Window(230, 70)
    assert next_window(run.progress, 50) == Window(230, 50)


def test_unfinished_high_water_is_the_run_low() -> None:
    saved = BackwardProgress(low=200, t0=500, lowest_done=400)
    assert high_water(saved) == 200
    assert high_water(None) is None


@pytest.mark.parametrize(
    ("saved", "total"),
    [
        (BackwardProgress(low=0, t0=500, lowest_done=0, end="done"), 300),
        (BackwardProgress(low=200, t0=500, lowest_done=400), 450),
        (ForwardProgress(start=0, cursor=500, total=500, end="done"), 100),
    ],
)
def test_shrinking_total_resets_to_a_rescan(saved: Progress, total: int) -> None:
    run = start_run(saved, total)
    assert (run.reset, run.resumed) == (True, False)
    progress = run.progress
    assert isinstance(progress, BackwardProgress)
    assert (progress.low, progress.t0, progress.stop_when_expired) == (0, total, True)


def test_random_short_pages_crashes_and_growth_lose_no_row() -> None:
    rng = random.Random(20240105)
    total = 0
    saved: Progress | None = None
    seen: set[int] = set()
    duplicates = crashes = 0
    for _ in range(80):
        total += rng.randrange(0, 400)
        progress = start_run(saved, total).progress
        while (window := next_window(progress, 100)) is not None:
            take = min(window.size, rng.choice([100, 100, 60, 13, 1]))
            rows = range(window.offset, min(window.offset + take, total))
            duplicates += len(seen.intersection(rows))
            seen.update(rows)
            progress = after_window(progress, window, WindowResult(rows=len(rows)))
            if rng.random() < 0.1:
                crashes += 1
                break
            saved = progress
        else:
            saved = progress
    for _ in range(2):
        progress, _, read = walk(start_run(saved, total).progress, total, 100)
        duplicates += len(seen.intersection(read))
        seen.update(read)
        saved = progress
    assert seen == set(range(total))
    assert crashes > 0
    assert duplicates <= crashes * 100


def test_size_must_be_positive() -> None:
    with pytest.raises(ValueError):
        next_window(start_run(None, 10).progress, 0)


def test_forward_walks_the_returned_cursor() -> None:
    run = start_run(None, 250, paging="forward")
    progress = run.progress
    assert progress == ForwardProgress(start=0, cursor=0, total=250)
    progress, windows, read = walk(progress, 250, 100)
    assert windows == [Window(0, 100), Window(100, 100), Window(200, 100)]
    assert read == list(range(250))
    assert progress.end == "done"
    assert high_water(progress) == 250
    assert remaining(progress) is None
    again = start_run(progress, 300, paging="forward")
    assert again.progress == ForwardProgress(start=250, cursor=250, total=300)


def test_forward_follows_offset_jumps() -> None:
    progress = start_run(None, 100_000, paging="forward").progress
    window = next_window(progress, 100)
    assert window == Window(0, 100)
    progress = after_window(
        progress, window, WindowResult(rows=100, next_offset=1024, rest_total=99_000)
    )
    assert next_window(progress, 100) == Window(1024, 100)


@pytest.mark.parametrize(
    ("result", "end", "cursor"),
    [
        (WindowResult(rows=0, next_offset=500, rest_total=10), "done", 500),
        (WindowResult(rows=10, next_offset=500, rest_total=10), "stuck", 500),
        (WindowResult(rows=10, next_offset=400, rest_total=10), "stuck", 500),
        (WindowResult(rows=10, next_offset=510, rest_total=0), "done", 510),
        (WindowResult(rows=10, next_offset=510, rest_total=5), None, 510),
    ],
)
def test_forward_stop_conditions(result: WindowResult, end: str | None, cursor: int) -> None:
    progress = ForwardProgress(start=500, cursor=500, total=600)
    window = next_window(progress, 100)
    assert window is not None
    after = after_window(progress, window, result)
    assert isinstance(after, ForwardProgress)
    assert (after.end, after.cursor) == (end, cursor)


def test_forward_resumes_and_resets() -> None:
    unfinished = ForwardProgress(start=0, cursor=300, total=500)
    run = start_run(unfinished, 600, paging="forward")
    assert (run.resumed, run.progress) == (True, unfinished)
    run = start_run(unfinished, 400, paging="forward")
    assert run.reset
    assert run.progress == ForwardProgress(start=0, cursor=0, total=400)


def test_switching_strategy_keeps_the_high_water_mark() -> None:
    backward_done = BackwardProgress(low=0, t0=500, lowest_done=0, end="done")
    assert start_run(backward_done, 600, "forward").progress == ForwardProgress(
        start=500, cursor=500, total=600
    )
    backward_open = BackwardProgress(low=200, t0=500, lowest_done=400)
    assert start_run(backward_open, 600, "forward").progress == ForwardProgress(
        start=200, cursor=200, total=600
    )
    forward = ForwardProgress(start=0, cursor=450, total=450, end="done")
    progress = start_run(forward, 600, "backward").progress
    assert isinstance(progress, BackwardProgress)
    assert (progress.low, progress.t0, progress.stop_when_expired) == (450, 600, False)


def test_progress_round_trips_with_its_strategy_tag() -> None:
    for progress in (
        BackwardProgress(low=1, t0=9, lowest_done=5, partial=Partial(3, 1), expired_streak=2),
        ForwardProgress(start=0, cursor=7, total=9, end="stuck"),
    ):
        data = encode_progress(progress)
        assert decode_progress(data) == progress
    assert b'"type":"backward"' in encode_progress(BackwardProgress(low=0, t0=0, lowest_done=0))
