# The pure half of cluster mode: when to renew, which leases a renewal kept, whether a member is
# alive, what instances must agree on and how their offers differ. Plain values in and out (the
# clock is passed in), tested with tables; daemon/cluster/__init__.py moves them to and from the
# store.
from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

RENEWALS_PER_LEASE = 3
"""A lease is renewed this many times within its length, so two lost renewals in a row still
leave it held."""


class Offers(msgspec.Struct, frozen=True, kw_only=True):
    """What one instance brings to the cluster, as the others see it in its member row."""

    lease_ms: int
    tasks: dict[str, str] = {}
    """Collector task id → digest of its settings (and its account's)."""
    proxies: dict[str, str] = {}
    """Shared proxy name → digest of its URL and limits."""
    shared: dict[str, str] = {}
    """Sections every instance must hold alike (`broker`: kind, queue, queue type; `webhooks`:
    signed or not, allowed networks) → digest."""


def digest(value: Any) -> str:
    """A short stable fingerprint of a config value (never the value: it may hold URLs)."""
    raw = msgspec.json.encode(value, order="sorted")
    return hashlib.blake2b(raw, digest_size=6).hexdigest()


def renew_every_s(lease_s: float) -> float:
    return lease_s / RENEWALS_PER_LEASE


def poll_every_s(lease_s: float) -> float:
    """How often free leases are tried for: a tick, so a dead holder's work moves within about
    lease + 1 s."""
    return min(1.0, lease_s / 4)


def tick_in(now: float, next_renewal: float, retry_at: float | None, poll_s: float) -> float:
    """Seconds until the cluster task's next tick, unless a wake-up comes first (a lease
    wanted here, one released anywhere): the next renewal, or when the first lease wanted here
    and held elsewhere runs out (`retry_at`; None: nothing wanted), whichever comes first, and
    at least a 50th of the tick so a lease renewed just in time is not tried in a loop."""
    due = next_renewal if retry_at is None else min(next_renewal, retry_at)
    return max(due - now, poll_s / 50)


def local_deadline(sent_at: float, lease_s: float) -> float:
    """Until when (this process's monotonic clock) a lease renewed by a request sent at `sent_at`
    may be trusted: the database counts from when it ran the statement, later than `sent_at`, so
    this is never past the database's own expiry."""
    return sent_at + lease_s


def alive(expires_ms: int, now_ms: int) -> bool:
    return expires_ms >= now_ms


def lost_leases(held: Iterable[str], renewed: Iterable[str]) -> set[str]:
    """The held leases a renewal did not return: another instance took them."""
    return set(held) - set(renewed)


def fair_share(total: int, members: int) -> int:
    """Leases of one kind each live member should hold when they are spread evenly."""
    return math.ceil(total / max(1, members))


def disagreements(mine: Offers, instance: str, others: Sequence[tuple[str, Offers]]) -> list[str]:
    """What this instance's config says differently from live members' (sentences naming the
    key and the other instance): the lease, a collector task both list, a shared proxy both list,
    a setting all must share."""
    found: list[str] = []
    for other, theirs in others:
        if other == instance:
            continue
        if theirs.lease_ms != mine.lease_ms:
            found.append(
                f"$.cluster.lease: {mine.lease_ms / 1000:g}s here, {theirs.lease_ms / 1000:g}s"
                f" on {other}"
            )
        found.extend(_differ("$.collector.tasks", "task", mine.tasks, theirs.tasks, other))
        found.extend(_differ("$.tracker.proxies", "proxy", mine.proxies, theirs.proxies, other))
        found.extend(
            f"$.{key}: configured differently on {other}"
            for key in sorted(mine.shared.keys() & theirs.shared.keys())
            if mine.shared[key] != theirs.shared[key]
        )
    return found


def _differ(
    path: str, what: str, mine: Mapping[str, str], theirs: Mapping[str, str], other: str
) -> list[str]:
    return [
        f"{path}: {what} {key!r} is configured differently on {other}"
        for key in sorted(mine.keys() & theirs.keys())
        if mine[key] != theirs[key]
    ]
