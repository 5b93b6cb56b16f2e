# The tracker's scheduling rules (specs/tracker.md, "Rules"), as pure functions over plain values.
#
# Why pure: the reference buried these rules in SQL and workers, which made them hard to test
# and let bugs hide (parallel "new" chains, Infinity ETAs, jobs scheduled in the past). Here every
# decision (when to snapshot next, which milestone is next, how urgent it is, which window has
# room, how long to wait after an error) is a function of numbers and instants passed in (epoch
# ms, the clock and the random source are arguments), tested with tables of values. The store
# and the ticks only move data between these functions, the database and the network.
from __future__ import annotations

import math
import random
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal
from zoneinfo import ZoneInfo

ScheduleType = Literal["new", "milestone", "normal", "archive"]
SCHEDULE_TYPES: tuple[ScheduleType, ...] = ("new", "milestone", "normal", "archive")
ScheduleStatus = Literal["pending", "processing", "completed", "failed", "no_proxy", "bili_error"]
SCHEDULE_STATUSES: tuple[ScheduleStatus, ...] = (
    "pending", "processing", "completed", "failed", "no_proxy", "bili_error",
)  # fmt: skip
ACTIVE_STATUSES: tuple[ScheduleStatus, ...] = ("pending", "processing")

SECOND = 1000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE
DAY = 24 * HOUR


@dataclass(frozen=True, slots=True)
class Snap:
    """A snapshot reduced to what the rules read: when, and the view count then."""

    at_ms: int
    views: int


# ---- new videos -------------------------------------------------------------------------------

NEW_OFFSETS_MS: tuple[int, ...] = (90 * SECOND, 3 * MINUTE, 5 * MINUTE, 10 * MINUTE)
"""A new song's first four snapshots, after it was classified."""

NEW_MAX_AGE_MS = 48 * HOUR
NEW_SLOW_AFTER_MS = 2 * HOUR
NEW_SLOW_VPH = 10.0


def new_schedule_times(now_ms: int) -> list[int]:
    """When the four `new` schedules of a freshly classified song run."""
    return [now_ms + offset for offset in NEW_OFFSETS_MS]


def views_per_hour(views: int, age_ms: int) -> float:
    """Average views per hour since publication (an age ≤ 0 counts as one millisecond)."""
    return views / (max(age_ms, 1) / HOUR)


def new_continuation_ms(published_ms: int, snapshot_ms: int, views: int) -> int | None:
    """Delay of the next `new` snapshot after one taken at `snapshot_ms`; None ends the chain.

    The chain stops 48 h after publication, or after 2 h when the video gathers fewer than 10
    views an hour; otherwise the next snapshot follows in 240 min, 120 min above 50 views/h,
    60 min above 100 and 15 min above 1000.
    """
    age = snapshot_ms - published_ms
    vph = views_per_hour(views, age)
    if age > NEW_MAX_AGE_MS:
        return None
    if age > NEW_SLOW_AFTER_MS and vph < NEW_SLOW_VPH:
        return None
    if vph > 1000:
        return 15 * MINUTE
    if vph > 100:
        return 60 * MINUTE
    if vph > 50:
        return 120 * MINUTE
    return 240 * MINUTE


# ---- regular ("normal") snapshots -------------------------------------------------------------

REGULAR_LOOKBACK_MS = 24 * HOUR


def regular_base(before: Snap | None, after: Snap | None) -> Snap | None:
    """The snapshot a regular interval is measured from: the newest one at or before now−24 h
    (`before`), else the one after that instant (`after`, the nearest one then)."""
    return before if before is not None else after


def regular_interval_hours(base: Snap | None, latest: Snap | None) -> float:
    """Hours until the next regular snapshot, from the views gained between `base` and `latest`.

    Missing data (or both the same instant) → 0 (snapshot now); no gain → 72 h; then by views per
    day: < 6 → 36 h, < 120 → 24 h, < 320 → 12 h, else 6 h. A loss counts as < 6/day.
    """
    if base is None or latest is None or base.at_ms == latest.at_ms:
        return 0.0
    gained = latest.views - base.views
    if gained == 0:
        return 72.0
    hours = (latest.at_ms - base.at_ms) / HOUR
    per_day = gained / (hours + 0.001) * 24
    if per_day < 6:
        return 36.0
    if per_day < 120:
        return 24.0
    if per_day < 320:
        return 12.0
    return 6.0


def regular_target_ms(latest_ms: int | None, interval_hours: float, now_ms: int) -> int:
    """When the regular dispatcher plans a song's next snapshot: its last snapshot plus the
    interval, not in the past (at least now + 1 ms)."""
    start = latest_ms if latest_ms is not None else now_ms
    return max(start + int(interval_hours * HOUR), now_ms + 1)


# ---- milestones and ETA -----------------------------------------------------------------------

MILLION = 1_000_000


def closest_milestone(views: int, strict: bool = False) -> int:
    """The next milestone at or above `views`: 100k, 1M, then every million; `strict` jumps to
    10M for anything in [1M, 10M) (the ladder of the eta table)."""
    if views < 100_000:
        return 100_000
    if views < MILLION:
        return MILLION
    if views < 10 * MILLION and strict:
        return 10 * MILLION
    return -(-views // MILLION) * MILLION


def milestone_achieved(previous_views: int, new_views: int) -> bool:
    """A snapshot crossed the milestone the previous count was heading for."""
    return new_views > closest_milestone(previous_views)


SONG_CANDIDATE_RANGES: tuple[tuple[int, int | None], ...] = (
    (60_000, 100_000), (900_000, MILLION), (MILLION + 1, None),
)  # fmt: skip
"""[low, high) view ranges that make a song a milestone candidate (None: no upper bound)."""
VIDEO_CANDIDATE_RANGES: tuple[tuple[int, int | None], ...] = ((90_000, 100_000),)
"""[low, high) ranges for any video; plus the last 100k below each whole million."""
NEAR_MILLION = 100_000
CANDIDATE_ETA_HOURS = 2300.0


def _in_ranges(views: int, ranges: Sequence[tuple[int, int | None]]) -> bool:
    return any(views >= low and (high is None or views < high) for low, high in ranges)


def is_milestone_candidate(views: int, is_song: bool, eta_hours: float | None) -> bool:
    """Whether the milestone dispatcher looks at a video: songs in [60k,100k), [900k,1M) or above
    1M; any video in [90k,100k) or within 100k below the next million; any video whose stored
    ETA is under 2300 h."""
    if is_song and _in_ranges(views, SONG_CANDIDATE_RANGES):
        return True
    if _in_ranges(views, VIDEO_CANDIDATE_RANGES):
        return True
    if views >= MILLION - NEAR_MILLION and views % MILLION >= MILLION - NEAR_MILLION:
        return True
    return eta_hours is not None and eta_hours < CANDIDATE_ETA_HOURS


_A, _B, _C, _U, _G = 1.054, 4.5, 100.0, 0.601, 455
FACTOR_MIN, FACTOR_MAX = 4.5, 100.0


def factor_raw(x: float) -> float:
    """F(x), the acceleration factor before clamping (F(0)≈16.02, F(455)≈10.00, F(3000)≈4.90)."""
    if x > _G:
        return math.log(_B / math.log10(x + 1)) / math.log(_A)
    return math.log(_B / math.log10(x + _C)) / math.log(_A) + _U


def factor(x: float) -> float:
    """F(x) clamped to [4.5, 100]: how much sooner than the straight-line ETA to look."""
    return min(max(factor_raw(x), FACTOR_MIN), FACTOR_MAX)


ETA_LOOKBACKS_MS: tuple[int, ...] = (
    3 * MINUTE, 20 * MINUTE, HOUR, 3 * HOUR, 6 * HOUR, 72 * HOUR,
)  # fmt: skip
ETA_MAX_HOURS = 144.0
DISPATCH_MIN_MS = 2 * SECOND
DISPATCH_MAX_MS = int(1.2 * HOUR)


def nearest(target_ms: int, before: Snap | None, after: Snap | None) -> Snap | None:
    """The snapshot closer to `target_ms` of the last one at or before it and the first after."""
    if before is None or after is None:
        return before or after
    return before if target_ms - before.at_ms <= after.at_ms - target_ms else after


@dataclass(frozen=True, slots=True)
class Eta:
    adjusted_hours: float
    """The scheduling ETA (hours to the next milestone divided by the factor); inf: none."""
    speed: float
    """Views per hour of the look-back that gave the smallest ETA (0 when none)."""
    target: int
    """The next milestone (non-strict ladder)."""
    table_hours: float
    """The eta table's value: hours to the strict milestone at `speed` (inf when speed is 0)."""


def short_term_eta(latest: Snap, lookback_snaps: Sequence[Snap | None]) -> Eta:
    """ETA to the next milestone from the snapshots nearest each look-back (3 min … 72 h).

    For each, speed = Δviews/Δh and eta = (target − views)/speed/F; the smallest wins. A look-back
    without a gain counts for nothing; without any, the ETA is infinite.
    """
    target = closest_milestone(latest.views)
    to_go = target - latest.views
    f = factor(to_go)
    best, best_speed = math.inf, 0.0
    for snap in lookback_snaps:
        if snap is None:
            continue
        gained = latest.views - snap.views
        if gained <= 0:
            continue
        hours = abs(latest.at_ms - snap.at_ms) / HOUR
        speed = gained / (hours + 1e-5)
        adjusted = to_go / (speed + 1e-5) / f
        if adjusted < best:
            best, best_speed = adjusted, speed
    if math.isnan(best):
        best = math.inf
    return Eta(best, best_speed, target, eta_table_hours(latest.views, best_speed))


def eta_table_hours(views: int, speed: float) -> float:
    """Hours to the strict milestone at `speed` views/h (the `eta` row; inf when not growing)."""
    if speed <= 0:
        return math.inf
    return (closest_milestone(views, strict=True) - views) / (speed + 1e-5)


def bulk_eta(previous: Snap | None, current: Snap) -> tuple[float, float] | None:
    """(eta hours, speed) for the eta row after a bulk snapshot, from the previous snapshot."""
    if previous is None:
        return None
    hours = (current.at_ms - previous.at_ms) / HOUR
    speed = (current.views - previous.views) / (hours + 1e-4)
    eta = (closest_milestone(current.views, strict=True) - current.views) / (speed + 1e-4)
    return eta, speed


def milestone_dispatch_delay_ms(eta_hours: float) -> int | None:
    """Delay the milestone dispatcher plans for an ETA: None above 144 h, else clamped to
    [2 s, 1.2 h]."""
    if not eta_hours <= ETA_MAX_HOURS:  # also NaN / inf
        return None
    return min(max(int(eta_hours * HOUR), DISPATCH_MIN_MS), DISPATCH_MAX_MS)


def milestone_continuation_ms(eta_hours: float) -> int | None:
    """Delay of the next milestone snapshot after one that did not cross the milestone: the ETA
    itself (not capped at 1.2 h, as in the reference), at least 2 s; None above 144 h."""
    if not eta_hours <= ETA_MAX_HOURS:
        return None
    return max(int(eta_hours * HOUR), DISPATCH_MIN_MS)


# ---- archive --------------------------------------------------------------------------------

SATURDAY, MONDAY = 5, 0  # datetime.weekday()


def _next_weekday(now_ms: int, weekday: int, tz: ZoneInfo) -> datetime:
    """The same local clock time on the next `weekday`, 1–7 days ahead (never today)."""
    local = datetime.fromtimestamp(now_ms / 1000, tz)
    days = (weekday - local.weekday()) % 7 or 7
    naive = local.replace(tzinfo=None) + timedelta(days=days)
    return naive.replace(tzinfo=tz)


def _ms(dt: datetime) -> int:
    return round(dt.timestamp() * 1000)


def next_saturday_ms(now_ms: int, timezone: str) -> int:
    """A song's archive snapshot: next Saturday at the same local clock time (1–7 days ahead)."""
    return _ms(_next_weekday(now_ms, SATURDAY, ZoneInfo(timezone)))


def next_week_range_ms(now_ms: int, timezone: str) -> tuple[int, int]:
    """[next Monday, the Monday after), same local clock time: where other videos' archive
    snapshots fall."""
    tz = ZoneInfo(timezone)
    start = _next_weekday(now_ms, MONDAY, tz)
    end = (start.replace(tzinfo=None) + timedelta(days=7)).replace(tzinfo=tz)
    return _ms(start), _ms(end)


def archive_time_ms(now_ms: int, is_song: bool, timezone: str, rng: random.Random) -> int:
    """When a video's archive snapshot is planned (before window throttling)."""
    if is_song:
        return next_saturday_ms(now_ms, timezone)
    start, end = next_week_range_ms(now_ms, timezone)
    return start + rng.randrange(end - start)


# ---- window throttling ------------------------------------------------------------------------

WINDOW_HORIZON_MS = 14 * DAY


def window_of(at_ms: int, window_ms: int) -> int:
    """The index of the epoch-aligned window holding `at_ms`."""
    return at_ms // window_ms


def windowed_time_ms(
    target_ms: int,
    now_ms: int,
    *,
    window_ms: int,
    full: Container[int],
    rng: random.Random,
    horizon_ms: int = WINDOW_HORIZON_MS,
) -> int:
    """Where a throttled (normal/archive) schedule lands: in the first window from the target's
    on that is not `full` (the indexes of windows already holding their capacity), at a random
    offset inside it but not before now, looking up to `horizon_ms` ahead. When every window is
    full the target itself is kept (its window then exceeds the capacity)."""
    first = window_of(target_ms, window_ms)
    for index in range(first, first + max(horizon_ms // window_ms, 1)):
        if index in full:
            continue
        start = index * window_ms
        low = max(start, now_ms)
        high = start + window_ms
        if low >= high:
            continue
        return low + rng.randrange(high - low)
    return max(target_ms, now_ms)


def place_in_windows(
    targets_ms: Sequence[int],
    now_ms: int,
    *,
    window_ms: int,
    fill: dict[int, int],
    capacity: int,
    rng: random.Random,
    horizon_ms: int = WINDOW_HORIZON_MS,
) -> list[int]:
    """Planned times of throttled schedules placed one after the other (windowed_time_ms each),
    every placement counting in its window for the next ones, as if each were inserted before
    the next was placed. `fill` maps window indexes to their pending schedules (windows that
    cannot fill up within these placements may be missing); it is updated in place."""
    full = {w for w, n in fill.items() if n >= capacity}
    planned = []
    for target in targets_ms:
        at = windowed_time_ms(
            target, now_ms, window_ms=window_ms, full=full, rng=rng, horizon_ms=horizon_ms
        )
        win = window_of(at, window_ms)
        fill[win] = fill.get(win, 0) + 1
        if fill[win] >= capacity:
            full.add(win)
        planned.append(at)
    return planned


# ---- errors ---------------------------------------------------------------------------------

BULK_ERROR_RETRY_MS = 15 * SECOND
BULK_NO_PROXY_MAX_MS = 30 * SECOND


def single_retry_ms(schedule_type: str) -> int:
    """Retry delay of a single snapshot that found no proxy (or failed in the network): 5 s for a
    milestone, 2 min for the others."""
    return 5 * SECOND if schedule_type == "milestone" else 2 * MINUTE


def bulk_no_proxy_retry_ms(rng: random.Random) -> int:
    """Retry delay of a bulk group that found no proxy: random in [0, 30 s]."""
    return rng.randint(0, BULK_NO_PROXY_MAX_MS)


# ---- ticks ------------------------------------------------------------------------------------

SINGLE_LOOKBACK_MS = MINUTE
SINGLE_LIMIT = 10
BULK_LOOKBACK_MS = 2 * MINUTE
BULK_LIMIT = 1000
CLEANUP_AGE_MS = 2 * MINUTE

SINGLE_TYPES_BY_PRIORITY: tuple[tuple[ScheduleType, ...], ...] = (
    ("milestone",), ("new", "archive"),
)  # fmt: skip
"""The single tick's types (all but normal), highest priority first."""
BULK_TYPES_BY_PRIORITY: tuple[tuple[ScheduleType, ...], ...] = (("normal",), ("archive",))
EXACT_TIME_TYPES: frozenset[str] = frozenset({"new", "milestone"})
"""Types planned at their exact time; the others go through window throttling."""


def due_range(now_ms: int, lookback_ms: int, ahead_ms: int) -> tuple[int, int]:
    """[low, high] of planned times a tick takes: from `lookback_ms` ago to `ahead_ms` ahead
    (the tick's period: 1 s for the single tick, 15 s for the bulk tick)."""
    return now_ms - lookback_ms, now_ms + ahead_ms


def pick_single(
    due: Sequence[tuple[int, int, str, int]],
    busy_aids: Container[int],
    limit: int = SINGLE_LIMIT,
) -> list[tuple[int, int, str, int]]:
    """The single tick's rows from due `(id, aid, type, planned_ms)` in priority order: skip aids
    with a processing schedule (and a second row of an aid already taken), at most `limit`."""
    rank: dict[str, int] = {t: i for i, group in enumerate(SINGLE_TYPES_BY_PRIORITY) for t in group}
    taken: list[tuple[int, int, str, int]] = []
    seen: set[int] = set()
    for row in sorted(due, key=lambda r: (rank.get(r[2], len(rank)), r[3], r[0])):
        if row[2] not in rank or row[1] in busy_aids or row[1] in seen:
            continue
        taken.append(row)
        seen.add(row[1])
        if len(taken) == limit:
            break
    return taken


def expiring(rows: Sequence[tuple[int, int, str, int]], expiring_ms: int) -> bool:
    """Whether one of the due rows `(id, aid, type, planned_ms)` is planned before
    `expiring_ms`: it would leave a tick's lookback before the next tick."""
    return any(row[3] < expiring_ms for row in rows)


def within_room(
    units: Sequence[Sequence[tuple[int, int, str, int]]], room: int | None, expiring_ms: int
) -> list[tuple[int, int, str, int]]:
    """The due rows a tick claims from `units` in priority order (a unit is one request: a single
    schedule, or a bulk group of `(id, aid, type, planned_ms)`): the first `room` units (None:
    every one), the rest left pending for a tick with room (this instance's next, or another
    instance's), except a unit holding a row planned before `expiring_ms`, which would leave
    the tick's lookback before the next tick: it is claimed anyway (its request waits for room
    or is retried as the spec says when none comes)."""
    taken: list[tuple[int, int, str, int]] = []
    for i, unit in enumerate(units):
        if room is None or i < room or expiring(unit, expiring_ms):
            taken.extend(unit)
    return taken


def groups(items: Sequence[int], size: int) -> list[list[int]]:
    """`items` in consecutive groups of at most `size` (the bulk request's aids)."""
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def lag_percentiles(lags_ms: Sequence[int], quantiles: Sequence[float]) -> list[float | None]:
    """Nearest-rank quantiles of lags (None when there are none)."""
    if not lags_ms:
        return [None for _ in quantiles]
    ordered = sorted(lags_ms)
    out: list[float | None] = []
    for q in quantiles:
        rank = max(math.ceil(q * len(ordered)), 1)
        out.append(float(ordered[rank - 1]))
    return out


# ---- ingest --------------------------------------------------------------------------------

INGEST_ATTEMPTS = 10
INGEST_RETRY_MS = 30 * SECOND
CLASSIFY_RETRY_MS = 5 * MINUTE


def ingest_retry(attempts: int, now_ms: int) -> int | None:
    """When a failed ingest (network error, `attempts` failures so far) is tried again; None
    after the 10th attempt."""
    if attempts >= INGEST_ATTEMPTS:
        return None
    return now_ms + INGEST_RETRY_MS


def unseen_aids(page: Sequence[int], known: Callable[[int], bool]) -> list[int]:
    """The aids of a newlist page not seen before, in list order, without repeats."""
    out: list[int] = []
    for aid in page:
        if aid not in out and not known(aid):
            out.append(aid)
    return out


def discovery_continues(page: Sequence[int], unseen: Sequence[int]) -> bool:
    """Discovery pages on while a page is non-empty and holds an unseen aid."""
    return bool(page) and bool(unseen)
