"""The longest tests first, spread over the pytest-xdist workers.

pytest-xdist's worksteal scheduler hands each worker a contiguous slice of the collection and
lets an idle one steal the tail of another's queue. A minute-long test that happens to sit late
in a slice starts when the rest are almost done and holds the run open alone. Dealing the known
long tests to the heads of the slices (the longest first, each to the slice with the least of
them so far) lets the short ones fill in around them, and stolen tails stay short.

The weights are seconds measured on the 2-core machine (`scripts/test --durations=40`), only
their order matters; a test not listed weighs nothing and keeps its place.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")

SLOW: dict[str, float] = {
    # the first part
    "tests/tracker/test_tracker_lifecycle.py::test_lifecycle": 70,
    "tests/jobs/test_crash.py::test_kill_9_with_many_jobs": 60,
    "tests/crawlapi/test_monitor_cluster.py::": 65,
    "tests/crawlapi/test_extract_crash.py::": 45,
    "tests/jobs/test_crash.py::test_kill_9_mid_stream": 35,
    "tests/jobs/test_delivery.py::test_a_burst_of_1000_events": 25,
    "tests/crawlapi/test_monitor_crash.py::": 25,
    "tests/tracker/test_tracker_engine.py::test_milestone_snapshot": 24,
    "tests/integration/test_collector_amqp.py::test_kill_9_between_publish": 18,
    "tests/tracker/test_tracker_process.py::test_kill_during_bulk_tick": 16,
    "tests/crawlapi/test_sdk_js.py::": 14,
    "tests/test_process.py::test_a_second_process_on_one_state_dir": 15,
    "tests/api/test_fuzz_process.py::": 15,
    "tests/crawlapi/test_sdk_llm.py::test_faults_end_as_page_warnings": 14,
    "tests/ui/test_console_browser.py::": 10,
    "tests/ui/test_console_monitors.py::": 10,
    "tests/tracker/test_bilibili_sim.py::test_restart_keeps_limits": 12,
    "tests/crawlapi/test_crash.py::": 11,
    "tests/tracker/test_tracker_engine.py::test_window_counts": 10,
    "tests/crawlapi/test_mcp_": 9,
    "tests/tracker/test_bilibili_sim.py::test_transit_jitter": 9,
    # the cluster and broker timing tests
    "tests/crawlapi/test_lease_faults.py::test_kill9_of_the_owner": 55,
    "tests/jobs/test_fault_process.py::test_a_webhook_job_survives_a_database_fault": 50,
    "tests/crawlapi/test_lease_faults.py::": 40,
    "tests/crawlapi/test_cluster_process.py::": 29,
    "tests/crawlapi/test_monitor_faults.py::": 25,
    "tests/jobs/test_fault_process.py::": 23,
    "tests/integration/test_collector_cluster.py::": 18,
    "tests/crawlapi/test_extract_cluster.py::": 20,
    "tests/integration/test_collector_job_survives.py::": 16,
    "tests/tracker/test_tracker_cluster_process.py::": 16,
    "tests/jobs/test_cluster_process.py::": 13,
    "tests/cluster/test_membership_process.py::": 11,
}


def weight(nodeid: str) -> float:
    """Seconds a test is known to take (0: not among the long ones)."""
    return max((s for prefix, s in SLOW.items() if nodeid.startswith(prefix)), default=0.0)


def slice_sizes(n: int, workers: int) -> list[int]:
    """The lengths of the contiguous slices worksteal hands out first (xdist's own arithmetic)."""
    sizes = []
    for i in range(workers):
        size = n // (workers - i)
        sizes.append(size)
        n -= size
    return sizes


def deal(items: Sequence[T], ids: Sequence[str], workers: int) -> list[T]:
    """`items` reordered so each worker's first slice opens with its share of the long tests
    (the longest first, balanced by weight), the others after them in their own order."""
    if workers < 2 or len(items) < workers:
        return list(items)
    weights = [weight(i) for i in ids]
    slow = sorted((k for k, w in enumerate(weights) if w), key=lambda k: -weights[k])
    chunks: list[list[int]] = [[] for _ in range(workers)]
    loads = [0.0] * workers
    for k in slow:
        emptiest = loads.index(min(loads))
        chunks[emptiest].append(k)
        loads[emptiest] += weights[k]
    rest = iter(k for k, w in enumerate(weights) if not w)
    order: list[int] = []
    for chunk, size in zip(chunks, slice_sizes(len(items), workers), strict=True):
        chunk.extend(next(rest) for _ in range(max(0, size - len(chunk))))
        order.extend(chunk)
    order.extend(rest)
    return [items[k] for k in order]


def workers() -> int:
    """The pytest-xdist workers of this run (0 outside xdist)."""
    return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
