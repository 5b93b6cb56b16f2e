# The areas of the daemon, in start order, and the checks each one makes of a config before it
# is used (at start, by `crawld check-config --secrets` and before a reload is applied). Adding an
# area means adding it here; `daemon.app` knows only this list.
from __future__ import annotations

from daemon import config
from daemon.api import component as http
from daemon.api import control
from daemon.cluster import component as cluster
from daemon.collector import component as collector
from daemon.crawl import component as crawl
from daemon.jobs import component as jobs
from daemon.llm import component as llm
from daemon.process import Installer
from daemon.settings import Config
from daemon.tracker import component as tracker
from daemon.ui import component as ui


def installers() -> list[Installer]:
    """Each area's install(daemon), in start order: the cluster first, so areas can take leases
    as they start; HTTP last so every route is registered."""
    return [cluster.install, control.install, jobs.install, llm.install, collector.install,
            tracker.install, crawl.install, ui.install, http.install]  # fmt: skip


def check_secrets(cfg: Config) -> None:
    """Every secret the config names must be set now, so a reload cannot half-apply."""
    config.resolve_secret(cfg.store.dsn_env, "$.store.dsn_env")
    for check in (
        http.check_secrets,
        jobs.check_secrets,
        collector.check_secrets,
        llm.check_secrets,
        crawl.check_secrets,
    ):
        check(cfg)
