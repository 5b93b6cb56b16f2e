# The running daemon as the areas see it: its config, store and outbox, and the registries an
# area fills when it is installed (components, API routes, /status sections, reload hooks, metric
# refreshers). Areas import this module, never `daemon.app`, and `daemon.app` never imports an
# area's internals: the list of areas lives in `daemon/areas.py`.
from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import trio

from daemon import config, metrics
from daemon.config import Config
from daemon.logs import get_logger
from daemon.outbox import Outbox, now_ms
from daemon.store import Store
from daemon.supervise import ComponentState
from daemon.systemd import Notifier

log = get_logger("daemon")


class ReloadResult(msgspec.Struct):
    ok: bool
    at_ms: int
    message: str


ComponentFn = Callable[..., Awaitable[None]]
ReloadHook = Callable[[config.Config, config.Config, config.ConfigDiff], Awaitable[None]]
StatusSection = Callable[[], Awaitable[dict[str, Any]]]
# Sections whose change needs a restart: they shape resources opened once at start.
RESTART_SECTIONS = ("http", "store", "broker", "cluster")


@dataclass
class Component:
    name: str
    run: ComponentFn


@dataclass
class Daemon:
    """The running process: its config, store and the parts the areas installed."""

    config: config.Config
    notifier: Notifier = field(default_factory=Notifier)
    store: Store | None = None
    outbox: Outbox | None = None
    state: str = "starting"
    generation: int = 1
    last_reload: ReloadResult | None = None
    started_monotonic: float = field(default_factory=time.monotonic)
    components: list[Component] = field(default_factory=list)
    component_states: dict[str, ComponentState] = field(default_factory=dict)
    routes: list[Any] = field(default_factory=list)
    pages: list[Any] = field(default_factory=list)
    """Starlette routes served behind the same edge but left out of /openapi.json (the console)."""
    sessions: Any = None
    """The console's session check (daemon/api/edge.py SessionCheck), once daemon/ui installed."""
    http_stats: Any = None
    """The running HTTP edge's EdgeStats, for a route that refuses on the edge's behalf."""
    status_sections: dict[str, StatusSection] = field(default_factory=dict)
    reload_hooks: list[ReloadHook] = field(default_factory=list)
    cluster: Any = None
    """This process's Cluster (daemon/cluster/): membership and leases, on either backend."""
    jobs: Any = None
    """The JobManager (daemon/jobs/manager.py) once the jobs part is installed."""
    metric_refreshers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    """Run before each /metrics scrape to set gauges that need a store read."""
    parts: dict[str, Any] = field(default_factory=dict)
    """The objects each area installed, by name ("collector", …), for the API and tests."""
    http_address: tuple[str, int] | None = None
    stop_requested: trio.Event = field(default_factory=trio.Event)
    stopped: trio.Event = field(default_factory=trio.Event)
    """Set once every component ended and the store is closed."""
    http_shutdown: trio.Event = field(default_factory=trio.Event)
    check_secrets: Callable[[Config], None] = lambda cfg: None
    """Every area's secret check (daemon/areas.py); reload runs it before applying a file."""

    def add_component(self, name: str, run: ComponentFn) -> None:
        self.components.append(Component(name, run))

    def summary(self) -> str:
        """One line for systemd STATUS=."""
        running = sum(1 for c in self.component_states.values() if c.state == "running")
        text = f"{self.state}: {running}/{len(self.component_states)} components running"
        if self.http_address:
            text += f", http on {self.http_address[0]}:{self.http_address[1]}"
        return text + f", config generation {self.generation}"

    async def reload(self) -> bool:
        """Re-read the config file; apply it only if it is entirely valid."""
        self.notifier.reloading("reloading configuration")
        previous_state, self.state = self.state, "reloading"
        source = self.config.source
        try:
            new = await trio.to_thread.run_sync(config.load, source)
            self.check_secrets(new)
            change = config.diff(self.config, new)
            for section in RESTART_SECTIONS:
                if section in change.sections_changed:
                    log.warning("section changed; it takes effect after a restart", section=section)
            for hook in self.reload_hooks:
                await hook(self.config, new, change)
            self.config = new
            self.generation += 1
            message = f"applied generation {self.generation}: {change.summary()}"
            self.last_reload = ReloadResult(True, now_ms(), message)
            metrics.reloads.labels("ok").inc()
            metrics.config_generation.set(self.generation)
            log.info("configuration reloaded", generation=self.generation, changes=change.summary())
            ok = True
        except config.ConfigError as exc:
            message = f"reload rejected, keeping generation {self.generation}: {exc}"
            self.last_reload = ReloadResult(False, now_ms(), message)
            metrics.reloads.labels("rejected").inc()
            log.error("configuration reload rejected; the running config is kept", error=str(exc))
            ok = False
        self.state = previous_state
        self.notifier.ready(self.summary() if ok else message)
        return ok

    def request_stop(self) -> None:
        self.stop_requested.set()


Installer = Callable[[Daemon], None]
"""An area's `install(daemon)`: registers its components, routes, sections and hooks."""
