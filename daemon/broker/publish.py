# A window of publishes as one write on an aiormq channel (asyncio side of `daemon.broker`).
#
# aiormq's `basic_publish` is one coroutine per message: a task to run it concurrently, a timeout
# scope, the channel lock, a confirmation future with its callbacks, a frame queued for the writer
# task and a socket write, each time. On this project's 2-core target that is most of the CPU a
# published row costs (docs/explanations/amqp-thread.md has the figures). `publish_window` does
# the same work once per window, on aiormq's own channel and with aiormq's own confirm
# bookkeeping:
#
# - under the channel lock that `basic_publish` takes, it numbers the messages with the channel's
#   delivery tags and registers one confirmation per message in `channel.confirmations`, which is
#   where aiormq's frame reader settles acks, nacks (also `multiple`) and mandatory returns (found
#   through `channel.message_id_delivery_tag`), exactly as for its own publishes;
# - the frames are marshalled as pamqp would (the Basic.Publish frame once per window, the headers
#   and bodies by daemon/broker/frames.py, same bytes at a fraction of the CPU) and queued on
#   the connection's writer as ONE ChannelFrame: one socket write instead of one per message, and
#   nothing half-queued if the caller is cancelled;
# - a confirmation is a light `_Slot` that records its message's outcome and counts down one
#   future per window, made with `channel.create_future()` so that a channel or connection close
#   rejects it like any aiormq call.
#
# Those attributes are aiormq's (no leading underscore, but not documented API). aiormq is pinned
# in pyproject.toml and the broker tests run this path against a real RabbitMQ; `supports(channel)`
# checks the attributes when the channel opens, and the broker falls back to `publish_each` (one
# `basic_publish` per message, same contract) if a future aiormq no longer has them.
from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from aiormq import spec
from aiormq.abc import AbstractChannel, ChannelFrame
from pamqp import frame as pamqp_frame

from daemon.broker import frames

_PENDING: Any = object()

_REQUIRED = (
    "confirmations",
    "message_id_delivery_tag",
    "delivery_tag",
    "write_queue",
    "lock",
    "number",
    "max_content_size",
    "create_future",
    "publisher_confirms",
)


def supports(channel: AbstractChannel) -> bool:
    """Whether `channel` has the aiormq internals `publish_window` works with."""
    return all(hasattr(channel, name) for name in _REQUIRED) and bool(
        getattr(channel, "publisher_confirms", False)
    )


class _Window:
    """The outcomes of one window: None (acked) or the error, per message."""

    __slots__ = ("abandoned", "future", "left", "outcomes")

    def __init__(self, future: asyncio.Future[None], size: int) -> None:
        self.future = future
        self.outcomes: list[Any] = [_PENDING] * size
        self.left = 0
        self.abandoned = False

    def settle(self, index: int, outcome: BaseException | None) -> None:
        if self.outcomes[index] is not _PENDING:
            return
        self.outcomes[index] = outcome
        self.left -= 1
        if self.left == 0 and not self.future.done():
            self.future.set_result(None)


class _Slot:
    """What aiormq's reader sees in `channel.confirmations` for one message: the part of the
    Future interface it uses (`done`, `cancelled`, `set_result`, `set_exception`)."""

    __slots__ = ("index", "window")

    def __init__(self, window: _Window, index: int) -> None:
        self.window = window
        self.index = index

    def done(self) -> bool:
        # An abandoned window's late confirms are ignored (aiormq logs them at debug).
        return self.window.abandoned or self.window.outcomes[self.index] is not _PENDING

    def cancelled(self) -> bool:
        return self.window.abandoned

    def set_result(self, result: object) -> None:
        if isinstance(result, spec.Basic.Ack):
            self.window.settle(self.index, None)
        else:  # a returned message when the channel does not raise on returns
            self.window.settle(self.index, RuntimeError(f"unexpected publisher confirm {result!r}"))

    def set_exception(self, exc: BaseException) -> None:
        self.window.settle(self.index, exc)


async def publish_window(
    channel: AbstractChannel,
    queue: str,
    properties: Sequence[spec.Basic.Properties],
    bodies: Sequence[bytes],
    timeout: float,
) -> list[BaseException | None]:
    """Publish every message (mandatory, to `queue` through the default exchange) and wait for
    the broker's verdict on each: None when acked, else the error (a return, a nack, a message
    that cannot be marshalled, the channel's close reason, TimeoutError after `timeout`)."""
    ch: Any = channel  # the attributes `supports` checked
    number: int = ch.number
    max_body: int = ch.max_content_size
    window = _Window(ch.create_future(), len(bodies))
    publish = pamqp_frame.marshal(spec.Basic.Publish(routing_key=queue, mandatory=True), number)
    parts: list[bytes] = []
    to_send: list[tuple[int, str]] = []  # (index, message_id) of the messages that marshalled
    for index, (props, body) in enumerate(zip(properties, bodies, strict=True)):
        try:
            head = frames.content_header(number, len(body), props)
            if len(body) < max_body:
                content = [frames.content_body(number, body)] if body else []
            else:
                content = [
                    frames.content_body(number, body[at : at + max_body])
                    for at in range(0, len(body), max_body)
                ]
        except Exception as exc:  # this message alone cannot be sent (e.g. a bad header value)
            window.outcomes[index] = exc
            continue
        parts.append(publish)
        parts.append(head)
        parts.extend(content)
        to_send.append((index, props.message_id or ""))
    if not to_send:
        window.future.cancel()
        return list(window.outcomes)

    registered: list[tuple[str, int]] = []
    confirmations: dict[int, Any] = ch.confirmations
    ids: dict[str, int] = ch.message_id_delivery_tag
    try:
        async with ch.lock:
            first = ch.delivery_tag + 1
            tag = first - 1
            for index, message_id in to_send:
                tag += 1
                confirmations[tag] = _Slot(window, index)
                ids[message_id] = tag
                registered.append((message_id, tag))
            ch.delivery_tag = tag
            window.left = len(to_send)
            try:
                await ch.write_queue.put(ChannelFrame(payload=b"".join(parts), should_close=False))
            except BaseException:
                # Nothing was queued, so the broker numbers the next publish `first`: take the
                # tags back while the lock is still held.
                ch.delivery_tag = first - 1
                for message_id, t in registered:
                    confirmations.pop(t, None)
                    if ids.get(message_id) == t:
                        del ids[message_id]
                registered.clear()
                raise
        parts.clear()
        done, _ = await asyncio.wait([window.future], timeout=timeout)
        if not done:
            failure: BaseException = TimeoutError("no publisher confirm in time")
        elif window.future.cancelled():
            failure = ConnectionError("the channel closed")
        else:
            failure = window.future.exception() or ConnectionError("the channel closed")
        return [failure if outcome is _PENDING else outcome for outcome in window.outcomes]
    finally:
        window.abandoned = True
        if not window.future.done():
            window.future.cancel()
        for message_id, t in registered:
            if ids.get(message_id) == t:
                del ids[message_id]


async def publish_each(
    channel: AbstractChannel,
    queue: str,
    properties: Sequence[spec.Basic.Properties],
    bodies: Sequence[bytes],
    timeout: float,
) -> list[BaseException | None]:
    """`publish_window`'s contract with one aiormq basic_publish per message: the fallback
    when `supports(channel)` is false."""
    # wait=False skips only the socket-drain wait (the batch is bounded); the confirm is
    # still awaited. AbstractChannel's signature lacks `wait`, Channel has it. One timeout bounds
    # the whole batch (a timer per message would cost a timer handle each); when it fires, every
    # publish still waiting ends with TimeoutError, which counts as "outcome unknown".
    publish: Callable[..., Coroutine[Any, Any, object]] = channel.basic_publish
    pending = [
        asyncio.ensure_future(
            publish(body, routing_key=queue, properties=props, mandatory=True, wait=False)
        )
        for props, body in zip(properties, bodies, strict=True)
    ]
    try:
        async with asyncio.timeout(timeout):
            results = await asyncio.gather(*pending, return_exceptions=True)
    except TimeoutError:
        results = [
            TimeoutError("no publisher confirm in time")
            if not task.done() or task.cancelled()
            else (task.exception() or task.result())
            for task in pending
        ]
    return [
        None
        if isinstance(result, spec.Basic.Ack)
        else result
        if isinstance(result, BaseException)
        else RuntimeError(f"unexpected publisher confirm {result!r}")
        for result in results
    ]
