# The AMQP broker client against a real RabbitMQ: properties round trip, TTL, dedupe, refusals,
# cancellation, and connection loss handled the way the outbox drainer handles it (retry the whole
# batch until confirmed). Waits are real time, so every one is short and bounded.
from __future__ import annotations

import functools
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import trio

from daemon.broker import (
    AmqpBroker,
    BrokerError,
    BrokerSettings,
    BrokerUnavailable,
    OutgoingMessage,
    PublishFailed,
    Publishing,
    amqp_url,
    backoff,
    delete_queue,
    message_properties,
    open_amqp_broker,
    redact_url,
    unique_by_message_id,
)
from daemon.broker import publish as broker_publish
from daemon.broker.rules import batch_limit, warn_connect_failure
from tests.integration.conftest import RabbitCtl, rabbitmqctl_for

broker = pytest.mark.broker


@pytest.fixture(autouse=True, params=["window", "each"])
def publish_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs on both publish paths: a window as one write (what the pinned aiormq
    gets) and one basic_publish per message (the fallback for an aiormq without the internals)."""
    if request.param == "each":
        monkeypatch.setattr(broker_publish, "supports", lambda channel: False)
    return str(request.param)


def messages(n: int, *, prefix: str = "m", ttl_ms: int | None = 60_000) -> list[OutgoingMessage]:
    now = int(time.time() * 1000)
    return [
        OutgoingMessage(
            body=b'{"row": %d}' % i,
            message_id=f"{prefix}-{i}",
            expiration_ms=ttl_ms,
            timestamp=now,
            headers={"task_id": "jobs-beijing", "run_id": "r1", "offset": i},
        )
        for i in range(n)
    ]


def settings(url: str, queue: str, **overrides: object) -> BrokerSettings:
    values: dict[str, object] = {
        "url": url,
        "queue": queue,
        "connection_name": f"crawld-test-{uuid.uuid4().hex[:8]}",
        "reconnect_max": 0.5,
        "call_wait": 3.0,
        "connect_timeout": 3.0,
        "operation_timeout": 10.0,
    }
    values.update(overrides)
    return BrokerSettings(**values)  # type: ignore[arg-type]


@asynccontextmanager
async def connected_broker(s: BrokerSettings) -> AsyncIterator[AmqpBroker]:
    async with open_amqp_broker(s, rng=random.Random(1)) as b:
        with trio.fail_after(5):
            await b.wait_connected()
        yield b


async def drain(b: AmqpBroker, batches: Sequence[list[OutgoingMessage]]) -> list[BrokerError]:
    """What the outbox drainer does: retry each whole batch until it is confirmed."""
    errors: list[BrokerError] = []
    for batch in batches:
        while True:
            try:
                await b.publish_batch(batch)
                break
            except BrokerError as exc:
                errors.append(exc)
                assert len(errors) < 20, errors
                with trio.fail_after(10):
                    await b.wait_connected()
    return errors


async def take_all(b: AmqpBroker) -> list[str]:
    ids: list[str] = []
    while got := await b.get(500):
        ids.extend(m.message_id or "" for m in got)
    return ids


# --- pure parts ---------------------------------------------------------------------------------


def test_backoff_is_jittered_exponential_and_capped() -> None:
    rng = random.Random(7)
    assert backoff(0, 30, rng) == 0.0
    for attempt, ceiling in [(1, 0.1), (2, 0.2), (3, 0.4), (6, 3.2), (10, 30.0), (500, 30.0)]:
        values = [backoff(attempt, 30, rng) for _ in range(200)]
        assert all(ceiling / 2 <= v <= ceiling for v in values), (attempt, min(values))
        assert max(values) - min(values) > ceiling / 10  # really jittered
    assert backoff(3, 0.25, rng) <= 0.25


def test_url_gets_password_and_name_and_is_redacted() -> None:
    url = amqp_url("amqp://crawler@mq.example:5672/vh?heartbeat=30", "p@ss:w/rd", "crawld")
    assert url == "amqp://crawler:p%40ss%3Aw%2Frd@mq.example:5672/vh?heartbeat=30&name=crawld"
    assert amqp_url("amqp://u:old@h/", "new") == "amqp://u:new@h/"
    assert amqp_url("amqp://u@h/?name=mine", None, "crawld") == "amqp://u@h/?name=mine"
    assert redact_url(url) == "amqp://crawler:***@mq.example:5672/vh?heartbeat=30&name=crawld"
    assert redact_url("amqp://h/") == "amqp://h/"


def test_outgoing_message_properties() -> None:
    m = OutgoingMessage(body=b"{}", message_id="a", expiration_ms=604_800_000, timestamp=1_700_000)
    props = message_properties(m)
    assert props.expiration == "604800000"  # AMQP wants the decimal string
    assert props.delivery_mode == 2
    assert props.content_type == "application/json"
    assert props.app_id == "crawld"
    assert props.timestamp is not None and props.timestamp.timestamp() == 1_700
    with pytest.raises(ValueError, match="negative"):
        OutgoingMessage(body=b"", message_id="a", expiration_ms=-1)
    with pytest.raises(ValueError, match="message_id"):
        OutgoingMessage(body=b"", message_id="")
    a, b, a2 = (OutgoingMessage(body=bytes([i]), message_id=mid) for i, mid in enumerate("aba"))
    assert unique_by_message_id([a, b, a2]) == [a, b]


@pytest.mark.parametrize(
    ("window", "batches", "in_flight", "limit"),
    [
        (500, 2, 0, 250),  # the window's share
        (500, 2, 250, 250),
        (500, 2, 400, 100),  # cut to the room left
        (500, 2, 500, 0),  # full: wait for confirms
        (500, 1, 0, 500),
        (500, 1, 1, 499),
        (100, 3, 0, 34),  # shares round up, the window still caps the total
        (100, 3, 68, 32),
        (1, 4, 0, 1),
    ],
)
def test_batches_share_the_confirm_window(
    window: int, batches: int, in_flight: int, limit: int
) -> None:
    assert batch_limit(window, batches, in_flight) == limit


def test_a_reconnect_loop_warns_once_per_kind_of_failure() -> None:
    errors = ["refused", "refused", "refused", "auth failed", "auth failed", "refused"]
    warned, previous = [], None
    for attempt, error in enumerate(errors, start=1):
        warned.append(warn_connect_failure(attempt, error, previous))
        previous = error
    assert warned == [True, False, False, True, False, True]
    assert warn_connect_failure(1, "refused", "refused")  # a new outage starts at attempt 1


def test_rabbitmqctl_only_aims_at_the_given_broker() -> None:
    local = "amqp://guest:guest@127.0.0.1:5672/"
    remote = "amqp://u:p@mq.example:5672/prod"
    command, _ = rabbitmqctl_for(remote, {})
    assert command is None  # never the local node for a remote broker
    command, _ = rabbitmqctl_for(remote, {"CRAWLD_TEST_RABBITMQCTL": "rabbitmqctl -n rabbit@mq"})
    assert command == ["rabbitmqctl", "-n", "rabbit@mq"]
    command, why = rabbitmqctl_for(local, {})
    assert command in (["rabbitmqctl"], None), why


# --- against RabbitMQ ---------------------------------------------------------------------------


@broker
@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
async def test_round_trip_keeps_every_property(
    amqp_url: str, queue_name: str, queue_type: str
) -> None:
    s = settings(amqp_url, queue_name, queue_type=queue_type)
    sent = messages(3)
    async with connected_broker(s) as b:
        assert await b.queue_size() == 0
        await b.publish_batch(sent)
        assert await b.queue_size() == 3
        got = await b.get(10)
        assert await b.queue_size() == 0
        assert await b.get(5) == []
        await b.publish_batch(messages(10, prefix="n"))
        assert [m.message_id for m in await b.get(4)] == [f"n-{i}" for i in range(4)]
        assert await b.queue_size() == 6
        status = b.status()
    assert [m.body for m in got] == [m.body for m in sent]
    for out, back in zip(sent, got, strict=True):
        assert back.message_id == out.message_id
        assert back.expiration == "60000"
        assert back.delivery_mode == 2
        assert back.content_type == "application/json"
        assert back.app_id == "crawld"
        assert back.headers.items() >= out.headers.items()  # quorum adds x-delivery-count
        assert out.timestamp is not None and back.timestamp == out.timestamp // 1000 * 1000
        assert back.redelivered is False
    assert status["connected"] is True
    assert (status["published"], status["confirmed"], status["reconnects"]) == (13, 13, 0)

    # The queue really has that type: declaring it as the other type is refused, and the broker
    # client reports why instead of connecting.
    other = "classic" if queue_type == "quorum" else "quorum"
    wrong_settings = settings(amqp_url, queue_name, queue_type=other, call_wait=0.1)
    async with open_amqp_broker(wrong_settings) as wrong:
        with trio.fail_after(5):
            while wrong.last_error is None:
                await trio.sleep(0.02)
        assert not wrong.connected
        assert "x-queue-type" in wrong.last_error
        with pytest.raises(BrokerUnavailable, match="x-queue-type"):
            await wrong.queue_size()


@broker
async def test_per_message_ttl_expires(amqp_url: str, queue_name: str) -> None:
    async with connected_broker(settings(amqp_url, queue_name)) as b:
        short = messages(2, prefix="short", ttl_ms=150)
        long = messages(1, prefix="long", ttl_ms=60_000)
        await b.publish_batch(short + long)
        await trio.sleep(0.4)
        with trio.fail_after(10):  # the broker drops them a moment after their TTL (under load,
            while await b.queue_size() > 1:  # a few hundred ms later)
                await trio.sleep(0.05)
        got = await b.get(10)
    assert [m.message_id for m in got] == ["long-0"]


@broker
async def test_duplicates_within_a_batch_are_published_once(amqp_url: str, queue_name: str) -> None:
    first, second = messages(2)
    again = OutgoingMessage(body=b"other body", message_id=first.message_id)
    async with connected_broker(settings(amqp_url, queue_name)) as b:
        await b.publish_batch([first, second, again, second])
        assert await b.queue_size() == 2
        got = await b.get(10)
        assert b.duplicates == 2
    assert [(m.message_id, m.body) for m in got] == [
        (first.message_id, first.body),
        (second.message_id, second.body),
    ]


@broker
async def test_missing_queue_is_refused_then_declared_again(amqp_url: str, queue_name: str) -> None:
    async with connected_broker(settings(amqp_url, queue_name)) as b:
        await delete_queue(amqp_url, queue_name)
        batch = messages(3)
        with pytest.raises(PublishFailed, match="312 NO_ROUTE") as caught:
            await b.publish_batch(batch)
        assert sorted(caught.value.returned) == sorted(m.message_id for m in batch)
        assert b.rejected == 3 and b.confirmed == 0
        assert b.connected  # a refusal is not a connection problem
        await b.publish_batch(batch)  # the retry declares the queue again first
        assert await b.queue_size() == 3
        # get and queue_size on a vanished queue answer "empty" and bring it back
        await delete_queue(amqp_url, queue_name)
        assert await b.get(5) == []
        await delete_queue(amqp_url, queue_name)
        assert await b.queue_size() == 0
        await b.publish_batch(batch)
        assert await b.queue_size() == 3


@broker
async def test_unsendable_message_fails_alone(amqp_url: str, queue_name: str) -> None:
    good, bad = messages(1)[0], OutgoingMessage(body=b"", message_id="bad", headers={"x": object()})
    async with connected_broker(settings(amqp_url, queue_name)) as b:
        with pytest.raises(PublishFailed, match="1 invalid") as caught:
            await b.publish_batch([good, bad])
        assert caught.value.invalid == ["bad"]
        assert await b.queue_size() == 1
        assert b.connected


@broker
async def test_broker_nack_raises_publish_failed(
    amqp_url: str, queue_name: str, rabbitmqctl: RabbitCtl
) -> None:
    # A policy on this test's queue only, in the test broker's vhost: at most 2 messages, refuse
    # the rest with a nack.
    definition = '{"max-length": 2, "overflow": "reject-publish"}'
    await rabbitmqctl(
        "set_policy", "--apply-to", "queues", queue_name, f"^{queue_name}$", definition, vhost=True
    )
    try:
        async with connected_broker(settings(amqp_url, queue_name)) as b:
            batch = messages(5)
            with pytest.raises(PublishFailed, match="3 nacked") as caught:
                await b.publish_batch(batch)
            assert len(caught.value.nacked) == 3 and caught.value.returned == []
            assert await b.queue_size() == 2
            assert b.connected
    finally:
        with trio.CancelScope(shield=True):
            await rabbitmqctl("clear_policy", queue_name, vhost=True)


@broker
async def test_cancelled_calls_lose_nothing_and_leave_the_client_usable(
    amqp_url: str, queue_name: str
) -> None:
    async with connected_broker(settings(amqp_url, queue_name)) as b:
        await b.publish_batch(messages(500))
        # Cancelled at different points of a get: whatever was delivered but not acknowledged
        # goes back to the queue, and deliveries still arriving for the abandoned channel do not
        # stall the connection (with aiormq's default channel buffer they would).
        for delay_ms in range(1, 7):
            with trio.move_on_after(delay_ms / 1000):
                await b.get(500)
            with trio.fail_after(5):  # the broker requeues the abandoned deliveries async
                while await b.queue_size() != 500:
                    await trio.sleep(0.01)
        with trio.fail_after(5):
            ids = await take_all(b)
        assert sorted(ids) == sorted(f"m-{i}" for i in range(500))

        with trio.move_on_after(0.005) as scope:
            await b.publish_batch(messages(300, prefix="c"))
        assert scope.cancelled_caught
        await b.publish_batch(messages(5, prefix="after"))
        ids = await take_all(b)
        assert {f"after-{i}" for i in range(5)} <= set(ids)
        assert b.connected and b.reconnects == 0

    # Cancelling the whole client while it publishes closes it promptly, and the next client on
    # the same trio run (a fresh asyncio loop) works.
    with trio.fail_after(5):
        with trio.CancelScope() as outer:
            async with connected_broker(settings(amqp_url, queue_name)) as b:
                for round_ in range(1000):
                    await b.publish_batch(messages(100, prefix=f"r{round_}"))
                    if round_ == 0:  # connected and publishing (however long that took): cancel
                        outer.deadline = trio.current_time() + 0.01  # in a later batch
        assert outer.cancelled_caught
        async with connected_broker(settings(amqp_url, queue_name)) as b:
            assert await b.queue_size() > 0


@broker
async def test_connection_closed_by_broker_then_retry_delivers_exactly(
    amqp_url: str, queue_name: str, rabbitmqctl: RabbitCtl
) -> None:
    s = settings(amqp_url, queue_name)
    async with connected_broker(s) as b:
        first, second = messages(50, prefix="a"), messages(50, prefix="b")
        await b.publish_batch(first)
        await close_connections_named(rabbitmqctl, s.connection_name)
        errors = await drain(b, [second])
        for error in errors:
            assert isinstance(error, BrokerUnavailable)
        assert b.reconnects == 1
        assert b.connected and b.last_error is None
        ids = await take_all(b)
    # `second` was published only after the close finished, so nothing can be duplicated
    assert sorted(ids) == sorted(m.message_id for m in first + second)


@broker
async def test_connection_cut_mid_batch_then_retry_delivers_everything(
    amqp_url: str, queue_name: str
) -> None:
    async with (
        tcp_proxy(amqp_url) as proxy,
        connected_broker(settings(proxy.url, queue_name, call_wait=0.5)) as b,
    ):
        batch = messages(500)
        with trio.fail_after(5):
            await b.publish_batch(messages(1, prefix="warm"))
            async with trio.open_nursery() as nursery:
                first_try: list[BaseException] = []

                async def publish() -> None:
                    try:
                        await b.publish_batch(batch)
                    except BrokerError as exc:
                        first_try.append(exc)

                proxy.hold()  # confirms stop reaching the client: the batch stays in flight
                nursery.start_soon(publish)
                await trio.sleep(0.03)
                proxy.down()  # mid-flight: cut every connection and refuse new ones
                proxy.release()
        [error] = first_try
        assert isinstance(error, BrokerUnavailable)
        assert not b.connected
        with trio.fail_after(2):
            while b.last_error is None:
                await trio.sleep(0.01)
        with pytest.raises(BrokerUnavailable):  # calls fail fast-ish while the broker is down
            with trio.fail_after(2):
                await b.publish_batch(batch)
        await trio.sleep(0.3)
        proxy.up()
        await drain(b, [batch])
        assert b.reconnects == 1
        ids = await take_all(b)
    assert set(ids) == {m.message_id for m in batch} | {"warm-0"}
    assert len(ids) <= 2 * len(batch) + 1  # duplicates bounded by the unconfirmed batch


@broker
async def test_unreachable_broker_fails_fast_and_closes_cleanly(amqp_url: str) -> None:
    async with tcp_proxy(amqp_url) as proxy:
        proxy.down()
        s = settings(proxy.url, "never-declared", call_wait=0.2, reconnect_max=0.1)
        with trio.fail_after(3):
            async with open_amqp_broker(s) as b:
                with pytest.raises(BrokerUnavailable, match="not connected"):
                    await b.publish_batch(messages(1))
                with pytest.raises(BrokerUnavailable):
                    await b.get(1)
                assert not b.connected
                assert b.last_error
                with trio.move_on_after(0.2) as scope:
                    await b.wait_connected()
                assert scope.cancelled_caught
            with pytest.raises(BrokerUnavailable, match="closed"):
                await b.publish_batch(messages(1))
            with pytest.raises(KeyError):  # the caller's own error, not an exception group
                async with open_amqp_broker(s):
                    raise KeyError("from the block")


@broker
async def test_a_cut_fails_every_batch_waiting_for_confirms_at_once(
    amqp_url: str, queue_name: str
) -> None:
    """Three batches in flight, their confirms held back by the proxy, then the TCP links cut:
    all three fail at once (not after the 30 s confirm timeout), the retry after the reconnect
    delivers everything, and the logs say it once each, in our words."""
    async with (
        root_records() as records,
        tcp_proxy(amqp_url) as proxy,
        connected_broker(
            settings(proxy.url, queue_name, operation_timeout=30.0, call_wait=5.0)
        ) as b,
    ):
        batches = [messages(200, prefix=f"b{i}") for i in range(3)]
        proxy.hold()
        pending: list[Publishing] = [await b.start_publish(batch) for batch in batches]
        await trio.sleep(0.2)  # the publishes reached the broker; their confirms wait in the proxy
        proxy.down()
        errors: list[BrokerError] = []
        with trio.fail_after(5):  # far below the 30 s confirm timeout
            for publishing in pending:
                with pytest.raises(BrokerUnavailable) as caught:
                    await publishing.confirmed()
                errors.append(caught.value)
        await trio.sleep(0.5)  # a few reconnect attempts fail while the proxy refuses
        proxy.release()
        proxy.up()
        with trio.fail_after(10):
            await drain(b, batches)
        ids = await take_all(b)
    assert set(ids) == {m.message_id for batch in batches for m in batch}
    assert len(ids) <= 2 * 600  # duplicates bounded by what was in flight
    ours = [r for r in records if r.name.startswith("crawld.broker")]
    assert not [r for r in records if r.name.startswith(("aiormq", "pamqp"))]
    assert not [r for r in ours if r.levelno >= logging.WARNING and r.exc_info]
    lost = [r for r in ours if r.getMessage().startswith("RabbitMQ connection lost")]
    assert len(lost) == 1
    warned = [r for r in ours if r.getMessage().startswith("cannot connect")]
    attempts = [r for r in ours if r.getMessage() == "connect attempt failed"]
    assert len(warned) <= 2 and len(warned) + len(attempts) >= 1
    assert any(r.getMessage().startswith("aiormq:") for r in ours)  # kept, at debug


@broker
async def test_pipelined_batches_settle_in_order(amqp_url: str, queue_name: str) -> None:
    async with connected_broker(settings(amqp_url, queue_name)) as b:
        batches = [messages(100, prefix=f"p{i}") for i in range(4)]
        pending = [await b.start_publish(batch) for batch in batches]
        for publishing in pending:
            await publishing.confirmed()
            await publishing.confirmed()  # asking again answers the same
        assert b.confirmed == 400
        ids = await take_all(b)
    assert ids == [m.message_id for batch in batches for m in batch]


# --- helpers: what reaches the root logger (the journal), our own connection's forced close,
# a TCP proxy we can cut


@asynccontextmanager
async def root_records() -> AsyncIterator[list[logging.LogRecord]]:
    """Every record that reaches the root logger's handlers (where crawld's journal handler
    sits), at any level, during the block."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    root = logging.getLogger()
    handler, level = Keep(logging.DEBUG), root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield records
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


# --- helpers: our own connection's forced close, and a TCP proxy we can cut ----------------------


async def close_connections_named(rabbitmqctl: RabbitCtl, name: str) -> None:
    listing = await rabbitmqctl("list_connections", "pid", "client_properties")
    ours = [
        line.split("\t", 1)[0]
        for line in listing.splitlines()
        if f'{{"connection_name","{name}"}}' in line
    ]
    assert len(ours) == 1, listing
    await rabbitmqctl("close_connection", ours[0], "test")


class Proxy:
    def __init__(self, url: str, port: int) -> None:
        parts = urlsplit(url)
        netloc = parts.netloc.rpartition("@")
        self.url = urlunsplit(
            (parts.scheme, f"{netloc[0]}{netloc[1]}127.0.0.1:{port}", parts.path, parts.query, "")
        )
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 5672)
        self.accepting = True
        self.flowing = trio.Event()
        self.flowing.set()
        self._links: set[trio.CancelScope] = set()

    def hold(self) -> None:
        """Stop passing the broker's bytes (confirms) to the client; the TCP links stay open."""
        self.flowing = trio.Event()

    def release(self) -> None:
        self.flowing.set()

    def down(self) -> None:
        self.accepting = False
        for scope in self._links:
            scope.cancel()

    def up(self) -> None:
        self.accepting = True

    async def handle(self, client: trio.SocketStream) -> None:
        async with client:
            if not self.accepting:
                return
            with trio.CancelScope() as scope:
                self._links.add(scope)
                try:
                    upstream = await trio.open_tcp_stream(*self.upstream)
                    async with upstream, trio.open_nursery() as nursery:
                        nursery.start_soon(pump, client, upstream, nursery.cancel_scope)
                        nursery.start_soon(pump, upstream, client, nursery.cancel_scope, self)
                finally:
                    self._links.discard(scope)


async def pump(
    source: trio.SocketStream,
    sink: trio.SocketStream,
    done: trio.CancelScope,
    gate: Proxy | None = None,
) -> None:
    try:
        while data := await source.receive_some(65536):
            if gate is not None:
                await gate.flowing.wait()
            await sink.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    done.cancel()


@asynccontextmanager
async def tcp_proxy(url: str) -> AsyncIterator[Proxy]:
    async with trio.open_nursery() as nursery:
        serve = functools.partial(trio.serve_tcp, lambda s: proxy.handle(s), 0, host="127.0.0.1")
        listeners = await nursery.start(serve)
        proxy = Proxy(url, listeners[0].socket.getsockname()[1])
        try:
            yield proxy
        finally:
            proxy.down()
            nursery.cancel_scope.cancel()


@broker
async def test_pinned_aiormq_publishes_windows_and_leaves_no_bookkeeping(
    amqp_url: str, queue_name: str, publish_path: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The fast path is not silently lost: the pinned aiormq has what it needs. A window of bodies
    # larger than a frame (split into several body frames) and empty bodies round-trips, and the
    # channel keeps no confirmation or message-id entry once the window settled.
    big = b"x" * 300_000  # RabbitMQ's default frame_max is 128 KiB
    sent = [
        OutgoingMessage(body=big, message_id="big"),
        OutgoingMessage(body=b"", message_id="empty"),
        *messages(3),
    ]
    with caplog.at_level(logging.WARNING, logger="crawld.broker"):
        async with connected_broker(settings(amqp_url, queue_name)) as b:
            link = b._link
            assert link is not None
            assert link.windowed is (publish_path == "window")
            await b.publish_batch(sent)
            await b.publish_batch(messages(2, prefix="again"))
            got = await b.get(10)
            channel: Any = link.publish
            assert dict(channel.confirmations) == {}
            assert channel.message_id_delivery_tag == {}
            assert channel.delivery_tag == 7
    assert [(m.message_id, len(m.body)) for m in got] == [
        ("big", len(big)),
        ("empty", 0),
        *((f"m-{i}", len(f'{{"row": {i}}}')) for i in range(3)),
        ("again-0", 10),
        ("again-1", 10),
    ]
    assert got[0].body == big
    fallback = [r for r in caplog.records if "one message at a time" in r.getMessage()]
    assert bool(fallback) is (publish_path == "each")
