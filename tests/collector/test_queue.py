# The AMQP drainer's pipeline against a broker stand-in whose confirms the test releases one by one:
# batches share the confirm window, the next one is read and sent while earlier confirms are
# pending, the ack cursor only moves in order, and a failure re-sends everything after the cursor
# (so repeats stay within the window). RabbitMQ itself is exercised in tests/integration.
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import trio

from daemon.broker import BrokerUnavailable, OutgoingMessage
from daemon.broker.rules import BrokerSettings
from daemon.collector.queue import AmqpQueue, stream_name
from daemon.outbox import NewItem, Outbox

QUEUE = "rows"
STREAM = stream_name(QUEUE)


class HeldPublish:
    def __init__(self, messages: Sequence[OutgoingMessage]) -> None:
        self.ids = [m.message_id for m in messages]
        self.settled = trio.Event()
        self.error: BrokerUnavailable | None = None
        self.abandoned = False

    def __len__(self) -> int:
        return len(self.ids)

    def confirm(self, error: BrokerUnavailable | None = None) -> None:
        self.error = error
        self.settled.set()

    def abandon(self) -> None:
        self.abandoned = True

    async def confirmed(self) -> None:
        await self.settled.wait()
        if self.error is not None:
            raise self.error


class HeldBroker:
    """Records each batch and holds its confirms until the test releases them."""

    def __init__(self, window: int, batches: int) -> None:
        self.settings = BrokerSettings(
            url="amqp://127.0.0.1/", confirm_window=window, batches_in_flight=batches
        )
        self.sent: list[HeldPublish] = []
        self.changed = trio.Event()

    async def start_publish(self, messages: Sequence[OutgoingMessage]) -> HeldPublish:
        publish = HeldPublish(messages)
        self.sent.append(publish)
        self.changed.set()
        self.changed = trio.Event()
        return publish

    async def wait_sent(self, count: int) -> None:
        while len(self.sent) < count:
            await self.changed.wait()


async def rows(outbox: Outbox, count: int) -> None:
    items = [NewItem(key=f"m{i}", body=b"{}", meta={"ttl_ms": 60_000}) for i in range(count)]
    await outbox.append(STREAM, items)


async def cursor(outbox: Outbox) -> int:
    return (await outbox.state(STREAM)).ack_cursor


async def settle(outbox: Outbox, upto: int) -> None:
    while await cursor(outbox) < upto:
        await trio.sleep(0.01)


async def test_batches_are_pipelined_and_acked_in_order(
    outbox: Outbox, autojump_clock: trio.testing.MockClock
) -> None:
    await rows(outbox, 30)
    broker = HeldBroker(window=10, batches=2)
    queue = AmqpQueue(outbox, QUEUE, confirm_window=10)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(queue.drain, broker)  # type: ignore[arg-type]
        await broker.wait_sent(2)
        await trio.sleep(1)
        assert [p.ids for p in broker.sent] == [
            [f"m{i}" for i in range(5)],
            [f"m{i}" for i in range(5, 10)],
        ]  # two batches in flight, the window is full: no third yet
        broker.sent[1].confirm()  # the later batch confirms first: the cursor waits for the first
        await trio.sleep(1)
        assert await cursor(outbox) == 0 and len(broker.sent) == 2
        broker.sent[0].confirm()
        await broker.wait_sent(4)
        await settle(outbox, 10)
        assert broker.sent[2].ids[0] == "m10" and broker.sent[3].ids[0] == "m15"
        for publish in broker.sent[2:]:
            publish.confirm()
        await broker.wait_sent(6)
        for publish in broker.sent[4:]:
            publish.confirm()
        await settle(outbox, 30)
        while queue.published < 30:  # the drainer counts once its ack's commit wakes it
            await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert queue.published == 30 and queue.failed_batches == 0


@pytest.mark.parametrize("batches", [1, 2, 3])
async def test_a_failure_resends_from_the_cursor_within_the_window(
    outbox: Outbox, autojump_clock: trio.testing.MockClock, batches: int
) -> None:
    await rows(outbox, 24)
    broker = HeldBroker(window=12, batches=batches)
    queue = AmqpQueue(outbox, QUEUE, confirm_window=12)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(queue.drain, broker)  # type: ignore[arg-type]
        await broker.wait_sent(batches)
        first_try = list(broker.sent)
        first_try[0].confirm(BrokerUnavailable("connection lost"))
        await broker.wait_sent(batches + 1)
        assert all(p.abandoned for p in first_try[1:])  # later batches are not waited for
        assert broker.sent[batches].ids[0] == "m0"  # everything after the cursor, again
        while await cursor(outbox) < 24:
            for publish in broker.sent:
                if not publish.settled.is_set() and publish not in first_try:
                    publish.confirm()
            await trio.sleep(0.01)
        while queue.published < 24:  # the drainer counts once its ack's commit wakes it
            await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    sent = [i for p in broker.sent for i in p.ids]
    assert set(sent) == {f"m{i}" for i in range(24)}
    assert len(sent) - 24 <= 12  # repeats bounded by the confirm window
    assert queue.failed_batches == 1 and queue.published == 24


class HeldAcks(Outbox):
    """An outbox whose acks wait until the test lets them commit."""

    def __init__(self, outbox: Outbox) -> None:
        super().__init__(outbox.store)
        self.release = trio.Event()
        self.waiting = 0

    async def ack(self, stream: str, upto_seq: int, also: Any = None) -> None:
        self.waiting += 1
        await self.release.wait()
        await super().ack(stream, upto_seq, also)


async def test_a_batch_keeps_its_room_until_its_ack_committed(
    outbox: Outbox, autojump_clock: trio.testing.MockClock
) -> None:
    held = HeldAcks(outbox)
    await rows(held, 20)
    broker = HeldBroker(window=10, batches=2)
    queue = AmqpQueue(held, QUEUE, confirm_window=10)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(queue.drain, broker)  # type: ignore[arg-type]
        await broker.wait_sent(2)
        broker.sent[0].confirm()
        broker.sent[1].confirm()
        await trio.sleep(1)
        # confirmed but the cursor has not moved: a crash now would repeat these 10, so no
        # more may go out
        assert held.waiting == 1 and len(broker.sent) == 2
        held.release.set()
        await broker.wait_sent(4)
        assert broker.sent[2].ids[0] == "m10"
        for publish in broker.sent[2:]:
            publish.confirm()
        await settle(held, 20)
        nursery.cancel_scope.cancel()
