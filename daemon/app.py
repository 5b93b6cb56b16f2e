# The root task. Start order is dependency order: signal receivers first (Python's default for
# SIGTERM/SIGHUP is to die on the spot, with no cleanup), then the store, then each area's
# components under supervisors via `nursery.start`, then HTTP; READY=1 goes out only when all of
# them reported started.
#
# Areas (control, jobs, collector, tracker, crawl, http) plug in through `install(daemon)`, listed
# in `daemon/areas.py`: they add components, API routes, /status sections and reload hooks to the
# Daemon (`daemon/process.py`) and never touch each other. This module imports no area.
#
# Reload (SIGHUP) builds the new Config completely and checks its secrets before anything
# changes; only then do the reload hooks apply the diff and the reference is swapped. A bad file
# changes nothing; systemd still gets READY=1 with a STATUS= saying the old config is kept.
from __future__ import annotations

import contextlib
import functools
import signal
from collections.abc import AsyncIterator
from typing import Any

import trio

from daemon import __version__, areas, metrics, settings
from daemon.logs import get_logger
from daemon.outbox import Outbox
from daemon.process import Daemon, Installer
from daemon.settings import Config, ConfigDiff
from daemon.store import Backend, Store, StoreUnavailable, backend_for, open_store
from daemon.supervise import ComponentState, GaveUp, supervise
from daemon.systemd import Notifier, run_watchdog

__all__ = ["Daemon", "check_secrets", "default_installers", "run_daemon"]

log = get_logger("daemon")
check_secrets = areas.check_secrets
default_installers = areas.installers


def reread(old: Config) -> tuple[Config, ConfigDiff]:
    """The file `old` came from, read again and checked (secrets included), and what changed."""
    new = settings.load(old.source)
    areas.check_secrets(new)
    return new, settings.diff(old, new)


async def run_daemon(
    cfg: Config,
    *,
    installers: list[Installer] | None = None,
    notifier: Notifier | None = None,
    task_status: trio.TaskStatus[Daemon] = trio.TASK_STATUS_IGNORED,
) -> int:
    """Run the daemon until SIGTERM/SIGINT or `request_stop()`; return the exit code."""
    daemon = Daemon(cfg, notifier=notifier or Notifier(), reread=reread)
    areas.check_secrets(cfg)
    backend = backend_for(cfg)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async with (
            _held(daemon, backend, settings.instance_name(cfg)),
            _opened_store(daemon, backend, cfg.store.group_commit_max) as store,
        ):
            daemon.store = store
            daemon.outbox = Outbox(store)
            for install in installers if installers is not None else areas.installers():
                install(daemon)
            try:
                exit_code = await _run_components(daemon, signals, task_status)
            finally:
                daemon.state = "stopped"
    daemon.stopped.set()
    log.info("stopped", exit_code=exit_code)
    return exit_code


@contextlib.asynccontextmanager
async def _held(daemon: Daemon, backend: Backend, instance: str) -> AsyncIterator[None]:
    """backend.hold(instance) (one process per state dir, or per instance name on a PostgreSQL
    schema), entered and left in a thread: on PostgreSQL it is a connection of its own."""
    hold = backend.hold(instance)
    try:
        await trio.to_thread.run_sync(hold.__enter__)
    except StoreUnavailable as exc:
        daemon.notifier.status(f"cannot start: {exc}")
        raise
    try:
        yield
    finally:
        await trio.to_thread.run_sync(hold.__exit__, None, None, None)


@contextlib.asynccontextmanager
async def _opened_store(
    daemon: Daemon, backend: Backend, group_commit_max: int
) -> AsyncIterator[Store]:
    """open_store, with a start-up failure (server unreachable, newer schema) in STATUS=."""
    opening = True
    try:
        async with open_store(backend, group_commit_max=group_commit_max) as store:
            opening = False
            yield store
    except StoreUnavailable as exc:
        if opening:
            daemon.notifier.status(f"cannot start: {exc}")
        raise


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
                await nursery.start(supervised)
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
