"""keep_rows: a window's rows judged with plain values (the crawler publishes what it keeps)."""

from __future__ import annotations

from daemon.collector.datefilter import DateRule, keep_rows

NOW = 1_714_500_000_000  # 2024-04-30T18:00:00Z
HOUR_MS = 3_600_000
RULE = DateRule(field="t", filter_days=7, timezone="UTC")


def test_keeps_recent_rows_in_order_with_their_expiry_and_counts_the_rest() -> None:
    rows = [
        {"t": "3小时前", "n": 1},
        {"t": "2020-01-01", "n": 2},
        {"n": 3},
        {"t": "刚刚", "n": 4},
    ]
    fixed = keep_rows(rows, RULE, NOW, ttl_from="fixed", fixed_ttl_ms=123)
    assert [(r["n"], ttl) for r, ttl in fixed.rows] == [(1, 123), (4, 123)]
    assert [j.verdict for j in fixed.dropped] == ["expired", "missing"]
    assert (fixed.counts.recent, fixed.counts.expired, fixed.counts.missing) == (2, 1, 1)

    by_record = keep_rows(rows, RULE, NOW, ttl_from="record", fixed_ttl_ms=123)
    assert [r["n"] for r, _ in by_record.rows] == [1, 4]
    ttl_first = by_record.rows[0][1]
    assert ttl_first == 7 * 24 * HOUR_MS - 3 * HOUR_MS
