from __future__ import annotations

import pytest

from daemon.cluster import rules
from daemon.cluster.rules import Offers


def test_renewals_fit_three_times_in_a_lease() -> None:
    assert rules.renew_every_s(10.0) == pytest.approx(10 / 3)
    assert rules.poll_every_s(10.0) == 1.0
    assert rules.poll_every_s(2.0) == 0.5


@pytest.mark.parametrize(
    ("now", "renewal", "retry_at", "expected"),
    [
        (100.0, 103.0, None, 3.0),  # nothing wanted: until the renewal
        (100.0, 103.0, 101.5, 1.5),  # a wanted lease runs out first
        (100.0, 103.0, 107.0, 3.0),  # the renewal comes first (it tries the lease too)
        (100.0, 100.0, 99.0, 0.02),  # overdue: soon, never in a loop
    ],
)
def test_the_next_tick_is_the_renewal_or_when_a_wanted_lease_runs_out(
    now: float, renewal: float, retry_at: float | None, expected: float
) -> None:
    assert rules.tick_in(now, renewal, retry_at, 1.0) == pytest.approx(expected)


def test_a_renewal_is_trusted_from_when_it_was_sent() -> None:
    assert rules.local_deadline(100.0, 10.0) == 110.0


@pytest.mark.parametrize(
    ("expires", "now", "alive"), [(1000, 999, True), (1000, 1000, True), (1000, 1001, False)]
)
def test_alive(expires: int, now: int, alive: bool) -> None:
    assert rules.alive(expires, now) is alive


def test_lost_leases_are_the_held_ones_not_renewed() -> None:
    assert rules.lost_leases(["a", "b", "c"], ["a", "c"]) == {"b"}
    assert rules.lost_leases([], []) == set()


@pytest.mark.parametrize(
    ("total", "members", "share"), [(10, 3, 4), (3, 3, 1), (0, 2, 0), (5, 0, 5)]
)
def test_fair_share(total: int, members: int, share: int) -> None:
    assert rules.fair_share(total, members) == share


def test_digest_is_stable_and_hides_the_value() -> None:
    a = rules.digest({"url": "http://user:secret@relay", "rate": 5})
    assert a == rules.digest({"rate": 5, "url": "http://user:secret@relay"})
    assert "secret" not in a and len(a) == 12
    assert a != rules.digest({"url": "http://user:secret@relay", "rate": 6})


def test_disagreements_name_the_key_and_the_other_instance() -> None:
    mine = Offers(lease_ms=10_000, tasks={"t1": "aa", "t2": "bb"}, proxies={"relay": "r1"},
                  shared={"broker": "q1", "webhooks": "w1"})  # fmt: skip
    theirs = Offers(lease_ms=5_000, tasks={"t1": "aa", "t2": "XX", "t3": "cc"},
                    proxies={"relay": "r2"}, shared={"broker": "q1", "webhooks": "w2"})  # fmt: skip
    found = rules.disagreements(mine, "a", [("a", mine), ("b", theirs)])
    assert found == [
        "$.cluster.lease: 10s here, 5s on b",
        "$.collector.tasks: task 't2' is configured differently on b",
        "$.tracker.proxies: proxy 'relay' is configured differently on b",
        "$.webhooks: configured differently on b",
    ]
    assert rules.disagreements(mine, "a", [("c", mine)]) == []
