from __future__ import annotations

import random

import pytest

from daemon.jobs.retry import (
    DEFAULT_SCHEDULE,
    Decision,
    Resume,
    decide,
    jittered,
    longest_wait,
    next_attempt_ms,
    parse_retry_after,
    resume,
)

NOW = 1_445_412_480.0  # Wed, 21 Oct 2015 07:28:00 GMT
SCHEDULE = DEFAULT_SCHEDULE


class Fixed:
    """A random source that always returns `value` (0.5 → no jitter)."""

    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


MID = Fixed(0.5)


@pytest.mark.parametrize(
    ("attempt", "status", "error", "retry_after", "expected"),
    [
        (1, 200, None, None, Decision("delivered")),
        (1, 204, None, None, Decision("delivered")),
        (6, 299, None, None, Decision("delivered")),
        (1, 500, None, None, Decision("retry", 5.0, "HTTP 500")),
        (2, 503, None, None, Decision("retry", 60.0, "HTTP 503")),
        (3, 404, None, None, Decision("retry", 300.0, "HTTP 404")),
        (4, 301, None, None, Decision("retry", 900.0, "HTTP 301")),
        (5, 302, None, None, Decision("retry", 3600.0, "HTTP 302")),
        (1, 199, None, None, Decision("retry", 5.0, "HTTP 199")),
        (1, None, "timeout", None, Decision("retry", 5.0, "timed out")),
        (1, None, "connect", None, Decision("retry", 5.0, "connection failed")),
        (1, None, "dns", None, Decision("retry", 5.0, "host did not resolve")),
        (1, None, "network", None, Decision("retry", 5.0, "network error")),
        (1, 429, None, "120", Decision("retry", 120.0, "HTTP 429")),
        (1, 429, None, "2", Decision("retry", 5.0, "HTTP 429")),
        (1, 503, None, "Wed, 21 Oct 2015 07:38:00 GMT", Decision("retry", 600.0, "HTTP 503")),
        (1, 429, None, "86400", Decision("retry", 3600.0, "HTTP 429")),
        (1, 429, None, "soon", Decision("retry", 5.0, "HTTP 429")),
        (1, 410, None, None, Decision("gone", 0.0, "HTTP 410 (Gone) on attempt 1; not retried")),
        (4, 410, None, "60", Decision("gone", 0.0, "HTTP 410 (Gone) on attempt 4; not retried")),
        (6, 500, None, None, Decision("failed", 0.0, "gave up after 6 attempts; last: HTTP 500")),
        (
            6,
            None,
            "timeout",
            None,
            Decision("failed", 0.0, "gave up after 6 attempts; last: timed out"),
        ),
        (2, None, "blocked", None, Decision("blocked", 0.0, "address blocked (not allowed)")),
    ],
)
def test_decide_table(
    attempt: int,
    status: int | None,
    error: str | None,
    retry_after: str | None,
    expected: Decision,
) -> None:
    got = decide(attempt, status, error, retry_after, NOW, SCHEDULE, MID)  # type: ignore[arg-type]
    assert got == expected
    assert got.final is (expected.kind != "retry")


def test_blocked_reason_carries_the_detail() -> None:
    got = decide(1, None, "blocked", None, NOW, SCHEDULE, MID, reason_detail="loopback 127.0.0.1")
    assert got == Decision("blocked", reason="address blocked (loopback 127.0.0.1)")


def test_detail_is_added_to_a_final_failure() -> None:
    got = decide(2, None, "connect", None, NOW, [1.0], MID, reason_detail="refused")
    assert got.reason == "gave up after 2 attempts; last: connection failed: refused"


def test_custom_and_empty_schedules() -> None:
    assert decide(1, 500, None, None, NOW, [0.01, 0.02], MID) == Decision("retry", 0.01, "HTTP 500")
    assert decide(2, 500, None, None, NOW, [0.01, 0.02], MID).delay == pytest.approx(0.02)
    assert decide(3, 500, None, None, NOW, [0.01, 0.02], MID).kind == "failed"
    assert decide(1, 500, None, None, NOW, [], MID) == Decision(
        "failed", reason="gave up after 1 attempt; last: HTTP 500"
    )


def test_retry_after_cap_is_configurable() -> None:
    got = decide(1, 429, None, "100", NOW, SCHEDULE, MID, retry_after_cap=30.0)
    assert got.delay == 30.0


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", None),
        ("   ", None),
        ("0", 0.0),
        ("120", 120.0),
        (" 7 ", 7.0),
        ("-1", None),
        ("1.5", None),
        ("tomorrow", None),
        ("99999999", 3600.0),
        ("Wed, 21 Oct 2015 07:28:30 GMT", 30.0),
        ("Wednesday, 21-Oct-15 07:29:00 GMT", 60.0),
        ("Wed Oct 21 07:29:00 2015", 60.0),
        ("Wed, 21 Oct 2015 07:28:45 -0000", 45.0),
        ("Wed, 21 Oct 2015 08:28:00 +0100", 0.0),
        ("Wed, 21 Oct 2015 07:00:00 GMT", 0.0),
        ("Thu, 22 Oct 2015 07:28:00 GMT", 3600.0),
    ],
)
def test_parse_retry_after(value: str | None, expected: float | None) -> None:
    assert parse_retry_after(value, NOW) == expected


@pytest.mark.parametrize(("value", "factor"), [(0.0, 0.8), (0.5, 1.0), (0.25, 0.9)])
def test_jitter_bounds(value: float, factor: float) -> None:
    assert jittered(100.0, Fixed(value)) == pytest.approx(100.0 * factor)


def test_jitter_spreads_within_twenty_percent() -> None:
    rng = random.Random(7)
    delays = [decide(2, 500, None, None, NOW, SCHEDULE, rng).delay for _ in range(1000)]
    assert all(48.0 <= d < 72.0 for d in delays)
    assert max(delays) - min(delays) > 20.0


@pytest.mark.parametrize(
    ("attempt", "status", "error"), [(0, 500, None), (1, None, None), (-1, None, "timeout")]
)
def test_decide_rejects_bad_input(attempt: int, status: int | None, error: str | None) -> None:
    with pytest.raises(ValueError):
        decide(attempt, status, error, None, NOW, SCHEDULE, MID)  # type: ignore[arg-type]


# Continuing a schedule stored by an earlier drainer (a restart, another instance).
NOW_MS = 1_700_000_000_000


@pytest.mark.parametrize(
    ("seq", "stored", "expected"),
    [
        (1, None, Resume(1, 0.0)),  # nothing stored: a first attempt, now
        (3, (2, 4, NOW_MS + 60_000), Resume(1, 0.0)),  # a row about another event is stale
        (3, (3, 0, NOW_MS + 60_000), Resume(1, 0.0)),  # no attempt was made
        (3, (3, 3, NOW_MS + 60_000), Resume(4, 60.0)),  # attempt 4, at its time
        (3, (3, 3, NOW_MS + 250), Resume(4, 0.25)),
        (3, (3, 5, NOW_MS - 10_000), Resume(6, 0.0)),  # overdue: at once, still attempt 6
        (3, (3, 5, NOW_MS), Resume(6, 0.0)),
        # Further away than the schedule can set (the clock stepped back): the longest wait.
        (3, (3, 2, NOW_MS + 86_400_000), Resume(3, 4320.0)),
    ],
)
def test_resume_continues_the_stored_schedule(
    seq: int, stored: tuple[int, int, int] | None, expected: Resume
) -> None:
    stored_seq, attempts, next_ms = stored or (None, 0, 0)
    got = resume(seq, stored_seq, attempts, next_ms, NOW_MS, SCHEDULE)
    assert got == expected


def test_longest_wait_is_the_jittered_longest_delay_or_the_retry_after_cap() -> None:
    assert longest_wait(SCHEDULE) == pytest.approx(3600.0 * 1.2)
    assert longest_wait([1.0, 2.0]) == 3600.0  # a Retry-After may ask for up to its cap
    assert longest_wait([1.0, 2.0], retry_after_cap=1.0) == pytest.approx(2.4)
    assert longest_wait([]) == 3600.0


@pytest.mark.parametrize(
    ("delay", "expected"), [(0.0, NOW_MS), (5.0, NOW_MS + 5000), (0.0001, NOW_MS + 1)]
)
def test_next_attempt_time_is_never_early(delay: float, expected: int) -> None:
    assert next_attempt_ms(NOW_MS, delay) == expected


def test_a_stored_schedule_reaches_the_same_final_outcome() -> None:
    # Attempts 1-3 before a restart, 4-6 after: the sixth is the last, as without the restart.
    plan = resume(1, 1, 3, NOW_MS, NOW_MS, SCHEDULE)
    assert plan.attempt == 4
    assert decide(plan.attempt, 500, None, None, NOW, SCHEDULE, MID).kind == "retry"
    assert decide(6, 500, None, None, NOW, SCHEDULE, MID).reason == (
        "gave up after 6 attempts; last: HTTP 500"
    )
