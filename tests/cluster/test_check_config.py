"""What `crawld check-config --secrets` says of a cluster's member rows (plain values)."""

from __future__ import annotations

from typing import Any

import msgspec

from daemon.__main__ import cluster_report
from daemon.cluster import Offers

NOW = 1_000_000


def member(name: str, offers: Offers | str, *, expires_in: int = 1500) -> dict[str, Any]:
    raw = offers if isinstance(offers, str) else msgspec.json.encode(offers).decode()
    return {"instance": name, "host": "h", "pid": 7, "http": None, "offers": raw,
            "heartbeat_ms": NOW - 500, "expires_ms": NOW + expires_in, "now_ms": NOW}  # fmt: skip


def test_a_different_lease_is_an_error_the_rest_warnings_dead_members_only_listed() -> None:
    mine = Offers(lease_ms=2000, shared={"broker": "x"}, tasks={"t1": "d1"})
    rows = [
        member("a", Offers(lease_ms=2000, shared={"broker": "y"}, tasks={"t1": "d1"})),
        member("b", Offers(lease_ms=3000, shared={"broker": "x"})),
        member("c", Offers(lease_ms=9000), expires_in=-1),
        member("d", "not json"),
        member("me", Offers(lease_ms=2000)),
    ]
    lines, warnings, errors = cluster_report(rows, mine, "me")
    assert lines[0] == "cluster: 5 members in the store"
    assert lines[1] == "  a: alive, last heartbeat 0.5s ago (host h, pid 7, http -)"
    assert lines[3].startswith("  c: gone,")
    assert errors == ["$.cluster.lease: 2s here, 3s on b"]
    assert warnings == [
        "cannot read what member d offers",
        "$.cluster.instance: 'me' is the name of a live member (pid 7 on h): a second process"
        " of this name would be refused",
        "$.broker: configured differently on a",
    ]
    assert cluster_report([], mine, "me") == (["cluster: 0 members in the store"], [], [])
