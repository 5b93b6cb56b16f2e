"""The curve's pure rules: range windows, min/max decimation, milestone lines."""

from __future__ import annotations

import pytest

from daemon.ui import curve


def rows(values: list[int], step: int = 10) -> list[tuple[int, ...]]:
    return [(i * step, v) for i, v in enumerate(values)]


def test_few_rows_come_back_unchanged() -> None:
    given = rows([1, 2, 3])
    assert curve.decimate(given, 10) == given
    assert curve.decimate([], 10) == []


def test_decimation_keeps_min_and_max_of_each_bucket_in_time_order() -> None:
    # 8 rows, 4 points -> 2 buckets of 4 rows each
    given = rows([5, 9, 1, 6, 7, 2, 8, 3])
    assert curve.decimate(given, 4) == [(10, 9), (20, 1), (50, 2), (60, 8)]


def test_a_flat_bucket_keeps_one_row() -> None:
    given = rows([4, 4, 4, 4, 7, 7, 7, 7])
    assert curve.decimate(given, 4) == [(0, 4), (40, 7)]


@pytest.mark.parametrize("count", [1001, 5000, 100_000])
def test_never_more_than_max_points_and_the_extremes_survive(count: int) -> None:
    values = [(i * 7919) % 1000 for i in range(count)]
    values[count // 3] = -5
    values[2 * count // 3] = 10_000
    kept = curve.decimate(rows(values), 1000)
    assert len(kept) <= 1000
    assert [t for t, _ in kept] == sorted(t for t, _ in kept)
    assert min(v for _, v in kept) == -5 and max(v for _, v in kept) == 10_000


def test_decimation_of_rows_in_one_instant() -> None:
    assert len(curve.decimate([(5, i) for i in range(10)], 4)) <= 4


def test_max_points_below_two_is_refused() -> None:
    with pytest.raises(ValueError, match="max_points"):
        curve.decimate(rows([1, 2, 3]), 1)


def test_windows() -> None:
    now = 100 * curve.HOUR_MS
    assert curve.window("6h", now) == (94 * curve.HOUR_MS, now)
    assert curve.window("7d", now) == (0, now)  # never before the epoch
    assert curve.window("all", now) == (0, now)
    with pytest.raises(KeyError):
        curve.window("1y", now)


@pytest.mark.parametrize(
    ("low", "high", "lines"),
    [
        (0, 50_000, [100_000]),
        (90_000, 120_000, [100_000, 1_000_000]),
        (150_000, 990_000, [1_000_000]),
        (1_500_000, 2_400_000, [2_000_000, 3_000_000]),
        (0, 30_000_000, [20_000_000 + i * 1_000_000 for i in range(12)]),
    ],
)
def test_milestone_lines(low: int, high: int, lines: list[int]) -> None:
    assert curve.milestone_lines(low, high) == lines


def test_snapshot_csv() -> None:
    from daemon.api.tracker import snapshots_csv

    assert snapshots_csv([(1, 2, 3, 4, 5, 6, 7, 8)]) == (
        "at_ms,views,danmakus,replies,likes,coins,shares,favorites\n1,2,3,4,5,6,7,8\n"
    )
    assert snapshots_csv([]) == "at_ms,views,danmakus,replies,likes,coins,shares,favorites\n"
