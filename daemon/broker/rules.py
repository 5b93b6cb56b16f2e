# The broker's rules as plain values and functions: settings, the message a caller hands over,
# the AMQP properties it becomes, URL handling (password, connection name, redaction), the
# reconnect backoff, how a window's per-message outcomes become one error, and how the confirm
# window is cut into pipelined batches. Nothing here does I/O or knows about threads or loops, so
# each rule is tested with tables of values; `daemon.broker` moves data between these and aiormq.
from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import aiormq
import msgspec
from aiormq import spec
from aiormq.abc import DeliveredMessage

if TYPE_CHECKING:
    from daemon.config import BrokerConfig

QueueType = Literal["classic", "quorum"]


# ---------------------------------------------------------------------------------------------
# Errors


class BrokerError(Exception):
    """Base class: the operation did not complete; retrying it later is the usual answer."""


class BrokerUnavailable(BrokerError):
    """No usable connection, or it was lost or timed out mid-operation (outcome unknown)."""


class PublishFailed(BrokerError):
    """The broker refused part of a batch: message ids `returned` (unroutable), `nacked`, or
    `invalid` (could not be encoded, e.g. a header value AMQP cannot carry)."""

    def __init__(
        self,
        message: str,
        *,
        returned: Sequence[str] = (),
        nacked: Sequence[str] = (),
        invalid: Sequence[str] = (),
    ) -> None:
        super().__init__(message)
        self.returned = list(returned)
        self.nacked = list(nacked)
        self.invalid = list(invalid)


# ---------------------------------------------------------------------------------------------
# Values


class BrokerSettings(msgspec.Struct, frozen=True, kw_only=True):
    url: str
    """AMQP URL; `password` (if given) replaces any password in it."""
    password: str | None = None
    queue: str = "job_data"
    queue_type: QueueType = "classic"
    reconnect_max: float = 30.0
    """Cap of the reconnect backoff, in seconds."""
    connection_name: str = "crawld"
    """Shown by `rabbitmqctl list_connections client_properties` (URL `?name=` wins)."""
    connect_timeout: float = 10.0
    operation_timeout: float = 30.0
    """Bound on one publish confirm, one get or one declare."""
    confirm_window: int = 500
    """Most messages published and not yet confirmed at any time (also the most a crash or a
    lost connection can send twice)."""
    batches_in_flight: int = 2
    """The confirm window is cut into this many batches, published back to back: the next one
    is read and sent while the confirms of the earlier ones are pending."""
    call_wait: float = 5.0
    """How long a call waits for a (re)connection before raising BrokerUnavailable."""

    @classmethod
    def from_config(cls, config: BrokerConfig, password: str | None) -> BrokerSettings:
        return cls(
            url=config.url,
            password=password,
            queue=config.queue,
            queue_type=config.queue_type,
            reconnect_max=float(config.reconnect_max),
            confirm_window=config.confirm_window,
            batches_in_flight=config.batches_in_flight,
        )


class OutgoingMessage(msgspec.Struct, frozen=True, kw_only=True):
    """One message for the configured queue. `timestamp` and `expiration_ms` are milliseconds
    (AMQP carries the timestamp in whole seconds; `expiration_ms` is sent as a decimal string)."""

    body: bytes
    message_id: str
    expiration_ms: int | None = None
    timestamp: int | None = None
    headers: dict[str, Any] = {}
    content_type: str = "application/json"
    delivery_mode: int = 2
    app_id: str = "crawld"

    def __post_init__(self) -> None:
        if not self.message_id:
            raise ValueError("message_id must not be empty")
        if self.expiration_ms is not None and self.expiration_ms < 0:
            raise ValueError(f"expiration_ms cannot be negative, got {self.expiration_ms}")
        if self.delivery_mode not in (1, 2):
            raise ValueError(f"delivery_mode must be 1 or 2, got {self.delivery_mode}")


class ReceivedMessage(msgspec.Struct, frozen=True, kw_only=True):
    """A message taken (and acknowledged) with `get`. `timestamp` is epoch milliseconds."""

    body: bytes
    message_id: str | None
    expiration: str | None
    timestamp: int | None
    headers: dict[str, Any]
    content_type: str | None
    delivery_mode: int | None
    app_id: str | None
    redelivered: bool


# ---------------------------------------------------------------------------------------------
# Pure helpers


def backoff(attempt: int, cap: float, rng: random.Random, *, base: float = 0.1) -> float:
    """Seconds to wait before retry number `attempt` (1, 2, …): equal jitter over
    `base * 2**(attempt-1)` capped at `cap`, i.e. a value in [ceiling/2, ceiling]."""
    if attempt < 1 or cap <= 0:
        return 0.0
    ceiling = min(cap, base * 2.0 ** min(attempt - 1, 60))
    return ceiling / 2 + rng.uniform(0, ceiling / 2)


def amqp_url(url: str, password: str | None = None, connection_name: str | None = None) -> str:
    """`url` with `password` inserted (percent-encoded) and `?name=` added when absent."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if password is not None:
        userinfo, at, hostport = netloc.rpartition("@")
        user = userinfo.partition(":")[0] if at else ""
        netloc = f"{user}:{quote(password, safe='')}@{hostport}"
    query = parts.query
    if connection_name and "name" not in dict(parse_qsl(query)):
        query = urlencode([*parse_qsl(query, keep_blank_values=True), ("name", connection_name)])
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact_url(url: str) -> str:
    """`url` with any password replaced by `***`, for logs and /status."""
    parts = urlsplit(url)
    userinfo, at, hostport = parts.netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    netloc = f"{userinfo.partition(':')[0]}:***@{hostport}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def split_password(url: str) -> tuple[str, str | None]:
    """(`url` without its password, the password): the config form, with the secret apart."""
    parts = urlsplit(url)
    userinfo, at, hostport = parts.netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return url, None
    user, _, password = userinfo.partition(":")
    netloc = f"{user}@{hostport}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment)), password


def declare_arguments(queue_type: QueueType) -> dict[str, Any]:
    return {"x-queue-type": queue_type}


def message_properties(message: OutgoingMessage) -> spec.Basic.Properties:
    """The AMQP properties `publish_batch` sends for `message`."""
    return spec.Basic.Properties(
        content_type=message.content_type,
        delivery_mode=message.delivery_mode,
        message_id=message.message_id,
        expiration=None if message.expiration_ms is None else str(message.expiration_ms),
        timestamp=None if message.timestamp is None else _amqp_timestamp(message.timestamp // 1000),
        headers=message.headers or None,
        app_id=message.app_id,
    )


@functools.lru_cache(maxsize=256)
def _amqp_timestamp(seconds: int) -> datetime:
    """AMQP timestamps are whole seconds; the messages of one window share a few of them."""
    return datetime.fromtimestamp(seconds, UTC)


def unique_by_message_id(messages: Sequence[OutgoingMessage]) -> list[OutgoingMessage]:
    """The first message of each message_id, in order."""
    seen: set[str] = set()
    unique = []
    for message in messages:
        if message.message_id not in seen:
            seen.add(message.message_id)
            unique.append(message)
    return unique


def received(delivered: DeliveredMessage) -> ReceivedMessage:
    props = delivered.header.properties
    timestamp = props.timestamp
    if timestamp is not None and timestamp.tzinfo is None:
        timestamp = timestamp.replace(tzinfo=UTC)
    delivery = delivered.delivery
    return ReceivedMessage(
        body=delivered.body,
        message_id=props.message_id,
        expiration=props.expiration,
        timestamp=None if timestamp is None else round(timestamp.timestamp() * 1000),
        headers=dict(props.headers or {}),
        content_type=props.content_type,
        delivery_mode=props.delivery_mode,
        app_id=props.app_id,
        redelivered=bool(getattr(delivery, "redelivered", False)),
    )


CONNECTION_ERRORS = (
    asyncio.CancelledError,
    TimeoutError,
    ConnectionError,
    OSError,
    aiormq.exceptions.AMQPError,
    aiormq.exceptions.ChannelInvalidStateError,
)
"""Per-message outcomes that mean "connection lost or confirm timed out": outcome unknown."""


def describe(exc: BaseException) -> str:
    """One line for an error, for logs and /status."""
    if isinstance(exc, asyncio.CancelledError):
        return "connection closed"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Refusals(msgspec.Struct, kw_only=True):
    """A window's failed messages, sorted by what the broker (or the encoder) said."""

    returned: list[str] = []
    nacked: list[str] = []
    invalid: list[str] = []
    lost: list[BaseException] = []
    details: list[str] = []
    queue_missing: bool = False
    """A message came back 312 NO_ROUTE: the queue is gone and must be declared again."""


def sort_failures(failures: Sequence[tuple[str, BaseException]], queue: str) -> Refusals:
    """Sort (message_id, error) pairs of one window into returned / nacked / invalid / lost."""
    out = Refusals()
    for message_id, exc in failures:
        if isinstance(exc, aiormq.exceptions.PublishError):
            if not out.returned:
                code = getattr(exc.frame, "reply_code", None)
                text = getattr(exc.frame, "reply_text", "")
                out.details.append(f"returned {code} {text} (queue {queue!r})")
                out.queue_missing = out.queue_missing or code == 312
            out.returned.append(message_id)
        elif isinstance(exc, aiormq.exceptions.DeliveryError):
            out.nacked.append(message_id)
        elif isinstance(exc, CONNECTION_ERRORS):
            out.lost.append(exc)
        else:
            if not out.invalid:
                out.details.append(f"message {message_id!r} not sendable: {describe(exc)}")
            out.invalid.append(message_id)
    if out.nacked:
        out.details.append(f"{len(out.nacked)} nacked by the broker")
    return out


def publish_failed(refusals: Refusals, confirmed: int, total: int) -> PublishFailed:
    """The error for a window the broker answered but did not fully accept."""
    return PublishFailed(
        f"{confirmed} of {total} confirmed; {len(refusals.returned)} returned, "
        f"{len(refusals.nacked)} nacked, {len(refusals.invalid)} invalid: "
        + "; ".join(refusals.details),
        returned=refusals.returned,
        nacked=refusals.nacked,
        invalid=refusals.invalid,
    )


def batch_limit(confirm_window: int, batches_in_flight: int, in_flight: int) -> int:
    """How many messages the next pipelined batch may take, given `in_flight` unconfirmed ones:
    the window's share per batch, cut to the room left in the window (0: wait for confirms)."""
    share = -(-confirm_window // max(1, batches_in_flight))
    return max(0, min(share, confirm_window - in_flight))


def warn_connect_failure(attempt: int, error: str, previous: str | None) -> bool:
    """Whether a failed connect attempt deserves a warning line: the first of an outage, or one
    that fails differently from the attempt before (the rest go to debug)."""
    return attempt <= 1 or error != previous
