# Which rows are recent enough to publish, and for how long a message should live.
#
# Octoparse rows carry no system timestamp: the record time is whatever the task scraped into one
# field, so it can be a strptime-shaped string, ISO 8601, unix seconds or milliseconds, or a
# Chinese relative form ("3小时前", "昨天 12:00", "刚刚"). Naive times are read in the task's
# timezone (Chinese sites and Bazhuayu cloud run at UTC+8). Relative forms need the current time,
# so `now_ms` is always passed in: the functions are pure and tested with tables of values.
# A missing or unparseable date is a verdict of its own so the crawler can count it and apply
# the task's policy (drop or keep) instead of confusing it with "expired".
#
# Speed: most rows carry one fixed shape (`2024-05-01 12:30:00`, `2024/05/01`, ...). Those are read
# by slicing digits and one cached UTC offset per zone and hour, before strptime and the regex
# chain; the fast path only answers where the slow one would give the same instant (no task
# format, or a first task format of the very same shape) and hands everything else to it.
from __future__ import annotations

import functools
import math
import re
import unicodedata
from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime, timedelta, tzinfo
from typing import TYPE_CHECKING, Any, Literal
from zoneinfo import ZoneInfo

import msgspec

if TYPE_CHECKING:
    from daemon.collector.config import CollectorConfig, TaskConfig

DAY_MS = 86_400_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

Verdict = Literal["recent", "expired", "missing", "unparseable"]


class DateRule(msgspec.Struct, frozen=True, kw_only=True):
    """One task's date settings."""

    field: str
    formats: tuple[str, ...] = ()
    timezone: str = "Asia/Shanghai"
    filter_days: float = 7.0
    missing: Literal["drop", "keep"] = "drop"
    """What to do with rows whose date is missing or unparseable."""

    @classmethod
    def from_task(cls, task: TaskConfig, collector: CollectorConfig) -> DateRule:
        return cls(
            field=task.date_field,
            formats=tuple(task.date_formats),
            timezone=task.timezone,
            filter_days=task.filter_days if task.filter_days is not None else collector.filter_days,
            missing=task.missing_date,
        )


class Judgement(msgspec.Struct, frozen=True):
    verdict: Verdict
    record_ms: int | None
    publish: bool


class DateCounts(msgspec.Struct):
    """Running totals of verdicts, for /status and /metrics."""

    recent: int = 0
    expired: int = 0
    missing: int = 0
    unparseable: int = 0

    def count(self, judgement: Judgement) -> None:
        setattr(self, judgement.verdict, getattr(self, judgement.verdict) + 1)

    def add(self, other: DateCounts) -> None:
        self.recent += other.recent
        self.expired += other.expired
        self.missing += other.missing
        self.unparseable += other.unparseable


def judge(row: Mapping[str, Any], rule: DateRule, now_ms: int) -> Judgement:
    """Decide one row: its record time and whether it is published."""
    value = row.get(rule.field)
    if value is None or (isinstance(value, str) and not value.strip()):
        return Judgement("missing", None, rule.missing == "keep")
    record_ms = parse_record_time(value, now_ms=now_ms, tz=rule.timezone, formats=rule.formats)
    if record_ms is None:
        return Judgement("unparseable", None, rule.missing == "keep")
    if keep(record_ms, now_ms, rule.filter_days):
        return Judgement("recent", record_ms, True)
    return Judgement("expired", record_ms, False)


def keep(record_ms: int, now_ms: int, filter_days: float) -> bool:
    """A record is kept while now - record_time <= filter_days (future times are kept)."""
    return now_ms - record_ms <= round(filter_days * DAY_MS)


def ttl_ms(record_ms: int, now_ms: int, filter_days: float) -> int:
    """Remaining lifetime of a record (`ttl_from = "record"`); <= 0 means do not publish.

    Capped at the whole filter window so a record dated in the future cannot outlive it."""
    window = round(filter_days * DAY_MS)
    return min(record_ms + window - now_ms, window)


def expiration_ms(
    judgement: Judgement,
    now_ms: int,
    *,
    ttl_from: Literal["fixed", "record"],
    filter_days: float,
    fixed_ttl_ms: int,
) -> int | None:
    """The message's `expiration` in ms, or None when the row must not be published."""
    if not judgement.publish:
        return None
    if ttl_from == "fixed" or judgement.record_ms is None:
        return fixed_ttl_ms
    remaining = ttl_ms(judgement.record_ms, now_ms, filter_days)
    return remaining if remaining > 0 else None


class Kept(msgspec.Struct):
    """What a window's rows become: the rows to publish with their expiry, the verdicts of
    every row, and the judgements of the rows dropped."""

    rows: list[tuple[dict[str, Any], int]]
    counts: DateCounts
    dropped: list[Judgement]


def keep_rows(
    rows: Sequence[dict[str, Any]],
    rule: DateRule,
    now_ms: int,
    *,
    ttl_from: Literal["fixed", "record"],
    fixed_ttl_ms: int,
) -> Kept:
    """Judge each row of a window and keep the ones to publish, in order, with their expiry."""
    kept = Kept([], DateCounts(), [])
    for row in rows:
        judgement = judge(row, rule, now_ms)
        kept.counts.count(judgement)
        ttl = expiration_ms(
            judgement,
            now_ms,
            ttl_from=ttl_from,
            filter_days=rule.filter_days,
            fixed_ttl_ms=fixed_ttl_ms,
        )
        if ttl is not None:
            kept.rows.append((row, ttl))
        else:
            kept.dropped.append(judgement)
    return kept


def parse_record_time(
    value: object,
    *,
    now_ms: int,
    tz: str | tzinfo = "Asia/Shanghai",
    formats: Sequence[str] = (),
) -> int | None:
    """Epoch ms of a row's date value, or None when it cannot be read.

    Tries the task's strptime `formats` first (a format without a year takes the latest year
    that is not in the future), then unix seconds/ms, relative Chinese forms, ISO 8601 and common
    `YYYY-MM-DD HH:MM` / `YYYY年M月D日` / `MM-DD HH:MM` shapes. Naive times are in `tz`."""
    zone = _zone(tz) if isinstance(tz, str) else tz
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return _from_epoch(float(value))
    if not isinstance(value, str):
        return None
    raw = value.strip()
    if (fixed := _FIXED.fullmatch(raw)) is not None and (
        not formats or _format_shape(formats[0]) == _value_shape(fixed)
    ):
        fast = _fixed_ms(fixed, zone)
        if fast is not None:
            return fast
    text = unicodedata.normalize("NFKC", raw).strip()
    if not text:
        return None
    now = datetime.fromtimestamp(now_ms / 1000, zone)
    for fmt in formats:
        for candidate in dict.fromkeys((raw, text)):
            try:
                parsed = datetime.strptime(candidate, fmt)
            except ValueError:
                continue
            if not _has_year(fmt):
                parsed = _latest_past_year(parsed, now)
            return _to_ms(parsed, zone)
    return _parse_builtin(text, now_ms, now, zone)


@functools.lru_cache(maxsize=64)
def _zone(name: str) -> tzinfo:
    return ZoneInfo(name)


_FIXED = re.compile(
    r"(\d{4})([-/])(\d{2})\2(\d{2})(?:([ T])(\d{2}):(\d{2})(?::(\d{2}))?)?", re.ASCII
)
_FIXED_FORMAT = re.compile(r"%Y([-/])%m\1%d(?:([ T])%H:%M(:%S)?)?")
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_HOURS: dict[tuple[tzinfo, str], int | None] = {}
_HOURS_MAX = 4096
_VARIES = -1
"""`_HOURS` value for an hour in which the zone's offset changes (each time is worked out)."""


def _value_shape(m: re.Match[str]) -> tuple[str, str | None, bool]:
    return m[2], m[5], m[8] is not None


@functools.lru_cache(maxsize=256)
def _format_shape(fmt: str) -> tuple[str, str | None, bool] | None:
    """The fixed shape a strptime format stands for (None: not one the fast path knows)."""
    m = _FIXED_FORMAT.fullmatch(fmt)
    return None if m is None else (m[1], m[2], m[3] is not None)


def _fixed_ms(m: re.Match[str], zone: tzinfo) -> int | None:
    """Epoch ms of a `_FIXED` match read in `zone`; None when a field is out of range. The
    instant of each (zone, date, hour) is worked out once and cached."""
    minute, second = int(m[7] or 0), int(m[8] or 0)
    if minute > 59 or second > 59:
        return None
    key = (zone, f"{m[1]}{m[3]}{m[4]}{m[6]}")
    try:
        base = _HOURS[key]
    except KeyError:
        if len(_HOURS) >= _HOURS_MAX:
            _HOURS.clear()
        base = _HOURS[key] = _hour_start_ms(int(m[1]), int(m[3]), int(m[4]), int(m[6] or 0), zone)
    if base is None:
        return None
    if base == _VARIES:
        return _exact_ms(int(m[1]), int(m[3]), int(m[4]), int(m[6] or 0), minute, second, zone)
    return base + minute * 60_000 + second * 1000


def _hour_start_ms(year: int, month: int, day: int, hour: int, zone: tzinfo) -> int | None:
    """Epoch ms of hour:00:00 on that local date; None when out of range, _VARIES when the
    zone's offset is not the same for the whole hour."""
    if hour > 23:
        return None
    try:
        start = datetime(year, month, day, hour, tzinfo=zone)
    except ValueError:
        return None
    if start.utcoffset() != datetime(year, month, day, hour, 59, 59, tzinfo=zone).utcoffset():
        return _VARIES
    return _exact_ms(year, month, day, hour, 0, 0, zone)


def _exact_ms(
    year: int, month: int, day: int, hour: int, minute: int, second: int, zone: tzinfo
) -> int:
    days = date(year, month, day).toordinal() - _EPOCH_ORDINAL
    local_s = ((days * 24 + hour) * 60 + minute) * 60 + second
    offset = datetime(year, month, day, hour, minute, second, tzinfo=zone).utcoffset()
    return local_s * 1000 - (offset or timedelta(0)) // timedelta(milliseconds=1)


def _from_epoch(number: float) -> int | None:
    if not math.isfinite(number) or number <= 0:
        return None
    if number >= 1e14:
        return int(number // 1000)
    if number >= 1e11:
        return int(number)
    return round(number * 1000)


_DIGITS = re.compile(r"\d+(?:\.\d+)?")
_COMPACT = {8: "%Y%m%d", 12: "%Y%m%d%H%M", 14: "%Y%m%d%H%M%S"}
_JUST_NOW = re.compile(r"^(?:刚刚|刚才|just now|now)$", re.IGNORECASE)
_AGO_UNITS_MS = {
    "秒": 1_000,
    "秒钟": 1_000,
    "分": 60_000,
    "分钟": 60_000,
    "小时": 3_600_000,
    "个小时": 3_600_000,
    "钟头": 3_600_000,
    "天": DAY_MS,
    "日": DAY_MS,
    "周": 7 * DAY_MS,
    "星期": 7 * DAY_MS,
    "个星期": 7 * DAY_MS,
    "个月": 30 * DAY_MS,
    "月": 30 * DAY_MS,
    "年": 365 * DAY_MS,
    "second": 1_000,
    "sec": 1_000,
    "minute": 60_000,
    "min": 60_000,
    "hour": 3_600_000,
    "day": DAY_MS,
    "week": 7 * DAY_MS,
}
_AGO = re.compile(
    r"(\d+(?:\.\d+)?|半)\s*(秒钟|秒|分钟|分|个小时|小时|钟头|天|日|个星期|星期|周|个月|月|年)\s*(?:以)?前"
    r"|(\d+)\s*(second|sec|minute|min|hour|day|week)s?\s+ago",
    re.IGNORECASE,
)
_DAY_WORDS = {"今天": 0, "昨天": 1, "前天": 2, "today": 0, "yesterday": 1}
_DAY_WORD = re.compile(
    r"(今天|昨天|前天|today|yesterday)\s*(?:(\d{1,2})\s*[:点时]\s*(\d{1,2})?\s*分?(?::(\d{1,2}))?)?",
    re.IGNORECASE,
)
_TIME = r"(?:\s*T?\s*(\d{1,2}):(\d{1,2})(?::(\d{1,2})(?:\.\d+)?)?)?"
_FULL_DATE = re.compile(
    r"(?<!\d)(\d{4})\s*[-/.年]\s*(\d{1,2})\s*[-/.月]\s*(\d{1,2})\s*日?" + _TIME + r"(?!\d)"
)
_NO_YEAR = re.compile(r"(?<![\d\-/.])(\d{1,2})\s*[-/月]\s*(\d{1,2})\s*日?" + _TIME + r"(?![\d\-/])")
_TIME_ONLY = re.compile(r"^(\d{1,2}):(\d{2})(?::(\d{2}))?$")


def _parse_builtin(text: str, now_ms: int, now: datetime, zone: tzinfo) -> int | None:
    if _DIGITS.fullmatch(text):
        if "." not in text and (fmt := _COMPACT.get(len(text))):
            try:
                return _to_ms(datetime.strptime(text, fmt), zone)
            except ValueError:
                return None
        return _from_epoch(float(text))
    if _JUST_NOW.match(text):
        return now_ms
    if m := _AGO.search(text):
        if m.group(1):
            amount = 0.5 if m.group(1) == "半" else float(m.group(1))
            unit = _AGO_UNITS_MS[m.group(2)]
        else:
            amount, unit = float(m.group(3)), _AGO_UNITS_MS[m.group(4).lower()]
        return now_ms - round(amount * unit)
    if m := _DAY_WORD.search(text):
        day = now.date() - timedelta(days=_DAY_WORDS[m.group(1).lower()])
        try:
            at = _at(day.year, day.month, day.day, *m.group(2, 3, 4))
        except ValueError:
            return None
        return _to_ms(at, zone)
    try:
        return _to_ms(datetime.fromisoformat(text), zone)
    except ValueError:
        pass
    try:
        if m := _FULL_DATE.search(text):
            year, month, day_of_month = (int(g) for g in m.group(1, 2, 3))
            at = _at(year, month, day_of_month, *m.group(4, 5, 6))
            return _to_ms(at, zone)
        if m := _NO_YEAR.search(text):
            at = _at(2000, int(m.group(1)), int(m.group(2)), *m.group(3, 4, 5))
            return _to_ms(_latest_past_year(at, now), zone)
        if m := _TIME_ONLY.match(text):
            at = _at(now.year, now.month, now.day, *m.group(1, 2, 3))
            if at > now.replace(tzinfo=None) + timedelta(hours=1):
                at -= timedelta(days=1)
            return _to_ms(at, zone)
    except ValueError:
        return None
    return None


def _at(year: int, month: int, day: int, *clock: str | None) -> datetime:
    """A naive datetime from regex groups; missing hour/minute/second groups are 0."""
    hour, minute, second = (int(g) if g else 0 for g in (*clock, None, None, None)[:3])
    return datetime(year, month, day, hour, minute, second)


def _has_year(fmt: str) -> bool:
    return any(d in fmt for d in ("%Y", "%y", "%G", "%c", "%x", "%s"))


def _latest_past_year(at: datetime, now: datetime) -> datetime:
    """`at` in the latest year that does not put it more than a day after `now`."""
    limit = now.replace(tzinfo=None) + timedelta(days=1)
    for year in range(now.year, now.year - 8, -1):
        try:
            candidate = at.replace(year=year)
        except ValueError:
            continue
        if candidate <= limit:
            return candidate
    return at


def _to_ms(at: datetime, zone: tzinfo) -> int:
    if at.tzinfo is None:
        at = at.replace(tzinfo=zone)
    return (at - _EPOCH) // timedelta(milliseconds=1)
