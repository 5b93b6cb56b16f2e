# The `[monitors]` section: how often a monitor may run, how the scheduler and its checks work,
# and where notifications may go. Everything works with the defaults; tests and small sites lower
# min_interval. Notification destinations are the operator's alone: an SMTP relay
# (`[monitors.smtp]`) for Firecrawl's `notification.email`, and named Apprise URLs
# (`[[monitors.notification_targets]]`) that a monitor references by name; their secrets are
# named by `_env` keys and read at start (`check_secrets`), never written back anywhere.
from __future__ import annotations

import re
from typing import Literal

import msgspec

from daemon.config import is_loopback_host
from daemon.config_types import Duration, Section
from daemon.crawl.options.schemas import SPACE

TARGET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_PART = rf"[^@{SPACE}<>,;:\"]+"
ADDRESS = re.compile(rf"^{_PART}@{_PART}\.{_PART}$")
"""An e-mail address as a notification takes it: no display name, nothing a header could split."""


class SmtpConfig(Section, frozen=True, kw_only=True):
    """The relay Firecrawl's `notification.email` goes out through."""

    host: str
    port: int = 587
    security: Literal["starttls", "tls", "none"] = "starttls"
    """`starttls` (upgrade on the submission port), `tls` (implicit TLS, port 465) or `none`
    (plain text: only to a loopback relay when a password is sent)."""
    username: str | None = None
    password_env: str | None = None
    """Environment variable holding the relay's password (needs `username`)."""
    from_address: str
    """The From: address of every notification (e.g. "crawld@example.com")."""
    allowed_recipients: list[str] = []
    """Recipients a monitor may name: full addresses or "@domain"; empty: any address."""

    def __post_init__(self) -> None:
        if not self.host or any(c.isspace() for c in self.host):
            raise ValueError("host: the relay's host name or address")
        if not 1 <= self.port <= 65535:
            raise ValueError("port: between 1 and 65535")
        if not ADDRESS.match(self.from_address):
            raise ValueError(f"from_address: {self.from_address!r} is not an e-mail address")
        if (self.password_env is None) != (self.username is None):
            raise ValueError("username and password_env: both or neither")
        if self.security == "none" and self.username and not is_loopback_host(self.host):
            raise ValueError(
                'security = "none" sends the password in clear: only to a loopback relay'
            )
        for entry in self.allowed_recipients:
            if not (ADDRESS.match(entry) or re.match(r"^@[^@\s]+\.[^@\s]+$", entry)):
                raise ValueError(f"allowed_recipients: {entry!r} is neither an address nor @domain")

    def allows(self, address: str) -> bool:
        """Whether a monitor may send to `address`."""
        if not self.allowed_recipients:
            return True
        folded = address.lower()
        return any(folded == a.lower() or (a.startswith("@") and folded.endswith(a.lower()))
                   for a in self.allowed_recipients)  # fmt: skip


class NotificationTarget(Section, frozen=True, kw_only=True):
    """A destination a monitor names in `notification.targets`: an Apprise URL (Slack,
    Telegram, Discord, ntfy, Matrix, mailto, json:// …) held by `url_env` (or, without a
    secret in it, `url`)."""

    name: str
    url_env: str | None = None
    url: str | None = None

    def __post_init__(self) -> None:
        if not TARGET_NAME.match(self.name):
            raise ValueError(f"name: {self.name!r} must be 1-64 letters, digits or _ . -")
        if (self.url is None) == (self.url_env is None):
            raise ValueError("exactly one of url_env or url")

    def __repr__(self) -> str:  # the URL may hold a token: never in a log or a traceback
        return f"NotificationTarget(name={self.name!r})"


class MonitorConfig(Section, frozen=True):
    enabled: bool = True
    """Serve /v2/monitor and run the scheduler (needs [crawl] enabled)."""
    min_interval: Duration = Duration(300)
    """The shortest time between two runs a schedule may ask for (Firecrawl: 5 minutes);
    at least 1 minute (cron's grain)."""
    tick: Duration = Duration(5)
    """The longest the scheduler sleeps between two looks for due monitors (it also wakes at
    the earliest next run and when a monitor is created or changed)."""
    claim_batch: int = 10
    """Due monitors claimed per store read (oldest due first); a full batch is followed by
    another read at once, so a backlog drains in one look."""
    check_concurrency: int = 4
    """Pages of one check fetched at once (the crawl engine's limits apply over all work)."""
    crawl_limit: int = 100
    """Pages a crawl target's crawl reaches when its crawlOptions give no `limit`."""
    smtp: SmtpConfig | None = None
    """`[monitors.smtp]`: the relay of `notification.email`; absent: email is refused (400)."""
    notification_targets: list[NotificationTarget] = []
    """`[[monitors.notification_targets]]`: named Apprise destinations."""
    notify_timeout: Duration = Duration(30)
    """The longest one notification attempt (an SMTP session, an Apprise call) may take."""
    notify_concurrency: int = 4
    """Notifications sent at once (each in a worker thread)."""
    notify_retry_schedule: list[Duration] = msgspec.field(
        default_factory=lambda: [Duration(s) for s in (30, 120, 600, 1800, 7200)]
    )
    """Waits before each retry of a failed notification; its length is the number of retries."""

    def __post_init__(self) -> None:
        if self.min_interval < 60:
            raise ValueError("min_interval: at least 1m (a cron schedule's grain)")
        if self.tick <= 0 or self.tick > 60:
            raise ValueError("tick: more than 0 and at most 60 s")
        if not 1 <= self.claim_batch <= 1000:
            raise ValueError("claim_batch: between 1 and 1000")
        if not 1 <= self.check_concurrency <= 64:
            raise ValueError("check_concurrency: between 1 and 64")
        if not 1 <= self.crawl_limit <= 100_000:
            raise ValueError("crawl_limit: between 1 and 100000")
        if not 1 <= self.notify_timeout <= 600:
            raise ValueError("notify_timeout: between 1 s and 10 m")
        if not 1 <= self.notify_concurrency <= 64:
            raise ValueError("notify_concurrency: between 1 and 64")
        if len(self.notify_retry_schedule) > 20:
            raise ValueError("notify_retry_schedule: at most 20 retries")
        names = [t.name for t in self.notification_targets]
        if dupes := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"notification_targets: the name {dupes[0]!r} is used twice")

    def target_names(self) -> frozenset[str]:
        return frozenset(t.name for t in self.notification_targets)
