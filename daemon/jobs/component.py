# Wires the jobs part into the daemon: the JobManager (as `daemon.jobs`, which the collector
# picks up when it installs after us), its drainers and the expiry cleanup as supervised
# components, the /v2/crawl routes, the `webhooks` /status section and the reload hook.
from __future__ import annotations

from typing import Any

import trio

from daemon import config
from daemon.jobs.manager import JobManager
from daemon.process import Daemon
from daemon.settings import Config


def install(daemon: Daemon) -> None:
    from daemon.api import jobs as jobs_api

    assert daemon.store is not None and daemon.outbox is not None
    cfg = daemon.config
    manager = JobManager(
        daemon.store, daemon.outbox, cfg.jobs, cfg.webhooks, cluster=daemon.cluster
    )
    daemon.jobs = manager
    daemon.parts["jobs"] = manager

    async def run_webhooks(daemon: Daemon, *, task_status: trio.TaskStatus[None]) -> None:
        await manager.run(task_status=task_status)

    async def run_cleanup(daemon: Daemon, *, task_status: trio.TaskStatus[None]) -> None:
        await manager.run_cleanup(task_status=task_status)

    async def webhooks_section() -> dict[str, Any]:
        return await manager.status()

    daemon.add_component("webhooks", run_webhooks)
    daemon.add_component("jobs-cleanup", run_cleanup)
    daemon.routes.extend(jobs_api.routes(manager))
    daemon.status_sections["webhooks"] = webhooks_section
    daemon.reload_hooks.append(manager.on_reload)


def check_secrets(cfg: Config) -> None:
    config.webhook_secret(cfg.webhooks)
