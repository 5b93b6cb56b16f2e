"""The console's pure rules beyond sessions: the login's wrong-key limit per address and the
queue's per-minute history, with plain values and a fake clock."""

from __future__ import annotations

from daemon.ui.history import MINUTE_MS, QueueHistory
from daemon.ui.login_limit import LoginLimits


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_wrong_keys_are_limited_per_address() -> None:
    clock = Clock()
    limits = LoginLimits(clock, rate=1 / 12, burst=5)
    for _ in range(5):
        assert limits.retry_after("10.0.0.1") == 0
        limits.wrong_key("10.0.0.1")
    assert limits.retry_after("10.0.0.1") == 12
    assert limits.retry_after("10.0.0.2") == 0  # another address is not held back
    clock.now += 11.5
    assert limits.retry_after("10.0.0.1") == 1  # whole seconds, rounded up
    clock.now += 0.5
    assert limits.retry_after("10.0.0.1") == 0
    limits.wrong_key("10.0.0.1")
    assert limits.retry_after("10.0.0.1") == 12  # one attempt back per 12 s, not the burst
    clock.now += 60
    assert limits.retry_after("10.0.0.1") == 0


def test_the_limit_forgets_spent_addresses_first() -> None:
    clock = Clock()
    limits = LoginLimits(clock, rate=1.0, burst=1, max_addresses=3)
    for address in ("a", "b", "c"):
        limits.wrong_key(address)
    clock.now += 0.5
    limits.wrong_key("d")  # a, b and c are still limited: the oldest goes
    assert len(limits) == 3 and limits.retry_after("a") == 0 and limits.retry_after("d") == 1
    clock.now += 5
    limits.wrong_key("e")  # everything else recovered: all of it goes
    assert len(limits) == 1


def test_queue_history_counts_per_minute() -> None:
    history = QueueHistory(minutes=3)
    t0 = 10 * MINUTE_MS
    history.observe(t0 + 1_000, 100, 90)  # the first reading is the baseline
    history.observe(t0 + 30_000, 104, 92)
    history.observe(t0 + MINUTE_MS + 5_000, 110, 110)
    series = history.series(t0 + 2 * MINUTE_MS + 1)
    assert [m["minute_ms"] for m in series] == [t0, t0 + MINUTE_MS, t0 + 2 * MINUTE_MS]
    assert [(m["published"], m["delivered"], m["depth"]) for m in series] == [
        (4, 2, 12), (6, 18, 0), (None, None, None)
    ]  # fmt: skip
    history.observe(t0 + 5 * MINUTE_MS, 7, 7)  # the stream went back: start over, count nothing
    series = history.series(t0 + 5 * MINUTE_MS)
    assert [m["published"] for m in series] == [None, None, 0]
    assert len(history._by_minute) == 1  # older minutes are dropped
