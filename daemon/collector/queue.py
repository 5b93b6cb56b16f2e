# Where collected rows wait for their readers. Both kinds read the same outbox stream the crawlers
# write to:
# - AmqpQueue: one drainer publishes the stream to RabbitMQ with publisher confirms, in pipelined
#   batches: up to `batches_in_flight` batches (together at most `confirm_window` messages) are
#   sent and awaiting confirms while the next one is read from the store. Batches are settled in
#   order and the stream's ack cursor advances past a batch only once it and every batch before
#   it were confirmed; the first failure abandons the rest and everything after the cursor is sent
#   again. Reading, sending and settling are separate tasks, so the next batch is read ahead and
#   an ack's commit never delays a send that the window has room for; a batch keeps its room
#   until its ack committed. A crash or a lost connection therefore repeats at most
#   `confirm_window` messages (same message ids). `/consume` and `/queue/size` ask RabbitMQ.
#   In cluster mode the drainer runs under the stream's lease: each ack checks its token in the
#   same transaction, and no batch is handed to the broker once the lease's local deadline has
#   passed (an owner paused past its lease wakes up publishing nothing); the next owner starts
#   after the ack cursor, so a failover repeats at most `confirm_window` messages too.
# - EmbeddedQueue: no broker; the stream itself is the queue. `/consume` takes from it in order,
#   honouring each message's TTL.
from __future__ import annotations

import random
from collections import deque
from typing import Any, Protocol

import trio

from daemon import metrics
from daemon.broker import AmqpBroker, BrokerError, Publishing
from daemon.broker.rules import batch_limit
from daemon.cluster import Lease, LeaseLost
from daemon.collector.messages import ConsumedMessage, consumed_from_item, decode_body, outgoing
from daemon.logs import get_logger
from daemon.outbox import Item, Outbox, now_ms
from daemon.supervise import restart_delay

log = get_logger("collector.queue")


def stream_name(queue: str) -> str:
    return f"queue:{queue}"


class QueueUnavailable(Exception):
    """The queue cannot be read right now (broker down)."""


class RowQueue(Protocol):
    kind: str
    name: str

    async def consume(self, count: int) -> list[ConsumedMessage]: ...
    async def size(self) -> int: ...
    def status(self) -> dict[str, Any]: ...


class EmbeddedQueue:
    kind = "embedded"

    def __init__(self, outbox: Outbox, name: str) -> None:
        self.outbox = outbox
        self.name = name
        self.stream = stream_name(name)
        self.consumed = 0
        self.expired = 0

    async def consume(self, count: int) -> list[ConsumedMessage]:
        items, expired = await self.outbox.take(self.stream, count)
        self.consumed += len(items)
        self.expired += expired
        at = self.outbox.clock_ms()
        return [consumed_from_item(item, at) for item in items]

    async def size(self) -> int:
        """Messages waiting (expired ones are counted until a consume passes them, as in
        RabbitMQ, where they leave only at the head of the queue)."""
        return (await self.outbox.state(self.stream)).pending

    def status(self) -> dict[str, Any]:
        return {"kind": self.kind, "consumed": self.consumed, "expired": self.expired}


class AmqpQueue:
    kind = "amqp"

    def __init__(self, outbox: Outbox, name: str, confirm_window: int) -> None:
        self.outbox = outbox
        self.name = name
        self.stream = stream_name(name)
        self.confirm_window = confirm_window
        self.broker: AmqpBroker | None = None
        self.published = 0
        self.expired_before_publish = 0
        self.failed_batches = 0
        self._failures = 0
        """Failures since the last confirmed batch (drives the retry backoff)."""
        self.last_error: str | None = None
        self.draining = False
        """Whether this instance drains the stream now (holds its lease, or needs none)."""

    async def consume(self, count: int) -> list[ConsumedMessage]:
        broker = self._broker()
        try:
            received = await broker.get(count)
        except BrokerError as exc:
            raise QueueUnavailable(str(exc)) from exc
        return [
            ConsumedMessage(
                body=decode_body(m.body),
                message_id=m.message_id,
                expiration=m.expiration,
                timestamp=m.timestamp,
                headers=dict(m.headers),
                content_type=m.content_type,
                delivery_mode=m.delivery_mode,
                redelivered=m.redelivered,
            )
            for m in received
        ]

    async def size(self) -> int:
        try:
            return await self._broker().queue_size()
        except BrokerError as exc:
            raise QueueUnavailable(str(exc)) from exc

    def _broker(self) -> AmqpBroker:
        if self.broker is None:
            raise QueueUnavailable("the broker connection is not open")
        return self.broker

    def status(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "kind": self.kind,
            "published": self.published,
            "expired_before_publish": self.expired_before_publish,
            "failed_batches": self.failed_batches,
            "last_error": self.last_error,
            "draining": self.draining,
        }
        if self.broker is not None:
            info.update(self.broker.status())
        return info

    async def drain(
        self, broker: AmqpBroker, rng: random.Random | None = None, *, lease: Lease | None = None
    ) -> None:
        """Publish the stream in order, forever; after a failed batch, back off and send
        everything after the ack cursor again. With `lease` (cluster mode) every ack is fenced
        by it and LeaseLost ends the drain."""
        rng = rng or random.Random()
        self.draining = True
        try:
            await self._drain(broker, rng, lease)
        finally:
            self.draining = False

    async def _drain(self, broker: AmqpBroker, rng: random.Random, lease: Lease | None) -> None:
        while True:
            try:
                await self._pipeline(broker, lease)
            except BrokerError as exc:
                self._failures += 1
                self.failed_batches += 1
                metrics.queue_publish_failures.labels(self.stream).inc()
                self.last_error = str(exc)
                delay = restart_delay(self._failures, 0.2, 10.0, rng)
                log.warning(
                    "publish failed; unconfirmed rows will be sent again",
                    retry_in_s=round(delay, 2),
                    error=str(exc),
                )
                await trio.sleep(delay)
                continue

    async def _pipeline(self, broker: AmqpBroker, lease: Lease | None = None) -> None:
        """Keep batches in flight until one fails (raises its BrokerError).

        Three tasks so that no step waits for another it does not depend on: the reader
        prefetches the next batch from the store while earlier ones publish, the sender hands a
        batch to the broker as soon as the window has room, and the settler awaits confirms in
        order and advances the ack cursor. A batch holds its room in the window until its ack
        committed (not merely until it was confirmed), so everything after the cursor that the
        broker may have seen, confirmed or not, stays within `confirm_window`."""
        settings = broker.settings
        share = batch_limit(settings.confirm_window, settings.batches_in_flight, 0)
        window = _Window(settings.confirm_window)
        in_flight: deque[tuple[list[Item], Publishing | None, int]] = deque()
        failure: list[Exception] = []  # the first error of a task, raised as it is
        read_send, read_receive = trio.open_memory_channel[list[Item]](1)
        sent_send, sent_receive = trio.open_memory_channel[None](settings.batches_in_flight + 1)

        async def guard(task: Any, *args: Any) -> None:
            try:
                await task(*args)
            except Exception as exc:
                failure.append(exc)
                nursery.cancel_scope.cancel()

        async def read() -> None:
            after = 0  # 0: from the ack cursor
            async with read_send:
                while True:
                    batch = await self.outbox.next_batch(self.stream, share, after=after)
                    after = batch[-1].seq
                    await read_send.send(batch)

        async def send() -> None:
            async with read_receive, sent_send:
                async for batch in read_receive:
                    await window.reserve(len(batch))
                    if lease is not None and lease.deadline <= trio.current_time():
                        raise LeaseLost(lease.name)  # not renewed in time: maybe taken over
                    at = now_ms()
                    messages = [m for item in batch if (m := outgoing(item, at)) is not None]
                    publishing = await broker.start_publish(messages) if messages else None
                    in_flight.append((batch, publishing, len(messages)))
                    await sent_send.send(None)

        async def settle() -> None:
            async with sent_receive:
                async for _ in sent_receive:
                    batch, publishing, sent = in_flight[0]
                    if publishing is not None:
                        await publishing.confirmed()
                    await self.outbox.ack(
                        self.stream, batch[-1].seq, also=lease.check if lease else None
                    )
                    in_flight.popleft()
                    window.release(len(batch))
                    self.last_error = None
                    self._failures = 0
                    self.published += sent
                    self.expired_before_publish += len(batch) - sent
                    metrics.queue_published.labels(self.stream, "confirmed").inc(sent)
                    metrics.queue_published.labels(self.stream, "expired").inc(len(batch) - sent)

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(guard, read)
                nursery.start_soon(guard, send)
                nursery.start_soon(guard, settle)
        finally:
            for _, publishing, _ in in_flight:
                if publishing is not None:
                    publishing.abandon()
        raise failure[0]


class _Window:
    """Room for messages sent and not yet acknowledged in the store."""

    def __init__(self, size: int) -> None:
        self.free = size
        self._released = trio.Event()

    async def reserve(self, count: int) -> None:
        while self.free < count:
            await self._released.wait()
        self.free -= count

    def release(self, count: int) -> None:
        self.free += count
        self._released.set()
        self._released = trio.Event()
