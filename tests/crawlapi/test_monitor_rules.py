"""The monitors' pure rules, as tables: text schedules to cron, cron evaluated in IANA zones
(DST included), the shortest gap, jitter, what a due monitor does, a page's status and diff."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from daemon.crawl.monitors import compare as c
from daemon.crawl.monitors import models
from daemon.crawl.monitors import schedule as s

MIN = 60_000


def ms(text: str, tz: str = "UTC") -> int:
    local = datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(tz))
    return int(local.timestamp() * 1000)


@pytest.mark.parametrize(
    ("text", "cron", "interval_min"),
    [
        ("every 15 minutes", "*/15 * * * *", 15),
        ("Every 30 Minutes", "*/30 * * * *", 30),
        ("every 15 minutes starting at :05", "5-59/15 * * * *", 15),
        ("every 5 minutes starting at :07", "2-59/5 * * * *", 5),
        ("every 1 minute", "* * * * *", 1),
        ("hourly", "0 * * * *", 60),
        ("every hour at :30", "30 * * * *", 60),
        ("every 6 hours", "0 */6 * * *", 360),
        ("every 1 hour", "0 * * * *", 60),
        ("daily", "0 0 * * *", 1440),
        ("every day at 9am", "0 9 * * *", 1440),
        ("daily at 9:30pm", "30 21 * * *", 1440),
        ("daily, at 21:00", "0 21 * * *", 1440),
        ("daily at 12am", "0 0 * * *", 1440),
        ("daily at 12pm", "0 12 * * *", 1440),
        ("weekly", "0 0 * * 0", 10080),
        ("every week", "0 0 * * 0", 10080),
    ],
)
def test_text_forms_become_cron(text: str, cron: str, interval_min: int) -> None:
    parsed = s.parse_text(text)
    assert (parsed.cron, parsed.interval_ms) == (cron, interval_min * MIN)
    s.parse_cron(parsed.cron)


@pytest.mark.parametrize(
    "text",
    ["every 7 minutes", "every 0 minutes", "every 5 hours", "daily at 13pm", "daily at 25:00",
     "hourly at :75", "sometimes", "every 15 minutes starting at :99", ""],
)  # fmt: skip
def test_bad_text_forms(text: str) -> None:
    with pytest.raises(s.ScheduleError):
        s.parse_text(text)


@pytest.mark.parametrize(
    "cron",
    ["* * * *", "60 * * * *", "* 24 * * *", "* * 0 * *", "* * * 13 *", "* * * * 8",
     "*/0 * * * *", "5-1 * * * *", "x * * * *", "* * * * * *"],
)  # fmt: skip
def test_bad_cron(cron: str) -> None:
    with pytest.raises(s.ScheduleError):
        s.parse_cron(cron)


@pytest.mark.parametrize(
    ("cron", "tz", "after", "expected"),
    [
        ("*/15 * * * *", "UTC", "2026-03-01T10:07:13", "2026-03-01T10:15:00"),
        ("*/15 * * * *", "UTC", "2026-03-01T10:15:00", "2026-03-01T10:30:00"),
        ("0 9 * * *", "Europe/Paris", "2026-03-01T09:00:00", "2026-03-02T09:00:00"),
        ("0 9 * * *", "America/New_York", "2026-03-01T08:59:00", "2026-03-01T09:00:00"),
        ("0 0 * * 0", "UTC", "2026-03-02T00:00:00", "2026-03-08T00:00:00"),  # a Sunday
        ("0 0 * * sun", "UTC", "2026-03-02T00:00:00", "2026-03-08T00:00:00"),
        ("0 0 * * 7", "UTC", "2026-03-02T00:00:00", "2026-03-08T00:00:00"),
        ("0 12 1 jan,jul *", "UTC", "2026-03-02T00:00:00", "2026-07-01T12:00:00"),
        ("0 0 29 2 *", "UTC", "2026-03-01T00:00:00", "2028-02-29T00:00:00"),
        # day of month and day of week both restricted: either (the 13th, or a Friday)
        ("0 0 13 * 5", "UTC", "2026-03-01T00:00:00", "2026-03-06T00:00:00"),
        # 02:30 does not exist in Paris on 2026-03-29 (clocks jump 02:00 -> 03:00): skipped
        ("30 2 * * *", "Europe/Paris", "2026-03-28T03:00:00", "2026-03-30T02:30:00"),
    ],
)
def test_next_fire(cron: str, tz: str, after: str, expected: str) -> None:
    got = s.next_fire(s.parse_cron(cron), s.zone(tz), ms(after, tz))
    assert got == ms(expected, tz)


def test_a_repeated_local_hour_fires_once() -> None:
    # 2026-10-25 in Paris: 02:00-03:00 happens twice; "30 2 * * *" fires at its first 02:30.
    cron, tz = s.parse_cron("30 2 * * *"), s.zone("Europe/Paris")
    first = s.next_fire(cron, tz, ms("2026-10-25T00:00:00", "Europe/Paris"))
    assert first == int(datetime(2026, 10, 25, 0, 30, tzinfo=UTC).timestamp() * 1000)
    second = s.next_fire(cron, tz, first)
    assert second == ms("2026-10-26T02:30:00", "Europe/Paris")


@pytest.mark.parametrize("cron", ["*/20 * * * *", "30 2 * * *", "0 1-3 * * *", "15 9 * * 1-5"])
@pytest.mark.parametrize("after", ["2026-03-27T00:00:00", "2026-10-23T00:00:00"])
def test_fires_walks_the_same_times_as_next_fire_through_dst(cron: str, after: str) -> None:
    parsed, tz = s.parse_cron(cron), s.zone("Europe/Paris")
    walked = list(itertools.islice(s.fires(parsed, tz, ms(after, "Europe/Paris")), 400))
    at: int | None = ms(after, "Europe/Paris")
    stepped = []
    for _ in walked:
        at = s.next_fire(parsed, tz, at or 0)
        stepped.append(at)
    assert walked == stepped and walked == sorted(set(walked))


@pytest.mark.parametrize(
    ("cron", "gap_min"),
    [("*/5 * * * *", 5), ("0,1 * * * *", 1), ("0 9 * * *", 1440), ("0 */6 * * *", 360),
     ("0 9,21 * * 1-5", 12 * 60), ("* * * * *", 1)],
)  # fmt: skip
def test_shortest_gap(cron: str, gap_min: int) -> None:
    got = s.shortest_gap_ms(s.parse_cron(cron), s.zone("UTC"), ms("2026-03-01T00:00:00"))
    assert got == gap_min * MIN


def test_unknown_zone() -> None:
    with pytest.raises(s.ScheduleError, match="unknown time zone"):
        s.zone("Mars/Olympus")


@pytest.mark.parametrize(
    ("interval_min", "most_s"), [(5, 150), (60, 1800), (1440, 1800), (10080, 1800), (0, 0)]
)
def test_jitter_is_fixed_per_monitor_and_bounded(interval_min: int, most_s: int) -> None:
    ids = [f"monitor-{i}" for i in range(300)]
    offsets = [s.jitter_ms(i, interval_min * MIN) for i in ids]
    assert offsets == [s.jitter_ms(i, interval_min * MIN) for i in ids]
    assert all(0 <= o < max(most_s, 1) * 1000 and o % 1000 == 0 for o in offsets)
    if most_s:
        assert len(set(offsets)) > 50  # spread, not all at :00


@pytest.mark.parametrize(
    ("now", "running", "next_due", "overlap"),
    [
        ("2026-03-01T10:15:04", False, "2026-03-01T10:30:00", False),
        # down for hours: one check for the missed time, the next after now (no storm)
        ("2026-03-01T16:42:00", False, "2026-03-01T16:45:00", False),
        ("2026-03-01T10:15:04", True, "2026-03-01T10:30:00", True),
    ],
)
def test_on_due(now: str, running: bool, next_due: str, overlap: bool) -> None:
    due = s.on_due(s.parse_cron("*/15 * * * *"), s.zone("UTC"), ms("2026-03-01T10:15:00"),
                   ms(now), running)  # fmt: skip
    assert due == s.Due(ms("2026-03-01T10:15:00"), ms(next_due), overlap)


PREV = c.Previous("s1", "# Title\n\nPrice: 10\n", gone=False)
GONE = c.Previous("s1", "# Title\n", gone=True)


@pytest.mark.parametrize(
    ("previous", "markdown", "code", "error", "status", "keep", "gone"),
    [
        (None, "# Title\n", 200, None, "new", True, False),
        (PREV, "# Title\n\nPrice: 10\n", 200, None, "same", True, False),
        (PREV, "# Title\n\n  Price:   10\n", 200, None, "same", True, False),  # whitespace only
        (PREV, "# Title\n\nPrice: 12\n", 200, None, "changed", True, False),
        (PREV, "not found", 404, None, "removed", True, True),
        (PREV, "gone", 410, None, "removed", True, True),
        (GONE, "not found", 404, None, "same", False, False),
        (GONE, "# Title\n", 200, None, "new", True, False),  # back again
        (None, "not found", 404, None, "error", False, False),
        (PREV, "oops", 500, None, "error", False, False),
        (PREV, None, None, "connection refused", "error", False, False),
    ],
)
def test_page_outcome(
    previous: c.Previous | None, markdown: str | None, code: int | None, error: str | None,
    status: str, keep: bool, gone: bool,
) -> None:  # fmt: skip
    got = c.page_outcome(previous, markdown, code, error)
    assert (got.status, got.keep, got.gone) == (status, keep, gone)
    assert (got.diff is not None) == (status == "changed")
    assert (got.error is not None) == (status == "error")


def test_changed_page_diff() -> None:
    got = c.page_outcome(PREV, "# Title\n\nPrice: 12\n", 200, None)
    assert got.diff is not None
    assert got.diff["text"] == "@@ -1,3 +1,3 @@\n # Title\n \n-Price: 10\n+Price: 12\n"
    [chunk] = got.diff["json"]["files"][0]["chunks"]
    assert [ch["type"] for ch in chunk["changes"]] == ["normal", "normal", "del", "add"]


@pytest.mark.parametrize(
    ("statuses", "target_errors", "status"),
    [
        (["same", "changed", "new"], 0, "completed"),
        (["same", "error"], 0, "partial"),
        (["error", "error"], 0, "failed"),
        ([], 0, "completed"),
        ([], 1, "failed"),
        (["same"], 1, "partial"),
    ],
)
def test_check_status(statuses: list[str], target_errors: int, status: str) -> None:
    counts = c.summary(statuses)
    assert counts["totalPages"] == len(statuses)
    assert sum(counts[k] for k in c.PAGE_STATUSES) == len(statuses)
    assert c.check_status(counts, target_errors) == status


@pytest.mark.parametrize(
    ("markdown", "patterns", "expected"),
    [
        ("# News\n\nUpdated 2026-03-01\n\nBody\n", (r"Updated \d{4}-\d{2}-\d{2}",),
         "# News\n\n\nBody\n"),
        ("Visitors: 1234 today\n", (r"\d+",), "Visitors:  today\n"),
        ("a\nAD: buy now\nb\n", (r"AD: .*",), "a\nb\n"),
        ("unchanged\n", (), "unchanged\n"),
    ],
)  # fmt: skip
def test_ignore_patterns_drop_noise(
    markdown: str, patterns: tuple[str, ...], expected: str
) -> None:
    assert c.without_noise(markdown, patterns) == expected


def test_noise_alone_is_no_change() -> None:
    patterns = (r"\d+ visitors",)
    before = c.without_noise("# Shop\n\n42 visitors\n\nPrice: 10\n", patterns)
    after = c.without_noise("# Shop\n\n97 visitors\n\nPrice: 10\n", patterns)
    got = c.page_outcome(c.Previous("s", before, gone=False), after, 200, None)
    assert got.status == "same"


@pytest.mark.parametrize(
    ("given", "sent"),
    [
        ({"exclude_tags": [".ad"], "only_main_content": False},
         {"excludeTags": [".ad"], "onlyMainContent": False}),
        ({"excludeTags": ["nav"], "formats": ["markdown"]},
         {"excludeTags": ["nav"], "formats": ["markdown"]}),
        ({"no_such_key": 1}, {"no_such_key": 1}),  # left for the reader to refuse
    ],
)  # fmt: skip
def test_scrape_options_from_firecrawl_py_are_camel_cased(
    given: dict[str, object], sent: dict[str, object]
) -> None:
    assert models.camel_keys(given) == sent
