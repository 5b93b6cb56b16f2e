# A monitor's schedule as pure rules: Firecrawl's text forms normalised to 5-field cron, cron
# evaluated in an IANA zone (the next fire found by walking days, then the day's hours and
# minutes, never minute by minute), the shortest gap between fires (checked against [monitors]
# min_interval) and the deterministic per-monitor jitter of text schedules. A local time a DST
# jump skips does not fire; one a fall-back repeats fires once (its first occurrence), as Vixie
# cron does. Plain values in and out; the scheduler (service.py) is a thin loop around them.
from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

MINUTE_MS = 60_000
MAX_JITTER_MS = 30 * MINUTE_MS
SEARCH_DAYS = 366 * 8
"""How far ahead a next fire is looked for (a Feb 29 schedule fires at least every 8 years)."""

_MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun",
                "jul", "aug", "sep", "oct", "nov", "dec")  # fmt: skip
_MONTHS = {m: i + 1 for i, m in enumerate(_MONTH_NAMES)}
_DAYS = {d: i for i, d in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])}


class ScheduleError(ValueError):
    """A schedule that cannot be read; the message says why."""


@dataclass(frozen=True)
class Cron:
    """A parsed 5-field cron expression; `text` is its normalised spelling."""

    text: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    any_day: bool
    any_weekday: bool

    def day_matches(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        dom = day.day in self.days
        dow = (day.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:
            return dom and dow
        return dom or dow  # both restricted: either matches (cron's rule)


def _value(token: str, names: dict[str, int], field: str) -> int:
    if token.isdigit():
        return int(token)
    if token.lower() in names:
        return names[token.lower()]
    raise ScheduleError(f"{field}: {token!r} is not a number")


def _field(
    text: str, lo: int, hi: int, field: str, names: dict[str, int] | None = None
) -> set[int]:
    out: set[int] = set()
    for part in text.split(","):
        base, _, step_text = part.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or int(step_text) < 1:
                raise ScheduleError(f"{field}: step {step_text!r} must be a positive number")
            step = int(step_text)
        if base == "*":
            first, last = lo, hi
        elif "-" in base:
            a, _, b = base.partition("-")
            first, last = _value(a, names or {}, field), _value(b, names or {}, field)
        else:
            first = _value(base, names or {}, field)
            last = hi if step_text else first
        if not (lo <= first <= hi and lo <= last <= hi) or first > last:
            raise ScheduleError(f"{field}: {part!r} is outside {lo}-{hi}")
        out.update(range(first, last + 1, step))
    return out


def parse_cron(text: str) -> Cron:
    """A 5-field cron expression (minute hour day-of-month month day-of-week; `*`, lists,
    ranges, steps, month and day names); ScheduleError naming the bad field."""
    parts = text.split()
    if len(parts) != 5:
        raise ScheduleError(f"a cron expression has 5 fields, {len(parts)} given")
    minute, hour, dom, month, dow = parts
    weekdays = {d % 7 for d in _field(dow, 0, 7, "day of week", _DAYS)}
    return Cron(
        text=" ".join(parts),
        minutes=tuple(sorted(_field(minute, 0, 59, "minute"))),
        hours=tuple(sorted(_field(hour, 0, 23, "hour"))),
        days=frozenset(_field(dom, 1, 31, "day of month")),
        months=frozenset(_field(month, 1, 12, "month", _MONTHS)),
        weekdays=frozenset(weekdays),
        any_day=dom == "*",
        any_weekday=dow == "*",
    )


def zone(name: str) -> ZoneInfo:
    """The IANA zone `name`; ScheduleError when unknown."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(f"unknown time zone {name[:64]!r}") from None


def _exists(local: datetime, tz: ZoneInfo) -> bool:
    back = local.astimezone(UTC).astimezone(tz)
    return back.replace(tzinfo=None) == local.replace(tzinfo=None)


def fires(cron: Cron, tz: ZoneInfo, after_ms: int) -> Iterator[int]:
    """The fire times strictly after `after_ms` (epoch ms, minute-aligned) in order, within
    SEARCH_DAYS: one walk, each the next_fire of the one before (the existing local times of a
    zone map to instants in the same order, a fall-back's repeat being skipped)."""
    start = datetime.fromtimestamp(after_ms / 1000, UTC).astimezone(tz)
    day = start.date() - timedelta(days=1)  # a fall-back can put a fire of yesterday after it
    last = after_ms
    for _ in range(SEARCH_DAYS):
        if cron.day_matches(day):
            for hour in cron.hours:
                for minute in cron.minutes:
                    local = datetime(day.year, day.month, day.day, hour, minute, tzinfo=tz)
                    at = int(local.timestamp() * 1000)
                    if at > last and _exists(local, tz):  # the cheap test first
                        last = at
                        yield at
        day += timedelta(days=1)


def next_fire(cron: Cron, tz: ZoneInfo, after_ms: int) -> int | None:
    """The first fire time strictly after `after_ms` (epoch ms, minute-aligned), or None when
    none comes within SEARCH_DAYS."""
    return next(fires(cron, tz, after_ms), None)


def shortest_gap_ms(cron: Cron, tz: ZoneInfo, from_ms: int, samples: int = 60) -> int | None:
    """The shortest time between two consecutive fires among the first `samples` after
    `from_ms` (None: fewer than two fires)."""
    gaps: list[int] = []
    previous: int | None = None
    for at in fires(cron, tz, from_ms):
        if previous is not None:
            gaps.append(at - previous)
            if len(gaps) == samples:
                break
        previous = at
    return min(gaps) if gaps else None


_EVERY_MINUTES = re.compile(r"every (\d+) minutes?(?: starting at :?(\d{1,2}))?")
_HOURLY = re.compile(r"(?:hourly|every hour)(?: at :?(\d{1,2}))?")
_EVERY_HOURS = re.compile(r"every (\d+) hours?")
_DAILY = re.compile(r"(?:daily|every day)(?: at (\d{1,2})(?::(\d{2}))? ?(am|pm)?)?")
_WEEKLY = re.compile(r"weekly|every week")


@dataclass(frozen=True)
class TextSchedule:
    cron: str
    interval_ms: int


def _minute(text: str | None) -> int:
    minute = int(text or 0)
    if minute > 59:
        raise ScheduleError(f"minute :{minute} is outside 0-59")
    return minute


def parse_text(text: str) -> TextSchedule:
    """Firecrawl's text schedules (lower-cased, commas dropped) as cron with their interval;
    ScheduleError for anything else."""
    said = " ".join(text.lower().replace(",", " ").split())
    if m := _EVERY_MINUTES.fullmatch(said):
        n = int(m[1])
        if n < 1 or 60 % n:
            raise ScheduleError("every N minutes: N must divide 60")
        start = _minute(m[2]) % n
        field = f"*/{n}" if start == 0 else f"{start}-59/{n}"
        return TextSchedule(f"{field if n > 1 else '*'} * * * *", n * MINUTE_MS)
    if m := _HOURLY.fullmatch(said):
        return TextSchedule(f"{_minute(m[1])} * * * *", 60 * MINUTE_MS)
    if m := _EVERY_HOURS.fullmatch(said):
        n = int(m[1])
        if n < 1 or 24 % n:
            raise ScheduleError("every N hours: N must divide 24")
        return TextSchedule(f"0 {'*' if n == 1 else f'*/{n}'} * * *", n * 60 * MINUTE_MS)
    if m := _DAILY.fullmatch(said):
        hour, minute = int(m[1] or 0), _minute(m[2])
        if m[3]:
            if not 1 <= hour <= 12:
                raise ScheduleError(f"{hour}{m[3]}: the hour must be 1-12")
            hour = hour % 12 + (12 if m[3] == "pm" else 0)
        if hour > 23:
            raise ScheduleError(f"hour {hour} is outside 0-23")
        return TextSchedule(f"{minute} {hour} * * *", 24 * 60 * MINUTE_MS)
    if _WEEKLY.fullmatch(said):
        return TextSchedule("0 0 * * 0", 7 * 24 * 60 * MINUTE_MS)
    raise ScheduleError(
        f"{text[:64]!r} is no schedule: use 'every N minutes', 'hourly', 'every N hours',"
        " 'daily at 9am', 'weekly' or a 5-field cron expression"
    )


def jitter_ms(monitor_id: str, interval_ms: int) -> int:
    """A monitor's fixed offset after each fire time: from its id, in whole seconds, at most
    min(interval / 2, 30 minutes)."""
    span_s = min(interval_ms // 2, MAX_JITTER_MS) // 1000
    if span_s <= 0:
        return 0
    digest = int.from_bytes(hashlib.sha256(monitor_id.encode()).digest()[:8], "big")
    return (digest % span_s) * 1000


@dataclass(frozen=True)
class Due:
    """What a due monitor's scheduler does: record a check (or `skipped_overlap` when its
    previous check still runs) for `scheduled_ms`, and wait for `next_due_ms` (+ jitter)."""

    scheduled_ms: int
    next_due_ms: int | None
    overlap: bool


def on_due(cron: Cron, tz: ZoneInfo, due_ms: int, now_ms: int, running: bool) -> Due:
    """A due monitor at `now_ms` (its cron time `due_ms` passed): one check for it, the next
    fire after now, so a daemon that was down for hours runs one catch-up check, not a storm."""
    return Due(due_ms, next_fire(cron, tz, max(now_ms, due_ms)), running)
