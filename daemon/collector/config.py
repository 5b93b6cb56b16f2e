# The `[collector]` section: the Octoparse accounts and the tasks read from them. Defined next to
# the collector's code like every area's section; `daemon/settings.py` puts it in the whole
# config and calls `check_references` once the file is decoded.
from __future__ import annotations

import re
from typing import Literal, Protocol

from daemon.config import BrokerConfig, WebhookSpec, WebhookURL, check_webhook_url
from daemon.config_types import Duration, Section, check_timezone


class AccountConfig(Section, frozen=True):
    name: str
    base_url: str = "https://openapi.octoparse.com"
    username: str | None = None
    password_env: str | None = None
    api_key_env: str | None = None
    """Use an `x-api-key` (op_sk_…) instead of username/password tokens."""
    rate_limit: float = 20.0
    """Requests per second for all tasks of this account (Octoparse allows 20 per IP)."""
    timeout: Duration = Duration(30)

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, got {self.base_url!r}")
        if self.api_key_env is None and (self.username is None or self.password_env is None):
            raise ValueError("set api_key_env, or both username and password_env")
        if self.rate_limit <= 0:
            raise ValueError("rate_limit must be positive")


class TaskConfig(Section, frozen=True):
    id: str
    """Our name for the task: used in the API, logs, message headers and message ids."""
    account: str
    task_id: str
    """The Octoparse taskId."""
    date_field: str
    date_formats: list[str] = []
    timezone: str = "Asia/Shanghai"
    filter_days: float | None = None
    missing_date: Literal["drop", "keep"] = "drop"
    interval: Duration | None = None
    enabled: bool = True
    paging: Literal["backward", "forward"] = "backward"
    batch_size: int | None = None
    ttl_from: Literal["fixed", "record"] = "fixed"
    webhook: WebhookURL | WebhookSpec | None = None

    def __post_init__(self) -> None:
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", self.id):
            raise ValueError(f"id must be 1-64 letters, digits, '.', '_' or '-', got {self.id!r}")
        if self.batch_size is not None and not 1 <= self.batch_size <= 1000:
            raise ValueError("batch_size must be between 1 and 1000")
        if self.filter_days is not None and self.filter_days <= 0:
            raise ValueError("filter_days must be positive")
        if isinstance(self.webhook, str):
            check_webhook_url(self.webhook)
        check_timezone(self.timezone)


class CollectorConfig(Section, frozen=True):
    enabled: bool = True
    auto_start: bool = True
    filter_days: float = 7
    max_expired_batches: int = 3
    batch_size: int = 100
    interval: Duration = Duration(600)
    max_pending: int = 20_000
    """Rows a task may leave in the outbox before its crawler waits for the drainer."""
    accounts: list[AccountConfig] = []
    tasks: list[TaskConfig] = []

    def __post_init__(self) -> None:
        if not 1 <= self.batch_size <= 1000:
            raise ValueError("batch_size must be between 1 and 1000")
        if self.max_expired_batches < 1:
            raise ValueError("max_expired_batches must be at least 1")
        if self.filter_days <= 0:
            raise ValueError("filter_days must be positive")

    def check_references(self) -> None:
        """ValueError naming the key path of a duplicate account name or task id, or of a task
        naming an unknown account (run when the file is read, after each value decoded)."""
        accounts = set()
        for i, account in enumerate(self.accounts):
            if account.name in accounts:
                raise ValueError(
                    f"duplicate account name {account.name!r} - at `$.collector.accounts[{i}].name`"
                )
            accounts.add(account.name)
        seen: set[str] = set()
        for i, task in enumerate(self.tasks):
            path = f"$.collector.tasks[{i}]"
            if task.id in seen:
                raise ValueError(f"duplicate task id {task.id!r} - at `{path}.id`")
            seen.add(task.id)
            if task.account not in accounts:
                raise ValueError(f"unknown account {task.account!r} - at `{path}.account`")


class CollectorSettings(Protocol):
    """What the collector reads of the whole config: its section and the broker's."""

    @property
    def collector(self) -> CollectorConfig: ...
    @property
    def broker(self) -> BrokerConfig: ...
