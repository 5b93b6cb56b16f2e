# The root task. Start order is dependency order: signal receivers first (Python's default for
# SIGTERM/SIGHUP is to die on the spot, with no cleanup), then the store, then each area's
# components under supervisors via `nursery.start`, then HTTP; READY=1 goes out only when all of
# them reported started.
#
# Areas (collector, jobs, tracker) plug in through `install(daemon)`: they add components,
# API routes, /status sections and reload hooks to the Daemon, and never touch each other.
#
# Reload (SIGHUP) builds the new Config completely and checks its secrets before anything
# changes; only then do the reload hooks apply the diff and the reference is swapped. A bad file
# changes nothing; systemd still gets READY=1 with a STATUS= saying the old config is kept.
from __future__ import annotations

import functools
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from daemon import __version__, config, metrics
from daemon.api.control import ComponentStatus, ConfigStatus, ReloadResult, Status, StoreStatus
from daemon.api.server import serve_app
from daemon.logs import get_logger
from daemon.outbox import Outbox, now_ms
from daemon.store import Store, open_store
from daemon.supervise import ComponentState, GaveUp, supervise
from daemon.systemd import Notifier, run_watchdog

log = get_logger("daemon")

ComponentFn = Callable[..., Awaitable[None]]
ReloadHook = Callable[[config.Config, config.Config, config.ConfigDiff], Awaitable[None]]
StatusSection = Callable[[], Awaitable[dict[str, Any]]]
# Sections whose change needs a restart: they shape resources opened once at start.
RESTART_SECTIONS = ("http", "store", "broker")


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
    status_sections: dict[str, StatusSection] = field(default_factory=dict)
    reload_hooks: list[ReloadHook] = field(default_factory=list)
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

    def add_component(self, name: str, run: ComponentFn) -> None:
        self.components.append(Component(name, run))

    async def status(self) -> Status:
        store = None
        if self.store is not None:
            s = self.store.stats
            store = StoreStatus(
                path=str(self.store.path),
                schema_version=self.store.schema_version,
                transactions=s.transactions,
                write_jobs=s.write_jobs,
                write_errors=s.write_errors,
                largest_group=s.largest_group,
            )
        sections = {name: await fn() for name, fn in self.status_sections.items()}
        return Status(
            state=self.state,
            version=__version__,
            pid=os.getpid(),
            uptime_s=round(time.monotonic() - self.started_monotonic, 3),
            config=ConfigStatus(
                source=self.config.source, generation=self.generation, last_reload=self.last_reload
            ),
            components=[
                ComponentStatus(c.name, c.state, c.restarts, c.last_error)
                for c in self.component_states.values()
            ],
            store=store,
            **sections,
        )

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
            check_secrets(new)
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


def check_secrets(cfg: config.Config) -> None:
    """Every secret the config names must be set now, so a reload cannot half-apply."""
    if cfg.broker.kind == "amqp":
        config.resolve_secret(cfg.broker.password_env, "$.broker.password_env")
    config.webhook_secret(cfg.webhooks)
    if cfg.collector.enabled:
        used = {t.account for t in cfg.collector.tasks if t.enabled}
        for i, account in enumerate(cfg.collector.accounts):
            if account.name not in used:
                continue
            path = f"$.collector.accounts[{i}]"
            if account.api_key_env is not None:
                config.resolve_secret(account.api_key_env, f"{path}.api_key_env")
            else:
                config.resolve_secret(account.password_env, f"{path}.password_env")


Installer = Callable[[Daemon], None]


def default_installers() -> list[Installer]:
    """The areas of the daemon, in start order."""
    from daemon.api import control

    def install_control(daemon: Daemon) -> None:
        daemon.routes.extend(control.routes(daemon))

    from daemon.collector import component as collector
    from daemon.jobs import component as jobs

    return [install_control, jobs.install, collector.install]


async def _serve_http(daemon: Daemon, task_status: trio.TaskStatus[Any]) -> None:
    from daemon.api.app import build_app

    app = build_app(daemon, daemon.routes)
    await serve_app(
        app,
        daemon.config.http.bind,
        shutdown=daemon.http_shutdown,
        task_status=task_status,
    )


async def run_daemon(
    cfg: config.Config,
    *,
    installers: list[Installer] | None = None,
    notifier: Notifier | None = None,
    task_status: trio.TaskStatus[Daemon] = trio.TASK_STATUS_IGNORED,
) -> int:
    """Run the daemon until SIGTERM/SIGINT or `request_stop()`; return the exit code."""
    daemon = Daemon(cfg, notifier=notifier or Notifier())
    check_secrets(cfg)
    db_path = config.state_dir(cfg) / "crawld.db"
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async with open_store(
            db_path,
            synchronous=cfg.store.synchronous,
            busy_timeout=cfg.store.busy_timeout,
            group_commit_max=cfg.store.group_commit_max,
        ) as store:
            daemon.store = store
            daemon.outbox = Outbox(store)
            for install in installers if installers is not None else default_installers():
                install(daemon)
            if cfg.http.enabled:
                daemon.add_component("http", _serve_http)
            try:
                exit_code = await _run_components(daemon, signals, task_status)
            finally:
                daemon.state = "stopped"
    daemon.stopped.set()
    log.info("stopped", exit_code=exit_code)
    return exit_code


async def _run_components(
    daemon: Daemon, signals: Any, task_status: trio.TaskStatus[Daemon]
) -> int:
    cfg = daemon.config.daemon
    exit_code = 0
    try:
        async with trio.open_nursery() as nursery:
            for component in daemon.components:
                state = daemon.component_states[component.name] = ComponentState(component.name)
                supervised = functools.partial(
                    supervise,
                    state,
                    functools.partial(component.run, daemon),
                    max_restarts=cfg.max_restarts,
                    window=cfg.restart_window,
                    backoff_cap=cfg.restart_backoff_max,
                    on_restart=_count_restart,
                )
                started = await nursery.start(supervised)
                if component.name == "http":
                    daemon.http_address = started
            nursery.start_soon(run_watchdog, daemon.notifier)
            daemon.state = "running"
            metrics.config_generation.set(daemon.generation)
            daemon.notifier.ready(daemon.summary())
            log.info(
                "started",
                version=__version__,
                http=":".join(map(str, daemon.http_address)) if daemon.http_address else None,
                config=daemon.config.source,
            )
            task_status.started(daemon)
            nursery.start_soon(_signal_loop, daemon, signals)
            await daemon.stop_requested.wait()
            daemon.state = "stopping"
            daemon.notifier.stopping()
            log.info("stopping")
            daemon.http_shutdown.set()
            http = daemon.component_states.get("http")
            if http is not None:
                with trio.move_on_after(cfg.shutdown_timeout):
                    await http.finished.wait()
            nursery.cancel_scope.cancel()
    except* GaveUp as group:
        log.critical("stopping: a component gave up", error=str(group.exceptions[0]))
        daemon.notifier.stopping()
        exit_code = 1
    return exit_code


def _count_restart(state: ComponentState) -> None:
    metrics.component_restarts.labels(state.name).inc()


async def _signal_loop(daemon: Daemon, signals: Any) -> None:
    async for signum in signals:
        if signum == signal.SIGHUP:
            log.info("SIGHUP: reloading configuration", config=daemon.config.source)
            await daemon.reload()
        else:
            log.info("signal received, stopping", signal=signal.Signals(signum).name)
            daemon.request_stop()
