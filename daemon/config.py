# The core's part of config.toml: the sections of the shared mechanisms (daemon, http, store,
# broker, cluster, jobs, webhooks), the errors and secret resolution every section uses, and what
# a reload hands to its hooks. The whole file (these sections plus each area's own, defined next
# to its code) is assembled in `daemon/settings.py`, above every area: the core never names an
# area, and reads the whole config only through `CoreConfig`, the sections it owns.
#
# Values decode into frozen msgspec Structs that reject unknown keys; msgspec reports the key
# path of a bad value (`$.collector.tasks[2].date_field`), and cross-field checks raise the same
# ConfigError with a path, so a user always learns which key in which file is wrong.
#
# Secrets never live in the file: options ending in `_env` name the environment variable that
# holds the secret, and `resolve_secret` reads it when a component starts.
from __future__ import annotations

import ipaddress
import os
import re
import socket
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

import msgspec

from daemon.config_types import Duration, Section, enc_hook
from daemon.jobs import webhook_rules


class ConfigError(Exception):
    """A config file that cannot be used; the message names the file and the key path."""


class DaemonConfig(Section, frozen=True):
    state_dir: str = "state"
    """Where crawld.db (and its -wal/-shm files) live; relative paths are relative to the config
    file. Under systemd, $STATE_DIRECTORY overrides it."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    shutdown_timeout: Duration = Duration(20)
    max_restarts: int = 5
    """A component that fails this many times within `restart_window` ends the process."""
    restart_window: Duration = Duration(300)
    restart_backoff_max: Duration = Duration(30)

    def __post_init__(self) -> None:
        if self.max_restarts < 1:
            raise ValueError("max_restarts must be at least 1")


class HttpConfig(Section, frozen=True):
    bind: str = "127.0.0.1:8700"
    enabled: bool = True
    api_key_env: str | None = None
    """Environment variable holding the API key(s), comma-separated so keys can rotate; when set,
    every route but /healthz needs `Authorization: Bearer <key>`. Required unless bind is a
    loopback address."""
    metrics_public: bool = False
    """Serve /metrics without a key (for a Prometheus that cannot send one)."""
    hosts: list[str] = []
    """Accepted `Host` header names ("name" or "name:port"); empty: the bind address, localhost,
    127.0.0.1 and [::1] on the listening port. Other names get 421 (DNS rebinding)."""
    public_url: str | None = None
    """Base URL clients reach the API at, used in `next` links; default http://<bind>."""
    max_body: int = 1024 * 1024
    """Largest request body in bytes; larger ones get 413 before they are read."""
    body_timeout: Duration = Duration(30)
    """A request body must arrive completely within this time (408 otherwise)."""
    read_timeout: Duration = Duration(30)
    """A connection that sends nothing for this long is closed."""
    keep_alive_timeout: Duration = Duration(5)
    """An idle keep-alive connection is closed after this long."""
    max_header_bytes: int = 16 * 1024
    """Largest request line plus headers."""
    max_concurrent_requests: int = 256
    """Requests handled at once; more get 503 at once (/healthz is never refused)."""
    backlog: int = 128
    """Connections the kernel queues before crawld accepts them."""

    def __post_init__(self) -> None:
        host, sep, port = self.bind.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"bind must be 'host:port', got {self.bind!r}")
        if self.api_key_env is None and not is_loopback_host(host):
            raise ValueError(
                f"bind {self.bind!r} is not a loopback address: name the environment variable "
                "holding the API key at `$.http.api_key_env`"
            )
        if self.public_url is not None and not re.match(r"^https?://[^/\s]+", self.public_url):
            raise ValueError(f"public_url must be an http(s) URL, got {self.public_url!r}")
        if self.max_body < 1:
            raise ValueError("max_body must be at least 1 byte")
        if self.max_concurrent_requests < 1:
            raise ValueError("max_concurrent_requests must be at least 1")
        if self.max_header_bytes < 1024:
            raise ValueError("max_header_bytes must be at least 1024")
        if self.backlog < 1:
            raise ValueError("backlog must be at least 1")
        for name in self.hosts:
            if not re.match(r"^(\[[0-9a-fA-F:.]+\]|[^\s/:\[\]@]+)(:\d{1,5})?$", name):
                raise ValueError(f"hosts: {name!r} is not a host name or host:port")


def is_loopback_host(host: str) -> bool:
    """Whether a bind host only accepts connections from this machine."""
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class StoreConfig(Section, frozen=True):
    kind: Literal["sqlite", "postgres"] = "sqlite"
    """sqlite: one file in the state dir (the default, one host). postgres: a schema of a
    PostgreSQL database, named by the URL in `dsn_env` (see docs/how-to/postgresql.md)."""
    dsn_env: str | None = None
    """postgres: the environment variable holding the libpq URL
    (postgresql://user:pass@host:5432/db?sslmode=require); never the URL itself."""
    schema: str = "crawld"
    """postgres: the schema holding crawld's tables (one database can hold several)."""
    pool_size: int = min(8, (os.cpu_count() or 1) + 2)
    """postgres: connections of this instance (one writer, the rest for reads)."""
    connect_timeout: Duration = Duration(10)
    """postgres: how long a connection attempt may take."""
    synchronous: Literal["normal", "full"] = "normal"
    """WAL + NORMAL never corrupts and survives a crash of crawld; only a power loss can roll back
    the last commits (each outbox item is then re-sent, never lost upstream of it). Choose "full"
    to fsync every commit."""
    busy_timeout: Duration = Duration(5)
    group_commit_max: int = 256
    """Most write jobs merged into one transaction by the single writer."""

    def __post_init__(self) -> None:
        if self.group_commit_max < 1:
            raise ValueError("group_commit_max must be at least 1")
        if self.kind == "postgres" and not self.dsn_env:
            raise ValueError(
                'dsn_env: kind = "postgres" needs dsn_env, the environment variable holding'
                " the connection URL"
            )
        if self.pool_size < 2:
            raise ValueError("pool_size must be at least 2 (one writer, one reader)")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,62}", self.schema):
            raise ValueError(
                f"schema: {self.schema!r} is not a plain identifier ([A-Za-z_][A-Za-z0-9_]*)"
            )


class ClusterConfig(Section, frozen=True):
    instance: str = ""
    """This instance's name among those sharing a PostgreSQL store; empty: the host name. Two
    live processes with one name are refused (the second exits naming the first)."""
    lease: Duration = Duration(10)
    """How long a lease (a collector task, a drainer, a paced crawl, a singleton duty) and a
    membership last without renewal; renewed every third of it. Another instance takes over
    the work of one that died within about this time plus one tick."""

    def __post_init__(self) -> None:
        if self.instance and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}", self.instance):
            raise ValueError(
                f"instance: {self.instance!r} must be 1-63 letters, digits or _ . : - (a host"
                " name fits)"
            )
        if not 2.0 <= self.lease <= 300.0:
            raise ValueError(f"lease must be between 2s and 300s, got {self.lease}s")


def instance_name(config: CoreConfig) -> str:
    """`[cluster] instance`, or the host name."""
    name = config.cluster.instance or socket.gethostname().split(".")[0] or "crawld"
    return re.sub(r"[^A-Za-z0-9_.:-]", "-", name)[:63]


class BrokerConfig(Section, frozen=True):
    kind: Literal["embedded", "amqp"] = "embedded"
    url: str = "amqp://guest@127.0.0.1:5672/"
    """AMQP URL without the password; the password comes from `password_env`."""
    password_env: str | None = None
    queue: str = "job_data"
    queue_type: Literal["classic", "quorum"] = "classic"
    message_ttl_ms: int = 604_800_000
    confirm_window: int = 500
    """Most messages published and not yet confirmed; a crash or a lost connection sends at most
    this many again."""
    batches_in_flight: int = 2
    """The confirm window is published as this many batches back to back (pipelined)."""
    reconnect_max: Duration = Duration(30)

    def __post_init__(self) -> None:
        if self.kind == "amqp" and not self.url.startswith(("amqp://", "amqps://")):
            raise ValueError(f"url must start with amqp:// or amqps://, got {self.url!r}")
        if self.message_ttl_ms < 0:
            raise ValueError("message_ttl_ms cannot be negative")
        if not 1 <= self.confirm_window <= 10_000:
            raise ValueError("confirm_window must be between 1 and 10000")
        if not 1 <= self.batches_in_flight <= min(16, self.confirm_window):
            raise ValueError("batches_in_flight must be between 1 and min(16, confirm_window)")


WebhookEvent = Literal[
    "started", "page", "completed", "failed",
    "crawl.started", "crawl.page", "crawl.completed", "crawl.failed",
    "batch_scrape.started", "batch_scrape.page", "batch_scrape.completed", "batch_scrape.failed",
    "extract.started", "extract.completed", "extract.failed",
    "action", "cancelled",
    "agent.started", "agent.action", "agent.completed", "agent.failed", "agent.cancelled",
    "monitor.page", "monitor.check.completed",
]  # fmt: skip


WebhookURL = Annotated[str, msgspec.Meta(extra_json_schema=webhook_rules.URL_SCHEMA)]
"""A webhook URL; its pattern and length are in the JSON schema, checked by check_webhook_url."""


class WebhookFields(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The shape of a webhook setting, unchecked: what stored jobs decode into, so a setting that
    today's rules refuse (stored by an older crawld) still loads and fails softly at delivery."""

    url: str
    headers: dict[str, str] = {}
    metadata: dict[str, str] = {}
    events: list[WebhookEvent] = []


class WebhookSpec(WebhookFields, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Firecrawl v2 `webhook` object; a bare URL string is accepted where this is. Checked by
    `daemon.jobs.webhook_rules` (header names and values, size caps on headers and metadata)."""

    # The rules below in JSON-schema form, for /openapi.json only (extra_json_schema checks
    # nothing): __post_init__ checks them, with messages that name the field.
    url: WebhookURL
    headers: Annotated[
        dict[
            str, Annotated[str, msgspec.Meta(extra_json_schema=webhook_rules.HEADER_VALUE_SCHEMA)]
        ],
        msgspec.Meta(extra_json_schema=webhook_rules.HEADERS_SCHEMA),
    ] = {}
    metadata: Annotated[
        dict[
            str, Annotated[str, msgspec.Meta(extra_json_schema=webhook_rules.METADATA_VALUE_SCHEMA)]
        ],
        msgspec.Meta(extra_json_schema=webhook_rules.METADATA_SCHEMA),
    ] = {}

    def __post_init__(self) -> None:
        check_webhook_url(self.url)
        problem = webhook_rules.headers_problem(self.headers)
        problem = problem or webhook_rules.metadata_problem(self.metadata)
        if problem is not None:
            raise ValueError(problem)


def check_webhook_url(url: str) -> None:
    problem = webhook_rules.url_problem(url)
    if problem is not None:
        raise ValueError(f"webhook {problem}")


def webhook_spec(value: str | WebhookSpec | None) -> WebhookSpec | None:
    """Normalise the string form of a webhook to a WebhookSpec."""
    if isinstance(value, str):
        check_webhook_url(value)
        return WebhookSpec(url=value)
    return value


class JobsConfig(Section, frozen=True):
    store: bool = True
    """Keep webhook events in the durable outbox; false keeps them in a bounded memory queue."""
    ttl: Duration = Duration(86400)
    memory_queue_size: int = 1000


class WebhooksConfig(Section, frozen=True):
    secret_env: str | None = None
    """Environment variable holding the HMAC secret; without it requests are not signed."""
    timeout: Duration = Duration(10)
    retry_schedule: list[Duration] = msgspec.field(
        default_factory=lambda: [Duration(s) for s in (5, 60, 300, 900, 3600)]
    )
    """Waits before each retry of a failed webhook request; its length is the number of retries."""
    per_host_concurrency: int = 8
    allow_cidrs: list[str] = []
    """Networks a webhook may reach although they are private (e.g. "127.0.0.0/8" for a local
    receiver)."""

    def __post_init__(self) -> None:
        for cidr in self.allow_cidrs:
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise ValueError(f"allow_cidrs: {cidr!r} is not a network") from None
        if self.per_host_concurrency < 1:
            raise ValueError("per_host_concurrency must be at least 1")


def state_dir(config: CoreConfig) -> Path:
    """The state directory: $STATE_DIRECTORY under systemd, else relative to the config file."""
    if env := os.environ.get("STATE_DIRECTORY"):
        return Path(env.split(":")[0])
    path = Path(config.daemon.state_dir)
    if not path.is_absolute() and config.source and not config.source.startswith("<"):
        path = Path(config.source).resolve().parent / path
    return path


def resolve_secret(env_name: str | None, key_path: str) -> str | None:
    """The secret held by environment variable `env_name`; ConfigError if it is named but unset."""
    if env_name is None:
        return None
    value = os.environ.get(env_name)
    if value is None:
        raise ConfigError(f"environment variable {env_name} (named at `{key_path}`) is not set")
    return value


def webhook_secret(cfg: WebhooksConfig) -> str | None:
    """The webhook signing secret (`$.webhooks.secret_env`), checked; ConfigError if it is named
    but unset or malformed (a `whsec_` secret must be base64 of 24-64 bytes)."""
    secret = resolve_secret(cfg.secret_env, "$.webhooks.secret_env")
    if secret is not None:
        problem = webhook_rules.secret_problem(secret)
        if problem is not None:
            raise ConfigError(
                f"environment variable {cfg.secret_env} (named at `$.webhooks.secret_env`):"
                f" {problem}"
            )
    return secret


def to_builtins(value: Any) -> Any:
    return msgspec.to_builtins(value, enc_hook=enc_hook)


class CoreConfig(Protocol):
    """What the core reads of the whole config (`daemon.settings.Config`): its own sections and
    the file they came from. Core code that needs more than one section takes this."""

    @property
    def daemon(self) -> DaemonConfig: ...
    @property
    def http(self) -> HttpConfig: ...
    @property
    def store(self) -> StoreConfig: ...
    @property
    def broker(self) -> BrokerConfig: ...
    @property
    def cluster(self) -> ClusterConfig: ...
    @property
    def jobs(self) -> JobsConfig: ...
    @property
    def webhooks(self) -> WebhooksConfig: ...
    @property
    def source(self) -> str: ...


class ConfigDiff(msgspec.Struct, frozen=True):
    """What a reload changes (`daemon.settings.diff`): collector tasks by id, other sections by
    name; each reload hook gets it with the old and the new config."""

    tasks_added: list[str]
    tasks_removed: list[str]
    tasks_changed: list[str]
    sections_changed: list[str]

    @property
    def empty(self) -> bool:
        return not (
            self.tasks_added or self.tasks_removed or self.tasks_changed or self.sections_changed
        )

    def summary(self) -> str:
        if self.empty:
            return "no changes"
        parts = []
        for label, items in (
            ("tasks added", self.tasks_added),
            ("tasks removed", self.tasks_removed),
            ("tasks changed", self.tasks_changed),
            ("sections changed", self.sections_changed),
        ):
            if items:
                parts.append(f"{label}: {', '.join(items)}")
        return "; ".join(parts)
