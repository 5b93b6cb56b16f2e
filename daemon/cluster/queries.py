# What other parts ask of the cluster's tables inside their own transaction: who holds the leases
# of a prefix, how many instances are alive.
# The cluster owns `cluster_leases` and `cluster_members`; a part needing them in the same
# snapshot as its own rows (the webhook drainers' scan reads both in one read) calls these instead
# of reading the rows itself, so the rules about them (when a lease is held, when a member is
# alive) stay here.
from __future__ import annotations

from daemon.cluster import rules
from daemon.cluster import store as cluster_store
from daemon.store import Conn


def lease_holders(conn: Conn, prefix: str) -> dict[str, str]:
    """The leases of `prefix` held now: the name after the prefix → the instance holding it."""
    return {
        row["name"][len(prefix) :]: row["holder"]
        for row in cluster_store.leases(conn, prefix)
        if row["held"]
    }


def live_members(conn: Conn) -> int:
    """How many instances are alive (their heartbeat has not run out)."""
    return sum(1 for m in cluster_store.members(conn) if rules.alive(m["expires_ms"], m["now_ms"]))
