# The broker client: RabbitMQ through aiormq, which is asyncio-only, in a trio daemon. aiormq runs
# on a plain asyncio loop in a thread of its own (daemon/broker/asyncio_thread.py): trio hands
# over one call per unit of work (a window of publishes, a take, a declare), never one per
# message. Everything asyncio lives in daemon/broker/aio.py and daemon/broker/publish.py (a
# window of publishes as one write), which only ever run on that thread; this module and the
# rest of the project are plain trio and never touch an aiormq object. The rules (properties,
# URLs, backoff, how per-message outcomes become one error, how the confirm window is cut) are
# in daemon/broker/rules.py.
#
# Contract for publishing: `start_publish` sends a batch and returns a handle at once; the
# handle's `confirmed()` returns only when the broker confirmed EVERY message of the batch, and
# anything else (nack, mandatory return, lost connection, confirm timeout) raises a BrokerError so
# the caller (the outbox drainer) sends the whole batch again. Several batches may be in flight;
# the caller awaits them in order. Message ids are stable, so a retry after an unknown outcome
# gives at-least-once delivery with duplicates bounded by what was in flight.
#
# The connection is owned by one background task: it connects (jittered exponential backoff while
# the broker is down), declares the queue, then watches `connection.closing`. A lost connection
# fails every batch still waiting for confirms at once (their asyncio tasks are cancelled), so the
# drainer re-sends right after the reconnect instead of waiting out the confirm timeout. Calls
# never block on a dead connection: they wait a bounded time for a live one, then raise.
from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiormq
import trio
from aiormq.abc import AbstractChannel, AbstractConnection

from daemon.broker import aio
from daemon.broker import publish as window
from daemon.broker.asyncio_thread import AsyncioThread, Call, LoopClosed, open_asyncio_thread
from daemon.broker.rules import (
    BrokerError,
    BrokerSettings,
    BrokerUnavailable,
    OutgoingMessage,
    ReceivedMessage,
    amqp_url,
    backoff,
    describe,
    message_properties,
    publish_failed,
    received,
    redact_url,
    sort_failures,
    unique_by_message_id,
    warn_connect_failure,
)
from daemon.logs import get_logger

log = get_logger("broker")

T = TypeVar("T")

_TAKE_IDLE = 0.1
"""Seconds `get` waits for the next delivery before settling for fewer than asked."""

_STABLE_AFTER = 10.0
"""Seconds a connection must live before a loss restarts the backoff from its first step."""


@dataclass(eq=False)
class _Link:
    """One live connection with its confirm channel and its admin (get/declare) channel."""

    connection: AbstractConnection
    publish: AbstractChannel
    admin: AbstractChannel | None
    lost: trio.Event = field(default_factory=trio.Event)
    reason: str | None = None
    need_declare: bool = False
    publishing: set[Call[list[BaseException | None]]] = field(default_factory=set)
    """Publish calls waiting for confirms: all cancelled at once when the connection is lost."""
    windowed: bool = True
    """Publish a batch as one write (daemon/broker/publish.py), else one basic_publish per
    message."""


class Publishing:
    """A batch handed to the broker; `confirmed()` waits for the verdict on all of it."""

    def __init__(
        self,
        broker: AmqpBroker,
        link: _Link,
        batch: list[OutgoingMessage],
        call: Call[list[BaseException | None]],
    ) -> None:
        self._broker = broker
        self._link = link
        self._batch = batch
        self._call = call
        self._verdict: BrokerError | None = None
        self._settled = False

    def __len__(self) -> int:
        return len(self._batch)

    def abandon(self) -> None:
        """Stop waiting for this batch (a later one failed first); its outcome no longer
        matters because the caller sends everything after its cursor again."""
        self._call.cancel()
        self._link.publishing.discard(self._call)

    async def confirmed(self) -> None:
        """Return when every message was confirmed; raise PublishFailed when the broker refused
        some, BrokerUnavailable when the connection was lost or a confirm timed out (outcome
        unknown). Safe to call again: it answers the same."""
        if not self._settled:
            self._verdict = await self._broker._settle(self._link, self._batch, self._call)
            self._settled = True
        if self._verdict is not None:
            raise self._verdict


class AmqpBroker:
    """The daemon's RabbitMQ queue. Create with `open_amqp_broker`."""

    def __init__(self, settings: BrokerSettings, thread: AsyncioThread, rng: random.Random) -> None:
        self.settings = settings
        self._url = amqp_url(settings.url, settings.password, settings.connection_name)
        self.url = redact_url(self._url)
        self._thread = thread
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
            "confirm_window": self.settings.confirm_window,
            "batches_in_flight": self.settings.batches_in_flight,
        }

    async def wait_connected(self) -> None:
        """Return once connected and the queue is declared. Raises BrokerUnavailable once the
        client is closed."""
        while not self.connected:
            if self._closed:
                raise BrokerUnavailable("the broker client is closed")
            await self._link_ready.wait()

    # -- operations -------------------------------------------------------------------------

    async def start_publish(self, messages: Sequence[OutgoingMessage]) -> Publishing:
        """Send all `messages` (persistent, mandatory, to the queue) concurrently and return a
        handle at once; its `confirmed()` gives the verdict. Repeated message_ids within the
        batch are sent once. Raises BrokerUnavailable when there is no connection."""
        batch = unique_by_message_id(messages)
        self.duplicates += len(messages) - len(batch)
        link = await self._live_link()
        if link.need_declare:
            async with self._admin_lock:
                await self._declare(link, passive=False)
        properties = [message_properties(message) for message in batch]
        bodies = [message.body for message in batch]
        try:
            call = self._thread.submit(
                window.publish_window if link.windowed else window.publish_each,
                link.publish,
                self.settings.queue,
                properties,
                bodies,
                self.settings.operation_timeout,
            )
        except LoopClosed as exc:
            raise BrokerUnavailable("the broker client is closed") from exc
        self.published += len(batch)
        link.publishing.add(call)
        if link.lost.is_set():  # lost between the check and now: fail it like the others
            call.cancel()
        return Publishing(self, link, batch, call)

    async def publish_batch(self, messages: Sequence[OutgoingMessage]) -> None:
        """Publish all `messages` and return when every one is confirmed (`start_publish`
        followed by `confirmed()`). Raises PublishFailed when the broker nacks or returns any of
        them, BrokerUnavailable when the connection is missing, lost or a confirm times out."""
        if not messages:
            return
        publishing = await self.start_publish(messages)
        await publishing.confirmed()

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
                    aio.take,
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
        return [received(message) for message in delivered]

    async def queue_size(self) -> int:
        """Messages ready in the queue (passive declare)."""
        link = await self._live_link()
        async with self._admin_lock:
            return await self._declare(link, passive=not link.need_declare)

    # -- internals --------------------------------------------------------------------------

    async def _aio(self, fn: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
        try:
            return await self._thread.run(fn, *args)
        except LoopClosed as exc:
            raise BrokerUnavailable("the broker client is closed") from exc
        except asyncio.CancelledError as exc:
            # A trio cancel arrives as trio.Cancelled; this one came from aiormq (connection
            # closing), from a lost link failing its calls, or from the loop shutting down.
            raise BrokerUnavailable("the AMQP connection closed during the operation") from exc

    async def _settle(
        self, link: _Link, batch: list[OutgoingMessage], call: Call[list[BaseException | None]]
    ) -> BrokerError | None:
        """Wait for a publish call and turn its per-message outcomes into one verdict."""
        try:
            results = await call.outcome()
        except asyncio.CancelledError as exc:
            return self._unavailable(link, exc, "publish")
        except Exception as exc:
            return self._unavailable(link, exc, "publish")
        finally:
            link.publishing.discard(call)
        failures = [(m.message_id, r) for m, r in zip(batch, results, strict=True) if r is not None]
        self.confirmed += len(batch) - len(failures)
        if not failures:
            return None
        refusals = sort_failures(failures, self.settings.queue)
        if refusals.queue_missing:
            link.need_declare = True  # declare the queue before the next try
        confirmed = f"{len(batch) - len(failures)} of {len(batch)} confirmed"
        if refusals.lost:
            # The connection went away or a confirm timed out: the outcome is unknown.
            error = self._unavailable(link, refusals.lost[0], "publish")
            error.args = (f"{error}; {confirmed}",)
            return error
        self.rejected += len(refusals.returned) + len(refusals.nacked)
        return publish_failed(refusals, len(batch) - len(failures), len(batch))

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
                    aio.open_channel, link.connection, self.settings.operation_timeout
                )
            except Exception as exc:
                raise self._unavailable(link, exc, "open channel") from exc
        return link.admin

    async def _drop_admin(self, link: _Link, channel: AbstractChannel) -> None:
        if link.admin is channel:
            link.admin = None
        with trio.move_on_after(3), contextlib.suppress(BrokerError):
            await self._aio(aio.close_channel, channel)

    async def _declare(self, link: _Link, *, passive: bool) -> int:
        """Declare the queue (or check it passively) and return its ready message count;
        a missing queue is declared again. Call with the admin lock held."""
        for _ in range(2):
            channel = await self._admin_channel(link)
            try:
                count = await self._aio(
                    aio.declare,
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
            self._lose(link, describe(cause))
        reason = link.reason if link.lost.is_set() and link.reason else describe(cause)
        return BrokerUnavailable(f"{doing} failed: {reason}")

    def _lose(self, link: _Link, reason: str) -> None:
        if link.lost.is_set():
            return
        link.reason = reason
        if self._link is link:
            self._link = None
            self._link_ready = trio.Event()
        link.lost.set()
        # Every batch still waiting for confirms fails now: its outcome is unknown and the
        # drainer sends it again after the reconnect, rather than after the confirm timeout.
        for call in list(link.publishing):
            call.cancel()

    async def _maintain(self) -> None:
        """The connection's owner: connect, watch, reconnect with backoff, forever."""
        attempt = 0
        while True:
            if attempt:
                await trio.sleep(backoff(attempt, self.settings.reconnect_max, self._rng))
            try:
                connection, publish, admin, windowed = await self._aio(
                    aio.connect,
                    self._url,
                    self.settings.queue,
                    self.settings.queue_type,
                    self.settings.connect_timeout,
                )
            except Exception as exc:
                attempt += 1
                error = describe(exc)
                if warn_connect_failure(attempt, error, self.last_error):
                    log.warning(
                        "cannot connect to RabbitMQ; retrying with backoff",
                        url=self.url,
                        error=error,
                        attempt=attempt,
                    )
                else:
                    log.debug("connect attempt failed", error=error, attempt=attempt)
                self.last_error = error
                continue
            link = _Link(connection, publish, admin, windowed=windowed)
            if not windowed:
                log.warning(
                    "this aiormq lacks the channel internals of window publishing; "
                    "publishing one message at a time (slower)",
                    aiormq=_aiormq_version(),
                )
            connected_at = trio.current_time()
            self._link = link
            self._link_ready.set()
            if self._connections:
                self.reconnects += 1
            self._connections += 1
            self.last_error = None
            log.info(
                "connected to RabbitMQ",
                url=self.url,
                queue=self.settings.queue,
                attempts=attempt or None,
            )
            try:
                await self._watch(link)
            finally:
                self._lose(link, link.reason or "closed")
                with (
                    trio.CancelScope(shield=True),
                    trio.move_on_after(3),
                    contextlib.suppress(BrokerError),
                ):
                    await self._aio(aio.close_connection, connection)
            self.last_error = link.reason
            log.warning("RabbitMQ connection lost; reconnecting", url=self.url, error=link.reason)
            # A connection that dies right after opening keeps backing off instead of flapping.
            short_lived = trio.current_time() - connected_at < _STABLE_AFTER
            attempt = attempt + 1 if short_lived else 1

    async def _watch(self, link: _Link) -> None:
        async def observe() -> None:
            try:
                reason = await self._aio(aio.wait_closed, link.connection, link.publish)
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
                await self._aio(aio.close_connection, link.connection)


@contextlib.asynccontextmanager
async def open_amqp_broker(
    settings: BrokerSettings, *, rng: random.Random | None = None
) -> AsyncIterator[AmqpBroker]:
    """Run a broker client for the block. It connects in the background (entering never
    blocks on RabbitMQ); leaving closes the connection, then the asyncio thread."""
    aio.route_client_logs()
    sole: BaseException | None = None
    try:
        async with open_asyncio_thread("crawld-amqp") as thread:
            broker = AmqpBroker(settings, thread, rng or random.Random())
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
        # The nursery wraps whatever the caller's block raised; hand back the exception itself
        # so callers catch what they raised, not a group.
        sole = _sole_exception(group)
        if sole is None:
            raise
    if sole is not None:
        raise sole


def _aiormq_version() -> str:
    from importlib.metadata import version

    return version("aiormq")


def _sole_exception(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        if len(exc.exceptions) != 1:
            return None
        exc = exc.exceptions[0]
    return exc
