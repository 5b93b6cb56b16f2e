"""The scheduler's claim under a backlog, driven with chosen clock values through
`MonitorService.tick`: more monitors due at once than `[monitors] claim_batch` all get their check
in one tick, the oldest due first, and monitors that cannot be scheduled do not hold the others
back."""

from __future__ import annotations

import msgspec

from daemon.app import Daemon
from daemon.crawl.monitors import store as mstore
from daemon.crawl.monitors.service import MonitorService
from daemon.fakes.site import SiteSim

BATCH = 3
MINUTES = [7, 2, 5, 0, 6, 1, 4, 3]
"""Due minutes of the monitors, in the order they are created."""


def batches(ids: list[str]) -> list[set[str]]:
    return [set(ids[i : i + BATCH]) for i in range(0, len(ids), BATCH)]


async def test_a_backlog_drains_in_one_tick_oldest_first_past_monitors_that_fail(
    site: SiteSim, daemon: Daemon
) -> None:
    service: MonitorService = daemon.parts["monitors"]
    service.configure(msgspec.structs.replace(service.config, claim_batch=BATCH))
    by_minute: dict[int, str] = {}
    for minute in MINUTES:
        body = {"name": f"m{minute}", "schedule": {"cron": f"{minute} 9 * * *"},
                "targets": [{"type": "scrape", "urls": [site.url("/about")]}]}  # fmt: skip
        by_minute[minute] = (await service.create(body))["id"]
    rows = {m: await service._row(i) for m, i in by_minute.items()}
    now = max(r.next_run_ms or 0 for r in rows.values()) + 1_000
    oldest = [by_minute[m] for m in sorted(by_minute)]

    seen: list[str] = []
    broken = set(oldest[:BATCH])  # a whole batch of the oldest cannot be scheduled
    real_due = service._due

    async def due(row: mstore.MonitorRow, now_ms: int) -> int:
        seen.append(row.id)
        if row.id in broken:
            raise RuntimeError("this monitor cannot be scheduled")
        return await real_due(row, now_ms)

    service._due = due  # type: ignore[method-assign]
    assert await service.tick(now) == len(MINUTES) - BATCH  # all the others, in one tick
    # Oldest due first, each looked at once (a batch's claims run at once, in any order).
    assert batches(seen) == batches(oldest)
    broken.clear()
    seen.clear()
    assert await service.tick(now) == BATCH  # the next tick schedules them
    assert set(seen) == set(oldest[:BATCH]) and len(seen) == BATCH
    for monitor_id in oldest:
        row = await service._row(monitor_id)
        assert row.last_run_ms is not None and (row.next_run_ms or 0) > now
    assert await service.tick(now) == 0
