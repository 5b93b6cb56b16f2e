# Installs the LLM service (daemon/llm/) into the daemon: `daemon.llm` is set before the areas are
# installed, so an area takes it in its own install (see daemon/llm/__init__.py). Also the `llm`
# /status section, the reload hook that applies a new `[llm]` (or its removal) to the next call,
# and a task that drops expired cache entries.
from __future__ import annotations

from typing import Any

import trio
import trio.lowlevel

from daemon import config
from daemon.llm.service import LlmService
from daemon.logs import get_logger
from daemon.process import Daemon
from daemon.settings import Config, ConfigDiff
from daemon.store import DB_ERRORS, StoreClosed

_STORE_FAILURES: tuple[type[BaseException], ...] = (*DB_ERRORS, StoreClosed)

log = get_logger("llm")
PURGE_EVERY_S = 600.0


def check_secrets(cfg: Config) -> None:
    """Every API key `[llm]` names must be set (so a reload cannot half-apply)."""
    if cfg.llm is None:
        return
    for name in cfg.llm.provider_names():
        provider = cfg.llm.provider(name)
        assert provider is not None
        path = "$.llm.api_key_env" if name == "default" else (f"$.llm.providers.{name}.api_key_env")
        config.resolve_secret(provider.api_key_env, path)


def install(daemon: Daemon) -> None:
    service = LlmService(daemon.config.llm, daemon.store)
    daemon.llm = service
    daemon.parts["llm"] = service

    async def run_purge(daemon: Daemon, *, task_status: trio.TaskStatus[None]) -> None:
        task_status.started()
        try:
            while True:
                await trio.sleep(PURGE_EVERY_S)
                try:
                    while await service.purge() > 0:
                        await trio.lowlevel.checkpoint()
                except _STORE_FAILURES as exc:
                    log.warning("LLM cache purge failed; trying again later", error=str(exc))
        finally:
            await service.aclose()

    async def section() -> dict[str, Any]:
        return service.status()

    async def on_reload(old: Config, new: Config, change: ConfigDiff) -> None:
        if "llm" in change.sections_changed:
            service.configure(new.llm)
            log.info("[llm] applied", providers=service.provider_names())

    daemon.add_component("llm", run_purge)
    daemon.status_sections["llm"] = section
    daemon.reload_hooks.append(on_reload)
