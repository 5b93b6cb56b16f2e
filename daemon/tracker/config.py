# The `[tracker]` section (specs/tracker.md, Interface): every option the spec fixes, with its
# default. Proxies are named and assigned per task kind; with no `[[tracker.proxies]]` block the
# tracker uses one `direct` proxy for every kind. Limits default to the reference's per-proxy
# GCRA windows for Bilibili (and the extra bulk windows).
from __future__ import annotations

import re
from typing import Literal

import msgspec

from daemon.config_types import Duration, Section, check_timezone

TaskKind = Literal["discovery", "ingest", "snapshot", "bulk"]
TASK_KINDS: tuple[TaskKind, ...] = ("discovery", "ingest", "snapshot", "bulk")


class Limit(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """At most `requests` requests per `per` (a GCRA window)."""

    requests: int
    per: Duration

    def __post_init__(self) -> None:
        if self.requests < 1:
            raise ValueError("requests must be at least 1")
        if self.per <= 0:
            raise ValueError("per must be a positive duration")


def _limits(*pairs: tuple[int, float]) -> list[Limit]:
    return [Limit(requests=n, per=Duration(s)) for n, s in pairs]


DEFAULT_LIMITS = _limits((20, 1), (130, 15), (2000, 300))
DEFAULT_BULK_LIMITS = _limits((5, 1), (40, 15), (200, 300))


class ProxyConfig(Section, frozen=True):
    name: str
    kind: Literal["direct", "http", "socks5", "relay"] = "direct"
    url: str | None = None
    """http(s):// or socks5:// proxy URL; for `relay` the endpoint that takes `{url}` and
    returns `{statusCode, body, serverTime}`. Unused for `direct`."""
    tasks: list[TaskKind] = msgspec.field(default_factory=lambda: list(TASK_KINDS))
    limits: list[Limit] = msgspec.field(default_factory=lambda: list(DEFAULT_LIMITS))
    """This proxy's limits for every Bilibili request."""
    bulk_limits: list[Limit] = msgspec.field(default_factory=lambda: list(DEFAULT_BULK_LIMITS))
    """Extra limits for bulk requests (on top of `limits`)."""

    def __post_init__(self) -> None:
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", self.name):
            raise ValueError(f"name must be 1-64 letters, digits, '.', '_' or '-': {self.name!r}")
        if self.kind == "direct":
            if self.url is not None:
                raise ValueError("a direct proxy has no url")
        elif self.url is None:
            raise ValueError(f"a {self.kind} proxy needs a url")
        else:
            schemes = {"http": ("http://", "https://"), "socks5": ("socks5://", "socks5h://"),
                       "relay": ("http://", "https://")}[self.kind]  # fmt: skip
            if not self.url.startswith(schemes):
                raise ValueError(
                    f"url of a {self.kind} proxy must start with {' or '.join(schemes)}"
                )
        if not self.tasks:
            raise ValueError("tasks cannot be empty")


class TrackerConfig(Section, frozen=True):
    enabled: bool = False
    base_url: str = "https://api.bilibili.com"
    discovery_interval: Duration = Duration(60)
    snapshot_tick: Duration = Duration(1)
    bulk_tick: Duration = Duration(15)
    bulk_size: int = 30
    window: Duration = Duration(300)
    window_capacity: int = 3000
    classifier_url: str | None = None
    """An HTTP classifier with the reference contract (POST /classify, GET /health); unset: the
    built-in rule classifier."""
    timezone: str = "Asia/Shanghai"
    """Where archive Saturdays and Mondays are counted."""
    proxies: list[ProxyConfig] = []

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, got {self.base_url!r}")
        if self.classifier_url is not None and not self.classifier_url.startswith(
            ("http://", "https://")
        ):
            raise ValueError(f"classifier_url must be an http(s) URL: {self.classifier_url!r}")
        if not 1 <= self.bulk_size <= 50:
            raise ValueError("bulk_size must be between 1 and 50")
        if self.window_capacity < 1:
            raise ValueError("window_capacity must be at least 1")
        for name, value in (("discovery_interval", self.discovery_interval),
                            ("snapshot_tick", self.snapshot_tick), ("bulk_tick", self.bulk_tick),
                            ("window", self.window)):  # fmt: skip
            if value <= 0:
                raise ValueError(f"{name} must be a positive duration")
        check_timezone(self.timezone)
        names = [p.name for p in self.proxies]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise ValueError(f"duplicate proxy name {name!r} - at `$.tracker.proxies[{i}]`")

    def effective_proxies(self) -> list[ProxyConfig]:
        """The configured proxies, or one `direct` proxy for every task kind."""
        return list(self.proxies) or [ProxyConfig(name="direct")]
