# Where collected rows wait for their readers. Both kinds read the same outbox stream the crawlers
# write to:
# - AmqpQueue: one drainer publishes the stream to RabbitMQ in batches of `confirm_window`, all
#   concurrently with publisher confirms, and advances the stream's ack cursor only once every
#   message of the batch is confirmed. A crash or a lost connection repeats at most that batch
#   (same message ids). `/consume` and `/queue/size` ask RabbitMQ.
# - EmbeddedQueue: no broker; the stream itself is the queue. `/consume` takes from it in order,
#   honouring each message's TTL.
from __future__ import annotations

import random
from typing import Any, Protocol

import trio

from daemon import metrics
from daemon.broker import AmqpBroker, BrokerError
from daemon.collector.messages import ConsumedMessage, consumed_from_item, decode_body, outgoing
from daemon.logs import get_logger
from daemon.outbox import Outbox, now_ms
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
        self.last_error: str | None = None

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
        }
        if self.broker is not None:
            info.update(self.broker.status())
        return info

    async def drain(self, broker: AmqpBroker, rng: random.Random | None = None) -> None:
        """Publish the stream in order, forever; retry a failed batch with backoff."""
        rng = rng or random.Random()
        failures = 0
        while True:
            batch = await self.outbox.next_batch(self.stream, self.confirm_window)
            at = now_ms()
            messages = [m for item in batch if (m := outgoing(item, at)) is not None]
            try:
                if messages:
                    await broker.publish_batch(messages)
            except BrokerError as exc:
                failures += 1
                self.failed_batches += 1
                metrics.queue_publish_failures.labels(self.stream).inc()
                self.last_error = str(exc)
                delay = restart_delay(failures, 0.2, 10.0, rng)
                log.warning(
                    "publish failed; the batch will be sent again",
                    messages=len(messages),
                    first_seq=batch[0].seq,
                    retry_in_s=round(delay, 2),
                    error=str(exc),
                )
                await trio.sleep(delay)
                continue
            failures = 0
            self.last_error = None
            await self.outbox.ack(self.stream, batch[-1].seq)
            self.published += len(messages)
            self.expired_before_publish += len(batch) - len(messages)
            metrics.queue_published.labels(self.stream, "confirmed").inc(len(messages))
            metrics.queue_published.labels(self.stream, "expired").inc(len(batch) - len(messages))
