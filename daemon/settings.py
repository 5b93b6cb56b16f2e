# config.toml as a whole: the root Config that holds the core's sections (daemon/config.py) and
# each area's own (daemon/<area>/config.py), read by `load` and compared by `diff` on reload. It
# sits in the assembly, above the areas, so the core never imports an area to know the file:
# core code reads the sections it owns through `daemon.config.CoreConfig`, an area those it needs
# through a Protocol of its own (e.g. `daemon.collector.config.CollectorSettings`).
#
# Reload (SIGHUP) builds a whole new Config and diffs it against the running one before anything
# changes. The core's helpers are re-exported so an entry point or a test needs one import.
from __future__ import annotations

import os
from pathlib import Path

import msgspec

from daemon.collector.config import CollectorConfig
from daemon.config import (
    BrokerConfig,
    ClusterConfig,
    ConfigDiff,
    ConfigError,
    DaemonConfig,
    HttpConfig,
    JobsConfig,
    StoreConfig,
    WebhooksConfig,
    WebhookSpec,
    instance_name,
    resolve_secret,
    state_dir,
    webhook_spec,
)
from daemon.config_types import Section, dec_hook
from daemon.crawl.agent.config import AgentConfig
from daemon.crawl.config import CrawlConfig, OcrConfig, ParseConfig
from daemon.crawl.monitors.config import MonitorConfig
from daemon.llm.config import LlmConfig
from daemon.search.config import SearchConfig
from daemon.tracker.config import TrackerConfig

__all__ = [
    "Config", "ConfigDiff", "ConfigError", "WebhookSpec", "decode", "diff", "instance_name",
    "load", "resolve_secret", "state_dir", "webhook_spec",
]  # fmt: skip


class Config(Section, frozen=True):
    """The whole config.toml: the core's sections (daemon/config.py) and each area's."""

    daemon: DaemonConfig = DaemonConfig()
    http: HttpConfig = HttpConfig()
    store: StoreConfig = StoreConfig()
    broker: BrokerConfig = BrokerConfig()
    cluster: ClusterConfig = ClusterConfig()
    collector: CollectorConfig = CollectorConfig()
    tracker: TrackerConfig = TrackerConfig()
    crawl: CrawlConfig = CrawlConfig()
    ocr: OcrConfig = OcrConfig()
    parse: ParseConfig = ParseConfig()
    search: SearchConfig = SearchConfig()
    agent: AgentConfig = AgentConfig()
    monitors: MonitorConfig = MonitorConfig()
    jobs: JobsConfig = JobsConfig()
    webhooks: WebhooksConfig = WebhooksConfig()
    llm: LlmConfig | None = None
    """`[llm]`: the model endpoint(s) behind the json and summary formats; absent: no LLM."""
    source: str = ""
    """The file this value was read from (set by `load`, not written in the file)."""


def _check_references(config: Config) -> None:
    config.crawl.check_proxies()
    config.crawl.browser.check()
    config.ocr.check()
    config.collector.check_references()


def decode(text: str | bytes, source: str = "<string>") -> Config:
    """Decode and validate config text; raise ConfigError naming `source` and the key path."""
    try:
        config = msgspec.toml.decode(text, type=Config, dec_hook=dec_hook)
        if config.source:
            raise ValueError(
                "`source` is set by crawld and cannot be written in the file - at `$.source`"
            )
        _check_references(config)
    except (msgspec.ValidationError, msgspec.DecodeError, ValueError) as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return msgspec.structs.replace(config, source=source)


def load(path: str | os.PathLike[str]) -> Config:
    """Read and validate a config file."""
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    return decode(text, source=str(path))


def diff(old: Config, new: Config) -> ConfigDiff:
    """What changed between two configs: tasks by id, other sections by name."""
    old_tasks = {t.id: t for t in old.collector.tasks}
    new_tasks = {t.id: t for t in new.collector.tasks}
    old_accounts = {a.name: a for a in old.collector.accounts}
    new_accounts = {a.name: a for a in new.collector.accounts}
    changed = [
        tid
        for tid, task in new_tasks.items()
        if tid in old_tasks
        and (
            task != old_tasks[tid]
            or old_accounts.get(task.account) != new_accounts.get(task.account)
        )
    ]
    sections = [
        name
        for name in old.__struct_fields__
        if name not in ("collector", "source") and getattr(old, name) != getattr(new, name)
    ]
    old_collector = msgspec.structs.replace(old.collector, accounts=[], tasks=[])
    new_collector = msgspec.structs.replace(new.collector, accounts=[], tasks=[])
    if old_collector != new_collector:
        sections.append("collector")
    return ConfigDiff(
        tasks_added=[t for t in new_tasks if t not in old_tasks],
        tasks_removed=[t for t in old_tasks if t not in new_tasks],
        tasks_changed=changed,
        sections_changed=sections,
    )
