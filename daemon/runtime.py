# The running daemon as the core sees it: its config, store and outbox, the core services (the
# cluster, the jobs manager, the LLM service), and the registries a part fills when it is
# installed (components, /status sections, reload hooks, metric refreshers). It names no area and
# no surface: the whole config is a type parameter (daemon/settings.py Config), and the HTTP
# surface's registries and the areas' services are added by the assembly (daemon/process.py).
from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import msgspec
import trio

from daemon import metrics
from daemon.config import ConfigDiff, ConfigError, CoreConfig
from daemon.logs import get_logger
from daemon.outbox import Outbox, now_ms
from daemon.store import Store
from daemon.supervise import ComponentState
from daemon.systemd import Notifier

if TYPE_CHECKING:
    from daemon.cluster import Cluster
    from daemon.jobs.manager import JobManager
    from daemon.llm.service import LlmService

log = get_logger("daemon")


class ReloadResult(msgspec.Struct):
    ok: bool
    at_ms: int
    message: str


C = TypeVar("C", bound=CoreConfig)
"""The whole config's type (daemon/settings.py Config); the core knows it as CoreConfig."""
ComponentFn = Callable[..., Awaitable[None]]
ReloadHook = Callable[[C, C, ConfigDiff], Awaitable[None]]
"""Called with the running config, the new one and what changed, before the new one is used."""
StatusSection = Callable[[], Awaitable[dict[str, Any]]]
# Sections whose change needs a restart: they shape resources opened once at start.
RESTART_SECTIONS = ("http", "store", "broker", "cluster")


@dataclass
class Component:
    name: str
    run: ComponentFn


def _cannot_reread(config: Any) -> tuple[Any, ConfigDiff]:
    raise ConfigError(f"{config.source}: this process was started without a way to reread it")


@dataclass
class Daemon(Generic[C]):
    """The running process: its config, store, the core services and what the parts installed.
    Each service is None until the part that makes it is installed (cluster first, then jobs,
    then llm: daemon/areas.py)."""

    config: C
    notifier: Notifier = field(default_factory=Notifier)
    store: Store | None = None
    outbox: Outbox | None = None
    state: str = "starting"
    generation: int = 1
    last_reload: ReloadResult | None = None
    started_monotonic: float = field(default_factory=time.monotonic)
    components: list[Component] = field(default_factory=list)
    component_states: dict[str, ComponentState] = field(default_factory=dict)
    status_sections: dict[str, StatusSection] = field(default_factory=dict)
    reload_hooks: list[ReloadHook[C]] = field(default_factory=list)
    cluster: Cluster | None = None
    """This process's Cluster (daemon/cluster/): membership and leases, on either backend."""
    jobs: JobManager | None = None
    """The JobManager (daemon/jobs/manager.py) once the jobs part is installed."""
    llm: LlmService | None = None
    """The LlmService (daemon/llm/service.py), installed before the areas; exists with or
    without `[llm]` (its `configured()` says whether calls can be made)."""
    metric_refreshers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    """Run before each /metrics scrape to set gauges that need a store read."""
    http_address: tuple[str, int] | None = None
    stop_requested: trio.Event = field(default_factory=trio.Event)
    stopped: trio.Event = field(default_factory=trio.Event)
    """Set once every component ended and the store is closed."""
    http_shutdown: trio.Event = field(default_factory=trio.Event)
    reread: Callable[[C], tuple[C, ConfigDiff]] = _cannot_reread
    """Reads the file the running config came from again, checks every secret it names and says
    what changed (set by daemon/app.py); ConfigError when the file cannot be used. Run in a
    thread."""

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
        try:
            new, change = await trio.to_thread.run_sync(self.reread, self.config)
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
        except ConfigError as exc:
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
