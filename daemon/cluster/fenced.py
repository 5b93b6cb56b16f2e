# Writes made on the strength of a lease, written once for every holder (collector runs, tracker
# duties, paced crawls and extracts, webhook drainers, job expiry): the transaction first checks
# the lease's fencing token (its `cluster_leases` row, locked until COMMIT) and only then runs the
# caller's statements, so a process paused past its lease and woken up writes nothing stale: the
# check raises LeaseLost and the whole transaction rolls back. `lease=None` is single-instance
# use with nothing to fence: the statements run as they are.
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from daemon.cluster import Lease
    from daemon.store import Conn, Store

T = TypeVar("T")


def check(conn: Conn, lease: Lease | None) -> None:
    """Inside a store transaction: raise LeaseLost unless `lease` (if any) is still held with
    its token."""
    if lease is not None:
        lease.check(conn)


def fenced(lease: Lease | None, fn: Callable[[Conn], T]) -> Callable[[Conn], T]:
    """`fn` as a transaction function that checks `lease` first (for callers that hand the
    function to something else that runs it in a store write)."""
    if lease is None:
        return fn

    def tx(conn: Conn) -> T:
        lease.check(conn)
        return fn(conn)

    return tx


async def write(
    store: Store, lease: Lease | None, fn: Callable[[Conn], T], *, small: bool = False
) -> T:
    """`store.write(fn, small=small)` on the strength of `lease`: LeaseLost (raised, nothing
    kept) when the lease was lost."""
    return await store.write(fenced(lease, fn), small=small)
