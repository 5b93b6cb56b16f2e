# Wires the tracker (seed 002) into the daemon. The area always installs, whether or not
# `[tracker] enabled` is set, so a reload can switch it on or off: each loop is its own
# supervised component waiting behind the service's gate (daemon/tracker/service.py). The first
# component, `tracker`, recovers schedules a dead process left processing and restores the
# limiter state before any loop may run, and stores the limiter state at shutdown.
from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from daemon.clock import wall_ms
from daemon.process import Daemon
from daemon.settings import Config, ConfigDiff
from daemon.tracker import metrics
from daemon.tracker import store as ts
from daemon.tracker.service import TrackerService


def install(daemon: Daemon) -> None:
    from daemon.api import tracker as tracker_api

    assert daemon.store is not None
    service = TrackerService(
        daemon.config.tracker, daemon.store, clock=wall_ms, cluster=daemon.cluster
    )
    daemon.parts["tracker"] = service

    async def run_control(daemon: Daemon, *, task_status: trio.TaskStatus[None]) -> None:
        try:
            if daemon.config.tracker.enabled:
                await service.activate()
            task_status.started()
            await trio.sleep_forever()
        finally:
            await service.close()

    async def run_loop(
        loop: Callable[[], Awaitable[None]], daemon: Daemon, *, task_status: trio.TaskStatus[None]
    ) -> None:
        task_status.started()
        await service.gate.run(loop)

    daemon.add_component("tracker", run_control)
    for name, loop in service.loops().items():
        daemon.add_component(name, functools.partial(run_loop, loop))

    async def reload(old: Config, new: Config, change: ConfigDiff) -> None:
        if old.tracker != new.tracker:
            await service.apply(new.tracker)

    async def status() -> dict[str, Any]:
        return await service.status()

    async def refresh_schedules() -> None:
        counts = await daemon.store.read(ts.schedule_counts)  # type: ignore[union-attr]
        for type_, by_status in counts.items():
            for status_ in ("pending", "processing", "completed", "failed", "no_proxy",
                            "bili_error"):  # fmt: skip
                metrics.schedules.labels(type_, status_).set(by_status.get(status_, 0))

    daemon.reload_hooks.append(reload)
    daemon.status_sections["tracker"] = status
    daemon.metric_refreshers.append(refresh_schedules)
    daemon.routes.extend(tracker_api.routes(daemon, service))
