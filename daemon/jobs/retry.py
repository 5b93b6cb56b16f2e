# What to do after one webhook attempt, as a pure function of its result, the retry schedule,
# the clock and a random source. Keeping it pure lets the drainer stay a thin loop (send, decide,
# sleep) and lets every rule be tested as a table.
#
# Rules (spec "Delivery" 7, Standard Webhooks 3.2): only 2xx is delivered. Timeouts, connection
# errors, unresolvable hosts, 5xx, 429 and every other non-2xx (3xx included: redirects are not
# followed) are retried after schedule[n-1] seconds with ±20 % jitter, so many jobs failing at
# once do not retry in lockstep. `Retry-After` sets a floor on that wait (capped, so a receiver
# cannot park an event for days). 410 Gone stops at once and is its own outcome, `gone`: the
# drainer then stops sending to that endpoint for the whole job. A blocked address is never retried.
# After len(schedule) retries the event has its final outcome: failed.
#
# The schedule outlives a process: after each retried attempt the drainer stores the attempts
# made and the time of the next one (`next_attempt_ms`), and whoever drains the job next (after a
# restart, a reload, or on another instance) continues from there (`resume`): the next attempt
# keeps its number and is not sent before its time. A stored time further away than the schedule
# could ever have set (the wall clock stepped back) is cut to that longest wait.
from __future__ import annotations

import datetime
import email.utils
import math
from collections.abc import Sequence
from typing import Literal, Protocol

import msgspec

DEFAULT_SCHEDULE: tuple[float, ...] = (5.0, 60.0, 300.0, 900.0, 3600.0)
DEFAULT_RETRY_AFTER_CAP = 3600.0
JITTER = 0.2

DecisionKind = Literal["delivered", "retry", "failed", "blocked", "gone"]
ErrorKind = Literal["timeout", "connect", "dns", "network", "blocked"]

_ERROR_TEXT: dict[str, str] = {
    "timeout": "timed out",
    "connect": "connection failed",
    "dns": "host did not resolve",
    "network": "network error",
}


class Random(Protocol):
    def random(self) -> float: ...


class Decision(msgspec.Struct, frozen=True):
    kind: DecisionKind
    delay: float = 0.0
    """Seconds to wait before the next attempt (only for `retry`)."""
    reason: str = ""
    """For a final kind other than `delivered`: why the event was not delivered (job error, log)."""

    @property
    def final(self) -> bool:
        return self.kind != "retry"


def parse_retry_after(
    value: str | None, now: float, cap: float = DEFAULT_RETRY_AFTER_CAP
) -> float | None:
    """Seconds to wait from a `Retry-After` value (delta-seconds or HTTP-date), clamped to
    [0, cap]; None when absent or unparseable. `now` is Unix seconds."""
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    if text.isdigit():
        return min(float(text), cap)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return min(max(when.timestamp() - now, 0.0), cap)


class Resume(msgspec.Struct, frozen=True):
    """Where a drainer picks up an event's schedule."""

    attempt: int
    """The number of the next attempt (1: the first send)."""
    wait: float
    """Seconds to wait before sending it."""


def longest_wait(
    schedule: Sequence[float], retry_after_cap: float = DEFAULT_RETRY_AFTER_CAP
) -> float:
    """The longest wait `decide` can set with `schedule`: its longest delay with full jitter, or
    a capped Retry-After."""
    return max(max(schedule, default=0.0) * (1.0 + JITTER), retry_after_cap)


def next_attempt_ms(now_ms: int, delay: float) -> int:
    """Epoch ms of the next attempt, `delay` seconds after `now_ms` (rounded up: never early)."""
    return now_ms + math.ceil(delay * 1000)


def resume(
    seq: int,
    stored_seq: int | None,
    stored_attempts: int,
    stored_next_ms: int,
    now_ms: int,
    schedule: Sequence[float],
    *,
    retry_after_cap: float = DEFAULT_RETRY_AFTER_CAP,
) -> Resume:
    """Where the schedule of event `seq` stands, given what was stored for the job (`stored_seq`
    None: nothing): the stored attempts were made, so the next is attempt `stored_attempts + 1`,
    due at `stored_next_ms` (epoch ms; `now_ms` the clock). A row for another event is stale
    (the event it was about has its outcome) and means a first attempt now."""
    if stored_seq is None or stored_seq != seq or stored_attempts < 1:
        return Resume(attempt=1, wait=0.0)
    wait = min(max(0.0, (stored_next_ms - now_ms) / 1000), longest_wait(schedule, retry_after_cap))
    return Resume(attempt=stored_attempts + 1, wait=wait)


def jittered(delay: float, rng: Random, jitter: float = JITTER) -> float:
    """`delay` scaled by a uniform factor in [1 - jitter, 1 + jitter)."""
    return delay * (1.0 - jitter + 2.0 * jitter * rng.random())


def describe(status: int | None, error_kind: str | None) -> str:
    if status is not None:
        return f"HTTP {status}"
    return _ERROR_TEXT.get(error_kind or "", error_kind or "unknown error")


def decide(
    attempt_no: int,
    status: int | None,
    error_kind: ErrorKind | None,
    retry_after: str | None,
    now: float,
    schedule: Sequence[float],
    rng: Random,
    *,
    retry_after_cap: float = DEFAULT_RETRY_AFTER_CAP,
    reason_detail: str | None = None,
) -> Decision:
    """Classify attempt number `attempt_no` (1 for the first send) of one event.

    Give either the HTTP `status` it got, or the `error_kind` that kept it from getting one.
    `retry_after` is the response's Retry-After header, `now` Unix seconds, `schedule` the waits
    before each retry. `reason_detail` (e.g. a blocked address's reason) is added to a final
    reason.
    """
    if attempt_no < 1:
        raise ValueError(f"attempts count from 1, got {attempt_no}")
    if status is None and error_kind is None:
        raise ValueError("an attempt has either a status or an error kind")
    if status is not None and 200 <= status < 300:
        return Decision("delivered")
    what = describe(status, error_kind)
    if reason_detail:
        what = f"{what}: {reason_detail}"
    if error_kind == "blocked":
        return Decision("blocked", reason=f"address blocked ({reason_detail or 'not allowed'})")
    if status == 410:
        return Decision("gone", reason=f"{what} (Gone) on attempt {attempt_no}; not retried")
    if attempt_no > len(schedule):
        attempts = "1 attempt" if attempt_no == 1 else f"{attempt_no} attempts"
        return Decision("failed", reason=f"gave up after {attempts}; last: {what}")
    delay = jittered(float(schedule[attempt_no - 1]), rng)
    floor = parse_retry_after(retry_after, now, retry_after_cap)
    if floor is not None:
        delay = max(delay, floor)
    return Decision("retry", delay=delay, reason=what)
