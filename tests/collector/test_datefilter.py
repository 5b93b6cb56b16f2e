from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from daemon.collector.config import CollectorConfig, TaskConfig
from daemon.collector.datefilter import (
    DAY_MS,
    DateCounts,
    DateRule,
    Judgement,
    expiration_ms,
    judge,
    keep,
    parse_record_time,
    ttl_ms,
)

SHANGHAI = ZoneInfo("Asia/Shanghai")
HOUR_MS = 3_600_000


def ms(
    year: int,
    month: int,
    day: int,
    hour: int = 0,
    minute: int = 0,
    second: int = 0,
    *,
    tz: ZoneInfo = SHANGHAI,
) -> int:
    return int(datetime(year, month, day, hour, minute, second, tzinfo=tz).timestamp() * 1000)


NOW = ms(2025, 3, 10, 15, 30)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("刚刚", NOW),
        ("刚才", NOW),
        ("just now", NOW),
        ("3秒前", NOW - 3_000),
        ("5分钟前", NOW - 5 * 60_000),
        ("5分前", NOW - 5 * 60_000),
        ("2小时前", NOW - 2 * HOUR_MS),
        ("2个小时前", NOW - 2 * HOUR_MS),
        ("半小时前", NOW - HOUR_MS // 2),
        ("3天前", NOW - 3 * DAY_MS),
        ("1周前", NOW - 7 * DAY_MS),
        ("3小时前发布", NOW - 3 * HOUR_MS),
        ("３小时前", NOW - 3 * HOUR_MS),
        ("2 hours ago", NOW - 2 * HOUR_MS),
        ("昨天 12:00", ms(2025, 3, 9, 12, 0)),
        ("昨天12:00", ms(2025, 3, 9, 12, 0)),
        ("昨天 12:00:30", ms(2025, 3, 9, 12, 0, 30)),
        ("昨天 １２：００", ms(2025, 3, 9, 12, 0)),
        ("昨天12点30分", ms(2025, 3, 9, 12, 30)),
        ("前天 08:30", ms(2025, 3, 8, 8, 30)),
        ("今天 09:00", ms(2025, 3, 10, 9, 0)),
        ("昨天", ms(2025, 3, 9)),
        ("03-09 10:00", ms(2025, 3, 9, 10, 0)),
        ("3-9 10:00", ms(2025, 3, 9, 10, 0)),
        ("12-31 23:00", ms(2024, 12, 31, 23, 0)),
        ("03-11 10:00", ms(2025, 3, 11, 10, 0)),
        ("1月5日", ms(2025, 1, 5)),
        ("1月5日 08:05", ms(2025, 1, 5, 8, 5)),
        ("12:00", ms(2025, 3, 10, 12, 0)),
        ("23:00", ms(2025, 3, 9, 23, 0)),
        ("2024-01-05", ms(2024, 1, 5)),
        ("2024-01-05 12:00:00", ms(2024, 1, 5, 12, 0)),
        ("2024-01-05 12:00", ms(2024, 1, 5, 12, 0)),
        ("2024-01-05T12:00:00Z", ms(2024, 1, 5, 12, 0, tz=ZoneInfo("UTC"))),
        ("2024-01-05T12:00:00+09:00", ms(2024, 1, 5, 12, 0, tz=ZoneInfo("Asia/Tokyo"))),
        ("2024-01-05T12:00:00.250+08:00", ms(2024, 1, 5, 12, 0) + 250),
        ("2024/1/5 8:05", ms(2024, 1, 5, 8, 5)),
        ("2024.01.05", ms(2024, 1, 5)),
        ("2024年1月5日 08:05", ms(2024, 1, 5, 8, 5)),
        ("2024年01月05日", ms(2024, 1, 5)),
        ("发布于 2024-01-05 12:00", ms(2024, 1, 5, 12, 0)),
        ("20240105", ms(2024, 1, 5)),
        ("20240105120000", ms(2024, 1, 5, 12, 0)),
        ("1700000000", 1_700_000_000_000),
        ("1700000000123", 1_700_000_000_123),
        ("1700000000.5", 1_700_000_000_500),
        (1_700_000_000, 1_700_000_000_000),
        (1_700_000_000_123, 1_700_000_000_123),
        (1_700_000_000.25, 1_700_000_000_250),
        (1_700_000_000_123_456, 1_700_000_000_123),
        ("  2024-01-05  ", ms(2024, 1, 5)),
    ],
)
def test_parses_absolute_relative_and_epoch_forms(value: object, expected: int) -> None:
    assert parse_record_time(value, now_ms=NOW) == expected


@pytest.mark.parametrize(
    "value",
    ["", "   ", "garbage", "2024-13-01", "02-30 10:00", "昨天 25:00", True, None, 0, -5, [], {}],
)
def test_unreadable_values_give_none(value: object) -> None:
    assert parse_record_time(value, now_ms=NOW) is None


def test_nan_and_infinity_give_none() -> None:
    assert parse_record_time(float("nan"), now_ms=NOW) is None
    assert parse_record_time(float("inf"), now_ms=NOW) is None


@pytest.mark.parametrize(
    ("value", "formats", "expected"),
    [
        ("05/01/2024 10:00", ["%d/%m/%Y %H:%M"], ms(2024, 1, 5, 10, 0)),
        ("05/01/2024 10:00", ["%Y", "%d/%m/%Y %H:%M"], ms(2024, 1, 5, 10, 0)),
        ("2024年01月05日 10时05分", ["%Y年%m月%d日 %H时%M分"], ms(2024, 1, 5, 10, 5)),
        ("12-31 10:00", ["%m-%d %H:%M"], ms(2024, 12, 31, 10, 0)),
        ("02-29 10:00", ["%m-%d %H:%M"], ms(2024, 2, 29, 10, 0)),
        ("2024-01-05 10:00 +0000", ["%Y-%m-%d %H:%M %z"], ms(2024, 1, 5, 18, 0)),
    ],
)
def test_task_formats_come_first(value: str, formats: list[str], expected: int) -> None:
    assert parse_record_time(value, now_ms=NOW, formats=formats) == expected


def test_naive_times_are_in_the_task_timezone() -> None:
    utc = parse_record_time("2024-01-05 12:00", now_ms=NOW, tz="UTC")
    shanghai = parse_record_time("2024-01-05 12:00", now_ms=NOW, tz="Asia/Shanghai")
    assert utc is not None and shanghai is not None
    assert utc - shanghai == 8 * HOUR_MS


def test_relative_days_follow_the_local_calendar() -> None:
    just_after_midnight = ms(2025, 3, 10, 0, 5)
    assert parse_record_time("昨天 23:00", now_ms=just_after_midnight, tz="Asia/Shanghai") == ms(
        2025, 3, 9, 23, 0
    )
    at_utc = parse_record_time("昨天 23:00", now_ms=just_after_midnight, tz="UTC")
    assert at_utc == int(datetime(2025, 3, 8, 23, 0, tzinfo=UTC).timestamp() * 1000)


@pytest.mark.parametrize(
    ("record", "days", "kept"),
    [
        (NOW, 7, True),
        (NOW + HOUR_MS, 7, True),
        (NOW - 7 * DAY_MS, 7, True),
        (NOW - 7 * DAY_MS - 1, 7, False),
        (NOW - 12 * HOUR_MS, 0.5, True),
        (NOW - 12 * HOUR_MS - 1, 0.5, False),
    ],
)
def test_keep_within_filter_days(record: int, days: float, kept: bool) -> None:
    assert keep(record, NOW, days) is kept


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (NOW, 7 * DAY_MS),
        (NOW - DAY_MS, 6 * DAY_MS),
        (NOW - 7 * DAY_MS + 1, 1),
        (NOW - 7 * DAY_MS, 0),
        (NOW - 8 * DAY_MS, -DAY_MS),
        (NOW + DAY_MS, 7 * DAY_MS),
    ],
)
def test_ttl_is_the_remaining_lifetime(record: int, expected: int) -> None:
    assert ttl_ms(record, NOW, 7) == expected


RULE = DateRule(field="发布时间", filter_days=7)


@pytest.mark.parametrize(
    ("row", "rule", "verdict", "publish"),
    [
        ({"发布时间": "3小时前"}, RULE, "recent", True),
        ({"发布时间": "2020-01-01"}, RULE, "expired", False),
        ({}, RULE, "missing", False),
        ({"发布时间": None}, RULE, "missing", False),
        ({"发布时间": "  "}, RULE, "missing", False),
        ({"发布时间": "soon"}, RULE, "unparseable", False),
        ({}, DateRule(field="发布时间", missing="keep"), "missing", True),
        ({"发布时间": "soon"}, DateRule(field="发布时间", missing="keep"), "unparseable", True),
        ({"发布时间": "2020-01-01"}, DateRule(field="发布时间", missing="keep"), "expired", False),
    ],
)
def test_judge_row(row: dict[str, object], rule: DateRule, verdict: str, publish: bool) -> None:
    judgement = judge(row, rule, NOW)
    assert (judgement.verdict, judgement.publish) == (verdict, publish)


def test_counts_add_up() -> None:
    counts = DateCounts()
    for value in ("3小时前", "2020-01-01", None, "x", "昨天 10:00"):
        counts.count(judge({"发布时间": value}, RULE, NOW))
    assert counts == DateCounts(recent=2, expired=1, missing=1, unparseable=1)
    total = DateCounts(recent=1)
    total.add(counts)
    assert total.recent == 3


@pytest.mark.parametrize(
    ("judgement", "ttl_from", "expected"),
    [
        (Judgement("recent", NOW - DAY_MS, True), "fixed", 604_800_000),
        (Judgement("recent", NOW - DAY_MS, True), "record", 6 * DAY_MS),
        (Judgement("recent", NOW - 7 * DAY_MS, True), "record", None),
        (Judgement("expired", NOW - 8 * DAY_MS, False), "fixed", None),
        (Judgement("missing", None, True), "record", 604_800_000),
        (Judgement("unparseable", None, False), "fixed", None),
    ],
)
def test_expiration(judgement: Judgement, ttl_from: str, expected: int | None) -> None:
    assert (
        expiration_ms(
            judgement,
            NOW,
            ttl_from=ttl_from,  # type: ignore[arg-type]
            filter_days=7,
            fixed_ttl_ms=604_800_000,
        )
        == expected
    )


def test_rule_from_task_config() -> None:
    collector = CollectorConfig(filter_days=3)
    task = TaskConfig(
        id="t", account="a", task_id="x", date_field="时间", date_formats=["%Y"], timezone="UTC"
    )
    assert DateRule.from_task(task, collector) == DateRule(
        field="时间", formats=("%Y",), timezone="UTC", filter_days=3, missing="drop"
    )
    custom = TaskConfig(
        id="t", account="a", task_id="x", date_field="时间", filter_days=1, missing_date="keep"
    )
    rule = DateRule.from_task(custom, collector)
    assert (rule.filter_days, rule.missing) == (1, "keep")


# --- the fast path for fixed shapes gives exactly what strptime would -----------------------------

_SHAPES = [
    "%Y-%m-%d %H:%M:%S",
    "%Y-%m-%d %H:%M",
    "%Y-%m-%d",
    "%Y/%m/%d %H:%M:%S",
    "%Y-%m-%dT%H:%M:%S",
    "%Y/%m/%d",
]


@pytest.mark.parametrize(
    "zone",
    ["Asia/Shanghai", "UTC", "America/New_York", "Europe/London", "Australia/Lord_Howe"],
)
def test_fixed_shapes_read_as_strptime_reads_them(zone: str) -> None:
    tz = ZoneInfo(zone)
    # Every 20 minutes over two days around each DST change of 2024 (Lord Howe moves by 30 min)
    # and on ordinary days: times in gaps and folds included.
    starts = [
        datetime(2024, 3, 9),
        datetime(2024, 4, 6),
        datetime(2024, 10, 5),
        datetime(2024, 11, 2),
    ]
    starts += [datetime(2024, 3, 30), datetime(2024, 10, 26), datetime(2024, 7, 1)]
    checked = 0
    for start in starts:
        for step in range(0, 48 * 60, 20):
            at = start + timedelta(minutes=step)
            for fmt in _SHAPES:
                text = at.strftime(fmt)
                want = round(datetime.strptime(text, fmt).replace(tzinfo=tz).timestamp() * 1000)
                assert parse_record_time(text, now_ms=NOW, tz=zone) == want, (text, zone)
                assert parse_record_time(text, now_ms=NOW, tz=zone, formats=[fmt]) == want
                checked += 1
    assert checked > 1000


@pytest.mark.parametrize(
    ("value", "formats", "expected"),
    [
        # a first task format of another shape wins over the fast path (day before month)
        ("2024-05-01", ["%Y-%d-%m"], datetime(2024, 1, 5, tzinfo=ZoneInfo("Asia/Shanghai"))),
        ("2024-13-01 00:00", [], None),  # out of range: the slow path decides (no date)
        ("2024-02-30", [], None),
        (
            "2024-02-29 23:59:59",
            [],
            datetime(2024, 2, 29, 23, 59, 59, tzinfo=ZoneInfo("Asia/Shanghai")),
        ),
        ("2024-05-01 24:00", [], None),
    ],
)
def test_fixed_shapes_defer_to_the_slow_path(
    value: str, formats: list[str], expected: datetime | None
) -> None:
    got = parse_record_time(value, now_ms=NOW, tz="Asia/Shanghai", formats=formats)
    assert got == (None if expected is None else round(expected.timestamp() * 1000))
