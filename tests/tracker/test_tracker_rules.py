from __future__ import annotations

import math
import random
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from daemon.tracker import rules
from daemon.tracker.rules import DAY, HOUR, MINUTE, SECOND, Snap

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z, a Thursday


def test_new_schedule_times() -> None:
    assert rules.new_schedule_times(T0) == [
        T0 + 90 * SECOND, T0 + 3 * MINUTE, T0 + 5 * MINUTE, T0 + 10 * MINUTE,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("age_ms", "views", "expected"),
    [
        (10 * MINUTE, 0, 240 * MINUTE),  # young: always continues
        (HOUR, 5, 240 * MINUTE),
        (HOUR, 51, 120 * MINUTE),
        (HOUR, 50, 240 * MINUTE),  # not above 50
        (HOUR, 101, 60 * MINUTE),
        (HOUR, 100, 120 * MINUTE),
        (HOUR, 1001, 15 * MINUTE),
        (HOUR, 1000, 60 * MINUTE),
        (2 * HOUR, 0, 240 * MINUTE),  # exactly 2 h: not after 2 h yet
        (3 * HOUR, 29, None),  # 9.7 vph after 2 h
        (3 * HOUR, 30, 240 * MINUTE),  # 10 vph
        (10 * HOUR, 20_000, 15 * MINUTE),
        (48 * HOUR, 48_000, 60 * MINUTE),  # exactly 48 h still runs
        (48 * HOUR + 1, 10**9, None),
        (0, 10, 15 * MINUTE),  # age 0 counts as 1 ms
    ],
)
def test_new_continuation(age_ms: int, views: int, expected: int | None) -> None:
    assert rules.new_continuation_ms(T0, T0 + age_ms, views) == expected


@pytest.mark.parametrize(
    ("base", "latest", "hours"),
    [
        (None, Snap(T0, 10), 0.0),
        (Snap(T0, 10), None, 0.0),
        (Snap(T0, 10), Snap(T0, 20), 0.0),  # same instant
        (Snap(T0, 10), Snap(T0 + DAY, 10), 72.0),
        (Snap(T0, 10), Snap(T0 + DAY, 15), 36.0),
        (Snap(T0, 10), Snap(T0 + DAY, 5), 36.0),  # a loss
        (Snap(T0, 0), Snap(T0 + DAY, 7), 24.0),
        (Snap(T0, 0), Snap(T0 + DAY, 119), 24.0),
        (Snap(T0, 0), Snap(T0 + DAY, 121), 12.0),
        (Snap(T0, 0), Snap(T0 + DAY, 319), 12.0),
        (Snap(T0, 0), Snap(T0 + DAY, 321), 6.0),
        (Snap(T0, 0), Snap(T0 + 2 * HOUR, 100), 6.0),  # 1200/day
    ],
)
def test_regular_interval(base: Snap | None, latest: Snap | None, hours: float) -> None:
    assert rules.regular_interval_hours(base, latest) == hours


def test_regular_base_and_target() -> None:
    a, b = Snap(T0, 1), Snap(T0 + HOUR, 2)
    assert rules.regular_base(a, b) == a
    assert rules.regular_base(None, b) == b
    assert rules.regular_base(None, None) is None
    assert rules.regular_target_ms(T0, 6, T0 + HOUR) == T0 + 6 * HOUR
    assert rules.regular_target_ms(T0, 0, T0 + HOUR) == T0 + HOUR + 1
    assert rules.regular_target_ms(None, 12, T0) == T0 + 12 * HOUR


@pytest.mark.parametrize(
    ("views", "loose", "strict"),
    [
        (0, 100_000, 100_000),
        (99_999, 100_000, 100_000),
        (100_000, 1_000_000, 1_000_000),
        (999_999, 1_000_000, 1_000_000),
        (1_000_000, 1_000_000, 10_000_000),  # exactly a million: 0 to go (non-strict)
        (1_000_001, 2_000_000, 10_000_000),
        (2_500_000, 3_000_000, 10_000_000),
        (9_999_999, 10_000_000, 10_000_000),
        (10_000_001, 11_000_000, 11_000_000),
    ],
)
def test_closest_milestone(views: int, loose: int, strict: int) -> None:
    assert rules.closest_milestone(views) == loose
    assert rules.closest_milestone(views, strict=True) == strict


@pytest.mark.parametrize(
    ("previous", "new", "achieved"),
    [
        (99_000, 100_000, False),
        (99_000, 100_001, True),
        (100_500, 200_000, False),
        (999_999, 1_000_001, True),
        (1_500_000, 2_000_001, True),
        (1_500_000, 1_999_999, False),
    ],
)
def test_milestone_achieved(previous: int, new: int, achieved: bool) -> None:
    assert rules.milestone_achieved(previous, new) is achieved


@pytest.mark.parametrize(
    ("views", "song", "eta", "candidate"),
    [
        (59_999, True, None, False),
        (60_000, True, None, True),
        (60_000, False, None, False),
        (89_999, False, None, False),
        (90_000, False, None, True),
        (99_999, False, None, True),
        (100_000, True, None, False),
        (899_999, False, None, False),
        (900_000, False, None, True),
        (1_000_000, True, None, False),  # above 1M means > 1M
        (1_000_001, True, None, True),
        (1_500_000, False, None, False),
        (1_900_000, False, None, True),
        (2_000_000, False, None, False),
        (500, False, 2299.0, True),
        (500, False, 2300.0, False),
        (0, False, None, False),
    ],
)
def test_milestone_candidates(views: int, song: bool, eta: float | None, candidate: bool) -> None:
    assert rules.is_milestone_candidate(views, song, eta) is candidate


@pytest.mark.parametrize(
    ("x", "value"),
    [
        (0, 16.02),
        (100, 13.35),
        (455, 10.00),
        (456, 10.00),
        (1000, 7.71),
        (2000, 5.89),
        (3000, 4.90),
    ],
)
def test_factor_reference_values(x: int, value: float) -> None:
    assert rules.factor_raw(x) == pytest.approx(value, abs=0.005)
    assert rules.factor(x) == pytest.approx(value, abs=0.005)


def test_factor_clamp() -> None:
    assert rules.factor(3600) == 4.5
    assert rules.factor(10**6) == 4.5
    assert rules.factor_raw(10**6) < 4.5


def test_short_term_eta_keeps_minimum() -> None:
    now = T0 + 10 * DAY
    latest = Snap(now, 99_000)  # 1000 to go, factor 7.71
    snaps = [
        Snap(now - 3 * MINUTE, 98_900),  # 2000 views/h
        Snap(now - 20 * MINUTE, 98_000),  # 3000 views/h: fastest
        None,
        Snap(now - 3 * HOUR, 99_000),  # no gain: ignored
        Snap(now - 6 * HOUR, 99_500),  # a loss: ignored
        Snap(now - 72 * HOUR, 50_000),
    ]
    eta = rules.short_term_eta(latest, snaps)
    assert eta.target == 100_000
    assert eta.speed == pytest.approx(3000, rel=1e-4)
    assert eta.adjusted_hours == pytest.approx(1000 / 3000 / rules.factor(1000), rel=1e-4)
    assert eta.table_hours == pytest.approx(1000 / 3000, rel=1e-4)


def test_short_term_eta_without_growth_is_infinite() -> None:
    latest = Snap(T0, 500)
    eta = rules.short_term_eta(latest, [Snap(T0, 500), None])
    assert eta.adjusted_hours == math.inf and eta.speed == 0 and eta.table_hours == math.inf
    assert rules.milestone_dispatch_delay_ms(eta.adjusted_hours) is None


def test_eta_table_uses_strict_ladder() -> None:
    assert rules.eta_table_hours(2_000_000, 1000.0) == pytest.approx(8000, rel=1e-6)
    assert rules.bulk_eta(None, Snap(T0, 1)) is None
    eta, speed = rules.bulk_eta(Snap(T0, 0), Snap(T0 + HOUR, 1000))  # type: ignore[misc]
    assert speed == pytest.approx(1000, rel=1e-3)
    assert eta == pytest.approx(99_000 / 1000, rel=1e-3)


@pytest.mark.parametrize(
    ("eta_hours", "dispatch", "continuation"),
    [
        (0.0, 2 * SECOND, 2 * SECOND),
        (0.0001, 2 * SECOND, 2 * SECOND),
        (0.5, 30 * MINUTE, 30 * MINUTE),
        (1.2, int(1.2 * HOUR), int(1.2 * HOUR)),
        (10.0, int(1.2 * HOUR), 10 * HOUR),
        (144.0, int(1.2 * HOUR), 144 * HOUR),
        (144.01, None, None),
        (math.inf, None, None),
        (math.nan, None, None),
    ],
)
def test_milestone_delays(eta_hours: float, dispatch: int | None, continuation: int | None) -> None:
    assert rules.milestone_dispatch_delay_ms(eta_hours) == dispatch
    assert rules.milestone_continuation_ms(eta_hours) == continuation


SH = ZoneInfo("Asia/Shanghai")


def _sh(*args: int) -> int:
    return int(datetime(*args, tzinfo=SH).timestamp() * 1000)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("now", "saturday"),
    [
        (_sh(2026, 1, 1, 10, 30), _sh(2026, 1, 3, 10, 30)),  # Thursday → 2 days
        (_sh(2026, 1, 2, 23, 59), _sh(2026, 1, 3, 23, 59)),  # Friday → 1 day
        (_sh(2026, 1, 3, 0, 1), _sh(2026, 1, 10, 0, 1)),  # Saturday → next week, never today
        (_sh(2026, 1, 4, 12, 0), _sh(2026, 1, 10, 12, 0)),  # Sunday → 6 days
    ],
)
def test_next_saturday(now: int, saturday: int) -> None:
    assert rules.next_saturday_ms(now, "Asia/Shanghai") == saturday


def test_next_saturday_counts_in_the_timezone() -> None:
    # Friday 20:00 UTC is already Saturday 04:00 in Shanghai: next Saturday is a week later.
    now = int(datetime(2026, 1, 2, 20, 0, tzinfo=ZoneInfo("UTC")).timestamp() * 1000)
    assert rules.next_saturday_ms(now, "Asia/Shanghai") == _sh(2026, 1, 10, 4, 0)
    assert rules.next_saturday_ms(now, "UTC") == now + DAY


@pytest.mark.parametrize(
    ("now", "monday"),
    [
        (_sh(2026, 1, 1, 10, 0), _sh(2026, 1, 5, 10, 0)),  # Thursday
        (_sh(2026, 1, 5, 10, 0), _sh(2026, 1, 12, 10, 0)),  # Monday → next week
        (_sh(2026, 1, 4, 23, 0), _sh(2026, 1, 5, 23, 0)),  # Sunday → tomorrow
    ],
)
def test_next_week_range(now: int, monday: int) -> None:
    assert rules.next_week_range_ms(now, "Asia/Shanghai") == (monday, monday + 7 * DAY)


def test_archive_time() -> None:
    rng = random.Random(7)
    now = _sh(2026, 1, 1, 10, 0)
    assert rules.archive_time_ms(now, True, "Asia/Shanghai", rng) == _sh(2026, 1, 3, 10, 0)
    start, end = _sh(2026, 1, 5, 10, 0), _sh(2026, 1, 12, 10, 0)
    times = [rules.archive_time_ms(now, False, "Asia/Shanghai", rng) for _ in range(500)]
    assert all(start <= t < end for t in times)
    assert max(times) - min(times) > 5 * DAY  # spread over the week


W = 5 * MINUTE


@pytest.mark.parametrize(
    ("target", "now", "full", "window_index"),
    [
        (T0 + 2 * MINUTE, T0, set(), T0 // W),
        (T0 + 2 * MINUTE, T0, {T0 // W}, T0 // W + 1),
        (T0 + 2 * MINUTE, T0, {T0 // W, T0 // W + 1, T0 // W + 2}, T0 // W + 3),
        (T0 + DAY, T0, set(), (T0 + DAY) // W),
    ],
)
def test_windowed_time(target: int, now: int, full: set[int], window_index: int) -> None:
    rng = random.Random(1)
    for _ in range(50):
        at = rules.windowed_time_ms(target, now, window_ms=W, full=full, rng=rng)
        assert at // W == window_index
        assert at >= now


def test_windowed_time_not_before_now() -> None:
    rng = random.Random(2)
    now = T0 + 4 * MINUTE  # inside the window [T0, T0 + 5 min)
    times = [rules.windowed_time_ms(T0, now, window_ms=W, full=set(), rng=rng) for _ in range(200)]
    assert all(now <= t < T0 + W for t in times)


def test_windowed_time_gives_up_after_horizon() -> None:
    rng = random.Random(3)
    first = T0 // W
    full = range(first, first + 14 * DAY // W)
    assert rules.windowed_time_ms(T0, T0, window_ms=W, full=full, rng=rng) == T0
    just_fits = range(first, first + 14 * DAY // W - 1)
    at = rules.windowed_time_ms(T0, T0, window_ms=W, full=just_fits, rng=rng)
    assert at // W == first + 14 * DAY // W - 1


@pytest.mark.parametrize(
    ("targets", "fill", "capacity", "windows"),
    [
        ([T0] * 3, {}, 2, [0, 0, 1]),
        ([T0] * 3, {T0 // W: 1}, 2, [0, 1, 1]),
        ([T0, T0 + W, T0], {T0 // W + 1: 1}, 2, [0, 1, 0]),
        ([T0] * 2, {T0 // W: 5}, 2, [1, 1]),
    ],
)
def test_place_in_windows(
    targets: list[int], fill: dict[int, int], capacity: int, windows: list[int]
) -> None:
    counts = dict(fill)
    placed = rules.place_in_windows(
        targets, T0, window_ms=W, fill=counts, capacity=capacity, rng=random.Random(4)
    )
    assert [at // W - T0 // W for at in placed] == windows
    for at in placed:
        fill[at // W] = fill.get(at // W, 0) + 1
    assert counts == fill


def test_place_in_windows_is_windowed_time_one_after_another() -> None:
    targets = [T0 + (i % 4) * W for i in range(40)]
    fill = {T0 // W + 1: 2}
    rng_a, rng_b = random.Random(8), random.Random(8)
    placed = rules.place_in_windows(
        targets, T0, window_ms=W, fill=dict(fill), capacity=5, rng=rng_a
    )
    one_by_one = []
    for target in targets:
        full = {w for w, n in fill.items() if n >= 5}
        at = rules.windowed_time_ms(target, T0, window_ms=W, full=full, rng=rng_b)
        fill[at // W] = fill.get(at // W, 0) + 1
        one_by_one.append(at)
    assert placed == one_by_one


def test_retry_delays() -> None:
    assert rules.single_retry_ms("milestone") == 5 * SECOND
    assert rules.single_retry_ms("new") == 2 * MINUTE
    assert rules.single_retry_ms("archive") == 2 * MINUTE
    rng = random.Random(4)
    delays = [rules.bulk_no_proxy_retry_ms(rng) for _ in range(200)]
    assert all(0 <= d <= 30 * SECOND for d in delays) and len(set(delays)) > 100
    assert rules.BULK_ERROR_RETRY_MS == 15 * SECOND


def test_due_ranges() -> None:
    assert rules.due_range(T0, rules.SINGLE_LOOKBACK_MS, SECOND) == (T0 - MINUTE, T0 + SECOND)
    assert rules.due_range(T0, rules.BULK_LOOKBACK_MS, 15 * SECOND) == (
        T0 - 2 * MINUTE, T0 + 15 * SECOND,
    )  # fmt: skip


def test_pick_single_priority_busy_and_limit() -> None:
    due = [
        (1, 10, "new", T0),
        (2, 11, "archive", T0 - 1),
        (3, 12, "milestone", T0 + 500),
        (4, 13, "milestone", T0 - 30 * SECOND),
        (5, 14, "new", T0),  # aid 14 is busy
        (6, 10, "milestone", T0),  # aid 10 twice: the milestone wins
        (7, 15, "normal", T0),  # never single
    ]
    picked = rules.pick_single(due, busy_aids={14})
    assert [r[0] for r in picked] == [4, 6, 3, 2]
    assert [r[0] for r in rules.pick_single(due, busy_aids=set(), limit=2)] == [4, 6]
    many = [(i, 100 + i, "new", T0) for i in range(25)]
    assert len(rules.pick_single(many, busy_aids=set())) == rules.SINGLE_LIMIT == 10


def test_groups() -> None:
    assert rules.groups(list(range(65)), 30) == [
        list(range(30)), list(range(30, 60)), list(range(60, 65)),
    ]  # fmt: skip
    assert rules.groups([], 30) == []


def test_lag_percentiles() -> None:
    assert rules.lag_percentiles([], [0.5, 0.99]) == [None, None]
    assert rules.lag_percentiles(list(range(1, 101)), [0.5, 0.99]) == [50.0, 99.0]
    assert rules.lag_percentiles([7], [0.5, 0.99]) == [7.0, 7.0]


@pytest.mark.parametrize(
    ("attempts", "retry"), [(1, T0 + 30 * SECOND), (9, T0 + 30 * SECOND), (10, None)]
)
def test_ingest_retry(attempts: int, retry: int | None) -> None:
    assert rules.ingest_retry(attempts, T0) == retry


def test_discovery_paging() -> None:
    known = {1, 2, 3}
    assert rules.unseen_aids([5, 1, 4, 5], known.__contains__) == [5, 4]
    assert rules.discovery_continues([5, 1], [5])
    assert not rules.discovery_continues([1, 2], [])
    assert not rules.discovery_continues([], [])


@pytest.mark.parametrize(
    ("room", "expiring", "expected"),
    [
        (None, 0, [1, 2, 3, 4, 5]),  # no bound: every unit
        (2, 0, [1, 2, 3]),  # the first two units, in their order
        (0, 0, []),
        (5, 0, [1, 2, 3, 4, 5]),
        (0, 150, [1, 2]),  # a unit with a row about to leave the lookback is taken anyway
        (1, 450, [1, 2, 3, 4]),
    ],
)
def test_within_room(room: int | None, expiring: int, expected: list[int]) -> None:
    units = [
        [(1, 10, "normal", 100), (2, 20, "normal", 200)],
        [(3, 30, "normal", 300)],
        [(4, 40, "archive", 400)],
        [(5, 50, "archive", 500)],
    ]
    assert [r[0] for r in rules.within_room(units, room, expiring)] == expected
