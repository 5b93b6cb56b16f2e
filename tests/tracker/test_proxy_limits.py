from __future__ import annotations

import pytest

from daemon.config_types import Duration
from daemon.net.ratelimit import (
    Window,
    conforming_within,
    conservative_tat,
    earliest_conforming,
    reserve_all,
    window_gcra,
)
from daemon.tracker.config import DEFAULT_BULK_LIMITS, DEFAULT_LIMITS, Limit
from daemon.tracker.proxy_limits import ProxyLimiter, window_key

W1 = Window(2, 1000)  # 2 per second
W2 = Window(3, 10_000)  # 3 per 10 s


def ms(tats_ms: list[int]) -> list[int]:
    return [w.scaled(t) for w, t in zip([W1, W2], tats_ms, strict=True)]


@pytest.mark.parametrize(
    ("tats", "now", "expected"),
    [
        ([0, 0], 0, [1000, 10_000]),  # TAT units: 1/2 ms and 1/3 ms
        ([1000, 10_000], 0, [2000, 20_000]),
        ([2000, 20_000], 0, None),  # first window full: nothing reserved
        ([0, 30_000], 0, None),  # second window full though the first has room
        ([0, 30_000], 3333, None),  # 1/3 ms short of one interval
        ([0, 30_000], 3334, [7668, 40_000]),
    ],
)
def test_reserve_all_table(tats: list[int], now: int, expected: list[int] | None) -> None:
    assert reserve_all(tats, now, [W1, W2]) == expected


def test_reserve_all_needs_one_tat_per_window() -> None:
    with pytest.raises(ValueError):
        reserve_all([0], 0, [W1, W2])


@pytest.mark.parametrize(
    ("tats_ms", "now", "expected"),
    [([0, 0], 5000, 5000), ([1000, 0], 0, 500), ([1000, 20_000], 0, 13_334)],
)
def test_earliest_conforming(tats_ms: list[int], now: int, expected: int) -> None:
    tats = ms(tats_ms)
    at = earliest_conforming(tats, now, [W1, W2])
    assert at == expected
    assert reserve_all(tats, at, [W1, W2]) is not None
    assert reserve_all(tats, at - 1, [W1, W2]) is None or at == now


def greedy_count(tats: list[int], now: int, end: int, margin_ms: int = 0) -> int:
    """Requests reserved ms by ms, as many as conform at each ms, before `end`."""
    count = 0
    for at in range(now, end):
        while (reserved := reserve_all(tats, at, [W1, W2], margin_ms)) is not None:
            tats, count = reserved, count + 1
    return count


@pytest.mark.parametrize(
    ("tats_ms", "now", "horizon", "margin", "expected"),
    [
        ([0, 0], 0, 1000, 0, 3),  # two at once, the third 500 ms later; then W2 is spent
        ([0, 0], 0, 500, 0, 2),  # the third would come at 500: in the next window
        ([0, 0], 0, 501, 0, 3),
        ([0, 0], 0, 10_000, 0, 5),  # W2: 3 at once, then one each 3 1/3 s
        ([0, 0], 0, 0, 0, 0),
        ([1000, 20_000], 0, 13_334, 0, 0),  # W2 full until 13 334
        ([1000, 20_000], 0, 13_335, 0, 1),
        ([0, 0], 0, 600, 0, 3),
        ([0, 0], 0, 600, 100, 2),  # a 100 ms margin: the second at 100 ms, the third at 600
        ([0, 0], 5000, 1000, 0, 3),  # idle history banks no more than the bursts
    ],
)
def test_conforming_within_table(
    tats_ms: list[int], now: int, horizon: int, margin: int, expected: int
) -> None:
    tats = ms(tats_ms)
    got = conforming_within(tats, now, [W1, W2], horizon, 100, margin)
    assert got == expected
    assert got == greedy_count(tats, now, now + horizon, margin)


def test_conforming_within_stops_at_the_limit_and_reserves_nothing() -> None:
    tats = ms([0, 0])
    assert conforming_within(tats, 0, [W1, W2], 10_000, 2) == 2
    assert conforming_within([], 0, [], 10_000, 7) == 7  # no window: only the limit
    assert tats == ms([0, 0])


def test_proxy_limiter_room_follows_its_windows() -> None:
    limiter = ProxyLimiter(
        [Limit(requests=2, per=Duration(1))], [Limit(requests=1, per=Duration(2))], now=0
    )
    limiter.restore({key: 0 for key in limiter.tats})
    assert limiter.room(0, 500, bulk=False, limit=10) == 2  # the third at 500 ms
    assert limiter.room(0, 1000, bulk=False, limit=10) == 3
    assert limiter.room(0, 1000, bulk=True, limit=10) == 1  # the bulk window allows one per 2 s
    assert limiter.try_acquire(0, bulk=True)
    assert limiter.room(0, 1000, bulk=True, limit=10) == 0
    assert limiter.room(0, 2001, bulk=True, limit=10) == 1
    assert limiter.room(0, 500, bulk=False, limit=10) == 1
    limiter.exhaust(0)
    assert limiter.room(0, 500, bulk=False, limit=10) == 0


def test_conservative_tat_allows_no_burst() -> None:
    tat = conservative_tat(100_000, W2)
    assert reserve_all([tat], 100_000, [W2]) is None
    assert earliest_conforming([tat], 100_000, [W2]) == 103_334


def test_window_rounds_stored_tats_up() -> None:
    assert Window(3, 10_000).to_ms(10) == 4
    assert Window(3, 10_000).to_ms(9) == 3
    with pytest.raises(ValueError):
        Window(0, 1000)


def run(limiter: ProxyLimiter, times: list[int], bulk: bool) -> list[bool]:
    return [limiter.try_acquire(t, bulk=bulk) for t in times]


def fresh(now: int = 1_700_000_000_000) -> ProxyLimiter:
    """A limiter whose history is known to be empty."""
    limiter = ProxyLimiter(DEFAULT_LIMITS, DEFAULT_BULK_LIMITS, now)
    limiter.restore(dict.fromkeys(limiter.tats, 0))
    return limiter


T0 = 1_700_000_000_000


def test_defaults_allow_a_burst_of_20_then_one_per_50ms() -> None:
    limiter = fresh()
    assert run(limiter, [T0] * 21, bulk=False) == [True] * 20 + [False]
    assert not limiter.try_acquire(T0 + 49, bulk=False)
    assert limiter.try_acquire(T0 + 50, bulk=False)
    assert not limiter.try_acquire(T0 + 50, bulk=False)


def test_bulk_requests_also_use_the_bulk_windows() -> None:
    limiter = fresh()
    assert run(limiter, [T0] * 6, bulk=True) == [True] * 5 + [False]
    # the common windows still have room for other tasks
    assert run(limiter, [T0] * 16, bulk=False) == [True] * 15 + [False]


def test_a_denied_bulk_request_spends_nothing() -> None:
    limiter = fresh()
    run(limiter, [T0] * 5, bulk=True)
    before = dict(limiter.tats)
    assert not limiter.try_acquire(T0, bulk=True)
    assert limiter.tats == before


@pytest.mark.parametrize(
    ("limits", "span", "most"),
    [(DEFAULT_LIMITS, 300_000, 2000 + 2000), (DEFAULT_BULK_LIMITS, 300_000, 200 + 200)],
)
def test_sustained_rate_never_exceeds_gcra_bound(limits: list[Limit], span: int, most: int) -> None:
    """GCRA with burst = N admits at most N + N·T/per in any span T (redis_rate semantics)."""
    limiter = fresh()
    bulk = limits is DEFAULT_BULK_LIMITS
    sent = 0
    for t in range(T0, T0 + span, 7):
        if limiter.try_acquire(t, bulk=bulk):
            sent += 1
    assert sent <= most
    assert sent >= most // 2  # not starved either


def test_unknown_history_is_conservative() -> None:
    limiter = ProxyLimiter(DEFAULT_LIMITS, DEFAULT_BULK_LIMITS, T0)
    assert not limiter.try_acquire(T0, bulk=False)
    assert limiter.available_at(T0, bulk=False) == T0 + 150  # 2000/5 min: one per 150 ms
    assert limiter.available_at(T0, bulk=True) == T0 + 1500  # 200/5 min: one per 1.5 s


def test_restore_keeps_only_windows_that_still_exist() -> None:
    old = fresh()
    run(old, [T0] * 3, bulk=False)
    changed = [Limit(requests=10, per=1.0), *DEFAULT_LIMITS[1:]]  # type: ignore[arg-type]
    new = ProxyLimiter(changed, DEFAULT_BULK_LIMITS, T0)
    new.take_over(old)
    kept = window_key("all", DEFAULT_LIMITS[1])
    assert new.tats[kept] == old.tats[kept]
    assert new.tats_ms()[window_key("all", changed[0])] == T0 + 1000  # conservative
    stored = ProxyLimiter(DEFAULT_LIMITS, DEFAULT_BULK_LIMITS, T0 + 5)
    stored.restore(old.tats_ms())
    assert stored.tats_ms() == old.tats_ms()


def test_exhaust_and_fill() -> None:
    limiter = fresh()
    assert all(w["fill"] == 0 for w in limiter.fill(T0))
    run(limiter, [T0] * 10, bulk=False)
    assert limiter.fill(T0)[0]["fill"] == 0.5
    limiter.exhaust(T0)
    assert all(w["fill"] == 1 for w in limiter.fill(T0))
    assert not limiter.try_acquire(T0, bulk=False)


def test_window_key_names_scope_and_size() -> None:
    assert window_key("all", DEFAULT_LIMITS[0]) == "all:20/1000ms"
    assert window_key("bulk", DEFAULT_BULK_LIMITS[2]) == "bulk:200/300000ms"


@pytest.mark.parametrize(
    ("window", "margin_ms", "burst", "next_ms"),
    [
        (Window(20, 1000), 0, 20, 50),
        (Window(20, 1000), 100, 18, 50),  # 100 ms of slack = 2 requests of 50 ms
        (Window(20, 1000), 120, 17, 20),  # the 20 ms left over come first
        (Window(5, 1000), 100, 4, 100),
        (Window(5, 1000), 250, 3, 50),
        (Window(1, 1000), 100, 1, 1000),  # a burst of one has no slack to give
    ],
)
def test_margin_shrinks_the_burst_not_the_rate(
    window: Window, margin_ms: int, burst: int, next_ms: int
) -> None:
    tat, sent = 0, 0
    while (new := window_gcra(tat, T0, window, margin_ms)) is not None:
        tat, sent = new, sent + 1
    assert sent == burst
    assert earliest_conforming([tat], T0, [window], margin_ms) == T0 + next_ms
    assert window_gcra(tat, T0 + next_ms, window, margin_ms) is not None
