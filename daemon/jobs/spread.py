# Which jobs' webhook drainers this instance takes over in cluster mode, as pure rules over plain
# values. Each scan lists jobs with undelivered events whose drainer lease is free; taking every
# one would pile all of a dead instance's jobs onto whichever survivor scans first, so an
# instance takes up to its fair share of the jobs with a backlog, and always at least one, so a
# live member that takes nothing never stalls a job for more than a scan.
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from daemon.cluster.rules import fair_share


def to_take(free: Sequence[str], held_here: int, backlog_jobs: int, members: int) -> list[str]:
    """Of the `free` jobs (in the order to try them), those to try for now: up to this
    instance's fair share of `backlog_jobs` among `members` live instances, less the
    `held_here` drainers it already runs, and at least one."""
    room = max(1, fair_share(backlog_jobs, members) - held_here)
    return list(free[:room])


def per_instance(holders: Iterable[str]) -> dict[str, int]:
    """How many drainers each instance holds (for /status), sorted by instance."""
    counts: dict[str, int] = {}
    for holder in holders:
        counts[holder] = counts.get(holder, 0) + 1
    return dict(sorted(counts.items()))


def free_jobs(
    backlog: Mapping[str, int], held: Iterable[str], running_here: Iterable[str]
) -> list[str]:
    """Jobs with a backlog whose lease nobody holds and that no drainer here runs, the
    biggest backlog first (ties by id, so instances try them in one order)."""
    taken = set(held) | set(running_here)
    return sorted((j for j in backlog if j not in taken), key=lambda j: (-backlog[j], j))
