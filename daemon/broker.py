# RabbitMQ through aiormq, which is asyncio-only, in a trio daemon. Everything asyncio lives in
# this module: one `trio_asyncio.open_loop()` per broker, and every aiormq call crosses into it
# through `_aio()` (small asyncio-side helpers below, called with `aio_as_trio`). The rest of the
# project sees plain trio functions and never imports aiormq.
#
# Contract for publishing: `publish_batch` returns only when the broker confirmed EVERY message
# of the batch; anything else (nack, mandatory return, lost connection, confirm timeout) raises a
# BrokerError and the caller (the outbox drainer) retries the whole batch. Message ids are stable,
# so a retry after an unknown outcome gives at-least-once delivery with bounded duplicates.
#
# The connection is owned by one background task: it connects (jittered exponential backoff while
# the broker is down), declares the queue, then watches `connection.closing` so a lost connection
# is noticed at once and replaced. Calls never block on a dead connection: they wait a bounded
# time for a live one and otherwise raise BrokerUnavailable.
#
# `get` (the /consume route) takes messages with a prefetch-bounded consumer rather than one
# basic.get round trip per message, so a large take answers well before HTTP clients time out.
from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypeVar
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import aiormq
import msgspec
import trio
import trio_asyncio
from aiormq import spec
from aiormq.abc import AbstractChannel, AbstractConnection, DeliveredMessage

from daemon.logs import get_logger

if TYPE_CHECKING:
    from daemon.config import BrokerConfig

__all__ = [
    "AmqpBroker",
    "BrokerError",
    "BrokerSettings",
    "BrokerUnavailable",
    "OutgoingMessage",
    "PublishFailed",
    "ReceivedMessage",
    "amqp_url",
    "backoff",
    "declare_arguments",
    "delete_queue",
    "message_properties",
    "open_amqp_broker",
    "probe",
    "redact_url",
    "unique_by_message_id",
]

log = get_logger("broker")

P = ParamSpec("P")
T = TypeVar("T")

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
        timestamp=(
            None
            if message.timestamp is None
            else datetime.fromtimestamp(message.timestamp / 1000, UTC)
        ),
        headers=dict(message.headers) if message.headers else None,
        app_id=message.app_id,
    )


def unique_by_message_id(messages: Sequence[OutgoingMessage]) -> list[OutgoingMessage]:
    """The first message of each message_id, in order."""
    seen: set[str] = set()
    unique = []
    for message in messages:
        if message.message_id not in seen:
            seen.add(message.message_id)
            unique.append(message)
    return unique


def _received(delivered: DeliveredMessage) -> ReceivedMessage:
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


_UNBOUNDED = 0
"""Channel frame buffer size. aiormq's default (10) lets frames still arriving for a channel
being closed (deliveries, confirms) fill its buffer and stall the connection's only reader,
and with it every other channel. Incoming frames are bounded anyway: by prefetch on the admin
channel, by the publishes in flight on the confirm channel."""

_TAKE_IDLE = 0.1
"""Seconds `get` waits for the next delivery before settling for fewer than asked."""

_STABLE_AFTER = 10.0
"""Seconds a connection must live before a loss restarts the backoff from its first step."""

_CONNECTION_ERRORS = (
    asyncio.CancelledError,
    TimeoutError,
    ConnectionError,
    OSError,
    aiormq.exceptions.AMQPError,
    aiormq.exceptions.ChannelInvalidStateError,
)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, asyncio.CancelledError):
        return "connection closed"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# ---------------------------------------------------------------------------------------------
# asyncio side: every function here runs as an asyncio task on the broker's loop.


async def _aio_connect(
    url: str, queue: str, queue_type: QueueType, timeout: float
) -> tuple[AbstractConnection, AbstractChannel, AbstractChannel]:
    async with asyncio.timeout(timeout):
        connection = await aiormq.connect(url)
        try:
            publish = await connection.channel(
                publisher_confirms=True, on_return_raises=True, frame_buffer_size=_UNBOUNDED
            )
            admin = await connection.channel(publisher_confirms=False, frame_buffer_size=_UNBOUNDED)
            await admin.queue_declare(queue, durable=True, arguments=declare_arguments(queue_type))
        except BaseException:
            await _aio_close_connection(connection)
            raise
    return connection, publish, admin


async def _aio_close_connection(connection: AbstractConnection) -> None:
    with contextlib.suppress(Exception):
        async with asyncio.timeout(2):
            await connection.close()


async def _aio_close_channel(channel: AbstractChannel) -> None:
    with contextlib.suppress(Exception):
        async with asyncio.timeout(2):
            await channel.close()


async def _aio_open_channel(connection: AbstractConnection, timeout: float) -> AbstractChannel:
    return await connection.channel(
        publisher_confirms=False, frame_buffer_size=_UNBOUNDED, timeout=timeout
    )


async def _aio_wait_closed(connection: AbstractConnection, channel: AbstractChannel) -> str:
    # Each `closing` access is an independent observer; cancelling one only stops watching.
    observers = [connection.closing, channel.closing]
    try:
        done, _ = await asyncio.wait(observers, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for observer in observers:
            observer.cancel()
    future = done.pop()
    if future.cancelled():
        return "connection closed"
    exc = future.exception()
    return _describe(exc) if exc is not None else "connection closed"


async def _aio_publish_all(
    channel: AbstractChannel,
    queue: str,
    properties: list[spec.Basic.Properties],
    bodies: list[bytes],
    timeout: float,
) -> list[BaseException | None]:
    async def one(props: spec.Basic.Properties, body: bytes) -> None:
        # wait=False skips only the socket-drain wait (the batch is bounded); the confirm is
        # still awaited. AbstractChannel's signature lacks `wait`, Channel has it.
        confirm = await channel.basic_publish(  # type: ignore[call-arg]
            body,
            routing_key=queue,
            properties=props,
            mandatory=True,
            timeout=timeout,
            wait=False,
        )
        if not isinstance(confirm, spec.Basic.Ack):
            raise RuntimeError(f"unexpected publisher confirm {confirm!r}")

    results = await asyncio.gather(
        *(one(props, body) for props, body in zip(properties, bodies, strict=True)),
        return_exceptions=True,
    )
    return [result if isinstance(result, BaseException) else None for result in results]


async def _aio_take(
    channel: AbstractChannel, queue: str, count: int, timeout: float, idle: float
) -> list[DeliveredMessage]:
    # One basic.get per message costs a round trip each (about 1 ms here, so seconds for 1000,
    # long enough for an HTTP client to give up after we acked). Instead: a consumer limited by
    # prefetch to the messages ready now, cancelled once they arrived (or nothing came for
    # `idle` seconds: expired messages behind the head still count as ready), then one ack.
    async with asyncio.timeout(timeout):
        ready = await channel.queue_declare(queue, passive=True)
        want = min(count, int(ready.message_count or 0), 65535) if ready else 0
        if want == 0:
            return []
        taken: list[DeliveredMessage] = []
        arrived = asyncio.Event()

        async def on_message(message: DeliveredMessage) -> None:
            taken.append(message)
            arrived.set()

        await channel.basic_qos(prefetch_count=want)
        consume = await channel.basic_consume(queue, on_message, no_ack=False)
        while len(taken) < want:
            arrived.clear()
            try:
                async with asyncio.timeout(idle):
                    await arrived.wait()
            except TimeoutError:
                break
        assert consume.consumer_tag is not None
        await channel.basic_cancel(consume.consumer_tag)
        await asyncio.sleep(0)  # let callbacks for deliveries before Basic.CancelOk finish
        if not taken:
            return []
        taken.sort(key=lambda message: message.delivery_tag or 0)
        last = taken[-1].delivery_tag
        assert last is not None
        # wait=False only queues the frame, so no cancellation can land between "acked" and
        # "returned to the caller".
        await channel.basic_ack(last, multiple=True, wait=False)
    return taken


async def _aio_declare(
    channel: AbstractChannel, queue: str, queue_type: QueueType, passive: bool, timeout: float
) -> int:
    if passive:
        ok = await channel.queue_declare(queue, passive=True, timeout=timeout)
    else:
        ok = await channel.queue_declare(
            queue, durable=True, arguments=declare_arguments(queue_type), timeout=timeout
        )
    assert ok is not None
    return int(ok.message_count or 0)


async def _aio_delete_queue(url: str, queue: str, timeout: float) -> None:
    async with asyncio.timeout(timeout):
        connection = await aiormq.connect(url)
        try:
            channel = await connection.channel(publisher_confirms=False)
            await channel.queue_delete(queue)
        finally:
            await _aio_close_connection(connection)


async def _aio_probe(url: str, timeout: float) -> None:
    async with asyncio.timeout(timeout):
        connection = await aiormq.connect(url)
        await _aio_close_connection(connection)


# ---------------------------------------------------------------------------------------------
# trio side


@dataclass(eq=False)
class _Link:
    """One live connection with its confirm channel and its admin (get/declare) channel."""

    connection: AbstractConnection
    publish: AbstractChannel
    admin: AbstractChannel | None
    lost: trio.Event = field(default_factory=trio.Event)
    reason: str | None = None
    need_declare: bool = False


class AmqpBroker:
    """The daemon's RabbitMQ queue. Create with `open_amqp_broker`."""

    def __init__(self, settings: BrokerSettings, loop: Any, rng: random.Random) -> None:
        self.settings = settings
        self._url = amqp_url(settings.url, settings.password, settings.connection_name)
        self.url = redact_url(self._url)
        self._loop = loop
        self._rng = rng
        self._link: _Link | None = None
        self._link_ready = trio.Event()
        self._admin_lock = trio.Lock()
        self._closed = False
        self._connections = 0
        self.last_error: str | None = None
        self.published = 0
        """Messages handed to the broker (each try of a batch counts)."""
        self.confirmed = 0
        self.rejected = 0
        """Messages nacked or returned."""
        self.duplicates = 0
        """Messages skipped because their message_id repeated within a batch."""
        self.reconnects = 0

    # -- state ------------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._link is not None and not self._link.lost.is_set()

    def status(self) -> dict[str, Any]:
        """A JSON-ready summary for /status and /metrics."""
        return {
            "kind": "amqp",
            "url": self.url,
            "queue": self.settings.queue,
            "queue_type": self.settings.queue_type,
            "connected": self.connected,
            "last_error": self.last_error,
            "published": self.published,
            "confirmed": self.confirmed,
            "rejected": self.rejected,
            "duplicates": self.duplicates,
            "reconnects": self.reconnects,
        }

    async def wait_connected(self) -> None:
        """Return once connected and the queue is declared. Raises BrokerUnavailable once the
        client is closed."""
        while not self.connected:
            if self._closed:
                raise BrokerUnavailable("the broker client is closed")
            await self._link_ready.wait()

    # -- operations -------------------------------------------------------------------------

    async def publish_batch(self, messages: Sequence[OutgoingMessage]) -> None:
        """Publish all `messages` concurrently (persistent, mandatory, to the queue) and return
        when every one is confirmed. Repeated message_ids are sent once. Raises PublishFailed
        when the broker nacks or returns any of them, BrokerUnavailable when the connection is
        missing, lost or a confirm times out (then the outcome of each message is unknown).
        Batches published concurrently must not share message ids."""
        batch = unique_by_message_id(messages)
        self.duplicates += len(messages) - len(batch)
        if not batch:
            return
        link = await self._live_link()
        if link.need_declare:
            async with self._admin_lock:
                await self._declare(link, passive=False)
        properties = [message_properties(message) for message in batch]
        bodies = [message.body for message in batch]
        self.published += len(batch)
        try:
            results = await self._aio(
                _aio_publish_all,
                link.publish,
                self.settings.queue,
                properties,
                bodies,
                self.settings.operation_timeout,
            )
        except Exception as exc:
            raise self._unavailable(link, exc, "publish") from exc
        self.confirmed += sum(1 for result in results if result is None)
        failures = [(m.message_id, r) for m, r in zip(batch, results, strict=True) if r is not None]
        if failures:
            raise self._publish_error(link, failures, len(batch))

    async def get(self, count: int = 1) -> list[ReceivedMessage]:
        """Take up to `count` of the messages ready in the queue, in queue order, acknowledged
        together once all arrived. Cancelled or failed midway, none is taken (the broker puts
        them back, marked redelivered)."""
        if count < 1:
            raise ValueError(f"count must be at least 1, got {count}")
        link = await self._live_link()
        async with self._admin_lock:
            if link.need_declare:
                await self._declare(link, passive=False)
            channel = await self._admin_channel(link)
            try:
                delivered = await self._aio(
                    _aio_take,
                    channel,
                    self.settings.queue,
                    count,
                    self.settings.operation_timeout,
                    _TAKE_IDLE,
                )
            except BaseException as exc:
                # Deliveries not yet acknowledged are requeued by the broker when their channel
                # closes; close it now so nothing stays stuck on a long-lived channel.
                with trio.CancelScope(shield=True):
                    await self._drop_admin(link, channel)
                if not isinstance(exc, Exception):
                    raise
                if isinstance(exc, aiormq.exceptions.ChannelNotFoundEntity):
                    link.need_declare = True  # the queue was deleted under us: declare it again
                    await self._declare(link, passive=False)
                    return []
                raise self._unavailable(link, exc, "get") from exc
        return [_received(message) for message in delivered]

    async def queue_size(self) -> int:
        """Messages ready in the queue (passive declare)."""
        link = await self._live_link()
        async with self._admin_lock:
            return await self._declare(link, passive=not link.need_declare)

    # -- internals --------------------------------------------------------------------------

    async def _aio(self, fn: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
        if self._loop.is_closed():
            raise BrokerUnavailable("the broker client is closed")
        try:
            return await trio_asyncio.aio_as_trio(fn, loop=self._loop)(*args, **kwargs)
        except asyncio.CancelledError as exc:
            # A trio cancel arrives as trio.Cancelled; this one came from aiormq (connection
            # closing) or from the loop shutting down.
            raise BrokerUnavailable("the AMQP connection closed during the operation") from exc

    async def _live_link(self) -> _Link:
        if self._closed:
            raise BrokerUnavailable("the broker client is closed")
        if not self.connected:
            with trio.move_on_after(self.settings.call_wait):
                await self.wait_connected()
        link = self._link
        if link is None or link.lost.is_set():
            raise BrokerUnavailable(f"not connected to RabbitMQ: {self.last_error or 'connecting'}")
        return link

    async def _admin_channel(self, link: _Link) -> AbstractChannel:
        if link.admin is None or link.admin.is_closed:
            try:
                link.admin = await self._aio(
                    _aio_open_channel, link.connection, self.settings.operation_timeout
                )
            except Exception as exc:
                raise self._unavailable(link, exc, "open channel") from exc
        return link.admin

    async def _drop_admin(self, link: _Link, channel: AbstractChannel) -> None:
        if link.admin is channel:
            link.admin = None
        with trio.move_on_after(3), contextlib.suppress(BrokerError):
            await self._aio(_aio_close_channel, channel)

    async def _declare(self, link: _Link, *, passive: bool) -> int:
        """Declare the queue (or check it passively) and return its ready message count;
        a missing queue is declared again. Call with the admin lock held."""
        for _ in range(2):
            channel = await self._admin_channel(link)
            try:
                count = await self._aio(
                    _aio_declare,
                    channel,
                    self.settings.queue,
                    self.settings.queue_type,
                    passive,
                    self.settings.operation_timeout,
                )
            except aiormq.exceptions.ChannelNotFoundEntity:
                link.admin = None
                link.need_declare = True
                passive = False
                continue
            except Exception as exc:
                if link.admin is channel and channel.is_closed:
                    link.admin = None
                raise self._unavailable(link, exc, "declare queue") from exc
            if not passive:
                link.need_declare = False
            return count
        raise BrokerUnavailable(f"queue {self.settings.queue!r} disappeared while declaring it")

    def _unavailable(self, link: _Link, exc: BaseException, doing: str) -> BrokerError:
        """The error to raise for `exc`; marks the link lost when its connection is gone."""
        if isinstance(exc, BrokerError) and not isinstance(exc, BrokerUnavailable):
            return exc
        if isinstance(exc, TimeoutError):
            timeout = self.settings.operation_timeout
            return BrokerUnavailable(f"{doing}: no answer within {timeout:g}s (outcome unknown)")
        cause = exc.__cause__ if isinstance(exc, BrokerUnavailable) and exc.__cause__ else exc
        if link.connection.is_closed or link.publish.is_closed:
            self._lose(link, _describe(cause))
        reason = link.reason if link.lost.is_set() and link.reason else _describe(cause)
        return BrokerUnavailable(f"{doing} failed: {reason}")

    def _publish_error(
        self, link: _Link, failures: list[tuple[str, BaseException]], total: int
    ) -> BrokerError:
        returned: list[str] = []
        nacked: list[str] = []
        invalid: list[str] = []
        lost: list[BaseException] = []
        details: list[str] = []
        for message_id, exc in failures:
            if isinstance(exc, aiormq.exceptions.PublishError):
                if not returned:
                    code = getattr(exc.frame, "reply_code", None)
                    text = getattr(exc.frame, "reply_text", "")
                    details.append(f"returned {code} {text} (queue {self.settings.queue!r})")
                    if code == 312:  # NO_ROUTE: the queue is gone; declare it before next try
                        link.need_declare = True
                returned.append(message_id)
            elif isinstance(exc, aiormq.exceptions.DeliveryError):
                nacked.append(message_id)
            elif isinstance(exc, _CONNECTION_ERRORS):
                lost.append(exc)
            else:
                if not invalid:
                    details.append(f"message {message_id!r} not sendable: {_describe(exc)}")
                invalid.append(message_id)
        confirmed = f"{total - len(failures)} of {total} confirmed"
        if lost:
            # The connection went away or a confirm timed out: the outcome is unknown.
            error = self._unavailable(link, lost[0], "publish")
            error.args = (f"{error}; {confirmed}",)
            return error
        self.rejected += len(returned) + len(nacked)
        if nacked:
            details.append(f"{len(nacked)} nacked by the broker")
        return PublishFailed(
            f"{confirmed}; {len(returned)} returned, {len(nacked)} nacked, "
            f"{len(invalid)} invalid: " + "; ".join(details),
            returned=returned,
            nacked=nacked,
            invalid=invalid,
        )

    def _lose(self, link: _Link, reason: str) -> None:
        if link.lost.is_set():
            return
        link.reason = reason
        if self._link is link:
            self._link = None
            self._link_ready = trio.Event()
        link.lost.set()

    async def _maintain(self) -> None:
        """The connection's owner: connect, watch, reconnect with backoff, forever."""
        attempt = 0
        while True:
            if attempt:
                await trio.sleep(backoff(attempt, self.settings.reconnect_max, self._rng))
            try:
                connection, publish, admin = await self._aio(
                    _aio_connect,
                    self._url,
                    self.settings.queue,
                    self.settings.queue_type,
                    self.settings.connect_timeout,
                )
            except Exception as exc:
                attempt += 1
                self.last_error = _describe(exc)
                log.warning(
                    "cannot connect to RabbitMQ",
                    url=self.url,
                    error=self.last_error,
                    attempt=attempt,
                )
                continue
            link = _Link(connection, publish, admin)
            connected_at = trio.current_time()
            self._link = link
            self._link_ready.set()
            if self._connections:
                self.reconnects += 1
            self._connections += 1
            self.last_error = None
            log.info("connected to RabbitMQ", url=self.url, queue=self.settings.queue)
            try:
                await self._watch(link)
            finally:
                self._lose(link, link.reason or "closed")
                with (
                    trio.CancelScope(shield=True),
                    trio.move_on_after(3),
                    contextlib.suppress(BrokerError),
                ):
                    await self._aio(_aio_close_connection, connection)
            self.last_error = link.reason
            log.warning("RabbitMQ connection lost", url=self.url, error=link.reason)
            # A connection that dies right after opening keeps backing off instead of flapping.
            short_lived = trio.current_time() - connected_at < _STABLE_AFTER
            attempt = attempt + 1 if short_lived else 1

    async def _watch(self, link: _Link) -> None:
        async def observe() -> None:
            try:
                reason = await self._aio(_aio_wait_closed, link.connection, link.publish)
            except BrokerError as exc:
                reason = str(exc)
            self._lose(link, reason)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(observe)
            await link.lost.wait()
            nursery.cancel_scope.cancel()

    async def _shutdown(self) -> None:
        self._closed = True
        self._link_ready.set()
        link = self._link
        if link is not None:
            self._lose(link, "closed")
            with trio.move_on_after(3), contextlib.suppress(BrokerError):
                await self._aio(_aio_close_connection, link.connection)


@contextlib.asynccontextmanager
async def open_amqp_broker(
    settings: BrokerSettings, *, rng: random.Random | None = None
) -> AsyncIterator[AmqpBroker]:
    """Run a broker client for the block. It connects in the background (entering never
    blocks on RabbitMQ); leaving closes the connection, then the asyncio loop."""
    sole: BaseException | None = None
    try:
        async with trio_asyncio.open_loop() as loop:
            broker = AmqpBroker(settings, loop, rng or random.Random())
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(broker._maintain)
                    try:
                        yield broker
                    finally:
                        broker._closed = True
                        nursery.cancel_scope.cancel()
            finally:
                with trio.CancelScope(shield=True):
                    await broker._shutdown()
    except BaseExceptionGroup as group:
        # The two nurseries wrap whatever the caller's block raised; hand back the exception
        # itself so callers catch what they raised, not a doubly nested group.
        sole = _sole_exception(group)
        if sole is None:
            raise
    if sole is not None:
        raise sole


def _sole_exception(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        if len(exc.exceptions) != 1:
            return None
        exc = exc.exceptions[0]
    return exc


async def probe(url: str, *, timeout: float = 3.0) -> None:
    """Open and close one AMQP connection; raises BrokerUnavailable if that fails."""
    error = await _run_alone(_aio_probe, url, timeout)
    if error is not None:
        raise BrokerUnavailable(f"{redact_url(url)}: {_describe(error)}") from error


async def delete_queue(url: str, queue: str, *, timeout: float = 5.0) -> None:
    """Delete `queue` (absent is fine), over a connection of its own. For tests and tools."""
    error = await _run_alone(_aio_delete_queue, url, queue, timeout)
    if error is not None:
        raise BrokerUnavailable(f"delete queue {queue!r}: {_describe(error)}") from error


async def _run_alone(fn: Callable[..., Awaitable[None]], *args: Any) -> BaseException | None:
    """Run one asyncio helper in a loop of its own; return its error instead of raising it
    (inside `open_loop` it would come out wrapped in exception groups)."""
    async with trio_asyncio.open_loop() as loop:
        try:
            await trio_asyncio.aio_as_trio(fn, loop=loop)(*args)
        except (Exception, asyncio.CancelledError) as exc:
            return exc
    return None
