# The broker's asyncio side: every coroutine here runs as an asyncio task on the broker's loop
# thread (daemon/broker/asyncio_thread.py), handed over from trio one unit of work at a time (a
# connect, a take, a declare); aiormq's own logger is routed to crawld's here too.
#
# Why apart: this and daemon/broker/publish.py are the only modules that touch aiormq objects,
# so what may only run on the loop thread is easy to see; daemon/broker/client.py calls these
# through `AsyncioThread.run` and never awaits an asyncio object itself.
from __future__ import annotations

import asyncio
import contextlib
import logging

import aiormq
from aiormq.abc import AbstractChannel, AbstractConnection, DeliveredMessage

from daemon.broker import publish as window
from daemon.broker.rules import QueueType, declare_arguments, describe
from daemon.logs import get_logger

log = get_logger("broker")

UNBOUNDED = 0
"""Channel frame buffer size. aiormq's default (10) lets frames still arriving for a channel
being closed (deliveries, confirms) fill its buffer and stall the connection's only reader,
and with it every other channel. Incoming frames are bounded anyway: by prefetch on the admin
channel, by the publishes in flight on the confirm channel."""


class _ToDebug(logging.Handler):
    """Re-emits aiormq's records as one debug line each on our logger, without tracebacks."""

    def emit(self, record: logging.LogRecord) -> None:
        error = None
        if record.exc_info and record.exc_info[1] is not None:
            error = describe(record.exc_info[1])
        try:
            message = record.getMessage()
        except Exception:  # a bad format string in a library message must not raise here
            message = str(record.msg)
        log.debug(f"aiormq: {message}", level=record.levelname, error=error)


def route_client_logs() -> None:
    """Send aiormq's (and pamqp's) log records to crawld's broker logger at debug level: the
    broker client already logs what happened once, in one line (idempotent)."""
    for name in ("aiormq", "pamqp"):
        logger = logging.getLogger(name)
        if not any(isinstance(h, _ToDebug) for h in logger.handlers):
            logger.addHandler(_ToDebug())
        logger.propagate = False


async def connect(
    url: str, queue: str, queue_type: QueueType, timeout: float
) -> tuple[AbstractConnection, AbstractChannel, AbstractChannel, bool]:
    async with asyncio.timeout(timeout):
        connection = await aiormq.connect(url)
        try:
            publish = await connection.channel(
                publisher_confirms=True, on_return_raises=True, frame_buffer_size=UNBOUNDED
            )
            admin = await connection.channel(publisher_confirms=False, frame_buffer_size=UNBOUNDED)
            await admin.queue_declare(queue, durable=True, arguments=declare_arguments(queue_type))
        except BaseException:
            await close_connection(connection)
            raise
    return connection, publish, admin, window.supports(publish)


async def close_connection(connection: AbstractConnection) -> None:
    with contextlib.suppress(Exception):
        async with asyncio.timeout(2):
            await connection.close()


async def close_channel(channel: AbstractChannel) -> None:
    with contextlib.suppress(Exception):
        async with asyncio.timeout(2):
            await channel.close()


async def open_channel(connection: AbstractConnection, timeout: float) -> AbstractChannel:
    return await connection.channel(
        publisher_confirms=False, frame_buffer_size=UNBOUNDED, timeout=timeout
    )


async def wait_closed(connection: AbstractConnection, channel: AbstractChannel) -> str:
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
    return describe(exc) if exc is not None else "connection closed"


async def take(
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


async def declare(
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


async def delete_queue(url: str, queue: str, timeout: float) -> None:
    async with asyncio.timeout(timeout):
        connection = await aiormq.connect(url)
        try:
            channel = await connection.channel(publisher_confirms=False)
            await channel.queue_delete(queue)
        finally:
            await close_connection(connection)


async def probe(url: str, timeout: float) -> None:
    async with asyncio.timeout(timeout):
        connection = await aiormq.connect(url)
        await close_connection(connection)
